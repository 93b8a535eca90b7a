"""Every code block of the documentation site runs at a tiny budget, or says why it does not.

The convention, for the pages in mkdocs.yml's nav:

* A ```python block runs. The blocks of one page run in page order in one namespace, like the
  cells of a notebook, in a fresh working directory. Two names are defined for them:
  ``TDMPC2_TINY`` and ``DREAMERV3_TINY``, the smallest configurations (each agent's
  ``SMOKE_SETTINGS``, with TD-MPC2's seed phase cut to 200 steps and DreamerV3 on one env).
* An HTML comment on the line before a block (blank lines allowed between) changes that:

  - ``<!-- docs-test: replace A -> B; replace C -> D -->``: the block runs with every ``A``
    replaced by ``B`` (each ``A`` must occur in the block), e.g. ``replace model_size=1 ->
    **TDMPC2_TINY; replace 6_000 -> 250``;
  - ``<!-- docs-test: skip, <why, with the time it would take> -->``: the block does not run.

* Any other block with a language (```bash, ...) is a command this suite does not run: it must be
  marked ``skip`` with its reason. Blocks without a language, or ```text, are output, not code.

``mkdocs build --strict`` (when mkdocs is installed) checks that every page builds and that every
relative link and anchor resolves; the README's relative links are checked here too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DIRECTIVE = re.compile(r"^<!--\s*docs-test:\s*(?P<body>.*?)\s*-->$")
FENCE = re.compile(r"^```(?P<lang>[\w+-]*)\s*$")
OUTPUT_LANGUAGES = {"", "text"}


@dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    directive: str | None  # the body of the docs-test comment before the block, if any

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        if self.directive is None or not self.directive.startswith("skip"):
            return None
        return self.directive[len("skip") :].lstrip(" ,:")

    def replacements(self) -> list[tuple[str, str]]:
        if self.directive is None or self.skip_reason is not None:
            return []
        pairs = []
        for part in filter(None, (p.strip() for p in self.directive.split(";"))):
            match = re.fullmatch(r"replace (.+?) -> (.+)", part)
            if not match:
                raise ValueError(f"{self.where}: cannot read docs-test directive {part!r}")
            pairs.append((match[1], match[2]))
        return pairs

    def runnable_code(self) -> str:
        code = self.code
        for old, new in self.replacements():
            if old not in code:
                raise ValueError(
                    f"{self.where}: docs-test replaces {old!r}, which the block does not contain"
                )
            code = code.replace(old, new)
        return code


def nav_pages() -> list[str]:
    """The Markdown files of mkdocs.yml's nav, in nav order."""
    yaml = pytest.importorskip("yaml")
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages: list[str] = []

    def walk(entry) -> None:
        if isinstance(entry, str):
            pages.append(entry)
        elif isinstance(entry, list):
            for item in entry:
                walk(item)
        elif isinstance(entry, dict):
            for value in entry.values():
                walk(value)

    walk(nav)
    return [page for page in pages if page.endswith(".md")]


def blocks(page: str) -> list[Block]:
    lines = (DOCS / page).read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, lang = i, match["lang"]
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"docs/{page}:{i + 1}: the code block is not closed")
        previous = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        directive = DIRECTIVE.match(previous)
        code = "\n".join(lines[start + 1 : end]) + "\n"
        found.append(Block(page, start + 1, lang, code, directive["body"] if directive else None))
        i = end + 1
    return found


PAGES = nav_pages() if (ROOT / "mkdocs.yml").exists() else []
RUNNABLE_PAGES = [
    page for page in PAGES if any(b.lang == "python" and b.skip_reason is None for b in blocks(page))
]


def test_every_block_runs_or_says_why_not():
    assert PAGES, "mkdocs.yml has no nav pages"
    problems = []
    for page in PAGES:
        for block in blocks(page):
            if block.directive is not None and not block.directive.startswith(("skip", "replace")):
                problems.append(f"{block.where}: unknown docs-test directive {block.directive!r}")
            elif block.skip_reason == "":
                problems.append(f"{block.where}: a skipped block must say why (and how long it would take)")
            elif block.lang not in OUTPUT_LANGUAGES | {"python"} and block.skip_reason is None:
                problems.append(
                    f"{block.where}: a {block.lang} block is not run here: mark it docs-test skip"
                )
            elif block.lang == "python":
                try:
                    compile(block.runnable_code(), block.where, "exec")
                except (ValueError, SyntaxError) as error:
                    problems.append(str(error))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_page_code_runs(page, tmp_path, monkeypatch):
    from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMERV3_SMOKE
    from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE

    monkeypatch.chdir(tmp_path)
    namespace = {
        "__name__": "__docs__",
        "TDMPC2_TINY": {**TDMPC2_SMOKE, "seed_steps": 200},
        "DREAMERV3_TINY": {**DREAMERV3_SMOKE, "n_envs": 1},  # one env: one compiled update size
    }
    threads = torch.get_num_threads()  # a page may set it (SAC's comparison): restored for later tests
    try:
        for block in blocks(page):
            if block.lang != "python" or block.skip_reason is not None:
                continue
            exec(compile(block.runnable_code(), block.where, "exec"), namespace)
    finally:
        torch.set_num_threads(threads)


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t and not t.startswith("mailto:")]
    assert local, "README.md links to no page"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


@pytest.mark.skipif(shutil.which("mkdocs") is None, reason="mkdocs is not installed (the docs extra)")
def test_site_builds_strict(tmp_path):
    """Every page builds, and every relative link and anchor resolves (about 5 s)."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]

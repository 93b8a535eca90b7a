"""The second tier's table names tests that exist: a renamed test must not slip into the default run."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import EXTENDED_FILES, EXTENDED_TESTS

TESTS = Path(__file__).parent


def _functions(file: str) -> set[str]:
    tree = ast.parse((TESTS / file).read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def test_every_extended_file_exists() -> None:
    missing = [file for file in EXTENDED_FILES if not (TESTS / file).is_file()]
    assert not missing, f"tests/conftest.py EXTENDED_FILES names files that do not exist: {missing}"


def test_every_extended_test_exists() -> None:
    missing = []
    for entry in EXTENDED_TESTS:
        file, function = entry.split("::")
        if not (TESTS / file).is_file() or function.split("[")[0] not in _functions(file):
            missing.append(entry)
    assert not missing, f"tests/conftest.py EXTENDED_TESTS names tests that do not exist: {missing}"


def test_every_extended_parametrisation_exists() -> None:
    """An entry ``file::function[id]`` names one collected parametrisation (ids change with params)."""
    entries = [entry for entry in EXTENDED_TESTS if "[" in entry]
    files = sorted({f"tests/{entry.split('::')[0]}" for entry in entries})
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "extended or not extended", *files],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    missing = [entry for entry in entries if f"tests/{entry}" not in collected.splitlines()]
    assert not missing, f"tests/conftest.py EXTENDED_TESTS names parametrisations not collected: {missing}"

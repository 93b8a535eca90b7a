"""Break one term of an update at a time and see which parity test catches it.

Each break is a test-only switch of the package (:mod:`sb3_worldmodels.blocks.breaks`: a loss scale, a
normaliser, a stop-gradient, the clip, a target, the schedule), consulted where the term is computed
and free when off. For every break the agent's parity tests run in a fresh process with that switch
on (the environment variable ``SB3WM_BREAKS``); the checkout is never modified. A break that no test
catches is a missing test.

    python tools/break_one_term.py                      # every break, both agents
    python tools/break_one_term.py --agent tdmpc2 --only policy_clip
    python tools/break_one_term.py --markdown /tmp/breaks.md  # the table for docs/fidelity_checks.md

Writes a JSON record (``--out``) and, with ``--markdown``, the table that docs/fidelity_checks.md shows
(the file given is overwritten with the bare table).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without install

from sb3_worldmodels.blocks.breaks import BREAKS, ENV_VAR  # noqa: E402

TESTS = {
    "dreamerv3": [
        "tests/test_dreamerv3_parity.py",
        "tests/test_dreamerv3_parity_trained.py",
        "tests/test_dreamerv3_parity_images.py",
    ],
    "tdmpc2": ["tests/test_tdmpc2_parity.py", "tests/test_tdmpc2_parity_trained.py"],
}


def run_break(name: str | None, agent: str, timeout: int) -> dict:
    """Run the agent's parity tests with the switch ``name`` on (None: the control run, none on)."""
    tests = [t for t in TESTS[agent] if (ROOT / t).exists()]
    # One compilation cache for all runs: the functions a break does not touch compile once.
    cache = Path(tempfile.gettempdir()) / "break-one-term-jax-cache"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        ENV_VAR: name or "",
    }
    env.update(
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0"
    )
    # Every parity test, CI's second tier included (the trained and image ones), not the default run's.
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "not slow"]
    cmd = [*pytest, "-rf", *tests]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    failed = sorted(set(re.findall(r"^FAILED (\S+?)(?: - |$)", proc.stdout, re.M)))
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
    return {
        "tests": tests,
        "failed": failed,
        "summary": summary,
        "seconds": round(time.perf_counter() - start, 1),
    }


def markdown(records: list[dict]) -> str:
    """One row per break: the tests (functions, parameters folded) that failed, and how many did."""
    lines = [
        "| agent | break | what was broken | failed tests | caught by |",
        "|---|---|---|---|---|",
    ]
    for r in records:
        tests = sorted({t.split("::")[-1].split("[")[0] for t in r.get("failed", [])})
        caught = ", ".join(f"`{t}`" for t in tests) or "**nothing: a missing test**"
        count = len(r.get("failed", []))
        lines.append(f"| {r['agent']} | `{r['name']}` | {r['what']} | {count} | {caught} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", choices=["dreamerv3", "tdmpc2"], default=None)
    parser.add_argument("--only", nargs="*", default=None, help="names of breaks to run")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/break_one_term.json")
    parser.add_argument("--markdown", type=Path, default=None, help="print the table to this file too")
    parser.add_argument("--timeout", type=int, default=1800)
    args = parser.parse_args()
    unknown = sorted(set(args.only or ()) - set(BREAKS))
    if unknown:
        parser.error(f"unknown breaks {unknown}; choose from {sorted(BREAKS)}")
    selected = [
        name
        for name, brk in BREAKS.items()
        if args.agent in (None, brk.agent) and (args.only is None or name in args.only)
    ]
    records = []
    for agent in sorted({BREAKS[name].agent for name in selected}):
        control = run_break(None, agent, args.timeout)
        print(f"{agent} control: {control['summary']}", flush=True)
        if control.get("failed") or " passed" not in control["summary"]:
            raise SystemExit(f"the unbroken {agent} parity tests do not pass: {control['summary']}")
        for name in (n for n in selected if BREAKS[n].agent == agent):
            result = run_break(name, agent, args.timeout)
            print(f"{agent} {name}: {result.get('failed') or result}", flush=True)
            records.append({"agent": agent, "name": name, "what": BREAKS[name].what, **result})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(records, indent=1))
    table = markdown(records)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    missed = [r["name"] for r in records if not r["failed"]]
    if missed:
        raise SystemExit(f"no parity test catches {missed}")


if __name__ == "__main__":
    main()

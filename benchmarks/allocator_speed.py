"""glibc's allocator left alone (the default) against ``SB3WM_MALLOC=on`` and against transparent huge
pages for its large blocks (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` at launch), in a process that
compiles its programs and in one that loads them all from the compilation cache.

    python benchmarks/allocator_speed.py --rounds 2 --out benchmarks/results/allocator_cpu.jsonl
    python benchmarks/allocator_speed.py --setting off --setting hugetlb

Each round runs, for each setting in turn, ``dreamerv3_speed.py --config update-1m`` and
``tdmpc2_speed.py --size 1`` twice in fresh processes that share a new, empty compilation cache: the
first compiles every program ("compiles"), the second loads them all ("loads"). One JSON line per
(round, agent, setting, process): the update (and plan) milliseconds and compile seconds the
benchmark reported, with the CPU's model and extensions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from evaluation import run_record  # noqa: E402

from sb3_worldmodels.blocks.cpu import cpu_info  # noqa: E402

HERE = Path(__file__).resolve().parent
RUNS = {
    "dreamerv3": ["dreamerv3_speed.py", "--config", "update-1m", "--repeats"],
    "tdmpc2": ["tdmpc2_speed.py", "--size", "1", "--repeats"],
}
KEPT = {
    "dreamerv3": ("ms_per_update_median", "compile_seconds"),
    "tdmpc2": ("plan_ms", "update_ms", "agent_steps_per_s", "plan_compile_s", "update_compile_s"),
}


SETTINGS = {
    "off": {"SB3WM_MALLOC": "off", "GLIBC_TUNABLES": ""},
    "on": {"SB3WM_MALLOC": "on", "GLIBC_TUNABLES": ""},
    "hugetlb": {"SB3WM_MALLOC": "off", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
}
"""The environments compared: glibc as it comes, the package's setting, glibc's large blocks madvised
as transparent huge pages (glibc 2.35 or later; THP in "madvise" or "always" mode)."""


def run(agent: str, setting: str, cache: str, repeats: int) -> dict:
    """One benchmark process of ``agent`` in the environment :data:`SETTINGS` names ``setting``, with
    the compilation cache folder ``cache``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    env.update(SETTINGS[setting], SB3WM_COMPILATION_CACHE=cache)
    script, *args = RUNS[agent]
    out = subprocess.run(
        [sys.executable, str(HERE / script), *args, str(repeats)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    row = json.loads(out.stdout.strip().splitlines()[-1])
    return {key: row[key] for key in KEPT[agent]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--agent", choices=sorted(RUNS), action="append", help="default: both")
    parser.add_argument("--setting", choices=sorted(SETTINGS), action="append", help="default: off, on")
    parser.add_argument("--out", type=Path, help="append the rows to this .jsonl file")
    args = parser.parse_args()
    machine = {**run_record(), **cpu_info().as_dict()}
    for round_ in range(args.rounds):
        for agent in args.agent or sorted(RUNS):
            for setting in args.setting or ["off", "on"]:
                with tempfile.TemporaryDirectory() as cache:
                    for process in ("compiles", "loads"):
                        row = {"round": round_, "agent": agent, "setting": setting, "process": process}
                        row.update(SETTINGS[setting])
                        row.update(run(agent, setting, cache, args.repeats), **machine)
                        line = json.dumps(row)
                        print(line, flush=True)
                        if args.out:
                            with args.out.open("a") as f:
                                f.write(line + "\n")


if __name__ == "__main__":
    main()

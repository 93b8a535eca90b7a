"""Long-run stability: memory, compilation and throughput over hundreds of thousands of rows.

    python benchmarks/long_run.py --agent dreamerv3 --rows 200000 --capacity 5000
    python benchmarks/long_run.py --agent tdmpc2 --rows 200000 --capacity 5000

One ``learn`` call on Pendulum-v1 with the smoke-sized agent (``SMOKE_SETTINGS``: tiny networks, so
the run measures the shell, the replay and the jitted calls rather than the maths) and a replay
capacity far below the run, so the replay is full early and evicts from then on. Every ``--every``
rows a callback records the process's resident memory (VmRSS), the rows per second of the segment,
the number of compiled variants of every jitted agent function, and the replay's bytes.

Acceptance (written before any run): once the replay is full, RSS grows by less than 64 MiB to the
end; no jitted function compiles a new variant after the first segment in which the replay is full;
the rows/s of every segment after it stays within 30% of their median. Writes
benchmarks/results/long_run_<agent>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from evaluation import run_record
from stable_baselines3.common.callbacks import BaseCallback

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.dreamerv3 import agent as dreamer_core
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.tdmpc2 import algorithm as tdmpc2_algorithm
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE

RESULTS = Path(__file__).parent / "results"
RSS_GROWTH_LIMIT_MIB = 64
THROUGHPUT_BAND = 0.30


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def compiled_variants(module) -> dict[str, int]:
    """Compiled variants of every ``*_jit`` function of ``module``."""
    return {
        name: getattr(module, name)._cache_size()
        for name in dir(module)
        if name.endswith("_jit") and hasattr(getattr(module, name), "_cache_size")
    }


def replay_is_full(replay) -> bool:
    """Whether the replay holds (nearly) its capacity: it evicts from now on."""
    if hasattr(replay, "capacity_per_env"):  # DreamerV3's rows
        return replay.size() >= 0.95 * replay.capacity_per_env * replay.n_envs
    return replay.stored_steps >= 0.95 * replay.capacity_steps  # TD-MPC2's steps in whole episodes


class Recorder(BaseCallback):
    def __init__(self, every: int, module) -> None:
        super().__init__()
        self.every, self.module = every, module
        self.points: list[dict] = []
        self.next_at = every
        self.last = (0, time.perf_counter())

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.next_at:
            rows, start = self.last
            now = time.perf_counter()
            replay = self.model.replay_buffer
            self.points.append(
                {
                    "rows": self.num_timesteps,
                    "rss_mib": round(rss_mib(), 1),
                    "rows_per_s": round((self.num_timesteps - rows) / (now - start), 1),
                    "replay_bytes": int(replay.nbytes),
                    "replay_full": replay_is_full(replay),
                    "updates": int(self.model._n_updates),
                    "compiled": compiled_variants(self.module),
                }
            )
            print(json.dumps(self.points[-1]), flush=True)
            self.last = (self.num_timesteps, now)
            self.next_at += self.every
        return True


def verdict(points: list[dict]) -> dict:
    full = next((i for i, p in enumerate(points) if p["replay_full"]), None)
    if full is None or full + 2 > len(points):
        return {"passed": False, "reason": "the replay never filled with segments to spare"}
    after = points[full + 1 :]
    growth = max(p["rss_mib"] for p in after) - points[full]["rss_mib"]
    recompiled = [p["rows"] for p in after if p["compiled"] != points[full]["compiled"]]
    speeds = np.array([p["rows_per_s"] for p in after])
    spread = float(np.max(np.abs(speeds / np.median(speeds) - 1)))
    return {
        "full_at_rows": points[full]["rows"],
        "rss_growth_after_full_mib": round(growth, 1),
        "recompiled_at_rows": recompiled,
        "rows_per_s_median": float(np.median(speeds)),
        "rows_per_s_max_deviation": round(spread, 3),
        "passed": growth < RSS_GROWTH_LIMIT_MIB and not recompiled and spread <= THROUGHPUT_BAND,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", choices=["dreamerv3", "tdmpc2"], default="dreamerv3")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--capacity", type=int, default=5_000)
    parser.add_argument("--every", type=int, default=10_000)
    args = parser.parse_args()
    if args.agent == "dreamerv3":
        model = DreamerV3(
            "Pendulum-v1", **{**DREAMER_SMOKE, "n_envs": 4, "train_ratio": 8}, buffer_size=args.capacity
        )
        module = dreamer_core
    else:
        model = TDMPC2("Pendulum-v1", **TDMPC2_SMOKE, buffer_size=args.capacity, seed_steps=1000)
        module = tdmpc2_algorithm
    recorder = Recorder(args.every, module)
    start = time.perf_counter()
    model.learn(args.rows, callback=recorder)
    result = {
        "agent": args.agent,
        "rows": model.num_timesteps,
        "capacity": args.capacity,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "points": recorder.points,
        **verdict(recorder.points),
        **run_record(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"long_run_{args.agent}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "points"}, indent=1))


if __name__ == "__main__":
    main()

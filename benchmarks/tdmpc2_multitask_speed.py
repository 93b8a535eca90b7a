"""TDMPC2MultiTask offline training speed and memory (CPU).

    python benchmarks/tdmpc2_multitask_speed.py                      # sizes 1 and 5, batch 256
    python benchmarks/tdmpc2_multitask_speed.py --sizes 1 --updates 20 --entries 100000
    python benchmarks/tdmpc2_multitask_speed.py --sizes 1 --seeds 1 4 8 --out tdmpc2_multitask_seeds.json

Builds a pool of two synthetic tasks with the widest widths of the reference's mt30 DMC tasks and the
narrowest (24 observations / 6 actions, as walker and cheetah's family, and 5 / 1, as cartpole), in
episodes of 501 entries as the released data, ``--entries`` entries in all. For each model size it
times ``--updates`` gradient updates (``learn``, batch 256, the reference's default; after a warm-up
that compiles) and reports updates per second, the pool's bytes per million stored entries (on disk,
memory-mapped) and the process's resident memory after training. Writes
benchmarks/results/tdmpc2_multitask_speed.json (``--out`` names another file there).

``--seeds 1 4 8`` also times seed groups (``seed=[0, ..., N - 1]``: N models trained in one program,
each update one call for all seeds) beside one seed, in the same process: milliseconds per update of
the group and per seed's update, under ``seed_groups``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from evaluation import run_record

from sb3_worldmodels import TDMPC2MultiTask, pool_tasks

RESULTS = Path(__file__).parent / "results"
TASKS = {"wide": (24, 6), "narrow": (5, 1)}  # name -> (obs_dim, action_dim)
EPISODE_ENTRIES = 501


def synthetic_export(path: Path, obs_dim: int, action_dim: int, episodes: int, seed: int) -> Path:
    """An episode export (the documented format) of random entries."""
    rng = np.random.default_rng(seed)
    entries = episodes * EPISODE_ENTRIES
    np.savez(
        path,
        format="sb3_worldmodels.episodes",
        version=1,
        obs_dim=obs_dim,
        action_dim=action_dim,
        episode_length=EPISODE_ENTRIES - 1,
        obs=rng.normal(size=(entries, obs_dim)).astype(np.float32),
        action=rng.uniform(-1, 1, (entries, action_dim)).astype(np.float32),
        reward=rng.uniform(0, 1, entries).astype(np.float32),
        episode_starts=np.arange(episodes + 1, dtype=np.int64) * EPISODE_ENTRIES,
    )
    return path


def resident_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--updates", type=int, default=50)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="seed counts (N > 1: a group)")
    parser.add_argument("--out", default="tdmpc2_multitask_speed.json", help="file in benchmarks/results")
    args = parser.parse_args()
    episodes = max(1, args.entries // (EPISODE_ENTRIES * len(TASKS)))
    result: dict = {"batch_size": args.batch_size, "updates": args.updates, "sizes": {}, **run_record()}
    result["devices"] = f"{jax.device_count()} x {jax.devices()[0].device_kind}"
    with tempfile.TemporaryDirectory() as folder:
        sources = {
            name: synthetic_export(Path(folder) / f"{name}.npz", o, a, episodes, seed)
            for seed, (name, (o, a)) in enumerate(TASKS.items())
        }
        pool = pool_tasks(sources, Path(folder) / "pool")
        for source in sources.values():
            source.unlink()
        result["pool"] = {
            "entries": pool.num_entries,
            "obs_dim": pool.obs_dim,
            "action_dim": pool.action_dim,
            "bytes": pool.nbytes,
            "bytes_per_million_entries": round(pool.nbytes / pool.num_entries * 1e6),
        }
        for size in args.sizes:
            for n_seeds in args.seeds:
                seed: int | list[int] = 0 if n_seeds == 1 else list(range(n_seeds))
                model = TDMPC2MultiTask(pool, model_size=size, batch_size=args.batch_size, seed=seed)
                model.learn(3)  # compiles
                start = time.perf_counter()
                model.learn(args.updates)
                seconds = time.perf_counter() - start
                row = {
                    "updates_per_second": round(args.updates / seconds, 3),
                    "ms_per_update": round(1e3 * seconds / args.updates, 1),
                    "resident_mib_after": round(resident_mib(), 1),
                    "task_dim": model.config.task_dim,
                }
                if n_seeds == 1:
                    result["sizes"][str(size)] = row
                if args.seeds != [1]:
                    row = {**row, "ms_per_seed_update": round(1e3 * seconds / args.updates / n_seeds, 2)}
                    result.setdefault("seed_groups", {}).setdefault(str(size), {})[str(n_seeds)] = row
                print(json.dumps({"size": size, "seeds": n_seeds, **row}), flush=True)
                del model
    out = RESULTS / args.out
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "sizes"}))


if __name__ == "__main__":
    main()

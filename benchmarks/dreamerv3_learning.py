"""DreamerV3 learning checks on Gymnasium's classic control tasks (CPU).

    python benchmarks/dreamerv3_learning.py --task pendulum --seed 0   # 20,000 rows, "1m", 16 envs, ratio 512
    python benchmarks/dreamerv3_learning.py --task cartpole --seed 0   # 24,000 rows, same settings

Acceptance (written before any run): Pendulum-v1, final evaluation (10 episodes) >= -300;
CartPole-v1, mean evaluation of the sampling policy (10 episodes every 2,000 rows) over rows
12,000-24,000 >= 250.

The run is checkpointed at every evaluation (model, replay, curves) in
benchmarks/results/checkpoints/dreamerv3_<task>_seed<seed>/; the same command resumes from there (a
check longer than one sitting can span several processes; ``--stop-after-hours`` ends a process
cleanly after an evaluation). The train/* statistics go to progress.csv files in that folder (one
per process). Writes the curve to benchmarks/results/dreamerv3_<task>_seed<seed>.json, with
``"done": false`` until the last row.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
from evaluation import evaluate_fresh, learn_in_segments, run_record
from stable_baselines3.common.logger import configure
from stable_baselines3.common.monitor import Monitor

from sb3_worldmodels import DreamerV3

TASKS = {
    "pendulum": dict(env="Pendulum-v1", rows=20_000, threshold=-300.0, deterministic=False),
    "cartpole": dict(env="CartPole-v1", rows=24_000, threshold=250.0, deterministic=False),
}
PAPER_ERA = dict(model_size="1m", n_envs=16, train_ratio=512, batch_size=16, batch_length=64)
EVAL_EVERY = 2_000
RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", choices=TASKS, default="pendulum")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument(
        "--checkpoint", type=Path, default=None, help="checkpoint folder (default: see above)"
    )
    parser.add_argument("--stop-after-hours", type=float, default=None)
    args = parser.parse_args()
    task = TASKS[args.task]
    rows = args.rows or task["rows"]
    name = f"dreamerv3_{args.task}_seed{args.seed}"
    checkpoint = args.checkpoint or RESULTS / "checkpoints" / name

    def make_model() -> DreamerV3:
        return DreamerV3(task["env"], seed=args.seed, **PAPER_ERA)

    def make_eval_env(seed: int) -> gym.Env:
        env = Monitor(gym.make(task["env"]))
        env.reset(seed=seed)
        return env

    stop = None if args.stop_after_hours is None else 3600 * args.stop_after_hours
    model, record = learn_in_segments(
        make_model,
        rows,
        evaluate_fresh(make_eval_env, args.seed, 10, task["deterministic"]),
        eval_every=EVAL_EVERY,
        checkpoint_every=EVAL_EVERY,
        checkpoint=checkpoint,
        x_key="rows",
        stop_after_seconds=stop,
        logger=lambda start: configure(str(checkpoint / f"log_from_{start}"), ["csv"]),
    )
    curve = record["curve"]
    if args.task == "pendulum":
        score = curve[-1]["eval_mean"]
    else:
        score = float(np.mean([p["eval_mean"] for p in curve if p["rows"] >= 12_000] or [np.nan]))
    result = {
        "task": args.task,
        "seed": args.seed,
        "rows": model.num_timesteps,
        "done": record["done"],
        "updates": model._n_updates,
        "wall_seconds": record["seconds"],
        "resumed_at": record["resumed_at"],
        "score": score,
        "threshold": task["threshold"],
        "passed": bool(record["done"] and score >= task["threshold"]),
        "settings": PAPER_ERA,
        **run_record(),
        "curve": curve,
        "train_curve": record["train_curve"],
    }
    out = RESULTS / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("curve", "train_curve")}))


if __name__ == "__main__":
    main()

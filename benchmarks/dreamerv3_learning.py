"""DreamerV3 learning checks on Gymnasium's classic control tasks (CPU).

    python benchmarks/dreamerv3_learning.py --task pendulum --seed 0   # 20,000 rows, "1m", 16 envs, ratio 512
    python benchmarks/dreamerv3_learning.py --task cartpole --seed 0   # 24,000 rows, same settings

Acceptance (written before any run): Pendulum-v1, final evaluation (10 episodes) >= -300;
CartPole-v1, mean evaluation of the sampling policy (10 episodes every 2,000 rows) over rows
12,000-24,000 >= 250. Writes the curve to benchmarks/results/dreamerv3_<task>_seed<seed>.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from evaluation import EvalEvery, run_record
from stable_baselines3.common.monitor import Monitor

from sb3_worldmodels import DreamerV3

TASKS = {
    "pendulum": dict(env="Pendulum-v1", rows=20_000, threshold=-300.0, deterministic=False),
    "cartpole": dict(env="CartPole-v1", rows=24_000, threshold=250.0, deterministic=False),
}
PAPER_ERA = dict(model_size="1m", n_envs=16, train_ratio=512, batch_size=16, batch_length=64)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", choices=TASKS, default="pendulum")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", type=int, default=None)
    args = parser.parse_args()
    task = TASKS[args.task]
    rows = args.rows or task["rows"]
    model = DreamerV3(task["env"], seed=args.seed, **PAPER_ERA)

    def make_eval_env():
        env = Monitor(gym.make(task["env"]))
        env.reset(seed=10_000 + args.seed)
        return env

    callback = EvalEvery(make_eval_env, 2_000, 10, task["deterministic"], x_key="rows")
    start = time.time()
    model.learn(rows, callback=callback)
    callback.finish()
    if args.task == "pendulum":
        score = callback.curve[-1]["eval_mean"]
    else:
        score = float(np.mean([p["eval_mean"] for p in callback.curve if p["rows"] >= 12_000]))
    result = {
        "task": args.task,
        "seed": args.seed,
        "rows": model.num_timesteps,
        "updates": model._n_updates,
        "wall_seconds": round(time.time() - start, 1),
        "score": score,
        "threshold": task["threshold"],
        "passed": score >= task["threshold"],
        "settings": PAPER_ERA,
        **run_record(),
        "curve": callback.curve,
        "train_curve": callback.train_curve,
    }
    out = Path(__file__).parent / "results" / f"dreamerv3_{args.task}_seed{args.seed}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}))


if __name__ == "__main__":
    main()

"""Quick start: train DreamerV3 on Pendulum-v1 with the smallest preset for a few CPU minutes.

    python examples/quickstart.py [--rows 3000]

A budget this small shows the whole pipeline (collection, world-model training, imagination,
evaluation); Pendulum needs about 20,000 rows at the paper's train ratio to swing up
(see docs/performance.md).
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor

from sb3_worldmodels import DreamerV3
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMERV3_SMOKE

TINY = dict(**DREAMERV3_SMOKE, n_envs=2)  # fmt: skip


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=3_000, help="training budget in replay rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="a tiny model and 200 rows (CI)")
    args = parser.parse_args(argv)

    settings = dict(model_size="1m", n_envs=4, train_ratio=64, batch_size=8, batch_length=32)
    if args.tiny:
        settings.update(TINY)
    model = DreamerV3("Pendulum-v1", seed=args.seed, verbose=1, **settings)
    rows = 200 if args.tiny else args.rows
    start = time.time()
    model.learn(rows, log_interval=8)
    print(f"trained {model.num_timesteps} rows, {model._n_updates} updates in {time.time() - start:.0f} s")

    eval_env = Monitor(gym.make("Pendulum-v1"))
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=3, deterministic=False)
    print(f"evaluation over 3 episodes (sampling policy): {mean:.1f} +/- {std:.1f}")
    return mean


if __name__ == "__main__":
    main()

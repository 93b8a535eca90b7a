"""Quick start: TD-MPC2 learns to swing up Pendulum-v1 in about five minutes on a laptop CPU.

    python examples/quickstart.py                       # 2,000 agent steps, every episode's return
    python examples/quickstart.py --tensorboard runs/   # also logs to TensorBoard
    python examples/quickstart.py --paper               # the paper's planner and batch (slower)
    python examples/quickstart.py --tiny                # a tiny model and 300 steps (the test suite)

The first 1,000 steps act at random (TD-MPC2's ``seed_steps``), then 1,000 updates run in a row on
those episodes, and from then on the agent plans every action and trains once per step. Pendulum's
returns go from -800 ... -1,600 (random) to -100 ... -300 in the first planned episodes. Model size 1
with a lighter planner and batch than the paper's (256 samples and 4 iterations instead of 512 and
6, batches of 128 instead of 256) takes about half the time per step. Measured figures:
docs/getting-started.md.
"""

from __future__ import annotations

import argparse
import time

from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_worldmodels import TDMPC2
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE

QUICK = dict(model_size=1, num_samples=256, iterations=4, batch_size=128)
PAPER = dict(model_size=1)  # the paper's planner (512 samples, 6 iterations) and batch (256)
TINY = dict(**TDMPC2_SMOKE, seed_steps=200)  # fmt: skip


class PrintEpisodes(BaseCallback):
    """Prints the return of every finished training episode (the Monitor's ``episode`` record)."""

    def _on_training_start(self) -> None:
        self.start = time.perf_counter()

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:
                seconds = time.perf_counter() - self.start
                phase = "random" if self.num_timesteps <= self.model.seed_steps else "planned"
                print(
                    f"step {self.num_timesteps:>6,}  episode return {info['episode']['r']:>8.1f}  "
                    f"({phase}, {seconds:.0f} s)",
                    flush=True,
                )
        return True


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2_000, help="agent steps to train")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tensorboard", default=None, help="a folder for TensorBoard logs")
    parser.add_argument("--paper", action="store_true", help="the paper's planner and batch size")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and 300 steps (CI)")
    args = parser.parse_args(argv)

    settings = TINY if args.tiny else PAPER if args.paper else QUICK
    model = TDMPC2("Pendulum-v1", seed=args.seed, tensorboard_log=args.tensorboard, **settings)
    steps = 300 if args.tiny else args.steps
    start = time.perf_counter()
    model.learn(steps, callback=PrintEpisodes())
    seconds = time.perf_counter() - start
    print(f"trained {model.num_timesteps:,} steps, {model._n_updates:,} updates in {seconds:.0f} s")

    episodes = 1 if args.tiny else 3
    eval_env = make_vec_env("Pendulum-v1", n_envs=1, seed=1_000 + args.seed)  # episodes not trained on
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=episodes, deterministic=True)
    print(f"evaluation over {episodes} episodes: {mean:.1f} +/- {std:.1f}")
    return mean


if __name__ == "__main__":
    main()

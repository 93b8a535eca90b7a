"""What the learning benchmarks share: periodic evaluation on fresh episodes, and run records."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy


class EvalEvery(BaseCallback):
    """Evaluates every ``every`` counted steps (``num_timesteps``) on ``episodes`` fresh episodes.

    Each point records ``x_key`` (the counted steps), ``frames`` (steps x ``action_repeat``),
    the mean evaluation return, the update count and the wall-clock seconds; every finished
    training episode (SB3's Monitor info) is recorded in ``train_curve`` with the same counters.
    """

    def __init__(
        self,
        make_env: Callable,
        every: int,
        episodes: int,
        deterministic: bool,
        x_key: str = "steps",
        action_repeat: int = 1,
    ) -> None:
        super().__init__()
        self.env = make_env()
        self.every, self.episodes, self.deterministic = every, episodes, deterministic
        self.x_key, self.action_repeat = x_key, action_repeat
        self.next_at = every
        self.curve: list[dict] = []
        self.train_curve: list[dict] = []
        self.start = time.time()

    def evaluate(self) -> None:
        rewards, _ = evaluate_policy(
            self.model,
            self.env,
            n_eval_episodes=self.episodes,
            deterministic=self.deterministic,
            return_episode_rewards=True,
        )
        recent = [p["return"] for p in self.train_curve[-self.episodes :]]
        point = {
            self.x_key: self.num_timesteps,
            "frames": self.num_timesteps * self.action_repeat,
            "eval_mean": float(np.mean(rewards)),
            "train_mean": float(np.mean(recent)) if recent else None,
            "updates": self.model._n_updates,
            "seconds": round(time.time() - self.start, 1),
        }
        self.curve.append(point)
        print(json.dumps(point), flush=True)

    def finish(self) -> None:
        """Evaluate once more unless the last point is at the final step."""
        if not self.curve or self.curve[-1][self.x_key] < self.num_timesteps:
            self.evaluate()

    def _on_step(self) -> bool:
        for info in self.locals.get("infos", []):
            if "episode" in info:  # Monitor: a training episode ended (exploration on)
                self.train_curve.append(
                    {
                        self.x_key: self.num_timesteps,
                        "frames": self.num_timesteps * self.action_repeat,
                        "return": float(info["episode"]["r"]),
                    }
                )
        if self.every and self.num_timesteps >= self.next_at:
            self.next_at += self.every
            self.evaluate()
        return True


def run_record() -> dict:
    """Where and when a result was measured."""
    return {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "date": time.strftime("%Y-%m-%d"),
    }

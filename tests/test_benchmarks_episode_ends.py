"""benchmarks/cartpole_episode_ends.py: how a CartPole-v1 episode ended, from real episodes."""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

from cartpole_episode_ends import episode_end, play  # noqa: E402


class ConstantPolicy:
    """``predict`` as SB3's: always the same action, the state passed through."""

    def __init__(self, action: int) -> None:
        self.action = action
        self.calls = 0

    def predict(self, observation, state=None, episode_start=None, deterministic=False):
        assert observation.shape == (1, 4)
        self.calls += 1
        return np.array([self.action]), state


class CenteringPolicy:
    """Pushes under the pole (a hand-made controller that balances it and keeps the cart near 0)."""

    def predict(self, observation, state=None, episode_start=None, deterministic=False):
        x, x_dot, angle, angle_dot = observation[0]
        return np.array([int(angle + 0.5 * angle_dot + 0.01 * x + 0.1 * x_dot > 0)]), state


def test_constant_push_ends_by_the_pole():
    policy = ConstantPolicy(1)
    row = play(policy, seed=0, deterministic=False)
    assert row["end"] == "pole"
    assert row["return"] == policy.calls < 50
    assert len(row["cart_x"]) == 4 and row["cart_x"][-1] > 0  # pushed right


def test_a_balancing_controller_reaches_the_time_limit():
    row = play(CenteringPolicy(), seed=1, deterministic=True)
    assert row["end"] == "limit" and row["return"] == 500.0


def test_the_cart_off_the_track_is_told_apart_from_the_pole():
    cartpole = gym.make("CartPole-v1").unwrapped  # limits: |x| 2.4, |angle| 12 degrees
    assert episode_end(np.array([2.41, 0.0, 0.0, 0.0]), cartpole) == "cart"
    assert episode_end(np.array([-2.41, 0.0, 0.25, 0.0]), cartpole) == "cart"
    assert episode_end(np.array([0.0, 0.0, -0.21, 0.0]), cartpole) == "pole"
    assert episode_end(np.array([2.39, 0.0, 0.2, 0.0]), cartpole) == "limit"

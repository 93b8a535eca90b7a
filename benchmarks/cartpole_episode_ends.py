"""Why a saved DreamerV3 agent's CartPole-v1 episodes end: the pole falls, the cart leaves the track,
or the 500-step limit.

    python benchmarks/cartpole_episode_ends.py <checkpoint folder>/model_<rows>.zip

Plays ``--episodes`` episodes (seeds 100, 101, ...) with ``predict`` as ``evaluate_policy`` calls it
(its recurrent state carried, the sampling policy unless ``--deterministic``) and prints one JSON row
per episode: the return, the cause of the end, and the cart's position at each quarter of the episode.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np


def episode_end(observation: np.ndarray, cartpole: Any) -> str:
    """How an episode that has ended ended: "cart" (past the track's end), "pole" (past the angle
    limit) or "limit" (neither: the time limit), by the thresholds of ``cartpole`` (the unwrapped env)."""
    if abs(observation[0]) > cartpole.x_threshold:
        return "cart"
    if abs(observation[2]) > cartpole.theta_threshold_radians:
        return "pole"
    return "limit"


def play(model: Any, seed: int, deterministic: bool) -> dict:
    """One episode with ``model.predict`` → its return, how it ended and the cart's x at each quarter."""
    env = gym.make("CartPole-v1")
    observation, _ = env.reset(seed=seed)
    state, start = None, np.ones(1, dtype=bool)
    total, positions = 0.0, []
    done = False
    while not done:
        action, state = model.predict(
            observation[None], state=state, episode_start=start, deterministic=deterministic
        )
        start = np.zeros(1, dtype=bool)
        observation, reward, terminated, truncated, _ = env.step(int(action[0]))
        total += float(reward)
        positions.append(float(observation[0]))
        done = terminated or truncated
    end = episode_end(observation, env.unwrapped)
    env.close()
    quarters = [positions[min(len(positions) - 1, len(positions) * q // 4)] for q in (1, 2, 3, 4)]
    return {"seed": seed, "return": total, "end": end, "cart_x": quarters}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", type=Path, help="a saved DreamerV3 model (.zip)")
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--deterministic", action="store_true")
    args = parser.parse_args()
    from sb3_worldmodels import DreamerV3

    model = DreamerV3.load(args.model)
    for episode in range(args.episodes):
        row = play(model, 100 + episode, args.deterministic)
        print(json.dumps({**row, "cart_x": [round(x, 2) for x in row["cart_x"]]}), flush=True)


if __name__ == "__main__":
    main()

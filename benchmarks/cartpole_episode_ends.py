"""Why a saved agent's CartPole-v1 episodes end: the pole falls, the cart leaves the track, or the
500-step limit.

    python benchmarks/cartpole_episode_ends.py \
        benchmarks/results/checkpoints/dreamerv3_cartpole_seed2/model_16008.zip

Plays ``--episodes`` episodes (seeds 100, 101, ...) with ``predict`` as ``evaluate_policy`` calls it
(its recurrent state carried, the sampling policy unless ``--deterministic``) and prints one JSON row
per episode: the return, the cause of the end, and the cart's position at each quarter of the episode.
CartPole-v1 terminates when |x| > 2.4 or |angle| > 0.2095 rad (gymnasium's cartpole.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gymnasium as gym
import numpy as np

X_LIMIT = 2.4
ANGLE_LIMIT = 12 * 2 * np.pi / 360


def episode_end(observation: np.ndarray, truncated: bool) -> str:
    """ "cart" (|x| past the track's end), "pole" (angle past 12 degrees) or "limit" (time limit)."""
    if abs(observation[0]) > X_LIMIT:
        return "cart"
    if abs(observation[2]) > ANGLE_LIMIT:
        return "pole"
    return "limit" if truncated else "running"


def play(model, seed: int, deterministic: bool) -> dict:
    """One episode with ``model.predict`` → its return, how it ended and the cart's path."""
    env = gym.make("CartPole-v1")
    observation, _ = env.reset(seed=seed)
    state, start = None, np.ones(1, dtype=bool)
    total, positions = 0.0, []
    while True:
        action, state = model.predict(
            observation[None], state=state, episode_start=start, deterministic=deterministic
        )
        start = np.zeros(1, dtype=bool)
        observation, reward, terminated, truncated, _ = env.step(int(action[0]))
        total += float(reward)
        positions.append(float(observation[0]))
        if terminated or truncated:
            break
    quarters = [positions[min(len(positions) - 1, len(positions) * q // 4)] for q in (1, 2, 3, 4)]
    return {"seed": seed, "return": total, "end": episode_end(observation, truncated), "cart_x": quarters}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", type=Path, help="a saved model (.zip)")
    parser.add_argument("--agent", choices=("dreamerv3", "tdmpc2"), default="dreamerv3")
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--deterministic", action="store_true")
    args = parser.parse_args()
    from sb3_worldmodels import TDMPC2, DreamerV3

    model = (DreamerV3 if args.agent == "dreamerv3" else TDMPC2).load(args.model)
    for episode in range(args.episodes):
        row = play(model, 100 + episode, args.deterministic)
        print(json.dumps({**row, "cart_x": [round(x, 2) for x in row["cart_x"]]}), flush=True)


if __name__ == "__main__":
    main()

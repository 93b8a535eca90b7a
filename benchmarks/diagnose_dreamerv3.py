"""What a saved DreamerV3 knows about its env: run episodes and compare the model's beliefs with what
happens (for the learning checks' checkpoints; discrete or continuous actions, any Gymnasium id).

    python benchmarks/diagnose_dreamerv3.py benchmarks/results/checkpoints/dreamerv3_cartpole_seed1 \
        --env CartPole-v1 --episodes 10

At every step of an episode played with ``predict`` (the sampling policy unless ``--deterministic``):
the actor's entropy at the current belief, and, one step open loop along the action taken
(``predict_rollout``), the predicted reward and continue probability of the next step and the
critic's value there. Printed per episode and overall: the return and length; the mean absolute
reward error; the mean continue probability before the last step and at a real termination; the
critic's value against the discounted return that followed (gamma = 1 - 1/return_horizon; known
only for episodes that terminated, where nothing follows the termination); the mean actor entropy.
One JSON line per episode and one summary line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gymnasium as gym
import jax
import numpy as np

from sb3_worldmodels import DreamerV3
from sb3_worldmodels.dreamerv3 import agent as core
from sb3_worldmodels.dreamerv3.networks import features


def actor_entropy(model: DreamerV3, state: tuple[np.ndarray, ...]) -> float:
    config, params = model._config, model.policy.state["agent"].params
    dist = core._actor(
        config, params["actor"], features(jax.numpy.asarray(state[0]), jax.numpy.asarray(state[1]))
    )
    return float(core._actor_entropy(config, dist)[0])


def run_episode(model: DreamerV3, env: gym.Env, seed: int, deterministic: bool) -> dict:
    obs, _ = env.reset(seed=seed)
    state, start = None, np.ones(1, bool)
    steps: list[dict] = []
    while True:
        action, state = model.predict(
            obs[None], state=state, episode_start=start, deterministic=deterministic
        )
        start = np.zeros(1, bool)
        entropy = actor_entropy(model, state)
        env_action = np.asarray(action).reshape((1, 1, *np.shape(action)[1:]))
        predicted = model.predict_rollout(state, env_action)
        obs, reward, terminated, truncated, _ = env.step(action[0])
        steps.append(
            {
                "reward": float(reward),
                "terminated": bool(terminated),
                "pred_reward": float(predicted["reward"][0, 0]),
                "pred_continue": float(predicted["continue"][0, 0]),
                "pred_value": float(predicted["value"][0]),
                "entropy": entropy,
            }
        )
        if terminated or truncated:
            return {"steps": steps, "terminated": bool(terminated)}


def summarize(episode: dict, gamma: float) -> dict:
    steps = episode["steps"]
    rewards = np.array([s["reward"] for s in steps])
    n = len(steps)
    # Discounted return after step t (from state t+1 on), with gamma^k; zero after a termination.
    after = np.zeros(n)
    for t in range(n - 2, -1, -1):
        after[t] = rewards[t + 1] + gamma * after[t + 1]
    cont = np.array([s["pred_continue"] for s in steps])
    values = np.array([s["pred_value"] for s in steps])
    return {
        "return": float(rewards.sum()),
        "length": n,
        "terminated": episode["terminated"],
        "reward_abs_error": float(np.mean(np.abs(rewards - [s["pred_reward"] for s in steps]))),
        "continue_alive": float(cont[:-1].mean()) if n > 1 else None,
        "continue_at_termination": float(cont[-1]) if episode["terminated"] else None,
        "value_mean": float(values[:-1].mean()) if n > 1 else None,
        "return_after_mean": float(after[:-1].mean()) if n > 1 and episode["terminated"] else None,
        "entropy_mean": float(np.mean([s["entropy"] for s in steps])),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", type=Path, help="a folder with model.zip, or a model .zip")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=20_000)
    parser.add_argument("--deterministic", action="store_true")
    args = parser.parse_args()
    path = args.checkpoint / "model.zip" if args.checkpoint.is_dir() else args.checkpoint
    model = DreamerV3.load(path)
    gamma = 1.0 - 1.0 / model.return_horizon
    env = gym.make(args.env)
    rows = []
    for i in range(args.episodes):
        row = summarize(run_episode(model, env, args.seed + i, args.deterministic), gamma)
        rows.append(row)
        print(json.dumps(row), flush=True)

    def mean(key: str) -> float | None:
        values = [r[key] for r in rows if r[key] is not None]
        return float(np.mean(values)) if values else None

    keys = ("return", "length", "reward_abs_error", "continue_alive", "continue_at_termination")
    summary = {k: mean(k) for k in (*keys, "value_mean", "return_after_mean", "entropy_mean")}
    summary.update(rows=int(model.num_timesteps), updates=int(model._n_updates), episodes=len(rows))
    print(json.dumps({"summary": summary}))


if __name__ == "__main__":
    main()

"""What TD-MPC2's world model expected, against what happened.

    python examples/world_model_predictions.py                 # size 1 on Pendulum-v1, 3,000 steps
    python examples/world_model_predictions.py --tiny          # seconds (CI)

After training, one evaluation episode is run with ``predict``. At every step the model predicts the
reward of the action it takes (``predict_rollout``, one step), and every ``--every`` steps the
rewards along its whole plan (``predict_plan_rollout`` on ``predict``'s state: the planned trajectory
over the horizon) are drawn from that step on. The real rewards are drawn beside them. Writes
``world_model_predictions.png`` (needs matplotlib) and ``world_model_predictions.csv``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import gymnasium as gym
import numpy as np

from sb3_worldmodels import TDMPC2
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE

TINY = dict(
    **TDMPC2_SMOKE, seed_steps=50,
)  # fmt: skip


def record_episode(model: TDMPC2, env: gym.Env, every: int, seed: int) -> dict:
    """One deterministic episode: real rewards, one-step predictions, and plans every ``every`` steps."""
    obs, _ = env.reset(seed=seed)
    state, start = None, np.ones(1, bool)
    real, predicted, plans = [], [], []
    done, t = False, 0
    while not done:
        action, state = model.predict(obs, state=state, episode_start=start, deterministic=True)
        predicted.append(float(model.predict_rollout(obs, action[None])["reward"][0]))
        if t % every == 0:
            plans.append((t, model.predict_plan_rollout(obs, state[0][0])["reward"]))
        obs, reward, terminated, truncated, _ = env.step(action)
        real.append(float(reward))
        done, start, t = terminated or truncated, np.zeros(1, bool), t + 1
    return {"real": np.array(real), "predicted": np.array(predicted), "plans": plans}


def plot(record: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(record["real"], color="black", label="real reward")
    ax.plot(record["predicted"], color="tab:blue", alpha=0.7, label="predicted (taken action)")
    for i, (t, rewards) in enumerate(record["plans"]):
        ax.plot(range(t, t + len(rewards)), rewards, color="tab:orange", marker=".",
                label="predicted along the plan" if i == 0 else None)  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3_000)
    parser.add_argument("--every", type=int, default=10, help="steps between drawn plans")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and 150 steps (CI)")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    env_kwargs = {"max_episode_steps": 100} if args.tiny else {}
    env = gym.make("Pendulum-v1", **env_kwargs)
    model = TDMPC2("MlpPolicy", env, seed=0, **(TINY if args.tiny else {"model_size": 1}))
    model.learn(150 if args.tiny else args.steps)

    record = record_episode(model, gym.make("Pendulum-v1", **env_kwargs), args.every, seed=1)
    error = np.abs(record["predicted"] - record["real"])
    print(f"one-step reward prediction: mean absolute error {error.mean():.3f} "
          f"(real rewards range {record['real'].min():.2f} to {record['real'].max():.2f})")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "world_model_predictions.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "real_reward", "predicted_reward"])
        writer.writerows(zip(range(len(error)), record["real"], record["predicted"], strict=True))
    if plot(record, args.out / "world_model_predictions.png"):
        print(f"wrote {args.out / 'world_model_predictions.png'}")
    return record


if __name__ == "__main__":
    main()

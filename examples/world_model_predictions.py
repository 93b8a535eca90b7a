"""What the world model expected, against what happened (TD-MPC2 or DreamerV3).

    python examples/world_model_predictions.py                      # TD-MPC2 size 1, Pendulum-v1
    python examples/world_model_predictions.py --agent dreamerv3    # DreamerV3 "1m", Pendulum-v1
    python examples/world_model_predictions.py --tiny               # seconds (CI); with either agent

After training, one evaluation episode is run with ``predict``. At every step the model predicts the
reward of the action it takes (``predict_rollout``, one step). Every ``--every`` steps a longer
prediction is drawn from that step on:

- TD-MPC2: the rewards along its own plan (``predict_plan_rollout`` on ``predict``'s state, the
  planned trajectory over the horizon);
- DreamerV3: the reference's open-loop report, the rewards (and observations) it imagines along the
  actions that were really taken next (``predict_rollout`` with ``predict``'s arguments of that step,
  ``--open-loop`` steps).

The real rewards are drawn beside them. Writes ``world_model_predictions.png`` (needs matplotlib)
and ``world_model_predictions.csv``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import gymnasium as gym
import numpy as np

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE

TINY = {
    "tdmpc2": dict(**TDMPC2_SMOKE, seed_steps=50),
    "dreamerv3": dict(DREAMER_SMOKE),
}
FULL = {"tdmpc2": dict(model_size=1), "dreamerv3": dict(model_size="1m", n_envs=1)}


def record_tdmpc2(model: TDMPC2, env: gym.Env, every: int, seed: int) -> dict:
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


def record_dreamerv3(model: DreamerV3, env: gym.Env, every: int, seed: int, open_loop: int) -> dict:
    """One episode with the mode policy; then, from every ``every``-th step's belief, the open-loop
    prediction along the actions really taken next (at most ``open_loop`` of them)."""
    obs, _ = env.reset(seed=seed)
    state, start = None, np.ones(1, bool)
    real, predicted, inputs, actions, observations = [], [], [], [], []
    done = False
    while not done:
        step = dict(observation=obs, state=state, episode_start=start)
        action, state = model.predict(**step, deterministic=True)
        predicted.append(float(model.predict_rollout(actions=action[None], **step)["reward"][0]))
        inputs.append(step)
        actions.append(action)
        obs, reward, terminated, truncated, _ = env.step(action)
        real.append(float(reward))
        observations.append(np.asarray(obs, np.float32).reshape(-1))
        done, start = terminated or truncated, np.zeros(1, bool)
    plans, obs_errors = [], []
    for t in range(0, len(actions), every):
        taken = np.stack(actions[t : t + open_loop])
        out = model.predict_rollout(actions=taken, **inputs[t])
        plans.append((t, out["reward"]))
        obs_errors.append(np.abs(out["observation"] - np.stack(observations[t : t + open_loop])).mean())
    print(f"open-loop observation error: mean absolute {np.mean(obs_errors):.3f} over {open_loop} steps")
    return {"real": np.array(real), "predicted": np.array(predicted), "plans": plans,
            "obs_errors": obs_errors}  # fmt: skip


def plot(record: dict, path: Path, long_label: str) -> bool:
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
                label=long_label if i == 0 else None)  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", choices=["tdmpc2", "dreamerv3"], default="tdmpc2")
    parser.add_argument("--steps", type=int, help="default 3,000 (TD-MPC2), 20,000 (DreamerV3)")
    parser.add_argument("--every", type=int, default=10, help="steps between drawn long predictions")
    parser.add_argument("--open-loop", type=int, default=15, help="DreamerV3: steps predicted open loop")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and 150 steps (CI)")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    env_kwargs = {"max_episode_steps": 100} if args.tiny else {}
    env = gym.make("Pendulum-v1", **env_kwargs)
    settings = TINY[args.agent] if args.tiny else FULL[args.agent]
    steps = 150 if args.tiny else args.steps or (3_000 if args.agent == "tdmpc2" else 20_000)
    eval_env = gym.make("Pendulum-v1", **env_kwargs)
    if args.agent == "tdmpc2":
        model = TDMPC2("MlpPolicy", env, seed=0, **settings)
        model.learn(steps)
        record = record_tdmpc2(model, eval_env, args.every, seed=1)
        long_label = "predicted along the plan"
    else:
        model = DreamerV3("MlpPolicy", env, seed=0, **settings)
        model.learn(steps)
        record = record_dreamerv3(model, eval_env, args.every, seed=1, open_loop=args.open_loop)
        long_label = "predicted open loop along the taken actions"

    error = np.abs(record["predicted"] - record["real"])
    print(f"one-step reward prediction: mean absolute error {error.mean():.3f} "
          f"(real rewards range {record['real'].min():.2f} to {record['real'].max():.2f})")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "world_model_predictions.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "real_reward", "predicted_reward"])
        writer.writerows(zip(range(len(error)), record["real"], record["predicted"], strict=True))
    if plot(record, args.out / "world_model_predictions.png", long_label):
        print(f"wrote {args.out / 'world_model_predictions.png'}")
    return record


if __name__ == "__main__":
    main()

"""What a saved DreamerV3 knows about its env: run episodes and compare the model's beliefs with what
happens (for the learning checks' checkpoints; discrete or continuous actions, any Gymnasium id).

    python tools/diagnose_dreamerv3.py benchmarks/results/checkpoints/dreamerv3_cartpole_seed1 \
        --env CartPole-v1 --episodes 10

At every step of an episode played with ``predict`` (the sampling policy unless ``--deterministic``),
at the current belief: the actor's entropy and the critic's value; one step open loop along the
action taken (``predict_rollout``): the predicted reward and continue probability of the next step;
and at the end, the continue probability the model gives the terminal observation itself. Printed
per episode and overall: the return and length; the mean absolute reward error; the continue
probability while alive, predicted for the terminating step, and of the terminal observation; the
critic's mean, min and max against the discounted return that followed (gamma = 1 - 1/return_horizon;
known only for episodes that terminated); the mean actor entropy. One JSON line per episode and one
summary line, which adds how linearly the features of a belief encode the observation (R² of a
ridge read-out per observation dimension, from the recurrent state, the stochastic state and both).
With ``--replay``, also the training statistics (continue and reward heads split by class, as the
reference logs them) on windows of the replay rows the model had been trained on.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels import DreamerV3
from sb3_worldmodels.blocks.math import twohot_mean
from sb3_worldmodels.common.replay import annotate_batch
from sb3_worldmodels.dreamerv3 import agent as core
from sb3_worldmodels.dreamerv3 import networks as N
from sb3_worldmodels.dreamerv3.networks import features


def belief_heads(model: DreamerV3, state: tuple[np.ndarray, ...]) -> dict[str, float]:
    """Features, actor entropy, continue probability and critic value at a belief (``predict``'s state)."""
    config, params = model._config, model.policy.state["agent"].params
    feat = features(jnp.asarray(state[0]), jnp.asarray(state[1]))
    heads = N.heads(config, {"con": params["con"], "critic": params["critic"]}, feat)
    dist = core.actor_distribution(config, params["actor"], feat)
    return {
        "features": np.asarray(feat)[0],
        "entropy": float(core.actor_entropy(config, dist)[0]),
        "continue": float(jax.nn.sigmoid(heads["con"][0, 0])),
        "value": float(twohot_mean(heads["critic"], core.head_bins(config))[0]),
    }


def run_episode(model: DreamerV3, env: gym.Env, seed: int, deterministic: bool, read: list) -> dict:
    """One episode; appends (features, observation) of every belief to ``read``."""
    obs, _ = env.reset(seed=seed)
    state, start = None, np.ones(1, bool)
    steps: list[dict] = []
    while True:
        action, state = model.predict(
            obs[None], state=state, episode_start=start, deterministic=deterministic
        )
        start = np.zeros(1, bool)
        here = belief_heads(model, state)
        read.append((here["features"], np.asarray(obs)))
        env_action = np.asarray(action).reshape((1, 1, *np.shape(action)[1:]))
        predicted = model.predict_rollout(state, env_action)
        obs, reward, terminated, truncated, _ = env.step(action[0])
        steps.append(
            {
                "reward": float(reward),
                "pred_reward": float(predicted["reward"][0, 0]),
                "pred_continue": float(predicted["continue"][0, 0]),
                "value": here["value"],
                "entropy": here["entropy"],
            }
        )
        if terminated or truncated:
            # The model's reading of the terminal observation itself (its posterior, not a prediction).
            _, last = model.predict(obs[None], state=state, episode_start=start, deterministic=deterministic)
            return {"steps": steps, "terminated": bool(terminated), "terminal": belief_heads(model, last)}


def summarize(episode: dict, gamma: float) -> dict:
    steps = episode["steps"]
    rewards = np.array([s["reward"] for s in steps])
    n = len(steps)
    # Discounted return from each belief on (reward t+1 onwards); nothing follows a termination.
    ahead = np.zeros(n)
    for t in range(n - 1, -1, -1):
        ahead[t] = rewards[t] + (gamma * ahead[t + 1] if t + 1 < n else 0.0)
    cont = np.array([s["pred_continue"] for s in steps])
    values = np.array([s["value"] for s in steps])
    return {
        "return": float(rewards.sum()),
        "length": n,
        "terminated": episode["terminated"],
        "reward_abs_error": float(np.mean(np.abs(rewards - [s["pred_reward"] for s in steps]))),
        "continue_alive": float(cont[:-1].mean()) if n > 1 else None,
        "continue_predicted_at_termination": float(cont[-1]) if episode["terminated"] else None,
        "continue_of_terminal_obs": episode["terminal"]["continue"] if episode["terminated"] else None,
        "value_mean": float(values.mean()),
        "value_min": float(values.min()),
        "value_max": float(values.max()),
        "return_ahead_mean": float(ahead.mean()) if episode["terminated"] else None,
        "entropy_mean": float(np.mean([s["entropy"] for s in steps])),
    }


def linear_readout(read: list, deter: int) -> dict[str, list[float]]:
    """R² of a ridge regression of each observation dimension from the belief's features (fit on
    even steps, scored on odd ones): from the recurrent state, the stochastic state, and both."""
    feats = np.array([f for f, _ in read])
    obs = np.array([o for _, o in read]).reshape(len(read), -1)
    train = np.arange(len(read)) % 2 == 0
    out = {}
    for name, cols in (("deter", slice(0, deter)), ("stoch", slice(deter, None)), ("both", slice(None))):
        x = np.c_[feats[:, cols], np.ones(len(read))]
        w = np.linalg.solve(x[train].T @ x[train] + 1e-2 * np.eye(x.shape[1]), x[train].T @ obs[train])
        err = ((x[~train] @ w - obs[~train]) ** 2).sum(0)
        out[f"readout_r2_{name}"] = (
            (1 - err / ((obs[~train] - obs[~train].mean(0)) ** 2).sum(0)).round(3).tolist()
        )
    return out


def replay_statistics(model: DreamerV3, replay_path: Path, batches: int, seed: int) -> dict[str, float]:
    """The training statistics (losses, ``constats/*``, ``rewstats/*``) of the saved model on windows
    drawn uniformly from the replay rows it had been trained on (each env's first
    ``num_timesteps / n_envs`` rows; a later replay file of the same run may be given). The model is
    not changed: each batch's update is computed and its metrics kept."""
    model.load_replay_buffer(replay_path)
    replay, config = model.replay_buffer, model._config
    per_env = int(model.num_timesteps) // replay.n_envs
    rng = np.random.default_rng(seed)
    state = model.policy.state["agent"]
    totals: dict[str, list[float]] = {}
    for _ in range(batches):
        envs = rng.integers(0, replay.n_envs, config.batch_size)
        starts = rng.integers(0, per_env - replay.window + 1, config.batch_size)
        rows = [
            replay.read_rows(int(e), np.arange(s, s + replay.window))
            for e, s in zip(envs, starts, strict=True)
        ]
        batch = {k: np.stack([r[k] for r in rows])[None] for k in rows[0]}
        annotate_batch(batch)
        _, metrics, _ = core.train_step_jit(config, state, {k: jnp.asarray(v[0]) for k, v in batch.items()})
        for key, value in jax.device_get(metrics).items():
            totals.setdefault(key, []).append(float(value))
    keep = ("con_loss", "rew_loss", "rec_loss", "dyn_loss")
    return {
        f"replay/{k}": float(np.nanmean(v)) if np.any(np.isfinite(v)) else None
        for k, v in sorted(totals.items())
        if k in keep or "stats/" in k
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", type=Path, help="a folder with model.zip, or a model .zip")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=20_000)
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--replay", type=Path, help="a replay .pkl of the same run: its training statistics")
    parser.add_argument("--batches", type=int, default=50, help="replay batches for --replay")
    args = parser.parse_args()
    path = args.checkpoint / "model.zip" if args.checkpoint.is_dir() else args.checkpoint
    model = DreamerV3.load(path)
    gamma = 1.0 - 1.0 / model.return_horizon
    env = gym.make(args.env)
    rows, read = [], []
    for i in range(args.episodes):
        row = summarize(run_episode(model, env, args.seed + i, args.deterministic, read), gamma)
        rows.append(row)
        print(json.dumps(row), flush=True)

    def mean(key: str) -> float | None:
        values = [r[key] for r in rows if r[key] is not None]
        return float(np.mean(values)) if values else None

    summary = {k: mean(k) for k in rows[0] if k != "terminated"}
    summary.update(linear_readout(read, model._config.deter))
    if args.replay is not None:
        summary.update(replay_statistics(model, args.replay, args.batches, args.seed))
    summary.update(rows=int(model.num_timesteps), updates=int(model._n_updates), episodes=len(rows))
    print(json.dumps({"summary": summary}))


if __name__ == "__main__":
    main()

"""The learning checks' runner: a run split across processes by its checkpoints resumes where it stopped."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium as gym
from stable_baselines3.common.monitor import Monitor

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

from evaluation import evaluate_fresh, learn_in_segments  # noqa: E402

from sb3_worldmodels import DreamerV3  # noqa: E402
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS  # noqa: E402


def make_model() -> DreamerV3:
    return DreamerV3("CartPole-v1", seed=3, **{**SMOKE_SETTINGS, "n_envs": 2})


def make_eval_env(seed: int) -> gym.Env:
    env = Monitor(gym.make("CartPole-v1"))
    env.reset(seed=seed)
    return env


def test_a_checkpointed_run_resumes_where_it_stopped(tmp_path):
    evaluate = evaluate_fresh(make_eval_env, seed=3, episodes=2, deterministic=False)
    run = dict(
        total=240, evaluate=evaluate, eval_every=80, checkpoint_every=80, checkpoint=tmp_path, x_key="rows"
    )
    first, record = learn_in_segments(make_model, stop_after_seconds=0.0, **run)  # one segment, then stop
    assert not record["done"] and [p["rows"] for p in record["curve"]] == [first.num_timesteps]
    assert 80 <= first.num_timesteps < 90 and first._n_updates > 0
    saved = json.loads((tmp_path / "progress.json").read_text())
    assert saved["num_timesteps"] == first.num_timesteps and saved["curve"] == record["curve"]
    assert sorted(p.name for p in tmp_path.glob("*_*")) == sorted(saved["files"].values())

    model, record = learn_in_segments(make_model, **run)  # a new "process": resumes from the checkpoint
    assert record["done"] and record["resumed_at"] == [first.num_timesteps]
    rows = [p["rows"] for p in record["curve"]]
    assert rows[0] == first.num_timesteps and len(rows) == 3 and rows[-1] == model.num_timesteps >= 240
    assert all(b - a < 90 for a, b in zip([0, *rows], rows, strict=False))
    assert model._n_updates > first._n_updates
    # The replay was restored: its streams hold the rows of both processes (nothing restarted at 0).
    assert model.replay_buffer.rows_added_per_env.sum() == model.num_timesteps
    assert all(len(p["eval_returns"]) == 2 and p["seconds"] > 0 for p in record["curve"])
    saved = json.loads((tmp_path / "progress.json").read_text())  # only the last checkpoint is kept
    assert sorted(p.name for p in tmp_path.glob("*_*")) == sorted(saved["files"].values())

"""The learning checks' runner: a run split across processes by its checkpoints resumes where it stopped;
a seed group's check, stopped by its time budget and resumed, ends as the uninterrupted one."""

from __future__ import annotations

import collections
import functools
import json
import sys
from pathlib import Path

import gymnasium as gym
import jax
import numpy as np
import pytest
from stable_baselines3.common.monitor import Monitor

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import dreamerv3_learning  # noqa: E402
import tdmpc2_learning  # noqa: E402
from evaluation import evaluate_fresh, group_name, learn_in_segments, seeds_result  # noqa: E402

from sb3_worldmodels import TDMPC2, DreamerV3  # noqa: E402
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS  # noqa: E402
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE  # noqa: E402


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


class CutOff(Exception):
    """A process ended by its host while it evaluates."""


def test_a_run_cut_off_while_it_evaluates_resumes_with_that_evaluation(tmp_path):
    """The segment's training is checkpointed before its evaluation: a process killed during the
    evaluation loses only the evaluation, and the next process runs it first, on the same model."""
    evaluate = evaluate_fresh(make_eval_env, seed=3, episodes=2, deterministic=False)

    def cut_off(model, index):
        raise CutOff

    run = dict(total=160, eval_every=80, checkpoint_every=80, checkpoint=tmp_path, x_key="rows")
    with pytest.raises(CutOff):
        learn_in_segments(make_model, evaluate=cut_off, **run)
    saved = json.loads((tmp_path / "progress.json").read_text())
    assert 80 <= saved["num_timesteps"] < 90 and saved["curve"] == [] and not saved["done"]

    model, record = learn_in_segments(make_model, evaluate=evaluate, **run)
    assert record["done"] and record["resumed_at"] == [saved["num_timesteps"]]
    assert [p["rows"] for p in record["curve"]] == [saved["num_timesteps"], model.num_timesteps]
    _, whole = learn_in_segments(
        make_model, evaluate=evaluate, stop_after_seconds=0.0, **{**run, "checkpoint": tmp_path / "whole"}
    )
    assert record["curve"][0]["eval_returns"] == whole["curve"][0]["eval_returns"]


def test_an_evaluation_on_several_envs_runs_env_0_as_the_one_env_evaluation():
    """``evaluate_fresh(..., envs=3)``: six episodes, two per env, one ``predict`` per step for the three
    envs. Env 0 is seeded as the one-env evaluation, so with the deterministic policy its two
    episodes are the one-env evaluation's (``evaluate_policy`` lists episodes as they end)."""
    model = make_model()
    one = evaluate_fresh(make_eval_env, seed=3, episodes=2, deterministic=True)(model, 5)
    three = evaluate_fresh(make_eval_env, seed=3, episodes=6, deterministic=True, envs=3)(model, 5)
    assert len(three) == 6 and not collections.Counter(one) - collections.Counter(three)


# ------------------------------------------------------------------ seed groups, resumed in segments
SCRIPTS = {"tdmpc2": (tdmpc2_learning, TDMPC2, "steps"), "dreamerv3": (dreamerv3_learning, DreamerV3, "rows")}


def smoke_check(agent: str, folder: Path, *extra: str) -> dict:
    script, _, _ = SCRIPTS[agent]
    args = ["--task", "pendulum", "--seeds", "0", "1", "--smoke", "--results", str(folder)]
    return script.main([*args, "--checkpoint", str(folder / "checkpoint"), *extra])


@pytest.mark.parametrize("agent", list(SCRIPTS))
def test_a_seed_group_check_stopped_by_its_budget_resumes_exactly(agent, tmp_path):
    """The smoke check of a two-seed group (two Pendulum-v1 episodes, a checkpoint after each): run
    whole, and stopped by ``--budget-s 0`` after its first segment, then resumed by the same command in
    a new call. The checkpoint between episodes keeps the envs, so the resumed run equals the whole one:
    every seed's evaluations, training episodes, steps and final state."""
    _, cls, x_key = SCRIPTS[agent]
    whole = smoke_check(agent, tmp_path / "whole")
    first = smoke_check(agent, tmp_path / "split", "--budget-s", "0")
    assert first["done"] is False and len(first["per_seed"][0]["curve"]) == 1
    half = first[x_key]
    saved = json.loads((tmp_path / "split" / "checkpoint" / "progress.json").read_text())
    assert "envs" in saved["files"] and saved["num_timesteps"] == half  # between episodes: envs kept
    second = smoke_check(agent, tmp_path / "split")
    assert second["done"] is True and second["resumed_at"] == [half] and whole["resumed_at"] == []
    assert second[x_key] == whole[x_key] > half
    for mine, theirs in zip(second["per_seed"], whole["per_seed"], strict=True):
        assert mine["seed"] == theirs["seed"] and mine[x_key] == theirs[x_key]
        assert [p["eval_returns"] for p in mine["curve"]] == [p["eval_returns"] for p in theirs["curve"]]
        assert mine["train_curve"] == theirs["train_curve"] and len(mine["train_curve"]) == 2
        assert mine["updates"] == theirs["updates"] > 0 and mine["passed"] == (mine["score"] >= -300)
    assert {k: whole[k] for k in ("mean", "iqm", "n_passed")} == {
        k: second[k] for k in ("mean", "iqm", "n_passed")
    }
    assert whole["n_seeds"] == 2 and whole["backend"] == "cpu" and "--smoke" in whole["command"]
    assert whole["settings"]["compute_dtype"] == "float32"  # "auto" as resolved on the CPU, recorded
    states = []
    for run in ("whole", "split"):
        files = json.loads((tmp_path / run / "checkpoint" / "progress.json").read_text())["files"]
        states.append(cls.load(tmp_path / run / "checkpoint" / files["model"]).policy.state)
    leaves = jax.tree_util.tree_leaves_with_path(states[0])
    for (path, a), b in zip(leaves, jax.tree_util.tree_leaves(states[1]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))
    written = json.loads((tmp_path / "whole" / f"{agent}_pendulum_seeds0-1.json").read_text())
    assert written["per_seed"][1]["curve"] == whole["per_seed"][1]["curve"]


def test_a_seed_groups_summary_and_file_name():
    """Five seeds: the mean, the interquartile mean (the middle three of five) and the seeds passing."""
    summary = seeds_result([-900.0, -150.0, -120.0, -100.0, 50.0], [False, True, True, True, True])
    assert summary == {"mean": -244.0, "iqm": -370.0 / 3, "n_passed": 4, "n_seeds": 5}
    assert seeds_result([1.0, 3.0], [True, False])["iqm"] == 2.0  # fewer than 4 seeds: the mean
    assert group_name([0, 1, 2, 3, 4]) == "seeds0-4" and group_name([5, 2]) == "seeds5_2"
    assert group_name([7]) == "seeds7"


def test_an_evaluation_in_processes_runs_the_episodes_of_one_process():
    """``evaluate_fresh(..., envs=3, processes=True)``: the envs step in spawned processes (each its own
    seeded env, as tdmpc2_learning's ``--eval-processes``), and the deterministic policy's episodes are
    those of the same three envs stepped in this process."""
    model = TDMPC2("Pendulum-v1", seed=0, **TDMPC2_SMOKE)
    make = functools.partial(tdmpc2_learning.make_gym_env, "pendulum")
    here = evaluate_fresh(make, seed=3, episodes=3, deterministic=True, envs=3)(model, 1)
    apart = evaluate_fresh(make, seed=3, episodes=3, deterministic=True, envs=3, processes=True)(model, 1)
    assert len(here) == 3 and len(set(here)) == 3 and apart == here


def test_a_seed_group_check_with_its_envs_in_processes_equals_it_in_one_process(tmp_path):
    """``--env-processes``: each seed's training env steps in a spawned process, seeded by the group
    at its first reset as in one process, so the smoke check ends with the same evaluations, training
    episodes and model state."""
    apart = smoke_check("tdmpc2", tmp_path / "apart", "--env-processes")
    here = smoke_check("tdmpc2", tmp_path / "here")
    for mine, theirs in zip(apart["per_seed"], here["per_seed"], strict=True):
        assert [p["eval_returns"] for p in mine["curve"]] == [p["eval_returns"] for p in theirs["curve"]]
        assert mine["train_curve"] == theirs["train_curve"] and len(mine["train_curve"]) == 2
    states = []
    for run in ("apart", "here"):
        files = json.loads((tmp_path / run / "checkpoint" / "progress.json").read_text())["files"]
        assert ("envs" in files) == (run == "here")  # envs in processes are not pickled
        states.append(TDMPC2.load(tmp_path / run / "checkpoint" / files["model"]).policy.state)
    for a, b in zip(jax.tree_util.tree_leaves(states[0]), jax.tree_util.tree_leaves(states[1]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

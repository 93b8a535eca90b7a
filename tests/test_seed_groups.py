"""Seed groups: a model built with a list of seeds runs every seed in one program, and seed ``i`` of the
group does what a single-seed model with that seed does (to float tolerance)."""

from __future__ import annotations

import gymnasium as gym
import jax
import numpy as np
import pytest
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.logger import KVWriter, Logger
from stable_baselines3.common.vec_env import VecEnvWrapper

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.common.seed_group import interquartile_mean
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE

SEEDS = [3, 7]


def assert_trees_close(a, b, rtol=1e-4, atol=2e-5):
    leaves_a, tree_a = jax.tree_util.tree_flatten(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


class Captured(KVWriter):
    """Every logged key with its values."""

    def __init__(self) -> None:
        self.values: dict[str, list] = {}

    def write(self, key_values, key_excluded, step=0) -> None:
        for key, value in key_values.items():
            self.values.setdefault(key, []).append(value)


def capture_logs(model) -> Captured:
    writer = Captured()
    model.set_logger(Logger(None, [writer]))
    return writer


def test_dreamerv3_group_seed_equals_single_seed_run():
    """CartPole's episodes end at different steps per seed: the seeds owe different updates per step
    (masked in the group's call) and count different rows; each seed still equals its own run."""
    group = DreamerV3("CartPole-v1", n_envs=2, seed=SEEDS, **DREAMER_SMOKE)
    logs = capture_logs(group)
    group.learn(64, log_interval=1)
    rows = [lane.num_timesteps for lane in group._lanes]
    assert min(rows) == group.num_timesteps >= 64
    # Within tolerance over the first ~50 updates: a seed's parameters move by about the learning
    # rate (4e-5) per update, so one update more or less (an unmasked padding update) shows.
    for i, seed in enumerate(SEEDS):
        single = DreamerV3("CartPole-v1", n_envs=2, seed=seed, **DREAMER_SMOKE)
        single.learn(rows[i])
        lane = group._lanes[i]
        assert single.num_timesteps == lane.num_timesteps
        assert single._n_updates == lane._n_updates > 0
        stored = single.replay_buffer.rows_added_per_env
        np.testing.assert_array_equal(stored, lane.replay_buffer.rows_added_per_env)
        first = single.replay_buffer.read_rows(0, np.arange(20))
        np.testing.assert_array_equal(first["obs"], lane.replay_buffer.read_rows(0, np.arange(20))["obs"])
        mine = group.seed_model(i).policy.state
        assert_trees_close(mine["agent"].params, single.policy.state["agent"].params)
        np.testing.assert_array_equal(np.asarray(mine["act_key"]), np.asarray(single.policy.state["act_key"]))
    for seed in SEEDS:
        assert any(key.startswith(f"seed_{seed}/train/") for key in logs.values)
    assert "train/n_updates" in logs.values
    assert any(key.startswith(f"seed_{SEEDS[1]}/rollout/ep_rew_mean") for key in logs.values)
    assert "rollout/ep_rew_iqm" in logs.values


def pendulum(n_envs: int):
    return make_vec_env(lambda: gym.make("Pendulum-v1", max_episode_steps=20), n_envs=n_envs)


def test_tdmpc2_group_seed_equals_single_seed_run():
    settings = {**TDMPC2_SMOKE, "seed_steps": 25}
    group = TDMPC2(pendulum(2 * len(SEEDS)), seed=SEEDS, **settings)
    group.learn(60)
    for i, seed in enumerate(SEEDS):
        single = TDMPC2(pendulum(2), seed=seed, **settings)
        single.learn(60)
        lane = group._lanes[i]
        assert single._n_updates == lane._n_updates > 0
        stored, _ = single.replay_buffer.export_state()
        theirs, _ = lane.replay_buffer.export_state()
        assert stored.keys() == theirs.keys()
        for key in stored:  # the same episodes (floats follow the actions: close, not bit for bit)
            if np.issubdtype(stored[key].dtype, np.floating):
                np.testing.assert_allclose(stored[key], theirs[key], rtol=1e-4, atol=1e-5, err_msg=key)
            else:
                np.testing.assert_array_equal(stored[key], theirs[key], err_msg=key)
        mine = group.seed_model(i).policy.state
        assert_trees_close(mine["agent"].params, single.policy.state["agent"].params)


def test_seed_model_acts_evaluates_and_saves(tmp_path):
    group = TDMPC2(pendulum(2), seed=[0, 1], **{**TDMPC2_SMOKE, "seed_steps": 10})
    group.learn(24)
    model = group.seed_model(1)
    assert isinstance(model, TDMPC2) and model.seed == 1 and model.seeds is None
    mean, _ = evaluate_policy(model, pendulum(1), n_eval_episodes=1)
    assert np.isfinite(mean)
    model.save(tmp_path / "seed1.zip")
    loaded = TDMPC2.load(tmp_path / "seed1.zip")
    obs = np.zeros((1, 3), np.float32)
    np.testing.assert_allclose(
        model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0]
    )


@pytest.mark.parametrize(
    ("seed", "message"),
    [([1, 1], "must differ"), ([], "one or more"), (["a"], "one or more"), ("3", "list of ints")],
)
def test_bad_seed_lists_are_refused(seed, message):
    with pytest.raises((ValueError, TypeError), match=message):
        TDMPC2(pendulum(2), seed=seed, **TDMPC2_SMOKE)


def test_group_needs_envs_per_seed():
    with pytest.raises(ValueError, match="not a multiple of 2"):
        TDMPC2(pendulum(3), seed=[0, 1], **TDMPC2_SMOKE)


class Passthrough(VecEnvWrapper):
    def reset(self):
        return self.venv.reset()

    def step_wait(self):
        return self.venv.step_wait()


def test_a_wrapped_vec_env_is_seeded_seed_major():
    """The seeds reach the VecEnv whose reset reads them (rl_zoo3 wraps its envs, e.g. VecNormalize)."""
    group = TDMPC2(Passthrough(pendulum(4)), seed=[3, 7], **TDMPC2_SMOKE)
    assert group.env.unwrapped._seeds == [3, 4, 7, 8]
    first = group.env.reset()
    for i, seed in enumerate((3, 4, 7, 8)):
        alone = gym.make("Pendulum-v1")
        np.testing.assert_allclose(first[i], alone.reset(seed=seed)[0], rtol=1e-6)


def test_interquartile_mean():
    assert interquartile_mean([1.0, 2.0, 3.0]) == 2.0
    assert interquartile_mean([0.0, 1.0, 2.0, 100.0]) == 1.5
    assert interquartile_mean([-50.0, 1.0, 2.0, 3.0, 90.0]) == 2.0


def test_settings_per_seed_equal_single_seed_runs_with_those_settings():
    """A learning rate and a loss scale given one value per seed: each seed runs as a single-seed
    model given its own values (one program for the group)."""
    settings = {**TDMPC2_SMOKE, "seed_steps": 25}
    rates, coefs = [1e-3, 3e-4], [20.0, 5.0]
    group = TDMPC2(
        pendulum(2 * len(SEEDS)), seed=SEEDS, learning_rate=rates, consistency_coef=coefs, **settings
    )
    group.learn(50)
    for i, seed in enumerate(SEEDS):
        single = TDMPC2(pendulum(2), seed=seed, learning_rate=rates[i], consistency_coef=coefs[i], **settings)
        single.learn(50)
        assert single._n_updates == group._lanes[i]._n_updates > 0
        assert_trees_close(
            group.seed_model(i).policy.state["agent"].params, single.policy.state["agent"].params
        )
    assert group.seed_model(1).consistency_coef == coefs[1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": 0, "consistency_coef": [1.0, 2.0]}, "needs a list of seeds"),
        ({"seed": [0, 1], "consistency_coef": [1.0, 2.0, 3.0]}, "One value per seed"),
        ({"seed": [0, 1], "learning_rate": [1e-3]}, "One value per seed"),
        ({"seed": [0, 1], "dropout": [0.0, 0.01]}, "dropout cannot take one value per seed"),
        ({"seed": [0, 1], "num_q": [2, 4]}, "num_q cannot take one value per seed"),
    ],
)
def test_settings_per_seed_are_refused_where_they_cannot_be(kwargs, message):
    settings = {**TDMPC2_SMOKE, **kwargs}
    with pytest.raises(ValueError, match=message):
        TDMPC2(pendulum(2), **settings)

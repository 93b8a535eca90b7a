"""Seed groups of the multi-task model: ``TDMPC2MultiTask(pool, seed=[...])`` trains every seed in one
program, and seed ``i`` of the group does what a single-seed model with that seed does (its
parameters, update noise and window sampling), to float tolerance."""

from __future__ import annotations

import json
import zipfile

import jax
import numpy as np
import pytest
from stable_baselines3.common.logger import Logger

from sb3_worldmodels import TDMPC2, MultiTaskEvalCallback, TDMPC2MultiTask
from sb3_worldmodels.blocks.optim import get_learning_rate
from sb3_worldmodels.common.seed_lanes import SEED_COUNTERS
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS
from tests.test_seed_groups import Captured, assert_trees_close
from tests.test_tdmpc2_multitask import _LinearTask, two_task_pool

SEEDS = [3, 7]
TINY = {
    "model_size": 1,
    "batch_size": 16,
    "task_dim": 8,
    **{k: v for k, v in SMOKE_SETTINGS.items() if k not in ("model_size", "batch_size")},
}


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory):
    return two_task_pool(tmp_path_factory.mktemp("mt"))


def multitask(pool, **kwargs) -> TDMPC2MultiTask:
    return TDMPC2MultiTask(pool, **{**TINY, **kwargs})


def assert_states_equal(a, b) -> None:
    leaves = jax.tree_util.tree_leaves_with_path(a)
    for (path, x), y in zip(leaves, jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path))


def test_a_multitask_group_saves_loads_predicts_and_logs_per_seed(small_pool, tmp_path):
    """One group run: the logs per seed and their mean; save/load of the whole group, and the loaded
    group goes on as the one that was saved (each seed's window sampler and predict stream kept);
    predict with seed_index acts as that seed's model."""
    group = multitask(small_pool, seed=SEEDS)
    assert group.seeds == tuple(SEEDS) and group.n_seeds == 2
    assert all(np.shape(leaf)[0] == 2 for leaf in jax.tree_util.tree_leaves(group.policy.state))
    logs = Captured()
    group.set_logger(Logger(None, [logs]))
    group.learn(2, log_interval=1)
    assert group.num_timesteps == 2 and np.asarray(group.state.updates).tolist() == [2, 2]
    for key in ("consistency_loss", "reward_loss"):
        per_seed = [logs.values[f"seed_{seed}/train/{key}"][-1] for seed in SEEDS]
        assert per_seed[0] != per_seed[1]  # the seeds differ
        assert logs.values[f"train/{key}"][-1] == pytest.approx(np.mean(per_seed), rel=1e-6)
    assert logs.values["train/n_updates"] == [1, 2]

    obs = np.ones(3, np.float32)
    for i in range(2):  # deterministic, then the first two of each seed's predict stream
        model = group.seed_model(i)
        assert type(model) is TDMPC2MultiTask and model.seed == SEEDS[i] and model.seeds is None
        assert model.num_timesteps == 2 and model.pool is small_pool
        for deterministic in (True, False, False):
            ours, (plan,) = group.predict(obs, "up", deterministic=deterministic, seed_index=i)
            theirs, (their_plan,) = model.predict(obs, "up", deterministic=deterministic)
            np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(plan, their_plan, rtol=1e-6, atol=1e-6)
    assert [lane._predict_calls for lane in group._lanes] == [2, 2]

    group.save(tmp_path / "group.zip")
    with zipfile.ZipFile(tmp_path / "group.zip") as archive:
        data = json.loads(archive.read("data"))
    assert not [key for key, value in data.items() if isinstance(value, dict) and ":serialized:" in value]
    assert len(data[SEED_COUNTERS]) == 2
    loaded = TDMPC2MultiTask.load(tmp_path / "group.zip", data=small_pool)
    assert loaded.seeds == tuple(SEEDS) and loaded.num_timesteps == 2 and not hasattr(loaded, SEED_COUNTERS)
    assert [lane._predict_calls for lane in loaded._lanes] == [2, 2]
    assert_states_equal(loaded.policy.state, group.policy.state)
    group.learn(2, reset_num_timesteps=False)
    loaded.learn(2, reset_num_timesteps=False)
    assert loaded.num_timesteps == group.num_timesteps == 4
    assert_states_equal(loaded.policy.state, group.policy.state)
    for i in range(2):
        assert loaded.predict(obs, "up", seed_index=i)[0] == pytest.approx(
            group.predict(obs, "up", seed_index=i)[0]
        )

    with pytest.raises(ValueError, match="needs seed_index=i"):
        group.predict(obs, "up")
    with pytest.raises(ValueError, match="needs seed_index=i"):
        group.evaluate({"up": _LinearTask(3, 1)})
    with pytest.raises(IndexError, match="seed_index 2 outside"):
        group.predict(obs, "up", seed_index=2)
    with pytest.raises(ValueError, match="seed_model"):
        TDMPC2.from_multitask(group, "up", _LinearTask(3, 1))
    single = multitask(small_pool, seed=0)
    with pytest.raises(ValueError, match="seed_index=1 is for a seed group"):
        single.predict(obs, "up", seed_index=1)
    with pytest.raises(ValueError, match="is for a seed group"):
        single.seed_model(0)
    single.save(tmp_path / "single.zip")
    with zipfile.ZipFile(tmp_path / "single.zip") as archive:
        assert SEED_COUNTERS not in json.loads(archive.read("data"))
    with pytest.raises(ValueError, match="per-seed counters .* do not fit a group of 2 seeds"):
        TDMPC2MultiTask.load(tmp_path / "group.zip", custom_objects={SEED_COUNTERS: [{"_rng": None}]})


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"seed": []}, ValueError, "one or more ints"),
        ({"seed": [1, 1]}, ValueError, "must differ"),
        ({"seed": "3"}, TypeError, "list of ints"),
        ({"seed": 0, "consistency_coef": [1.0, 2.0]}, ValueError, "needs a list of seeds"),
        ({"seed": [0, 1], "learning_rate": [1e-3]}, ValueError, "One value per seed"),
        ({"seed": [0, 1], "consistency_coef": [1.0, 2.0, 3.0]}, ValueError, "One value per seed"),
        ({"seed": [0, 1], "batch_size": [16, 32]}, ValueError, "batch_size cannot take one value per seed"),
        ({"seed": [0, 1], "dropout": [0.0, 0.01]}, ValueError, "dropout cannot take one value per seed"),
        ({"seed": [0, 1], "learning_rate": [1e-3, -1.0]}, ValueError, "seed index 1: .*learning_rate"),
        ({"seed": [0, 1], "rho": [0.5, -1.0]}, ValueError, "seed index 1: .*rho"),
    ],
)
def test_bad_seed_lists_and_settings_per_seed_are_refused(small_pool, kwargs, error, message):
    with pytest.raises(error, match=message):
        multitask(small_pool, **kwargs)


def test_each_seed_of_a_multitask_group_equals_its_single_seed_model(small_pool):
    """Three updates: every seed's state (parameters, optimisers, keys, counters) equals a single-seed
    model's with that seed, which draws the same windows from the pool."""
    group = multitask(small_pool, seed=SEEDS)
    group.learn(3)
    for i, seed in enumerate(SEEDS):
        single = multitask(small_pool, seed=seed)
        single.learn(3)
        model = group.seed_model(i)
        assert model.config == single.config
        assert model._rng.bit_generator.state == single._rng.bit_generator.state  # the same windows drawn
        assert_trees_close(model.policy.state, single.policy.state)


def test_settings_per_seed_equal_single_seed_models_with_those_settings(small_pool, tmp_path):
    """A learning rate and a loss scale given one value per seed: each seed trains as a single-seed
    model given its values (one program for the group); save/load keeps each seed's values."""
    rates, coefs = [1e-3, 3e-4], [20.0, 5.0]
    group = multitask(small_pool, seed=SEEDS, learning_rate=rates, consistency_coef=coefs)
    assert group.per_seed_settings == {"learning_rate": rates, "consistency_coef": coefs}
    group.learn(3)
    for i, seed in enumerate(SEEDS):
        single = multitask(small_pool, seed=seed, learning_rate=rates[i], consistency_coef=coefs[i])
        single.learn(3)
        model = group.seed_model(i)
        assert model.config == single.config and model.learning_rate == rates[i]
        assert_trees_close(model.policy.state, single.policy.state)
    group.save(tmp_path / "group.zip")
    loaded = TDMPC2MultiTask.load(tmp_path / "group.zip", data=small_pool)
    assert [lane.config.consistency_coef for lane in loaded._lanes] == coefs
    assert [lane.config.learning_rate for lane in loaded._lanes] == rates
    group.learn(1, reset_num_timesteps=False)
    loaded.learn(1, reset_num_timesteps=False)
    assert_states_equal(loaded.policy.state, group.policy.state)


def test_a_group_is_evaluated_seed_by_seed(small_pool):
    """evaluate(seed_index=i) is seed i's model's evaluate; MultiTaskEvalCallback evaluates every seed
    and logs each one's scores and their mean."""
    group = multitask(small_pool, seed=SEEDS)
    envs = {"up": _LinearTask(3, 1), "down": _LinearTask(5, 2)}
    logs = Captured()
    group.set_logger(Logger(None, [logs]))
    callback = MultiTaskEvalCallback(envs, eval_freq=2, n_eval_episodes=1)
    group.learn(2, callback=callback, log_interval=100)
    (scores,) = callback.evaluations
    for i, seed in enumerate(SEEDS):
        alone = group.seed_model(i).evaluate(envs, n_eval_episodes=1)
        assert group.evaluate(envs, n_eval_episodes=1, seed_index=i) == pytest.approx(alone)
        for name in ("up", "down", "mean"):
            assert scores[f"seed_{seed}/{name}"] == pytest.approx(alone[name])
        assert logs.values[f"seed_{seed}/eval/up/mean_reward"] == [pytest.approx(alone["up"])]
    for name in ("up", "down", "mean"):
        assert scores[name] == pytest.approx(np.mean([scores[f"seed_{s}/{name}"] for s in SEEDS]))
    assert logs.values["eval/mean_reward"] == [pytest.approx(scores["mean"])]


def test_every_seed_of_a_group_starts_from_a_reference_checkpoint(tmp_path):
    from sb3_worldmodels import pool_tasks
    from tests.test_tdmpc2_multitask import _export_with_length, start_params, start_state_dict

    rng = np.random.default_rng(0)
    sources = {
        "task0": _export_with_length(tmp_path / "t0.npz", rng, 3, 1, 500),
        "task1": _export_with_length(tmp_path / "t1.npz", rng, 5, 2, 100),
    }
    pool = pool_tasks(sources, tmp_path / "pool")
    group = TDMPC2MultiTask.from_reference(
        start_state_dict(), pool, model_size=1, seed=[0, 1], learning_rate=[1e-3, 3e-4]
    )
    params, target = start_params()
    for i in range(2):
        model = group.seed_model(i)
        assert_states_equal((model.state.params, model.state.target_qs), (params, target))
        assert float(get_learning_rate(model.state.wm_opt)) == pytest.approx([1e-3, 3e-4][i])

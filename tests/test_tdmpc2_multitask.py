"""TD-MPC2's multi-task model against the reference's own multi-task records (nicklashansen/tdmpc2
@b67b21c; tests/fixtures/tdmpc2/README.md, "Multi-task fixtures"): two tasks, obs 3 / action 1 /
500-step episodes and obs 5 / action 2 / 100-step episodes, padded to obs 5 / action 2, task_dim 96."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sb3_worldmodels.tdmpc2 import agent as core
from sb3_worldmodels.tdmpc2 import networks as N
from sb3_worldmodels.tdmpc2.config import preset
from sb3_worldmodels.tdmpc2.reference_weights import params_from_state_dict
from tests.parity_helpers import (  # noqa: F401 (highest_precision: a fixture)
    close,
    close_mostly,
    highest_precision,
    load_fixture,
    tdmpc2_plan_noise,
    tdmpc2_start_state,
    tdmpc2_update_noise,
)

FIX = Path(__file__).parent / "fixtures" / "tdmpc2"
CONFIG = preset(
    1,
    obs_dim=5,
    action_dim=2,
    batch_size=8,
    q_dropout="off",
    task_dim=96,
    action_dims=(1, 2),
    episode_lengths=(500, 100),
)


def load(name: str) -> dict[str, np.ndarray]:
    return load_fixture(FIX / name)


def start_state_dict() -> dict[str, np.ndarray]:
    """The recorded start state in the reference's layout: init (target Qs = online Qs at init) + the
    re-randomisation overrides, targets included."""
    sd = load("mt_params_init.npz")
    sd.update({k.replace("_Qs", "_target_Qs"): v for k, v in sd.items() if k.startswith("_Qs.")})
    sd.update(load("mt_params_rerand_overrides.npz"))
    return sd


def start_params() -> tuple[dict, dict]:
    return params_from_state_dict(start_state_dict())


pytestmark = pytest.mark.usefixtures("highest_precision")


def test_config_matches_the_recorded_model():
    meta = json.loads((FIX / "mt_meta.json").read_text())
    np.testing.assert_array_equal(N.action_masks(CONFIG), meta["action_masks"])
    np.testing.assert_array_equal(np.float32(CONFIG.task_discounts), np.float32(meta["discount_float32"]))
    ours, target = N.init_params(CONFIG, jax.random.PRNGKey(0))
    ref, _ = start_params()
    shapes = lambda t: jax.tree_util.tree_map(lambda x: x.shape, t)  # noqa: E731
    assert shapes(ours) == shapes(ref)
    assert sum(x.size for x in jax.tree_util.tree_leaves(ours)) == meta["trainable_param_count"]
    emb = np.asarray(ours["task_emb"])
    assert emb.shape == (2, 96) and np.abs(emb).max() <= 0.02 and emb.std() > 0.01  # U(-0.02, 0.02)


def test_heads_with_task_embeddings_and_masks_match_reference():
    io = load("mt_model_io.npz")
    params, target = start_params()
    task = jnp.asarray(io["in_task"], jnp.int32)
    params = N.renormalise_task_embeddings(params, task)
    close(params["task_emb"], io["out_task_emb_weight_after_lookup"], err="renormalised table")
    cond = N.task_conditioning(CONFIG, params, task)
    close(cond.emb, io["out_task_emb_rows"])
    c, z, a = CONFIG, io["in_z"], io["in_action"]
    pair = jnp.asarray(io["in_q_pair"], jnp.int32)
    close(N.encode(c, params, io["in_obs"], cond), io["out_encode_z"])
    close(N.next_latent(c, params, z, a, cond), io["out_next_z"])
    logits = N.reward_logits(c, params, z, a, cond)
    close(logits, io["out_reward_logits"], atol=1e-5)
    close(N.decode(c, logits), io["out_reward_value"][:, 0], atol=1e-5)
    q = N.q_logits(c, params["qs"], z, a, None, cond)
    close(q, io["out_q_logits"], atol=1e-5)
    close(N.q_logits(c, target, z, a, None, cond), io["out_q_target_logits"], atol=1e-5)
    for qs, name in ((params["qs"], "out_q"), (target, "out_q_target")):
        for reduce in ("min", "avg"):
            value = N.q_pair_value(c, qs, z, a, pair, None, reduce, cond)
            close(value, io[f"{name}_{reduce}"][:, 0], atol=1e-5, err=f"{name}_{reduce}")
    mu, pi, log_pi, log_std = N.policy(c, params, z, io["in_eps_pi"], cond)
    close(mu, io["out_pi_mu"])
    close(pi, io["out_pi_action"])
    close(log_pi, io["out_pi_log_pi"][:, 0], atol=1e-4)
    close(log_std, io["out_pi_log_std"])
    single_action_rows = np.asarray(io["in_task"]) == 0  # the padded action entry is exactly 0
    assert not np.any(np.asarray(pi)[single_action_rows, 1]) and not np.any(
        np.asarray(log_std)[single_action_rows, 1]
    )
    td, parts = core.td_target(
        c,
        params,
        target,
        io["in_td_next_z"],
        io["in_td_reward"][..., 0],
        None,
        io["in_eps_td"],
        pair,
        None,
        task,
    )
    close(core.discount(c, task), io["out_td_discount"][:, 0])
    close(parts["td_pi_action"], io["out_td_pi_action"])
    close(td, io["out_td_target"][..., 0], atol=1e-5)


def test_update_matches_reference():
    """One offline update on a batch of both tasks: TD targets with each row's discount, the world
    model's and the policy's steps with the embedding renormalised at lookup, every parameter after."""
    io = load("mt_update_io.npz")
    meta = json.loads((FIX / "mt_meta.json").read_text())["update"]
    params, target = start_params()
    state = tdmpc2_start_state(CONFIG, params, target)
    batch = {
        "obs": jnp.asarray(io["in_obs"]),
        "action": jnp.asarray(io["in_action"]),
        "reward": jnp.asarray(io["in_reward"][..., 0]),
        "task": jnp.asarray(io["in_task"], jnp.int32),
    }
    noise = tdmpc2_update_noise(io)
    state, metrics, aux = jax.jit(core.update_with_noise, static_argnums=0)(CONFIG, state, batch, noise)
    for name in (
        "next_z",
        "td_pi_action",
        "td_q_target_min",
        "td_targets",
        "z0",
        "q_logits",
        "reward_logits",
    ):
        ref = io[name]
        close(np.asarray(aux["internals"][name]).reshape(ref.shape), ref, atol=2e-5, err=name)
    for name in ("pi_step_action", "pi_step_q_avg_unscaled"):
        ref = io[name]
        close(np.asarray(aux["internals"][name]).reshape(ref.shape), ref, atol=2e-5, err=name)
    close(aux["internals"]["pi_step_log_pi"], io["pi_step_log_pi"][..., 0], rtol=1e-4, atol=1e-3)
    close(state.scale.value, io["scale_value"][0])
    for ours, theirs in (
        ("consistency_loss", "consistency_loss"),
        ("reward_loss", "reward_loss"),
        ("value_loss", "value_loss"),
        ("pi_loss", "pi_loss"),
        ("total_loss", "total_loss"),
        ("grad_norm", "grad_norm"),
        ("pi_grad_norm", "pi_grad_norm_preclip"),
        ("pi_scale", "pi_scale"),
    ):
        rel = 1e-4 if ours in ("pi_loss", "pi_grad_norm") else 2e-5
        assert float(metrics[ours]) == pytest.approx(meta["update"][theirs], rel=rel, abs=1e-6), ours
    before = start_state_dict()
    delta = load("mt_params_after_update_delta.npz")
    after_sd = {k: (v.astype(np.float64) + delta[k]).astype(np.float32) for k, v in before.items()}
    after, after_target = params_from_state_dict(after_sd)
    theirs = dict(jax.tree_util.tree_leaves_with_path(after))
    for path, leaf in jax.tree_util.tree_leaves_with_path(state.params):
        close_mostly(leaf, theirs[path], jax.tree_util.keystr(path))
    norms = np.linalg.norm(np.asarray(state.params["task_emb"]), axis=-1)
    np.testing.assert_allclose(norms, meta["task_emb_after_update_row_norms"], rtol=1e-6)
    for a, b in zip(
        jax.tree_util.tree_leaves(state.target_qs), jax.tree_util.tree_leaves(after_target), strict=True
    ):
        close_mostly(a, b, "target")


@pytest.mark.parametrize("task, eval_mode", [(0, False), (1, True)])
def test_plans_for_each_task_match_reference(task, eval_mode):
    """MPPI for one task (t0): candidates, means and stds masked to its action dims, values with its
    float32 discount, the final action (with exploration noise on the true dims only)."""
    io = load("mt_plan_io.npz")
    p = f"task{task}_"
    assert int(io[p + "task"]) == task
    params, _ = start_params()
    params = N.renormalise_task_embeddings(params, jnp.asarray([task]))
    cond = N.task_conditioning(CONFIG, params, jnp.asarray([task]))
    z = N.encode(CONFIG, params, io[p + "obs"][None], cond)[0]
    close(z, io[p + "z"][0])
    noise = tdmpc2_plan_noise(io, p, CONFIG.action_dim)
    plan = jax.jit(core.plan_with_noise, static_argnums=0)
    args = (jnp.zeros((3, 2)), jnp.asarray(True), jnp.asarray(eval_mode), noise, jnp.asarray(task))
    action, mean, it = plan(CONFIG, params, z, *args)
    close(it["actions"], io[p + "iter_actions"], atol=1e-5)
    close(it["values"], io[p + "iter_values"][..., 0], rtol=1e-4, atol=1e-4)
    for name in ("mean_before", "std_before", "mean_after", "std_after"):
        close(it[name], io[p + "iter_" + name], atol=1e-5, err=name)
    close(it["score"][-1], io[p + "elite_p"], atol=1e-5)
    close(mean, io[p + "prev_mean_after"], atol=1e-5)
    close(action, io[p + "action"], atol=1e-5)
    if task == 0:
        assert not np.any(np.asarray(it["actions"])[..., 1]) and float(action[1]) == 0.0


def test_act_plans_each_env_for_its_own_task():
    """act with per-env task ids equals plan_with_noise per env (the batch path adds nothing)."""
    params, _ = start_params()
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5)), jnp.float32)
    task = jnp.asarray([1, 0], jnp.int32)
    key = jax.random.PRNGKey(3)
    act = jax.jit(core.act, static_argnums=(0, 6))
    actions, means = act(CONFIG, params, obs, jnp.zeros((2, 3, 2)), jnp.ones(2, bool), key, True, task)
    keys = jax.random.split(key, 2)
    renormed = N.renormalise_task_embeddings(params, task)
    for i in range(2):
        cond = N.task_conditioning(CONFIG, renormed, task[i])
        z = N.encode(CONFIG, renormed, obs[i], cond)
        noise = core.sample_plan_noise(CONFIG, keys[i], CONFIG.iterations)
        a, m, _ = core.plan_with_noise(
            CONFIG, renormed, z, jnp.zeros((3, 2)), jnp.asarray(True), jnp.asarray(True), noise, task[i]
        )
        close(actions[i], a, atol=1e-6)
        close(means[i], m, atol=1e-6)
    assert float(actions[1, 1]) == 0.0  # task 0 has one action dimension


def _write_export(path, rng, obs_dim, action_dim, episodes, length, reward_fn):
    """A task's episode export (the documented format) of random-action episodes of a linear system."""
    obs, action, reward, starts = [], [], [], [0]
    for _ in range(episodes):
        o = rng.normal(size=obs_dim).astype(np.float32)
        obs.append(o), action.append(np.zeros(action_dim, np.float32)), reward.append(np.float32(0))
        for _ in range(length):
            a = rng.uniform(-1, 1, action_dim).astype(np.float32)
            o = (0.9 * o + 0.3 * np.resize(a, obs_dim)).astype(np.float32)
            obs.append(o), action.append(a), reward.append(np.float32(reward_fn(o, a)))
        starts.append(len(obs))
    np.savez(
        path,
        format="sb3_worldmodels.episodes",
        version=1,
        obs_dim=obs_dim,
        action_dim=action_dim,
        episode_length=length,
        obs=np.stack(obs),
        action=np.stack(action),
        reward=np.asarray(reward, np.float32),
        episode_starts=np.asarray(starts, np.int64),
    )
    return path


def test_offline_training_on_a_pool_of_two_tasks_fits_each_tasks_rewards(tmp_path):
    """Offline updates on windows of a pool (obs 3 / action 1 and obs 5 / action 2): the world model
    learns rewards that depend on the task (same observation features, opposite signs)."""
    from sb3_worldmodels import pool_tasks
    from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS

    rng = np.random.default_rng(0)
    sources = {
        "up": _write_export(tmp_path / "up.npz", rng, 3, 1, 6, 30, lambda o, a: o[0]),
        "down": _write_export(tmp_path / "down.npz", rng, 5, 2, 6, 30, lambda o, a: -o[0] + a[1]),
    }
    pool = pool_tasks(sources, tmp_path / "pool")
    settings = {k: v for k, v in SMOKE_SETTINGS.items() if k != "model_size"}
    config = preset(
        1,
        **{**settings, "batch_size": 64},
        obs_dim=pool.obs_dim,
        action_dim=pool.action_dim,
        task_dim=8,
        action_dims=pool.action_dims,
        episode_lengths=pool.episode_lengths,
    )
    state = core.init_state(config, jax.random.PRNGKey(0))
    train = jax.jit(core.train_many, static_argnums=0)
    losses = []
    for _ in range(30):
        samples = [pool.sample(rng, config.batch_size, config.horizon) for _ in range(10)]
        batches = {k: jnp.asarray(np.stack([s[k] for s in samples])) for k in samples[0]}
        state, metrics = train(config, state, batches)
        losses.append(float(np.mean(metrics["reward_loss"])))
    assert int(state.updates) == 300
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.6 * losses[0], losses
    params = state.params
    for task in (0, 1):  # each task's predicted rewards follow its own rewards
        batch = pool.sample(np.random.default_rng(task + 10), 256, config.horizon)
        ids = np.flatnonzero(batch["task"] == task)
        cond = N.task_conditioning(config, params, jnp.asarray(batch["task"][ids]))
        z = N.encode(config, params, batch["obs"][0, ids], cond)
        predicted = N.decode(config, N.reward_logits(config, params, z, batch["action"][0, ids], cond))
        corr = np.corrcoef(np.asarray(predicted), batch["reward"][0, ids])[0, 1]
        assert corr > 0.5, (task, corr)
    assert np.all(np.linalg.norm(np.asarray(state.params["task_emb"]), axis=-1) <= 1.0 + 1e-3)


class _LinearTask(gym.Env):
    """A task of the pool above as an env: obs' = 0.9 obs + 0.3 a (tiled), 10 steps."""

    def __init__(self, obs_dim: int, action_dim: int) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (action_dim,), np.float32)
        self._obs, self._t = np.zeros(obs_dim, np.float32), 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._obs, self._t = self.np_random.normal(size=self._obs.shape).astype(np.float32), 0
        return self._obs.copy(), {}

    def step(self, action):
        self._obs = (0.9 * self._obs + 0.3 * np.resize(action, self._obs.shape)).astype(np.float32)
        self._t += 1
        return self._obs.copy(), float(self._obs[0]), False, self._t >= 10, {}


def two_task_pool(folder):
    """A small pool in ``folder``: tasks "up" (obs 3 / action 1) and "down" (obs 5 / action 2), four
    20-step episodes each."""
    from sb3_worldmodels import pool_tasks

    rng = np.random.default_rng(1)
    sources = {
        "up": _write_export(folder / "up.npz", rng, 3, 1, 4, 20, lambda o, a: o[0]),
        "down": _write_export(folder / "down.npz", rng, 5, 2, 4, 20, lambda o, a: -o[0] + a[1]),
    }
    return pool_tasks(sources, folder / "pool")


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory):
    return two_task_pool(tmp_path_factory.mktemp("mt"))


def _tiny_multitask(pool, **kwargs):
    from sb3_worldmodels import TDMPC2MultiTask
    from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS

    settings = {k: v for k, v in SMOKE_SETTINGS.items() if k not in ("model_size", "batch_size")}
    return TDMPC2MultiTask(pool, model_size=1, batch_size=16, task_dim=8, seed=0, **settings, **kwargs)


def test_multitask_learn_counts_updates_with_callbacks_logger_and_progress_bar(small_pool, tmp_path):
    from stable_baselines3.common.callbacks import BaseCallback

    class Count(BaseCallback):
        def __init__(self):
            super().__init__()
            self.steps, self.started, self.ended = 0, False, False

        def _on_training_start(self):
            self.started = True

        def _on_step(self):
            self.steps += 1
            return self.num_timesteps < 7  # stop after the 7th update

        def _on_training_end(self):
            self.ended = True

    model = _tiny_multitask(small_pool, tensorboard_log=str(tmp_path / "tb"))
    assert model.tasks == ("up", "down") and model.config.action_dims == (1, 2)
    assert model.config.episode_lengths == (20, 20)
    counter = Count()
    model.learn(20, callback=counter, log_interval=5, progress_bar=True)
    assert counter.started and counter.ended and counter.steps == 7 and model.num_timesteps == 7
    assert int(model.state.updates) == 7
    model.learn(3, reset_num_timesteps=False)
    assert model.num_timesteps == 10 and int(model.state.updates) == 10
    assert list((tmp_path / "tb").glob("*/events.out.tfevents.*"))


def test_multitask_predict_evaluate_save_load(small_pool, tmp_path):
    model = _tiny_multitask(small_pool)
    model.learn(5)
    obs_up, obs_down = np.ones(3, np.float32), np.ones((2, 5), np.float32)
    action, (mean,) = model.predict(obs_up, "up", deterministic=True)
    assert action.shape == (1,) and mean.shape == (1, 3, 2) and not np.any(mean[..., 1])
    again, _ = model.predict(obs_up, "up", deterministic=True)
    np.testing.assert_array_equal(action, again)  # same inputs, same action
    actions, _ = model.predict(obs_down, "down")
    assert actions.shape == (2, 2) and np.all(np.abs(actions) <= 1.0)
    scores = model.evaluate({"up": _LinearTask(3, 1), "down": _LinearTask(5, 2)}, n_eval_episodes=1)
    assert set(scores) == {"up", "down", "mean"}
    assert scores["mean"] == pytest.approx((scores["up"] + scores["down"]) / 2)

    model.save(tmp_path / "mt.zip")
    loaded = type(model).load(tmp_path / "mt.zip")
    assert loaded.tasks == model.tasks and loaded.config == model.config and loaded.num_timesteps == 5
    np.testing.assert_array_equal(loaded.predict(obs_up, "up", deterministic=True)[0], action)
    with pytest.raises(ValueError, match="No pool"):
        loaded.learn(1)
    loaded.learn(2, data=small_pool, reset_num_timesteps=False)
    assert loaded.num_timesteps == 7

    with pytest.raises(ValueError, match="Unknown task 'sideways'"):
        model.predict(obs_up, "sideways")
    with pytest.raises(ValueError, match="3 wide"):
        model.predict(np.ones(5, np.float32), "up")
    with pytest.raises(ValueError, match="task 'down'"):
        model.evaluate({"down": _LinearTask(3, 1)})
    (tmp_path / "foreign.zip").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="Could not read .* as an SB3 checkpoint"):
        type(model).load(tmp_path / "foreign.zip")


def test_a_multitask_model_saved_as_npz_by_an_earlier_release_loads(small_pool, tmp_path):
    """Earlier releases saved a multi-task model as an .npz ("state<path>" arrays and JSON metadata);
    it still loads, with the same parameters and update count."""
    import jax

    from sb3_worldmodels.common import safe_io

    model = _tiny_multitask(small_pool)
    model.learn(2)
    leaves = jax.tree_util.tree_leaves_with_path(model.state)
    arrays = {f"state{jax.tree_util.keystr(p)}": np.asarray(x) for p, x in leaves}
    meta = {
        "format": "sb3_worldmodels.tdmpc2_multitask",
        "version": 1,
        "config": {f: getattr(model.config, f) for f in model.config.__dataclass_fields__},
        "tasks": list(model.tasks),
        "obs_dims": list(model.obs_dims),
        "model_size": model.model_size,
        "seed": model.seed,
        "num_timesteps": model.num_timesteps,
    }
    with open(tmp_path / "old.npz", "wb") as handle:
        safe_io.save_npz(handle, arrays, meta)
    loaded = type(model).load(tmp_path / "old.npz", data=small_pool)
    assert loaded.config == model.config and loaded.num_timesteps == 2 and loaded.pool is not None
    for (path, saved), back in zip(leaves, jax.tree_util.tree_leaves(loaded.state), strict=True):
        np.testing.assert_array_equal(np.asarray(back), np.asarray(saved), err_msg=jax.tree_util.keystr(path))
    obs = np.ones(3, np.float32)
    np.testing.assert_array_equal(
        loaded.predict(obs, "up", deterministic=True)[0], model.predict(obs, "up", deterministic=True)[0]
    )


def _export_with_length(path, rng, obs_dim, action_dim, episode_length):
    _write_export(path, rng, obs_dim, action_dim, 2, 10, lambda o, a: 0.0)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    np.savez(path, **{**arrays, "episode_length": episode_length})
    return path


def test_a_reference_checkpoint_loads_into_a_model_of_its_tasks(tmp_path):
    """The reference's checkpoint layout ({"model": state_dict}, written with torch.save) of the
    recorded two-task model loads with the pool of its tasks and computes the recorded outputs."""
    import torch

    from sb3_worldmodels import TDMPC2MultiTask, pool_tasks
    from sb3_worldmodels.tdmpc2.multitask import TASK_SETS, reference_settings

    assert len(TASK_SETS["mt30"]) == 30 and len(TASK_SETS["mt80"]) == 80
    assert TASK_SETS["mt80"][:30] == TASK_SETS["mt30"] and len(set(TASK_SETS["mt80"])) == 80
    # parser.py:47-48,55@b67b21c: 64-wide embedding for mt30 at sizes 5/19/48, 512 latent at 19
    assert reference_settings(TASK_SETS["mt30"], 19) == {"task_dim": 64, "latent_dim": 512}
    assert reference_settings(TASK_SETS["mt30"], 5) == {"task_dim": 64}
    assert (
        reference_settings(TASK_SETS["mt30"], 1)
        == reference_settings(TASK_SETS["mt80"], 19)
        == {"task_dim": 96}
    )
    sd = start_state_dict()
    torch.save({"model": {k: torch.from_numpy(v) for k, v in sd.items()}}, tmp_path / "mt.pt")
    rng = np.random.default_rng(0)
    sources = {
        "task0": _export_with_length(tmp_path / "t0.npz", rng, 3, 1, 500),
        "task1": _export_with_length(tmp_path / "t1.npz", rng, 5, 2, 100),
    }
    pool = pool_tasks(sources, tmp_path / "pool")
    model = TDMPC2MultiTask.from_reference(tmp_path / "mt.pt", pool, model_size=1, seed=0)
    assert model.config.task_dim == 96 and model.config.action_dims == (1, 2)
    params, target = start_params()
    for (path, ours), theirs in zip(
        jax.tree_util.tree_leaves_with_path((model.state.params, model.state.target_qs)),
        jax.tree_util.tree_leaves((params, target)),
        strict=True,
    ):
        np.testing.assert_array_equal(ours, theirs, err_msg=jax.tree_util.keystr(path))
    io = load("mt_model_io.npz")
    task = jnp.asarray(io["in_task"], jnp.int32)
    renormed = N.renormalise_task_embeddings(model.state.params, task)
    cond = N.task_conditioning(model.config, renormed, task)
    close(N.encode(model.config, renormed, io["in_obs"], cond), io["out_encode_z"])

    with pytest.raises(ValueError, match="embeds 2 tasks"):
        TDMPC2MultiTask.from_reference(
            tmp_path / "mt.pt", pool_tasks({**sources, "extra": sources["task0"]}, tmp_path / "pool3"), 1
        )
    with pytest.raises(ValueError, match="shapes"):
        TDMPC2MultiTask.from_reference(tmp_path / "mt.pt", pool, model_size=5)
    with pytest.raises(ValueError, match="_task_emb"):
        TDMPC2MultiTask.from_reference({k: v for k, v in sd.items() if k != "_task_emb.weight"}, pool, 1)
    torch.save({"weights": {}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="state_dict"):
        TDMPC2MultiTask.from_reference(tmp_path / "other.pt", pool, 1)


@pytest.fixture(scope="module")
def recorded_multitask(tmp_path_factory):
    """A TDMPC2MultiTask of the recorded two-task model (nonzero heads, embedding rows of norm > 1)."""
    from sb3_worldmodels import TDMPC2MultiTask, pool_tasks

    folder = tmp_path_factory.mktemp("recorded")
    rng = np.random.default_rng(0)
    sources = {"a": _export_with_length(folder / "a.npz", rng, 3, 1, 500)}
    sources["b"] = _export_with_length(folder / "b.npz", rng, 5, 2, 100)
    model = TDMPC2MultiTask(pool_tasks(sources, folder / "pool"), 1, batch_size=8, task_dim=96, seed=0)
    assert model.config == CONFIG.replace(q_dropout=model.config.q_dropout)
    state = core.with_params(model.config, model.state, *start_params())
    model.state = state._replace(scale=state.scale._replace(value=jnp.float32(2.5)))
    return model


@pytest.mark.parametrize("task", ["a", "b"])
def test_a_single_task_agent_from_a_multitask_model_computes_the_same_functions(recorded_multitask, task):
    """from_multitask: every network of the single-task agent on the task's own inputs equals the
    multi-task network on the padded inputs with the task's (renormalised) embedding."""
    from sb3_worldmodels import TDMPC2

    mt, k = recorded_multitask, recorded_multitask.task_id(task)
    o, a = mt.obs_dims[k], mt.config.action_dims[k]
    agent = TDMPC2.from_multitask(mt, task, _LinearTask(o, a), episode_length=10, seed=0)
    cfg, mcfg = agent._config, mt.config
    assert (cfg.obs_dim, cfg.action_dim, cfg.task_dim) == (o, a, 0)
    assert (cfg.mlp_dim, cfg.latent_dim, cfg.num_q) == (mcfg.mlp_dim, mcfg.latent_dim, mcfg.num_q)
    single, state = agent.policy.state["agent"].params, agent.policy.state["agent"]
    assert float(state.scale.value) == 2.5
    ids = jnp.full((16,), k, jnp.int32)
    multi = N.renormalise_task_embeddings(mt.state.params, ids)
    cond = N.task_conditioning(mcfg, multi, ids)
    rng = np.random.default_rng(k)
    obs = rng.normal(size=(16, o)).astype(np.float32)
    act = rng.uniform(-1, 1, (16, a)).astype(np.float32)
    eps = rng.normal(size=(16, a)).astype(np.float32)
    pad = lambda x, w: np.pad(x, ((0, 0), (0, w - x.shape[1])))  # noqa: E731
    obs_p, act_p, eps_p = pad(obs, mcfg.obs_dim), pad(act, mcfg.action_dim), pad(eps, mcfg.action_dim)

    z, z_mt = N.encode(cfg, single, obs), N.encode(mcfg, multi, obs_p, cond)
    close(z, z_mt, atol=1e-5)
    close(N.next_latent(cfg, single, z, act), N.next_latent(mcfg, multi, z, act_p, cond), atol=1e-5)
    close(N.reward_logits(cfg, single, z, act), N.reward_logits(mcfg, multi, z, act_p, cond), atol=1e-5)
    close(
        N.q_logits(cfg, single["qs"], z, act, None),
        N.q_logits(mcfg, multi["qs"], z, act_p, None, cond),
        atol=1e-5,
    )
    target, target_mt = state.target_qs, mt.state.target_qs
    close(N.q_logits(cfg, target, z, act, None), N.q_logits(mcfg, target_mt, z, act_p, None, cond), atol=1e-5)
    mu, pi, log_pi, log_std = N.policy(cfg, single, z, eps)
    mu_mt, pi_mt, log_pi_mt, log_std_mt = N.policy(mcfg, multi, z, eps_p, cond)
    close(mu, mu_mt[:, :a], atol=1e-5)
    close(pi, pi_mt[:, :a], atol=1e-5)
    close(log_std, log_std_mt[:, :a], atol=1e-5)
    close(log_pi, log_pi_mt, atol=1e-4)  # the padded dims' tanh terms, log(1 + 1e-6) each


def test_a_single_task_agent_from_a_multitask_model_learns_online_and_saves(recorded_multitask, tmp_path):
    from sb3_worldmodels import TDMPC2

    mt = recorded_multitask
    agent = TDMPC2.from_multitask(
        mt,
        "b",
        _LinearTask(5, 2),
        episode_length=10,
        seed_steps=20,
        batch_size=8,
        num_samples=32,
        num_elites=8,
        num_pi_trajs=4,
        seed=0,
    )
    before = jax.tree_util.tree_map(np.asarray, agent.policy.state["agent"].params)
    agent.learn(30)
    after = agent.policy.state["agent"].params
    assert agent._n_updates > 0
    changed = jax.tree_util.tree_map(lambda x, y: not np.array_equal(x, np.asarray(y)), before, after)
    assert all(jax.tree_util.tree_leaves(changed))
    agent.save(tmp_path / "fine_tuned.zip")
    loaded = TDMPC2.load(tmp_path / "fine_tuned.zip")
    obs = np.ones(5, np.float32)
    np.testing.assert_array_equal(
        loaded.predict(obs, deterministic=True)[0], agent.predict(obs, deterministic=True)[0]
    )


def test_from_multitask_refuses_another_tasks_env_or_an_unknown_task(recorded_multitask):
    from sb3_worldmodels import TDMPC2

    with pytest.raises(ValueError, match="task 'a' of the multi-task model has 3 and 1"):
        TDMPC2.from_multitask(recorded_multitask, "a", _LinearTask(5, 2), episode_length=10)
    with pytest.raises(ValueError, match="Unknown task 'c'"):
        TDMPC2.from_multitask(recorded_multitask, "c", _LinearTask(5, 2), episode_length=10)
    with pytest.raises(ValueError, match="change the networks' shapes"):
        TDMPC2.from_multitask(recorded_multitask, "a", _LinearTask(3, 1), episode_length=10, mlp_dim=64)


def test_evaluation_per_task_during_learn_is_logged(small_pool, tmp_path):
    """MultiTaskEvalCallback: every eval_freq updates, each task's return and their mean are logged
    (eval/<task>/mean_reward, eval/mean_reward) and kept; a wrong env is refused before any update."""
    import csv

    from stable_baselines3.common.logger import configure

    from sb3_worldmodels import MultiTaskEvalCallback

    model = _tiny_multitask(small_pool)
    model.set_logger(configure(str(tmp_path / "log"), ["csv"]))
    envs = {"up": _LinearTask(3, 1), "down": _LinearTask(5, 2)}
    callback = MultiTaskEvalCallback(envs, eval_freq=3, n_eval_episodes=1)
    model.learn(7, callback=callback, log_interval=100)
    assert [e["updates"] for e in callback.evaluations] == [3, 6]
    last = callback.evaluations[-1]
    assert last["mean"] == pytest.approx((last["up"] + last["down"]) / 2)
    with open(tmp_path / "log" / "progress.csv") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("eval/mean_reward")]
    assert [float(row["eval/n_updates"]) for row in rows] == [3, 6]
    assert float(rows[-1]["eval/down/mean_reward"]) == pytest.approx(last["down"], rel=1e-5)
    assert float(rows[-1]["eval/up/mean_reward"]) == pytest.approx(last["up"], rel=1e-5)

    updates = int(model.state.updates)
    wrong = MultiTaskEvalCallback({"up": _LinearTask(5, 2)}, eval_freq=1)
    with pytest.raises(ValueError, match="task 'up'"):
        model.learn(2, callback=wrong)
    assert int(model.state.updates) == updates

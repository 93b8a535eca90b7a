"""TD-MPC2 through the SB3 surface, its schedule, its planner and a probe with a known answer."""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_worldmodels import TDMPC2
from sb3_worldmodels.blocks.optim import get_learning_rate
from sb3_worldmodels.common.boundary import UnsupportedSpaceError
from sb3_worldmodels.common.checkpoints import join_split_leaves
from sb3_worldmodels.common.policy import flatten_state
from sb3_worldmodels.common.training import training_call
from sb3_worldmodels.tdmpc2 import agent as core
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS, preset
from sb3_worldmodels.tdmpc2.upgrade import upgrade_state_leaves
from tests.parity_helpers import moment_tree
from tests.probe_envs import BanditEnv, ChainEnv, NaNEnv

# One tiny configuration for the module, so the jitted functions compile once per env shape: the
# smoke settings on the 10-step chain, whose programs other test files share.
TINY = dict(
    model_size=1,
    enc_dim=16,
    mlp_dim=32,
    latent_dim=16,
    num_q=2,
    batch_size=16,
    num_samples=32,
    num_elites=4,
    num_pi_trajs=4,
    iterations=2,
    seed_steps=30,
    episode_length=10,  # the chain's
    seed=0,
)


def tiny(env, **kwargs):
    return TDMPC2(env, **{**TINY, **kwargs})


def chain_vec(n=1, length=10, **kwargs):
    return make_vec_env(lambda: ChainEnv(length=length, **kwargs), n_envs=n)


def leaves(model):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(model.policy.state)]


def test_construction_forms_and_defaults():
    model = TDMPC2("Pendulum-v1", model_size=1)
    assert isinstance(model, BaseAlgorithm) and model.n_envs == 1
    assert model.discount == pytest.approx(0.975)  # T = 200: (40 - 1) / 40
    assert model.seed_steps == 1000 and model._config.iterations == 6
    assert model._config.num_q == 2 and model._config.latent_dim == 128
    assert TDMPC2("MlpPolicy", chain_vec(2), **TINY).n_envs == 2
    assert TDMPC2(policy="MlpPolicy", env=gym.make("Pendulum-v1"), model_size=1).n_envs == 1
    big = TDMPC2("Pendulum-v1", model_size=1, episode_length=1000, action_repeat=2)
    assert big.discount == pytest.approx(0.99) and big.seed_steps == 2500


def test_discrete_actions_and_terminations_are_refused_with_the_fix():
    with pytest.raises(UnsupportedSpaceError, match="DreamerV3"):
        TDMPC2("CartPole-v1")
    model = tiny(make_vec_env(lambda: BanditEnv(discrete=False), n_envs=1))
    with pytest.raises(ValueError, match="episodic=True"):
        model.learn(5)
    with pytest.raises(ValueError, match="NaN"):
        tiny(make_vec_env(lambda: NaNEnv(), n_envs=1)).learn(20)


def test_schedule_counts_seed_updates_then_one_per_step():
    model = tiny(chain_vec(1, length=10))
    model.learn(50)
    # Steps s = 0..49: seed_steps (30) updates at s = 30, then one per step for s = 31..49.
    assert model._n_updates == 30 + 19
    # The fifth episode ended at the last step: as in the reference's loop, a finished episode is
    # stored at the start of the next step, after the updates of the step that ended it.
    assert model.replay_buffer.num_episodes == 4 and model.replay_buffer.stored_steps == 40
    model.learn(1, reset_num_timesteps=False)
    assert model.replay_buffer.num_episodes == 5 and model.replay_buffer.stored_steps == 50
    two = tiny(chain_vec(2, length=10))
    two.learn(50)  # 25 vector steps of 2 agent steps
    assert two._n_updates == 30 + 19


def test_replay_windows_follow_the_episodes():
    model = tiny(chain_vec(1, length=10))
    model.learn(40)
    batch = model.replay_buffer.sample(256)
    t = batch["obs"][..., 0] * 10  # ChainEnv obs[0] = t / length
    assert np.allclose(np.diff(t, axis=0), 1.0, atol=1e-5)
    assert t[0].min() >= 0 and t[-1].max() <= 9 + 1e-5  # the reference never draws the last window
    actions = batch["action"][1:]
    rewards = batch["reward"][1:]
    target = 0.5 / 2.0  # ChainEnv target in agent units ([-2, 2] -> [-1, 1])
    np.testing.assert_allclose(rewards, -((actions[..., 0] * 2.0 - 0.5) ** 2), atol=1e-5)
    assert target == 0.25


def test_predict_save_load_and_evaluate(tmp_path):
    model = tiny(chain_vec(1, length=10))
    model.learn(40)
    obs = model.env.reset()
    action, state = model.predict(obs, deterministic=True)
    assert action.shape == (1, 1) and state[0].shape == (1, 3, 1)
    model.save(tmp_path / "td")
    loaded = TDMPC2.load(tmp_path / "td.zip", env=chain_vec(1, length=10))
    assert loaded.discount == model.discount and loaded.seed_steps == model.seed_steps
    for a, b in zip(leaves(model), leaves(loaded), strict=True):
        np.testing.assert_array_equal(a, b)
    again, _ = loaded.predict(obs, deterministic=True)
    first, _ = TDMPC2.load(tmp_path / "td.zip").predict(obs, deterministic=True)
    np.testing.assert_array_equal(again, first)  # same predict stream from the same checkpoint
    mean, _ = evaluate_policy(loaded, loaded.env, n_eval_episodes=2)
    assert np.isfinite(mean)
    single, single_state = loaded.predict(obs[0], state=None)
    assert np.shape(single) == (1,) and single_state[0].shape == (1, 3, 1)


def test_split_run_equals_whole_run(tmp_path):
    whole = tiny(chain_vec(1, length=10))
    whole.learn(60)

    first = tiny(chain_vec(1, length=10))
    first.learn(30)
    first.save(tmp_path / "half.zip")
    first.save_replay_buffer(tmp_path / "half.pkl")
    second = TDMPC2.load(tmp_path / "half.zip", env=chain_vec(1, length=10))
    second.load_replay_buffer(tmp_path / "half.pkl")
    second.learn(30, reset_num_timesteps=False)
    assert second.num_timesteps == whole.num_timesteps and second._n_updates == whole._n_updates
    for a, b in zip(leaves(whole), leaves(second), strict=True):
        np.testing.assert_array_equal(a, b)


def test_no_recompilation_across_steps():
    model = tiny(chain_vec(1, length=10))
    model.learn(40)

    sizes = (core.act_jit._cache_size(), training_call(core)._cache_size())
    model.learn(20, reset_num_timesteps=False)
    # Another learning rate (here a schedule) reuses the compilation: the rate lives in the state.
    scheduled = tiny(chain_vec(1, length=10), learning_rate=lambda progress: 1e-4 + 1e-3 * progress)
    scheduled.learn(40)
    assert (core.act_jit._cache_size(), training_call(core)._cache_size()) == sizes
    used = float(get_learning_rate(scheduled.policy.state["agent"].pi_opt))
    assert np.isclose(used, scheduled.lr_schedule(scheduled._current_progress_remaining), rtol=1e-6)


def test_planner_finds_the_optimum_of_a_quadratic(monkeypatch):
    """With the value replaced by -Σ_t |a_t - target|², MPPI's mean converges to the target."""
    config = preset(1, obs_dim=2, action_dim=2, enc_dim=8, mlp_dim=8, latent_dim=8, iterations=6)
    target = jnp.array([0.3, -0.6])

    def quadratic(config, params, z, actions, *args):
        return -jnp.sum(jnp.square(actions - target), axis=(0, 2))

    monkeypatch.setattr(core, "estimate_value", quadratic)
    params, _ = core.N.init_params(config, jax.random.PRNGKey(0))
    z = jnp.zeros(config.latent_dim)
    noise = core.sample_plan_noise(config, jax.random.PRNGKey(1), config.iterations)
    action, mean, it = core.plan_with_noise(
        config, params, z, jnp.zeros((3, 2)), jnp.asarray(True), jnp.asarray(True), noise
    )
    np.testing.assert_allclose(mean, jnp.broadcast_to(target, (3, 2)), atol=0.05)
    np.testing.assert_allclose(action, target, atol=0.1)
    errors = [float(jnp.max(jnp.abs(m - target))) for m in it["mean_after"]]
    assert errors[-1] < errors[0]


def test_probe_learns_the_rewarding_action():
    """ChainEnv pays -(a - 0.5)^2 every step: the deterministic plan must approach a = 0.5."""
    model = tiny(chain_vec(1, length=10), learning_rate=3e-3, seed_steps=100, batch_size=32)
    model.learn(300)
    obs = model.env.reset()
    actions = []
    state = None
    for _ in range(10):
        action, state = model.predict(obs, state=state, deterministic=True)
        actions.append(float(action[0, 0]))
        obs, _, _, _ = model.env.step(action)
    assert abs(np.mean(actions) - 0.5) < 0.25, actions


def test_callbacks_checkpoint_tensorboard_and_world_model_phases(tmp_path):
    from stable_baselines3.common.callbacks import CheckpointCallback, EvalCallback, StopTrainingOnMaxEpisodes
    from stable_baselines3.common.monitor import Monitor

    from sb3_worldmodels import WorldModelCallback

    class Recorder(WorldModelCallback):
        def __init__(self):
            super().__init__()
            self.pretrain, self.updates, self.evals = 0, [], []

        def on_pretrain(self):
            self.pretrain += 1

        def on_post_update(self, metrics):
            self.updates.append(metrics)

        def on_eval_metrics(self, metrics):
            self.evals.append(metrics)

        def _on_step(self):
            return True

    model = tiny(chain_vec(1, length=10), tensorboard_log=str(tmp_path / "tb"))
    rec = Recorder()
    eval_cb = EvalCallback(
        Monitor(ChainEnv(length=10)), eval_freq=20, n_eval_episodes=1, log_path=str(tmp_path)
    )
    ckpt = CheckpointCallback(save_freq=20, save_path=str(tmp_path / "ckpt"), save_replay_buffer=True)
    model.learn(40, callback=[rec, eval_cb, ckpt], progress_bar=True)
    assert rec.pretrain == 1 and len(rec.updates) == model._n_updates == 30 + 9
    assert "train/consistency_loss" in rec.updates[0] and rec.evals
    files = os.listdir(tmp_path / "ckpt")
    assert any(f.endswith(".zip") for f in files) and any("replay_buffer" in f for f in files)
    assert [f for _, _, fs in os.walk(tmp_path / "tb") for f in fs if f.startswith("events")]
    stopped = tiny(chain_vec(1, length=10))
    stopped.learn(10_000, callback=StopTrainingOnMaxEpisodes(max_episodes=2))
    assert stopped.num_timesteps == 20


def test_foreign_and_corrupt_checkpoints_are_refused(tmp_path):
    from sb3_worldmodels import DreamerV3

    DreamerV3("Pendulum-v1", model_size="1m", n_envs=1).save(tmp_path / "dreamer.zip")
    with pytest.raises(ValueError, match="DreamerV3"):
        TDMPC2.load(tmp_path / "dreamer.zip")
    (tmp_path / "broken.zip").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="checkpoint"):
        TDMPC2.load(tmp_path / "broken.zip")


def test_predict_rollout_is_the_planners_value_and_takes_env_actions():
    model = tiny(chain_vec(1, length=10))
    model.learn(40)  # some updates, so the heads are not at their zero initialisation
    cfg = model._config
    obs = np.array([[0.2, 1.0], [0.7, 1.0]], np.float32)
    plan = np.random.default_rng(0).uniform(-1, 1, (2, cfg.horizon, 1)).astype(np.float32)
    out = model.predict_plan_rollout(obs, plan)
    assert out["reward"].shape == (2, cfg.horizon) and out["latent"].shape == (2, cfg.horizon + 1, 16)
    # Σ γ^t r_t + γ^H Q(z_H, π(z_H)): the planner's estimate with no policy noise, both members, no dropout.
    params = model.policy.state["agent"].params
    z = core.N.encode(cfg, params, jnp.asarray(obs))
    planner = core.estimate_value(
        cfg, params, z, jnp.swapaxes(jnp.asarray(plan), 0, 1), jnp.zeros((2, 1)), jnp.arange(2), None
    )
    discounts = cfg.discount ** np.arange(cfg.horizon)
    ours = out["reward"] @ discounts + cfg.discount**cfg.horizon * out["value"]
    np.testing.assert_allclose(ours, np.asarray(planner), rtol=1e-5, atol=1e-5)
    # Env units (ChainEnv's actions are in [-2, 2]) give the same prediction as agent units.
    by_env = model.predict_rollout(obs, 2.0 * plan)
    # float32: a batch of one and a batch of two may round differently in the matmuls.
    np.testing.assert_allclose(by_env["reward"], out["reward"], rtol=1e-5, atol=1e-7)
    single = model.predict_rollout(obs[0], 2.0 * plan[0])
    np.testing.assert_allclose(single["reward"], out["reward"][0], rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="expected"):
        model.predict_rollout(obs, plan[:, :, :1].repeat(2, axis=2))


CHECKPOINTS = Path(__file__).parent / "fixtures" / "checkpoints"


def test_a_checkpoint_of_an_earlier_release_loads_acts_the_same_and_trains_on():
    """A file saved at 3fadb7b (the learning rate one state leaf, Adam's moments the whole optimiser
    state, LayerNorm parameters ln_scale/ln_bias; tests/fixtures/README.md) loads: it plans as it did
    there, keeps its learning rate in both optimisers and its Adam moments, and learns on."""
    old = CHECKPOINTS / "tdmpc2_before_optimiser_states.zip"
    recorded = np.load(CHECKPOINTS / "tdmpc2_before_optimiser_states_predict.npz")
    model = TDMPC2.load(old, env=make_vec_env(lambda: ChainEnv(length=10), n_envs=1))
    action, (plan,) = model.predict(recorded["obs"], deterministic=True)
    np.testing.assert_allclose(action, recorded["action"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(plan, recorded["plan"], rtol=1e-5, atol=1e-6)
    state = model.policy.state["agent"]
    for optimiser in (state.wm_opt, state.pi_opt):
        assert float(get_learning_rate(optimiser)) == pytest.approx(1e-3)
        adam_state = optimiser.inner_state[0]
        assert int(optimiser.count) == int(adam_state.count) == int(state.updates) > 0
        assert np.mean(np.asarray(adam_state.nu) != 0) > 0.5
    before = int(state.updates)
    with pytest.warns(UserWarning, match="replay buffer was not loaded"):
        model.learn(12, reset_num_timesteps=False)  # an episode ends: updates resume
    assert int(model.policy.state["agent"].updates) > before


def test_upgrade_state_leaves_renames_only_the_earlier_names():
    old = {
        "state/['agent'].lr": 1.0,
        "state/['agent'].wm_opt.count": 3,
        "state/['agent'].wm_opt.mu['encoder']['0']['kernel']": 4.0,
        "state/['agent'].pi_opt.nu['0']['bias']": 5.0,
        "state/['agent'].params['pi']['0']['kernel']": 6.0,
        "state/['agent'].params['pi']['0']['ln_scale']": 8.0,
        "state/['agent'].pi_opt.mu['0']['ln_bias']": 9.0,
        "state/['act_key']": 7,
    }
    assert upgrade_state_leaves(old, "state/['agent']") == {
        "state/['agent'].wm_opt.hyperparams['learning_rate']": 1.0,
        "state/['agent'].pi_opt.hyperparams['learning_rate']": 1.0,
        "state/['agent'].wm_opt.inner_state[0].count": 3,
        "state/['agent'].wm_opt.count": 3,
        "state/['agent'].wm_opt.inner_state[0].mu['encoder']['0']['kernel']": 4.0,
        "state/['agent'].pi_opt.inner_state[0].nu['0']['bias']": 5.0,
        "state/['agent'].params['pi']['0']['kernel']": 6.0,
        "state/['agent'].params['pi']['0']['norm']['scale']": 8.0,
        "state/['agent'].pi_opt.inner_state[0].mu['0']['norm']['bias']": 9.0,
        "state/['act_key']": 7,
    }
    config = preset(**SMOKE_SETTINGS, obs_dim=2, action_dim=1)
    today = flatten_state({"agent": core.init_state(config, jax.random.PRNGKey(0))})
    assert upgrade_state_leaves(today, "['agent']") == today


@pytest.mark.parametrize("seeds", [0, 3])
def test_moments_stored_per_parameter_are_joined_in_the_trees_order(seeds: int):
    """Files written before each optimiser moment was one vector of every parameter hold it as one
    array per parameter (``.wm_opt.inner_state[0].mu['encoder']['0']['kernel']``, ...): loading joins
    them into the vector in the order the optimiser ravels the parameters, over a seed group's seed
    axis too; the file's other leaves pass as they are."""
    config = preset(**SMOKE_SETTINGS, obs_dim=2, action_dim=1)
    state = core.init_state(config, jax.random.PRNGKey(0))
    wm_params = {k: v for k, v in state.params.items() if k != "pi"}
    size = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(wm_params))
    lead = (seeds,) if seeds else ()
    vector = np.arange(seeds * size if seeds else size, dtype=np.float32).reshape(*lead, size)
    name = "['agent'].wm_opt.inner_state[0].mu"
    today = {k: np.broadcast_to(v, (*lead, *v.shape)) for k, v in flatten_state({"agent": state}).items()}
    today[name] = vector
    flat_of = jax.tree_util.tree_flatten_with_path
    trees = [flat_of(moment_tree(v, wm_params))[0] for v in (vector if seeds else [vector])]
    split = {k: v for k, v in today.items() if k != name}
    for i, (path, _) in enumerate(trees[0]):
        stacked = np.stack([np.asarray(tree[i][1]) for tree in trees])
        split[name + jax.tree_util.keystr(path)] = stacked if seeds else stacked[0]
    assert len(split) > len(today)
    joined = join_split_leaves(split, today)
    assert joined.keys() == today.keys()
    np.testing.assert_array_equal(joined[name], vector)
    assert all(joined[k] is split[k] for k in today if k != name)

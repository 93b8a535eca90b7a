"""DreamerV3 through the SB3 surface: construction, learn, callbacks, predict, save/load, bad input."""

from __future__ import annotations

import os
import warnings
import zipfile

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch as th
from stable_baselines3 import SAC
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import (
    CheckpointCallback,
    EvalCallback,
    StopTrainingOnMaxEpisodes,
    StopTrainingOnRewardThreshold,
)
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

from sb3_worldmodels import DreamerV3, WorldModelCallback
from sb3_worldmodels.common.boundary import UnsupportedSpaceError
from sb3_worldmodels.common.training import training_call
from sb3_worldmodels.dreamerv3 import agent as core
from sb3_worldmodels.dreamerv3 import networks as N
from tests.parity_helpers import moment_tree
from tests.probe_envs import ChainEnv, DictObsEnv, NaNEnv, ScriptedEpisodesEnv

# One tiny configuration for the whole module, so the jitted functions compile once.
TINY = dict(
    model_size="1m",
    units=16,
    deter=32,
    hidden=16,
    classes=4,
    stoch=4,
    blocks=4,
    batch_size=2,
    batch_length=8,
    train_ratio=16,
    imag_horizon=3,
    n_envs=2,
    seed=0,
)


def tiny(env, **kwargs):
    return DreamerV3(env, **{**TINY, **kwargs})


def params_of(model):
    return jax.tree_util.tree_leaves(model.policy.state)


def chain_vec(n=1, **kwargs):
    return make_vec_env(lambda: ChainEnv(**kwargs), n_envs=n)


def test_construction_forms():
    by_id = tiny("CartPole-v1")
    assert isinstance(by_id, BaseAlgorithm) and isinstance(by_id, OffPolicyAlgorithm)
    assert by_id.n_envs == 2 and by_id.model_size == "1m"
    by_env = tiny(gym.make("CartPole-v1"), n_envs=None)
    assert by_env.n_envs == 1
    vec = make_vec_env("CartPole-v1", n_envs=3)
    by_vec = DreamerV3("MlpPolicy", vec, **{k: v for k, v in TINY.items() if k != "n_envs"})
    assert by_vec.n_envs == 3
    zoo = DreamerV3(
        policy="MlpPolicy",
        env=vec,
        seed=1,
        verbose=0,
        device="auto",
        tensorboard_log=None,
        **{k: v for k, v in TINY.items() if k not in ("n_envs", "seed")},
    )
    assert zoo.seed == 1
    assert DreamerV3("Pendulum-v1", n_envs=1, _init_setup_model=False).n_envs == 1
    no_n = {k: v for k, v in TINY.items() if k != "n_envs"}
    for mode in ("sync", "vector_entry_point"):
        gym_vec = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode=mode)
        assert DreamerV3(gym_vec, **no_n).n_envs == 2


def test_defaults_are_paper_era():
    model = DreamerV3("Pendulum-v1", n_envs=1)
    cfg = model.config
    assert (cfg.units, cfg.deter, cfg.hidden, cfg.classes) == (256, 2048, 256, 16)
    assert (cfg.train_ratio, cfg.batch_size, cfg.batch_length, cfg.imag_horizon) == (512, 16, 64, 15)
    assert model.buffer_size == 5_000_000 and model.replay_buffer is None
    assert model.replay_bytes_per_seed == 0
    assert DreamerV3("Pendulum-v1", _init_setup_model=False).n_envs == 16


def test_learn_rows_and_updates_follow_the_ratio():
    model = tiny(chain_vec(1, length=10), n_envs=None)
    model.learn(66)
    # 6 episodes of 10 steps = 6 * 11 rows (the reset row included).
    assert model.num_timesteps == 66
    assert model.replay_buffer.size() == 66
    # Rows counted one by one with the gate: the schedule owes exactly the updates done.
    assert model._n_updates > 0
    rate = TINY["train_ratio"] / (TINY["batch_size"] * TINY["batch_length"])
    window = TINY["batch_length"] + 1
    first = window + TINY["batch_size"] - 1  # rows when the replay first holds batch_size windows
    expected = 1 + int(np.floor((66 - first) * rate + 1e-9))
    assert model._n_updates == expected
    assert model.replay_bytes_per_seed == model.replay_buffer.nbytes > 0


def test_callbacks_eval_checkpoint_progress_tensorboard(tmp_path):
    model = tiny("CartPole-v1", tensorboard_log=str(tmp_path / "tb"))
    eval_env = Monitor(gym.make("CartPole-v1"))
    eval_cb = EvalCallback(
        eval_env,
        eval_freq=20,
        n_eval_episodes=2,
        log_path=str(tmp_path / "eval"),
        best_model_save_path=str(tmp_path / "best"),
    )
    ckpt = CheckpointCallback(save_freq=25, save_path=str(tmp_path / "ckpt"), save_replay_buffer=True)
    model.learn(120, callback=[eval_cb, ckpt], progress_bar=True)
    assert os.path.exists(tmp_path / "eval" / "evaluations.npz")
    assert os.path.exists(tmp_path / "best" / "best_model.zip")
    files = os.listdir(tmp_path / "ckpt")
    assert any(f.endswith(".zip") for f in files) and any("replay_buffer" in f for f in files)
    events = [f for _, _, fs in os.walk(tmp_path / "tb") for f in fs if f.startswith("events")]
    assert events
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=2)
    assert np.isfinite(mean)


def test_stop_callbacks():
    model = tiny("CartPole-v1")
    model.learn(10_000, callback=StopTrainingOnMaxEpisodes(max_episodes=2))
    assert model.num_timesteps < 10_000
    model = tiny("CartPole-v1")
    stop = StopTrainingOnRewardThreshold(reward_threshold=-1.0)
    model.learn(
        10_000,
        callback=EvalCallback(
            Monitor(gym.make("CartPole-v1")), eval_freq=5, n_eval_episodes=1, callback_on_new_best=stop
        ),
    )
    assert model.num_timesteps <= 2 * 5 + 4


class _Recorder(WorldModelCallback):
    def __init__(self, stop_after: int | None = None):
        super().__init__()
        self.pretrain = 0
        self.updates: list[dict] = []
        self.evals: list[dict] = []
        self.steps = 0
        self.stop_after = stop_after

    def on_pretrain(self):
        self.pretrain += 1

    def on_post_update(self, metrics):
        self.updates.append(metrics)
        return {"custom/seen": len(self.updates)}

    def on_eval_metrics(self, metrics):
        self.evals.append(metrics)
        return {"custom/eval": 1.0}

    def _on_step(self):
        self.steps += 1
        return self.stop_after is None or self.steps < self.stop_after


def test_world_model_callback_phases():
    rec = _Recorder()
    model = tiny("CartPole-v1")
    eval_cb = EvalCallback(Monitor(gym.make("CartPole-v1")), eval_freq=30, n_eval_episodes=1)
    model.learn(100, callback=[rec, eval_cb])
    assert rec.pretrain == 1
    assert len(rec.updates) == model._n_updates > 0
    assert "train/loss" in rec.updates[0]
    assert rec.evals and "eval/mean_reward" in rec.evals[0]
    stopper = _Recorder(stop_after=3)
    model2 = tiny("CartPole-v1")
    model2.learn(1000, callback=stopper)
    assert stopper.steps == 3 and model2.num_timesteps <= 3 * 2 + 2


def test_predict_protocol_and_purity():
    model = tiny("CartPole-v1")
    model.learn(60)
    obs = model.env.reset()
    before = [np.array(x) for x in params_of(model)]
    act_key = np.array(model.policy.state["act_key"])
    action, state = model.predict(obs, deterministic=True)
    assert action.shape == (2,) and len(state) == 3 and state[0].shape[0] == 2
    action2, state2 = model.predict(
        obs, state=state, episode_start=np.array([True, False]), deterministic=True
    )
    single, single_state = model.predict(obs[0], deterministic=True)
    assert np.ndim(single) == 0 and single_state[0].shape[0] == 1
    assert single == action[0]
    after = params_of(model)
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert np.array_equal(act_key, np.array(model.policy.state["act_key"]))
    with pytest.raises(ValueError, match="tuple"):
        model.predict(gym.make("CartPole-v1").reset())
    with pytest.warns(UserWarning, match="without `state`"):
        model.predict(obs, deterministic=True)  # the second call in a row without state
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.predict(obs, deterministic=True)  # warned once only
        _, state = model.predict(obs, state=state, deterministic=True)
        model.predict(obs, state=state, deterministic=True)


@pytest.mark.parametrize(
    "env_id",
    # Pendulum's continuous actions compile another update (about 50 s): a benchmark check (-m slow)
    ["CartPole-v1", pytest.param("Pendulum-v1", marks=pytest.mark.slow)],
)
def test_predict_rollout_agrees_with_acting(env_id):
    """The rollout starts from the belief predict forms from the same arguments; its first imagined
    state is the recurrent state the agent reaches when it really takes the action (the GRU step does
    not read the next observation); later steps follow the prior."""
    model = tiny(env_id)
    model.learn(60)
    env = model.env
    first_obs = env.reset()
    first_action, first_state = model.predict(first_obs, deterministic=True)
    obs, _, dones, _ = env.step(first_action)
    action, state = model.predict(obs, state=first_state, episode_start=dones, deterministic=True)
    env.action_space.seed(0)
    others = [np.stack([env.action_space.sample() for _ in range(2)]) for _ in range(3)]
    later = np.stack([action, *others], 1)
    calls = model._predict_calls
    out = model.predict_rollout(obs, later, state=first_state, episode_start=dones)
    assert model._predict_calls == calls  # predict's random stream is not advanced
    n, t = 2, 4
    assert out["observation"].shape == (n, t, model.observation_space.shape[0])
    assert out["reward"].shape == out["continue"].shape == (n, t) and out["value"].shape == (n,)
    assert all(np.all(np.isfinite(v)) for v in out.values())
    assert np.all((out["continue"] > 0) & (out["continue"] < 1))
    next_obs, _, dones, _ = env.step(action)
    _, next_state = model.predict(next_obs, state=state, episode_start=dones, deterministic=True)
    np.testing.assert_allclose(out["deter"][:, 0], next_state[0], rtol=1e-5, atol=1e-6)
    # Open loop and causal: a shorter action sequence predicts the same first steps.
    short = model.predict_rollout(obs, later[:, :2], state=first_state, episode_start=np.zeros(2, bool))
    for k in ("observation", "reward", "continue", "deter"):
        np.testing.assert_allclose(short[k], out[k][:, :2], rtol=1e-5, atol=1e-6)
    # One observation, no env axis: the first env's prediction.
    one = model.predict_rollout(obs[0], later[0], state=tuple(s[:1] for s in first_state))
    np.testing.assert_allclose(one["reward"], out["reward"][0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="env axis first"):
        model.predict_rollout(obs, later[0], state=first_state)


def test_save_load_predict_identical(tmp_path):
    model = tiny(chain_vec(1, length=10), n_envs=None)  # continuous actions
    model.learn(60)
    obs = model.env.reset()
    action, state = model.predict(obs, deterministic=True)
    path = tmp_path / "dreamer"
    model.save(path)
    loaded = DreamerV3.load(path.with_suffix(".zip"), env=model.env)
    action2, state2 = loaded.predict(obs, deterministic=True)
    np.testing.assert_array_equal(action, action2)
    for a, b in zip(state, state2, strict=True):
        np.testing.assert_array_equal(a, b)
    assert loaded.replay_buffer is None  # a loaded model allocates no replay until learn
    assert loaded.num_timesteps == model.num_timesteps
    params = loaded.get_parameters()
    loaded.set_parameters(params)


def test_parameters_with_moments_per_parameter_load_as_the_vector():
    """Parameters saved before the optimiser kept its moments as one vector hold one tensor per
    parameter for each moment: set_parameters joins them, so the model's state is the one they came
    from, for one seed and for a group's (S, P) moments."""
    rng = np.random.default_rng(0)
    for seed in (0, [0, 1]):
        env = chain_vec(2 if seed == 0 else 4, length=10)
        model = tiny(env, n_envs=None, seed=seed)
        moments = {
            name: th.as_tensor(rng.normal(size=tuple(tensor.shape)).astype(np.float32))
            for name, tensor in model.get_parameters()["policy"].items()
            if name.endswith((".nu", ".mu"))
        }
        assert moments
        model.set_parameters({"policy": moments}, exact_match=False)  # every moment nonzero
        saved = model.get_parameters()["policy"]
        params = model.policy.state["agent"].params
        lead = () if seed == 0 else (2,)
        one_seed = jax.tree_util.tree_map(lambda x: x[0], params) if lead else params
        split = {}
        for name, tensor in saved.items():
            if not name.endswith((".nu", ".mu")):
                split[name] = tensor
                continue
            vectors = tensor.numpy().reshape(-1, tensor.shape[-1])
            trees = [moment_tree(v, one_seed) for v in vectors]
            for path, _ in jax.tree_util.tree_flatten_with_path(trees[0])[0]:
                leaves = [np.array(dict(jax.tree_util.tree_flatten_with_path(t)[0])[path]) for t in trees]
                split[name + jax.tree_util.keystr(path)] = th.as_tensor(
                    np.stack(leaves) if lead else leaves[0]
                )
        assert len(split) > len(saved) + 100
        fresh = tiny(chain_vec(2 if seed == 0 else 4, length=10), n_envs=None, seed=seed)
        fresh.set_parameters({"policy": split})
        for name, tensor in fresh.get_parameters()["policy"].items():
            np.testing.assert_array_equal(tensor.numpy(), saved[name].numpy(), err_msg=name)


def test_replay_rows_follow_the_reference_driver():
    """As the reference's driver writes rows (driver.py:34-81, from_gym.py:56-82@2411f7d): one row per
    observation, the reset row first (reward 0, is_first), the episode's last row with the terminal
    observation, its reward, is_last, is_terminal only for a termination (docs/deviations.md D21)
    and a zero action; every other row stores the one-hot action taken after its observation, and
    the policy's latents, which the GRU continues from with the stored action (the replay context)."""
    model = tiny(make_vec_env(ScriptedEpisodesEnv, n_envs=2), n_envs=None, batch_length=64)
    model.learn(60)  # no window of 65 rows yet: no training, the policy stays fixed
    assert model._n_updates == 0
    buf = model.replay_buffer
    assert buf.rows_added_per_env.sum() == model.num_timesteps
    cfg = model._config
    dyn = core.policy_params(model.policy.state["agent"])["dyn"]
    for env in range(2):
        rows = buf.read_rows(env, np.arange(buf.rows_added_per_env[env]))
        expected, k = [], 0
        while len(expected) < len(rows["obs"]):
            n = ScriptedEpisodesEnv.length(k)
            for t in range(n + 1):
                last = t == n
                expected.append((k, t, 10 * k + t if t else 0, t == 0, last, last and k % 2 == 0))
            k += 1
        expected = np.array(expected[: len(rows["obs"])], np.float32)
        np.testing.assert_array_equal(rows["obs"], expected[:, :2])
        np.testing.assert_array_equal(rows["reward"], expected[:, 2])
        for i, name in enumerate(("is_first", "is_last", "is_terminal"), start=3):
            np.testing.assert_array_equal(rows[name], expected[:, i].astype(bool), err_msg=name)
        last = rows["is_last"]
        assert not rows["action"][last].any()  # zeroed on the episode's last row
        np.testing.assert_array_equal(rows["action"][~last].sum(-1), 1.0)  # one-hot elsewhere
        # Each non-first, non-last row's deter is the GRU step from the previous row's stored latent
        # and stored action: exactly what training's replay context relies on (agent.py:188-199@2411f7d,
        # agent.py:172-183@29eb964).
        for i in np.flatnonzero(~rows["is_first"] & ~last)[:6]:
            prev = jnp.asarray(rows["deter"][i - 1 : i])
            deter, _ = N.rssm_step(
                cfg,
                dyn,
                None,
                prev,
                N.to_blocks(cfg, prev),
                jax.nn.one_hot(rows["stoch"][i - 1 : i], cfg.classes),
                jnp.asarray(rows["action"][i - 1 : i]),
            )
            np.testing.assert_allclose(np.asarray(deter)[0], rows["deter"][i], rtol=1e-5, atol=1e-6)


def test_split_run_equals_whole_run(tmp_path):
    def make():
        return tiny(chain_vec(1, length=10), n_envs=None)

    whole = make()
    whole.learn(66)

    first = make()
    first.learn(33)
    first.save(tmp_path / "half.zip")
    first.save_replay_buffer(tmp_path / "half.pkl")
    second = DreamerV3.load(tmp_path / "half.zip", env=chain_vec(1, length=10))
    second.load_replay_buffer(tmp_path / "half.pkl")
    second.learn(33, reset_num_timesteps=False)

    assert second.num_timesteps == whole.num_timesteps and second._n_updates == whole._n_updates
    for a, b in zip(params_of(whole), params_of(second), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_no_recompilation_after_first_update():
    model = tiny("CartPole-v1")
    model.learn(80)
    # The collector acts through policy_step with its key drawn from the stream (from_stream()).
    programs = (training_call(core), core.policy_step_jit, core.policy_step_jit.from_stream())
    sizes = tuple(program._cache_size() for program in programs)
    assert sizes[2] > 0
    model.learn(80, reset_num_timesteps=False)
    assert tuple(program._cache_size() for program in programs) == sizes


def test_subproc_and_dict_observations():
    vec = SubprocVecEnv([lambda: ChainEnv()] * 2)
    try:
        model = DreamerV3("MlpPolicy", vec, **{k: v for k, v in TINY.items() if k != "n_envs"})
        model.learn(30)
        assert model.num_timesteps >= 30
    finally:
        vec.close()
    model = DreamerV3(DummyVecEnv([DictObsEnv]), **{k: v for k, v in TINY.items() if k != "n_envs"})
    assert model.obs_adapter.dim == 3
    model.learn(25)
    action, _ = model.predict(DictObsEnv().reset()[0])
    assert action.shape == (1,)


def test_bad_input_errors(tmp_path):
    with pytest.raises(UnsupportedSpaceError, match="MultiDiscrete"):
        tiny(_multidiscrete_env(), n_envs=None)
    with pytest.raises(ValueError, match="norm_reward"):
        tiny(VecNormalize(chain_vec()), n_envs=None)
    with pytest.raises(ValueError, match="allow_vecnormalize_obs"):
        tiny(VecNormalize(chain_vec(), norm_reward=False), n_envs=None)
    with pytest.warns(UserWarning, match="normalised observations"):
        tiny(VecNormalize(chain_vec(), norm_reward=False), n_envs=None, allow_vecnormalize_obs=True)
    with pytest.raises(ValueError, match="action_noise"):
        tiny("Pendulum-v1", action_noise=object())
    with pytest.raises(ValueError, match="Non-finite observation"):
        tiny(DummyVecEnv([NaNEnv]), n_envs=None).learn(20)


def _multidiscrete_env():
    class Env(ChainEnv):
        def __init__(self):
            super().__init__()
            self.action_space = gym.spaces.MultiDiscrete([2, 3])

    return Env()


def test_foreign_and_corrupt_checkpoints(tmp_path):
    sac = SAC("MlpPolicy", "Pendulum-v1", buffer_size=100)
    sac.save(tmp_path / "sac.zip")
    with pytest.raises(ValueError, match="SAC"):
        DreamerV3.load(tmp_path / "sac.zip")
    (tmp_path / "bad.zip").write_bytes(b"not a zip at all")
    with pytest.raises(ValueError, match="Could not read"):
        DreamerV3.load(tmp_path / "bad.zip")
    model = tiny("CartPole-v1")
    other = tiny("CartPole-v1", units=8)
    before = [np.array(x) for x in params_of(other)]
    with pytest.raises(RuntimeError, match="does not fit"):
        other.set_parameters(model.get_parameters())
    assert all(np.array_equal(a, b) for a, b in zip(before, params_of(other), strict=True))
    # A truncated zip (an interrupted copy) fails clearly too.
    model.save(tmp_path / "ok.zip")
    data = (tmp_path / "ok.zip").read_bytes()
    (tmp_path / "cut.zip").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError):
        DreamerV3.load(tmp_path / "cut.zip")
    assert zipfile.is_zipfile(tmp_path / "ok.zip")


def test_replay_buffer_mismatch_is_refused(tmp_path):
    model = tiny("CartPole-v1")
    model.learn(30)
    model.save_replay_buffer(tmp_path / "rb.pkl")
    other = tiny("CartPole-v1", n_envs=3)
    with pytest.raises(ValueError, match="does not fit"):
        other.load_replay_buffer(tmp_path / "rb.pkl")
    assert other.replay_buffer is None


def test_learning_rate_schedule_reaches_the_optimiser():
    from sb3_worldmodels.blocks.optim import get_learning_rate

    model = tiny("CartPole-v1", learning_rate=lambda progress: 1e-4 + 1e-3 * progress)
    model.learn(60)
    used = float(get_learning_rate(model.policy.state["agent"].opt_state))
    # The rate of the last training call: the schedule at the progress remaining at its end.
    assert 0.9e-4 < used < 1.1e-3
    assert np.isclose(used, model.lr_schedule(model._current_progress_remaining), rtol=1e-6)
    constant = tiny("CartPole-v1", learning_rate=2e-4)
    constant.learn(60)
    assert np.isclose(float(get_learning_rate(constant.policy.state["agent"].opt_state)), 2e-4)

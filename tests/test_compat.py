"""The SB3 compatibility matrix (docs/compatibility.md), row by row, for both agents.

Rows covered elsewhere are named in the doc; this file holds the rest. Every agent runs on the same
ChainEnv shapes and tiny settings so each compiles once per worker.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.callbacks import (
    CallbackList,
    CheckpointCallback,
    ConvertCallback,
    EvalCallback,
    EveryNTimesteps,
    LogEveryNTimesteps,
    StopTrainingOnNoModelImprovement,
)
from stable_baselines3.common.env_checker import check_env
from stable_baselines3.common.logger import configure
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecMonitor
from stable_baselines3.her.her_replay_buffer import HerReplayBuffer

from sb3_worldmodels import TDMPC2, ActionRepeat, DreamerV3, make_dmc_env
from sb3_worldmodels.blocks.precision import resolve_compute_dtype
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMERV3_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE
from tests.probe_envs import ChainEnv

SETTINGS = {
    "tdmpc2": (
        TDMPC2,
        dict(
            **TDMPC2_SMOKE, seed_steps=10, seed=0,
        ),
    ),
    "dreamerv3": (
        DreamerV3,
        dict(
            **DREAMERV3_SMOKE, seed=0,
        ),
    ),
}  # fmt: skip
AGENTS = list(SETTINGS)


def limited_chain() -> gym.Env:
    """ChainEnv with a TimeLimit that says its episode length (TD-MPC2 reads it for its discount)."""
    return TimeLimit(ChainEnv(), 10)


def chain(n: int = 1, monitor: bool = True):
    return DummyVecEnv([(lambda: Monitor(limited_chain())) if monitor else limited_chain for _ in range(n)])


def build(agent: str, env=None, **kwargs):
    cls, settings = SETTINGS[agent]
    return cls("MlpPolicy", env if env is not None else chain(), **{**settings, **kwargs})


@pytest.mark.parametrize("agent", AGENTS)
def test_callbacks_one_by_one(agent, tmp_path):
    model = build(agent)
    calls = []
    every = EveryNTimesteps(
        n_steps=10, callback=ConvertCallback(lambda _locals, _globals: calls.append(1) is None)
    )
    no_improvement = StopTrainingOnNoModelImprovement(max_no_improvement_evals=1, min_evals=1)
    eval_cb = EvalCallback(
        Monitor(limited_chain()),
        eval_freq=10,
        n_eval_episodes=1,
        callback_after_eval=no_improvement,
        verbose=0,
    )
    ckpt = CheckpointCallback(save_freq=15, save_path=str(tmp_path), name_prefix="m")
    model.learn(200, callback=CallbackList([every, LogEveryNTimesteps(n_steps=10), ckpt, eval_cb]))
    # Training stops at an evaluation exactly when two evaluations in a row did not improve.
    stopped_early = model.num_timesteps < 200
    assert stopped_early == (no_improvement.no_improvement_evals > 1)
    assert not stopped_early or eval_cb.n_calls % 10 == 0  # at an evaluation
    assert len(calls) >= model.num_timesteps // 20  # DreamerV3 counts rows: a reset row per episode
    first = min(tmp_path.glob("m_*_steps.zip"), key=lambda p: int(p.stem.split("_")[1]))
    assert type(model).load(first).num_timesteps == int(first.stem.split("_")[1]) >= 15


@pytest.mark.parametrize("agent", AGENTS)
def test_vec_monitor_and_loggers(agent, tmp_path):
    model = build(agent, VecMonitor(chain(monitor=False)))
    model.set_logger(configure(str(tmp_path), ["csv", "json", "log"]))
    model.learn(40, log_interval=1)
    assert len(model.ep_info_buffer) >= 3  # VecMonitor, not Monitor, reported the episodes
    rows = [json.loads(line) for line in (tmp_path / "progress.json").read_text().splitlines()]
    keys = set().union(*rows)
    assert {"time/total_timesteps", "rollout/ep_rew_mean", "train/learning_rate"} <= keys
    assert (tmp_path / "progress.csv").read_text().startswith(("time/", "rollout/", "train/"))


@pytest.mark.parametrize("agent", AGENTS)
def test_get_set_parameters_and_set_env(agent):
    trained = build(agent)
    trained.learn(30)
    fresh = build(agent, seed=1)
    obs = np.array([[0.3, 1.0]], np.float32)
    fresh.set_parameters(trained.get_parameters())
    a, _ = trained.predict(obs, deterministic=True)
    b, _ = fresh.predict(obs, deterministic=True)
    np.testing.assert_allclose(a, b, rtol=1e-6)
    fresh.set_env(chain())
    fresh.learn(10, reset_num_timesteps=False)
    with pytest.raises((ValueError, AssertionError)):
        fresh.set_env(DummyVecEnv([lambda: ChainEnv(discrete=True)]))


def test_vec_frame_stack():
    model = build("tdmpc2", VecFrameStack(chain(), n_stack=3))
    assert model.obs_adapter.dim == 6
    model.learn(25)
    assert model._n_updates > 0


@pytest.mark.parametrize("agent", AGENTS)
def test_her_and_action_noise_are_refused(agent):
    from stable_baselines3.common.noise import NormalActionNoise

    with pytest.raises(ValueError, match="HerReplayBuffer"):
        build(agent, replay_buffer_class=HerReplayBuffer)
    with pytest.raises(ValueError, match="action_noise"):
        build(agent, action_noise=NormalActionNoise(np.zeros(1), np.ones(1)))


def test_env_checker_accepts_the_env_helpers():
    check_env(make_dmc_env("cartpole-balance", action_repeat=2))
    check_env(ActionRepeat(gym.make("Pendulum-v1"), 2))


@pytest.mark.parametrize("agent", AGENTS)
def test_every_argument_is_kept_under_its_own_name(agent):
    """SB3's base classes store some arguments under the same names (``tau``, ``gamma``, ...): a
    constructor argument must survive that, and every config field must reach the config."""
    cls, settings = SETTINGS[agent]
    model = build(agent)
    signature = inspect.signature(cls.__init__).parameters
    for name, param in signature.items():
        given = settings.get(name, param.default)
        if name in ("self", "policy", "env") or given is None or not isinstance(given, (int, float, str)):
            continue
        if name in ("device", "stats_window_size", "_init_setup_model"):  # SB3's own: resolved or private
            continue
        assert getattr(model, name) == given, name
    config = model.config
    accelerator_dtype = sys.modules[type(config).__module__].ACCELERATOR_DTYPE
    for field in dataclasses.fields(config):
        given = getattr(model, field.name, None)
        if field.name == "compute_dtype":  # the attribute keeps the choice, the config what runs
            given = resolve_compute_dtype(given, accelerator_dtype)
        if given is not None:  # None: the preset's
            assert getattr(config, field.name) == given, field.name


def test_tdmpc2_target_rate_reaches_the_update():
    model = build("tdmpc2", tau=0.02)
    assert model.tau == 0.02 and model.config.tau == 0.02
    assert build("tdmpc2").config.tau == 0.01  # the reference's default, not SB3's

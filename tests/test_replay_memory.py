"""The replay's size is checked against the memory available before anything is allocated."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.common import replay as replay_module
from sb3_worldmodels.common.replay import available_memory
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE
from tests.probe_envs import ChainEnv

AGENTS = {
    "dreamerv3": (DreamerV3, {**DREAMER_SMOKE, "seed": 0}, "buffer_size"),
    "tdmpc2": (TDMPC2, {**TDMPC2_SMOKE, "seed": 0, "seed_steps": 10}, "buffer_size"),
}


def build(agent: str):
    cls, settings, _ = AGENTS[agent]
    return cls(make_vec_env(lambda: TimeLimit(ChainEnv(), 10), n_envs=2), **settings)


def test_the_memory_available_is_read():
    available = available_memory()
    assert available is None or available > 0


@pytest.mark.parametrize("agent", list(AGENTS))
def test_a_replay_larger_than_memory_is_refused_before_anything_changes(agent, monkeypatch):
    model = build(agent)
    setting = AGENTS[agent][2]
    monkeypatch.setattr(replay_module, "available_memory", lambda: 50_000)
    with pytest.raises(MemoryError, match=rf"GiB for the replay .*does not fit .*lower {setting}"):
        model.learn(5_000)
    assert model.replay_buffer is None and model.num_timesteps == 0 and model._last_obs is None


@pytest.mark.parametrize("agent", list(AGENTS))
def test_a_replay_over_half_the_memory_warns_and_runs(agent, monkeypatch):
    model = build(agent)
    needed = {}
    real = replay_module.check_replay_memory

    def spy(need, held, setting, name):
        needed["bytes"] = need
        return real(need, held, setting, name)

    monkeypatch.setattr(replay_module, "check_replay_memory", spy)
    monkeypatch.setattr("sb3_worldmodels.common.base.check_replay_memory", spy)
    model.learn(40)
    assert needed["bytes"] >= model.replay_buffer.nbytes > 0
    monkeypatch.setattr(replay_module, "available_memory", lambda: int(needed["bytes"] * 1.5))
    fresh = build(agent)
    with pytest.warns(UserWarning, match="more than half"):
        fresh.learn(40)
    assert np.isfinite(fresh.num_timesteps)

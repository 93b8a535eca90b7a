"""What a run split by save/load reproduces, and the warning when it cannot.

Exact equality with the uninterrupted run (``test_*_sb3::test_split_run_equals_whole_run``) needs the
split at an episode boundary, the replay buffer saved and reloaded, and ``reset_num_timesteps=False``.
Continuing without the replay, or from a mid-episode checkpoint (SB3's load resets the envs), warns.
"""

from __future__ import annotations

import warnings

import pytest
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE
from tests.probe_envs import ChainEnv

AGENTS = {
    # agent: (class, settings, steps that end at an episode boundary, steps that end mid-episode)
    "dreamerv3": (DreamerV3, {**DREAMER_SMOKE, "seed": 0}, 33, 37),
    "tdmpc2": (TDMPC2, {**TDMPC2_SMOKE, "seed": 0, "seed_steps": 10}, 30, 35),
}


def chain():
    return make_vec_env(lambda: TimeLimit(ChainEnv(), 10), n_envs=1)


def saved_after(agent: str, steps: int, folder):
    cls, settings, _, _ = AGENTS[agent]
    model = cls(chain(), **settings)
    model.learn(steps)
    model.save(folder / "model.zip")
    model.save_replay_buffer(folder / "replay.pkl")
    return cls


@pytest.mark.parametrize("agent", list(AGENTS))
def test_a_resume_with_everything_it_needs_is_silent(agent, tmp_path):
    cls = saved_after(agent, AGENTS[agent][2], tmp_path)
    model = cls.load(tmp_path / "model.zip", env=chain())
    model.load_replay_buffer(tmp_path / "replay.pkl")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Continuing a loaded")
        model.learn(10, reset_num_timesteps=False)


@pytest.mark.parametrize("agent", list(AGENTS))
def test_a_resume_without_the_replay_warns(agent, tmp_path):
    cls = saved_after(agent, AGENTS[agent][2], tmp_path)
    model = cls.load(tmp_path / "model.zip", env=chain())
    with pytest.warns(UserWarning, match="replay buffer was not loaded.*load_replay_buffer"):
        model.learn(10, reset_num_timesteps=False)
    with warnings.catch_warnings():  # said once, at the first learn() after load
        warnings.filterwarnings("error", message="Continuing a loaded")
        model.learn(10, reset_num_timesteps=False)


@pytest.mark.parametrize("agent", list(AGENTS))
def test_a_resume_from_mid_episode_warns(agent, tmp_path):
    cls = saved_after(agent, AGENTS[agent][3], tmp_path)
    model = cls.load(tmp_path / "model.zip", env=chain())
    model.load_replay_buffer(tmp_path / "replay.pkl")
    assert not model.at_episode_boundary
    with pytest.warns(UserWarning, match="saved mid-episode"):
        model.learn(10, reset_num_timesteps=False)

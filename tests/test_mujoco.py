"""Gymnasium MuJoCo v5: DreamerV3 takes the terminations; TD-MPC2 asks for ``episodic=True``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMERV3_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE

TINY_TDMPC2 = dict(
    **TDMPC2_SMOKE, seed=0,
)  # fmt: skip
TINY_DREAMERV3 = dict(
    **DREAMERV3_SMOKE, seed=0,
)  # fmt: skip


def test_tdmpc2_refuses_hopper_terminations_without_episodic():
    # Random seed-phase actions make Hopper fall within a few hundred steps; no compilation needed.
    model = TDMPC2("Hopper-v5", seed_steps=1000, **TINY_TDMPC2)
    assert model.agent_episode_length == 1000
    with pytest.raises(ValueError, match="episodic=True"):
        model.learn(1000)
    assert model.num_timesteps < 1000


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["Hopper-v5", "Walker2d-v5", "HalfCheetah-v5"])
def test_both_agents_run_the_mujoco_tasks(env_id):
    # TD-MPC2 replays finished episodes only: 100-step episodes, so that 300 steps end some of them.
    env = gym.make(env_id, max_episode_steps=100)
    tdmpc2 = TDMPC2("MlpPolicy", env, episodic=True, seed_steps=60, **TINY_TDMPC2)
    tdmpc2.learn(300)
    assert tdmpc2._n_updates > 0
    dreamer = DreamerV3(env_id, n_envs=2, **TINY_DREAMERV3)
    dreamer.learn(300)
    assert dreamer._n_updates > 0 and len(dreamer.ep_info_buffer) >= (1 if env_id != "HalfCheetah-v5" else 0)
    obs = dreamer.env.reset()
    action, _ = dreamer.predict(obs, episode_start=np.ones(2, bool), deterministic=True)
    assert dreamer.action_space.contains(action[0])

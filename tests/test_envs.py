"""Env helpers: action repeat, dict flattening, dm_control task names and the paper protocol env."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from sb3_worldmodels import TDMPC2, ActionRepeat, FlattenDictObservation, make_dmc_env
from sb3_worldmodels.common.boundary import ObservationAdapter
from sb3_worldmodels.envs.dmc import dmc_env_id
from tests.probe_envs import ChainEnv, DictObsEnv


class CountingEnv(gym.Env):
    """Reward = index of the simulator step (1, 2, 3, ...); truncates after ``length`` steps."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, length: int) -> None:
        self.length, self.t = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(1, self.t, np.float32), float(self.t), False, self.t >= self.length, {"t": self.t}


def test_action_repeat_sums_rewards_and_stops_at_the_episode_end():
    env = ActionRepeat(CountingEnv(length=7), repeat=3)
    env.reset()
    obs, reward, terminated, truncated, info = env.step(np.zeros(1))
    assert reward == 1 + 2 + 3 and obs[0] == 3 and info["t"] == 3 and not truncated
    env.step(np.zeros(1))
    obs, reward, terminated, truncated, info = env.step(np.zeros(1))
    assert reward == 7 and truncated and info["t"] == 7  # stopped after one inner step
    with pytest.raises(ValueError, match="action_repeat must be >= 1"):
        ActionRepeat(CountingEnv(3), 0)


def test_flatten_dict_observation_matches_the_agents_own_order():
    env = DictObsEnv()
    flat = FlattenDictObservation(env)
    obs, _ = flat.reset(seed=0)
    for _ in range(3):
        obs, *_ = flat.step(flat.action_space.sample())
    raw = env._obs()
    adapter = ObservationAdapter.from_space(env.observation_space, "test")
    batched = {k: np.asarray(v)[None] for k, v in raw.items()}
    np.testing.assert_array_equal(obs, adapter.convert(batched)[0])
    assert obs.dtype == np.float32 and flat.observation_space.shape == (adapter.dim,)
    with pytest.raises(ValueError, match="Dict of Box"):
        FlattenDictObservation(ChainEnv())


@pytest.mark.parametrize(
    "name, env_id",
    [
        ("walker-walk", "dm_control/walker-walk-v0"),
        ("walker_walk", "dm_control/walker-walk-v0"),
        ("cup-catch", "dm_control/ball_in_cup-catch-v0"),
        ("ball_in_cup_catch", "dm_control/ball_in_cup-catch-v0"),
        ("cartpole-balance-sparse", "dm_control/cartpole-balance_sparse-v0"),
        ("finger-turn_hard", "dm_control/finger-turn_hard-v0"),
        ("dm_control/cheetah-run-v0", "dm_control/cheetah-run-v0"),
    ],
)
def test_dmc_task_names_in_every_papers_spelling(name, env_id):
    assert dmc_env_id(name) == env_id


def test_unknown_dmc_task_lists_the_known_ones():
    with pytest.raises(ValueError, match="known tasks: .*walker-walk"):
        dmc_env_id("walker-fly")


def test_make_dmc_env_is_the_paper_protocol():
    env = make_dmc_env("cartpole-balance", action_repeat=2, seed=0)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs.shape == (5,)
    steps, total = 0, 0.0
    while True:
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        steps, total = steps + 1, total + reward
        if terminated or truncated:
            break
    assert steps == 500 and truncated and not terminated  # 1,000 simulator steps
    assert 0.0 < total <= 1000.0  # per-step rewards in [0, 1], two per agent step


def test_agents_take_dm_control_ids_without_importing_shimmy():
    model = TDMPC2("dm_control/cartpole-balance-v0", model_size=1, action_repeat=2, seed=0)
    assert model.agent_episode_length == 500 and model.discount == pytest.approx(0.99)
    assert model.env.observation_space["position"].shape == (3,)
    assert model.env.get_attr("repeat")[0] == 2


# ------------------------------------------------------------------------------------------- pixels
def test_dmc_pixels_are_the_papers_images():
    """64 x 64 RGB uint8 from camera 0, rendered after the repeated steps; the same seed gives the
    same images."""
    env = make_dmc_env("cartpole-balance", pixels=True, seed=0)
    assert env.observation_space == gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    first, _ = env.reset(seed=3)
    assert first.shape == (64, 64, 3) and first.dtype == np.uint8 and first.std() > 5
    frames = [env.step(np.ones(1, np.float32))[0] for _ in range(5)]
    assert all(env.observation_space.contains(f) for f in frames)
    assert np.abs(frames[-1].astype(int) - first).sum() > 0  # the cart moved
    physics = env.unwrapped._env.physics
    np.testing.assert_array_equal(frames[-1], physics.render(64, 64, camera_id=0))
    again = make_dmc_env("cartpole-balance", pixels=True).reset(seed=3)[0]
    np.testing.assert_array_equal(again, first)
    assert make_dmc_env("quadruped-walk", pixels=True).get_wrapper_attr("camera") == 2


def test_dmc_frame_stack_repeats_the_reset_frame_then_shifts():
    env = make_dmc_env("cartpole-balance", pixels=True, frame_stack=3, size=32)
    assert env.observation_space.shape == (32, 32, 9)
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs[..., 0:3], obs[..., 6:9])
    np.testing.assert_array_equal(obs[..., 3:6], obs[..., 6:9])
    nxt = env.step(np.ones(1, np.float32))[0]
    np.testing.assert_array_equal(nxt[..., 0:6], obs[..., 3:9])  # the oldest frame left
    assert not np.array_equal(nxt[..., 6:9], obs[..., 6:9])


def _run_fresh(code: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY")}
    return subprocess.run(
        [sys.executable, "-c", code], env={**env, **env_vars}, capture_output=True, text=True, timeout=300
    )


def test_headless_rendering_is_chosen_without_a_display_and_a_missing_renderer_says_how():
    code = (
        "from sb3_worldmodels import make_dmc_env\n"
        "import os\n"
        "obs, _ = make_dmc_env('cartpole-balance', pixels=True).reset(seed=0)\n"
        "print(os.environ['MUJOCO_GL'], obs.shape, obs.dtype)\n"
    )
    ok = _run_fresh(code)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "egl (64, 64, 3) uint8" in ok.stdout
    broken = _run_fresh(code, MUJOCO_GL="glfw")  # GLFW needs a display: no renderer
    assert broken.returncode != 0
    assert "no usable renderer" in broken.stderr and "MUJOCO_GL=egl" in broken.stderr

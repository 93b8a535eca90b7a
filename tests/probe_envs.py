"""Small deterministic environments with known answers, for tests and probes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class ChainEnv(gym.Env):
    """Deterministic fixed-length episodes: obs = (t / length, 1), reward = -(a - target)^2.

    Reset always returns the same observation, so a run split at an episode boundary and resumed
    from a checkpoint sees exactly the observations of the uninterrupted run.
    """

    metadata: dict = {"render_modes": []}  # noqa: RUF012

    def __init__(self, length: int = 10, target: float = 0.5, discrete: bool = False) -> None:
        self.length = length
        self.target = target
        self.discrete = discrete
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = spaces.Discrete(2) if discrete else spaces.Box(-2.0, 2.0, (1,), np.float32)
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t / self.length, 1.0], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        if self.discrete:
            reward = float(int(action) == 1)
        else:
            reward = -float((np.asarray(action).reshape(-1)[0] - self.target) ** 2)
        return self._obs(), reward, False, self.t >= self.length, {}


class BanditEnv(gym.Env):
    """One-step episodes: action 1 pays 1, action 0 pays 0 (terminates after one step)."""

    def __init__(self, discrete: bool = True) -> None:
        self.discrete = discrete
        self.observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Discrete(2) if discrete else spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        if self.discrete:
            reward = float(int(action) == 1)
        else:
            reward = float(np.asarray(action).reshape(-1)[0])
        return np.zeros(1, np.float32), reward, True, False, {}


class ColourEnv(gym.Env):
    """Pixel observations with a known answer: the image is red or green (drawn at random each step);
    action 0 pays 1 on red, action 1 pays 1 on green, anything else 0. Episodes last ``length`` steps.

    ``layout``: "hwc" (Gymnasium's channel-last), "chw" (channel-first) or "hw" (2-D grayscale, where
    the two colours are dark and bright); ``dtype``: uint8 or float32 pixels in [0, 255]; ``vector``:
    a Dict observation {"image", "vector"}, the vector a constant (1, 0).
    """

    metadata: dict = {"render_modes": []}  # noqa: RUF012

    def __init__(
        self, size: int = 16, layout: str = "hwc", dtype=np.uint8, vector: bool = False, length: int = 10
    ) -> None:
        self.size, self.layout, self.dtype, self.vector, self.length = size, layout, dtype, vector, length
        shape = {"hwc": (size, size, 3), "chw": (3, size, size), "hw": (size, size)}[layout]
        image = spaces.Box(0, 255, shape, dtype)
        self.observation_space = (
            spaces.Dict({"image": image, "vector": spaces.Box(-1.0, 1.0, (2,), np.float32)})
            if vector
            else image
        )
        self.action_space = spaces.Discrete(2)
        self.t, self.colour = 0, 0

    def _obs(self):
        if self.layout == "hw":
            image = np.full((self.size, self.size), 60 + 150 * self.colour)
        else:
            image = np.zeros((self.size, self.size, 3))
            image[..., self.colour] = 255
            if self.layout == "chw":
                image = np.moveaxis(image, -1, 0)
        image = image.astype(self.dtype)
        return {"image": image, "vector": np.array([1.0, 0.0], np.float32)} if self.vector else image

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.colour = 0, int(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.colour)
        self.t += 1
        self.colour = int(self.np_random.integers(2))
        return self._obs(), reward, False, self.t >= self.length, {}


class NaNEnv(ChainEnv):
    """Returns a NaN observation after a few steps."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.t >= 3:
            obs = obs.copy()
            obs[0] = np.nan
        return obs, reward, terminated, truncated, info


class DictObsEnv(ChainEnv):
    """A dm_control-like dict observation with a scalar key and float64 values."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Dict(
            {
                "position": spaces.Box(-np.inf, np.inf, (2,), np.float64),
                "height": spaces.Box(-np.inf, np.inf, (), np.float64),
            }
        )

    def _obs(self):
        return {"position": np.array([self.t / self.length, 1.0]), "height": np.array(0.5 * self.t)}


class DiscountProbeEnv(gym.Env):
    """Reward 1 on every step, termination after ``length`` steps; obs = (steps left / length, 1).

    With discount gamma the value of the first state is sum_{k < length} gamma^k.
    """

    def __init__(self, length: int = 4) -> None:
        self.length = length
        self.observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([(self.length - self.t) / self.length, 1.0], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= self.length, False, {}


class DelayedChoiceEnv(gym.Env):
    """Two steps: the first action picks a branch and pays nothing; the second step pays 1 on
    branch 1 and 0.3 on branch 0, then terminates. The first choice's value exists only through the
    model's prediction of the next step, i.e. in imagination."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0.0, 1.0, (3,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t, self.branch = 0, 0

    def _obs(self) -> np.ndarray:
        return np.array(
            [self.t == 0, self.t == 1 and self.branch == 1, self.t == 1 and self.branch == 0], np.float32
        )

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.branch = 0, 0
        return self._obs(), {}

    def step(self, action):
        if self.t == 0:
            self.branch = int(action)
            self.t = 1
            return self._obs(), 0.0, False, False, {}
        self.t = 2
        return self._obs(), 1.0 if self.branch == 1 else 0.3, True, False, {}


class ScriptedEpisodesEnv(gym.Env):
    """Episodes that say who they are: obs = (episode index k, step t), the step into obs t pays
    10·k + t. Episode k lasts 2 + k % 3 steps and ends by termination when k is even, by truncation
    when k is odd (for checking how episodes are recorded)."""

    observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.k, self.t = -1, 0

    @staticmethod
    def length(k: int) -> int:
        return 2 + k % 3

    def _obs(self) -> np.ndarray:
        return np.array([self.k, self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k, self.t = self.k + 1, 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length(self.k)
        even = self.k % 2 == 0
        return self._obs(), float(10 * self.k + self.t), end and even, end and not even, {}


class DriverScriptEnv(gym.Env):
    """Env ``index`` of a 2-env scripted run with exactly two episodes per env, of known lengths:
    obs = (index, step t, episode k); the step into obs t of episode k pays 100·index + 10·k + t + 0.5;
    ``EPISODES[index][k]`` = (steps, ends by termination). Recorded from the reference's own driver
    (tests/fixtures/dreamerv3/driver_*, see README there); ``action_for`` is the scripted policy."""

    EPISODES = {0: ((5, True), (13, False)), 1: ((10, False), (8, True))}  # noqa: RUF012
    observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, index: int) -> None:
        self.index, self.k, self.t = index, -1, 0

    @staticmethod
    def reward(index: int, k: int, t: int) -> float:
        return float(100 * index + 10 * k + t) + 0.5

    @staticmethod
    def action_for(index: int, t: int, k: int) -> int:
        return (index + t + k) % 2

    def _obs(self) -> np.ndarray:
        return np.array([self.index, self.t, self.k], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k, self.t = self.k + 1, 0  # a third reset (SB3's autoreset after the end) is never stepped
        return self._obs(), {}

    def step(self, action):
        steps, terminates = self.EPISODES[self.index][self.k]
        self.t += 1
        end = self.t >= steps
        reward = self.reward(self.index, self.k, self.t)
        return self._obs(), reward, end and terminates, end and not terminates, {}

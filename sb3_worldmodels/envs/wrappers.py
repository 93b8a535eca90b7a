"""Gymnasium wrappers for any env: action repeat, Dict flattening, frame stacking, and the episode
length in agent steps read from a wrapper chain."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class ActionRepeat(gym.Wrapper):
    """Repeat each action ``repeat`` times, summing the rewards; stop early when the episode ends.

    One agent step is ``repeat`` simulator steps (the papers' DeepMind Control protocol uses 2). The
    last inner step's observation, flags and info are returned.
    """

    def __init__(self, env: gym.Env, repeat: int) -> None:
        super().__init__(env)
        if int(repeat) < 1:
            raise ValueError(f"action_repeat must be >= 1, got {repeat}.")
        self.repeat = int(repeat)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        total = 0.0
        for _ in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


def agent_steps_per_episode(env: gym.Env) -> int | None:
    """The most agent steps an episode of ``env`` can have, where the env says so; else None.

    Read from the outermost time limit found walking the wrapper chain inwards: a ``TimeLimit``
    (``gym.make`` adds one from the spec's ``max_episode_steps``), else dm_control's own step limit
    (shimmy's dm_control envs have no ``max_episode_steps``: the simulator ends the episode after
    its time limit over the control timestep, 1,000 steps in the suite). The limit is divided by the
    repeat of every :class:`ActionRepeat` wrapped around it (integer division, as the papers'
    ``episode_length``: 1,000 simulator steps at repeat 2 are 500 agent steps).
    """
    repeat, current = 1, env
    while True:
        if isinstance(current, ActionRepeat):
            repeat *= current.repeat
        if isinstance(current, gym.wrappers.TimeLimit):
            return max(1, int(current._max_episode_steps) // repeat)
        if not isinstance(current, gym.Wrapper):
            break
        current = current.env
    spec_limit = getattr(getattr(current, "spec", None), "max_episode_steps", None)
    if spec_limit:
        return max(1, int(spec_limit) // repeat)
    step_limit = getattr(getattr(current, "_env", None), "_step_limit", None)  # dm_control.rl.control
    if isinstance(step_limit, (int, float)) and np.isfinite(step_limit) and step_limit > 0:
        return max(1, int(step_limit) // repeat)
    return None


class FlattenDictObservation(gym.ObservationWrapper):
    """Concatenate a Dict of Box observations into one float32 vector, in the Dict's key order.

    The same order the agents' own observation adapter uses, so a model trained on the Dict env
    and one trained on the flattened env see identical vectors.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Dict) or not all(
            isinstance(s, gym.spaces.Box) for s in space.spaces.values()
        ):
            raise ValueError(f"FlattenDictObservation needs a Dict of Box spaces, got {space}.")
        self._keys = list(space.spaces)
        width = sum(int(np.prod(space.spaces[k].shape)) for k in self._keys)  # type: ignore[arg-type, misc]
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (width,), np.float32)

    def observation(self, observation: dict) -> np.ndarray:
        return np.concatenate([np.asarray(observation[k], np.float32).reshape(-1) for k in self._keys])


class StackFrames(gym.ObservationWrapper):
    """The last ``frames`` images concatenated along the channel axis: (H, W, C) → (H, W, frames·C),
    oldest first; after a reset the first image fills every slot (tdmpc2/envs/dmcontrol.py:67-92
    @eece801, which stacks channel-first)."""

    def __init__(self, env: gym.Env, frames: int) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 3:
            raise ValueError(f"StackFrames needs (H, W, C) image observations, got {space}.")
        if int(frames) < 1:
            raise ValueError(f"frames must be at least 1, got {frames}.")
        self.frames = int(frames)
        h, w, c = space.shape
        self.observation_space = gym.spaces.Box(0, 255, (h, w, c * self.frames), space.dtype)
        self._stack: list[np.ndarray] = []

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict]:
        obs, info = self.env.reset(**kwargs)
        self._stack = [obs] * self.frames
        return np.concatenate(self._stack, -1), info

    def observation(self, observation: np.ndarray) -> np.ndarray:
        self._stack = [*self._stack[1:], observation]
        return np.concatenate(self._stack, -1)

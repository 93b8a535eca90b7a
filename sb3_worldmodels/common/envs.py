"""Environment helpers: building SB3 VecEnvs from ids and from Gymnasium vector envs."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv


def _monitored(make):
    return lambda: Monitor(make())


def vec_env_from_gymnasium(env: gym.vector.VectorEnv) -> VecEnv:
    """An SB3 VecEnv with the same sub-environments as a Gymnasium ``VectorEnv``.

    SB3 VecEnvs reset an env in the step that ends its episode (the final observation goes to
    ``info["terminal_observation"]``); Gymnasium's default vector envs reset one step later. Rather
    than translating between the two, the sub-environments are re-hosted:
    ``SyncVectorEnv`` -> ``DummyVecEnv`` over its env objects, ``AsyncVectorEnv`` -> ``SubprocVecEnv``
    over its env functions, and a natively vectorised env (e.g. ``gym.make_vec("CartPole-v1")``) is
    rebuilt from its registered id. Each sub-env gets SB3's ``Monitor``.
    """
    n = env.num_envs
    if isinstance(env, gym.vector.SyncVectorEnv):
        return DummyVecEnv([(lambda e=e: Monitor(e)) for e in env.envs])
    if isinstance(env, gym.vector.AsyncVectorEnv):
        fns = list(env.env_fns)
        env.close()
        return SubprocVecEnv([_monitored(fn) for fn in fns])
    spec: Any = getattr(env, "spec", None)
    if spec is not None and getattr(spec, "id", None):
        vector_only = ("num_envs", "vectorization_mode", "vector_kwargs", "wrappers")
        kwargs = {k: v for k, v in (getattr(spec, "kwargs", {}) or {}).items() if k not in vector_only}
        env.close()
        return make_vec_env(spec.id, n_envs=n, env_kwargs=kwargs)
    raise ValueError(
        f"Cannot convert {type(env).__name__} to an SB3 VecEnv: pass the env id, a gymnasium.Env, an SB3 "
        "VecEnv, or a SyncVectorEnv/AsyncVectorEnv."
    )


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

"""SB3 VecEnvs from Gymnasium vector envs, and a VecEnv's episode length in agent steps."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecEnvWrapper

from sb3_worldmodels.envs.wrappers import agent_steps_per_episode


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
        return DummyVecEnv([(lambda e=e: Monitor(e)) for e in env.envs])  # type: ignore[misc]
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


def vec_agent_steps_per_episode(venv: VecEnv) -> int | None:
    """:func:`agent_steps_per_episode` of a VecEnv's first env (in-process VecEnvs; for others only
    the spec's ``max_episode_steps`` is known, without the action repeat)."""
    inner: Any = venv
    while isinstance(inner, VecEnvWrapper):
        inner = inner.venv
    if isinstance(inner, DummyVecEnv):
        return agent_steps_per_episode(inner.envs[0])
    spec = venv.get_attr("spec", [0])[0]
    limit = getattr(spec, "max_episode_steps", None)
    return int(limit) if limit else None

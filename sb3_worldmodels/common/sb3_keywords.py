"""SB3's constructor keywords: the ones the agents take under their own names, the ones they refuse
(with the reason), and the ``policy``/``env`` arguments in every form SB3 accepts them."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import Any

import gymnasium as gym
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.her.her_replay_buffer import HerReplayBuffer

from sb3_worldmodels.common.vec_env import vec_env_from_gymnasium
from sb3_worldmodels.envs.registration import register_namespace
from sb3_worldmodels.envs.wrappers import ActionRepeat

POLICY_NAMES = ("MlpPolicy", "MultiInputPolicy", "CnnPolicy")

# SB3 keywords (off-policy algorithms and their subclasses) that no world-model agent has, and why.
FOREIGN_KEYWORDS = {
    "train_freq": "it decides when to update itself ({cadence})",
    "gradient_steps": "it decides how many updates to run ({cadence})",
    "n_steps": "its returns are its own (TD(lambda) or planning), not SB3's n-step returns",
    "target_update_interval": "it is DQN's; the agent has no hard target-network copy",
    "exploration_fraction": "it is DQN's epsilon-greedy schedule; the agent explores with its own policy",
    "exploration_initial_eps": "it is DQN's epsilon-greedy schedule; the agent explores with its own policy",
    "exploration_final_eps": "it is DQN's epsilon-greedy schedule; the agent explores with its own policy",
    "max_grad_norm": "gradient clipping is the agent's own ({clip})",
    "ent_coef": "it is SAC's; the agent's entropy bonus is {entropy}",
    "target_entropy": "it is SAC's; the agent's entropy bonus is {entropy}",
    "policy_delay": "it is TD3's; the agent updates its actor at every update",
    "target_policy_noise": "it is TD3's; the agent has no target policy smoothing",
    "target_noise_clip": "it is TD3's; the agent has no target policy smoothing",
    "sde_sample_freq": "gSDE is not supported",
    "use_sde_at_warmup": "gSDE is not supported",
}
# SB3 keywords every agent accepts (and checks in refuse_unsupported_options).
ACCEPTED_KEYWORDS = frozenset(
    {
        "allow_vecnormalize_obs",
        "data_parallel",
        "replay_on_device",
        "action_noise",
        "replay_buffer_class",
        "replay_buffer_kwargs",
        "optimize_memory_usage",
        "use_sde",
    }
)


def take_sb3_alias(
    given: dict[str, Any],
    sb3_name: str,
    own_name: str,
    own_value: Any,
    own_default: Any,
    convert: Callable[[Any], Any] | None = None,
) -> Any:
    """Pop SB3's keyword ``sb3_name`` from ``given`` and return it (converted) as the agent's
    ``own_name``; ``own_value`` when absent. Both given: ValueError."""
    if sb3_name not in given:
        return own_value
    value = given.pop(sb3_name)
    if own_value != own_default:
        raise ValueError(
            f"Pass either {sb3_name}={value!r} (SB3's name) or {own_name}={own_value!r}, not both: "
            f"they are the same setting here."
        )
    return convert(value) if convert is not None else value


def refuse_foreign_keywords(agent: type, given: dict[str, Any], hints: dict[str, str]) -> None:
    """ValueError for an SB3 keyword the agent has no use for (saying why), TypeError for an unknown one
    (with the closest of the agent's own argument names)."""
    own = [name for name in inspect.signature(agent).parameters if not name.startswith("_")]
    for key in given:
        if key in FOREIGN_KEYWORDS:
            reason = FOREIGN_KEYWORDS[key].format(**hints)
            raise ValueError(f"{agent.__name__} does not take {key}: {reason}.")
        if key not in ACCEPTED_KEYWORDS:
            close = difflib.get_close_matches(key, [*ACCEPTED_KEYWORDS, *own], n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{agent.__name__} got an unexpected keyword argument {key!r}.{hint}")


def refuse_unsupported_options(
    agent_name: str,
    *,
    n_envs: Any,
    action_repeat: Any,
    action_noise: Any,
    use_sde: bool,
    optimize_memory_usage: bool,
    replay_buffer_class: Any,
    replay_buffer_kwargs: dict | None,
) -> None:
    """ValueError for a value of SB3's keywords that the agents cannot honour, naming the reason."""
    if n_envs is not None and (isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1):
        raise ValueError(f"n_envs must be a positive integer (or None for the default), got {n_envs!r}.")
    if isinstance(action_repeat, bool) or not isinstance(action_repeat, int) or action_repeat < 1:
        raise ValueError(f"action_repeat must be an integer >= 1 (1: no repeat), got {action_repeat!r}.")
    if action_noise is not None:
        raise ValueError(f"{agent_name} explores with its own policy: action_noise is not supported.")
    if use_sde:
        raise ValueError(f"{agent_name} does not support use_sde (gSDE).")
    if optimize_memory_usage:
        raise ValueError(
            f"{agent_name} keeps its own sequence replay: optimize_memory_usage is not supported."
        )
    if replay_buffer_class is not None and issubclass(replay_buffer_class, HerReplayBuffer):
        raise ValueError(f"{agent_name} does not support HerReplayBuffer.")
    if replay_buffer_class is not None:
        raise ValueError(f"{agent_name} uses its own sequence replay; replay_buffer_class must be None.")
    if replay_buffer_kwargs:
        raise ValueError(
            f"{agent_name} uses its own sequence replay: replay_buffer_kwargs has no meaning here."
        )


def is_env_id(value: Any) -> bool:
    """Whether ``value`` names a registered Gymnasium env (a family's ids are registered on demand)."""
    if not isinstance(value, str):
        return False
    if value in POLICY_NAMES:
        return False
    register_namespace(value)
    return value in gym.registry or ":" in value


def unknown_name_message(name: str, policies: dict) -> str:
    """The error for a string that is neither a registered env id nor a policy name, with a guess."""
    known = [*policies, *gym.registry]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    kinds = f"nor a policy name ({', '.join(policies)})" if policies else "(gym.registry)"
    return (
        f"{name!r} is neither a registered Gymnasium env id {kinds}.{hint} Pass an env id such as "
        "'Pendulum-v1', a gymnasium.Env or an SB3 VecEnv (dm_control ids need shimmy)."
    )


def policy_and_env(policy: Any, env: Any, policy_aliases: dict[str, Any]) -> tuple[Any, Any]:
    """SB3's ``(policy, env)`` arguments, where ``Algo(env)`` (an env or env id as the first argument,
    no env) means ``Algo("MlpPolicy", env)``; an unknown policy name is refused."""
    if env is None and (isinstance(policy, (gym.Env, VecEnv, gym.vector.VectorEnv)) or is_env_id(policy)):
        policy, env = "MlpPolicy", policy
    if isinstance(policy, str) and policy not in policy_aliases:
        raise ValueError(unknown_name_message(policy, policy_aliases))
    return policy, env


def make_env(env: Any, n_envs: int, seed: int | None, action_repeat: int) -> Any:
    """``env`` as SB3 takes it: an env id becomes ``n_envs`` Monitor-wrapped copies (wrapped in
    :class:`ActionRepeat` when ``action_repeat`` > 1), a Gymnasium VectorEnv an SB3 VecEnv; others
    are returned as given."""
    if isinstance(env, gym.vector.VectorEnv):
        return vec_env_from_gymnasium(env)
    if not isinstance(env, str):
        return env
    if not (is_env_id(env) or env in gym.registry):
        raise ValueError(unknown_name_message(env, {}))
    return make_vec_env(
        env,
        n_envs=n_envs,
        seed=seed,
        wrapper_class=ActionRepeat if action_repeat > 1 else None,  # type: ignore[arg-type]
        wrapper_kwargs={"repeat": action_repeat} if action_repeat > 1 else None,
    )

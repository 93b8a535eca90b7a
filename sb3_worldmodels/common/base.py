"""The SB3 shell shared by the world-model agents.

``WorldModelAlgorithm`` subclasses SB3's ``OffPolicyAlgorithm`` so that the logger, callbacks,
Monitor statistics, ``set_env``/``get_env``, the zip format and ``Algo.load`` are SB3's own. A
subclass provides the agent: its configuration, its state pytree (held by :class:`JaxPolicy`), one
jitted acting step, the rows it writes to replay, and one jitted training call.

Collection is overridden (SB3's does not carry a recurrent state per env): every vector step calls
the agent once for all envs with the episode starts, keeps SB3's callback calls in order, and keeps
the local names callbacks read (``actions``, ``new_obs``, ``rewards``, ``dones``, ``infos``).
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import re
import tempfile
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import jax
import numpy as np
import stable_baselines3 as sb3
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.save_util import load_from_pkl
from stable_baselines3.common.type_aliases import RolloutReturn, TrainFreq, TrainFrequencyUnit
from stable_baselines3.common.utils import (
    check_for_correct_spaces,
    get_system_info,
    should_collect_more_steps,
)
from stable_baselines3.common.vec_env import VecEnv, unwrap_vec_normalize
from stable_baselines3.her.her_replay_buffer import HerReplayBuffer

from sb3_worldmodels.blocks.random import fold_in_rows
from sb3_worldmodels.common import safe_io
from sb3_worldmodels.common.boundary import (
    ActionAdapter,
    AgentObservation,
    ObservationAdapter,
    check_finite_arrays,
    check_rewards,
    observation_rows,
)
from sb3_worldmodels.common.callbacks import WorldModelCallback
from sb3_worldmodels.common.policy import JaxPolicy
from sb3_worldmodels.common.replay import check_replay_memory
from sb3_worldmodels.common.replay_state import replay_from_state
from sb3_worldmodels.common.vec_env import vec_env_from_gymnasium
from sb3_worldmodels.envs.registration import register_namespace
from sb3_worldmodels.envs.wrappers import ActionRepeat

DETERMINISTIC_PREDICT_SEED = 0  # the base key of deterministic predicts (folded with each row's inputs)
FORMAT_VERSION = 2  # 2: attributes as JSON (safe_io); 1: attributes pickled by SB3


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


def take_sb3_alias(
    given: dict[str, Any], sb3_name: str, own_name: str, own_value: Any, own_default: Any, convert=None
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
    accepted = {"allow_vecnormalize_obs", "action_noise", "replay_buffer_class", "replay_buffer_kwargs"}
    accepted |= {"optimize_memory_usage", "use_sde"}
    for key in given:
        if key in FOREIGN_KEYWORDS:
            reason = FOREIGN_KEYWORDS[key].format(**hints)
            raise ValueError(f"{agent.__name__} does not take {key}: {reason}.")
        if key not in accepted:
            close = difflib.get_close_matches(key, [*accepted, *own], n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{agent.__name__} got an unexpected keyword argument {key!r}.{hint}")


class NonFiniteUpdateError(FloatingPointError):
    """An update produced NaN or inf; the model keeps its parameters from before it."""


class NonFiniteActionError(FloatingPointError):
    """The agent produced a NaN or infinite action; it was neither sent to an env nor returned."""


STATE_FIX = "pass back the state that predict returned, or None (with episode_start) to start afresh."


def refuse_non_finite_actions(actions: np.ndarray, where: str) -> None:
    if not np.all(np.isfinite(actions)):
        raise NonFiniteActionError(
            f"The agent produced a non-finite action{where}; it was not sent to the env. Its parameters "
            "or carried state hold NaN or inf (e.g. set by set_parameters); load a good checkpoint."
        )


def _checkpoint_header(blob: bytes, what: str) -> dict[str, Any]:
    """The checkpoint's plain JSON entries (nothing is decoded or unpickled)."""
    try:
        raw = json.loads(blob.decode(errors="replace"))
    except ValueError as error:
        raise ValueError(f"{what}: its 'data' part is not valid JSON ({error}).") from error
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: its 'data' part is not a JSON object.")
    return raw


def _stored_policy_name(header: dict[str, Any]) -> str:
    """The policy class SB3 recorded, read from the readable fields beside its pickle."""
    entry = header.get("policy_class")
    module = entry.get("__module__") if isinstance(entry, dict) else None
    if isinstance(module, str):
        parts = module.split(".")
        named = len(parts) == 3 and parts[2] == "policies" and parts[1] != "common"
        algo = f"{parts[1].upper()}, " if named else ""
        return f"{algo}a policy class from {module}"
    return "no sb3_worldmodels algorithm name"


def _is_env_id(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    if value in ("MlpPolicy", "MultiInputPolicy", "CnnPolicy"):
        return False
    register_namespace(value)
    return value in gym.registry or ":" in value


def _unknown_name_message(name: str, policies: dict) -> str:
    """The error for a string that is neither a registered env id nor a policy name, with a guess."""
    known = [*policies, *gym.registry]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    kinds = f"nor a policy name ({', '.join(policies)})" if policies else "(gym.registry)"
    return (
        f"{name!r} is neither a registered Gymnasium env id {kinds}.{hint} Pass an env id such as "
        "'Pendulum-v1', a gymnasium.Env or an SB3 VecEnv (dm_control ids need shimmy)."
    )


def _walk_callbacks(callback: BaseCallback | None) -> Iterator[BaseCallback]:
    if callback is None:
        return
    yield callback
    if isinstance(callback, CallbackList):
        for child in callback.callbacks:
            yield from _walk_callbacks(child)
    for attr in ("callback", "callback_on_new_best", "callback_after_eval"):
        nested = getattr(callback, attr, None)
        if isinstance(nested, BaseCallback) and nested is not callback:
            yield from _walk_callbacks(nested)


def _write_atomically(path: str | os.PathLike, suffix: str, write: Callable[[str], None]) -> None:
    """Call ``write`` on a temporary file beside ``path`` (``suffix`` added when it has none), flush it
    to disk, then rename it into place: an interrupted save never leaves a truncated file behind.

    The file gets the permissions a plain ``open`` would give (0666 less the umask, as SB3's files).
    Temporary files left by a save that was killed (their writer's process is gone) are removed.
    """
    target = Path(path)
    if target.suffix == "":
        target = target.with_suffix(suffix)
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.{os.getpid()}."
    _remove_orphaned_temporaries(target.parent, suffix)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp" + suffix, dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        _fsync_directory(target.parent)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _remove_orphaned_temporaries(folder: Path, suffix: str) -> None:
    """Delete the ``.<name>.<pid>.<random>.tmp<suffix>`` files in ``folder`` whose writing process is
    gone, whatever file they were for (a CheckpointCallback's next save has another name)."""
    pattern = re.compile(r"^\..+\.(\d+)\.[A-Za-z0-9_]+\.tmp" + re.escape(suffix) + "$")
    for leftover in folder.glob(f".*.tmp{suffix}"):
        match = pattern.match(leftover.name)
        if match and not _process_alive(int(match.group(1))):
            leftover.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _fsync_directory(folder: Path) -> None:
    """Persist a rename on POSIX (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class WorldModelAlgorithm(OffPolicyAlgorithm):
    """Base class of the JAX world-model agents (see the module docstring)."""

    policy_aliases = {"MlpPolicy": JaxPolicy, "MultiInputPolicy": JaxPolicy, "CnnPolicy": JaxPolicy}  # noqa: RUF012
    policy: JaxPolicy
    replay_buffer: Any  # the agent's replay_class (SequenceReplay, EpisodeReplay) or None
    model_size: Any
    _rollout: Any  # the agent's per-env collection state (None: every env starts an episode)
    _last_obs: Any
    agent_name = "world model agent"
    allow_discrete = True
    allow_images = False
    default_n_envs = 1
    nan_allowed_metrics: tuple[str, ...] = ()  # metric prefixes that are NaN by design (not guarded)
    # What a subclass provides, as class attributes:
    core: Any
    """The agent's pure core module: ``init_state(config, key)`` and ``set_learning_rate(state, lr)``."""
    config_class: Any
    """The agent's frozen config dataclass; its fields (less the space-derived ones and
    ``learning_rate``) are constructor arguments and attributes of the same names."""
    preset: Callable[..., Any]
    """``preset(model_size, **fields)``: the validated config of a model size with overrides."""
    space_fields: tuple[str, ...] = ("obs_dim", "action_dim")
    """Config fields set from the spaces, not by the user."""
    extra_hyperparameters: tuple[str, ...] = ()
    """Constructor arguments stored as attributes that are not config fields."""
    replay_class: Any
    window_setting: str
    """The hyperparameter whose value + 1 is the replay's window length (its sampled rows)."""
    stateless_predict_consequence = "forgets its state between such calls"
    renamed_state_leaves: dict[str, str] = {}  # noqa: RUF012
    """Old -> new names of state leaves, so that checkpoints of earlier releases still load."""

    @classmethod
    def config_settings(cls) -> tuple[str, ...]:
        """The config fields the user sets, as constructor arguments and attributes (not the
        space-derived ones, nor ``learning_rate``: SB3's attribute, a float or a schedule)."""
        fields = cls.config_class.__dataclass_fields__
        return tuple(f for f in fields if f not in cls.space_fields and f != "learning_rate")

    @classmethod
    def hyperparameter_names(cls) -> tuple[str, ...]:
        """The agent's own constructor arguments stored as attributes: ``model_size``, the config
        settings and the extra hyperparameters."""
        return ("model_size", *cls.config_settings(), *cls.extra_hyperparameters)

    @classmethod
    def _hyperparameters(cls, arguments: dict[str, Any]) -> dict[str, Any]:
        """The hyperparameters among a constructor's ``locals()``."""
        return {name: arguments[name] for name in cls.hyperparameter_names() if name in arguments}

    def __init__(
        self,
        policy: Any,
        env: Any,
        hyperparameters: dict[str, Any],
        *,
        learning_rate: Any,
        buffer_size: int,
        learning_starts: int,
        batch_size: int,
        gamma: float,
        tau: float,
        n_envs: int | None = None,
        action_repeat: int = 1,
        policy_kwargs: dict | None = None,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: str = "auto",
        allow_vecnormalize_obs: bool = False,
        action_noise: Any = None,
        replay_buffer_class: Any = None,
        replay_buffer_kwargs: dict | None = None,
        optimize_memory_usage: bool = False,
        use_sde: bool = False,
        _init_setup_model: bool = True,
    ) -> None:
        if env is None and (
            isinstance(policy, (gym.Env, VecEnv, gym.vector.VectorEnv)) or _is_env_id(policy)
        ):
            policy, env = "MlpPolicy", policy
        if policy == "CnnPolicy" and not self.allow_images:
            raise ValueError(
                f"{self.agent_name} does not learn from images yet (CnnPolicy): use the env's state "
                "observation with 'MlpPolicy' (or 'MultiInputPolicy' for Dict observations), or DreamerV3."
            )
        if isinstance(policy, str) and policy not in self.policy_aliases:
            raise ValueError(_unknown_name_message(policy, self.policy_aliases))
        if n_envs is not None and (isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1):
            raise ValueError(f"n_envs must be a positive integer (or None for the default), got {n_envs!r}.")
        repeat = action_repeat
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            raise ValueError(f"action_repeat must be an integer >= 1 (1: no repeat), got {repeat!r}.")
        if action_noise is not None:
            raise ValueError(
                f"{self.agent_name} explores with its own policy: action_noise is not supported."
            )
        if use_sde:
            raise ValueError(f"{self.agent_name} does not support use_sde (gSDE).")
        if optimize_memory_usage:
            raise ValueError(
                f"{self.agent_name} keeps its own sequence replay: optimize_memory_usage is not supported."
            )
        if replay_buffer_class is not None and issubclass(replay_buffer_class, HerReplayBuffer):
            raise ValueError(f"{self.agent_name} does not support HerReplayBuffer.")
        if replay_buffer_class is not None:
            raise ValueError(
                f"{self.agent_name} uses its own sequence replay; replay_buffer_class must be None."
            )
        if replay_buffer_kwargs:
            raise ValueError(
                f"{self.agent_name} uses its own sequence replay: replay_buffer_kwargs has no meaning here."
            )
        if policy_kwargs:
            raise ValueError(
                f"{self.agent_name} does not take policy_kwargs ({sorted(policy_kwargs)}): its networks are "
                "sized by the constructor's own arguments (model_size and the width settings of the "
                "config), not by net_arch or activation_fn."
            )
        # The agent's hyperparameters (its config fields and model_size) are attributes, so that a
        # loaded model or rl_zoo3 can override them; the config is built from them.
        self.__dict__.update(hyperparameters)
        self.action_repeat = action_repeat
        self.allow_vecnormalize_obs = allow_vecnormalize_obs
        if isinstance(env, gym.vector.VectorEnv):
            env = vec_env_from_gymnasium(env)
        if isinstance(env, str):
            if _is_env_id(env) or env in gym.registry:
                env = make_vec_env(
                    env,
                    n_envs=n_envs or self.default_n_envs,
                    seed=seed,
                    wrapper_class=ActionRepeat if repeat > 1 else None,  # type: ignore[arg-type]
                    wrapper_kwargs={"repeat": repeat} if repeat > 1 else None,
                )
            else:
                raise ValueError(_unknown_name_message(env, {}))
        if isinstance(env, (gym.Env, VecEnv)):
            # Clear errors before SB3's own assertions on the spaces.
            ObservationAdapter.from_space(env.observation_space, self.agent_name, self.allow_images)
            ActionAdapter.from_space(env.action_space, self.agent_name, self.allow_discrete)
        if isinstance(policy, str) and policy in self.policy_aliases:
            policy = self.policy_aliases[policy]  # SB3 refuses the "MlpPolicy" string with Dict spaces
        self.format_version = FORMAT_VERSION
        self.algorithm_name = type(self).__name__
        super().__init__(
            policy=policy,
            env=env,
            learning_rate=learning_rate,
            buffer_size=buffer_size,
            learning_starts=learning_starts,
            batch_size=batch_size,
            tau=tau,
            gamma=gamma,
            train_freq=(1, "step"),
            gradient_steps=-1,
            action_noise=None,
            replay_buffer_class=None,
            replay_buffer_kwargs=replay_buffer_kwargs,
            optimize_memory_usage=False,
            policy_kwargs=policy_kwargs,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            verbose=verbose,
            device="cpu",
            support_multi_env=True,
            seed=seed,
            use_sde=False,
            sde_support=False,
            supported_action_spaces=(spaces.Box, spaces.Discrete) if self.allow_discrete else (spaces.Box,),
        )
        if self.env is not None:
            self._check_env(self.env)
        if _init_setup_model:
            self._setup_model()

    # ------------------------------------------------------------------ set-up
    def _check_env(self, env: VecEnv) -> None:
        vec_normalize = unwrap_vec_normalize(env)
        if vec_normalize is None:
            return
        if vec_normalize.norm_reward:
            raise ValueError(
                f"{self.agent_name} needs the raw rewards: VecNormalize(norm_reward=True) changes the reward "
                "the world model learns to predict and the returns it plans or imagines with (the agent "
                "scales returns itself). Use VecNormalize(norm_reward=False) or no VecNormalize."
            )
        if vec_normalize.norm_obs and not self.allow_vecnormalize_obs:
            raise ValueError(
                f"{self.agent_name} wants raw observations (it applies its own symlog / normalisation): "
                "VecNormalize(norm_obs=True) makes the model learn a moving target. Remove VecNormalize, or "
                "pass allow_vecnormalize_obs=True to train on the normalised observations anyway."
            )
        if vec_normalize.norm_obs:
            warnings.warn(
                "Training on VecNormalize-normalised observations (allow_vecnormalize_obs=True): the "
                "world model's targets drift while the statistics move.",
                stacklevel=3,
            )

    def set_env(self, env: Any, force_reset: bool = True) -> None:
        """SB3's ``set_env`` (same spaces and number of envs), with the agent's VecNormalize checks; the
        agent's per-env state restarts (every env begins a new episode)."""
        self._check_env(self._wrap_env(env, self.verbose) if not isinstance(env, VecEnv) else env)
        super().set_env(env, force_reset=force_reset)
        self._rollout = None

    def _setup_model(self) -> None:
        self._setup_lr_schedule()
        self.set_random_seed(self.seed)
        self.obs_adapter = ObservationAdapter.from_space(
            self.observation_space, self.agent_name, self.allow_images
        )
        self.action_adapter = ActionAdapter.from_space(
            self.action_space, self.agent_name, self.allow_discrete
        )
        self.policy = JaxPolicy(self.observation_space, self.action_space)
        self._resolve_config_defaults()
        self._config = self.config
        self.policy.state = self._build_state()
        self.policy.algorithm_predict = self.predict
        # SB3 code reads ``model.gamma`` (e.g. for n-step returns or logging): the agent's own discount.
        self.gamma = float(self._config.gamma)
        self._convert_train_freq()
        self._rollout = None
        self._predict_calls = 0
        self._stateless_predicts = 0
        self._wm_callbacks: list[WorldModelCallback] = []
        self._eval_callbacks: list[EvalCallback] = []
        self._resumed = False
        self._flat_obs: tuple[Any, AgentObservation] | None = None  # (an observation, it flattened)
        if not hasattr(self, "at_episode_boundary"):
            self.at_episode_boundary = True  # every env between episodes (saved with the model)

    def _resolve_config_defaults(self) -> None:
        """Fix hyperparameters whose default depends on the env (called before the config is built)."""

    @property
    def config(self) -> Any:
        """The resolved static configuration, built from the attributes (so that load/zoo overrides
        apply) and the spaces; fields without a constructor argument keep their defaults."""
        fields = {name: getattr(self, name) for name in self.config_settings() if hasattr(self, name)}
        return self.preset(self.model_size, **{**fields, **self._space_config()})

    def _space_config(self) -> dict[str, Any]:
        """The config fields that follow from the spaces (and any that the agent derives from them)."""
        return {"obs_dim": self.obs_adapter.dim, "action_dim": self.action_adapter.dim}

    def _build_state(self) -> dict[str, Any]:
        """The policy's state: the agent's state pytree (params, optimiser, statistics; the static
        config keeps the default rate, so that every rate shares one compilation, and the optimiser
        reads the actual rate from the state, set here and at every training call) and the acting
        and predict RNG keys."""
        key = jax.random.PRNGKey(0 if self.seed is None else int(self.seed))
        agent_key, act_key, predict_key = jax.random.split(key, 3)
        agent = self.core.init_state(self._config, agent_key)
        agent = self.core.set_learning_rate(agent, float(self.lr_schedule(1.0)))
        return {"agent": agent, "act_key": act_key, "predict_key": predict_key}

    def _excluded_save_params(self) -> list[str]:
        return [
            *super()._excluded_save_params(),
            "_config",
            "obs_adapter",
            "action_adapter",
            "_rollout",
            "_wm_callbacks",
            "_eval_callbacks",
            "_resumed",
            "_flat_obs",
        ]

    def _update_learning_rate(self, optimizers: Any) -> None:
        # The JAX optimiser reads the current rate from the state at every training call.
        self.logger.record("train/learning_rate", self.current_learning_rate)

    @property
    def current_learning_rate(self) -> float:
        return float(self.lr_schedule(self._current_progress_remaining))

    # ------------------------------------------------------------------ save / load
    def save(self, path: str | os.PathLike | Any, exclude=None, include=None) -> None:
        """SB3's zip layout with attributes as plain JSON and weights as tensors (no pickles, see
        :mod:`sb3_worldmodels.common.safe_io`), written atomically (a temporary file renamed into place).

        An attribute JSON cannot express (a callable learning rate, a custom object) is pickled as SB3
        does, with a warning: loading it then needs ``custom_objects`` or ``trust_pickled_code=True``.
        """
        members = self._checkpoint_members(exclude, include)
        if not isinstance(path, (str, os.PathLike)):
            safe_io.write_zip(path, members)
            return
        _write_atomically(path, ".zip", lambda tmp: safe_io.write_zip(tmp, members))

    def _checkpoint_members(self, exclude: Any, include: Any) -> dict[str, bytes]:
        excluded = set(exclude or ()).union(self._excluded_save_params(), ("lr_schedule", "policy_class"))
        excluded = excluded.difference(include or ())
        excluded.update(name.split(".")[0] for name in self._get_torch_save_params()[0])
        attributes = {key: value for key, value in self.__dict__.items() if key not in excluded}
        text, pickled = safe_io.encode_attributes(attributes)
        if pickled:
            warnings.warn(
                f"Saved {', '.join(pickled)} as pickled Python objects (not expressible as plain data): "
                f"load() will need custom_objects={{{', '.join(repr(k) + ': ...' for k in pickled)}}} "
                "or trust_pickled_code=True. A float learning rate or SB3's schedule classes "
                "(LinearSchedule, ConstantSchedule) are stored as plain data.",
                stacklevel=3,
            )
        return {
            "data": text.encode(),
            "pytorch_variables.pth": safe_io.tensors_to_bytes({}),
            "policy.pth": safe_io.tensors_to_bytes(self.policy.state_dict()),
            "_stable_baselines3_version": sb3.__version__.encode(),
            "system_info.txt": get_system_info(print_info=False)[1].encode(),
        }

    def save_replay_buffer(self, path: str | os.PathLike | Any) -> None:
        """The replay as arrays plus JSON metadata in one ``.npz`` archive (no pickles), written
        atomically; a path without a suffix gets SB3's ``.pkl``."""
        if self.replay_buffer is None:
            raise ValueError(
                "There is no replay buffer to save yet: it is created by the first learn() call."
            )
        arrays, meta = self.replay_buffer.export_state()
        if not isinstance(path, (str, os.PathLike)):
            safe_io.save_npz(path, arrays, meta)
            return

        def write(tmp: str) -> None:
            with open(tmp, "wb") as handle:
                safe_io.save_npz(handle, arrays, meta)

        _write_atomically(path, ".pkl", write)

    def load_replay_buffer(
        self, path: Any, truncate_last_traj: bool = True, trust_pickled_code: bool = False
    ) -> None:
        """Load a replay written by :meth:`save_replay_buffer`. A pickled replay (older files) loads
        only with ``trust_pickled_code=True``: unpickling runs code stored in the file. A refused or
        mismatched file leaves the current replay in place."""
        what = safe_io.describe(path, "the replay file")
        if safe_io.is_zip_file(path):
            arrays, meta = safe_io.load_npz(path, what)
            buffer = replay_from_state(arrays, meta, what)
        elif not trust_pickled_code:
            raise safe_io.UnsafeFileError(f"{what} is a pickled replay buffer. {safe_io.TRUST_HINT}")
        else:
            buffer = load_from_pkl(path, self.verbose)
        if not isinstance(buffer, ReplayBuffer):
            raise ValueError(f"{what} does not hold a replay buffer (found {type(buffer).__name__}).")
        self._check_replay_buffer(buffer)
        self.replay_buffer = buffer

    def _check_replay_buffer(self, buffer: Any) -> None:
        """Raise if ``buffer`` was not written by this agent with these spaces, sizes and n_envs."""
        if not isinstance(buffer, self.replay_class):
            raise ValueError(
                f"This replay buffer was not written by {self.agent_name} (expected a "
                f"{self.replay_class.__name__})."
            )
        if buffer.fields != self._replay_fields() or buffer.n_envs != self.n_envs:
            raise ValueError(
                "This replay buffer does not fit the model: it was saved with other spaces, model sizes or "
                f"n_envs (buffer n_envs={buffer.n_envs}, model n_envs={self.n_envs})."
            )
        if buffer.window != self._replay_window:
            name = self.window_setting
            raise ValueError(
                f"This replay buffer samples windows of {buffer.window} rows, but the model trains on "
                f"{name} + 1 = {self._replay_window}: it was saved with {name}={buffer.window - 1}. "
                f"Load it into a model with that {name}."
            )

    @property
    def _replay_window(self) -> int:
        """Rows of each sampled replay window."""
        return int(getattr(self._config, self.window_setting)) + 1

    def _replay_fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Name -> (per-row shape, dtype) of each replay field."""
        raise NotImplementedError

    def _new_replay(self, capacity: int) -> Any:
        """An empty replay of this agent holding ``capacity`` rows."""
        return self.replay_class(
            capacity,
            self.observation_space,
            self.action_space,
            n_envs=self.n_envs,
            fields=self._replay_fields(),
            window=self._replay_window,
            seed=0 if self.seed is None else int(self.seed),
            **self._replay_options(),
        )

    def _replay_options(self) -> dict[str, Any]:
        """Further keyword arguments of the agent's replay class."""
        return {}

    @property
    def replay_bytes_per_seed(self) -> int:
        """Bytes held by the allocated replay (0 before it is allocated)."""
        return 0 if self.replay_buffer is None else int(self.replay_buffer.nbytes)

    @classmethod
    def load(  # type: ignore[override]
        cls,
        path: Any,
        env: Any = None,
        device: str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        trust_pickled_code: bool = False,
        **kwargs: Any,
    ):
        """Load a model saved by :meth:`save` without unpickling anything: attributes are JSON and
        the weights are read with ``torch.load(weights_only=True)``.

        :param custom_objects: values to use instead of the stored ones (SB3's meaning); they also
            stand in for attributes that were saved pickled.
        :param trust_pickled_code: read pickled attributes (checkpoints of format 1, or ones saved with
            custom Python objects). Unpickling runs code stored in the file: only for files you trust.
        :param kwargs: attributes to set after loading (SB3's meaning).
        """
        what = safe_io.describe(path, "the checkpoint")
        members = safe_io.read_zip(path, what)
        if "data" not in members:
            raise ValueError(f"{what} holds no SB3 model data (no 'data' part in the zip).")
        header = _checkpoint_header(members["data"], what)
        saved = header.get("algorithm_name")
        if saved != cls.__name__:
            if not isinstance(saved, str):
                saved = f"another algorithm ({_stored_policy_name(header)})"
            raise ValueError(
                f"{what} was saved by {saved}, not by {cls.__name__}: "
                "load it with the algorithm that saved it."
            )
        if "policy.pth" not in members:
            raise ValueError(
                f"{what} has no policy weights (policy.pth is missing from the zip): the file is "
                "incomplete or was not written by save()."
            )
        version = header.get("format_version")
        if isinstance(version, bool) or not isinstance(version, int) or version > FORMAT_VERSION:
            raise ValueError(
                f"{what} has checkpoint format {version!r}; this sb3_worldmodels reads format "
                f"{FORMAT_VERSION} and older: upgrade sb3_worldmodels to load it."
            )
        if print_system_info:
            print("== SAVED MODEL SYSTEM INFO ==")
            print(members.get("system_info.txt", b"(none)").decode(errors="replace"))
        data = safe_io.decode_attributes(header, what, custom_objects, trust_pickled_code)
        params = {"policy": safe_io.load_tensors(members["policy.pth"], f"{what} (policy.pth)")}
        return cls._from_checkpoint(data, params, env, device, force_reset, kwargs)

    @classmethod
    def _from_checkpoint(
        cls,
        data: dict[str, Any],
        params: dict[str, Any],
        env: Any,
        device: str,
        force_reset: bool,
        kwargs: dict,
    ):
        """SB3's ``BaseAlgorithm.load`` from the decoded attributes and tensors."""
        data.pop("policy_class", None)
        data.pop("lr_schedule", None)
        if "policy_kwargs" in kwargs and kwargs["policy_kwargs"] != data.get("policy_kwargs"):
            raise ValueError(
                "The specified policy kwargs do not equal the stored policy kwargs. Stored kwargs: "
                f"{data.get('policy_kwargs')}, specified kwargs: {kwargs['policy_kwargs']}"
            )
        if "observation_space" not in data or "action_space" not in data:
            raise ValueError("The checkpoint has no observation_space/action_space: it is incomplete.")
        if env is not None:
            env = cls._wrap_env(env, data.get("verbose", 0))
            check_for_correct_spaces(env, data["observation_space"], data["action_space"])
            if force_reset:
                data["_last_obs"] = None
            data["n_envs"] = env.num_envs
        model = cls(policy=JaxPolicy, env=env, device=device, _init_setup_model=False)  # type: ignore[call-arg]
        model.__dict__.update(data)
        model.__dict__.update(kwargs)
        model._setup_model()
        model.set_parameters(params, exact_match=True, device=device)
        model._resumed = True  # the next learn() says what a continuation cannot reproduce
        return model

    def get_parameters(self) -> dict[str, dict[str, Any]]:
        """SB3's parameter dict, ``{"policy": {name: float tensor}}``: weights, optimiser moments and
        statistics. PRNG keys and counters are left out (``set_parameters`` keeps the model's own);
        ``save`` stores them too."""
        return {"policy": self.policy.state_dict(floats_only=True)}

    def set_parameters(self, load_path_or_dict: Any, exact_match: bool = True, device: str = "auto") -> None:  # type: ignore[override]
        """SB3's ``set_parameters``; a checkpoint path is read without unpickling (only its weights).
        ``exact_match=False`` accepts a part of the weights: the others keep their values."""
        if isinstance(load_path_or_dict, dict):
            params = {name: self._renamed_weights(tensors) for name, tensors in load_path_or_dict.items()}
            return super().set_parameters(params, exact_match=exact_match, device=device)
        what = safe_io.describe(load_path_or_dict, "the file")
        members = safe_io.read_zip(load_path_or_dict, what)
        params = {
            name[: -len(".pth")]: safe_io.load_tensors(blob, f"{what} ({name})")
            for name, blob in members.items()
            if name.endswith(".pth") and name != "pytorch_variables.pth"
        }
        return self.set_parameters(params, exact_match=exact_match, device=device)

    def _renamed_weights(self, tensors: Any) -> Any:
        """``tensors`` with the names of older releases' state leaves replaced by today's."""
        if not isinstance(tensors, dict) or not self.renamed_state_leaves:
            return tensors
        return {self.renamed_state_leaves.get(name, name): value for name, value in tensors.items()}

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        return ["policy"], []

    # ------------------------------------------------------------------ learning loop
    def _setup_learn(
        self, total_timesteps, callback=None, reset_num_timesteps=True, tb_log_name="run", progress_bar=False
    ):
        # The replay is sized and its memory checked before SB3's set-up, so that a refused learn()
        # changes nothing.
        replay, reservation = self._replay_for_run(total_timesteps, reset_num_timesteps)
        check_replay_memory(
            replay.bytes_to_reserve(reservation), replay.nbytes, "buffer_size", self.agent_name
        )
        if self._resumed and not reset_num_timesteps and self.num_timesteps > 0:
            self._warn_inexact_resume()
        self._resumed = False
        last_obs = self._last_obs
        total, callback = super()._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        if self._last_obs is not last_obs:  # the envs were reset: every env starts a new episode
            self._rollout = None
        replay.reserve(reservation)
        self.replay_buffer = replay
        if reset_num_timesteps:
            self._reset_training_schedule()
        found = list(_walk_callbacks(callback))
        self._wm_callbacks = [c for c in found if isinstance(c, WorldModelCallback)]
        self._eval_callbacks = [c for c in found if isinstance(c, EvalCallback)]
        return total, callback

    def _replay_for_run(self, total_timesteps: int, reset_num_timesteps: bool) -> tuple[Any, int]:
        """The replay this run writes to (the current one, or a new one) and the argument of its
        ``reserve``: room for every row the run can write."""
        raise NotImplementedError

    def _reset_training_schedule(self) -> None:
        """Forget the updates owed (a run that restarts its step counter)."""
        raise NotImplementedError

    def _warn_inexact_resume(self) -> None:
        """Say why continuing this loaded model will not reproduce the uninterrupted run."""
        reasons = []
        if self.replay_buffer is None:
            reasons.append(
                "its replay buffer was not loaded (training restarts from an empty replay: call "
                "load_replay_buffer() with the file save_replay_buffer() or CheckpointCallback("
                "save_replay_buffer=True) wrote)"
            )
        if not self.at_episode_boundary and self._last_obs is None:
            reasons.append(
                "it was saved mid-episode and its envs start new episodes (SB3's load resets them)"
            )
        if reasons:
            warnings.warn(
                f"Continuing a loaded {type(self).__name__}: {'; and '.join(reasons)}. The run goes on "
                "but differs from an uninterrupted one (docs/safety.md, Resuming).",
                stacklevel=4,
            )

    def learn(
        self,
        total_timesteps: int,
        callback=None,
        log_interval: int = 4,
        tb_log_name: str | None = None,
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ):
        """SB3's ``learn``: collect ``total_timesteps`` (replay rows for DreamerV3, agent steps for
        TD-MPC2) and run the updates the agent's own schedule owes after each vector step. The
        TensorBoard run is named after the algorithm unless ``tb_log_name`` is given."""
        return super().learn(
            total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name or type(self).__name__,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )

    def _emit_eval_metrics(self) -> None:
        for ec in self._eval_callbacks:
            if ec.eval_freq > 0 and ec.n_calls % ec.eval_freq == 0 and self._wm_callbacks:
                metrics = {"eval/mean_reward": float(ec.last_mean_reward)}
                if ec.evaluations_length:
                    metrics["eval/mean_ep_length"] = float(np.mean(ec.evaluations_length[-1]))
                for cb in self._wm_callbacks:
                    extra = cb.on_eval_metrics(dict(metrics)) or {}
                    for key, value in extra.items():
                        self.logger.record(key, value)

    def collect_rollouts(
        self,
        env: VecEnv,
        callback: BaseCallback,
        train_freq: TrainFreq,
        replay_buffer: ReplayBuffer | None,
        action_noise=None,
        learning_starts: int = 0,
        log_interval: int | None = None,
    ) -> RolloutReturn:
        """SB3's off-policy collection, with the agent's carried state and its own replay rows."""
        self.policy.set_training_mode(False)
        num_collected_steps, num_collected_episodes = 0, 0
        assert train_freq.unit == TrainFrequencyUnit.STEP
        callback.on_rollout_start()
        continue_training = True
        while should_collect_more_steps(train_freq, num_collected_steps, num_collected_episodes):
            buffer_actions = self._collect_act(self._flat_last_obs(), learning_starts)
            refuse_non_finite_actions(buffer_actions, f" at step {self.num_timesteps}")
            actions = self.action_adapter.to_env(buffer_actions)
            try:
                new_obs, rewards, dones, infos = env.step(actions)
            except ValueError as error:  # e.g. DummyVecEnv storing an observation of another shape
                raise ValueError(
                    f"env.step failed at step {self.num_timesteps} (num_timesteps): {error}. An observation "
                    f"that no longer fits the observation space {self.observation_space} is the usual cause."
                ) from error
            where = f" at step {self.num_timesteps} (num_timesteps, before this step)"
            check_rewards(rewards, where)
            flat_obs = self.obs_adapter.convert(new_obs, where)
            self.num_timesteps += self._rows_in_step(dones)
            num_collected_steps += 1
            callback.update_locals(locals())
            if not callback.on_step():
                return RolloutReturn(
                    num_collected_steps * env.num_envs, num_collected_episodes, continue_training=False
                )
            self._emit_eval_metrics()
            self._update_info_buffer(infos, dones)
            self._collect_observe(flat_obs, rewards, dones, infos)
            self._last_obs = new_obs
            self._flat_obs = (new_obs, flat_obs)
            self.at_episode_boundary = bool(np.all(dones))
            self._update_current_progress_remaining(self.num_timesteps, self._total_timesteps)
            self._on_step()
            for done in dones:
                if done:
                    num_collected_episodes += 1
                    self._episode_num += 1
                    if log_interval is not None and self._episode_num % log_interval == 0:
                        self.dump_logs()
        callback.on_rollout_end()
        return RolloutReturn(num_collected_steps * env.num_envs, num_collected_episodes, continue_training)

    def _flat_last_obs(self) -> AgentObservation:
        """``_last_obs`` flattened, reusing the step's flattening unless SB3 reset the envs since."""
        if self._flat_obs is None or self._flat_obs[0] is not self._last_obs:
            self._flat_obs = (self._last_obs, self.obs_adapter.convert(self._last_obs))
        return self._flat_obs[1]

    def _rows_in_step(self, dones: np.ndarray) -> int:
        """How much ``num_timesteps`` advances for one vector step."""
        return len(dones)

    def _collect_act(self, obs: AgentObservation, learning_starts: int) -> np.ndarray:
        """(n_envs, A) agent-unit actions for the current observations ``obs`` (n_envs, O) (with
        images, an :data:`~sb3_worldmodels.common.boundary.AgentObservation` dict)."""
        raise NotImplementedError

    def _collect_observe(
        self, obs: AgentObservation, rewards: np.ndarray, dones: np.ndarray, infos: list[dict]
    ) -> None:
        """Record the step's outcome, ``obs`` (n_envs, O) flattened (replay rows, episode starts,
        training schedule)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ predict
    def _predict_batch(self, observation: Any) -> tuple[AgentObservation, bool]:
        if isinstance(observation, tuple) and len(observation) == 2 and isinstance(observation[1], dict):
            raise ValueError(
                "predict() got an (obs, info) tuple: pass only the observation returned by reset()."
            )
        vectorized = self.obs_adapter.is_batched(observation)
        if not vectorized:
            if isinstance(observation, dict):
                observation = {k: np.asarray(v)[None] for k, v in observation.items()}
            else:
                observation = np.asarray(observation)[None]
        return self.obs_adapter.convert(observation), vectorized

    def _predict_inputs(
        self,
        observation: Any,
        state: Any,
        episode_start: Any,
        deterministic: Any,
        warn_stateless: bool = True,
    ) -> tuple[AgentObservation, bool, list[np.ndarray], np.ndarray]:
        """The checked inputs of ``predict``: (flat observations (n, O), whether they were a batch, the
        carried state as float32 arrays (zeros when ``state`` is None), (n,) episode starts).
        ``warn_stateless`` counts the call for the stateless-``predict`` warning."""
        obs, vectorized = self._predict_batch(observation)
        n = observation_rows(obs)
        given_starts = self._check_predict_args(deterministic, episode_start, n)
        if warn_stateless:
            self._count_stateless_predict(state, episode_start)
        expected = self._predict_state_shapes(n)
        if state is None:
            return (
                obs,
                vectorized,
                [np.zeros(shape, np.float32) for shape in expected.values()],
                np.ones(n, bool),
            )
        shapes = [np.shape(s) for s in state] if isinstance(state, (tuple, list)) else None
        if shapes != list(expected.values()):
            raise ValueError(
                f"state must be the ({', '.join(expected)}) tuple that predict returned, with shapes "
                f"{list(expected.values())} for {n} observations; got {shapes or type(state).__name__}."
            )
        carried = [np.asarray(s, np.float32) for s in state]
        check_finite_arrays(dict(zip(expected, carried, strict=True)), "state", STATE_FIX)
        return obs, vectorized, carried, np.zeros(n, bool) if given_starts is None else given_starts

    def predict_rollout(
        self, observation: Any, actions: Any, state: Any = None, episode_start: Any = None
    ) -> dict[str, np.ndarray]:
        """What the world model expects if ``actions`` are taken next, open loop (no sampling).

        :param observation: the observation ``predict`` gets now: one, or a batch (n, ...).
        :param actions: env actions from now on: (T,) for Discrete or (T, A) for Box for one
            observation, (n, T) or (n, T, A) for a batch; the first is typically the action ``predict``
            returns for ``observation``.
        :param state: what ``predict`` returned at the previous step (None at an episode's start),
            and ``episode_start`` as for ``predict``: a recurrent model (DreamerV3) predicts from the
            belief ``predict`` forms from them; a Markov one (TD-MPC2) from the observation alone.
        :return: the agent's predictions by name (its ``predict_rollout`` documentation), each with
            the n axis first, or without it for one observation.
        """
        return self._predict_rollout(observation, actions, state, episode_start, agent_units=False)

    def _predict_rollout(
        self, observation: Any, actions: Any, state: Any, episode_start: Any, agent_units: bool
    ) -> dict[str, np.ndarray]:
        obs, vectorized, carried, starts = self._predict_inputs(
            observation, state, episode_start, deterministic=True, warn_stateless=False
        )
        agent_actions = self._rollout_actions(actions, observation_rows(obs), vectorized, agent_units)
        out = self._open_loop(obs, agent_actions, carried, starts)
        return {k: (np.asarray(v) if vectorized else np.asarray(v)[0]) for k, v in out.items()}

    def _rollout_actions(self, actions: Any, n: int, vectorized: bool, agent_units: bool) -> np.ndarray:
        """Actions of :meth:`predict_rollout` (env units, or the agent's with ``agent_units``), with or
        without the env axis → agent actions (n, T, A) float32; a wrong shape is refused."""
        discrete = self.action_adapter.discrete and not agent_units
        event = () if discrete else (self.action_adapter.dim,)
        actions = np.asarray(actions) if discrete else np.asarray(actions, np.float32)
        given = actions.shape
        if not vectorized:
            actions = actions[None]
        if actions.ndim != 2 + len(event) or actions.shape[0] != n or actions.shape[2:] != event:
            expected = ", ".join(map(str, ((n,) if vectorized else ()) + ("T", *event)))
            raise ValueError(
                f"actions have shape {given}, expected ({expected}): the env axis first for a batch of "
                "observations, none for one observation."
            )
        if agent_units:
            return actions
        steps = actions.shape[1]
        flat = self.action_adapter.from_env(actions.reshape(n * steps, *event))
        return np.asarray(flat, np.float32).reshape(n, steps, -1)

    def _open_loop(
        self, obs: AgentObservation, actions: np.ndarray, carried: list[np.ndarray], starts: np.ndarray
    ) -> dict[str, Any]:
        """The agent's open-loop predictions from flat observations ``obs`` (n, O) along agent
        ``actions`` (n, T, A), given ``predict``'s checked state ``carried`` and (n,) ``starts``."""
        raise NotImplementedError

    def _predict_state_shapes(self, n: int) -> dict[str, tuple[int, ...]]:
        """Name -> shape of each array of ``predict``'s state for n observations."""
        raise NotImplementedError

    def _env_actions(self, actions: np.ndarray, vectorized: bool) -> np.ndarray:
        """``predict``'s agent actions (n, A) as env actions, refused when not finite."""
        refuse_non_finite_actions(actions, " in predict")
        env_actions = self.action_adapter.to_env(actions)
        return env_actions if vectorized else np.asarray(env_actions[0])  # 0-d for one Discrete action

    def _terminal_observations(self, infos: list[dict], envs: np.ndarray) -> AgentObservation:
        """(len(envs), O) flat ``terminal_observation`` of the finished episodes of ``envs``."""
        observations = [infos[i].get("terminal_observation") for i in envs]
        if any(o is None for o in observations):
            raise RuntimeError(
                "The VecEnv did not report info['terminal_observation'] for a finished episode."
            )
        if isinstance(observations[0], dict):
            batch = {k: np.stack([o[k] for o in observations]) for k in observations[0]}
        else:
            batch = np.stack(observations)  # type: ignore[assignment]
        return self.obs_adapter.convert(batch)

    def _predict_keys(self, deterministic: bool, *inputs: np.ndarray) -> jax.Array:
        """(n, 2) PRNG keys for a ``predict`` call on n rows, one per row.

        ``deterministic=True``: each row's key is derived from that row's inputs (observation and
        state) alone, so the action is a function of the inputs and the weights: the same whatever
        came before, across save/load, and in another model given these weights by
        ``set_parameters``. Otherwise the keys come from the model's predict stream, which advances
        with every call.
        """
        if deterministic:
            return fold_in_rows(jax.random.PRNGKey(DETERMINISTIC_PREDICT_SEED), row_digests(*inputs))
        key = jax.random.fold_in(self.policy.state["predict_key"], self._predict_calls)
        self._predict_calls += 1
        return jax.random.split(key, len(inputs[0]))

    @staticmethod
    def _check_predict_args(deterministic: Any, episode_start: Any, n: int) -> np.ndarray | None:
        """Refuse a non-boolean ``deterministic`` and an ``episode_start`` that is not one flag per
        observation; return ``episode_start`` as an (n,) bool array (None when not given)."""
        if not isinstance(deterministic, (bool, np.bool_)):
            raise TypeError(
                f"deterministic must be a bool, got {deterministic!r} ({type(deterministic).__name__}): "
                "a string such as 'False' would count as True."
            )
        if episode_start is None:
            return None
        starts = np.asarray(episode_start)
        if starts.size != n or starts.ndim > 1:
            raise ValueError(
                f"episode_start has shape {starts.shape}, expected ({n},): one flag per observation."
            )
        return starts.reshape(n).astype(bool)

    def _count_stateless_predict(self, state: Any, episode_start: Any) -> None:
        """Warn once per model when ``predict`` is called a second time in a row with neither ``state``
        nor ``episode_start`` (evaluate_policy passes ``episode_start`` from its first call on)."""
        if state is not None or episode_start is not None:
            self._stateless_predicts = 0
            return
        self._stateless_predicts += 1
        if self._stateless_predicts == 2:
            warnings.warn(
                f"{type(self).__name__}.predict was called twice without `state`: the agent "
                f"{self.stateless_predict_consequence}. "
                "Pass the returned state back, with `episode_start`, as for sb3-contrib's RecurrentPPO "
                "(evaluate_policy does this).",
                stacklevel=4,
            )

    # ------------------------------------------------------------------ training
    def train(self, gradient_steps: int, batch_size: int = 0) -> None:
        """Run the updates the agent's schedule owes (SB3's ``gradient_steps`` is ignored), in
        jitted calls of ``_updates_per_call`` updates (and single updates for the rest)."""
        owed = self._take_owed_updates()
        if owed <= 0:
            return
        if self._n_updates == 0:
            for cb in self._wm_callbacks:
                cb.on_pretrain()
        per_call = self._updates_per_call
        chunks = [per_call] * (owed // per_call) + [1] * (owed % per_call)
        lr = self.current_learning_rate
        state = self.policy.state
        agent_state = self.core.set_learning_rate(state["agent"], lr)
        all_metrics = []
        done = 0
        for k in chunks:
            new_agent_state, metrics, commit = self._train_chunk(agent_state, k)
            metrics = jax.device_get(metrics)
            self._refuse_non_finite_update(metrics, done)
            agent_state, done = new_agent_state, done + k
            commit()
            self.policy.state = {**state, "agent": agent_state}
            all_metrics.append(metrics)
        self._n_updates += owed
        # Each call returns every update's metrics with a leading K: one row per update owed.
        stacked = {key: np.concatenate([m[key] for m in all_metrics]) for key in all_metrics[0]}
        for i in range(owed if self._wm_callbacks else 0):
            self._log_post_update({f"train/{key}": float(v[i]) for key, v in stacked.items()})
        for key, values in stacked.items():
            self.logger.record(f"train/{key}", _aggregate(key, values))
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/learning_rate", lr)
        self.logger.record("rollout/env_frames", self.num_timesteps * self.action_repeat)
        self.logger.record("train/replay_bytes", self.replay_bytes_per_seed)

    def _refuse_non_finite_update(self, metrics: dict[str, np.ndarray], done: int) -> None:
        """Raise NonFiniteUpdateError when any update of a chunk has a non-finite metric (every loss
        term, gradient and update norm is one), before its state or side effects are kept."""
        bad = [
            key
            for key, values in metrics.items()
            if not key.startswith(self.nan_allowed_metrics) and not np.all(np.isfinite(values))
        ]
        if not bad:
            return
        first = min(int(np.argmax(~np.isfinite(metrics[key]))) for key in bad)
        terms = [key for key in bad if not np.isfinite(metrics[key][first])]
        shown = ", ".join(f"{key} = {float(metrics[key][first])}" for key in terms[:6])
        shown += ", ..." if len(terms) > 6 else ""
        kept = self._n_updates + done
        raise NonFiniteUpdateError(
            f"Update {kept + first + 1} produced non-finite values ({shown}). "
            f"Training stopped; the parameters are kept as they were after update {kept} (the updates of "
            f"this jitted call are discarded). Common causes: a learning rate too high, or rewards and "
            "observations of extreme magnitude; the model can be saved or trained again as it is."
        )

    def _take_owed_updates(self) -> int:
        """The number of updates to run now (and forget them), 0 while training cannot start."""
        raise NotImplementedError

    @property
    def _updates_per_call(self) -> int:
        """Updates scanned in one jitted call (one distinct compilation)."""
        raise NotImplementedError

    def _train_chunk(self, agent_state: Any, k: int) -> tuple[Any, dict, Callable[[], None]]:
        """Sample k batches and run k updates in one jitted call: (new state, metrics with a leading k,
        a function that applies the call's side effects once its metrics are known to be finite)."""
        raise NotImplementedError

    def _log_post_update(self, metrics: dict[str, float]) -> None:
        for cb in self._wm_callbacks:
            extra = cb.on_post_update(dict(metrics)) or {}
            for key, value in extra.items():
                self.logger.record(key, value)


def padded_rows(n: int) -> int:
    """The batch size ``predict`` runs for n observations: the next power of two, so that a model
    compiles its acting step for a handful of sizes, not for every new n."""
    return 1 << max(0, int(n) - 1).bit_length()


def pad_rows(array: Any, rows: int) -> np.ndarray:
    """``array`` (n, ...) with its last row repeated up to ``rows`` rows."""
    array = np.asarray(array)
    extra = rows - array.shape[0]
    return array if extra == 0 else np.concatenate([array, np.repeat(array[-1:], extra, axis=0)])


def row_digests(*arrays: Any) -> np.ndarray:
    """(n,) uint32 CRC-32 of each row's bytes over ``arrays`` (each with a leading axis n)."""
    rows = [np.ascontiguousarray(np.asarray(a)).reshape(len(a), -1) for a in arrays]
    return np.array(
        [zlib.crc32(b"".join(r[i].tobytes() for r in rows)) for i in range(len(rows[0]))], np.uint32
    )


def _aggregate(key: str, values: np.ndarray) -> float:
    """The mean of one metric over a call's updates.

    Split statistics (``*stats/*``, see :func:`~sb3_worldmodels.blocks.distributions.balance_stats`)
    are NaN in updates whose batch lacks a class and are averaged over the others (NaN when all
    lack it), as the reference aggregates them; every other metric keeps a NaN visible.
    """
    if "stats/" in key:
        finite = values[~np.isnan(values)]
        return float(finite.mean()) if finite.size else float("nan")
    return float(np.mean(values))


__all__ = ["BaseAlgorithm", "WorldModelAlgorithm"]

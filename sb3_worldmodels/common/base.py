"""The SB3 shell shared by the online world-model agents: a thin composition of the shell's jobs.

``WorldModelAlgorithm`` subclasses SB3's ``OffPolicyAlgorithm`` so that the logger, callbacks,
Monitor statistics, ``set_env``/``get_env``, the zip format and ``Algo.load`` are SB3's own. Each job
lives in its own module of :mod:`sb3_worldmodels.common`:

- :mod:`.sb3_keywords`: SB3's constructor keywords (aliases, refusals, ``policy``/``env`` forms);
- :mod:`.collector`: the env loop, the checks at the env boundary, the replay and its files;
- :mod:`.predict`: ``predict``'s argument checks, carried state and key rule, ``predict_rollout``;
- :mod:`.checkpoints`: the checkpoint format, its state codec, ``save``/``load`` and parameters;
- :mod:`.training`: the training calls (``train``) and the learning rate;
- :mod:`.agent_hooks`: what an agent class provides (class attributes and abstract hooks).

This module builds the model from its hyperparameters and the spaces, and sets up each ``learn``.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import jax
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import EvalCallback
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.utils import check_for_correct_spaces
from stable_baselines3.common.vec_env import VecEnv

from sb3_worldmodels.blocks.devices import data_parallel_placement
from sb3_worldmodels.common.boundary import (
    ActionAdapter,
    NonFiniteActionError,
    ObservationAdapter,
    refuse_non_finite_actions,
)
from sb3_worldmodels.common.callbacks import WorldModelCallback, walk_callbacks
from sb3_worldmodels.common.checkpoints import FORMAT_VERSION, Checkpointing
from sb3_worldmodels.common.collector import Collector
from sb3_worldmodels.common.device_replay import check_replay_on_device
from sb3_worldmodels.common.net_arch import net_arch_settings
from sb3_worldmodels.common.policy import JaxPolicy
from sb3_worldmodels.common.policy_file import PolicyFiles
from sb3_worldmodels.common.predict import (
    DETERMINISTIC_PREDICT_SEED,
    STATE_FIX,
    Predictor,
    pad_rows,
    padded_rows,
    row_digests,
)
from sb3_worldmodels.common.replay import check_replay_memory
from sb3_worldmodels.common.sb3_keywords import (
    FOREIGN_KEYWORDS,
    make_env,
    policy_and_env,
    refuse_foreign_keywords,
    refuse_unsupported_options,
    take_sb3_alias,
)
from sb3_worldmodels.common.seed_group import HandOuts, SeedGroup, group_vec_env
from sb3_worldmodels.common.seed_lanes import seed_list
from sb3_worldmodels.common.training import NonFiniteUpdateError, Trainer


class WorldModelAlgorithm(
    SeedGroup, Checkpointing, PolicyFiles, Collector, Predictor, Trainer, OffPolicyAlgorithm
):
    """Base class of the online JAX world-model agents (see the module docstring); a subclass
    fulfils :class:`~sb3_worldmodels.common.agent_hooks.AgentHooks`."""

    policy_aliases = {"MlpPolicy": JaxPolicy, "MultiInputPolicy": JaxPolicy, "CnnPolicy": JaxPolicy}  # noqa: RUF012
    policy: JaxPolicy
    model_size: Any
    _last_obs: Any

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
        seed: int | list[int] | None = None,
        device: str = "auto",
        allow_vecnormalize_obs: bool = False,
        data_parallel: bool = False,
        replay_on_device: bool | None = None,
        action_noise: Any = None,
        replay_buffer_class: Any = None,
        replay_buffer_kwargs: dict | None = None,
        optimize_memory_usage: bool = False,
        use_sde: bool = False,
        _init_setup_model: bool = True,
    ) -> None:
        policy, env = policy_and_env(policy, env, self.policy_aliases)
        if policy == "CnnPolicy" and not self.allow_images:
            raise ValueError(
                f"{self.agent_name} does not learn from images yet (CnnPolicy): use the env's state "
                "observation with 'MlpPolicy' (or 'MultiInputPolicy' for Dict observations), or DreamerV3."
            )
        refuse_unsupported_options(
            self.agent_name,
            n_envs=n_envs,
            action_repeat=action_repeat,
            action_noise=action_noise,
            use_sde=use_sde,
            optimize_memory_usage=optimize_memory_usage,
            replay_buffer_class=replay_buffer_class,
            replay_buffer_kwargs=replay_buffer_kwargs,
        )
        hyperparameters = {**hyperparameters, **net_arch_settings(type(self), policy_kwargs, hyperparameters)}
        # The agent's hyperparameters (its config fields and model_size) are attributes, so that a
        # loaded model or rl_zoo3 can override them; the config is built from them.
        self.__dict__.update(hyperparameters)
        self.action_repeat = action_repeat
        self.allow_vecnormalize_obs = allow_vecnormalize_obs
        self.seeds = seed_list(seed)
        if not isinstance(data_parallel, bool):
            raise TypeError(f"data_parallel must be True or False, got {data_parallel!r}.")
        if data_parallel and self.seeds is not None:
            raise ValueError(
                "data_parallel=True splits one model's training batch over the devices; a seed group "
                "already shards its seeds over them. Pass one seed, or leave data_parallel False."
            )
        self.data_parallel = data_parallel
        self.replay_on_device = check_replay_on_device(replay_on_device)
        if replay_on_device and (data_parallel or not self.device_replay_fields):
            why = (
                "splits its training batches over the devices (data_parallel=True)"
                if data_parallel
                else "keeps its replay on the host"
            )
            raise ValueError(
                f"replay_on_device=True: {self.agent_name} {why}; leave replay_on_device None or False."
            )
        self._lanes = None
        n_envs = n_envs or self.default_n_envs
        if self.seeds is not None and isinstance(env, str):
            env_id = env
            env = group_vec_env(lambda s: make_env(env_id, n_envs, s, action_repeat), self.seeds)
        else:
            env = make_env(env, n_envs, seed, action_repeat)  # type: ignore[arg-type]
        if isinstance(env, (gym.Env, VecEnv)):
            # Clear errors before SB3's own assertions on the spaces.
            ObservationAdapter.from_space(env.observation_space, self.agent_name, self.allow_images)
            ActionAdapter.from_space(env.action_space, self.agent_name, self.allow_discrete)
        if isinstance(policy, str) and policy in self.policy_aliases:
            policy = self.policy_aliases[policy]  # SB3 refuses the "MlpPolicy" string with Dict spaces
        self.format_version = FORMAT_VERSION  # in __dict__ too, for SB3's own BaseAlgorithm.save
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
            seed=seed,  # type: ignore[arg-type]
            use_sde=False,
            sde_support=False,
            supported_action_spaces=(spaces.Box, spaces.Discrete) if self.allow_discrete else (spaces.Box,),
        )
        if self.env is not None:
            self._check_env(self.env)
            self._check_group_env()
        if _init_setup_model:
            self._setup_model()

    # ------------------------------------------------------------------ set-up
    def _setup_model(self) -> None:
        self._check_per_seed_values()
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
        self._batch_placement = None
        self._local_view = None
        self._run_updates = 0
        if getattr(self, "seeds", None) is None:
            self.seeds, self._lanes, self._placement = None, None, None
            self.policy.state = self._build_state()
            if getattr(self, "data_parallel", False):  # files of earlier releases have no such attribute
                self._batch_placement = data_parallel_placement(self.batch_size)
                self._check_process_span()
        else:
            if jax.process_count() > 1:
                raise ValueError(
                    f"A seed group runs on one process's devices, and this process is one of "
                    f"{jax.process_count()} of a jax.distributed run. Run each group in a process of its "
                    "own without jax.distributed (one job per host), or one model (one seed) with "
                    "data_parallel=True over every process's devices."
                )
            self._call_config = self._group_call_config()  # refuses what cannot vary per seed
            self._lanes = self._make_lanes()
            self.policy.state = self._build_group_state()
        self.policy.algorithm_predict = self.predict
        self.policy.policy_file_contents = self._policy_file_contents
        # SB3 code reads ``model.gamma`` (e.g. for n-step returns or logging): the agent's own discount.
        self.gamma = float(self._config.gamma)
        self._convert_train_freq()
        self._rollout = None
        self._predict_calls = 0
        self._stateless_predicts = 0
        self._wm_callbacks = []
        self._eval_callbacks = []
        self._resumed = False
        self._flat_obs = None
        self._predict_view = None
        self._hand_outs = None if self._lanes is None else HandOuts()
        self._rates_written = None
        self._unsettled = None
        self._staged = None
        self._learning = False
        if not hasattr(self, "_owed_updates"):
            self._owed_updates = 0  # a loaded model keeps the updates it owed
        if not hasattr(self, "at_episode_boundary"):
            self.at_episode_boundary = True

    @property
    def config(self) -> Any:
        """The resolved static configuration, built from the attributes (so that load/zoo overrides
        apply) and the spaces; fields without a constructor argument keep their defaults."""
        fields = {name: getattr(self, name) for name in self.config_settings() if hasattr(self, name)}
        fields.update({name: values[0] for name, values in self._per_seed_values().items()})
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
            "_lanes",
            "_replay_mirror",
            "_decided_device_fields",
            "_call_config",
            "_predict_view",
            "_hand_outs",
            "_rates_written",
            "_unsettled",
            "_staged",
            "_learning",
            "_placement",
            "_batch_placement",
            "_local_view",
            "_run_updates",
        ]

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

    # ------------------------------------------------------------------ learning loop
    def _setup_learn(
        self, total_timesteps, callback=None, reset_num_timesteps=True, tb_log_name="run", progress_bar=False
    ):
        # The replay is sized and its memory checked before SB3's set-up, so that a refused learn()
        # changes nothing.
        self._refuse_group_evaluation(callback)
        self._warn_lone_process()
        if self._lanes is None:
            replay, reservation = self._replay_for_run(total_timesteps, reset_num_timesteps)
        else:
            replay, reservation = self._group_replays(total_timesteps, reset_num_timesteps)
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
            self._forget_rollouts()
        replay.reserve(reservation)
        self.replay_buffer = replay
        if self._lanes is not None:
            self._set_up_lanes_for_run(replay, reset_num_timesteps)
        if reset_num_timesteps:
            self._reset_training_schedule()
        found = list(walk_callbacks(callback))
        self._wm_callbacks = [c for c in found if isinstance(c, WorldModelCallback)]
        self._eval_callbacks = [c for c in found if isinstance(c, EvalCallback)]
        return total, callback

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
        self._learning = True
        ended = False
        try:
            result = super().learn(
                total_timesteps,
                callback=callback,
                log_interval=log_interval,
                tb_log_name=tb_log_name or type(self).__name__,
                reset_num_timesteps=reset_num_timesteps,
                progress_bar=progress_bar,
            )
            ended = True
        finally:
            self._learning = False
            self._staged = None  # a step's update dispatched before a step that did not complete
            # Nothing is unsettled after the last step; after an error the state is made safe, quietly.
            self._settle_training(refuse=ended)
        return result


# Besides WorldModelAlgorithm, the names imported from here before the shell was split by job (their
# homes are the modules they are imported from).
__all__ = [
    "DETERMINISTIC_PREDICT_SEED",
    "FOREIGN_KEYWORDS",
    "FORMAT_VERSION",
    "STATE_FIX",
    "BaseAlgorithm",
    "NonFiniteActionError",
    "NonFiniteUpdateError",
    "WorldModelAlgorithm",
    "pad_rows",
    "padded_rows",
    "refuse_foreign_keywords",
    "refuse_non_finite_actions",
    "row_digests",
    "take_sb3_alias",
]

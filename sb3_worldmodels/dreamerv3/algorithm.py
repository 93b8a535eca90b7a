"""DreamerV3 as an SB3 algorithm (the numpy side; the math lives in :mod:`.agent`)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels.common.agent_hooks import AgentCall, TrainingBatch
from sb3_worldmodels.common.base import WorldModelAlgorithm
from sb3_worldmodels.common.boundary import AgentObservation, map_observation, observation_rows
from sb3_worldmodels.common.net_arch import NetArchFields
from sb3_worldmodels.common.predict import pad_rows, padded_rows
from sb3_worldmodels.common.replay import SequenceReplay
from sb3_worldmodels.common.sb3_keywords import refuse_foreign_keywords, take_sb3_alias
from sb3_worldmodels.common.schedule import RatioSchedule
from sb3_worldmodels.dreamerv3 import agent as core
from sb3_worldmodels.dreamerv3.config import DreamerV3Config, preset, seed_settings

_D = DreamerV3Config()  # the constructor's defaults are the config's


class _Pending(NamedTuple):
    """Per-env part of the next replay row that is known before its action (numpy)."""

    reward: np.ndarray  # (n,) float32: the reward that led to the current observation
    is_first: np.ndarray  # (n,) bool


class _RolloutState(NamedTuple):
    carry: core.Carry  # per-env recurrent state of the acting policy (device)
    pending: _Pending
    latent: tuple[Any, Any] | None  # posterior (deter, stoch) of the current rows (device or host)


SB3_HINTS = {
    "cadence": "train_ratio: replayed rows per collected row",
    "clip": "agc, adaptive gradient clipping per tensor",
    "entropy": "actent",
}


def _observation_fields(obs: AgentObservation) -> dict[str, np.ndarray]:
    """The replay fields of a batch of observations: "obs" (n, O) float32 and "image" (n, H, W, C)
    uint8, each when the observation has it."""
    if not isinstance(obs, dict):
        return {"obs": obs}
    fields = {"image": obs["image"]}
    if "vector" in obs:
        fields["obs"] = obs["vector"]
    return fields


def horizon_from_gamma(gamma: float) -> float:
    """SB3's ``gamma`` as DreamerV3's ``return_horizon`` (discount = 1 - 1 / horizon)."""
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0.0 <= gamma < 1.0:
        raise ValueError(f"gamma must be a number in [0, 1), got {gamma!r}.")
    return 1.0 / (1.0 - float(gamma))


class DreamerV3(WorldModelAlgorithm):
    """DreamerV3 (danijar/dreamerv3 @2411f7d + 29eb964) for flat observations; Discrete or Box actions.

    ``DreamerV3("Pendulum-v1")`` builds ``n_envs`` (16) Monitor-wrapped copies of the env;
    ``DreamerV3("MlpPolicy", vec_env)`` keeps the VecEnv's own count. ``num_timesteps`` counts replay
    rows, the reference's step: one per env per vector step, plus the reset row that starts each new
    episode (an episode of L env steps is L + 1 rows).

    Every hyperparameter has the name and the paper-era default of :class:`DreamerV3Config`, where it
    is documented with its source; ``model_size`` picks the preset ("1m" ... "400m", default "12m") and
    ``units``/``deter``/``hidden``/``classes``/``cnn_depth`` override it. ``learning_rate`` is a float
    or an SB3 schedule of the progress remaining; the 1,000-update warmup multiplies it.

    :param buffer_size: replay rows kept over all envs (the reference's ``replay.size``, 5e6,
        configs.yaml:12@2411f7d); the replay is allocated by ``learn`` for at most the rows that the run
        can write (``replay_bytes_per_seed`` gives its size).
    :param learning_starts: SB3's meaning: rows of uniform random actions before the policy acts, and
        no update before them (0 in the reference, which has no such phase; its ``train_fill`` only
        delays training: pass ``train_fill``).
    :param action_repeat: simulator steps per agent step: an env built from an id is wrapped in
        :class:`~sb3_worldmodels.envs.wrappers.ActionRepeat`; a given env must repeat itself. The frame
        counter ``rollout/env_frames`` is rows * action_repeat.
    """

    agent_name = "DreamerV3"
    allow_discrete = True
    allow_images = True
    default_n_envs = 16
    core = core
    config_class = DreamerV3Config
    preset = staticmethod(preset)
    seed_settings = staticmethod(seed_settings)
    space_fields = ("obs_dim", "action_dim", "discrete", "obs_keys", "image_shape", "image_keys")
    replay_class = SequenceReplay
    window_setting = "batch_length"
    training_batch_axis = 1  # batches (k, B, T, ...)
    stateless_predict_consequence = "is recurrent and forgets everything between such calls"
    nan_allowed_metrics = ("constats/", "rewstats/")  # NaN when a batch has no rare row (reference too)
    schedule_attributes = ("_schedule", "_rows")  # the train ratio's position and the rows it counted
    net_arch_fields = NetArchFields(
        width="units",
        width_sizes="every MLP (encoder, decoder, reward and continue heads, actor and critic)",
        actor_depth="actor_layers",
        critic_depth="critic_layers",
        own_choices="activations (SiLU after RMSNorm, nets.py@2411f7d) and optimiser (LaProp)",
    )

    def __init__(
        self,
        policy: Any = "MlpPolicy",
        env: Any = None,
        n_envs: int | None = None,
        model_size: str = "12m",
        units: int | None = None,
        deter: int | None = None,
        hidden: int | None = None,
        classes: int | None = None,
        stoch: int = _D.stoch,
        blocks: int = _D.blocks,
        enc_layers: int = _D.enc_layers,
        dec_layers: int = _D.dec_layers,
        rew_layers: int = _D.rew_layers,
        con_layers: int = _D.con_layers,
        actor_layers: int = _D.actor_layers,
        critic_layers: int = _D.critic_layers,
        cnn_depth: int | None = None,
        cnn_mults: tuple[int, ...] = _D.cnn_mults,
        cnn_kernel: int = _D.cnn_kernel,
        bins: int = _D.bins,
        free_nats: float = _D.free_nats,
        unimix: float = _D.unimix,
        actor_unimix: float = _D.actor_unimix,
        dyn_scale: float = _D.dyn_scale,
        rep_scale: float = _D.rep_scale,
        rec_scale: float = _D.rec_scale,
        rec_image_scale: float = _D.rec_image_scale,
        rew_scale: float = _D.rew_scale,
        con_scale: float = _D.con_scale,
        actor_scale: float = _D.actor_scale,
        critic_scale: float = _D.critic_scale,
        repval_scale: float = _D.repval_scale,
        train_ratio: float = _D.train_ratio,
        train_fill: int = _D.train_fill,
        batch_size: int = _D.batch_size,
        batch_length: int = _D.batch_length,
        imag_horizon: int = _D.imag_horizon,
        return_horizon: float = _D.return_horizon,
        lam: float = _D.lam,
        repval_lam: float = _D.repval_lam,
        actent: float = _D.actent,
        slowreg: float = _D.slowreg,
        slow_rate: float = _D.slow_rate,
        retnorm_rate: float = _D.retnorm_rate,
        retnorm_limit: float = _D.retnorm_limit,
        minstd: float = _D.minstd,
        maxstd: float = _D.maxstd,
        learning_rate: Any = _D.learning_rate,
        agc: float = _D.agc,
        agc_pmin: float = _D.agc_pmin,
        beta1: float = _D.beta1,
        beta2: float = _D.beta2,
        eps: float = _D.eps,
        warmup: int = _D.warmup,
        weight_decay: float = _D.weight_decay,
        matmul_precision: str = _D.matmul_precision,
        compute_dtype: str = _D.compute_dtype,
        buffer_size: int = 5_000_000,
        action_repeat: int = 1,
        learning_starts: int = 0,
        policy_kwargs: dict | None = None,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: str = "auto",
        _init_setup_model: bool = True,
        **sb3_kwargs: Any,
    ) -> None:
        sb3_kwargs = dict(sb3_kwargs)
        return_horizon = take_sb3_alias(
            sb3_kwargs,
            "gamma",
            "return_horizon",
            return_horizon,
            _D.return_horizon,
            convert=horizon_from_gamma,
        )
        slow_rate = take_sb3_alias(sb3_kwargs, "tau", "slow_rate", slow_rate, _D.slow_rate)
        refuse_foreign_keywords(type(self), sb3_kwargs, SB3_HINTS)
        super().__init__(
            policy,
            env,
            self._hyperparameters(locals()),
            learning_rate=learning_rate,
            buffer_size=buffer_size,
            learning_starts=learning_starts,
            batch_size=batch_size,
            gamma=1.0 - 1.0 / return_horizon,
            tau=slow_rate,
            n_envs=n_envs,
            action_repeat=action_repeat,
            policy_kwargs=policy_kwargs,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            verbose=verbose,
            seed=seed,
            device=device,
            _init_setup_model=_init_setup_model,
            **sb3_kwargs,
        )

    # ------------------------------------------------------------------ set-up
    def _space_config(self) -> dict[str, Any]:
        return {
            **super()._space_config(),
            "discrete": self.action_adapter.discrete,
            "obs_keys": self.obs_adapter.decoder_keys,
            "image_shape": self.obs_adapter.image_shape,
            "image_keys": self.obs_adapter.image_keys,
        }

    def _setup_model(self) -> None:
        super()._setup_model()
        saved = getattr(self, "_schedule", None)  # a loaded model keeps its ratio's position
        self._schedule = self._new_schedule()
        if saved is None:
            self._rows = 0
        else:
            self._schedule.load_state_dict(saved.state_dict())

    def _new_schedule(self) -> RatioSchedule:
        cfg = self._config
        return RatioSchedule(cfg.train_ratio, cfg.batch_size, cfg.batch_length, cfg.train_fill)

    def _reset_training_schedule(self) -> None:
        super()._reset_training_schedule()
        self._schedule = self._new_schedule()
        self._rows = 0

    def _replay_fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        cfg = self._config
        observation: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        if cfg.obs_dim:
            observation["obs"] = ((cfg.obs_dim,), np.dtype(np.float32))
        if cfg.image_shape:
            observation["image"] = (tuple(cfg.image_shape), np.dtype(np.uint8))
        return {
            **observation,
            "action": ((cfg.action_dim,), np.dtype(np.float32)),
            "reward": ((), np.dtype(np.float32)),
            "is_first": ((), np.dtype(bool)),
            "is_last": ((), np.dtype(bool)),
            "is_terminal": ((), np.dtype(bool)),
            "deter": ((cfg.deter,), np.dtype(np.float32)),
            "stoch": ((cfg.stoch,), np.dtype(np.int32)),
        }

    def _replay_for_run(self, total_timesteps: int, reset_num_timesteps: bool) -> tuple[SequenceReplay, int]:
        # Rows this run can still write per env: its share of the new rows, plus one reset row per
        # episode at most (an episode has at least one step) and a vector step of slack.
        replay = self.replay_buffer if self.replay_buffer is not None else self._new_replay(self.buffer_size)
        rows = replay.rows_per_env.max(initial=0) + math.ceil(max(0, total_timesteps) / self.n_envs) + 2
        return replay, rows

    # ------------------------------------------------------------------ collection
    def _new_rollout(self, n: int) -> _RolloutState:
        return _RolloutState(
            carry=core.init_carry(self._config, n),
            pending=_Pending(np.zeros(n, np.float32), np.ones(n, bool)),
            latent=None,
        )

    def _rows_in_step(self, dones: np.ndarray) -> int:
        return len(dones) + int(np.sum(dones))

    def _act_call(self, obs: AgentObservation, learning_starts: int) -> AgentCall:
        if self._rollout is None:
            self._rollout = self._new_rollout(self.n_envs)
        roll = self._rollout

        def finish(outputs: Any) -> np.ndarray:
            action, carry, deter, stoch = outputs
            for latent in (deter, stoch):  # for the replay rows: copied while the env steps
                if isinstance(latent, jax.Array):
                    latent.copy_to_host_async()
            action = np.asarray(action)
            if self.num_timesteps < learning_starts:
                action = self.action_adapter.random(
                    self.n_envs, np.random.default_rng([self._rows, self._collection_seed()])
                )
                carry = carry._replace(action=jnp.asarray(action))
            self._rollout = roll._replace(carry=carry, latent=(deter, stoch))
            self._current_obs = obs
            self._current_action = action
            return action

        arguments = (roll.carry, obs, roll.pending.is_first)  # numpy: the call transfers them
        static = {"deterministic": False}
        return AgentCall(core.policy_step_jit, core.policy_params, arguments, static, finish)

    def _collect_observe(
        self, obs: AgentObservation, rewards: np.ndarray, dones: np.ndarray, infos: list[dict]
    ) -> None:
        roll = self._rollout
        n = self.n_envs
        deter, stoch = (np.asarray(latent) for latent in roll.latent)
        envs = np.arange(n)
        zeros = np.zeros(n, bool)
        items = self.replay_buffer.add_rows(
            envs,
            {
                **_observation_fields(self._current_obs),
                "action": self._current_action.astype(np.float32),
                "reward": roll.pending.reward,
                "is_first": roll.pending.is_first,
                "is_last": zeros,
                "is_terminal": zeros,
                "deter": deter,
                "stoch": stoch.astype(np.int32),
            },
        )
        self._advance_schedule(items)
        rewards = np.asarray(rewards, dtype=np.float32)
        done_envs = np.flatnonzero(dones)
        if done_envs.size:
            # The episode's last row: terminal observation, the final reward, no action (the reference
            # zeroes it); its latent is written back by training before it is ever used as context.
            terminal_obs = self._terminal_observations(infos, done_envs)
            truncated = np.array([infos[i].get("TimeLimit.truncated", False) for i in done_envs], bool)
            k = done_envs.size
            cfg = self._config
            items = self.replay_buffer.add_rows(
                done_envs,
                {
                    **_observation_fields(terminal_obs),
                    "action": np.zeros((k, cfg.action_dim), np.float32),
                    "reward": rewards[done_envs],
                    "is_first": np.zeros(k, bool),
                    "is_last": np.ones(k, bool),
                    "is_terminal": ~truncated,
                    "deter": np.zeros((k, cfg.deter), np.float32),
                    "stoch": np.zeros((k, cfg.stoch), np.int32),
                },
            )
            self._advance_schedule(items)
        next_reward = np.where(dones, 0.0, rewards).astype(np.float32)
        self._rollout = roll._replace(pending=_Pending(next_reward, np.asarray(dones, bool).copy()))

    def _advance_schedule(self, items_after_rows: np.ndarray) -> None:
        """Count the rows just added (with the replay's item count after each) and add the updates
        the reference's ratio owes, row by row, on the rows where training may run: the reference's
        gate (``batch_size`` items in the replay, ``step >= train_fill``) and SB3's
        ``learning_starts`` (no update during the random-action rows)."""
        steps = self._rows + np.arange(1, len(items_after_rows) + 1)
        self._rows += len(items_after_rows)
        may_train = self._schedule.gate(steps, items_after_rows) & (steps > self.learning_starts)
        self._owed_updates += self._schedule.updates_for_rows(steps, may_train)

    # ------------------------------------------------------------------ training
    @property
    def _updates_per_call(self) -> int:
        return max(1, round(self.n_envs * self._config.updates_per_row))

    def _training_batch(self, k: int) -> TrainingBatch:
        batch, envs, starts = self.replay_buffer.sample(self._local_batch_size, count=k)

        def write_back(latents: Any) -> None:  # only once finite: no NaN latent reaches the replay
            self.replay_buffer.write_back(envs, starts, jax.device_get(latents))

        return TrainingBatch(batch, write_back)

    # ------------------------------------------------------------------ predict
    def predict(
        self,
        observation: Any,
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        seed_index: int | None = None,
    ):
        """RecurrentPPO's protocol: ``state`` = (deter (n, D), stoch (n, S, C), previous action (n, A)),
        env axis first; rows where ``episode_start`` is true (or all, when ``state`` is None) restart.
        Uses its own RNG stream: training and collection are never touched. Calling it again without
        the returned state restarts the agent's memory every step: that warns once per model.
        A seed group acts for the seed of index ``seed_index`` (required), as ``seed_model(seed_index)``.
        """
        if seed_index is not None or self.seeds is not None:
            return self._seed_call(seed_index, "predict", observation, state, episode_start, deterministic)
        obs, vectorized, carry, starts = self._predict_inputs(
            observation, state, episode_start, deterministic
        )
        # The policy step draws a batch's noise from one key (the first row's: from the predict
        # stream); with deterministic=True it draws nothing (the posterior's and the actor's modes).
        rows = list(obs.values()) if isinstance(obs, dict) else [obs]
        keys = self._predict_keys(bool(deterministic), *rows, *carry, starts)
        action, new_state = self._predict_step(obs, carry, starts, keys[0], bool(deterministic))
        return self._env_actions(action, vectorized), new_state

    def _predict_step(
        self,
        obs: AgentObservation,
        carry: list[np.ndarray],
        starts: np.ndarray,
        key: jax.Array,
        deterministic: bool,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """One policy step of ``predict``: obs (n, O), the carried (deter, stoch, action) and (n,)
        starts → (agent actions (n, A), the new (deter, stoch, action))."""
        n = observation_rows(obs)
        rows = padded_rows(n)  # one compilation per power of two, not per batch size
        action, new, _, _ = core.policy_step_jit(
            self._config,
            core.policy_params(self._local_agent_state()),
            core.Carry(*(jnp.asarray(pad_rows(x, rows)) for x in carry)),
            map_observation(lambda x: jnp.asarray(pad_rows(x, rows)), obs),
            jnp.asarray(pad_rows(starts, rows)),
            key,
            deterministic=deterministic,
        )
        return np.asarray(action)[:n], tuple(np.asarray(x)[:n] for x in new)

    def _predict_state_shapes(self, n: int) -> dict[str, tuple[int, ...]]:
        cfg = self._config
        return {
            "deter": (n, cfg.deter),
            "stoch": (n, cfg.stoch, cfg.classes),
            "action": (n, cfg.action_dim),
        }

    def predict_rollout(
        self,
        observation: Any,
        actions: Any,
        state: Any = None,
        episode_start: Any = None,
        seed_index: int | None = None,
    ) -> dict[str, np.ndarray]:
        """What the world model expects if ``actions`` are taken next, open loop (no sampling), from
        the belief ``predict(observation, state, episode_start, deterministic=True)`` forms (the
        posterior's mode). It does not advance ``predict``'s random stream.

        :param observation: the observation ``predict`` gets now: one, or a batch (n, ...).
        :param actions: env actions from now on: (T,) for Discrete or (T, A) for Box for one
            observation, (n, T) or (n, T, A) for a batch; the first is typically the action ``predict``
            returns for ``observation``.
        :param state: what ``predict`` returned at the previous step (None at an episode's start).
        :param episode_start: as for ``predict``.
        :param seed_index: for a seed group, the index of the seed whose model predicts (required).
        :return: "observation" (n, T, O) predicted (flattened) vector observations (without it for an
            image alone), "image" (n, T, H, W, C) predicted images in [0, 1] (with an image), "reward"
            (n, T) the reward of each step, "continue" (n, T) the probability that the episode goes on,
            "value" (n,) the critic's estimate at the last state, "deter" (n, T, D) the model's states;
            without the n axis for one observation.
        """
        return super().predict_rollout(observation, actions, state, episode_start, seed_index)

    def _open_loop(
        self, obs: AgentObservation, actions: np.ndarray, carried: list[np.ndarray], starts: np.ndarray
    ) -> dict[str, Any]:
        # The belief after obs: the posterior's mode, as deterministic predict (the key is not used).
        key = self.policy.state["predict_key"]
        _, belief = self._predict_step(obs, carried, starts, key, deterministic=True)
        return core.predict_rollout_jit(
            self._config,
            self._local_agent_state().params,
            jnp.asarray(belief[0]),
            jnp.asarray(belief[1]),
            jnp.asarray(actions),
        )

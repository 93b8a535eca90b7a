"""DreamerV3 as an SB3 algorithm (the numpy side; the math lives in :mod:`.agent`)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels.blocks.optim import with_learning_rate
from sb3_worldmodels.common.base import (
    STATE_FIX,
    WorldModelAlgorithm,
    pad_rows,
    padded_rows,
    refuse_foreign_keywords,
    refuse_non_finite_actions,
    take_sb3_alias,
)
from sb3_worldmodels.common.boundary import check_finite_arrays
from sb3_worldmodels.common.replay import SequenceReplay, check_replay_memory
from sb3_worldmodels.common.schedule import RatioSchedule
from sb3_worldmodels.dreamerv3 import agent as core
from sb3_worldmodels.dreamerv3.config import DreamerV3Config, preset


class _Pending(NamedTuple):
    """Per-env part of the next replay row that is known before its action (numpy)."""

    reward: np.ndarray  # (n,) float32: the reward that led to the current observation
    is_first: np.ndarray  # (n,) bool


class _RolloutState(NamedTuple):
    carry: core.Carry  # per-env recurrent state of the acting policy (device)
    pending: _Pending
    latent: tuple[np.ndarray, np.ndarray] | None  # posterior (deter, stoch) of the current rows


_CONFIG_FIELDS = tuple(
    f
    for f in DreamerV3Config.__dataclass_fields__
    if f not in ("obs_dim", "action_dim", "discrete", "learning_rate")
)


SB3_HINTS = {
    "cadence": "train_ratio: replayed rows per collected row",
    "clip": "agc, adaptive gradient clipping per tensor",
    "entropy": "actent",
}


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
    ``units``/``deter``/``hidden``/``classes`` override it. ``learning_rate`` is a float or an SB3
    schedule of the progress remaining; the 1,000-update warmup multiplies it.

    :param replay_capacity: rows kept over all envs (Table 4: 5e6); the replay is allocated by
        ``learn`` for at most the rows that the run can write (``replay_bytes_per_seed`` gives its size).
    :param learning_starts: SB3's meaning: rows of uniform random actions before the policy acts, and
        no update before them (0 in the reference, which has no such phase; its ``train_fill`` only
        delays training: pass ``train_fill``).
    :param action_repeat: simulator steps per agent step: an env built from an id is wrapped in
        :class:`~sb3_worldmodels.common.envs.ActionRepeat`; a given env must repeat itself. The frame
        counter ``rollout/env_frames`` is rows * action_repeat.
    """

    agent_name = "DreamerV3"
    allow_discrete = True
    default_n_envs = 16
    nan_allowed_metrics = ("constats/", "rewstats/")  # NaN when a batch has no rare row (reference too)

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
        stoch: int = 32,
        blocks: int = 8,
        enc_layers: int = 3,
        dec_layers: int = 3,
        rew_layers: int = 1,
        con_layers: int = 1,
        actor_layers: int = 3,
        critic_layers: int = 3,
        bins: int = 255,
        free_nats: float = 1.0,
        unimix: float = 0.01,
        actor_unimix: float = 0.01,
        dyn_scale: float = 1.0,
        rep_scale: float = 0.1,
        rec_scale: float = 1.0,
        rew_scale: float = 1.0,
        con_scale: float = 1.0,
        actor_scale: float = 1.0,
        critic_scale: float = 1.0,
        repval_scale: float = 0.3,
        train_ratio: float = 512,
        train_fill: int = 0,
        batch_size: int = 16,
        batch_length: int = 64,
        imag_horizon: int = 15,
        return_horizon: float = 333,
        lam: float = 0.95,
        repval_lam: float = 0.95,
        actent: float = 3e-4,
        slowreg: float = 1.0,
        slow_rate: float = 0.02,
        retnorm_rate: float = 0.01,
        retnorm_limit: float = 1.0,
        minstd: float = 0.1,
        maxstd: float = 1.0,
        learning_rate: Any = 4e-5,
        agc: float = 0.3,
        agc_pmin: float = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-20,
        warmup: int = 1000,
        weight_decay: float = 0.0,
        matmul_precision: str = "float32",
        replay_capacity: int = 5_000_000,
        episode_length: int = 1000,
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
        replay_capacity = take_sb3_alias(
            sb3_kwargs, "buffer_size", "replay_capacity", replay_capacity, 5_000_000
        )
        return_horizon = take_sb3_alias(
            sb3_kwargs, "gamma", "return_horizon", return_horizon, 333, convert=horizon_from_gamma
        )
        slow_rate = take_sb3_alias(sb3_kwargs, "tau", "slow_rate", slow_rate, 0.02)
        refuse_foreign_keywords(type(self), sb3_kwargs, SB3_HINTS)
        self.model_size = model_size
        self.units, self.deter, self.hidden, self.classes = units, deter, hidden, classes
        self.stoch, self.blocks = stoch, blocks
        self.enc_layers, self.dec_layers, self.rew_layers, self.con_layers = (
            enc_layers,
            dec_layers,
            rew_layers,
            con_layers,
        )
        self.actor_layers, self.critic_layers, self.bins = actor_layers, critic_layers, bins
        self.free_nats, self.unimix, self.actor_unimix = free_nats, unimix, actor_unimix
        self.dyn_scale, self.rep_scale, self.rec_scale = dyn_scale, rep_scale, rec_scale
        self.rew_scale, self.con_scale, self.actor_scale = rew_scale, con_scale, actor_scale
        self.critic_scale, self.repval_scale = critic_scale, repval_scale
        self.train_ratio, self.train_fill, self.batch_length = train_ratio, train_fill, batch_length
        self.imag_horizon, self.return_horizon, self.lam, self.repval_lam = (
            imag_horizon,
            return_horizon,
            lam,
            repval_lam,
        )
        self.actent, self.slowreg, self.slow_rate = actent, slowreg, slow_rate
        self.retnorm_rate, self.retnorm_limit, self.minstd, self.maxstd = (
            retnorm_rate,
            retnorm_limit,
            minstd,
            maxstd,
        )
        self.agc, self.agc_pmin, self.beta1, self.beta2, self.eps = agc, agc_pmin, beta1, beta2, eps
        self.warmup, self.weight_decay, self.matmul_precision = warmup, weight_decay, matmul_precision
        self.replay_capacity, self.episode_length, self.action_repeat = (
            replay_capacity,
            episode_length,
            action_repeat,
        )
        super().__init__(
            policy=policy,
            env=env,
            learning_rate=learning_rate,
            buffer_size=replay_capacity,
            learning_starts=learning_starts,
            batch_size=batch_size,
            n_envs=n_envs,
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
    @property
    def config(self) -> DreamerV3Config:
        """The resolved static configuration (from the attributes, so load/zoo overrides apply)."""
        # Fields without a constructor argument (e.g. img_layers) keep their reference defaults.
        fields = {f: getattr(self, f) for f in _CONFIG_FIELDS if hasattr(self, f)}
        return preset(
            self.model_size,
            obs_dim=self.obs_adapter.dim,
            action_dim=self.action_adapter.dim,
            discrete=self.action_adapter.discrete,
            obs_keys=self.obs_adapter.decoder_keys,
            **fields,
        )

    def _build_state(self) -> dict[str, Any]:
        self._config = self.config
        seed = 0 if self.seed is None else int(self.seed)
        key = jax.random.PRNGKey(seed)
        agent_key, act_key, predict_key = jax.random.split(key, 3)
        if not hasattr(self, "_schedule"):  # a loaded model keeps its saved schedule
            self._reset_schedule()
        # The static config keeps the default rate (so every rate shares one compilation); the
        # optimiser reads the actual rate from its state, set here and at every training call.
        agent = with_learning_rate(core.init_state(self._config, agent_key), float(self.lr_schedule(1.0)))
        return {
            "agent": agent,
            "act_key": act_key,
            "predict_key": predict_key,
        }

    def _discount(self) -> float:
        return float(self._config.gamma)

    def _reset_schedule(self) -> None:
        self._schedule = RatioSchedule(
            self._config.train_ratio, self._config.batch_size, self._config.batch_length
        )
        self._rows = 0

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_config"]

    def _setup_model(self) -> None:
        super()._setup_model()
        self._config = self.config
        self._pending_updates = 0

    @property
    def replay_bytes_per_seed(self) -> int:
        """Bytes held by the allocated replay (0 before ``learn``)."""
        return 0 if self.replay_buffer is None else int(self.replay_buffer.nbytes)

    def _replay_fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        cfg = self._config
        return {
            "obs": ((cfg.obs_dim,), np.dtype(np.float32)),
            "action": ((cfg.action_dim,), np.dtype(np.float32)),
            "reward": ((), np.dtype(np.float32)),
            "is_first": ((), np.dtype(bool)),
            "is_last": ((), np.dtype(bool)),
            "is_terminal": ((), np.dtype(bool)),
            "deter": ((cfg.deter,), np.dtype(np.float32)),
            "stoch": ((cfg.stoch,), np.dtype(np.int32)),
        }

    def _check_replay_buffer(self, buffer: Any) -> None:
        if not isinstance(buffer, SequenceReplay):
            raise ValueError("This replay buffer was not written by DreamerV3 (expected a SequenceReplay).")
        if buffer.fields != self._replay_fields() or buffer.n_envs != self.n_envs:
            raise ValueError(
                "This replay buffer does not fit the model: it was saved with other spaces, model sizes or "
                f"n_envs (buffer n_envs={buffer.n_envs}, model n_envs={self.n_envs})."
            )
        if buffer.window != self._config.batch_length + 1:
            raise ValueError(
                f"This replay buffer samples windows of {buffer.window} rows, but the model trains on "
                f"batch_length + 1 = {self._config.batch_length + 1}: it was saved with "
                f"batch_length={buffer.window - 1}. Load it into a model with that batch_length."
            )

    def _setup_learn(
        self, total_timesteps, callback=None, reset_num_timesteps=True, tb_log_name="run", progress_bar=False
    ):
        # Checked before SB3's set-up, so that a refused learn() changes nothing. Rows this run can
        # still write per env: its share of the new rows, plus one reset row per episode at most (an
        # episode has at least one step) and a vector step of slack.
        replay = self.replay_buffer if self.replay_buffer is not None else self._new_replay()
        rows = replay.rows_per_env.max(initial=0) + math.ceil(max(0, total_timesteps) / self.n_envs) + 2
        check_replay_memory(replay.bytes_to_reserve(rows), replay.nbytes, "replay_capacity", self.agent_name)
        total, callback = super()._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        replay.reserve(rows)
        self.replay_buffer = replay
        if reset_num_timesteps:
            self._rollout = None
            self._reset_schedule()
        return total, callback

    def _new_replay(self) -> SequenceReplay:
        return SequenceReplay(
            self.replay_capacity,
            self.observation_space,
            self.action_space,
            n_envs=self.n_envs,
            fields=self._replay_fields(),
            window=self._config.batch_length + 1,
            seed=0 if self.seed is None else int(self.seed),
        )

    # ------------------------------------------------------------------ collection
    def _new_rollout(self, n: int) -> _RolloutState:
        return _RolloutState(
            carry=core.init_carry(self._config, n),
            pending=_Pending(np.zeros(n, np.float32), np.ones(n, bool)),
            latent=None,
        )

    def _rows_in_step(self, dones: np.ndarray) -> int:
        return len(dones) + int(np.sum(dones))

    def _collect_act(self, obs: np.ndarray, learning_starts: int) -> np.ndarray:
        if self._rollout is None:
            self._rollout = self._new_rollout(self.n_envs)
        roll = self._rollout
        state = self.policy.state
        act_key, step_key = jax.random.split(state["act_key"])
        action, carry, deter, stoch = core.policy_step_jit(
            self._config,
            core.policy_params(state["agent"]),
            roll.carry,
            jnp.asarray(obs),
            jnp.asarray(roll.pending.is_first),
            step_key,
            deterministic=False,
        )
        self.policy.state = {**state, "act_key": act_key}
        action = np.asarray(action)
        if self.num_timesteps < learning_starts:
            action = self.action_adapter.random(
                self.n_envs, np.random.default_rng([self._rows, self.seed or 0])
            )
            carry = carry._replace(action=jnp.asarray(action))
        self._rollout = roll._replace(carry=carry, latent=(np.asarray(deter), np.asarray(stoch)))
        self._current_obs = obs
        self._current_action = action
        return action

    def _collect_observe(
        self, obs: np.ndarray, rewards: np.ndarray, dones: np.ndarray, infos: list[dict]
    ) -> None:
        roll = self._rollout
        n = self.n_envs
        deter, stoch = roll.latent
        envs = np.arange(n)
        zeros = np.zeros(n, bool)
        items = self.replay_buffer.add_rows(
            envs,
            {
                "obs": self._current_obs,
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
                    "obs": terminal_obs,
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

    def _terminal_observations(self, infos: list[dict], done_envs: np.ndarray) -> np.ndarray:
        observations = [infos[i].get("terminal_observation") for i in done_envs]
        if any(o is None for o in observations):
            raise RuntimeError(
                "The VecEnv did not report info['terminal_observation'] for a finished episode."
            )
        if isinstance(observations[0], dict):
            batch = {k: np.stack([o[k] for o in observations]) for k in observations[0]}
        else:
            batch = np.stack(observations)
        return self.obs_adapter.flatten(batch)

    def _advance_schedule(self, items_after_rows: np.ndarray) -> None:
        """Count the rows just added (with the replay's item count after each) and add the updates
        the reference's ratio owes, row by row, once the replay holds ``batch_size`` windows."""
        for items in items_after_rows:
            self._rows += 1
            # train_fill is the reference's gate (step >= train_fill); learning_starts is SB3's.
            trainable = self._rows >= self._config.train_fill and self._rows > self.learning_starts
            if trainable and items >= self._config.batch_size:
                self._pending_updates += self._schedule(self._rows)

    # ------------------------------------------------------------------ training
    @property
    def _updates_per_call(self) -> int:
        return max(1, round(self.n_envs * self._config.updates_per_row))

    def _take_owed_updates(self) -> int:
        owed, self._pending_updates = self._pending_updates, 0
        return owed

    def _with_learning_rate(self, agent_state: Any, lr: float) -> Any:
        return with_learning_rate(agent_state, lr)

    def _train_chunk(self, agent_state: Any, k: int) -> tuple[Any, dict]:
        batch, envs, starts = self.replay_buffer.sample(self._config.batch_size, count=k)
        batch = {name: jnp.asarray(value) for name, value in batch.items()}
        agent_state, metrics, latents = core.train_many_jit(self._config, agent_state, batch)

        def write_back() -> None:  # only once the metrics are finite: no NaN latent reaches the replay
            self.replay_buffer.write_back(envs, starts, jax.device_get(latents))

        return agent_state, metrics, write_back

    # ------------------------------------------------------------------ predict
    def predict(
        self,
        observation: Any,
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ):
        """RecurrentPPO's protocol: ``state`` = (deter (n, D), stoch (n, S, C), previous action (n, A)),
        env axis first; rows where ``episode_start`` is true (or all, when ``state`` is None) restart.
        Uses its own RNG stream: training and collection are never touched. Calling it again without
        the returned state restarts the agent's memory every step: that warns once per model.
        """
        obs, vectorized = self._predict_batch(observation)
        n = obs.shape[0]
        given_starts = self._check_predict_args(deterministic, episode_start, n)
        self._count_stateless_predict(
            state, episode_start, "is recurrent and forgets everything between such calls"
        )
        cfg = self._config
        if state is None:
            carry = [
                np.zeros((n, cfg.deter), np.float32),
                np.zeros((n, cfg.stoch, cfg.classes), np.float32),
                np.zeros((n, cfg.action_dim), np.float32),
            ]
            starts = np.ones(n, bool)
        else:
            expected = [(n, cfg.deter), (n, cfg.stoch, cfg.classes), (n, cfg.action_dim)]
            shapes = [np.shape(s) for s in state] if isinstance(state, (tuple, list)) else None
            if shapes != expected:
                raise ValueError(
                    f"state must be the (deter, stoch, previous action) tuple that predict returned, with "
                    f"shapes {expected} for {n} observations; got {shapes or type(state).__name__}."
                )
            carry = [np.asarray(s, np.float32) for s in state]
            check_finite_arrays(
                dict(zip(("deter", "stoch", "action"), carry, strict=True)), "state", STATE_FIX
            )
            starts = np.zeros(n, bool) if given_starts is None else given_starts
        key = jax.random.fold_in(self.policy.state["predict_key"], self._predict_calls)
        self._predict_calls += 1
        rows = padded_rows(n)  # one compilation per power of two, not per batch size
        action, carry, _, _ = core.policy_step_jit(
            self._config,
            core.policy_params(self.policy.state["agent"]),
            core.Carry(*(jnp.asarray(pad_rows(x, rows)) for x in carry)),
            jnp.asarray(pad_rows(obs, rows)),
            jnp.asarray(pad_rows(starts, rows)),
            key,
            deterministic=bool(deterministic),
        )
        action = np.asarray(action)[:n]
        refuse_non_finite_actions(action, " in predict")
        env_action = self.action_adapter.to_env(action)
        new_state = tuple(np.asarray(x)[:n] for x in carry)
        if not vectorized:
            env_action = np.asarray(env_action[0])  # SB3 gives a 0-d array for one Discrete action
        return env_action, new_state

    def predict_rollout(self, state: tuple[np.ndarray, ...], actions: Any) -> dict[str, np.ndarray]:
        """What the world model expects if ``actions`` are taken next, open loop (no sampling).

        :param state: the state ``predict`` returned (deter, stoch, previous action), env axis first:
            the model's belief after the last observation it was given.
        :param actions: env actions with the env axis first, (n, T) for Discrete, (n, T, A) for Box;
            the first one is typically the action ``predict`` returned.
        :return: "observation" (n, T, O) predicted (flattened) observations, "reward" (n, T) the
            reward of each step, "continue" (n, T) the probability that the episode goes on, "value"
            (n,) the critic's estimate at the last state, "deter" (n, T, D) the model's states.
        """
        deter, stoch = np.asarray(state[0]), np.asarray(state[1])
        n = deter.shape[0]
        actions = np.asarray(actions)
        event = () if self.action_adapter.discrete else (self._config.action_dim,)
        if actions.ndim != 2 + len(event) or actions.shape[0] != n or actions.shape[2:] != event:
            expected = ", ".join(map(str, (n, "T", *event)))
            raise ValueError(
                f"actions have shape {actions.shape}, expected ({expected}) (env axis first, as the state)."
            )
        steps = actions.shape[1]
        agent_actions = self.action_adapter.from_env(actions.reshape(n * steps, *event))
        out = core.predict_rollout_jit(
            self._config,
            self.policy.state["agent"].params,
            jnp.asarray(deter),
            jnp.asarray(stoch),
            jnp.asarray(agent_actions.reshape(n, steps, -1)),
        )
        return {k: np.asarray(v) for k, v in out.items()}

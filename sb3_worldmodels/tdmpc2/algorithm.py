"""TD-MPC2 as an SB3 algorithm (the numpy side; the math lives in :mod:`.agent`)."""

from __future__ import annotations

import inspect
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels.blocks.episodes import discount_from_episode_length
from sb3_worldmodels.common.agent_hooks import AgentCall, TrainingBatch
from sb3_worldmodels.common.base import WorldModelAlgorithm
from sb3_worldmodels.common.boundary import AgentObservation
from sb3_worldmodels.common.episode_replay import EpisodeReplay
from sb3_worldmodels.common.net_arch import NetArchFields
from sb3_worldmodels.common.predict import pad_rows, padded_rows
from sb3_worldmodels.common.sb3_keywords import refuse_foreign_keywords, take_sb3_alias
from sb3_worldmodels.common.vec_env import vec_agent_steps_per_episode
from sb3_worldmodels.tdmpc2 import agent as core
from sb3_worldmodels.tdmpc2 import networks
from sb3_worldmodels.tdmpc2.config import TDMPC2Config, planner_iterations, preset, seed_settings
from sb3_worldmodels.tdmpc2.upgrade import EarlierCheckpoints

if TYPE_CHECKING:
    from sb3_worldmodels.tdmpc2.multitask import TDMPC2MultiTask

_D = TDMPC2Config()  # the constructor's defaults are the config's
UNKNOWN_LENGTH_DISCOUNT = 0.99
"""The discount of an env that does not state its episode length: SB3's default ``gamma``."""
UNKNOWN_LENGTH_SEED_STEPS = 1000
"""The seed steps of an env that does not state its episode length: the least of the reference's
max(1000, 5 x episode length) (trainer/online_trainer.py@b67b21c)."""
# Fields a single-task agent does not take from a multi-task model (from_multitask).
_NOT_INHERITED = frozenset(
    {"obs_dim", "action_dim", "task_dim", "action_dims", "episode_lengths", "discount", "iterations"}
)


SB3_HINTS = {
    "cadence": "one update per agent step after the seed_steps, as the reference",
    "clip": "grad_clip_norm",
    "entropy": "entropy_coef",
}


class _RolloutState(NamedTuple):
    prev_mean: jax.Array  # (n, H, A) each env's last plan mean (warm start)
    first: np.ndarray  # (n,) bool: the env's next action is the first of its episode (t0)


def _observation_array(obs: AgentObservation) -> np.ndarray:
    """The one observation array the agent reads: the flat vectors (n, O), or the images (n, H, W, C)
    uint8 of an image observation (which comes alone: the config refuses images with vectors)."""
    if isinstance(obs, dict):
        if set(obs) != {"image"}:
            raise ValueError(f"TD-MPC2 takes an image or a vector observation, not both (got {sorted(obs)}).")
        return obs["image"]
    return obs


class TDMPC2(EarlierCheckpoints, WorldModelAlgorithm):
    """TD-MPC2 (nicklashansen/tdmpc2 @b67b21c) for flat observations and Box actions, or 64 x 64
    images (the pixel encoder of the later upstream code, @eece801).

    ``TDMPC2("Pendulum-v1")`` builds ``n_envs`` (1) Monitor-wrapped copies of the env (wrapped in
    :class:`~sb3_worldmodels.envs.wrappers.ActionRepeat` when ``action_repeat`` > 1);
    ``TDMPC2("MlpPolicy", vec_env)`` keeps the VecEnv's own count. ``num_timesteps`` counts agent
    steps (one per env per vector step).

    Every hyperparameter has the name and default of :class:`TDMPC2Config`, where it is documented
    with its source; ``model_size`` picks the preset (1, 5, 19, 48, 317; default 5) and ``enc_dim``,
    ``mlp_dim``, ``latent_dim``, ``num_enc_layers``, ``num_q`` override it. ``learning_rate`` is a
    float or an SB3 schedule (the encoder's rate is ``enc_lr_scale`` times it).

    :param buffer_size: most agent steps kept; the replay holds at most the run's steps.
    :param episode_length: the episode length in simulator steps, for the discount heuristic and
        ``seed_steps``; the agent sees ``episode_length // action_repeat`` steps per episode. None: read
        from the env (its time limit or dm_control's step limit, over its :class:`ActionRepeat`).
        An env that does not state it gets ``discount`` 0.99 (SB3's ``gamma``) and ``seed_steps``
        1000 unless given, with a warning naming ``episode_length``.
    :param iterations: MPPI iterations; 2 more are run when the action has 20 or more dimensions,
        as the reference adds them to the configured count (tdmpc2.py:30@b67b21c).
    :param discount: None for the reference's heuristic from the episode length (tdmpc2.py:31-48@b67b21c).
    :param seed_steps: agent steps of uniform random actions, after which that many updates run in a
        row, then one per agent step (None: max(1000, 5 x episode length in agent steps)).
    :param episodic: learn terminations (head, masked TD targets, planner masks; world_model.py:28@7ec6bc8,
        tdmpc2.py:127-137,258,283-305@7ec6bc8). Without
        it an env that terminates is refused.
    :param num_channels: channels of the pixel encoder's convolutions, for an image observation
        (64 x 64, channel-last or channel-first, e.g. ``make_dmc_env(task, pixels=True, frame_stack=3)``);
        num_channels x 16 must equal ``latent_dim``. None: ``latent_dim // 16`` (32 at model_size 5,
        the reference's; docs/deviations.md T20).
    """

    agent_name = "TD-MPC2"
    allow_discrete = False
    allow_images = True
    space_fields = ("obs_dim", "action_dim", "image_shape")
    default_n_envs = 1
    core = core
    config_class = TDMPC2Config
    preset = staticmethod(preset)
    seed_settings = staticmethod(seed_settings)
    extra_hyperparameters = ("seed_steps", "episode_length")
    replay_class = EpisodeReplay
    device_replay_fields = ("obs",)
    window_setting = "horizon"
    training_batch_axis = 2  # batches (k, H + 1, B, ...)
    stateless_predict_consequence = "loses its plan (the warm start of the next one)"
    # The dynamics, reward, policy and Q MLPs have 2 hidden layers of mlp_dim (world_model.py:24-31@b67b21c).
    net_arch_fields = NetArchFields(
        width="mlp_dim",
        width_sizes="the dynamics, reward, policy and Q networks",
        fixed_depth=2,
        own_choices="activations (Mish after LayerNorm, layers.py@b67b21c) and optimiser (Adam)",
    )
    # Hyperparameters read by the shell (stored by the base class; every config field is one too).
    episode_length: int | None
    seed_steps: int | None
    discount: float | None
    iterations: int

    def __init__(
        self,
        policy: Any = "MlpPolicy",
        env: Any = None,
        n_envs: int | None = None,
        model_size: int = 5,
        enc_dim: int | None = None,
        mlp_dim: int | None = None,
        latent_dim: int | None = None,
        num_enc_layers: int | None = None,
        num_q: int | None = None,
        simnorm_dim: int = _D.simnorm_dim,
        num_channels: int | None = _D.num_channels,
        dropout: float = _D.dropout,
        q_dropout: str = _D.q_dropout,
        dropout_masks: str = _D.dropout_masks,
        num_bins: int = _D.num_bins,
        vmin: float = _D.vmin,
        vmax: float = _D.vmax,
        log_std_min: float = _D.log_std_min,
        log_std_max: float = _D.log_std_max,
        batch_size: int = _D.batch_size,
        reward_coef: float = _D.reward_coef,
        value_coef: float = _D.value_coef,
        consistency_coef: float = _D.consistency_coef,
        rho: float = _D.rho,
        entropy_coef: float = _D.entropy_coef,
        discount: float | None = None,
        episodic: bool = _D.episodic,
        termination_coef: float = _D.termination_coef,
        learning_rate: Any = _D.learning_rate,
        enc_lr_scale: float = _D.enc_lr_scale,
        grad_clip_norm: float = _D.grad_clip_norm,
        tau: float = _D.tau,
        stale_pi_grad_in_clip: bool = _D.stale_pi_grad_in_clip,
        horizon: int = _D.horizon,
        iterations: int = _D.iterations,
        num_samples: int = _D.num_samples,
        num_elites: int = _D.num_elites,
        num_pi_trajs: int = _D.num_pi_trajs,
        min_std: float = _D.min_std,
        max_std: float = _D.max_std,
        temperature: float = _D.temperature,
        matmul_precision: str = _D.matmul_precision,
        compute_dtype: str = _D.compute_dtype,
        buffer_size: int = 1_000_000,
        seed_steps: int | None = None,
        episode_length: int | None = None,
        action_repeat: int = 1,
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
        seed_steps = take_sb3_alias(sb3_kwargs, "learning_starts", "seed_steps", seed_steps, None)
        discount = take_sb3_alias(sb3_kwargs, "gamma", "discount", discount, None)
        refuse_foreign_keywords(type(self), sb3_kwargs, SB3_HINTS)
        super().__init__(
            policy,
            env,
            self._hyperparameters(locals()),
            learning_rate=learning_rate,
            buffer_size=buffer_size,
            learning_starts=0,
            batch_size=batch_size,
            gamma=_D.discount if discount is None else discount,  # set from the env in _setup_model
            tau=tau,
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

    # ------------------------------------------------------------------ from a multi-task model
    @classmethod
    def from_multitask(
        cls, model: TDMPC2MultiTask, task: str, env: Any, policy: Any = "MlpPolicy", **kwargs: Any
    ) -> TDMPC2:
        """A single-task agent for ``task`` initialised from the multi-task ``model``, that then learns
        online as any TDMPC2 (fine-tuning).

        The agent has the model's architecture and hyperparameters (``kwargs`` override them, e.g.
        ``seed_steps`` to shorten the random phase, ``action_repeat``), the discount of ``env``'s
        episode length, and the model's networks specialised to the task
        (:func:`~sb3_worldmodels.tdmpc2.networks.single_task_params`): the task's embedding is a fixed
        constant of each first layer (folded into its bias), the padded observation and action columns
        are dropped. The Q scale is the model's; the optimisers and the replay start fresh.

        :param env: an env (or VecEnv, or id) with the task's own spaces: Box observations of the
            task's width (or a Dict that flattens to it) and its number of actions.
        """
        if model.seeds is not None:
            raise ValueError(
                f"from_multitask takes one model; this is a seed group (seeds {list(model.seeds)}): pass "
                "one seed's model, group.seed_model(i)."
            )
        k = model.task_id(task)
        c = model.config
        inherited = {
            name: getattr(c, name)
            for name in c.__dataclass_fields__
            if name not in _NOT_INHERITED and name in _CONSTRUCTOR_ARGS
        }
        agent = cls(policy, env, model_size=model.model_size, **{**inherited, **kwargs})
        if agent._config.image_shape:
            raise ValueError(
                f"the env observes images {agent._config.image_shape}; multi-task models are state-based "
                "(their encoder reads the state vector and the task embedding): give an env of the task's "
                "state observations."
            )
        ours = (agent._config.obs_dim, agent._config.action_dim)
        theirs = (model.obs_dims[k], c.action_dims[k])
        if ours != theirs:
            raise ValueError(
                f"the env has {ours[0]} observation values and {ours[1]} action dims; task {task!r} of the "
                f"multi-task model has {theirs[0]} and {theirs[1]}: give an env of that task."
            )
        params, target = networks.single_task_params(c, model.state.params, model.state.target_qs, k, ours[0])
        state = agent.policy.state
        if not (
            networks.same_layout(params, state["agent"].params)
            and networks.same_layout(target, state["agent"].target_qs)
        ):
            raise ValueError(
                f"{', '.join(sorted(kwargs))} change the networks' shapes: the agent cannot take the "
                "multi-task model's parameters (leave the architecture to the model)."
            )
        agent_state = core.with_params(agent._config, state["agent"], params, target)
        agent_state = agent_state._replace(scale=model.state.scale)
        agent.policy.state = {**state, "agent": agent_state}
        return agent

    # ------------------------------------------------------------------ set-up
    @property
    def agent_episode_length(self) -> int | None:
        """Agent steps per episode: ``episode_length // action_repeat`` when given, else what the env
        says (:func:`~sb3_worldmodels.envs.wrappers.agent_steps_per_episode`), else None."""
        if self.episode_length is not None:
            return max(1, int(self.episode_length) // max(1, int(self.action_repeat)))
        if self.env is None:
            return None
        return vec_agent_steps_per_episode(self.env)

    def _resolve_config_defaults(self) -> None:
        """Fix the env-derived defaults once (they are then saved with the model): the discount from
        the episode length and seed_steps = max(1000, 5 T) (tdmpc2.py:35-48, trainer/online_trainer.py
        @b67b21c, with T the episode's agent steps as the reference's ``episode_length``). An env that
        does not state its length gets SB3's gamma and the reference's least seed_steps instead
        (:data:`UNKNOWN_LENGTH_DISCOUNT`, :data:`UNKNOWN_LENGTH_SEED_STEPS`), with one warning."""
        if self.discount is not None and self.seed_steps is not None:
            return
        length = self.agent_episode_length
        if length is None:
            self._resolve_without_episode_length()
            return
        if self.discount is None:
            self.discount = discount_from_episode_length(length)
        if self.seed_steps is None:
            self.seed_steps = max(1000, 5 * length)

    def _resolve_without_episode_length(self) -> None:
        """The defaults of an env whose episode length is unknown, and the warning that names them."""
        taken = []
        if self.discount is None:
            self.discount = UNKNOWN_LENGTH_DISCOUNT
            taken.append(f"discount (gamma) = {UNKNOWN_LENGTH_DISCOUNT}, SB3's default")
        if self.seed_steps is None:
            self.seed_steps = UNKNOWN_LENGTH_SEED_STEPS
            taken.append(f"seed_steps (learning_starts) = {UNKNOWN_LENGTH_SEED_STEPS}, the reference's least")
        warnings.warn(
            "TD-MPC2 sets its discount and seed_steps from the episode length, and this env does not "
            "state it (no TimeLimit, spec max_episode_steps or dm_control step limit found): it takes "
            f"{' and '.join(taken)}. Pass episode_length=<simulator steps per episode> for the "
            "reference's values (or gamma= and learning_starts= to choose them).",
            stacklevel=2,
        )

    @property
    def _seed_steps(self) -> int:
        """``seed_steps`` once resolved (by :meth:`_resolve_config_defaults`, before any step)."""
        if self.seed_steps is None:
            raise RuntimeError("seed_steps is resolved when the model is set up.")
        return int(self.seed_steps)

    def _space_config(self) -> dict[str, Any]:
        # The reference adds 2 iterations for actions of 20+ dimensions (tdmpc2.py:30@b67b21c).
        dims = super()._space_config()
        return {
            **dims,
            "image_shape": self.obs_adapter.image_shape,
            "iterations": planner_iterations(self.iterations, dims["action_dim"]),
        }

    def _replay_fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        # "obs" holds the one observation: the float32 vector, or the uint8 image (as the reference's
        # buffer keeps its pixel observations' uint8 frames under "obs").
        cfg = self._config
        if cfg.image_shape:
            obs: tuple[tuple[int, ...], np.dtype] = (tuple(cfg.image_shape), np.dtype(np.uint8))
        else:
            obs = ((cfg.obs_dim,), np.dtype(np.float32))
        return {
            "obs": obs,
            "action": ((cfg.action_dim,), np.dtype(np.float32)),
            "reward": ((), np.dtype(np.float32)),
            "terminated": ((), np.dtype(np.float32)),
        }

    def _replay_options(self) -> dict[str, Any]:
        return {"include_last_window": self._config.episodic}

    def _replay_for_run(self, total_timesteps: int, reset_num_timesteps: bool) -> tuple[EpisodeReplay, int]:
        # Whole episodes, at most the run's steps (and at least one window).
        total = total_timesteps + (0 if reset_num_timesteps else self.num_timesteps)
        capacity = max(min(int(self.buffer_size), int(total)), self._replay_window)
        replay = self.replay_buffer if self.replay_buffer is not None else self._new_replay(capacity)
        return replay, capacity

    # ------------------------------------------------------------------ collection
    def _act_call(self, observation: AgentObservation, learning_starts: int) -> AgentCall:
        obs = _observation_array(observation)
        cfg = self._config
        n = self.n_envs
        if self._rollout is None:  # fresh observations after a reset: every env starts an episode
            self.replay_buffer.discard_running()
            self._start_episodes(np.arange(n), obs)
            self._rollout = _RolloutState(
                jnp.zeros((n, cfg.horizon, cfg.action_dim), jnp.float32), np.ones(n, bool)
            )
        roll = self._rollout
        if self.num_timesteps <= self._seed_steps:  # the seed phase: uniform random actions

            def finish_random(action: Any) -> np.ndarray:
                self._current_action = np.asarray(action)
                return self._current_action

            return AgentCall(core.seed_actions_jit, _no_state, (), {"n_envs": n}, finish_random)

        def finish(outputs: Any) -> np.ndarray:
            action, mean = outputs
            self._rollout = roll._replace(prev_mean=mean)  # stays on the device: the next plan's
            self._current_action = np.asarray(action)
            return self._current_action

        arguments = (obs, roll.prev_mean, roll.first)  # numpy: the call transfers them
        return AgentCall(core.act_jit, _agent_params, arguments, {"deterministic": False}, finish)

    def _start_episodes(self, envs: np.ndarray, obs: np.ndarray) -> None:
        k = len(envs)
        cfg = self._config
        self.replay_buffer.add_entries(
            envs,
            {
                "obs": obs,
                "action": np.zeros((k, cfg.action_dim), np.float32),
                "reward": np.zeros(k, np.float32),
                "terminated": np.zeros(k, np.float32),
            },
        )

    def _collect_observe(
        self, observation: AgentObservation, rewards: np.ndarray, dones: np.ndarray, infos: list[dict]
    ) -> None:
        obs = _observation_array(observation)
        n = self.n_envs
        # Episodes that ended at the previous step become sampleable now: the reference adds a
        # finished episode to its buffer at the start of the next step (trainer/online_trainer.py
        # @b67b21c), so the updates of the step that ends it do not see it yet.
        self.replay_buffer.store_finished()
        dones = np.asarray(dones, bool)
        truncated = np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos])
        terminated = dones & ~truncated
        if terminated.any() and not self._config.episodic:
            raise ValueError(
                "The env terminated an episode (done without TimeLimit.truncated), but TD-MPC2 as in its "
                "paper's code only handles episodes that end by a time limit. Pass episodic=True to learn "
                "terminations (termination head, masked TD targets and planner masks of the later code)."
            )
        reached = obs.copy()
        if dones.any():
            reached[dones] = _observation_array(self._terminal_observations(infos, np.flatnonzero(dones)))
        self.replay_buffer.add_entries(
            np.arange(n),
            {
                "obs": reached,
                "action": self._current_action.astype(np.float32),
                "reward": np.asarray(rewards, np.float32),
                "terminated": terminated.astype(np.float32),
            },
        )
        running, capacity = self.replay_buffer.longest_running, self.replay_buffer.capacity_steps
        if running > capacity:
            raise ValueError(
                f"An episode has run for {running} agent steps without ending, more than the replay holds "
                f"({capacity} steps: min(buffer_size, the run's steps)). TD-MPC2 learns from finished "
                "episodes: end them with a time limit (gymnasium.wrappers.TimeLimit) or raise buffer_size."
            )
        for i in np.flatnonzero(dones):
            self.replay_buffer.finish_episode(int(i))
        if dones.any():
            self._start_episodes(np.flatnonzero(dones), obs[dones])
        self._rollout = self._rollout._replace(first=dones.copy())
        self._owed_updates += self._step_updates(self.num_timesteps - n, self.num_timesteps)

    def _step_updates(self, before: int, after: int) -> int:
        """The updates a vector step from ``before`` to ``after`` agent steps owes: the reference's
        schedule, per agent step s (0-based), seed_steps updates at s == seed_steps, then one per step."""
        seed_steps = self._seed_steps
        burst = seed_steps if before <= seed_steps < after else 0
        return burst + max(0, after - max(before, seed_steps + 1))

    # ------------------------------------------------------------------ training
    def _updates_before_step(self) -> int:
        # The step's batches never hold its own transitions: they are sampled from stored episodes
        # only, and the episodes that ended at the previous step are stored first, as the step's
        # observation would store them.
        self.replay_buffer.store_finished()
        if self._n_updates == 0 or self.replay_buffer.num_episodes == 0:
            return 0  # the seed phase's burst runs after its step, in calls of its own
        before = self.num_timesteps
        due = self._owed_updates + self._step_updates(before, before + self.n_envs)
        return due if due == self._updates_per_call else 0

    def _take_owed_updates(self) -> int:
        if self.replay_buffer.num_episodes == 0:  # updates wait for the first finished episode
            # Said once an episode runs past its stated length (or 1000 steps when unknown): an episode
            # that is merely longer than the seed phase is no sign of an env that never ends.
            overdue = self.replay_buffer.longest_running > (self.agent_episode_length or 1000)
            if self._owed_updates and overdue and not getattr(self, "_warned_no_episode", False):
                self._warned_no_episode = True
                warnings.warn(
                    f"TD-MPC2 owes {self._owed_updates} updates but no episode has finished after "
                    f"{self.num_timesteps} steps: it trains on finished episodes only. If the env never "
                    "ends an episode, wrap it in gymnasium.wrappers.TimeLimit.",
                    stacklevel=2,
                )
            return 0
        owed, self._owed_updates = self._owed_updates, 0
        return owed

    @property
    def _updates_per_call(self) -> int:
        return self.n_envs

    def _training_batch(self, k: int) -> TrainingBatch:
        # (k, H+1, B, ...); with replay_on_device the observations' slots (k, H+1, B)
        batch = self.replay_buffer.sample(self._local_batch_size, count=k, rows_of=self._device_fields())
        batch = {
            "obs": batch["obs"],
            "action": batch["action"][:, 1:],
            "reward": batch["reward"][:, 1:],
            "terminated": batch["terminated"][:, 1:],
        }
        return TrainingBatch(batch, _nothing)

    # ------------------------------------------------------------------ predict
    def predict(
        self,
        observation: Any,
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        seed_index: int | None = None,
    ):
        """RecurrentPPO's protocol with ``state`` = (plan mean (n, H, A),): each env's previous plan,
        the warm start of the next; rows where ``episode_start`` is true (or all, when ``state`` is
        None) plan from scratch. ``deterministic=True`` is the reference's eval mode (no exploration
        noise on the chosen action; the planner's own sampling stays), and its randomness is drawn from a
        key derived from each row's inputs: the same observation and state give the same action,
        whatever was predicted before and after save/load. ``deterministic=False`` samples from the
        model's own predict stream (training and collection are never touched). Images are shifted
        by the augmentation in both modes, as the reference's every encode (tdmpc2.py:112-117,153
        @eece801), with offsets drawn from the same key. A seed group acts for the seed of index
        ``seed_index`` (required), as ``seed_model(seed_index)``."""
        if seed_index is not None or self.seeds is not None:
            return self._seed_call(seed_index, "predict", observation, state, episode_start, deterministic)
        inputs, vectorized, (prev,), first = self._predict_inputs(
            observation, state, episode_start, deterministic
        )
        obs = _observation_array(inputs)
        cfg, n = self._config, obs.shape[0]
        used_plan = np.where(first[:, None, None], 0.0, prev)  # a restart ignores the plan
        keys = self._predict_keys(bool(deterministic), obs, used_plan, first)
        rows = padded_rows(n)  # one compilation per power of two, not per batch size
        action, mean = core.act_jit(
            cfg,
            self._local_agent_state().params,
            jnp.asarray(pad_rows(obs, rows)),
            jnp.asarray(pad_rows(prev, rows)),
            jnp.asarray(pad_rows(first, rows)),
            jnp.asarray(pad_rows(keys, rows)),
            deterministic=bool(deterministic),
        )
        return self._env_actions(np.asarray(action)[:n], vectorized), (np.asarray(mean)[:n],)

    def predict_rollout(
        self,
        observation: Any,
        actions: Any,
        state: Any = None,
        episode_start: Any = None,
        seed_index: int | None = None,
    ) -> dict[str, np.ndarray]:
        """What the world model expects if ``actions`` are taken from ``observation``, open loop.

        :param observation: one observation or a batch (n, ...), as for ``predict``.
        :param actions: env actions (T, A) for one observation, or (n, T, A). For the plan returned as
            ``predict``'s state (agent units, [-1, 1]) use :meth:`predict_plan_rollout`.
        :param state: accepted as for ``predict`` (and ``episode_start``) and not used: the model is
            Markov, its latent is the observation's encoding (an image's without the shift
            augmentation: nothing is sampled here).
        :param seed_index: for a seed group, the index of the seed whose model predicts (required).
        :return: "reward" (n, T) predicted rewards, "value" (n,) the Q estimate after the last action,
            "latent" (n, T + 1, L), and "continue" (n, T) when ``episodic``; without the n axis for
            one observation.
        """
        return super().predict_rollout(observation, actions, state, episode_start, seed_index)

    def predict_plan_rollout(
        self, observation: Any, plan: Any, seed_index: int | None = None
    ) -> dict[str, np.ndarray]:
        """:meth:`predict_rollout` along a plan in agent units, e.g. ``predict``'s state[0] (n, H, A);
        a seed group's seed named by ``seed_index``."""
        if seed_index is not None or self.seeds is not None:
            return self._seed_call(seed_index, "predict_plan_rollout", observation, plan)
        return self._predict_rollout(observation, plan, None, None, agent_units=True)

    def _predict_state_shapes(self, n: int) -> dict[str, tuple[int, ...]]:
        return {"plan": (n, self._config.horizon, self._config.action_dim)}

    def _open_loop(
        self, obs: AgentObservation, actions: np.ndarray, carried: list[np.ndarray], starts: np.ndarray
    ) -> dict[str, Any]:
        return core.predict_rollout_jit(
            self._config,
            self._local_agent_state().params,
            jnp.asarray(_observation_array(obs)),
            jnp.asarray(actions),
        )


def _nothing() -> None:
    """A training call with no side effect to apply."""


def _agent_params(state: core.TDMPC2State) -> dict:
    """What the planner reads of the agent's state."""
    return state.params


def _no_state(state: core.TDMPC2State) -> None:
    """What the seed phase's random actions read of the agent's state: nothing."""
    return None


_CONSTRUCTOR_ARGS = frozenset(inspect.signature(TDMPC2.__init__).parameters)

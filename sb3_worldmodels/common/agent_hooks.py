"""The contract between the SB3 shell and an agent: what an agent class provides, written once.

:class:`~sb3_worldmodels.common.base.WorldModelAlgorithm` is SB3's off-policy algorithm around a
pure-JAX core; a subclass (``DreamerV3``, ``TDMPC2``) fills in the class attributes and implements
the abstract hooks below. The shell calls them and owns everything else: the SB3 keywords, the env
loop and its checks, predict's argument checks, the checkpoint format and the training calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from sb3_worldmodels.common.boundary import ActionAdapter, AgentObservation, ObservationAdapter
    from sb3_worldmodels.common.net_arch import NetArchFields


class AgentCall(NamedTuple):
    """One acting call of a core's jitted function, as an agent hook describes it: the shell makes the
    call (``function(config, reads(agent_state), *arguments, key, **static)``, the key drawn from the
    collection stream inside the call's program) and hands its outputs (device arrays) to ``finish``."""

    function: Any
    """The core's jitted function (:class:`~sb3_worldmodels.blocks.jit.AgentFunction`); its last
    positional argument is its PRNG key."""
    reads: Callable[[Any], Any]
    """The part of the agent's state the function takes first (e.g. the acting parameters)."""
    arguments: tuple[Any, ...]
    """Its other arguments (arrays) before the key."""
    static: dict[str, Any]
    """Its static keyword arguments."""
    finish: Callable[[Any], np.ndarray]
    """The call's outputs -> the agent's result, e.g. (n_envs, A) actions: it fetches to the host only
    what the host needs (outputs carried to the next call stay on the device)."""


class TrainingBatch(NamedTuple):
    """What one training call needs from the agent's numpy side."""

    batch: Any
    """The pytree of k sampled batches (numpy arrays) that ``core.train_many_jit(config, state,
    batch)`` takes."""
    commit: Callable[..., None]
    """Applies the call's side effects, given its outputs after (state, metrics) (e.g. DreamerV3's
    latents written back to the replay); called only once the metrics are finite."""


class AgentHooks(ABC):
    """What an agent class provides to the shell (class attributes and hooks), and the shell's
    attributes a hook may read (besides ``self.policy.state``: {"agent": the core's state,
    "act_key": collection's key, "predict_key": predict's stream})."""

    # ------------------------------------------------------------------ the agent's class attributes
    agent_name = "world model agent"
    """The agent's name in messages."""
    allow_discrete = True
    """Whether Discrete action spaces are accepted."""
    allow_images = False
    """Whether image observations are accepted."""
    default_n_envs = 1
    """Envs built from an env id when ``n_envs`` is not given."""
    core: Any
    """The agent's pure core module: ``init_state(config, key)``, ``set_learning_rate(state, lr)`` and
    ``train_many_jit(config, state, batch) -> (state, metrics with a leading k, *outputs)``."""
    config_class: Any
    """The agent's frozen config dataclass; its fields (less the space-derived ones and
    ``learning_rate``) are constructor arguments and attributes of the same names."""
    preset: Callable[..., Any]
    """``preset(model_size, **fields)``: the validated config of a model size with overrides."""
    seed_settings: Callable[..., Any]
    """``seed_settings(config, {field: S values})``: the config of a seed group's calls with float
    fields given one value per seed (refusing, with the reason, what cannot vary per seed)."""
    space_fields: tuple[str, ...] = ("obs_dim", "action_dim")
    """Config fields set from the spaces, not by the user."""
    extra_hyperparameters: tuple[str, ...] = ()
    """Constructor arguments stored as attributes that are not config fields."""
    replay_class: Any
    """The replay's class, built by the shell with :meth:`_replay_fields` and :meth:`_replay_options`."""
    window_setting: str
    """The hyperparameter whose value + 1 is the replay's window length (its sampled rows)."""
    training_batch_axis: int
    """The batch axis of the arrays of :meth:`_training_batch` (after the leading k), along which
    ``data_parallel=True`` splits them over the devices."""
    device_replay_fields: tuple[str, ...] = ()
    """Replay fields the training calls may read from device memory (``replay_on_device``), given by
    :meth:`_training_batch` as row indices when :meth:`_device_fields` names them."""
    stateless_predict_consequence = "forgets its state between such calls"
    """What the stateless-``predict`` warning says the agent loses."""
    nan_allowed_metrics: tuple[str, ...] = ()
    """Metric prefixes that are NaN by design (not refused as a non-finite update)."""
    net_arch_fields: NetArchFields
    """Where the config takes SB3's ``policy_kwargs=dict(net_arch=...)``."""
    schedule_attributes: tuple[str, ...] = ()
    """The attributes of the agent's own training schedule besides ``num_timesteps``, ``_n_updates``
    and ``_owed_updates``: a seed group saves them per seed (a single-seed model saves every attribute)."""

    # ------------------------------------------------------------------ the shell's attributes
    obs_adapter: ObservationAdapter
    action_adapter: ActionAdapter
    replay_buffer: Any
    """An instance of ``replay_class`` (None before the first ``learn``)."""
    _config: Any
    """The resolved config (an instance of ``config_class``)."""
    _rollout: Any
    """The agent's per-env collection state; None when every env starts an episode (the shell
    resets it after ``env.reset``)."""
    _owed_updates: int
    """Updates the agent's schedule owes and the next training call runs."""

    def _settle_training(self, refuse: bool = True) -> None:
        """The shell's (:class:`~sb3_worldmodels.common.training.Trainer`): check, commit and log the
        training call that is still unsettled, if any."""
        raise NotImplementedError

    def _train_before_step(self) -> None:
        """The shell's (:class:`~sb3_worldmodels.common.training.Trainer`): the coming step's training
        call before its env step, where :meth:`_updates_before_step` allows it."""
        raise NotImplementedError

    # ------------------------------------------------------------------ collection
    @abstractmethod
    def _act_call(self, obs: AgentObservation, learning_starts: int) -> AgentCall:
        """The acting call for the current observations ``obs`` (n_envs, O) (with images, an
        :data:`~sb3_worldmodels.common.boundary.AgentObservation` dict), every vector step one (random
        actions too: their key comes from the same stream); its ``finish`` gives the (n_envs, A)
        agent-unit actions."""

    @abstractmethod
    def _collect_observe(
        self, obs: AgentObservation, rewards: np.ndarray, dones: np.ndarray, infos: list[dict]
    ) -> None:
        """Record a vector step's outcome: ``obs`` (n_envs, O) flattened, (n_envs,) ``rewards`` and
        ``dones``, SB3's ``infos``: replay rows, episode starts, and the updates owed
        (``self._owed_updates``)."""

    def _rows_in_step(self, dones: np.ndarray) -> int:
        """How much ``num_timesteps`` advances for one vector step (default: one per env)."""
        return len(dones)

    # ------------------------------------------------------------------ replay
    @abstractmethod
    def _replay_fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Name -> (per-row shape, dtype) of each replay field."""

    def _replay_options(self) -> dict[str, Any]:
        """Further keyword arguments of the agent's replay class (default: none)."""
        return {}

    @abstractmethod
    def _replay_for_run(self, total_timesteps: int, reset_num_timesteps: bool) -> tuple[Any, int]:
        """The replay this run writes to (the current one, or a new one from ``_new_replay``) and the
        argument of its ``reserve``: room for every row the run can write."""

    # ------------------------------------------------------------------ training
    @property
    @abstractmethod
    def _updates_per_call(self) -> int:
        """Updates scanned in one jitted call (one distinct compilation)."""

    @abstractmethod
    def _training_batch(self, k: int) -> TrainingBatch:
        """k batches sampled from the replay for one call of ``core.train_many_jit`` (each array with a
        leading k), and what to apply once the call's metrics are known to be finite."""

    def _updates_before_step(self) -> int:
        """The updates the coming vector step will owe (those owed already included), when their
        training call may run before its env step: one call's worth (``_updates_per_call``), whose
        batches cannot hold the step's transitions and whose count does not depend on the step's
        outcome. 0 (the default): they run after the step. The shell takes them after the step as
        usual (``_take_owed_updates`` must then give this count)."""
        return 0

    def _take_owed_updates(self) -> int:
        """The number of updates to run now (and forget them); 0 while training cannot start.
        Default: every update owed."""
        owed, self._owed_updates = self._owed_updates, 0
        return owed

    def _reset_training_schedule(self) -> None:
        """Forget the updates owed (a run that restarts its step counter); an agent with a schedule
        of its own restarts it too."""
        self._owed_updates = 0

    # ------------------------------------------------------------------ predict
    @abstractmethod
    def predict(
        self,
        observation: Any,
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[Any, tuple[np.ndarray, ...]]:
        """RecurrentPPO's protocol: (env actions, the state to pass back). Built from the shell's
        ``_predict_inputs`` (checked inputs), ``_predict_keys`` (the key rule) and ``_env_actions``."""

    @abstractmethod
    def _predict_state_shapes(self, n: int) -> dict[str, tuple[int, ...]]:
        """Name -> shape of each array of ``predict``'s state for n observations."""

    @abstractmethod
    def _open_loop(
        self, obs: AgentObservation, actions: np.ndarray, carried: list[np.ndarray], starts: np.ndarray
    ) -> dict[str, Any]:
        """The agent's open-loop predictions from flat observations ``obs`` (n, O) along agent
        ``actions`` (n, T, A), given ``predict``'s checked state ``carried`` and (n,) ``starts``."""

    # ------------------------------------------------------------------ set-up
    def _resolve_config_defaults(self) -> None:  # noqa: B027 (optional hook, nothing to do by default)
        """Fix hyperparameters whose default depends on the env (called before the config is built)."""

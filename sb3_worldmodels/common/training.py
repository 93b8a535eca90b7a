"""Training calls: the updates an agent's schedule owes, run in jitted chunks, checked and logged.

After each vector step SB3 calls ``train``; the agent's collection hook has added the updates its
schedule owes to ``_owed_updates`` (the one name of that count in every agent), and ``train`` runs
them in calls of ``_updates_per_call`` updates (one compiled program: a call of fewer is padded),
refuses any update that produced NaN or inf before its state is kept, and logs each call's metrics.

Inside ``learn`` the last call of a ``train`` is *settled* later (:meth:`Trainer._settle_training`):
its metrics and outputs are fetched, checked, committed and logged once the next acting call has
been dispatched behind it, so that the host does that work while the device acts instead of waiting
for the update first. Nothing reads the state in between but the acting call, whose outputs are
dropped when the update is refused: the refusal, the state kept and every log and callback are as if
the call had been checked at once (the error comes from the next step's acting call, before its env
step). The last ``train`` of a ``learn`` settles at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import jax
import numpy as np
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

from sb3_worldmodels.blocks.devices import BatchPlacement
from sb3_worldmodels.blocks.jit import AgentFunction, agent_jit
from sb3_worldmodels.blocks.seeds import counted_updates
from sb3_worldmodels.blocks.stored_rows import with_stored_rows
from sb3_worldmodels.common.agent_hooks import AgentHooks
from sb3_worldmodels.common.callbacks import WorldModelCallback, record_extra_metrics
from sb3_worldmodels.common.device_replay import fields_on_device, updated_copies
from sb3_worldmodels.common.policy import JaxPolicy
from sb3_worldmodels.common.processes import ProcessSpan

_TRAINING_CALLS: dict[Any, AgentFunction] = {}


@jax.tree_util.register_pytree_node_class
class PackedMetrics:
    """A training call's metrics {name: (..., K)} with the float32 ones in one array (..., K, n), so
    that they reach the host in one transfer, not one per metric (a device round trip each on an
    accelerator). The names are the pytree's static part: they come back with the values."""

    def __init__(self, values: Any, names: tuple[str, ...], rest: dict[str, Any], order: tuple[str, ...]):
        self.values = values
        self.names = names
        self.rest = rest
        self.order = order

    @classmethod
    def pack(cls, metrics: dict[str, Any]) -> PackedMetrics:
        names = tuple(key for key, value in metrics.items() if value.dtype == np.float32)
        rest = {key: value for key, value in metrics.items() if key not in names}
        values = jax.numpy.stack([metrics[key] for key in names], axis=-1) if names else None
        return cls(values, names, rest, tuple(metrics))

    def unpack(self) -> dict[str, Any]:
        """{name: (..., K)} in the metrics' own order (a float32 metric a view of the values)."""
        columns = {name: self.values[..., j] for j, name in enumerate(self.names)}
        return {key: columns[key] if key in columns else self.rest[key] for key in self.order}

    def tree_flatten(self) -> tuple[tuple[Any, Any], tuple[tuple[str, ...], tuple[str, ...]]]:
        return (self.values, self.rest), (self.names, self.order)

    @classmethod
    def tree_unflatten(cls, static: tuple[tuple[str, ...], tuple[str, ...]], children: Any) -> PackedMetrics:
        return cls(children[0], static[0], children[1], static[1])


def training_call(core: Any) -> AgentFunction:
    """The training call of an agent's ``core`` module: ``fn(config, state, batches, count) ->
    (state, PackedMetrics, *extra)`` with K batches (the agent's ``_updates_per_call``) that runs the
    first ``count`` of them (None: all), :func:`~sb3_worldmodels.blocks.seeds.counted_updates` of the
    core's ``train_step`` (the fields named in ``stores``, ``{name: StoredRows}``, given as row indices
    into device memory: ``replay_on_device``), its metrics packed (:class:`PackedMetrics`). Every call
    of a run has the same K, so a run compiles one training program whatever its schedule owes."""
    if core not in _TRAINING_CALLS:
        counted = counted_updates(core.train_step)

        def packed(
            config: Any, state: Any, batches: Any, count: Any = None, stores: Any = None
        ) -> tuple[Any, ...]:
            batches = with_stored_rows(batches, stores)  # fields drawn as indices into device memory
            state, metrics, *extra = counted(config, state, batches, count)  # inlined in this program
            return (state, PackedMetrics.pack(metrics), *extra)

        name = f"counted_{getattr(core.train_step, '__name__', 'train_step')}"
        packed.__name__ = packed.__qualname__ = name  # the program's name
        _TRAINING_CALLS[core] = agent_jit(packed)
    return _TRAINING_CALLS[core]


def training_chunks(owed: int, size: int) -> list[int]:
    """The updates of each training call for ``owed`` updates in calls of ``size``: full calls, then
    single updates (each call's batches are sampled after the previous call's side effects, e.g.
    DreamerV3's latents written back to the replay)."""
    return [size] * (owed // size) + [1] * (owed % size)


def pad_updates(batch: Any, size: int) -> Any:
    """A (numpy) batch of k <= ``size`` updates (leading k) padded with zeros to ``size`` updates:
    the padding is never read (:func:`training_call` runs the first k)."""

    def pad(leaf: Any) -> Any:
        rows = leaf.shape[0]
        if rows == size:
            return leaf
        return np.concatenate([leaf, np.zeros((size - rows, *leaf.shape[1:]), leaf.dtype)])

    return jax.tree_util.tree_map(pad, batch)


class NonFiniteUpdateError(FloatingPointError):
    """An update produced NaN or inf; the model keeps its parameters from before it."""


class CallResults(NamedTuple):
    """A training call's results, on the device: K updates' metrics and outputs of which the first
    ``k`` ran, and the side effects to apply once they are checked."""

    metrics: PackedMetrics
    outputs: tuple[Any, ...]
    k: int
    commit: Callable[..., None]
    processes: BatchPlacement | None = None
    """The placement of a batch split over several processes' devices (None: this process's)."""

    def copy_to_host_async(self) -> None:
        """Start the transfers of the metrics and outputs (they run while the host does other work)."""
        copy_to_host_async((self.metrics, self.outputs))

    def fetch(self, batch_axis: int = 0) -> tuple[dict[str, np.ndarray], tuple[Any, ...]]:
        """(numpy metrics {name: (k,)}, the outputs with a leading k): one transfer each, sliced in
        numpy; over several processes, the metrics of the local replica and this process's rows of the
        outputs along ``batch_axis``."""
        if self.processes is not None:
            metrics = self.processes.to_host(self.metrics)
            outputs = self.processes.local_rows(self.outputs, batch_axis)
        else:
            metrics, outputs = jax.device_get((self.metrics, self.outputs))
        return jax.tree_util.tree_map(lambda x: x[: self.k], (metrics.unpack(), outputs))


@dataclasses.dataclass
class _Round:
    """The calls of one ``train``: the updates owed, the learning rate, each settled call's metrics."""

    owed: int
    lr: float
    metrics: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)


class _Unsettled(NamedTuple):
    """A training call dispatched and not yet checked."""

    round: _Round
    before: Any  # the agent state before the call: kept when one of its updates is refused
    results: CallResults
    done: int  # the updates of the same ``train`` before it

    def copy_to_host_async(self) -> None:
        self.results.copy_to_host_async()


class _Staged(NamedTuple):
    """A step's training call dispatched before its env step, kept apart until ``train`` takes it."""

    unsettled: _Unsettled
    state: Any  # the call's new agent state
    timesteps: int  # num_timesteps after the step
    sampled: Any  # the replay's random state after the call's batches were drawn


T = TypeVar("T")


def draws_undone(rngs: Sequence[np.random.Generator], draw: Callable[[], T]) -> tuple[T, list[Any]]:
    """``draw()`` with the generators put back as they were before it: (its result, their states after
    it, which a later taker of the result restores so that the generators go on as if it had drawn)."""
    before = [rng.bit_generator.state for rng in rngs]
    result = draw()
    after = [rng.bit_generator.state for rng in rngs]
    for rng, state in zip(rngs, before, strict=True):
        rng.bit_generator.state = state
    return result, after


def copy_to_host_async(tree: Any) -> None:
    """Start the device-to-host transfer of every array of ``tree`` this process holds whole."""
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jax.Array) and leaf.is_fully_addressable:
            leaf.copy_to_host_async()


def aggregate_metric(key: str, values: np.ndarray) -> float:
    """The mean of one metric over a call's updates.

    Split statistics (``*stats/*``, see :func:`~sb3_worldmodels.blocks.distributions.balance_stats`)
    are NaN in updates whose batch lacks a class and are averaged over the others (NaN when all
    lack it), as the reference aggregates them; every other metric keeps a NaN visible.
    """
    if values.shape == (1,):  # one update (the mean of one value is the value, NaN or not)
        return float(values[0])
    if "stats/" in key:
        finite = values[~np.isnan(values)]
        return float(finite.mean()) if finite.size else float("nan")
    return float(np.mean(values))


class Trainer(ProcessSpan, AgentHooks, OffPolicyAlgorithm):
    """SB3's ``train`` for the agents, and the learning rate they read at every training call."""

    policy: JaxPolicy
    _wm_callbacks: list[WorldModelCallback]
    action_repeat: int
    _batch_placement: BatchPlacement | None
    """Where ``data_parallel=True`` splits the training batches (None: one device, or not asked);
    under ``jax.distributed``, over every process's devices."""
    _rates_written: tuple[Any, bytes] | None
    """(the agent state the last training call returned, the learning rates it holds as bytes)."""
    _unsettled: Any
    """The training call that settles at the next acting call (an ``_Unsettled``; a seed group's
    ``GroupCall``, which the group settles), None when every call is settled."""
    _staged: Any
    """The training call dispatched before the current step's env step (a ``_Staged``, a seed group's
    ``GroupStaged``; None: none)."""
    _learning: bool
    """Whether ``learn`` is running."""
    _total_timesteps: int

    def train(self, gradient_steps: int, batch_size: int = 0) -> None:
        """Run the updates the agent's schedule owes (SB3's ``gradient_steps`` is ignored), in
        jitted calls of ``_updates_per_call`` updates (and single updates for the rest), each through
        the one program of that size (:func:`training_call`); inside ``learn`` the last call settles
        at the next acting call (the module's docstring)."""
        self._settle_training()
        staged, self._staged = getattr(self, "_staged", None), None
        owed = self._take_run_updates()
        if staged is not None and self._takes_staged(staged, owed):
            self._keep_training_call(staged.unsettled, staged.state, last=True)
            return
        if owed <= 0:
            return
        if self._n_updates == 0:
            for cb in self._wm_callbacks:
                cb.on_pretrain()
        lr = self.current_learning_rate
        kept = self.policy.state["agent"]  # what a refused call leaves
        agent_state = self._with_learning_rates(kept, np.float32(lr))
        written = self._rates_written
        if self._spans_processes and (written is None or agent_state is not written[0]):
            # A state from elsewhere (built, loaded, its rates written): on every process's devices.
            agent_state = self._batch_placement.replicate(agent_state)  # type: ignore[union-attr]
        round_ = _Round(owed, lr)
        chunks = training_chunks(owed, self._updates_per_call)
        done = 0
        for i, k in enumerate(chunks):
            new_state, results = self._train_chunk(agent_state, k)
            last = i == len(chunks) - 1
            self._keep_training_call(_Unsettled(round_, kept, results, done), new_state, last)
            agent_state = kept = new_state
            done += k

    def _keep_training_call(
        self, unsettled: Any, new_state: Any, last: bool, rates: bytes | None = None
    ) -> None:
        """Take a training call's state; settle it now, or, for a ``train``'s last call inside
        ``learn`` with steps still to collect, at the next acting call. ``unsettled``: an
        :class:`_Unsettled` (``rates``: its round's rate), or a seed group's call with the bytes of
        its (S,) rates."""
        self.policy.state = {**self.policy.state, "agent": new_state}
        written = np.float32(unsettled.round.lr).tobytes() if rates is None else rates
        self._rates_written = (new_state, written)
        if (
            last
            and getattr(self, "_learning", False)
            and self.num_timesteps < self._total_timesteps
            and not self._spans_processes  # their calls settle at once, as every process's
        ):
            unsettled.copy_to_host_async()
            self._unsettled = unsettled
            return
        self._settle(unsettled)

    def _train_before_step(self) -> None:
        """Dispatch the coming vector step's training call before its env step, when the agent's
        schedule allows it (:meth:`_updates_before_step`), so that the device updates while the env
        steps and the host records the step. Nothing sees it until ``train`` takes it, after the
        step (:meth:`_takes_staged`): callbacks see the state from before it, the replay's random
        state is as before its batches were drawn, and a run that stops at this step drops it."""
        if not getattr(self, "_learning", False):
            return
        if self._spans_processes:  # the processes agree on the updates after the step
            return
        count = self._updates_before_step()
        if count <= 0:
            return
        timesteps = self.num_timesteps + self.n_envs
        lr = float(self.lr_schedule(1.0 - float(timesteps) / float(self._total_timesteps)))
        kept = self.policy.state["agent"]
        agent_state = self._with_learning_rates(kept, np.float32(lr))
        (new_state, results), (sampled,) = draws_undone(
            [self.replay_buffer.rng], lambda: self._train_chunk(agent_state, count)
        )
        results.copy_to_host_async()
        unsettled = _Unsettled(_Round(count, lr), kept, results, 0)
        self._staged = _Staged(unsettled, new_state, timesteps, sampled)

    def _takes_staged(self, staged: _Staged, owed: int) -> bool:
        """Whether ``train`` takes the training call staged before the step (the same updates, the
        same step, learning rate and state as it would run now); if so its batches' draws are the
        replay's again. Otherwise it is dropped and ``train`` runs as if it had never been made."""
        unsettled = staged.unsettled
        if (
            owed != unsettled.round.owed
            or self.num_timesteps != staged.timesteps
            or self.current_learning_rate != unsettled.round.lr
            or self.policy.state["agent"] is not unsettled.before
        ):
            return False
        self.replay_buffer.rng.bit_generator.state = staged.sampled
        return True

    def _settle_training(self, refuse: bool = True) -> None:
        """Check, commit and log the training call that is still unsettled, if any: a refused update
        restores the state from before the call and raises :class:`NonFiniteUpdateError` (with
        ``refuse`` False, e.g. while another error ends ``learn``, it only restores)."""
        unsettled, self._unsettled = getattr(self, "_unsettled", None), None
        if unsettled is None:
            return
        try:
            self._settle(unsettled)
        except NonFiniteUpdateError:
            if refuse:
                raise

    def _settle(self, unsettled: _Unsettled) -> None:
        """Fetch a training call's results, refuse a non-finite update (restoring the state from before
        the call), apply its side effects, and log its ``train``'s calls once the last is settled."""
        round_, results = unsettled.round, unsettled.results
        metrics, outputs = results.fetch(self.training_batch_axis)
        try:
            self._refuse_non_finite_update(metrics, unsettled.done)
        except NonFiniteUpdateError:
            self.policy.state = {**self.policy.state, "agent": unsettled.before}
            raise
        results.commit(*outputs)
        round_.metrics.append(metrics)
        if unsettled.done + results.k == round_.owed:
            self._log_round(round_)

    def _log_round(self, round_: _Round) -> None:
        """Count a ``train``'s updates, and log their metrics (callbacks get each update's)."""
        owed, all_metrics = round_.owed, round_.metrics
        self._n_updates += owed
        # Each call returns every update's metrics with a leading K: one row per update owed.
        if len(all_metrics) == 1:
            stacked = all_metrics[0]
        else:
            stacked = {key: np.concatenate([m[key] for m in all_metrics]) for key in all_metrics[0]}
        for i in range(owed if self._wm_callbacks else 0):
            metrics = {f"train/{key}": float(v[i]) for key, v in stacked.items()}
            for cb in self._wm_callbacks:
                record_extra_metrics(self.logger, cb.on_post_update(dict(metrics)))
        for key, values in stacked.items():
            self.logger.record(f"train/{key}", aggregate_metric(key, values))
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/learning_rate", round_.lr)
        self.logger.record("rollout/env_frames", self.num_timesteps * self.action_repeat)
        self.logger.record("train/replay_bytes", self.replay_bytes_per_seed)

    def _with_learning_rates(
        self, agent_state: Any, rates: np.ndarray | np.floating, placed: Any = None
    ) -> Any:
        """``agent_state`` with the learning rate ``rates`` (a float32 scalar, or a group's (S,) one per
        seed; ``placed``: them on the devices, if not as given) written into its optimisers, unless it
        is the state the last training call returned with these rates in it (the calls keep the
        rate: no host work, no transfer)."""
        written = self._rates_written
        if written is not None and written[0] is agent_state and written[1] == rates.tobytes():
            return agent_state
        return self.core.set_learning_rate(agent_state, rates if placed is None else placed)

    def _train_chunk(self, agent_state: Any, k: int) -> tuple[Any, CallResults]:
        """k updates in one jitted call on k batches of the agent's replay (``_training_batch``),
        padded to the call's size: (the new state, the call's results on the device)."""
        size = self._updates_per_call
        training = self._training_batch(k)
        stores = self._device_stores()  # after the draw: every entry it can name is stored
        batch = pad_updates(training.batch, size)
        placement = self._batch_placement
        if placement is not None:  # data_parallel=True: each device holds a part of every batch
            batch = placement.put_batch(batch, self.training_batch_axis)
        count = None if size == 1 else np.int32(k)  # one update per call: the core's own train_many
        train = training_call(self.core)
        new_state, metrics, *outputs = train.call_from_host(self._config, agent_state, batch, count, stores)
        spans = placement is not None and placement.process_count > 1
        return new_state, CallResults(
            metrics, tuple(outputs), k, training.commit, placement if spans else None
        )

    def _device_fields(self) -> tuple[str, ...]:
        """The replay fields the training calls read from device memory (``replay_on_device``; a seed
        group decides for its seeds), decided at the first training call."""
        decided = getattr(self, "_decided_device_fields", None)
        if decided is None:
            setting = getattr(self, "replay_on_device", None)  # files of earlier releases lack it
            if self._batch_placement is not None:
                decided = ()
            else:
                fields = self.device_replay_fields
                decided = fields_on_device(setting, self.replay_buffer, fields, 1, self.agent_name)
            self._decided_device_fields = decided
        return decided

    def _device_stores(self) -> dict[str, Any] | None:
        """The device copies of :meth:`_device_fields` (None: none), brought up to date."""
        return updated_copies(self, self._device_fields(), jax.device_put, [self.replay_buffer])

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

    def _update_learning_rate(self, optimizers: Any) -> None:
        # The JAX optimiser reads the current rate from the state at every training call.
        self.logger.record("train/learning_rate", self.current_learning_rate)

    @property
    def current_learning_rate(self) -> float:
        return float(self.lr_schedule(self._current_progress_remaining))

    @property
    def replay_bytes_per_seed(self) -> int:
        """Bytes held by the allocated replay (0 before it is allocated)."""
        return 0 if self.replay_buffer is None else int(self.replay_buffer.nbytes)

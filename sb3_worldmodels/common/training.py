"""Training calls: the updates an agent's schedule owes, run in jitted chunks, checked and logged.

After each vector step SB3 calls ``train``; the agent's collection hook has added the updates its
schedule owes to ``_owed_updates`` (the one name of that count in every agent), and ``train`` runs
them in calls of ``_updates_per_call`` updates (one compiled program: a call of fewer is padded),
refuses any update that produced NaN or inf before its state is kept, and logs each call's metrics.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

from sb3_worldmodels.blocks.devices import BatchPlacement
from sb3_worldmodels.blocks.jit import AgentFunction, agent_jit
from sb3_worldmodels.blocks.seeds import counted_updates
from sb3_worldmodels.common.agent_hooks import AgentHooks
from sb3_worldmodels.common.callbacks import WorldModelCallback, record_extra_metrics
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
    core's ``train_step``, its metrics packed (:class:`PackedMetrics`). Every call of a run has the
    same K, so a run compiles one training program whatever its schedule owes."""
    if core not in _TRAINING_CALLS:
        counted = counted_updates(core.train_step)

        def packed(config: Any, state: Any, batches: Any, count: Any = None) -> tuple[Any, ...]:
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


def aggregate_metric(key: str, values: np.ndarray) -> float:
    """The mean of one metric over a call's updates.

    Split statistics (``*stats/*``, see :func:`~sb3_worldmodels.blocks.distributions.balance_stats`)
    are NaN in updates whose batch lacks a class and are averaged over the others (NaN when all
    lack it), as the reference aggregates them; every other metric keeps a NaN visible.
    """
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

    def train(self, gradient_steps: int, batch_size: int = 0) -> None:
        """Run the updates the agent's schedule owes (SB3's ``gradient_steps`` is ignored), in
        jitted calls of ``_updates_per_call`` updates (and single updates for the rest), each through
        the one program of that size (:func:`training_call`)."""
        owed = self._take_run_updates()
        if owed <= 0:
            return
        if self._n_updates == 0:
            for cb in self._wm_callbacks:
                cb.on_pretrain()
        lr = self.current_learning_rate
        state = self.policy.state
        agent_state = self._with_learning_rates(state["agent"], np.float32(lr))
        written = self._rates_written
        if self._spans_processes and (written is None or agent_state is not written[0]):
            # A state from elsewhere (built, loaded, its rates written): on every process's devices.
            agent_state = self._batch_placement.replicate(agent_state)  # type: ignore[union-attr]
        all_metrics = []
        done = 0
        for k in training_chunks(owed, self._updates_per_call):
            new_agent_state, metrics, commit = self._train_chunk(agent_state, k)
            self._refuse_non_finite_update(metrics, done)
            agent_state, done = new_agent_state, done + k
            commit()
            self.policy.state = {**state, "agent": agent_state}
            all_metrics.append(metrics)
        self._rates_written = (agent_state, np.float32(lr).tobytes())
        self._n_updates += owed
        # Each call returns every update's metrics with a leading K: one row per update owed.
        stacked = {key: np.concatenate([m[key] for m in all_metrics]) for key in all_metrics[0]}
        for i in range(owed if self._wm_callbacks else 0):
            metrics = {f"train/{key}": float(v[i]) for key, v in stacked.items()}
            for cb in self._wm_callbacks:
                record_extra_metrics(self.logger, cb.on_post_update(dict(metrics)))
        for key, values in stacked.items():
            self.logger.record(f"train/{key}", aggregate_metric(key, values))
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/learning_rate", lr)
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

    def _train_chunk(self, agent_state: Any, k: int) -> tuple[Any, dict, Callable[[], None]]:
        """k updates in one jitted call on k batches of the agent's replay (``_training_batch``),
        padded to the call's size: (new state, numpy metrics with a leading k, the call's side effects
        to apply once it is kept)."""
        size = self._updates_per_call
        training = self._training_batch(k)
        batch = pad_updates(training.batch, size)
        placement = self._batch_placement
        if placement is not None:  # data_parallel=True: each device holds a part of every batch
            batch = placement.put_batch(batch, self.training_batch_axis)
        count = None if size == 1 else np.int32(k)  # one update per call: the core's own train_many
        new_state, metrics, *outputs = training_call(self.core)(self._config, agent_state, batch, count)
        if placement is not None and placement.process_count > 1:  # this process's rows of the outputs
            metrics = placement.to_host(metrics)
            outputs = placement.local_rows(tuple(outputs), self.training_batch_axis)
        else:
            metrics, outputs = jax.device_get((metrics, tuple(outputs)))  # one transfer each, sliced in numpy
        metrics, outputs = jax.tree_util.tree_map(lambda x: x[:k], (metrics.unpack(), outputs))
        return new_state, metrics, functools.partial(training.commit, *outputs)

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

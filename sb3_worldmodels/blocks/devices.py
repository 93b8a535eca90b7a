"""Every device: a seed axis sharded over the host's devices, or one model's batch split over them
(data parallel), also over the devices of several processes (``jax.distributed``).

- :func:`seed_placement` places a group's leading seed axis S with
  ``NamedSharding(Mesh(devices, ("seeds",)), P("seeds"))``: each device holds S / D seeds, and a
  program vmapped over S (:meth:`~sb3_worldmodels.blocks.jit.AgentFunction.over_seeds`) runs on all
  of them at once (``jax.jit`` follows its inputs' shardings; its outputs keep them).
- :func:`data_parallel_placement` splits one model's training batch along its batch axis over the
  devices, the state replicated on each (``jax.jit`` inserts the gradients' all-reduce); under
  ``jax.distributed`` over every process's devices, each process sending its own rows.

On a host of one device both return None: the caller makes no sharding call at all, and its programs
are those of a plain ``jax.jit``.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

SEED_AXIS = "seeds"
"""The mesh axis of a group's seeds."""
BATCH_AXIS = "batch"
"""The mesh axis of a data-parallel model's batch."""


def devices_for_seeds(n_seeds: int, n_devices: int) -> int:
    """The devices a group of ``n_seeds`` seeds runs on: the largest count up to ``n_devices`` that
    divides ``n_seeds`` (every device holds the same number of seeds; none pads the group with seeds
    that nobody asked for). 8 seeds on 4 devices: 4 (2 each); 6 seeds on 4 devices: 3; 5 seeds: 1."""
    return max(d for d in range(1, min(n_seeds, n_devices) + 1) if n_seeds % d == 0)


def seed_placement(n_seeds: int, devices: Sequence[Any] | None = None) -> SeedPlacement | None:
    """Where a group of ``n_seeds`` seeds lives: over the local devices (``devices``, default
    ``jax.local_devices()``), or None when that is one device (nothing to place).

    With a seed count that no more than one device divides, the group runs on the largest count that
    does (:func:`devices_for_seeds`) and warns: give a multiple of the device count to use them all."""
    devices = list(jax.local_devices() if devices is None else devices)
    used = devices_for_seeds(n_seeds, len(devices))
    if used < len(devices) and n_seeds > 1:
        warnings.warn(
            f"A group of {n_seeds} seeds runs on {used} of the host's {len(devices)} devices (the seeds "
            f"are split evenly over the devices): give a multiple of {len(devices)} seeds to use them all.",
            stacklevel=3,
        )
    return None if used == 1 else SeedPlacement(n_seeds, devices[:used])


class SeedPlacement:
    """A leading seed axis of S = D x m seeds over D devices: seeds ``d*m .. d*m + m - 1`` on the
    ``d``-th device (``sharding``: ``P("seeds")`` over a 1-D mesh of the devices)."""

    def __init__(self, n_seeds: int, devices: Sequence[Any]) -> None:
        if n_seeds % len(devices):
            raise ValueError(f"{n_seeds} seeds do not split evenly over {len(devices)} devices.")
        self.n_seeds = n_seeds
        self.devices = list(devices)
        self.per_device = n_seeds // len(devices)
        self.mesh = Mesh(np.array(self.devices), (SEED_AXIS,))
        self.sharding = NamedSharding(self.mesh, P(SEED_AXIS))

    def device_of(self, index: int) -> Any:
        """The device that holds seed ``index``."""
        return self.devices[index // self.per_device]

    def put(self, tree: Any) -> Any:
        """A pytree whose leaves (numpy or jax) have a leading S, sharded along it: leaf (S, ...)."""
        return jax.device_put(tree, self.sharding)

    def stack(self, trees: Sequence[Any]) -> Any:
        """S pytrees of one structure -> one pytree of sharded leaves (S, ...), as
        :func:`~sb3_worldmodels.blocks.seeds.stack_trees` stacks them: host leaves (numpy, numbers)
        are sent from the host to their devices in one transfer, device leaves are moved to the device
        of their seed (no copy where they are there already, as the slices of :meth:`unstack` are)."""
        if len(trees) != self.n_seeds:
            raise ValueError(f"stack: {len(trees)} pytrees for a placement of {self.n_seeds} seeds.")
        structure: Any = jax.tree_util.tree_structure(trees[0])
        per_seed = [structure.flatten_up_to(tree) for tree in trees]
        leaves = [self._stack_leaf([seed[i] for seed in per_seed]) for i in range(structure.num_leaves)]
        return jax.tree_util.tree_unflatten(structure, leaves)

    def _stack_leaf(self, leaves: list[Any]) -> jax.Array:
        if all(isinstance(leaf, (np.ndarray, np.generic, numbers.Number)) for leaf in leaves):
            return jax.device_put(np.stack(leaves), self.sharding)
        moved = jax.device_put(list(leaves), [self.device_of(i) for i in range(self.n_seeds)])
        m = self.per_device
        blocks = [
            jnp.expand_dims(moved[d * m], 0) if m == 1 else jnp.stack(moved[d * m : (d + 1) * m])
            for d in range(len(self.devices))
        ]
        shape = (self.n_seeds, *blocks[0].shape[1:])
        return jax.make_array_from_single_device_arrays(shape, self.sharding, blocks)

    def unstack(self, tree: Any) -> list[Any]:
        """One pytree of leaves (S, ...) -> S pytrees, seed ``i``'s leaves on the device that holds it
        (read from that device's shard: nothing is copied between devices). Numpy leaves are sliced."""
        structure: Any = jax.tree_util.tree_structure(tree)
        columns = [self._unstack_leaf(leaf) for leaf in structure.flatten_up_to(tree)]
        return [jax.tree_util.tree_unflatten(structure, [c[i] for c in columns]) for i in range(self.n_seeds)]

    def slice(self, tree: Any, index: int) -> Any:
        """Seed ``index`` of a pytree of leaves (S, ...), on the device that holds it."""
        return jax.tree_util.tree_map(lambda leaf: self._unstack_leaf(leaf, index)[0], tree)

    def _unstack_leaf(self, leaf: Any, only: int | None = None) -> list[Any]:
        wanted = range(self.n_seeds) if only is None else [only]
        if not isinstance(leaf, jax.Array) or not leaf.sharding.is_equivalent_to(self.sharding, leaf.ndim):
            return [leaf[i] for i in wanted]
        shards = {shard.device: shard.data for shard in leaf.addressable_shards}
        m = self.per_device
        if m == 1:  # the shard is (1, ...): a squeeze dispatches faster than an index
            return [jnp.squeeze(shards[self.device_of(i)], 0) for i in wanted]
        return [shards[self.device_of(i)][i % m] for i in wanted]


def data_parallel_placement(batch_size: int, devices: Sequence[Any] | None = None) -> BatchPlacement | None:
    """One model's training batch of ``batch_size`` rows split over the devices (``devices``, default
    every device of the run: ``jax.devices()``, those of every process under ``jax.distributed``), or
    None for one device. ValueError when the batch does not split evenly."""
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) == 1:
        return None
    if batch_size % len(devices):
        processes = len({getattr(device, "process_index", 0) for device in devices})
        where = (
            f"the {len(devices)} devices of the run's {processes} processes"
            if processes > 1
            else (f"the host's {len(devices)} devices")
        )
        raise ValueError(
            f"data_parallel=True splits the training batch over {where}: batch_size={batch_size} is not a "
            f"multiple of {len(devices)}. Give a batch_size that is (or data_parallel=False)."
        )
    return BatchPlacement(devices)


class BatchPlacement:
    """A training batch split along its batch axis over a 1-D mesh of devices, the model's state
    replicated on each. Under ``jax.distributed`` the mesh holds every process's devices, each
    process's block of the batch contiguous (the devices in process order): a process sends its own
    rows (:meth:`put_batch`) and reads back its own rows of the outputs (:meth:`local_rows`)."""

    def __init__(self, devices: Sequence[Any]) -> None:
        self.devices = sorted(devices, key=lambda d: (getattr(d, "process_index", 0), getattr(d, "id", 0)))
        self.process_index = jax.process_index()
        self.local_devices = [d for d in self.devices if getattr(d, "process_index", 0) == self.process_index]
        self.process_count = len({getattr(d, "process_index", 0) for d in self.devices})
        self.mesh = Mesh(np.array(self.devices), (BATCH_AXIS,))
        self.replicated = NamedSharding(self.mesh, P())

    def local_batch_size(self, batch_size: int) -> int:
        """Rows of a ``batch_size`` batch that this process sends (all of them in one process)."""
        return batch_size * len(self.local_devices) // len(self.devices)

    def batch_sharding(self, axis: int) -> NamedSharding:
        """Arrays split along ``axis`` (the batch axis), whole along the others."""
        return NamedSharding(self.mesh, P(*([None] * axis), BATCH_AXIS))

    def put_batch(self, tree: Any, axis: int) -> Any:
        """A pytree of batches whose leaves have the batch axis at ``axis``, split along it. Under
        ``jax.distributed`` each process gives its own rows (:meth:`local_batch_size` of them) and
        the leaves are the run's global batches, the processes' rows in process order."""
        sharding = self.batch_sharding(axis)
        if self.process_count == 1:
            return jax.device_put(tree, sharding)
        scale = len(self.devices) // len(self.local_devices)

        def put(leaf: Any) -> jax.Array:
            shape = (*leaf.shape[:axis], leaf.shape[axis] * scale, *leaf.shape[axis + 1 :])
            return jax.make_array_from_process_local_data(sharding, np.asarray(leaf), shape)

        return jax.tree_util.tree_map(put, tree)

    def local_rows(self, tree: Any, axis: int) -> Any:
        """Numpy leaves of this process's rows (along ``axis``) of arrays split like the batch: the
        outputs of a training call that go back to this process's replay."""

        def rows(leaf: Any) -> np.ndarray:
            if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
                return np.asarray(leaf)
            sharding = self.batch_sharding(axis)
            if not leaf.sharding.is_equivalent_to(sharding, leaf.ndim):
                leaf = jax.device_put(leaf, sharding)  # a layout of the compiler's own choice
            shards = sorted(leaf.addressable_shards, key=lambda shard: shard.index[axis].start or 0)
            return np.concatenate([np.asarray(shard.data) for shard in shards], axis=axis)

        return jax.tree_util.tree_map(rows, tree)

    def to_host(self, tree: Any) -> Any:
        """Numpy leaves of whole arrays (e.g. the metrics): a replicated array is read from this
        process's copy, an array split over the processes is gathered from all of them."""

        def whole(leaf: Any) -> np.ndarray:
            if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable or leaf.is_fully_replicated:
                return np.asarray(leaf)
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))

        return jax.tree_util.tree_map(whole, tree)

    def replicate(self, tree: Any) -> Any:
        """A pytree with every leaf whole on every device (under ``jax.distributed`` every process
        must give the same values)."""
        return jax.device_put(tree, self.replicated)

    def on_first_device(self, tree: Any) -> Any:
        """A pytree of replicated leaves as they are on this process's first device (the replica
        there: nothing is copied), for a program that runs on that device alone (acting, predict)."""
        first = self.local_devices[0]

        def local(leaf: Any) -> Any:
            if not isinstance(leaf, jax.Array) or len(leaf.sharding.device_set) == 1:
                return leaf
            return next(shard.data for shard in leaf.addressable_shards if shard.device == first)

        return jax.tree_util.tree_map(local, tree)

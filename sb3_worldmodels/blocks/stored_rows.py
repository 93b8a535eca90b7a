"""Replay rows kept in device memory, read inside a jitted call by their indices.

A training batch field may arrive as row indices (..., int32) into a store of rows already on the
device, instead of as the rows themselves: the host then draws the indices only, and the call
gathers the rows where they live (``tdmpc2/common/buffer.py:72-93@b67b21c`` keeps the replay's
storage on the GPU when it fits, for the same reason: the batches never cross to the device).
The read is a gather of whole rows (36,864 bytes each for three stacked 64 x 64 RGB frames), the one
gather such a training program holds in the accelerators' gather-free form (``blocks.backend``);
``benchmarks/replay_on_device_speed.py`` times it against the host's batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp


@jax.tree_util.register_pytree_node_class
class StoredRows:
    """A field's rows on the device: ``store`` (slots, D) of the rows flattened (a flat minor axis
    tiles without padding on a TPU, where an image's minor axis of 3 or 9 channels would be padded to
    128), ``shape`` one row's shape (its product D), static."""

    def __init__(self, store: Any, shape: tuple[int, ...]) -> None:
        self.store = store
        self.shape = tuple(int(n) for n in shape)

    def tree_flatten(self) -> tuple[tuple[Any], tuple[int, ...]]:
        return (self.store,), self.shape

    @classmethod
    def tree_unflatten(cls, shape: tuple[int, ...], children: tuple[Any]) -> StoredRows:
        return cls(children[0], shape)

    def rows(self, index: Any) -> jax.Array:
        """The rows at ``index`` (..., integer): (..., *shape)."""
        index = jnp.asarray(index)
        flat = jnp.take(self.store, index.reshape(-1), axis=0, mode="clip")  # the host's indices are in range
        return flat.reshape(*index.shape, *self.shape)


def with_stored_rows(batch: Mapping[str, Any], stores: Mapping[str, StoredRows] | None) -> Any:
    """``batch`` with each field named in ``stores`` (its row indices) replaced by those rows."""
    if not stores:
        return batch
    missing = [name for name in stores if name not in batch]
    if missing:
        raise KeyError(f"stored fields {missing} are not in the batch's fields {sorted(batch)}")
    return {name: stores[name].rows(value) if name in stores else value for name, value in batch.items()}

"""``replay_on_device``: replay fields kept in device memory too, so that training batches cross to the
device as row indices instead of rows.

TD-MPC2's reference keeps its whole replay storage on the GPU when 2.5 times its bytes fit in the free
memory (``tdmpc2/common/buffer.py:72-93@b67b21c``). Here the replay stays the host's (saved, loaded,
sampled with its own generator: the same draws either way) and a copy of its large fields lives on the
device: each stored episode crosses once, and each training batch of pixel windows (256 x 4 images of
64 x 64 x 9, 38 MB per seed) is read where it lives instead of being gathered and sent by the host.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from sb3_worldmodels.blocks.stored_rows import StoredRows
from sb3_worldmodels.common.episode_replay import EpisodeReplay

AUTO_MIN_ROW_BYTES = 1024
"""``replay_on_device=None`` keeps a field on the device only when one entry of it has at least this
many bytes (images); a vector's few floats cost less to send than to gather."""
AUTO_MEMORY_SHARE = 0.4
"""... and when the copies take at most this share of the device's free memory (the reference's
rule: storage on the GPU when 2.5 times its bytes are free)."""
_MIN_WRITE_ROWS = 64
"""Entries written in one call are padded to a power of two at least this large: a few programs."""


def check_replay_on_device(value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(
            f"replay_on_device must be True, False or None (on an accelerator, for image fields that "
            f"fit in its memory), got {value!r}."
        )
    return value


def fields_on_device(
    setting: bool | None, replay: EpisodeReplay, candidates: Sequence[str], n_seeds: int, agent_name: str
) -> tuple[str, ...]:
    """The fields of ``replay`` (one seed's; ``n_seeds`` alike) to keep on the device for ``setting``."""
    if setting is False:
        return ()
    if not candidates:
        if setting:
            raise ValueError(
                f"{agent_name} keeps its replay on the host: replay_on_device=True has no effect."
            )
        return ()
    if setting:
        return tuple(candidates)
    if jax.default_backend() == "cpu":
        return ()
    chosen = tuple(name for name in candidates if replay.field_bytes(name, entries=1) >= AUTO_MIN_ROW_BYTES)
    needed = n_seeds * sum(replay.field_bytes(name) for name in chosen)
    stats = jax.local_devices()[0].memory_stats() or {}
    free = stats.get("bytes_limit", 0) - stats.get("bytes_in_use", 0)
    if "bytes_limit" in stats and needed > AUTO_MEMORY_SHARE * free:
        return ()
    return chosen


def updated_copies(
    owner: Any, names: tuple[str, ...], put: Callable[[np.ndarray], Any], replays: Sequence[EpisodeReplay]
) -> dict[str, StoredRows] | None:
    """The device copies of the fields ``names`` of ``replays`` kept by ``owner`` (a model, as its
    ``_replay_mirror``; a seed group's replays with a leading seed axis), brought up to date; None
    when no field is named."""
    if not names:
        return None
    mirror = getattr(owner, "_replay_mirror", None)
    if mirror is None or mirror.names != names:
        seed_axis = getattr(owner, "_lanes", None) is not None
        mirror = owner._replay_mirror = ReplayMirror(names, put, seed_axis)
    return mirror.stores(replays)


class ReplayMirror:
    """Copies of fields of one replay, or of S replays (a leading seed axis, ``seed_axis``), in device
    memory, brought up to date before each training call: entries are only appended (at absolute index
    ``replay.end``), so only those stored since the last call cross; a ring rebuilt or refilled whole
    (its ``layout_version``) crosses whole. ``put``: host array -> device array (a group's places its
    seed axis over the devices)."""

    def __init__(self, names: tuple[str, ...], put: Callable[[np.ndarray], Any], seed_axis: bool) -> None:
        self.names = names
        self._put = put
        self._seed_axis = seed_axis
        self._layout: tuple | None = None
        self._ends: list[int] = []
        self._stores: dict[str, Any] = {}

    def stores(self, replays: Sequence[EpisodeReplay]) -> dict[str, StoredRows]:
        """``{name: StoredRows}`` of the replays' current entries (one replay unless ``seed_axis``)."""
        if not self._seed_axis and len(replays) != 1:
            raise ValueError(f"a mirror without a seed axis copies one replay, got {len(replays)}")
        layout = tuple((id(r), r.layout_version, r.slots) for r in replays)
        if layout != self._layout:
            self._rebuild(replays)
            self._layout = layout
        else:
            self._append(replays)
        return {name: StoredRows(self._stores[name], replays[0].fields[name][0]) for name in self.names}

    def _rebuild(self, replays: Sequence[EpisodeReplay]) -> None:
        slots = max(r.slots for r in replays)
        if any(r.slots not in (0, slots) for r in replays):
            raise ValueError(
                f"the seeds' replays have rings of {[r.slots for r in replays]} slots; a copy needs one size"
            )
        for name in self.names:
            shape, dtype = replays[0].fields[name]
            empty = np.zeros((slots, math.prod(shape)), dtype)
            rings = [r.ring(name) for r in replays]
            flat = [empty if ring is None else ring.reshape(slots, -1) for ring in rings]
            store = self._put(np.stack(flat) if self._seed_axis else flat[0])
            # A group's put on one device leaves host arrays as they are: the copy must be on the device,
            # or every call would send it whole.
            self._stores[name] = jax.device_put(store) if isinstance(store, np.ndarray) else store
        self._ends = [r.end for r in replays]

    def _append(self, replays: Sequence[EpisodeReplay]) -> None:
        for s, replay in enumerate(replays):
            slots, end = replay.slots, replay.end
            start = max(self._ends[s], end - slots)
            if start >= end:
                continue
            n = end - start
            padded = max(_MIN_WRITE_ROWS, 1 << (n - 1).bit_length())
            index = np.full(padded, slots, np.int32)  # slot `slots` is out of range: dropped
            index[:n] = np.arange(start, end) % slots
            for name in self.names:
                ring: np.ndarray = replay.ring(name)  # type: ignore[assignment]
                rows = np.zeros((padded, math.prod(ring.shape[1:])), ring.dtype)
                rows[:n] = ring[index[:n]].reshape(n, -1)
                store = self._stores[name]
                if self._seed_axis:
                    self._stores[name] = _write_seed_rows(store, np.int32(s), index, rows)
                else:
                    self._stores[name] = _write_rows(store, index, rows)
            self._ends[s] = end


@jax.jit
def _write_rows(store: Any, index: Any, rows: Any) -> Any:
    return store.at[index].set(rows, mode="drop")


@jax.jit
def _write_seed_rows(store: Any, seed: Any, index: Any, rows: Any) -> Any:
    return store.at[seed, index].set(rows, mode="drop")

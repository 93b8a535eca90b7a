"""Sequence replay: DreamerV3's uniform replay over fixed-length windows, as an SB3 ``ReplayBuffer``.

The buffer keeps one ring of rows per env stream. A *row* is everything recorded at one env step
(observation, action taken after it, reward that led to it, episode flags, policy latents, ...); an
*item* is every window of ``window`` consecutive rows of one env stream, starting at every row and
crossing episode boundaries freely (danijar/dreamerv3 @2411f7d ``embodied/replay/replay.py``).
Items are implicit: env ``e`` holding rows ``[first_e, total_e)`` has the items starting at rows
``first_e .. total_e - window``, so nothing per item is stored and sampling is pure index maths.

Rows are addressed by their *absolute* stream index (0 = first row ever added to that env). Row
``r`` of env ``e`` lives in slot ``r % allocated`` of the arrays, which have shape
``(allocated, n_envs, *field_shape)``. While the allocation is below the per-env capacity no stream
has wrapped, so growing it copies slots in order; at the capacity the ring overwrites the oldest
row of that env (FIFO eviction per env).

The buffer holds numpy arrays only; :meth:`SequenceReplay.export_state` gives them with JSON-ready
metadata for a pickle-free file (``replay_state``). It subclasses ``ReplayBuffer`` so that
``load_replay_buffer``'s isinstance check passes, but it never
stores SB3 transitions and SB3 never samples it.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer

FieldSpec = tuple[tuple[int, ...], np.dtype]


def _normalize_fields(fields: Mapping[str, tuple[Any, Any]]) -> dict[str, FieldSpec]:
    if not fields:
        raise ValueError("SequenceReplay needs at least one field, e.g. {'obs': ((4,), np.float32)}.")
    out: dict[str, FieldSpec] = {}
    for name, spec in fields.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"Field names must be non-empty strings, got {name!r}.")
        try:
            shape, dtype = spec
            shape = tuple(int(d) for d in shape)
            dtype = np.dtype(dtype)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"Field {name!r} must be declared as (shape tuple, numpy dtype), got {spec!r}."
            ) from err
        if any(d < 0 for d in shape):
            raise ValueError(f"Field {name!r} has a negative dimension in shape {shape}.")
        out[name] = (shape, dtype)
    return out


def row_bytes(fields: Mapping[str, FieldSpec]) -> int:
    """Bytes of one row (or entry) holding every field."""
    return int(sum(math.prod(shape) * dtype.itemsize for shape, dtype in fields.values()))


def available_memory() -> int | None:
    """Bytes of memory the system can still give (``MemAvailable``), None where unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_replay_memory(needed: int, held: int, setting: str, agent: str) -> None:
    """Refuse a replay allocation of ``needed`` bytes (``held`` already allocated) that the memory
    available cannot hold, and warn above half of it; the messages name the setting that sizes it."""
    extra = needed - held
    available = available_memory()
    if available is None or extra <= 0:
        return
    figure = f"{needed / 2**30:.2f} GiB for the replay ({agent})"
    if extra > available:
        raise MemoryError(
            f"{figure} does not fit the {available / 2**30:.2f} GiB of memory available: lower {setting} "
            "(the most rows the replay keeps) or train for fewer steps (the replay holds at most the "
            "rows a run writes)."
        )
    if extra > available / 2:
        warnings.warn(
            f"{figure} takes more than half of the {available / 2**30:.2f} GiB of memory available; "
            f"lower {setting} if the machine runs short.",
            stacklevel=4,
        )


def fields_to_meta(fields: Mapping[str, FieldSpec]) -> dict[str, Any]:
    """Field specs as safe values: ``{name: {"shape": [...], "dtype": "<f4"}}``."""
    return {name: {"shape": list(shape), "dtype": dtype.str} for name, (shape, dtype) in fields.items()}


def fields_from_meta(meta: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {name: (tuple(spec["shape"]), np.dtype(str(spec["dtype"]))) for name, spec in meta.items()}


def read_fields(
    arrays: Mapping[str, np.ndarray],
    fields: Mapping[str, FieldSpec],
    lead: tuple[int, ...],
    prefix: str = "field/",
) -> dict[str, np.ndarray]:
    """``arrays[prefix + name]`` for every field, checked to be ``(*lead, *shape)`` of its dtype."""
    out = {}
    for name, (shape, dtype) in fields.items():
        key = prefix + name
        if key not in arrays:
            raise ValueError(f"the array {key!r} is missing")
        arr = np.asarray(arrays[key])
        if arr.shape != (*lead, *shape) or arr.dtype != dtype:
            raise ValueError(f"{key!r} is {arr.shape} {arr.dtype}, expected {(*lead, *shape)} {dtype}")
        out[name] = np.array(arr)
    return out


class SequenceReplay(ReplayBuffer):
    """Per-env ring of rows; samples windows of ``window`` consecutive rows (DreamerV3's
    replay.py:130-141@2411f7d).

    :param buffer_size: most rows kept over all envs; each env keeps ``ceil(buffer_size / n_envs)``
        rows (SB3's convention: the ``buffer_size`` attribute is then this per-env capacity).
    :param observation_space: kept for SB3 (``BaseBuffer``); rows are described by ``fields``.
    :param action_space: kept for SB3 (``BaseBuffer``).
    :param n_envs: number of env streams.
    :param fields: ``name -> (shape, dtype)`` of one row, e.g. ``{"obs": ((O,), np.float32),
        "action": ((A,), np.float32), "reward": ((), np.float32), "is_first": ((), bool), ...}``.
    :param window: rows per sampled item (T + 1 for DreamerV3: one context row, configs.yaml:92-94@2411f7d).
    :param seed: seed of the buffer's own ``np.random.Generator`` (saved with the buffer).
    :param online: keep the reference's online queue of fresh, non-overlapping windows, which
        ``sample`` serves before uniform draws.
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        n_envs: int,
        fields: Mapping[str, tuple[Any, Any]],
        window: int,
        seed: int,
        online: bool = True,
    ) -> None:
        # BaseBuffer only: ReplayBuffer.__init__ would allocate SB3's transition arrays.
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device="cpu", n_envs=n_envs)
        if n_envs < 1:
            raise ValueError(f"n_envs must be >= 1, got {n_envs}.")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}.")
        capacity = math.ceil(buffer_size / n_envs)
        if capacity < window:
            raise ValueError(
                f"buffer_size={buffer_size} over n_envs={n_envs} keeps {capacity} rows per env, fewer than "
                f"one window of {window} rows; use buffer_size >= {window * n_envs}."
            )
        self.fields = _normalize_fields(fields)
        self.window = int(window)
        self.capacity_per_env = capacity
        self.buffer_size = capacity  # SB3 convention: per-env rows
        self.online = bool(online)
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        # Attributes SB3 reads on a ReplayBuffer (load_replay_buffer, _setup_learn).
        self.optimize_memory_usage = False
        self.handle_timeout_termination = False
        self._data: dict[str, np.ndarray] | None = None
        self._allocated = 0
        self._total = np.zeros(n_envs, dtype=np.int64)  # absolute rows ever added per env
        self._queue: deque[tuple[int, int]] = deque()  # (env, absolute start row), oldest first

    # ------------------------------------------------------------------ sizes

    @property
    def allocated_rows_per_env(self) -> int:
        """Rows allocated per env stream (0 until ``reserve``/``add_rows``)."""
        return self._allocated

    @property
    def rows_per_env(self) -> np.ndarray:
        """Rows currently stored per env, shape (n_envs,) int64."""
        return np.minimum(self._total, self.capacity_per_env)

    @property
    def rows_added_per_env(self) -> np.ndarray:
        """Rows ever added per env (the absolute stream counter), shape (n_envs,) int64."""
        return self._total.copy()

    @property
    def num_items(self) -> int:
        """Windows that can be sampled now, over all envs."""
        return int(self._items_per_env().sum())

    @property
    def nbytes(self) -> int:
        """Bytes allocated by the row arrays."""
        if self._data is None:
            return 0
        return int(sum(arr.nbytes for arr in self._data.values()))

    @property
    def queue_size(self) -> int:
        """Entries in the online queue (including ones evicted since, skipped when popped)."""
        return len(self._queue)

    @property
    def online_queue(self) -> np.ndarray:
        """The online queue as (env, absolute start row) pairs, oldest first, shape (n, 2) int64."""
        return np.asarray(list(self._queue), dtype=np.int64).reshape(-1, 2)

    def size(self) -> int:
        """Rows stored over all envs."""
        return int(self.rows_per_env.sum())

    def _items_per_env(self) -> np.ndarray:
        return np.maximum(self.rows_per_env - self.window + 1, 0)

    def _first_row(self) -> np.ndarray:
        """Oldest stored absolute row per env, shape (n_envs,)."""
        return self._total - self.rows_per_env

    # ------------------------------------------------------------ allocation

    @property
    def bytes_per_row(self) -> int:
        """Bytes of one row over all fields."""
        return row_bytes(self.fields)

    def bytes_to_reserve(self, rows_per_env: int) -> int:
        """Bytes the arrays would hold after ``reserve(rows_per_env)``."""
        rows = max(self._allocated, min(self.capacity_per_env, int(rows_per_env)))
        return rows * self.n_envs * self.bytes_per_row

    def reserve(self, rows_per_env: int) -> None:
        """Allocate (or grow, keeping contents) to ``min(capacity_per_env, rows_per_env)`` rows per env."""
        target = min(self.capacity_per_env, int(rows_per_env))
        if target <= self._allocated:
            return
        # Invariant: below the capacity no stream has wrapped, so rows sit at slots 0..total-1.
        assert int(self._total.max()) <= self._allocated
        new = {
            name: np.zeros((target, self.n_envs, *shape), dtype=dtype)
            for name, (shape, dtype) in self.fields.items()
        }
        if self._data is not None:
            for name, arr in self._data.items():
                new[name][: self._allocated] = arr
        self._data = new
        self._allocated = target

    def _ensure_rows(self, needed: int) -> None:
        if needed <= self._allocated or self._allocated >= self.capacity_per_env:
            return
        grown = math.ceil(self._allocated * 1.25)
        self.reserve(max(needed, grown, self.window))

    # ---------------------------------------------------------------- adding

    def add(self, *args: Any, **kwargs: Any) -> None:
        """Not supported: rows are stored with :meth:`add_rows`."""
        raise TypeError(
            "SequenceReplay stores whole env rows, not SB3 transitions: call "
            "add_rows(env_ids, {field: array}) instead of add(obs, next_obs, action, reward, done, infos)."
        )

    def _get_samples(self, batch_inds: np.ndarray, env: Any = None) -> Any:
        raise TypeError("SequenceReplay is sampled with sample(batch_size, count), not through SB3's API.")

    def _check_values(
        self, values: Mapping[str, Any], lead: tuple[int, ...], what: str, required: bool
    ) -> dict[str, np.ndarray]:
        """Check keys, shapes ``(*lead, *field_shape)`` and dtypes; cast with numpy's same_kind rule."""
        unknown = set(values) - set(self.fields)
        if unknown:
            raise ValueError(
                f"{what}: unknown field(s) {sorted(unknown)}; declared fields are {list(self.fields)}."
            )
        if required:
            missing = set(self.fields) - set(values)
            if missing:
                raise ValueError(
                    f"{what}: missing field(s) {sorted(missing)}; every row needs {list(self.fields)}."
                )
        out = {}
        for name, value in values.items():
            shape, dtype = self.fields[name]
            arr = np.asarray(value)
            if arr.shape != (*lead, *shape):
                raise ValueError(
                    f"{what}: field {name!r} has shape {arr.shape}, expected {(*lead, *shape)} "
                    f"({lead} leading axes + declared row shape {shape})."
                )
            if not np.can_cast(arr.dtype, dtype, casting="same_kind"):
                raise TypeError(
                    f"{what}: field {name!r} has dtype {arr.dtype}, which does not cast safely to the "
                    f"declared {dtype} (same_kind rule)."
                )
            out[name] = arr.astype(dtype, copy=False)
        return out

    def add_rows(self, env_ids: np.ndarray, rows: Mapping[str, Any]) -> np.ndarray:
        """Append one row to each listed env stream.

        :param env_ids: (N,) distinct env indices.
        :param rows: every declared field, each shaped (N, *field_shape).
        :return: (N,) int64, items held after each listed row was added, in ``env_ids`` order (what
            the reference's training gate ``len(replay) >= batch_size`` sees after each row).

        Each row that completes a window inserts the item ending at it; the item is appended to the
        online queue when the stream held a multiple of ``window`` rows before this row, so queued
        windows start at stream rows 1, window + 1, 2 * window + 1, ... (replay.py:140-144@2411f7d).
        """
        env_ids = np.asarray(env_ids)
        if env_ids.ndim != 1 or not np.issubdtype(env_ids.dtype, np.integer):
            raise ValueError(
                f"env_ids must be a 1-D integer array, got shape {env_ids.shape} {env_ids.dtype}."
            )
        env_ids = env_ids.astype(np.int64)
        n = len(env_ids)
        if n and (env_ids.min() < 0 or env_ids.max() >= self.n_envs):
            raise ValueError(f"env_ids must lie in [0, {self.n_envs}), got {env_ids.tolist()}.")
        if len(np.unique(env_ids)) != n:
            raise ValueError(f"env_ids must be distinct (one row per env per call), got {env_ids.tolist()}.")
        values = self._check_values(rows, (n,), "add_rows", required=True)
        if n == 0:
            return np.zeros(0, dtype=np.int64)

        items_before = self._items_per_env()
        before = self._total[env_ids]
        self._ensure_rows(int(before.max()) + 1)
        assert self._data is not None
        slots = before % self._allocated
        for name, arr in values.items():
            self._data[name][slots, env_ids] = arr
        self._total[env_ids] = before + 1

        if self.online:
            queued = (before + 1 >= self.window) & (before % self.window == 0)
            starts = before + 1 - self.window
            self._queue.extend(zip(env_ids[queued].tolist(), starts[queued].tolist(), strict=True))
        gained = (self._items_per_env() - items_before)[env_ids]
        return int(items_before.sum()) + np.cumsum(gained)

    # -------------------------------------------------------------- sampling

    def sample(  # type: ignore[override]
        self, batch_size: int, count: int = 1
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Draw ``count`` batches of ``batch_size`` windows (not SB3's ``sample(batch_size, env)``).

        Windows come from the online queue first (in order; evicted ones skipped), then uniformly over
        all current items (each env weighted by its item count), drawn with the buffer's generator.
        Batches are annotated as in the reference's ``_annotate_batch``: ``is_first`` is set on row 0
        of every window and ``is_last`` on every row whose next row in the window is first.

        :return: ``(batch, envs, starts)``: ``batch[name]`` shaped (count, batch_size, window, *shape);
            ``envs`` and ``starts`` (count, batch_size) int64, the env and absolute stream row of each
            window's row 0 (pass them to :meth:`write_back`).
        """
        if batch_size < 1 or count < 1:
            raise ValueError(f"batch_size and count must be >= 1, got {batch_size} and {count}.")
        items = self._items_per_env()
        total_items = int(items.sum())
        if total_items == 0:
            raise ValueError(
                f"Nothing to sample: no env stream holds a full window of {self.window} rows yet "
                f"(rows per env: {self.rows_per_env.tolist()})."
            )
        k = batch_size * count
        first = self._first_row()
        envs = np.empty(k, dtype=np.int64)
        starts = np.empty(k, dtype=np.int64)
        filled = 0
        while filled < k and self._queue:
            env, start = self._queue.popleft()
            if start >= first[env]:
                envs[filled], starts[filled] = env, start
                filled += 1
        if filled < k:
            draws = self.rng.integers(0, total_items, size=k - filled)
            ends = np.cumsum(items)
            env = np.searchsorted(ends, draws, side="right")  # type: ignore[assignment]
            envs[filled:] = env
            starts[filled:] = first[env] + draws - (ends[env] - items[env])

        assert self._data is not None
        slots = (starts[:, None] + np.arange(self.window)) % self._allocated  # (k, window)
        batch = {name: arr[slots, envs[:, None]] for name, arr in self._data.items()}
        batch = {name: v.reshape(count, batch_size, *v.shape[1:]) for name, v in batch.items()}
        annotate_batch(batch)
        return batch, envs.reshape(count, batch_size), starts.reshape(count, batch_size)

    # ------------------------------------------------------------ write-back

    def write_back(self, envs: np.ndarray, starts: np.ndarray, values: Mapping[str, Any]) -> int:
        """Overwrite rows 1..window-1 of sampled windows (replay latent write-back, agent.py:213-218@2411f7d,
        replay.py:147-167@2411f7d).

        :param envs: (count, batch_size) env of each window, as returned by :meth:`sample`.
        :param starts: (count, batch_size) absolute start row of each window.
        :param values: fields to overwrite, each (count, batch_size, window - 1, *shape).
        :return: rows written; rows evicted (overwritten) since sampling are skipped.
        """
        envs = np.asarray(envs, dtype=np.int64)
        starts = np.asarray(starts, dtype=np.int64)
        if envs.shape != starts.shape or envs.ndim != 2:
            raise ValueError(
                f"envs and starts must both be (count, batch_size), got {envs.shape} and {starts.shape}."
            )
        values = self._check_values(values, (*envs.shape, self.window - 1), "write_back", required=False)
        if not values or self._data is None or envs.size == 0:
            return 0
        if envs.min() < 0 or envs.max() >= self.n_envs:
            raise ValueError(f"envs must lie in [0, {self.n_envs}).")
        rows = starts[..., None] + np.arange(1, self.window)  # (count, batch, window - 1)
        env_b = np.broadcast_to(envs[..., None], rows.shape)
        if np.any(rows >= self._total[env_b]):
            raise ValueError(
                "write_back: some rows were never added to the buffer; pass sample()'s envs/starts."
            )
        keep = rows >= self._first_row()[env_b]
        slots = rows[keep] % self._allocated
        for name, arr in values.items():
            self._data[name][slots, env_b[keep]] = arr[keep]
        return int(keep.sum())

    def read_rows(self, env: int, rows: np.ndarray | Sequence[int]) -> dict[str, np.ndarray]:
        """Stored fields (copies, not annotated) of absolute rows ``rows`` (N,) of one env stream."""
        rows = np.asarray(rows, dtype=np.int64)
        first, total = int(self._first_row()[env]), int(self._total[env])
        if rows.size and (rows.min() < first or rows.max() >= total):
            raise IndexError(
                f"env {env} stores rows [{first}, {total}), asked for {rows.min()}..{rows.max()}."
            )
        if self._data is None:
            return {name: np.zeros((0, *shape), dtype) for name, (shape, dtype) in self.fields.items()}
        return {name: arr[rows % self._allocated, env] for name, arr in self._data.items()}

    # ------------------------------------------------------------ save/load

    def export_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``(arrays, meta)``: the stored rows and everything else as safe values (see ``replay_state``)."""
        meta = {
            "class": "SequenceReplay",
            "init": {
                "buffer_size": self.capacity_per_env * self.n_envs,
                "observation_space": self.observation_space,
                "action_space": self.action_space,
                "n_envs": self.n_envs,
                "fields": fields_to_meta(self.fields),
                "window": self.window,
                "seed": self.seed,
                "online": self.online,
            },
            "allocated": self._allocated,
            "rng": self.rng,
        }
        arrays = {"total": self._total.copy(), "queue": self.online_queue}
        for name, arr in (self._data or {}).items():
            arrays[f"field/{name}"] = arr
        return arrays, meta

    def import_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        """Fill a freshly built buffer from :meth:`export_state`'s output; ValueError if inconsistent."""
        allocated = int(meta["allocated"])
        total = np.asarray(arrays["total"])
        queue = np.asarray(arrays["queue"])
        if not 0 <= allocated <= self.capacity_per_env:
            raise ValueError(f"allocated rows {allocated} outside [0, {self.capacity_per_env}]")
        if total.shape != (self.n_envs,) or total.dtype.kind not in "iu" or total.min(initial=0) < 0:
            raise ValueError(f"row counters of shape {total.shape} {total.dtype}")
        if allocated < self.capacity_per_env and total.max(initial=0) > allocated:
            raise ValueError("row counters exceed the stored rows")
        if queue.ndim != 2 or queue.shape[1] != 2 or queue.dtype.kind not in "iu":
            raise ValueError(f"online queue of shape {queue.shape}")
        if queue.size and (queue[:, 0].min() < 0 or queue[:, 0].max() >= self.n_envs):
            raise ValueError("online queue names an env that does not exist")
        self._data = read_fields(arrays, self.fields, (allocated, self.n_envs)) if allocated else None
        self._allocated = allocated
        self._total = total.astype(np.int64)
        self._queue = deque(map(tuple, queue.astype(np.int64).tolist()))
        self.rng = meta["rng"]

    def reset(self) -> None:
        """Drop every row and the online queue; keep the allocation and the generator."""
        super().reset()
        self._total[:] = 0
        self._queue.clear()


def annotate_batch(batch: dict[str, np.ndarray]) -> None:
    """In place, the reference's ``_annotate_batch`` on fields shaped (count, batch, window, ...).

    ``is_first`` is set on row 0 of every window (a window may start mid-episode), and ``is_last`` on
    every row whose next row in the window is first (an episode cut inside the window ends there).
    Only fields named ``is_first``/``is_last`` are touched, when present.
    """
    if "is_first" not in batch:
        return
    is_first = batch["is_first"]
    is_first[:, :, 0] = True
    if "is_last" in batch:
        is_last = batch["is_last"]
        next_first = np.zeros(is_last.shape, dtype=bool)
        next_first[:, :, :-1] = is_first[:, :, 1:].astype(bool)
        batch["is_last"] = np.logical_or(is_last, next_first).astype(is_last.dtype)

"""Episode replay: TD-MPC2's whole-episode storage sampled in windows, as an SB3 ``ReplayBuffer``.

An episode of L agent steps is stored as L + 1 *entries* (``tdmpc2/common/buffer.py @b67b21c``):
entry 0 holds the reset observation, entry k ≥ 1 the observation after step k with the action and
reward of step k (and its termination flag). Episodes enter the replay only when they end
(``online_trainer.py:91``): the running episode of each env is kept apart and never sampled.

A sampled item is a window of ``window`` = H + 1 consecutive entries of one stored episode:
``obs`` (H+1, B, O) time-major, and the H actions, rewards and flags that connect them. An episode
is drawn uniformly, then a start uniformly among its valid ones (the task pool's sampler too,
:func:`~sb3_worldmodels.blocks.episodes.sample_windows`): 0 .. L − H − 1 in the reference
(its crop never draws the window that ends on the final entry, buffer.py:60-70@b67b21c), or
0 .. L − H with ``include_last_window`` (the later SliceSampler, needed for terminations:
buffer.py:102-106@7ec6bc8). Episodes with no valid start are not stored.

Entries live in one ring of ``capacity_entries`` slots, addressed by an absolute entry counter;
the oldest episodes are evicted whole once the stored steps exceed ``capacity_steps``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer

from sb3_worldmodels.blocks.episodes import sample_windows, window_start_counts
from sb3_worldmodels.common.replay import FieldSpec, _normalize_fields, fields_to_meta, read_fields, row_bytes


class EpisodeReplay(ReplayBuffer):
    """Finished episodes of every env, sampled as windows inside one episode (see the module docstring).

    :param capacity_steps: most agent steps kept (the reference's ``min(buffer_size, steps)``).
    :param n_envs: env streams whose running episodes are kept apart.
    :param fields: ``name -> (shape, dtype)`` of one entry; must include "obs".
    :param window: entries per sampled item (H + 1).
    :param include_last_window: also draw the window that ends on an episode's final entry.
    :param seed: seed of the buffer's own ``np.random.Generator`` (saved with the buffer).
    """

    def __init__(
        self,
        capacity_steps: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        n_envs: int,
        fields: Mapping[str, tuple[Any, Any]],
        window: int,
        include_last_window: bool,
        seed: int,
    ) -> None:
        BaseBuffer.__init__(
            self, capacity_steps, observation_space, action_space, device="cpu", n_envs=n_envs
        )
        if window < 2:
            raise ValueError(f"window must be at least 2 entries, got {window}.")
        self.fields: dict[str, FieldSpec] = _normalize_fields(fields)
        if "obs" not in self.fields:
            raise ValueError("EpisodeReplay needs an 'obs' field.")
        self.window = int(window)
        self.include_last_window = bool(include_last_window)
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.optimize_memory_usage = False
        self.handle_timeout_termination = False
        self.capacity_steps = 0
        self._data: dict[str, np.ndarray] | None = None
        self._slots = 0
        self.layout_version = 0
        """Changes whenever the ring's slots are rebuilt or refilled whole (a copy of the ring must be
        made anew); entries are otherwise only appended, at absolute index :attr:`end`."""
        self._end = 0  # absolute index one past the last stored entry
        self._episodes: deque[tuple[int, int]] = deque()  # (absolute first entry, steps L), oldest first
        self._table: np.ndarray | None = None  # _episode_table's array of them, until they change
        self._stored_steps = 0
        self._open: list[list[dict[str, np.ndarray]]] = [[] for _ in range(n_envs)]
        self._finished: list[list[dict[str, np.ndarray]]] = []
        self.reserve(capacity_steps)

    # ------------------------------------------------------------------ sizes
    @property
    def min_steps(self) -> int:
        """Shortest storable episode: one valid window start."""
        return self.window - 1 if self.include_last_window else self.window

    @property
    def num_episodes(self) -> int:
        return len(self._episodes)

    @property
    def stored_steps(self) -> int:
        return self._stored_steps

    @property
    def num_windows(self) -> int:
        """Windows that can be sampled now."""
        return int(self._start_counts(self._episode_table()).sum())

    @property
    def nbytes(self) -> int:
        return 0 if self._data is None else int(sum(a.nbytes for a in self._data.values()))

    def size(self) -> int:
        return self._stored_steps

    @property
    def end(self) -> int:
        """Absolute index one past the last stored entry (entry i lives in slot i % :attr:`slots`)."""
        return self._end

    @property
    def slots(self) -> int:
        """Slots of the entry ring (0 until the first episode is stored)."""
        return self._slots

    def ring(self, name: str) -> np.ndarray | None:
        """The field's ring of entries (slots, ...), None before the first stored episode."""
        return None if self._data is None else self._data[name]

    def _episode_table(self) -> np.ndarray:
        """(n, 2) int64: each stored episode's absolute first entry and its steps, oldest first (built
        once after the stored episodes change, not at every sample: O(episodes) each)."""
        table = getattr(self, "_table", None)
        if table is None:
            table = np.asarray(list(self._episodes), np.int64).reshape(-1, 2)
            table.setflags(write=False)
            self._table = table
        return table

    def _start_counts(self, table: np.ndarray) -> np.ndarray:
        return window_start_counts(table[:, 1] + 1, self.window, self.include_last_window)

    def bytes_to_reserve(self, capacity_steps: int) -> int:
        """Bytes the entry ring holds once ``capacity_steps`` steps are stored (it is allocated whole)."""
        steps = max(self.capacity_steps, int(capacity_steps))
        return (steps + math.ceil(steps / self.min_steps) + 1) * row_bytes(self.fields)

    def field_bytes(self, name: str, entries: int | None = None) -> int:
        """Bytes of ``entries`` entries of one field (None: the ring at the current capacity)."""
        shape, dtype = self.fields[name]
        n = self._capacity_entries if entries is None else int(entries)
        return n * math.prod(shape) * np.dtype(dtype).itemsize

    def reserve(self, capacity_steps: int) -> None:
        """Raise the capacity to ``capacity_steps`` agent steps (never lowers it); the ring grows
        lazily, keeping the stored entries in order."""
        capacity_steps = int(capacity_steps)
        if capacity_steps < self.min_steps:
            raise ValueError(
                f"A replay of {capacity_steps} steps cannot hold one episode of {self.min_steps} steps "
                "(horizon + 1): train for more steps or raise buffer_size."
            )
        if capacity_steps <= self.capacity_steps:
            return
        self.capacity_steps = capacity_steps
        self.buffer_size = capacity_steps
        # Each stored episode has at least min_steps steps and one more entry than steps.
        self._capacity_entries = capacity_steps + math.ceil(capacity_steps / self.min_steps) + 1
        if self._data is not None:
            self._resize(self._capacity_entries)

    def _resize(self, slots: int) -> None:
        first = self._episodes[0][0] if self._episodes else self._end
        idx = np.arange(first, self._end) % max(self._slots, 1)
        data = {}
        for name, (shape, dtype) in self.fields.items():
            arr = np.zeros((slots, *shape), dtype)
            if self._data is not None and idx.size:
                arr[(np.arange(first, self._end)) % slots] = self._data[name][idx]
            data[name] = arr
        self._data, self._slots = data, slots
        self.layout_version = getattr(self, "layout_version", 0) + 1

    # ------------------------------------------------------------------ adding
    def add_entries(self, envs: np.ndarray, entries: Mapping[str, np.ndarray]) -> None:
        """Append one entry to the running episode of each env in ``envs`` (k,); fields (k, ...)."""
        for j, env in enumerate(np.asarray(envs)):
            self._open[int(env)].append({name: np.array(entries[name][j]) for name in self.fields})

    def finish_episode(self, env: int) -> None:
        """End the running episode of ``env`` without storing it yet: :meth:`store_finished` stores it.
        (The reference's loop adds a finished episode to its buffer at the start of the next step.)"""
        entries, self._open[env] = self._open[env], []
        self._finished.append(entries)

    def store_finished(self) -> int:
        """Store the episodes ended by :meth:`finish_episode`, in order; returns how many were stored."""
        finished, self._finished = self._finished, []
        return sum(self._store(entries) for entries in finished)

    def _store(self, entries: list[dict[str, np.ndarray]]) -> bool:
        steps = len(entries) - 1
        if steps < self.min_steps:
            return False
        if steps > self.capacity_steps:
            raise ValueError(
                f"An episode of {steps} steps does not fit a replay of {self.capacity_steps} steps: "
                "raise buffer_size or train for more steps."
            )
        if self._data is None:
            self._resize(self._capacity_entries)
        self._table = None  # the stored episodes change
        while self._stored_steps + steps > self.capacity_steps or (
            self._episodes and self._end + steps + 1 - self._episodes[0][0] > self._slots
        ):
            _, old = self._episodes.popleft()
            self._stored_steps -= old
        idx = np.arange(self._end, self._end + steps + 1) % self._slots
        for name in self.fields:
            self._data[name][idx] = np.stack([e[name] for e in entries])  # type: ignore[index]
        self._episodes.append((self._end, steps))
        self._end += steps + 1
        self._stored_steps += steps
        return True

    @property
    def longest_running(self) -> int:
        """Steps of the longest episode still running (0 when none has started)."""
        return max((len(entries) - 1 for entries in self._open), default=0)

    def discard_running(self) -> None:
        """Forget every env's running episode (e.g. on a new ``learn`` with fresh envs)."""
        self._open = [[] for _ in range(self.n_envs)]

    # ------------------------------------------------------------------ save/load
    def export_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``(arrays, meta)``: the stored entries, the running and finished-but-unstored episodes, and
        everything else as safe values (see ``replay_state``)."""
        meta = {
            "class": "EpisodeReplay",
            "init": {
                "capacity_steps": self.capacity_steps,
                "observation_space": self.observation_space,
                "action_space": self.action_space,
                "n_envs": self.n_envs,
                "fields": fields_to_meta(self.fields),
                "window": self.window,
                "include_last_window": self.include_last_window,
                "seed": self.seed,
            },
            "slots": self._slots,
            "end": self._end,
            "running": [len(entries) for entries in self._open],
            "finished": [len(entries) for entries in self._finished],
            "rng": self.rng,
        }
        arrays = {"episodes": np.asarray(list(self._episodes), dtype=np.int64).reshape(-1, 2)}
        for name, arr in (self._data or {}).items():
            arrays[f"field/{name}"] = arr
        for group, episodes in (("running", self._open), ("finished", self._finished)):
            for i, entries in enumerate(episodes):
                for name, (shape, dtype) in self.fields.items():
                    empty = np.zeros((0, *shape), dtype)
                    arrays[f"{group}/{i}/{name}"] = np.stack([e[name] for e in entries]) if entries else empty  # type: ignore[assignment]
        return arrays, meta

    def import_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        """Fill a freshly built buffer from :meth:`export_state`'s output; ValueError if inconsistent."""
        slots, end = int(meta["slots"]), int(meta["end"])
        episodes = np.asarray(arrays["episodes"])
        if episodes.ndim != 2 or episodes.shape[1] != 2 or episodes.dtype.kind not in "iu":
            raise ValueError(f"episode table of shape {episodes.shape}")
        if slots not in (0, self._capacity_entries) or end < 0:
            raise ValueError(f"{slots} slots do not fit a capacity of {self.capacity_steps} steps")
        stored = int(episodes[:, 1].sum()) if len(episodes) else 0
        if len(episodes) and (
            episodes[:, 1].min() < self.min_steps
            or stored > self.capacity_steps
            or episodes[0, 0] < end - slots
            or episodes[-1, 0] + episodes[-1, 1] + 1 != end
        ):
            raise ValueError("the episode table does not fit the stored entries")
        running = [int(n) for n in meta["running"]]
        if len(running) != self.n_envs:
            raise ValueError(f"{len(running)} running episodes for {self.n_envs} envs")
        self._data = read_fields(arrays, self.fields, (slots,)) if slots else None
        self._slots, self._end = slots, end
        self.layout_version = getattr(self, "layout_version", 0) + 1
        self._episodes = deque(map(tuple, episodes.astype(np.int64).tolist()))
        self._table = None
        self._stored_steps = stored
        self._open = [self._read_entries(arrays, f"running/{i}/", n) for i, n in enumerate(running)]
        self._finished = [
            self._read_entries(arrays, f"finished/{i}/", int(n)) for i, n in enumerate(meta["finished"])
        ]
        self.rng = meta["rng"]

    def _read_entries(
        self, arrays: Mapping[str, np.ndarray], prefix: str, n: int
    ) -> list[dict[str, np.ndarray]]:
        stacked = read_fields(arrays, self.fields, (n,), prefix=prefix)
        return [{name: stacked[name][k] for name in self.fields} for k in range(n)]

    # ------------------------------------------------------------------ sampling
    def sample(  # type: ignore[override]
        self, batch_size: int, count: int | None = None, env: Any = None, rows_of: tuple[str, ...] = ()
    ) -> dict[str, np.ndarray]:
        """``count`` batches (or one, if None) of ``batch_size`` windows, time-major:
        each field (count, window, B, ...) (or (window, B, ...)); the fields named in ``rows_of`` as
        their slots in the ring instead, int32 (count, window, B) (a copy of the ring elsewhere,
        e.g. in device memory, gives their values)."""
        if not self._episodes:
            raise ValueError("The replay holds no finished episode with a full window yet.")
        k = 1 if count is None else int(count)
        table = self._episode_table()
        counts = self._start_counts(table)
        _, rows = sample_windows(self.rng, table[:, 0], counts, self.window, (k, batch_size))
        idx = rows % self._slots  # (k, W, B)
        data: dict[str, np.ndarray] = self._data  # type: ignore[assignment]
        out = {name: idx.astype(np.int32) if name in rows_of else arr[idx] for name, arr in data.items()}
        return out if count is not None else {name: v[0] for name, v in out.items()}

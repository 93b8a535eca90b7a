"""Task pools: the episodes of several tasks in one table on disk, memory-mapped, sampled in windows.

A *task pool* (:func:`pool_tasks`, :func:`load_pool`) is a directory of ``.npy`` files holding the
episodes of several tasks in one table, each entry tagged with its task id (buffer.py:18,28@b67b21c),
observations zero-padded to the widest task's observation and actions to the widest action
(multitask.py:17-21,44-47@b67b21c; the padded action dims of a task are 0, as its action mask
leaves them, world_model.py:21-23@b67b21c), and a ``meta.json``. Read without unpickling
(``allow_pickle=False``). The arrays stay memory-mapped, so a pool larger than memory can be sampled.

:meth:`TaskPool.sample` draws the reference's training windows: H + 1 consecutive entries of one
episode, the episode uniformly, then the start uniformly among those whose window does not end on the
episode's last entry (the reference's random crop, buffer.py:60-70@b67b21c), with the online replay's
sampler (:func:`~sb3_worldmodels.blocks.episodes.sample_windows`) without ``include_last_window``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sb3_worldmodels.blocks.episodes import discount_from_episode_length, sample_windows, window_start_counts
from sb3_worldmodels.data.episodes import FORMAT_VERSION, PathLike, read_export_header, read_export_values

POOL_FORMAT = "sb3_worldmodels.task_pool"
MAX_TASKS = int(np.iinfo(np.int16).max) + 1  # task ids are stored as int16

_TASK_KEYS = ("name", "obs_dim", "action_dim", "episode_length", "episodes", "entries")


# ---------------------------------------------------------------------------------------------- pool
def pool_tasks(
    sources: Mapping[str, PathLike] | Iterable[tuple[str, PathLike]], path: PathLike, overwrite: bool = False
) -> TaskPool:
    """Pool the episode exports of several tasks into one task-pool directory and load it.

    The tasks' order is their task id. Observations are zero-padded to the widest task's
    observation, actions to the widest action. The directory is built next to ``path`` and renamed
    into place once complete: a failure leaves nothing behind.

    :param sources: task name -> its :func:`export_episodes` file (a mapping, or (name, file) pairs).
    :param path: the pool directory to write.
    :param overwrite: replace an existing pool at ``path`` (a directory that is not a pool is never
        replaced).
    :return: :func:`load_pool` of the written directory.
    """
    target = Path(path)
    pairs: list[tuple[Any, PathLike]] = (
        list(sources.items()) if isinstance(sources, Mapping) else [(name, file) for name, file in sources]
    )
    check_task_names([name for name, _ in pairs], "pool_tasks")
    check_pool_target(target, overwrite)
    exports = [read_export_header(name, Path(file)) for name, file in pairs]
    tasks = [
        PoolTask(e.name, e.obs_dim, e.action_dim, e.episode_length, e.episodes, e.entries) for e in exports
    ]

    def fill(out: Mapping[str, np.ndarray], starts: np.ndarray) -> None:
        row = episode = 0
        for task_id, export in enumerate(exports):
            values = read_export_values(export)
            obs, action, reward = values["obs"], values["action"], values["reward"]
            write_task_rows(out, row, task_id, tasks[task_id], obs, action, reward)
            starts[episode + 1 : episode + export.episodes + 1] = row + export.episode_starts[1:]
            row, episode = row + export.entries, episode + export.episodes

    return build_pool(target, overwrite, tasks, fill)


@dataclass(frozen=True)
class PoolTask:
    """One task's entry of a pool's meta.json (its task id is its position)."""

    name: str
    obs_dim: int
    action_dim: int
    episode_length: int
    episodes: int
    entries: int


def write_task_rows(
    out: Mapping[str, np.ndarray],
    row: int,
    task_id: int,
    task: PoolTask,
    obs: np.ndarray,
    action: np.ndarray,
    reward: np.ndarray,
) -> None:
    """Write entries of one task from ``row`` on, zero-padding its observations and actions."""
    rows = slice(row, row + len(obs))
    out["obs"][rows] = 0.0
    out["obs"][rows, : task.obs_dim] = obs[:, : task.obs_dim]
    out["action"][rows] = 0.0
    out["action"][rows, : task.action_dim] = action[:, : task.action_dim]
    out["reward"][rows] = reward
    out["task"][rows] = task_id


def build_pool(
    target: Path,
    overwrite: bool,
    tasks: list[PoolTask],
    fill: Callable[[Mapping[str, np.ndarray], np.ndarray], None],
) -> TaskPool:
    """Write a pool of ``tasks`` (in task id order) at ``target``: ``fill(arrays, episode_starts)``
    writes the memory-mapped arrays (tasks' episodes contiguous, in task id order) and the episode
    offsets. Built next to ``target``, renamed into place once complete."""
    obs_dim = max(task.obs_dim for task in tasks)
    action_dim = max(task.action_dim for task in tasks)
    entries = sum(task.entries for task in tasks)
    episodes = sum(task.episodes for task in tasks)
    building = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    try:
        building.mkdir(parents=True)
        files = {
            "obs": ((entries, obs_dim), np.float32),
            "action": ((entries, action_dim), np.float32),
            "reward": ((entries,), np.float32),
            "task": ((entries,), np.int16),
        }
        out = {
            key: np.lib.format.open_memmap(building / f"{key}.npy", mode="w+", dtype=dtype, shape=shape)
            for key, (shape, dtype) in files.items()
        }
        starts = np.zeros(episodes + 1, np.int64)
        fill(out, starts)
        for array in out.values():
            array.flush()
        del out
        np.save(building / "episode_starts.npy", starts)
        meta = {
            "format": POOL_FORMAT,
            "version": FORMAT_VERSION,
            "tasks": [{key: getattr(task, key) for key in _TASK_KEYS} for task in tasks],
            "obs_dim": obs_dim,
            "action_dim": action_dim,
        }
        (building / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        _move_into_place(building, target, overwrite)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return load_pool(target)


def check_task_names(names: list[Any], where: str) -> None:
    if not names:
        raise ValueError(f"{where}: no task given.")
    if len(names) > MAX_TASKS:
        raise ValueError(f"{where}: {len(names)} tasks, at most {MAX_TASKS} fit the int16 task ids.")
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{where}: task names must be non-empty strings, got {name!r}.")
    duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
    if duplicates:
        raise ValueError(f"{where}: task names must be unique; {duplicates} appear more than once.")


def _is_pool(path: Path) -> bool:
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == POOL_FORMAT


def check_pool_target(target: Path, overwrite: bool) -> None:
    if not target.exists():
        return
    if not target.is_dir():
        raise ValueError(f"{target} exists and is not a directory: choose another path for the pool.")
    if not any(target.iterdir()):
        return
    if not overwrite:
        raise ValueError(
            f"{target} already exists and is not empty: pass overwrite=True to replace the pool there, "
            "or choose another path."
        )
    if not _is_pool(target):
        raise ValueError(
            f"{target} is not a task pool (no meta.json of format {POOL_FORMAT!r}); overwrite=True only "
            "replaces a pool. Remove it yourself or choose another path."
        )


def _move_into_place(building: Path, target: Path, overwrite: bool) -> None:
    check_pool_target(target, overwrite)  # again: the target may have appeared meanwhile
    if target.is_dir() and not any(target.iterdir()):
        target.rmdir()
    if not target.exists():
        os.rename(building, target)
        return
    old = target.with_name(f"{target.name}.old-{os.getpid()}")
    os.rename(target, old)
    try:
        os.rename(building, target)
    except BaseException:
        os.rename(old, target)  # the previous pool stays in place
        raise
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------- load pool
@dataclass(frozen=True, eq=False, repr=False)
class TaskPool:
    """A task pool on disk (:func:`pool_tasks`), its arrays memory-mapped.

    With E entries in N episodes of T tasks, O = ``obs_dim`` and A = ``action_dim`` (the widest):
    ``obs`` (E, O) float32, ``action`` (E, A) float32, ``reward`` (E,) float32, ``task`` (E,) int16,
    ``episode_starts`` (N + 1,) int64 and ``episode_tasks`` (N,) int32 (in memory). Build it with
    :func:`load_pool`.
    """

    path: Path
    tasks: tuple[str, ...]
    obs_dims: tuple[int, ...]
    action_dims: tuple[int, ...]
    episode_lengths: tuple[int, ...]
    obs_dim: int
    action_dim: int
    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    task: np.ndarray
    episode_starts: np.ndarray
    episode_tasks: np.ndarray
    _starts_by_window: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    @property
    def num_episodes(self) -> int:
        return len(self.episode_starts) - 1

    @property
    def num_entries(self) -> int:
        return int(self.episode_starts[-1])

    @property
    def nbytes(self) -> int:
        """Bytes of the pool's arrays (on disk; memory-mapped, not held in memory)."""
        return int(
            sum(a.nbytes for a in (self.obs, self.action, self.reward, self.task, self.episode_starts))
        )

    @property
    def discounts(self) -> tuple[float, ...]:
        """Each task's discount from its episode length (tdmpc2.py:31-48@b67b21c's heuristic)."""
        return tuple(discount_from_episode_length(length) for length in self.episode_lengths)

    def __repr__(self) -> str:
        return (
            f"TaskPool({str(self.path)!r}, tasks={list(self.tasks)}, episodes={self.num_episodes}, "
            f"entries={self.num_entries}, obs_dim={self.obs_dim}, action_dim={self.action_dim})"
        )

    def task_id(self, name: str) -> int:
        """The id of task ``name`` (its position in :attr:`tasks`)."""
        if name not in self.tasks:
            raise ValueError(f"Unknown task {name!r}; the pool's tasks are {list(self.tasks)}.")
        return self.tasks.index(name)

    def _window_starts(self, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(episodes with a window, their first entries, their number of window starts), (n,) int64."""
        if window not in self._starts_by_window:
            counts = window_start_counts(np.diff(self.episode_starts), window)
            eligible = np.flatnonzero(counts > 0)
            self._starts_by_window[window] = (eligible, self.episode_starts[eligible], counts[eligible])
        return self._starts_by_window[window]

    def sample(self, rng: np.random.Generator, batch_size: int, horizon: int) -> dict[str, np.ndarray]:
        """``batch_size`` windows of ``horizon`` + 1 consecutive entries, time-major.

        An episode is drawn uniformly among those with a window, then the start uniformly among its
        ``entries - horizon - 1`` starts: the window ending on an episode's last entry is never drawn
        (buffer.py:60-70@b67b21c). Only the sampled rows are read from disk.

        :return: ``obs`` (H+1, B, O) float32; ``action`` (H, B, A) and ``reward`` (H, B) float32, the
            steps between consecutive observations; ``task`` (B,) int32, the windows' task ids.
        """
        batch_size, horizon = int(batch_size), int(horizon)
        if batch_size < 1 or horizon < 1:
            raise ValueError(f"batch_size and horizon must be positive, got {batch_size} and {horizon}.")
        window = horizon + 1
        eligible, firsts, counts = self._window_starts(window)
        if not len(eligible):
            raise ValueError(
                f"No episode of the pool has more than horizon + 1 = {window} entries: nothing to sample."
            )
        pick, rows = sample_windows(rng, firsts, counts, window, (batch_size,))  # rows (H+1, B)
        episode = eligible[pick]
        return {
            "obs": np.asarray(self.obs[rows]),
            "action": np.asarray(self.action[rows[1:]]),
            "reward": np.asarray(self.reward[rows[1:]]),
            "task": self.episode_tasks[episode].astype(np.int32),
        }

    def episodes(self, task: str | int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Each episode of ``task`` (name or id) as in its export, without padding:
        ``(obs (L+1, o), action (L+1, a), reward (L+1,))``."""
        task_id = self.task_id(task) if isinstance(task, str) else int(task)
        if not 0 <= task_id < self.num_tasks:
            raise ValueError(f"Task id {task} is not in 0 .. {self.num_tasks - 1}.")
        obs_dim, action_dim = self.obs_dims[task_id], self.action_dims[task_id]
        for episode in np.flatnonzero(self.episode_tasks == task_id):
            rows = slice(int(self.episode_starts[episode]), int(self.episode_starts[episode + 1]))
            yield (
                np.array(self.obs[rows, :obs_dim]),
                np.array(self.action[rows, :action_dim]),
                np.array(self.reward[rows]),
            )


def is_count(value: Any, least: int) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and bool(value >= least)


def _read_pool_meta(path: Path) -> dict[str, Any]:
    file = path / "meta.json"
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory: a task pool is a directory written by pool_tasks().")
    if not file.is_file():
        raise ValueError(f"{path} has no meta.json: it is not a task pool written by pool_tasks().")
    try:
        meta = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{file} is not readable JSON: {error}") from error
    if not isinstance(meta, dict) or meta.get("format") != POOL_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"{file}: format {found!r}, not {POOL_FORMAT!r}: not a task pool.")
    if meta.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{file}: version {meta.get('version')!r} of the pool format; this version reads "
            f"{FORMAT_VERSION}."
        )
    tasks = meta.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise ValueError(f"{file}: 'tasks' must be a non-empty list.")
    for i, task in enumerate(tasks):
        if not isinstance(task, dict) or set(task) != set(_TASK_KEYS):
            raise ValueError(f"{file}: task {i} must have exactly the keys {list(_TASK_KEYS)}.")
        for key in _TASK_KEYS[1:]:
            if not is_count(task[key], 1):
                raise ValueError(f"{file}: task {i} '{key}' is {task[key]!r}, not a positive integer.")
        if task["entries"] < 2 * task["episodes"]:
            raise ValueError(f"{file}: task {i} has fewer than 2 entries per episode.")
    try:
        check_task_names([task["name"] for task in tasks], str(file))
    except ValueError as error:
        raise ValueError(str(error)) from None
    for key, widths in (("obs_dim", "obs_dim"), ("action_dim", "action_dim")):
        widest = max(task[widths] for task in tasks)
        if meta.get(key) != widest:
            raise ValueError(f"{file}: '{key}' is {meta.get(key)!r}, the widest task's is {widest}.")
    return meta


def _open_array(path: Path, name: str, dtype: Any, shape: tuple[int, ...], mmap: bool) -> np.ndarray:
    file = path / f"{name}.npy"
    if not file.is_file():
        raise ValueError(f"{path} lacks {file.name}: the pool is incomplete.")
    try:
        array = np.load(file, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, EOFError, ValueError) as error:
        raise ValueError(f"{file} is not a readable .npy array: {error}") from error
    if array.dtype != np.dtype(dtype) or array.shape != shape:
        raise ValueError(
            f"{file} is {array.dtype} of shape {array.shape}, expected {np.dtype(dtype)} of shape {shape}."
        )
    return array


def load_pool(path: PathLike) -> TaskPool:
    """Open a task pool written by :func:`pool_tasks`, its arrays memory-mapped read-only.

    Checks meta.json and every array's dtype and shape, the episode offsets and the task of every
    entry; ValueError naming the file and the problem otherwise.
    """
    path = Path(path)
    meta = _read_pool_meta(path)
    tasks = meta["tasks"]
    entries = sum(task["entries"] for task in tasks)
    episodes = sum(task["episodes"] for task in tasks)
    obs_dim, action_dim = meta["obs_dim"], meta["action_dim"]
    starts = _open_array(path, "episode_starts", np.int64, (episodes + 1,), mmap=False)
    sizes = np.diff(starts)
    if starts[0] != 0 or np.any(sizes < 2):
        raise ValueError(
            f"{path / 'episode_starts.npy'}: offsets must start at 0 and increase by at least 2."
        )
    episode_tasks = np.repeat(np.arange(len(tasks), dtype=np.int32), [task["episodes"] for task in tasks])
    per_task = np.bincount(episode_tasks, weights=sizes, minlength=len(tasks)).astype(np.int64)
    if per_task.tolist() != [task["entries"] for task in tasks]:
        raise ValueError(
            f"{path / 'episode_starts.npy'}: the episodes hold {per_task.tolist()} entries per task, "
            f"meta.json says {[task['entries'] for task in tasks]}."
        )
    task = _open_array(path, "task", np.int16, (entries,), mmap=True)
    if not np.array_equal(task, np.repeat(episode_tasks, sizes)):
        raise ValueError(
            f"{path / 'task.npy'}: the task ids do not follow the episodes of meta.json's tasks."
        )
    return TaskPool(
        path=path,
        tasks=tuple(t["name"] for t in tasks),
        obs_dims=tuple(t["obs_dim"] for t in tasks),
        action_dims=tuple(t["action_dim"] for t in tasks),
        episode_lengths=tuple(t["episode_length"] for t in tasks),
        obs_dim=obs_dim,
        action_dim=action_dim,
        obs=_open_array(path, "obs", np.float32, (entries, obs_dim), mmap=True),
        action=_open_array(path, "action", np.float32, (entries, action_dim), mmap=True),
        reward=_open_array(path, "reward", np.float32, (entries,), mmap=True),
        task=task,
        episode_starts=starts,
        episode_tasks=episode_tasks,
    )

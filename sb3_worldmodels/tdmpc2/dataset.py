"""Offline multi-task data for TD-MPC2: one task's episodes exported from an agent, pooled across tasks.

Two on-disk formats, both read without unpickling (``allow_pickle=False``):

- An *episode export* (:func:`export_episodes`): one ``.npz`` holding a TD-MPC2 agent's finished
  episodes, whole, as its replay stores them (:mod:`sb3_worldmodels.common.episode_replay`): an
  episode of L agent steps is L + 1 *entries*, entry 0 the reset observation with a zero action and
  reward, entry k >= 1 the observation after step k with the action (agent units, [-1, 1]) and
  reward of step k.
- A *task pool* (:func:`pool_tasks`, :func:`load_pool`): a directory of ``.npy`` files holding the
  episodes of several tasks in one table, each entry tagged with its task id (buffer.py:18,28@b67b21c),
  observations zero-padded to the widest task's observation and actions to the widest action
  (multitask.py:17-21,44-47@b67b21c; the padded action dims of a task are 0, as its action mask
  leaves them, world_model.py:21-23@b67b21c). The arrays stay memory-mapped, so a pool larger than
  memory can be sampled.

:meth:`TaskPool.sample` draws the reference's training windows: H + 1 consecutive entries of one
episode, the episode uniformly, then the start uniformly among those whose window does not end on the
episode's last entry (the reference's random crop, buffer.py:60-70@b67b21c), the same rule as
:class:`~sb3_worldmodels.common.episode_replay.EpisodeReplay` without ``include_last_window``.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sb3_worldmodels.tdmpc2.config import discount_from_episode_length

EPISODES_FORMAT = "sb3_worldmodels.episodes"
POOL_FORMAT = "sb3_worldmodels.task_pool"
FORMAT_VERSION = 1
MAX_TASKS = int(np.iinfo(np.int16).max) + 1  # task ids are stored as int16

PathLike = str | os.PathLike[str]

# The arrays of an episode export: name -> (dtype, number of axes).
_EXPORT_ARRAYS: dict[str, tuple[np.dtype, int]] = {
    "obs": (np.dtype(np.float32), 2),
    "action": (np.dtype(np.float32), 2),
    "reward": (np.dtype(np.float32), 1),
    "episode_starts": (np.dtype(np.int64), 1),
}
_EXPORT_SCALARS = ("format", "version", "obs_dim", "action_dim", "episode_length")
_TASK_KEYS = ("name", "obs_dim", "action_dim", "episode_length", "episodes", "entries")


# ------------------------------------------------------------------------------------------- export
def export_episodes(agent: Any, path: PathLike, episode_length: int | None = None) -> Path:
    """Write a TD-MPC2 agent's finished episodes, whole, to one ``.npz`` (one task).

    The episodes are the replay's stored ones, oldest first, then those that ended on the last step
    (the replay stores an episode at the step after it ends). Written atomically: a temporary file in
    the same folder, then renamed onto ``path``.

    File contents, with E the entries of all N episodes:
    ``obs`` (E, O) float32, ``action`` (E, A) float32 (zeros at each episode's entry 0),
    ``reward`` (E,) float32 (0 at entry 0), ``episode_starts`` (N + 1,) int64 (episode i is entries
    ``episode_starts[i]:episode_starts[i + 1]``), ``terminated`` (E,) bool for an ``episodic``
    agent, and the scalars ``format`` ("sb3_worldmodels.episodes"), ``version`` (1), ``obs_dim``,
    ``action_dim`` and ``episode_length`` (agent steps per episode, the one the discount comes from).

    :param agent: a trained :class:`~sb3_worldmodels.TDMPC2` (read through its attributes).
    :param path: the file to write (its folder is created if needed).
    :param episode_length: agent steps per episode; None reads the agent's ``agent_episode_length``.
    :return: ``path`` as a :class:`~pathlib.Path`.
    """
    name = type(agent).__name__
    replay = getattr(agent, "replay_buffer", None)
    config = getattr(agent, "_config", None)
    if replay is None or config is None or not hasattr(replay, "export_state"):
        raise ValueError(
            f"{name} has no episode replay to export: train it with learn() (or load its replay with "
            "load_replay_buffer()) first."
        )
    if getattr(config, "image_shape", ()):
        raise ValueError(
            f"{name} learns from images {tuple(config.image_shape)}: export_episodes writes state "
            "observations for multi-task training, which takes state vectors only (as the reference's "
            "multi-task data). Image episodes cannot be exported: train the agents to export on the "
            "tasks' state observations."
        )
    arrays, meta = replay.export_state()
    if meta.get("class") != "EpisodeReplay":
        raise ValueError(
            f"export_episodes reads a TD-MPC2 agent's episode replay; {name} keeps a {meta.get('class')}."
        )
    obs_dim, action_dim = int(config.obs_dim), int(config.action_dim)
    _check_flat_observations(agent, obs_dim)
    episodes = _replay_episodes(arrays, meta)
    if not episodes:
        raise ValueError(
            f"{name}'s replay holds no finished episode: learn for more steps than one episode (an "
            "env that never ends an episode needs a gymnasium.wrappers.TimeLimit)."
        )
    for rows in episodes:
        if rows["obs"].ndim != 2 or rows["obs"].shape[1] != obs_dim:
            raise ValueError(
                f"{name}'s replay stores observations of shape {rows['obs'].shape[1:]}, not flat vectors "
                f"of {obs_dim} values: only flat (or flattened Dict) observations can be exported."
            )
    if episode_length is None:
        episode_length = getattr(agent, "agent_episode_length", None)
        if episode_length is None:
            raise ValueError(
                f"{name} does not know its episode length (its env does not say it): pass "
                "export_episodes(..., episode_length=<agent steps per episode>)."
            )
    if int(episode_length) < 1:
        raise ValueError(f"episode_length must be a positive number of agent steps, got {episode_length}.")

    sizes = np.array([len(rows["obs"]) for rows in episodes], np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    out = {
        "format": np.array(EPISODES_FORMAT),
        "version": np.array(FORMAT_VERSION, np.int64),
        "obs_dim": np.array(obs_dim, np.int64),
        "action_dim": np.array(action_dim, np.int64),
        "episode_length": np.array(int(episode_length), np.int64),
        "obs": np.concatenate([rows["obs"] for rows in episodes]).astype(np.float32),
        "action": np.concatenate([rows["action"] for rows in episodes]).astype(np.float32),
        "reward": np.concatenate([rows["reward"] for rows in episodes]).astype(np.float32),
        "episode_starts": starts,
    }
    out["action"][starts[:-1]] = 0.0  # entry 0 has no action or reward
    out["reward"][starts[:-1]] = 0.0
    if bool(getattr(config, "episodic", False)):
        out["terminated"] = np.concatenate([rows["terminated"] for rows in episodes]).astype(bool)
    return _write_atomically(Path(path), out)


def _check_flat_observations(agent: Any, obs_dim: int) -> None:
    """Refuse observation spaces whose values are not one flat vector of ``obs_dim`` values (a Dict
    counts when its Box entries concatenate to that vector, as the agent flattens it)."""
    from gymnasium import spaces

    space = getattr(agent, "observation_space", None)
    parts = list(space.spaces.values()) if isinstance(space, spaces.Dict) else [space]
    boxes = [part for part in parts if isinstance(part, spaces.Box)]
    if len(boxes) != len(parts):
        raise ValueError(
            f"{type(agent).__name__} has observation space {space}: only flat Box observations (or a "
            "Dict of Box vectors) can be exported."
        )
    width = sum(int(np.prod(box.shape, dtype=np.int64)) for box in boxes)
    if width != obs_dim:
        raise ValueError(
            f"{type(agent).__name__}'s observation space {space} holds {width} values, its model reads "
            f"{obs_dim}: the observations are not flat vectors and cannot be exported."
        )


def _replay_episodes(
    arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]
) -> list[dict[str, np.ndarray]]:
    """Each finished episode's entries (fields (L + 1, ...)), from ``EpisodeReplay.export_state``:
    the stored episodes in order, then the finished ones not stored yet that the replay will store
    (at least ``min_steps`` steps)."""
    fields = list(meta["init"]["fields"])
    slots = int(meta["slots"])
    episodes = []
    for first, steps in np.asarray(arrays["episodes"], np.int64).reshape(-1, 2):
        rows = (first + np.arange(steps + 1)) % slots
        episodes.append({name: np.asarray(arrays[f"field/{name}"])[rows] for name in fields})
    window = int(meta["init"]["window"])
    min_steps = window - 1 if bool(meta["init"]["include_last_window"]) else window
    for i, entries in enumerate(meta["finished"]):
        if int(entries) - 1 >= min_steps:
            episodes.append({name: np.asarray(arrays[f"finished/{i}/{name}"]) for name in fields})
    return episodes


def _write_atomically(path: Path, arrays: Mapping[str, np.ndarray]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(temporary, "wb") as handle:
            np.savez(handle, **arrays)  # type: ignore[arg-type]
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


# -------------------------------------------------------------------------------------- read export
@dataclass(frozen=True)
class _Export:
    """One task's export, checked except for its values (read by :func:`_read_export_values`)."""

    name: str
    file: Path
    obs_dim: int
    action_dim: int
    episode_length: int
    episode_starts: np.ndarray  # (N + 1,) int64
    has_terminated: bool

    @property
    def episodes(self) -> int:
        return len(self.episode_starts) - 1

    @property
    def entries(self) -> int:
        return int(self.episode_starts[-1])


def _member_header(archive: Any, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of one array of an ``.npz``, read from its header (no data)."""
    with archive.zip.open(f"{key}.npy") as handle:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(handle)
        elif version in ((2, 0), (3, 0)):
            shape, _, dtype = np.lib.format.read_array_header_2_0(handle)
        else:
            raise ValueError(f"unknown .npy format version {version}")
    return tuple(int(d) for d in shape), np.dtype(dtype)


def _scalar(archive: Any, key: str, kind: str, where: str) -> Any:
    value = archive[key]
    if value.ndim != 0 or value.dtype.kind not in kind:
        raise ValueError(f"{where}: '{key}' is {value.dtype} of shape {value.shape}, not a scalar.")
    return value[()]


def _read_export_header(name: str, file: Path) -> _Export:
    """Check one export's format, version, scalars, array dtypes and shapes, and episode offsets."""
    where = f"task {name!r} ({file})"
    try:
        loaded = np.load(file, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValueError("it is a single array, not an episode export (.npz)")
        with loaded as archive:
            missing = [key for key in (*_EXPORT_SCALARS, *_EXPORT_ARRAYS) if key not in archive.files]
            if missing:
                raise ValueError(f"it lacks {missing}: not an episode export written by export_episodes()")
            headers = {key: _member_header(archive, key) for key in archive.files}
            for key, (_, dtype) in headers.items():
                if dtype.hasobject:
                    raise ValueError(f"'{key}' holds Python objects (pickled data), which are not read")
            fmt = str(_scalar(archive, "format", "U", where))
            if fmt != EPISODES_FORMAT:
                raise ValueError(f"its format is {fmt!r}, not {EPISODES_FORMAT!r}")
            version = int(_scalar(archive, "version", "iu", where))
            if version != FORMAT_VERSION:
                raise ValueError(
                    f"it is version {version} of the episode format; this version reads {FORMAT_VERSION}"
                )
            dims = {key: int(_scalar(archive, key, "iu", where)) for key in _EXPORT_SCALARS[2:]}
            for key, value in dims.items():
                if value < 1:
                    raise ValueError(f"'{key}' is {value}, not a positive integer")
            for key, (dtype, ndim) in _EXPORT_ARRAYS.items():
                shape, stored = headers[key]
                if stored != dtype or len(shape) != ndim:
                    raise ValueError(f"'{key}' is {stored} of shape {shape}, expected {ndim}-D {dtype}")
            has_terminated = "terminated" in archive.files
            entries = headers["obs"][0][0]
            expected = {
                "obs": (entries, dims["obs_dim"]),
                "action": (entries, dims["action_dim"]),
                "reward": (entries,),
                **({"terminated": (entries,)} if has_terminated else {}),
            }
            for key, shape in expected.items():
                if headers[key][0] != shape:
                    raise ValueError(f"'{key}' has shape {headers[key][0]}, expected {shape}")
            if has_terminated and headers["terminated"][1] != np.dtype(bool):
                raise ValueError(f"'terminated' is {headers['terminated'][1]}, expected bool")
            starts = np.asarray(archive["episode_starts"])
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as error:
        raise ValueError(f"{where} is not a valid episode export: {error}") from error
    if len(starts) < 2 or starts[0] != 0 or starts[-1] != entries:
        raise ValueError(
            f"{where}: 'episode_starts' must run from 0 to the {entries} entries, got "
            f"{starts[:1].tolist()} .. {starts[-1:].tolist()} ({len(starts)} offsets)."
        )
    if np.any(np.diff(starts) < 2):
        raise ValueError(f"{where}: 'episode_starts' must increase by at least 2 (an episode has a step).")
    return _Export(
        name, file, dims["obs_dim"], dims["action_dim"], dims["episode_length"], starts, has_terminated
    )


def _read_export_values(export: _Export) -> dict[str, np.ndarray]:
    """The checked export's obs, action and reward, refused if not finite or if it terminates."""
    where = f"task {export.name!r} ({export.file})"
    with np.load(export.file, allow_pickle=False) as archive:
        values = {key: np.asarray(archive[key]) for key in ("obs", "action", "reward")}
        terminated = np.asarray(archive["terminated"]) if export.has_terminated else None
    for key, value in values.items():
        if not np.isfinite(value).all():
            bad = np.argwhere(~np.isfinite(value))[0].tolist()
            raise ValueError(f"{where}: '{key}' holds a NaN or inf (at index {bad}).")
    if terminated is not None and terminated.any():
        raise ValueError(
            f"{where} has {int(terminated.sum())} terminated episode(s): a task pool does not carry "
            "terminations (the reference's multi-task data has none, b67b21c). Pool only tasks whose "
            "episodes end by a time limit."
        )
    return values


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
    _check_task_names([name for name, _ in pairs], "pool_tasks")
    _check_target(target, overwrite)
    exports = [_read_export_header(name, Path(file)) for name, file in pairs]
    tasks = [
        _PoolTask(e.name, e.obs_dim, e.action_dim, e.episode_length, e.episodes, e.entries) for e in exports
    ]

    def fill(out: Mapping[str, np.ndarray], starts: np.ndarray) -> None:
        row = episode = 0
        for task_id, export in enumerate(exports):
            values = _read_export_values(export)
            _write_rows(out, row, task_id, tasks[task_id], values["obs"], values["action"], values["reward"])
            starts[episode + 1 : episode + export.episodes + 1] = row + export.episode_starts[1:]
            row, episode = row + export.entries, episode + export.episodes

    return _build_pool(target, overwrite, tasks, fill)


@dataclass(frozen=True)
class _PoolTask:
    """One task's entry of a pool's meta.json (its task id is its position)."""

    name: str
    obs_dim: int
    action_dim: int
    episode_length: int
    episodes: int
    entries: int


def _write_rows(
    out: Mapping[str, np.ndarray],
    row: int,
    task_id: int,
    task: _PoolTask,
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


def _build_pool(
    target: Path,
    overwrite: bool,
    tasks: list[_PoolTask],
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


# ----------------------------------------------------------------------------------- reference data
_CHUNK_KEYS = {"obs": 3, "action": 3, "reward": 2, "task": 2}  # key -> axes, (N episodes, T entries, ...)
_CHUNK_BLOCK = 4096  # episodes read from a chunk at a time


def read_reference_chunk(path: PathLike) -> dict[str, np.ndarray]:
    """One file of the reference's released multi-task data (mt30/mt80, read by
    offline_trainer.py:49-68@b67b21c): a TensorDict of N whole episodes of T entries saved with
    ``torch.save``, read without running code (:func:`~sb3_worldmodels.common.safe_io.load_tensordict`),
    the arrays memory-mapped.

    :return: ``obs`` (N, T, O) float32, ``action`` (N, T, A) float32, ``reward`` (N, T) float32,
        ``task`` (N, T) integer ids; entry 0 of an episode holds the reset observation, a dummy action
        and a NaN reward, as the reference's replay stores it.
    """
    from sb3_worldmodels.common.safe_io import load_tensordict

    entries = load_tensordict(path, f"the reference data file {path}")
    missing = sorted(set(_CHUNK_KEYS) - set(entries))
    if missing:
        raise ValueError(f"{path} lacks {missing}: a reference data chunk holds {sorted(_CHUNK_KEYS)}.")
    arrays = {key: entries[key].numpy() for key in _CHUNK_KEYS}
    n, t = arrays["reward"].shape[:2] if arrays["reward"].ndim == 2 else (-1, -1)
    for key, axes in _CHUNK_KEYS.items():
        if arrays[key].ndim != axes or arrays[key].shape[:2] != (n, t):
            shapes = {k: tuple(a.shape) for k, a in arrays.items()}
            raise ValueError(
                f"{path}: entries of shapes {shapes}; expected (N, T, O), (N, T, A), (N, T), (N, T)."
            )
    if t < 2:
        raise ValueError(f"{path}: episodes of {t} entries; at least 2 are needed.")
    if not np.issubdtype(arrays["task"].dtype, np.integer):
        raise ValueError(f"{path}: task ids of dtype {arrays['task'].dtype}, expected integers.")
    return arrays


def pool_reference_data(
    files: Iterable[PathLike],
    tasks: Mapping[str, tuple[int, int, int]],
    path: PathLike,
    overwrite: bool = False,
) -> TaskPool:
    """Convert the reference's released multi-task data into a task pool.

    :param files: the data's ``.pt`` chunk files (:func:`read_reference_chunk`).
    :param tasks: every task name in the order of the data's task ids (for the released data,
        :data:`~sb3_worldmodels.tdmpc2.multitask.TASK_SETS`), each with its ``(obs_dim, action_dim,
        episode_length)``: the task's own widths and its episode length in agent steps (the discount
        comes from it; the reference's: 500 for DMC, 100 for Meta-World, even where the data holds
        shorter segments).
    :param path: the pool directory to write (see :func:`pool_tasks`).
    :param overwrite: replace an existing pool at ``path``.

    Each episode keeps its task id (that of its first entry, as offline_trainer.py:64-66 and
    buffer.py:95@b67b21c); entry 0's dummy action and NaN reward become 0, as in :func:`export_episodes`;
    columns past a task's widths are zeroed. Chunks are read block by block and the pool is written
    through memory maps, so data larger than memory converts. Any other non-finite value, an episode
    whose entries disagree on the task, an id outside ``tasks``, data narrower than a task, or a task
    with no episode is refused (nothing is written).
    """
    target = Path(path)
    names = list(tasks)
    _check_task_names(names, "pool_reference_data")
    specs = []
    for name in names:
        spec = tasks[name]
        if not (
            isinstance(spec, (tuple, list)) and len(spec) == 3 and all(_is_count(int(v), 1) for v in spec)
        ):
            raise ValueError(
                f"pool_reference_data: task {name!r} needs (obs_dim, action_dim, episode_length), positive "
                f"integers; got {spec!r}."
            )
        specs.append(tuple(int(v) for v in spec))
    _check_target(target, overwrite)
    chunks = [Path(file) for file in files]
    if not chunks:
        raise ValueError("pool_reference_data: no data file given.")
    counts = np.zeros(len(names), np.int64)
    entries = np.zeros(len(names), np.int64)
    for chunk in chunks:  # first pass: check every file, count each task's episodes and entries
        data = read_reference_chunk(chunk)
        ids = _chunk_task_ids(chunk, data, specs)
        per_task = np.bincount(ids, minlength=len(names))
        counts += per_task
        entries += per_task * data["reward"].shape[1]
    empty = [name for name, count in zip(names, counts, strict=True) if count == 0]
    if empty:
        raise ValueError(
            f"pool_reference_data: the data holds no episode of {empty}; a pool needs episodes of every "
            "task (give the files of all tasks, or only the tasks they hold, in their id order)."
        )
    pool_tasks_ = [
        _PoolTask(name, o, a, length, int(n), int(e))
        for name, (o, a, length), n, e in zip(names, specs, counts, entries, strict=True)
    ]

    def fill(out: Mapping[str, np.ndarray], starts: np.ndarray) -> None:
        next_row = np.concatenate([[0], np.cumsum(entries)[:-1]])
        next_episode = np.concatenate([[0], np.cumsum(counts)[:-1]])
        for chunk in chunks:
            data = read_reference_chunk(chunk)
            ids = _chunk_task_ids(chunk, data, specs)
            length = data["reward"].shape[1]
            for first in range(0, len(ids), _CHUNK_BLOCK):
                block = slice(first, first + _CHUNK_BLOCK)
                obs, action = np.asarray(data["obs"][block]), np.asarray(data["action"][block])
                reward = np.array(data["reward"][block], np.float32)
                action[:, 0] = 0.0  # entry 0: no action or reward
                reward[:, 0] = 0.0
                if not (np.isfinite(obs).all() and np.isfinite(action).all() and np.isfinite(reward).all()):
                    raise ValueError(f"{chunk}: non-finite observations, actions or rewards (past entry 0).")
                for k in np.unique(ids[block]):
                    rows = np.flatnonzero(ids[block] == k)
                    row, episode = int(next_row[k]), int(next_episode[k])
                    task = pool_tasks_[k]
                    _write_rows(
                        out,
                        row,
                        int(k),
                        task,
                        obs[rows].reshape(-1, obs.shape[-1]),
                        action[rows].reshape(-1, action.shape[-1]),
                        reward[rows].reshape(-1),
                    )
                    ends = row + length * np.arange(1, len(rows) + 1)
                    starts[episode + 1 : episode + len(rows) + 1] = ends
                    next_row[k] += length * len(rows)
                    next_episode[k] += len(rows)

    return _build_pool(target, overwrite, pool_tasks_, fill)


def _chunk_task_ids(chunk: Path, data: Mapping[str, np.ndarray], specs: list[tuple[int, ...]]) -> np.ndarray:
    """(N,) each episode's task id, checked against the tasks and the data's widths."""
    task = np.asarray(data["task"])
    ids = task[:, 0].astype(np.int64)
    if np.any(task != task[:, :1]):
        raise ValueError(f"{chunk}: an episode's entries carry different task ids.")
    if ids.size and (ids.min() < 0 or ids.max() >= len(specs)):
        raise ValueError(
            f"{chunk}: task ids {int(ids.min())}..{int(ids.max())}; the tasks given are ids "
            f"0..{len(specs) - 1}."
        )
    obs_width, action_width = data["obs"].shape[-1], data["action"].shape[-1]
    for k in np.unique(ids):
        obs_dim, action_dim, _ = specs[k]
        if obs_dim > obs_width or action_dim > action_width:
            raise ValueError(
                f"{chunk}: task id {int(k)} is said to have {obs_dim} observations and {action_dim} actions, "
                f"the data holds {obs_width} and {action_width}."
            )
    return ids


def _check_task_names(names: list[Any], where: str) -> None:
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


def _check_target(target: Path, overwrite: bool) -> None:
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
    _check_target(target, overwrite)  # again: the target may have appeared meanwhile
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
    _starts_by_window: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

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

    def _window_starts(self, window: int) -> tuple[np.ndarray, np.ndarray]:
        """(episodes with a window, their number of window starts), both (n,) int64."""
        if window not in self._starts_by_window:
            counts = np.maximum(0, np.diff(self.episode_starts) - window)  # EpisodeReplay._valid_starts
            eligible = np.flatnonzero(counts > 0)
            self._starts_by_window[window] = (eligible, counts[eligible])
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
        eligible, counts = self._window_starts(window)
        if not len(eligible):
            raise ValueError(
                f"No episode of the pool has more than horizon + 1 = {window} entries: nothing to sample."
            )
        pick = rng.integers(0, len(eligible), size=batch_size)
        episode = eligible[pick]
        start = self.episode_starts[episode] + (rng.random(batch_size) * counts[pick]).astype(np.int64)
        rows = start[None, :] + np.arange(window)[:, None]  # (H+1, B)
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


def _is_count(value: Any, least: int) -> bool:
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
            if not _is_count(task[key], 1):
                raise ValueError(f"{file}: task {i} '{key}' is {task[key]!r}, not a positive integer.")
        if task["entries"] < 2 * task["episodes"]:
            raise ValueError(f"{file}: task {i} has fewer than 2 entries per episode.")
    try:
        _check_task_names([task["name"] for task in tasks], str(file))
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

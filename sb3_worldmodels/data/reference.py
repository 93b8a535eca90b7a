"""The reference's released multi-task data (mt30/mt80), read without running code and converted
into a task pool (:mod:`sb3_worldmodels.data.pool`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from sb3_worldmodels.data.episodes import PathLike
from sb3_worldmodels.data.pool import (
    PoolTask,
    TaskPool,
    build_pool,
    check_pool_target,
    check_task_names,
    is_count,
    write_task_rows,
)

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
    check_task_names(names, "pool_reference_data")
    specs = []
    for name in names:
        spec = tasks[name]
        if not (
            isinstance(spec, (tuple, list)) and len(spec) == 3 and all(is_count(int(v), 1) for v in spec)
        ):
            raise ValueError(
                f"pool_reference_data: task {name!r} needs (obs_dim, action_dim, episode_length), positive "
                f"integers; got {spec!r}."
            )
        specs.append(tuple(int(v) for v in spec))
    check_pool_target(target, overwrite)
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
        PoolTask(name, o, a, length, int(n), int(e))
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
                    write_task_rows(
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

    return build_pool(target, overwrite, pool_tasks_, fill)


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

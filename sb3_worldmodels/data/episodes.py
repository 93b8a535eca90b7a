"""Episode exports: one task's finished episodes, written from a TD-MPC2 agent's replay and read
back checked.

An *episode export* (:func:`export_episodes`) is one ``.npz`` holding the episodes whole, as the
agent's replay stores them (:mod:`sb3_worldmodels.common.episode_replay`): an episode of L agent
steps is L + 1 *entries*, entry 0 the reset observation with a zero action and reward, entry k >= 1
the observation after step k with the action (agent units, [-1, 1]) and reward of step k. It is read
without unpickling (``allow_pickle=False``). :func:`~sb3_worldmodels.data.pool.pool_tasks` pools the
exports of several tasks.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

EPISODES_FORMAT = "sb3_worldmodels.episodes"
FORMAT_VERSION = 1

PathLike = str | os.PathLike[str]

# The arrays of an episode export: name -> (dtype, number of axes).
_EXPORT_ARRAYS: dict[str, tuple[np.dtype, int]] = {
    "obs": (np.dtype(np.float32), 2),
    "action": (np.dtype(np.float32), 2),
    "reward": (np.dtype(np.float32), 1),
    "episode_starts": (np.dtype(np.int64), 1),
}
_EXPORT_SCALARS = ("format", "version", "obs_dim", "action_dim", "episode_length")


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
    return _write_arrays(Path(path), out)


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


def _write_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> Path:
    """``arrays`` as an ``.npz`` at exactly ``path``, written atomically."""
    from sb3_worldmodels.common.safe_io import write_atomically

    def write(temporary: str) -> None:
        with open(temporary, "wb") as handle:
            np.savez(handle, **arrays)  # type: ignore[arg-type]

    return write_atomically(path, write)


# -------------------------------------------------------------------------------------- read export
@dataclass(frozen=True)
class ExportHeader:
    """One task's export, checked except for its values (read by :func:`read_export_values`)."""

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


def read_export_header(name: str, file: Path) -> ExportHeader:
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
    return ExportHeader(
        name, file, dims["obs_dim"], dims["action_dim"], dims["episode_length"], starts, has_terminated
    )


def read_export_values(export: ExportHeader) -> dict[str, np.ndarray]:
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

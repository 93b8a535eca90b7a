"""Rebuild a replay buffer from its pickle-free file (``save_replay_buffer``'s ``.npz``), and the file
of a seed group: every seed's replay in one archive, each seed's arrays under ``seed_<index>/``."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from stable_baselines3.common.buffers import ReplayBuffer

from sb3_worldmodels.common.episode_replay import EpisodeReplay
from sb3_worldmodels.common.replay import SequenceReplay, fields_from_meta

REPLAY_CLASSES = {"SequenceReplay": SequenceReplay, "EpisodeReplay": EpisodeReplay}
GROUP_REPLAYS = "SeedGroupReplays"
"""The ``class`` of a seed group's replay file."""
_SEED_PREFIX = re.compile(r"^seed_(\d+)/(.+)$")


def replay_from_state(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], what: str) -> ReplayBuffer:
    """The buffer described by ``meta`` (its class from a fixed list) filled with ``arrays``.

    :raises ValueError: naming ``what`` when the file is not a consistent replay of a known class.
    """
    if meta.get("class") == GROUP_REPLAYS:
        seeds = meta.get("seeds")
        count = len(seeds) if isinstance(seeds, list) else "several"
        raise ValueError(
            f"{what} holds the replays of a seed group ({count} seeds, written by a group's "
            f"save_replay_buffer): load it into a group of as many seeds, built with seed=[...]."
        )
    cls = REPLAY_CLASSES.get(str(meta.get("class")))
    if cls is None:
        raise ValueError(f"{what} holds a replay of unknown kind {meta.get('class')!r}.")
    try:
        init = dict(meta["init"])
        init["fields"] = fields_from_meta(init["fields"])
        buffer = cls(**init)
        buffer.import_state(arrays, meta)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{what} is not a consistent {cls.__name__} file: {error}") from error
    return buffer


def group_replay_state(
    buffers: Sequence[Any], seeds: Sequence[int]
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, meta)`` of a seed group's replays (``buffers[i]`` is the ``i``-th seed's): each
    buffer's ``export_state`` arrays under ``seed_<i>/``, their metadata listed in seed order."""
    arrays: dict[str, np.ndarray] = {}
    metas = []
    for index, buffer in enumerate(buffers):
        own, meta = buffer.export_state()
        arrays.update({f"seed_{index}/{name}": value for name, value in own.items()})
        metas.append(meta)
    return arrays, {"class": GROUP_REPLAYS, "seeds": [int(s) for s in seeds], "replays": metas}


def group_replays_from_state(
    arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], what: str
) -> list[ReplayBuffer]:
    """The seeds' buffers of :func:`group_replay_state`'s output, in seed order.

    :raises ValueError: naming ``what`` for a single-seed replay file or an inconsistent group file.
    """
    if meta.get("class") != GROUP_REPLAYS:
        raise ValueError(
            f"{what} holds one seed's replay (written by a single-seed model's save_replay_buffer), not "
            "a seed group's: a group loads the file its own save_replay_buffer wrote. To train a group "
            "on single-seed replays, load each into the seed_model(i) of that seed instead."
        )
    metas = meta.get("replays")
    if not isinstance(metas, list) or not all(isinstance(m, dict) for m in metas):
        raise ValueError(f"{what} is not a consistent seed group replay file: no list of replays.")
    per_seed: list[dict[str, np.ndarray]] = [{} for _ in metas]
    for name, value in arrays.items():
        match = _SEED_PREFIX.match(name)
        if match is None or int(match.group(1)) >= len(metas):
            raise ValueError(
                f"{what} is not a consistent seed group replay file: unexpected array {name!r} "
                f"(for {len(metas)} seeds)."
            )
        per_seed[int(match.group(1))][match.group(2)] = value
    return [
        replay_from_state(own, seed_meta, f"{what} (seed index {index})")
        for index, (own, seed_meta) in enumerate(zip(per_seed, metas, strict=True))
    ]

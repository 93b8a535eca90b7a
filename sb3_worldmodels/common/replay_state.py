"""Rebuild a replay buffer from its pickle-free file (``save_replay_buffer``'s ``.npz``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from stable_baselines3.common.buffers import ReplayBuffer

from sb3_worldmodels.common.episode_replay import EpisodeReplay
from sb3_worldmodels.common.replay import SequenceReplay, fields_from_meta

REPLAY_CLASSES = {"SequenceReplay": SequenceReplay, "EpisodeReplay": EpisodeReplay}


def replay_from_state(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], what: str) -> ReplayBuffer:
    """The buffer described by ``meta`` (its class from a fixed list) filled with ``arrays``.

    :raises ValueError: naming ``what`` when the file is not a consistent replay of a known class.
    """
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

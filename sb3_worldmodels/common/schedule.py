"""Train ratio: how many updates to run after each collected row (when.py:26-42@2411f7d,
train.py:68-91@2411f7d).

Transcribes the reference's ``embodied/core/when.py:Ratio`` and the training gate of
``embodied/run/train.py`` (danijar/dreamerv3 @2411f7d). The reference counts every row of every env
(reset rows included) in one ``step`` counter; after each row it increments the counter, adds the
row to the replay, and then, only if the replay holds at least ``batch_size`` items and
``step >= train_fill``, asks the ratio for a number of updates. The ratio is not consulted while the
gate is closed, so its first call (which always answers 1) is the first row after the gate opens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


class RatioSchedule:
    """Updates per row at ``rate = train_ratio / (batch_size * batch_length)``, with the start gate.

    :param train_ratio: replayed (trained) rows per collected row.
    :param batch_size: B, sequences per update (also the gate's minimum number of replay items).
    :param batch_length: T, *trained* rows per sequence (the replay context row excluded, as the
        reference's ``batch_size * (batch_length - replay_context)``).
    :param train_fill: no training before the row counter reaches this value (reference default 0).

    The state is two plain attributes, ``rate`` and ``prev`` (None before the first call), so the
    object pickles with the model; :meth:`state_dict`/:meth:`load_state_dict` expose ``prev``.
    """

    def __init__(self, train_ratio: float, batch_size: int, batch_length: int, train_fill: int = 0) -> None:
        if not math.isfinite(train_ratio) or train_ratio < 0:
            raise ValueError(f"train_ratio must be a finite number >= 0, got {train_ratio}.")
        if batch_size < 1 or batch_length < 1:
            raise ValueError(
                f"batch_size and batch_length must be >= 1, got {batch_size} and {batch_length}."
            )
        self.train_ratio = float(train_ratio)
        self.batch_size = int(batch_size)
        self.batch_length = int(batch_length)
        self.train_fill = int(train_fill)
        self.rate = self.train_ratio / (self.batch_size * self.batch_length)
        self.prev: float | None = None

    def __call__(self, step: int) -> int:
        """Updates due at row counter ``step`` (when.Ratio): 1 on the first call, then
        ``int((step - prev) * rate)``, advancing ``prev`` by that many updates' worth of rows."""
        step = int(step)
        if self.rate == 0:
            return 0
        if self.prev is None:
            self.prev = step
            return 1
        repeats = int((step - self.prev) * self.rate)
        self.prev += repeats / self.rate
        return repeats

    def gate(self, steps: Sequence[int] | np.ndarray, items: Sequence[int] | np.ndarray) -> np.ndarray:
        """Training gate per row: ``items >= batch_size and step >= train_fill``.

        :param steps: (N,) row counter after each row.
        :param items: (N,) replay items after each row was added (``SequenceReplay.add_rows`` returns it).
        :return: (N,) bool.
        """
        steps = np.asarray(steps)
        items = np.asarray(items)
        return (items >= self.batch_size) & (steps >= self.train_fill)

    def updates_for_rows(
        self, steps: Sequence[int] | np.ndarray, can_train: Sequence[bool] | np.ndarray
    ) -> int:
        """Total updates for a run of rows, calling the ratio only on rows whose gate is open.

        :param steps: (N,) row counter after each row, in the order the rows were added.
        :param can_train: (N,) gate per row (see :meth:`gate`).
        """
        steps = np.asarray(steps).reshape(-1)
        can_train = np.asarray(can_train, dtype=bool).reshape(-1)
        if steps.shape != can_train.shape:
            raise ValueError(
                f"steps and can_train must have one entry per row, got {steps.shape} and {can_train.shape}."
            )
        return sum(self(int(s)) for s in steps[can_train])

    def state_dict(self) -> dict[str, Any]:
        """The mutable state: ``{"prev": float | None}``."""
        return {"prev": self.prev}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        prev = state["prev"]
        self.prev = None if prev is None else float(prev)

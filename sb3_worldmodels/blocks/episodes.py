"""Arithmetic on stored episodes, shared by the online replay, the offline task pool and TD-MPC2's
config: the windows of consecutive entries inside one episode, and the discount an episode length
implies.

An episode of L agent steps is stored as L + 1 *entries* (entry 0 the reset observation). A window
is ``window`` consecutive entries of one episode. NumPy only: the replays sample on the host.
"""

from __future__ import annotations

import numpy as np


def window_start_counts(entries: np.ndarray, window: int, include_last_window: bool = False) -> np.ndarray:
    """(n,) int64 number of valid window starts of each episode of ``entries`` (n,) entries.

    The reference's crop never draws the window that ends on an episode's final entry
    (buffer.py:60-70@b67b21c): ``entries - window`` starts; ``include_last_window`` adds that one
    (the later SliceSampler, buffer.py:102-106@7ec6bc8). Never negative.
    """
    extra = 1 if include_last_window else 0
    return np.maximum(0, np.asarray(entries, np.int64) - int(window) + extra)


def sample_windows(
    rng: np.random.Generator,
    first_entries: np.ndarray,
    start_counts: np.ndarray,
    window: int,
    shape: tuple[int, ...],
) -> tuple[np.ndarray, np.ndarray]:
    """Draw windows: an episode uniformly, then a start uniformly among its valid starts.

    :param rng: the generator (drawn from in a fixed order: the episodes, then the starts).
    :param first_entries: (n,) int64 index of each episode's entry 0, for episodes with a window.
    :param start_counts: (n,) int64 each episode's valid starts (:func:`window_start_counts`), > 0.
    :param window: entries per window.
    :param shape: the batch shape, ``(B,)`` or ``(K, B)``.
    :return: ``episode`` (*shape) the drawn positions in ``first_entries``, and ``rows``
        (*shape[:-1], window, B) the windows' entry indices, time-major.
    """
    episode = rng.integers(0, len(first_entries), size=shape)
    start = first_entries[episode] + (rng.random(shape) * start_counts[episode]).astype(np.int64)
    rows = np.expand_dims(start, -2) + np.arange(int(window))[:, None]
    return episode, rows


def discount_from_episode_length(
    episode_length: int, denom: float = 5.0, lo: float = 0.95, hi: float = 0.995
) -> float:
    """The reference's discount heuristic (tdmpc2.py:35-48): clip((T/5 - 1)/(T/5), 0.95, 0.995)."""
    frac = episode_length / denom
    return float(min(max((frac - 1) / frac, lo), hi))

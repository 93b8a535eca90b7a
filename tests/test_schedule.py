"""RatioSchedule against a plain transcription of the reference's train loop.

The reference: embodied/run/train.py:26-28,67-91@2411f7d and embodied/core/when.py:26-42@2411f7d.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from gymnasium import spaces

from sb3_worldmodels.common.replay import SequenceReplay
from sb3_worldmodels.common.schedule import RatioSchedule


class _ReferenceRatio:
    """embodied/core/when.py:Ratio @2411f7d, formula for formula."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio
        self.prev = None

    def __call__(self, step: int) -> int:
        if self.ratio == 0:
            return 0
        if self.prev is None:
            self.prev = step
            return 1
        repeats = int((step - self.prev) * self.ratio)
        self.prev += repeats / self.ratio
        return repeats


def _reference_updates(
    train_ratio: float, batch_size: int, batch_length: int, n_envs: int, n_rows: int, train_fill: int = 0
) -> tuple[int, int]:
    """embodied/run/train.py @2411f7d driven by embodied/core/driver.py, one row per env per step.

    Per row of every env, in env order: step += 1; replay.add (an item per full window of
    batch_length + 1 rows); if len(replay) >= batch_size and step >= train_fill: run
    should_train(step) updates. Returns (total updates, step of the first update).
    """
    ratio = _ReferenceRatio(train_ratio / (batch_size * batch_length))
    window = batch_length + 1
    rows = [0] * n_envs
    items, step, total, first = 0, 0, 0, -1
    while step < n_rows:
        for worker in range(n_envs):
            step += 1
            rows[worker] += 1
            if rows[worker] >= window:
                items += 1
            if items < batch_size or step < train_fill:
                continue
            n = ratio(step)
            if n and first < 0:
                first = step
            total += n
    return total, first


def _ours(
    train_ratio: float, batch_size: int, batch_length: int, n_envs: int, n_rows: int, train_fill: int = 0
) -> int:
    """The same loop built from SequenceReplay.add_rows' item counts and RatioSchedule, per vector step."""
    window = batch_length + 1
    replay = SequenceReplay(
        n_rows, spaces.Box(-1, 1, (1,)), spaces.Discrete(2), n_envs, {"is_first": ((), bool)}, window, seed=0
    )
    schedule = RatioSchedule(train_ratio, batch_size, batch_length, train_fill=train_fill)
    env_ids = np.arange(n_envs)
    row = {"is_first": np.zeros(n_envs, bool)}
    step, total = 0, 0
    while step < n_rows:
        items = replay.add_rows(env_ids, row)
        steps = step + 1 + env_ids
        step += n_envs
        total += schedule.updates_for_rows(steps, schedule.gate(steps, items))
    return total


@pytest.mark.parametrize(
    ("train_ratio", "batch_size", "batch_length", "n_envs", "n_rows", "train_fill"),
    [
        (512, 16, 64, 16, 4800, 0),  # DMC proprio: 0.5 updates per row
        (32, 4, 16, 4, 4000, 0),
        (8, 8, 16, 4, 8000, 0),  # the speed config (CartPole)
        (64, 16, 64, 8, 2400, 0),
        (1024, 16, 64, 1, 600, 0),
        (100, 3, 10, 5, 1000, 300),  # non-dyadic rate, train_fill past the item gate
    ],
)
def test_update_counts_match_reference_loop(
    train_ratio: float, batch_size: int, batch_length: int, n_envs: int, n_rows: int, train_fill: int
) -> None:
    expected, _ = _reference_updates(train_ratio, batch_size, batch_length, n_envs, n_rows, train_fill)
    assert expected > 0
    assert _ours(train_ratio, batch_size, batch_length, n_envs, n_rows, train_fill) == expected


def test_speed_config_update_count() -> None:
    # CartPole, 4 envs, 8,000 rows, batch 8 x 16, train ratio 8: rate 8 / 128 = 1/16 update per row.
    # Each env's first item needs 17 rows; the 8th item arrives with env 3's 18th row, at step 72.
    # First call there returns 1, then int((8000 - 72) / 16) = 495 more: 496 updates in total.
    total, first = _reference_updates(8, 8, 16, 4, 8000)
    assert (total, first) == (496, 72)
    assert _ours(8, 8, 16, 4, 8000) == 496


def test_dmc_config_starts_after_16_items() -> None:
    # 16 envs, window 65: the 16th item is env 15's 65th row, step 16 * 65 = 1040 (train.py:81@2411f7d).
    total, first = _reference_updates(512, 16, 64, 16, 1040 + 16 * 10)
    assert first == 1040
    # One update at step 1040, then 0.5 per row over 160 rows.
    assert total == 1 + 80


def test_call_matches_when_ratio_on_fixture_grid() -> None:
    # when.Ratio(512 / 1024) (when.py:26-42@2411f7d) over steps 0..2000 in increments of 16.
    ours, ref = RatioSchedule(512, 16, 64), _ReferenceRatio(512 / 1024)
    got = [ours(s) for s in range(0, 2001, 16)]
    assert got == [ref(s) for s in range(0, 2001, 16)]
    assert got[0] == 1 and all(n == 8 for n in got[1:])


def test_call_matches_when_ratio_on_irregular_steps() -> None:
    rng = np.random.default_rng(0)
    steps = np.cumsum(rng.integers(0, 40, size=500))
    for ratio, bs, bl in [(512, 16, 64), (7, 3, 11), (0.3, 2, 5)]:
        ours, ref = RatioSchedule(ratio, bs, bl), _ReferenceRatio(ratio / (bs * bl))
        assert [ours(int(s)) for s in steps] == [ref(int(s)) for s in steps]


def test_closed_gate_does_not_consult_the_ratio() -> None:
    schedule = RatioSchedule(512, 16, 64, train_fill=100)
    assert schedule.gate([99, 100, 100], [16, 15, 16]).tolist() == [False, False, True]
    assert schedule.updates_for_rows([50, 60], [False, False]) == 0
    assert schedule.prev is None
    assert schedule.updates_for_rows([70, 71], [False, True]) == 1
    assert schedule.prev == 71


def test_zero_ratio_never_trains() -> None:
    schedule = RatioSchedule(0, 16, 64)
    assert schedule.updates_for_rows(np.arange(1, 5000), np.ones(4999, bool)) == 0


def test_state_round_trip_continues_the_count() -> None:
    a = RatioSchedule(100, 3, 10)
    a.updates_for_rows(np.arange(1, 50), np.ones(49, bool))
    b = pickle.loads(pickle.dumps(a))
    c = RatioSchedule(100, 3, 10)
    c.load_state_dict(a.state_dict())
    steps = np.arange(50, 400)
    ones = np.ones(len(steps), bool)
    expected = a.updates_for_rows(steps, ones)
    assert b.updates_for_rows(steps, ones) == expected == c.updates_for_rows(steps, ones)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="train_ratio"):
        RatioSchedule(-1, 16, 64)
    with pytest.raises(ValueError, match="batch_size"):
        RatioSchedule(512, 0, 64)
    with pytest.raises(ValueError, match="one entry per row"):
        RatioSchedule(512, 16, 64).updates_for_rows([1, 2], [True])

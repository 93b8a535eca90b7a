"""SequenceReplay: windows, online queue, eviction, growth, write-back, annotation, pickling.

The reference is embodied/replay/replay.py@2411f7d: items and the online queue (replay.py:130-144),
write-back (147-167), queue-first sampling (178-191), FIFO eviction (193-217), annotation (303-317);
windows of batch_length 65 rows, the first a context row (configs.yaml:92-94@2411f7d).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.save_util import load_from_pkl, save_to_pkl

from sb3_worldmodels.common.replay import SequenceReplay

OBS_SPACE = spaces.Box(-np.inf, np.inf, (2,), np.float32)
ACT_SPACE = spaces.Box(-1, 1, (1,), np.float32)
FIELDS = {
    "obs": ((2,), np.float32),  # (env, absolute row): identifies every stored row
    "action": ((1,), np.float32),
    "reward": ((), np.float32),
    "is_first": ((), bool),
    "is_last": ((), bool),
    "is_terminal": ((), bool),
    "deter": ((3,), np.float32),
    "stoch": ((2,), np.int32),
}


def make(buffer_size: int = 1000, n_envs: int = 2, window: int = 4, online: bool = True, seed: int = 0):
    return SequenceReplay(buffer_size, OBS_SPACE, ACT_SPACE, n_envs, FIELDS, window, seed, online=online)


def rows_for(env_ids: np.ndarray, abs_rows: np.ndarray, is_first: np.ndarray | None = None) -> dict:
    n = len(env_ids)
    first = np.zeros(n, bool) if is_first is None else is_first
    return {
        "obs": np.stack([env_ids, abs_rows], axis=-1).astype(np.float32),
        "action": abs_rows[:, None].astype(np.float32),
        "reward": np.ones(n, np.float32),
        "is_first": first,
        "is_last": np.zeros(n, bool),
        "is_terminal": np.zeros(n, bool),
        "deter": np.full((n, 3), -1.0, np.float32),
        "stoch": np.full((n, 2), -1, np.int32),
    }


def add(buf: SequenceReplay, env_ids, times: int = 1) -> None:
    """Add ``times`` rows to each env in ``env_ids``; obs encodes (env, absolute row)."""
    env_ids = np.asarray(env_ids, dtype=np.int64)
    for _ in range(times):
        buf.add_rows(env_ids, rows_for(env_ids, buf.rows_added_per_env[env_ids]))


def check_windows(buf: SequenceReplay, batch: dict, envs: np.ndarray, starts: np.ndarray) -> None:
    obs = batch["obs"]
    assert obs.shape == (*envs.shape, buf.window, 2)
    np.testing.assert_array_equal(obs[..., 0], np.broadcast_to(envs[..., None], obs.shape[:-1]))
    np.testing.assert_array_equal(obs[..., 1], starts[..., None] + np.arange(buf.window))


def test_is_an_sb3_replay_buffer_and_allocates_lazily() -> None:
    buf = make()
    assert isinstance(buf, ReplayBuffer)
    assert buf.nbytes == 0 and buf.num_items == 0 and buf.size() == 0 and buf.allocated_rows_per_env == 0
    assert buf.buffer_size == 500 and buf.capacity_per_env == 500  # SB3 convention: per-env rows
    with pytest.raises(ValueError, match="Nothing to sample"):
        buf.sample(4)


def test_sb3_add_is_rejected() -> None:
    buf = make()
    with pytest.raises(TypeError, match="add_rows"):
        buf.add(np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 1)), np.zeros(2), np.zeros(2), [{}, {}])


def test_windows_never_mix_envs_and_are_consecutive() -> None:
    buf = make(n_envs=3, window=5)
    add(buf, [0, 1, 2], 9)
    add(buf, [2], 6)  # uneven streams: 9, 9, 15 rows
    assert buf.rows_per_env.tolist() == [9, 9, 15]
    assert buf.num_items == 5 + 5 + 11
    batch, envs, starts = buf.sample(32, count=4)
    assert envs.shape == starts.shape == (4, 32)
    assert {k: v.shape for k, v in batch.items()} == {
        k: (4, 32, 5, *shape) for k, (shape, _) in FIELDS.items()
    }
    assert all(batch[k].dtype == dtype for k, (_, dtype) in FIELDS.items())
    check_windows(buf, batch, envs, starts)


def test_every_start_is_reachable_uniformly() -> None:
    buf = make(buffer_size=24, n_envs=2, window=4, online=False)
    add(buf, [0], 15)  # capacity 12: rows 3..14 kept, starts 3..11
    add(buf, [1], 7)  # starts 0..3
    assert buf.num_items == 9 + 4
    batch, envs, starts = buf.sample(1000, count=26)
    check_windows(buf, batch, envs, starts)
    keys, counts = np.unique(envs * 100 + starts, return_counts=True)
    expected = [3, 4, 5, 6, 7, 8, 9, 10, 11, 100, 101, 102, 103]
    assert keys.tolist() == expected
    # 26,000 draws over 13 items: 2,000 each, std ~43.
    assert np.abs(counts - 2000).max() < 250


def test_online_queue_small_window() -> None:
    buf = make(n_envs=1, window=3)
    add(buf, [0], 10)
    # Items are inserted from row 2 on; queued when the stream held a multiple of 3 rows before:
    # rows held 3, 6, 9 -> windows starting at 1, 4, 7.
    assert buf.online_queue[:, 1].tolist() == [1, 4, 7]
    batch, envs, starts = buf.sample(2, count=2)
    assert starts[0].tolist() == [1, 4] and starts[1, 0] == 7
    check_windows(buf, batch, envs, starts)
    assert buf.queue_size == 0


def test_online_queue_reference_window() -> None:
    buf = make(buffer_size=400, n_envs=1, window=65)
    add(buf, [0], 200)
    assert buf.online_queue.tolist() == [[0, 1], [0, 66], [0, 131]]


def test_online_queue_interleaves_envs_in_insertion_order() -> None:
    buf = make(n_envs=2, window=3)
    add(buf, [0, 1], 3)
    add(buf, [1], 3)
    add(buf, [0, 1], 1)
    # env 1 reaches 4 rows first (its window at 1), then env 0 and env 1 in one call.
    assert buf.online_queue.tolist() == [[1, 1], [0, 1], [1, 4]]


def test_online_queue_skips_evicted_windows() -> None:
    buf = make(buffer_size=6, n_envs=1, window=3)
    add(buf, [0], 10)  # queue 1, 4, 7; rows 4..9 kept
    assert buf.online_queue[:, 1].tolist() == [1, 4, 7]
    _, _, starts = buf.sample(2)
    assert starts[0].tolist() == [4, 7]


def test_offline_buffer_has_no_queue() -> None:
    buf = make(n_envs=1, window=3, online=False)
    add(buf, [0], 10)
    assert buf.queue_size == 0


def test_fifo_eviction_at_capacity() -> None:
    buf = make(buffer_size=16, n_envs=2, window=3)
    add(buf, [0, 1], 20)
    add(buf, [1], 3)
    assert buf.allocated_rows_per_env == 8
    assert buf.rows_per_env.tolist() == [8, 8] and buf.size() == 16
    assert buf.rows_added_per_env.tolist() == [20, 23]
    assert buf.num_items == 12
    np.testing.assert_array_equal(buf.read_rows(0, np.arange(12, 20))["obs"][:, 1], np.arange(12, 20))
    np.testing.assert_array_equal(buf.read_rows(1, np.arange(15, 23))["obs"][:, 1], np.arange(15, 23))
    with pytest.raises(IndexError):
        buf.read_rows(0, [11])
    buf.sample(4)  # drain the queue
    batch, envs, starts = buf.sample(500)
    check_windows(buf, batch, envs, starts)
    assert set(starts[envs == 0].tolist()) == set(range(12, 18))
    assert set(starts[envs == 1].tolist()) == set(range(15, 21))


def test_growth_preserves_content_and_order() -> None:
    buf = make(buffer_size=200, n_envs=2, window=4)
    sizes = []
    for _ in range(100):
        add(buf, [0, 1])
        if not sizes or sizes[-1] != buf.allocated_rows_per_env:
            sizes.append(buf.allocated_rows_per_env)
    add(buf, [0], 10)  # env 0 wraps at the cap of 100
    assert sizes[0] == 4 and sizes[-1] == 100
    assert all(b >= min(100, 1.25 * a) for a, b in zip(sizes, sizes[1:], strict=False))
    np.testing.assert_array_equal(buf.read_rows(0, np.arange(10, 110))["obs"][:, 1], np.arange(10, 110))
    np.testing.assert_array_equal(buf.read_rows(1, np.arange(100))["obs"][:, 1], np.arange(100))


def test_reserve_grows_and_clamps() -> None:
    buf = make(buffer_size=100, n_envs=2, window=4)
    buf.reserve(10)
    assert buf.allocated_rows_per_env == 10
    add(buf, [0, 1], 7)
    buf.reserve(30)
    assert buf.allocated_rows_per_env == 30
    buf.reserve(5)  # never shrinks
    assert buf.allocated_rows_per_env == 30
    np.testing.assert_array_equal(buf.read_rows(1, np.arange(7))["obs"][:, 1], np.arange(7))
    buf.reserve(10**9)
    assert buf.allocated_rows_per_env == 50


def test_nbytes_is_field_bytes_times_allocated_rows() -> None:
    buf = make(n_envs=3)
    add(buf, [0, 1, 2], 5)
    row_bytes = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in FIELDS.values())
    assert buf.nbytes == row_bytes * buf.allocated_rows_per_env * 3 > 0


def test_add_rows_returns_items_after_each_row() -> None:
    buf = make(n_envs=3, window=3)
    assert buf.add_rows(np.arange(3), rows_for(np.arange(3), np.zeros(3, np.int64))).tolist() == [0, 0, 0]
    add(buf, [0, 1, 2])
    add(buf, [0])
    items = buf.add_rows(np.array([2, 0, 1]), rows_for(np.array([2, 0, 1]), np.array([2, 3, 2])))
    assert items.tolist() == [2, 3, 4]  # 1 item (env 0) before; env 2, 0, 1 each add one
    assert buf.num_items == 4


def test_write_back_lands_on_rows_one_to_end() -> None:
    buf = make(n_envs=2, window=4, online=False)
    add(buf, [0, 1], 12)
    deter = np.arange(2 * 3 * 3 * 3, dtype=np.float32).reshape(2, 3, 3, 3) + 1
    # Disjoint windows, shaped like sample(3, count=2)'s output, so every expected value is unambiguous.
    envs = np.array([[0, 0, 1], [1, 0, 1]])
    starts = np.array([[0, 4, 0], [4, 8, 8]])
    assert buf.write_back(envs, starts, {"deter": deter}) == 18
    for c in range(2):
        for b in range(3):
            got = buf.read_rows(envs[c, b], starts[c, b] + np.arange(4))
            np.testing.assert_array_equal(got["deter"][0], [-1, -1, -1])  # context row untouched
            np.testing.assert_array_equal(got["deter"][1:], deter[c, b])
            np.testing.assert_array_equal(got["stoch"], -1)  # other fields untouched
    batch, envs2, starts2 = buf.sample(8)
    check_windows(buf, batch, envs2, starts2)


def test_write_back_skips_evicted_rows() -> None:
    buf = make(buffer_size=16, n_envs=2, window=4, online=False)
    add(buf, [0, 1], 8)
    envs = np.array([[0, 1]])
    starts = np.array([[1, 4]])
    add(buf, [0], 3)  # env 0 keeps rows 3..10: rows 1, 2 (window at 1) were overwritten
    stoch = np.full((1, 2, 3, 2), 7, np.int32)
    assert buf.write_back(envs, starts, {"stoch": stoch}) == 2 + 3
    np.testing.assert_array_equal(buf.read_rows(0, [3, 4])["stoch"], 7)
    got = buf.read_rows(0, [9, 10])  # slots of evicted rows 1, 2 hold new rows, untouched
    np.testing.assert_array_equal(got["stoch"], -1)
    np.testing.assert_array_equal(got["obs"][:, 1], [9, 10])
    np.testing.assert_array_equal(buf.read_rows(1, [5, 6, 7])["stoch"], 7)


def test_write_back_accepts_jax_like_dtypes_and_validates() -> None:
    buf = make(n_envs=1, window=3)
    add(buf, [0], 5)
    envs, starts = np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64)
    buf.write_back(
        envs, starts, {"deter": np.ones((1, 1, 2, 3), np.float64), "stoch": np.ones((1, 1, 2, 2), np.int64)}
    )
    with pytest.raises(ValueError, match="shape"):
        buf.write_back(envs, starts, {"deter": np.ones((1, 1, 3, 3), np.float32)})
    with pytest.raises(ValueError, match="unknown"):
        buf.write_back(envs, starts, {"latent": np.ones((1, 1, 2, 3), np.float32)})
    with pytest.raises(ValueError, match="never added"):
        buf.write_back(envs, np.full((1, 1), 4), {"deter": np.ones((1, 1, 2, 3), np.float32)})


def test_annotation_marks_window_starts_and_cut_episodes() -> None:
    buf = make(n_envs=1, window=5, online=False)
    first_rows = {0, 3, 7}
    for t in range(12):
        buf.add_rows(np.array([0]), rows_for(np.array([0]), np.array([t]), np.array([t in first_rows])))
    batch, _, starts = buf.sample(200)
    for b, start in enumerate(starts[0]):
        rows = start + np.arange(5)
        expected_first = np.isin(rows, list(first_rows))
        expected_first[0] = True
        expected_last = np.zeros(5, bool)
        expected_last[:-1] = expected_first[1:]
        np.testing.assert_array_equal(batch["is_first"][0, b], expected_first)
        np.testing.assert_array_equal(batch["is_last"][0, b], expected_last)
    # The stored rows keep their true flags.
    np.testing.assert_array_equal(
        buf.read_rows(0, np.arange(12))["is_first"], np.isin(np.arange(12), [0, 3, 7])
    )
    assert not buf.read_rows(0, np.arange(12))["is_last"].any()


def test_pickle_round_trip_continues_sampling_exactly(tmp_path) -> None:
    buf = make(buffer_size=40, n_envs=2, window=4)
    add(buf, [0, 1], 25)  # wrapped, with a queue
    buf.sample(3)  # consume part of the queue and advance the generator
    path = tmp_path / "replay.pkl"
    save_to_pkl(path, buf)
    loaded = load_from_pkl(path)
    assert isinstance(loaded, SequenceReplay) and loaded.queue_size == buf.queue_size > 0
    for _ in range(3):
        a, b = buf.sample(5, count=2), loaded.sample(5, count=2)
        for key in FIELDS:
            np.testing.assert_array_equal(a[0][key], b[0][key])
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_array_equal(a[2], b[2])
    add(buf, [0, 1], 3)
    add(loaded, [0, 1], 3)
    np.testing.assert_array_equal(buf.sample(6)[2], loaded.sample(6)[2])


def test_sb3_load_replay_buffer_accepts_it(tmp_path) -> None:
    buf = make(buffer_size=40, n_envs=2, window=4)
    add(buf, [0, 1], 10)
    path = tmp_path / "replay.pkl"
    buf.device = "stale"
    save_to_pkl(path, buf)
    # SB3's own load path (isinstance check, timeout back-fill, HER branch, device), run on a stand-in
    # model so the test does not need to build networks.
    model = SimpleNamespace(verbose=0, env=None, device=th.device("cpu"), replay_buffer=None)
    OffPolicyAlgorithm.load_replay_buffer(model, path)
    assert isinstance(model.replay_buffer, SequenceReplay) and model.replay_buffer.device == th.device("cpu")
    np.testing.assert_array_equal(model.replay_buffer.sample(4)[2], buf.sample(4)[2])


def test_bad_rows_raise_clear_errors() -> None:
    buf = make(n_envs=2)
    ids = np.array([0, 1])
    good = rows_for(ids, np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=r"'obs' has shape \(2, 3\), expected \(2, 2\)"):
        buf.add_rows(ids, {**good, "obs": np.zeros((2, 3), np.float32)})
    with pytest.raises(ValueError, match="'deter' has shape"):
        buf.add_rows(ids, {**good, "deter": np.zeros((3,), np.float32)})
    with pytest.raises(ValueError, match=r"missing field\(s\) \['stoch'\]"):
        buf.add_rows(ids, {k: v for k, v in good.items() if k != "stoch"})
    with pytest.raises(ValueError, match="unknown field"):
        buf.add_rows(ids, {**good, "extra": np.zeros(2)})
    with pytest.raises(TypeError, match="'is_first' has dtype float"):
        buf.add_rows(ids, {**good, "is_first": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="distinct"):
        buf.add_rows(np.array([1, 1]), good)
    with pytest.raises(ValueError, match="lie in"):
        buf.add_rows(np.array([0, 2]), good)
    assert buf.size() == 0 and buf.nbytes == 0  # nothing was written by the failed calls
    buf.add_rows(ids, {**good, "obs": good["obs"].astype(np.float64)})  # float64 is cast to float32
    assert buf.size() == 2


def test_bad_construction_raises() -> None:
    with pytest.raises(ValueError, match="fewer than one window"):
        make(buffer_size=10, n_envs=2, window=6)
    with pytest.raises(ValueError, match="shape tuple, numpy dtype"):
        SequenceReplay(100, OBS_SPACE, ACT_SPACE, 1, {"obs": (2, np.float32)}, 4, 0)


def test_reset_clears_rows_and_queue() -> None:
    buf = make(n_envs=2, window=3)
    add(buf, [0, 1], 10)
    buf.reset()
    assert buf.size() == 0 and buf.num_items == 0 and buf.queue_size == 0
    add(buf, [0, 1], 4)
    batch, envs, starts = buf.sample(4)
    check_windows(buf, batch, envs, starts)

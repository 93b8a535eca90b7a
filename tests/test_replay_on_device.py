"""``replay_on_device``: a copy of the replay's observations in device memory, the training batches
drawn as row indices and read there. The same draws and the same updates as batches sent by the host,
for one model and a seed group, through ring wrap-around, eviction and a loaded replay."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.blocks.stored_rows import StoredRows, with_stored_rows
from sb3_worldmodels.common.device_replay import ReplayMirror, fields_on_device
from sb3_worldmodels.common.episode_replay import EpisodeReplay
from tests.test_tdmpc2_pixels_sb3 import TINY, dot_env

SHAPE = (4, 4, 3)


def image_replay(capacity: int = 30, seed: int = 0, shape: tuple[int, ...] = SHAPE) -> EpisodeReplay:
    box = spaces.Box(0, 255, shape, np.uint8)
    act = spaces.Box(-1.0, 1.0, (1,), np.float32)
    fields = {"obs": (shape, np.uint8), "reward": ((), np.float32)}
    return EpisodeReplay(capacity, box, act, 1, fields, window=3, include_last_window=False, seed=seed)


def store_episode(replay: EpisodeReplay, rng: np.random.Generator, steps: int) -> None:
    for _ in range(steps + 1):
        obs = rng.integers(0, 256, (1, *SHAPE), dtype=np.uint8)
        replay.add_entries(np.array([0]), {"obs": obs, "reward": rng.normal(size=1).astype(np.float32)})
    replay.finish_episode(0)
    replay.store_finished()


def assert_copy_equals_ring(stored: StoredRows, replays: list[EpisodeReplay], seed_axis: bool) -> None:
    copy = np.asarray(stored.store)
    for s, replay in enumerate(replays):
        ring = replay.ring("obs")
        assert ring is not None
        first = replay.end - replay.size() - replay.num_episodes  # the oldest stored entry
        live = np.arange(first, replay.end) % replay.slots  # the slots a draw can name
        mine = copy[s] if seed_axis else copy
        np.testing.assert_array_equal(mine[live].reshape(-1, *SHAPE), ring[live])


@pytest.mark.parametrize("seed_axis", [False, True])
def test_the_copy_follows_the_ring_through_wraps_evictions_and_a_loaded_replay(seed_axis):
    rng = np.random.default_rng(0)
    replays = [image_replay(seed=s) for s in range(2 if seed_axis else 1)]
    # A put that leaves host arrays as they are (a group's on one device): the copy is sent anyway
    mirror = ReplayMirror(("obs",), lambda array: array, seed_axis)
    for steps in [5, 7, 4, 9, 3, 6, 8, 5, 4, 7, 6]:  # 30 steps kept: the ring wraps, old episodes go
        for replay in replays:
            store_episode(replay, rng, steps + int(rng.integers(0, 3)))
        stores = mirror.stores(replays)
        assert isinstance(stores["obs"].store, jax.Array)
        assert_copy_equals_ring(stores["obs"], replays, seed_axis)
    # The rows a draw names are the rows the host would have sent
    for replay in replays:
        state = replay.rng.bit_generator.state
        rows = replay.sample(8, count=2, rows_of=("obs",))
        replay.rng.bit_generator.state = state
        sent = replay.sample(8, count=2)
        assert rows["obs"].dtype == np.int32 and rows["obs"].shape == (2, 3, 8)
        np.testing.assert_array_equal(rows["reward"], sent["reward"])
        if not seed_axis:
            read = with_stored_rows(rows, mirror.stores(replays))
            np.testing.assert_array_equal(np.asarray(read["obs"]), sent["obs"])
    # A replay filled whole from a file is copied whole
    arrays, meta = replays[0].export_state()
    loaded = image_replay(seed=5)
    loaded.import_state(arrays, meta)
    replays[0] = loaded
    assert_copy_equals_ring(mirror.stores(replays)["obs"], replays, seed_axis)


def test_a_model_trains_the_same_from_device_copies_of_its_observations(tmp_path):
    models = {}
    for on in (False, True):
        model = TDMPC2("CnnPolicy", dot_env(), buffer_size=100, replay_on_device=on, **TINY)
        model.learn(200)  # 100 steps kept of 200: evictions and a wrapped ring
        models[on] = model
    assert models[False]._decided_device_fields == ()
    assert models[True]._decided_device_fields == ("obs",) and models[True]._replay_mirror is not None
    assert models[True]._n_updates == models[False]._n_updates > 100
    host, device = (
        jax.tree_util.tree_leaves(models[on].policy.state["agent"].params) for on in (False, True)
    )
    for a, b in zip(host, device, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
    models[True].save(tmp_path / "m.zip")
    assert TDMPC2.load(tmp_path / "m.zip").replay_on_device is True


def test_a_seed_group_trains_the_same_from_device_copies_of_its_observations():
    groups = {}
    for on in (False, True):
        env = DummyVecEnv([dot_env, dot_env])
        group = TDMPC2("CnnPolicy", env, replay_on_device=on, **{**TINY, "seed": [0, 1]})
        group.learn(90)
        groups[on] = group
    assert groups[True]._replay_mirror is not None
    assert all(lane._decided_device_fields == ("obs",) for lane in groups[True]._lanes)
    for i in range(2):
        host = jax.tree_util.tree_leaves(groups[False].seed_model(i).policy.state["agent"].params)
        device = jax.tree_util.tree_leaves(groups[True].seed_model(i).policy.state["agent"].params)
        for a, b in zip(host, device, strict=True):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)


def test_the_setting_is_checked_and_chosen_for_the_backend():
    with pytest.raises(TypeError, match="True, False or None"):
        TDMPC2("CnnPolicy", dot_env(), replay_on_device="yes", **TINY)
    with pytest.raises(ValueError, match="keeps its replay on the host"):
        DreamerV3("CartPole-v1", replay_on_device=True)
    replay = image_replay()
    assert fields_on_device(True, replay, ("obs",), 1, "TD-MPC2") == ("obs",)
    assert fields_on_device(False, replay, ("obs",), 1, "TD-MPC2") == ()
    # None: on an accelerator for fields of images (1 KiB an entry or more); a CPU keeps the host's
    expected = ("obs",) if jax.default_backend() != "cpu" else ()
    assert fields_on_device(None, image_replay(shape=(64, 64, 9)), ("obs",), 4, "TD-MPC2") == expected
    assert fields_on_device(None, image_replay(shape=(4, 4, 3)), ("obs",), 4, "TD-MPC2") == ()

"""EpisodeReplay: finished episodes only, windows inside one episode, every valid start drawn."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces

from sb3_worldmodels.common.episode_replay import EpisodeReplay
from sb3_worldmodels.data.pool import TaskPool

FIELDS = {"obs": ((2,), np.float32), "action": ((1,), np.float32), "reward": ((), np.float32)}


def make(capacity=1000, window=4, last=False, n_envs=2):
    box = spaces.Box(-1, 1, (2,))
    return EpisodeReplay(capacity, box, spaces.Box(-1, 1, (1,)), n_envs, FIELDS, window, last, seed=0)


def add_episode(replay, env, episode_id, steps):
    """Entry k: obs = (episode id, k), action = k, reward = 10 k (entry 0: the reset entry)."""
    for k in range(steps + 1):
        replay.add_entries(
            np.array([env]),
            {
                "obs": np.array([[episode_id, k]], np.float32),
                "action": np.array([[k]], np.float32),
                "reward": np.array([10.0 * k], np.float32),
            },
        )
    replay.finish_episode(env)
    return replay.store_finished() == 1


@pytest.mark.parametrize("last", [False, True])
def test_windows_stay_in_one_episode_and_cover_every_valid_start(last):
    replay = make(window=4, last=last)
    add_episode(replay, 0, 1, 10)
    add_episode(replay, 1, 2, 6)
    replay.add_entries(np.array([0]), {k: np.zeros((1, *s), d) for k, (s, d) in FIELDS.items()})  # running
    batch = replay.sample(4096)
    obs = batch["obs"]  # (W, B, 2)
    assert obs.shape == (4, 4096, 2)
    ids, steps = obs[..., 0], obs[..., 1]
    assert np.all(ids == ids[0])  # one episode per window
    assert np.all(np.diff(steps, axis=0) == 1)  # consecutive entries
    assert np.all(batch["action"][..., 0] == steps)  # entry k holds the action of step k
    assert np.all(batch["reward"] == 10 * steps)
    for episode, length in ((1, 10), (2, 6)):
        starts = set(steps[0][ids[0] == episode].astype(int))
        last_start = length - 3 if last else length - 4  # window 4 = H + 1 with H = 3
        assert starts == set(range(last_start + 1)), (episode, sorted(starts))
    assert replay.num_windows == (8 + 4 if last else 7 + 3)
    assert replay.num_episodes == 2 and replay.stored_steps == 16


def test_short_episodes_are_not_stored_and_running_ones_never_sampled():
    replay = make(window=4)
    assert not add_episode(replay, 0, 1, 3)  # 3 steps: no window in the reference's crop
    with pytest.raises(ValueError, match="no finished episode"):
        replay.sample(2)
    assert add_episode(replay, 0, 2, 4)
    assert np.all(replay.sample(64)["obs"][..., 0] == 2)


def test_oldest_episodes_are_evicted_whole_and_capacity_grows_in_order():
    replay = make(capacity=20, window=3)
    for i in range(5):
        add_episode(replay, 0, i, 8)
    assert replay.stored_steps <= 20 and replay.num_episodes == 2
    assert set(np.unique(replay.sample(512)["obs"][..., 0])) == {3.0, 4.0}
    replay.reserve(100)
    for i in range(5, 8):
        add_episode(replay, 1, i, 8)
    assert set(np.unique(replay.sample(2048)["obs"][..., 0])) == {3.0, 4.0, 5.0, 6.0, 7.0}
    batch = replay.sample(2048, count=3)
    assert batch["obs"].shape == (3, 3, 2048, 2)
    assert np.all(np.diff(batch["obs"][..., 1], axis=1) == 1)


def test_too_small_capacity_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="buffer_size"):
        make(capacity=2, window=4)
    replay = make(capacity=10, window=4)
    with pytest.raises(ValueError, match="does not fit"):
        add_episode(replay, 0, 0, 12)


def test_the_task_pool_draws_the_same_windows_from_the_same_generator():
    """The online replay and the offline pool share one window sampler: on the same episodes and
    generator state they draw the same windows (a pool made from an agent's replay trains on what the
    replay would have given)."""
    replay = make(window=4)
    lengths = {1: 10, 2: 6, 3: 4}
    for episode_id, steps in lengths.items():
        add_episode(replay, 0, episode_id, steps)
    entries = [np.array([[i, k] for k in range(steps + 1)], np.float32) for i, steps in lengths.items()]
    obs = np.concatenate(entries)
    episode_starts = np.concatenate([[0], np.cumsum([len(e) for e in entries])]).astype(np.int64)
    pool = TaskPool(
        path=Path("."), tasks=("task",), obs_dims=(2,), action_dims=(1,), episode_lengths=(10,),
        obs_dim=2, action_dim=1, obs=obs, action=obs[:, 1:], reward=10.0 * obs[:, 1],
        task=np.zeros(len(obs), np.int16), episode_starts=episode_starts,
        episode_tasks=np.zeros(len(lengths), np.int32),
    )  # fmt: skip
    pool_rng = np.random.default_rng(replay.seed)  # the replay's generator, unused so far
    for _ in range(3):  # and they stay in step
        from_replay, from_pool = replay.sample(64), pool.sample(pool_rng, 64, horizon=3)
        np.testing.assert_array_equal(from_pool["obs"], from_replay["obs"])
        np.testing.assert_array_equal(from_pool["reward"], from_replay["reward"][1:])
    assert len(np.unique(from_pool["obs"][0, :, 0])) == 3  # every episode drawn

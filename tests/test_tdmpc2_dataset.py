"""TD-MPC2's offline multi-task data: episode exports of real agents, a task pool and its windows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import TDMPC2, TaskPool, export_episodes, load_pool, pool_tasks
from sb3_worldmodels.blocks.episodes import discount_from_episode_length
from sb3_worldmodels.data.reference import pool_reference_data, read_reference_chunk
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS
from tests.parity_helpers import load_fixture

HORIZON = 3  # TDMPC2's default: windows of 4 entries
LENGTHS = (6, 9, 12)  # CountingEnv's episode lengths, in turn


class CountingEnv(gym.Env):
    """Obs 5 = (episode index, step t, the action's 2 values, episode length), actions of 2 in [-1, 1],
    reward = the action's sum; episodes of 6, 9 and 12 steps in turn, ended by truncation (or by
    termination with ``terminate``). Every entry says where it belongs."""

    metadata: dict = {"render_modes": []}  # noqa: RUF012

    def __init__(self, terminate: bool = False) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, (5,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.terminate = terminate
        self.episode, self.t, self.length = -1, 0, 0

    def _obs(self, action: np.ndarray) -> np.ndarray:
        return np.array([self.episode, self.t, *action, self.length], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t, self.length = 0, LENGTHS[self.episode % len(LENGTHS)]
        return self._obs(np.zeros(2, np.float32)), {}

    def step(self, action):
        self.t += 1
        action = np.asarray(action, np.float32).reshape(2)
        end = self.t >= self.length
        return self._obs(action), float(action.sum()), end and self.terminate, end and not self.terminate, {}


def tiny_agent(env_fn, **kwargs) -> TDMPC2:
    """The smallest TD-MPC2, acting at random throughout (no update runs: fast)."""
    settings = {**SMOKE_SETTINGS, "seed_steps": 10_000, "seed": 0, **kwargs}
    return TDMPC2(make_vec_env(env_fn, n_envs=1), **settings)


def stored_episodes(agent: TDMPC2) -> list[dict[str, np.ndarray]]:
    """The replay's stored episodes, then its finished ones not stored yet, each field (L + 1, ...)."""
    replay = agent.replay_buffer
    episodes = [
        {name: data[(first + np.arange(steps + 1)) % replay._slots] for name, data in replay._data.items()}
        for first, steps in replay._episodes
    ]
    for entries in replay._finished:
        episodes.append({name: np.stack([entry[name] for entry in entries]) for name in replay.fields})
    return episodes


def read(path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


def rewrite(source, target, **changes) -> None:
    """A copy of the export ``source`` at ``target`` with ``changes`` (None removes an array)."""
    arrays = {**read(source), **changes}
    np.savez(target, **{key: value for key, value in arrays.items() if value is not None})


@pytest.fixture(scope="module")
def agents():
    pendulum = tiny_agent(lambda: gym.make("Pendulum-v1", max_episode_steps=20))
    pendulum.learn(80)  # 4 episodes of 20 steps, the last one finished but not yet stored
    counting = tiny_agent(CountingEnv, episode_length=12)
    counting.learn(60)  # episodes of 6, 9, 12, 6, 9, 12, 6 steps
    return {"pendulum": pendulum, "counting": counting}


@pytest.fixture(scope="module")
def exports(agents, tmp_path_factory):
    folder = tmp_path_factory.mktemp("exports")
    return {name: export_episodes(agent, folder / f"{name}.npz") for name, agent in agents.items()}


@pytest.fixture(scope="module")
def pool(exports, tmp_path_factory) -> TaskPool:
    return pool_tasks(exports, tmp_path_factory.mktemp("pools") / "pool")


# ------------------------------------------------------------------------------------------- export
@pytest.mark.parametrize("name", ["pendulum", "counting"])
def test_export_holds_every_finished_episode_whole(agents, exports, name):
    agent, data = agents[name], read(exports[name])
    episodes = stored_episodes(agent)
    assert len(agent.replay_buffer._finished) == 1  # the episode that ended on the last step is included
    starts = data["episode_starts"]
    assert starts.dtype == np.int64 and starts.tolist() == [0, *np.cumsum([len(e["obs"]) for e in episodes])]
    for key in ("obs", "action", "reward"):
        assert data[key].dtype == np.float32
        np.testing.assert_array_equal(data[key], np.concatenate([e[key] for e in episodes]))
    assert str(data["format"]) == "sb3_worldmodels.episodes" and int(data["version"]) == 1
    cfg = agent._config
    assert (int(data["obs_dim"]), int(data["action_dim"])) == (cfg.obs_dim, cfg.action_dim)
    assert int(data["episode_length"]) == agent.agent_episode_length
    assert discount_from_episode_length(int(data["episode_length"])) == pytest.approx(agent.discount)
    assert "terminated" not in data  # not an episodic agent
    np.testing.assert_array_equal(data["action"][starts[:-1]], 0.0)
    np.testing.assert_array_equal(data["reward"][starts[:-1]], 0.0)


def test_export_entries_are_the_envs_steps(exports):
    data = read(exports["counting"])
    starts = data["episode_starts"]
    assert [int(n) - 1 for n in np.diff(starts)] == [6, 9, 12, 6, 9, 12, 6]
    for lo, hi in zip(starts[:-1], starts[1:], strict=True):
        obs, action, reward = data["obs"][lo:hi], data["action"][lo:hi], data["reward"][lo:hi]
        assert np.all(obs[:, 0] == obs[0, 0]) and obs[:, 1].tolist() == list(range(hi - lo))
        np.testing.assert_array_equal(action[1:], obs[1:, 2:4])  # the action that led to the entry
        np.testing.assert_allclose(reward[1:], action[1:].sum(axis=1), rtol=1e-6)


def test_episodic_export_stores_terminations_and_the_pool_refuses_them(tmp_path):
    agent = tiny_agent(lambda: CountingEnv(terminate=True), episode_length=12, episodic=True)
    agent.learn(30)  # episodes of 6, 9 and 12 steps, each terminated
    data = read(export_episodes(agent, tmp_path / "episodic.npz"))
    assert data["terminated"].dtype == bool
    ends = data["episode_starts"][1:] - 1
    assert data["terminated"][ends].all() and data["terminated"].sum() == len(ends) == 3
    with pytest.raises(ValueError, match="3 terminated episode"):
        pool_tasks({"episodic": tmp_path / "episodic.npz"}, tmp_path / "pool")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episodic.npz"]


def test_export_refuses_an_agent_without_finished_episodes(tmp_path):
    agent = tiny_agent(CountingEnv, episode_length=12)
    with pytest.raises(ValueError, match=r"learn\(\)"):
        export_episodes(agent, tmp_path / "none.npz")
    agent.learn(4)
    with pytest.raises(ValueError, match="no finished episode"):
        export_episodes(agent, tmp_path / "none.npz")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------- pool
def test_pool_pads_every_task_and_records_its_meta(pool, exports):
    pendulum, counting = read(exports["pendulum"]), read(exports["counting"])
    e0, e1 = len(pendulum["obs"]), len(counting["obs"])
    assert pool.tasks == ("pendulum", "counting") and pool.task_id("counting") == 1
    assert (pool.obs_dims, pool.action_dims, pool.episode_lengths) == ((3, 5), (1, 2), (20, 12))
    assert (pool.obs_dim, pool.action_dim) == (5, 2)
    assert (pool.num_entries, pool.num_episodes) == (e0 + e1, 4 + 7)
    assert pool.discounts == (discount_from_episode_length(20), discount_from_episode_length(12))
    np.testing.assert_array_equal(pool.obs[:e0, :3], pendulum["obs"])
    np.testing.assert_array_equal(pool.action[:e0, :1], pendulum["action"])
    assert not pool.obs[:e0, 3:].any() and not pool.action[:e0, 1:].any()  # the padding is exactly 0
    np.testing.assert_array_equal(pool.obs[e0:], counting["obs"])
    np.testing.assert_array_equal(pool.action[e0:], counting["action"])
    np.testing.assert_array_equal(pool.reward, np.concatenate([pendulum["reward"], counting["reward"]]))
    np.testing.assert_array_equal(pool.task, np.repeat(np.array([0, 1], np.int16), [e0, e1]))
    assert pool.task.dtype == np.int16
    expected_starts = [*pendulum["episode_starts"], *(e0 + counting["episode_starts"][1:])]
    assert pool.episode_starts.tolist() == expected_starts
    meta = json.loads((pool.path / "meta.json").read_text())
    assert meta == {
        "format": "sb3_worldmodels.task_pool",
        "version": 1,
        "tasks": [
            {"name": "pendulum", "obs_dim": 3, "action_dim": 1, "episode_length": 20, "episodes": 4,
             "entries": e0},
            {"name": "counting", "obs_dim": 5, "action_dim": 2, "episode_length": 12, "episodes": 7,
             "entries": e1},
        ],
        "obs_dim": 5,
        "action_dim": 2,
    }  # fmt: skip
    assert sorted(p.name for p in pool.path.parent.iterdir()) == ["pool"]  # nothing left from building


def test_pool_is_memory_mapped_and_reopens(pool):
    for array in (pool.obs, pool.action, pool.reward, pool.task):
        assert isinstance(array, np.memmap) and not array.flags.writeable
    files = ("obs", "action", "reward", "task", "episode_starts")
    assert pool.nbytes == sum(np.load(pool.path / f"{name}.npy").nbytes for name in files)
    again = load_pool(str(pool.path))
    assert again.tasks == pool.tasks and again.episode_lengths == pool.episode_lengths
    np.testing.assert_array_equal(again.obs, pool.obs)


def test_episodes_are_the_exports_without_padding(pool, exports):
    for name, file in exports.items():
        data = read(file)
        starts = data["episode_starts"]
        episodes = list(pool.episodes(name))
        assert len(episodes) == len(starts) - 1
        for (obs, action, reward), lo, hi in zip(episodes, starts[:-1], starts[1:], strict=True):
            np.testing.assert_array_equal(obs, data["obs"][lo:hi])
            np.testing.assert_array_equal(action, data["action"][lo:hi])
            np.testing.assert_array_equal(reward, data["reward"][lo:hi])


# -------------------------------------------------------------------------------------------- sample
def window_starts(pool: TaskPool, first_obs: np.ndarray) -> np.ndarray:
    """The pool row of each sampled window's first observation (B,); every row is unique here."""
    match = np.all(np.asarray(pool.obs)[None, :, :] == first_obs[:, None, :], axis=2)  # (B, E)
    assert np.all(match.sum(axis=1) == 1)
    return match.argmax(axis=1)


def test_sample_draws_windows_inside_one_episode_never_the_last(pool):
    batch = pool.sample(np.random.default_rng(0), 4000, HORIZON)
    assert batch["obs"].shape == (HORIZON + 1, 4000, 5) and batch["obs"].dtype == np.float32
    assert batch["action"].shape == (HORIZON, 4000, 2) and batch["action"].dtype == np.float32
    assert batch["reward"].shape == (HORIZON, 4000) and batch["reward"].dtype == np.float32
    assert batch["task"].shape == (4000,) and batch["task"].dtype == np.int32
    assert all(type(value) is np.ndarray for value in batch.values())  # gathered rows, not the memmaps
    start = window_starts(pool, batch["obs"][0])
    rows = start[None, :] + np.arange(HORIZON + 1)[:, None]
    np.testing.assert_array_equal(batch["obs"], pool.obs[rows])
    np.testing.assert_array_equal(batch["action"], pool.action[rows[1:]])
    np.testing.assert_array_equal(batch["reward"], pool.reward[rows[1:]])
    np.testing.assert_array_equal(batch["task"], pool.task[start])
    # Every start the reference's crop allows is drawn, and no other: the window ending on an
    # episode's last entry never is (buffer.py:60-70@b67b21c).
    allowed = [
        s for lo, hi in zip(pool.episode_starts[:-1], pool.episode_starts[1:], strict=True)
        for s in range(lo, hi - HORIZON - 1)
    ]  # fmt: skip
    assert sorted(set(start.tolist())) == allowed
    counting = batch["task"] == 1
    t_end, length = batch["obs"][-1, counting, 1], batch["obs"][0, counting, 4]
    assert np.all(t_end <= length - 1)


def test_sample_skips_episodes_without_a_window_and_repeats_with_the_seed(pool):
    horizon = 11  # 12 + 1 entries: only the 12-step episodes (one start) and the pendulum's
    batch = pool.sample(np.random.default_rng(1), 500, horizon)
    start = window_starts(pool, batch["obs"][0])
    episode = np.searchsorted(pool.episode_starts, start, side="right") - 1
    assert np.all(np.diff(pool.episode_starts)[episode] >= horizon + 2)
    counting = batch["task"] == 1
    assert counting.any() and np.all(batch["obs"][0, counting, 1] == 0)
    again = pool.sample(np.random.default_rng(1), 500, horizon)
    for key, value in batch.items():
        np.testing.assert_array_equal(again[key], value)
    with pytest.raises(ValueError, match="No episode"):
        pool.sample(np.random.default_rng(0), 8, 20)


def test_unknown_task_names_the_known_ones(pool):
    with pytest.raises(ValueError, match=r"Unknown task 'cartpole'.*\['pendulum', 'counting'\]"):
        pool.task_id("cartpole")


# ---------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: {"version": np.array(2)}, "version 2"),
        (lambda d: {"format": np.array("something.else")}, "format is 'something.else'"),
        (lambda d: {"episode_starts": d["episode_starts"][:-1]}, "episode_starts"),
        (lambda d: {"episode_starts": d["episode_starts"] * 0}, "episode_starts"),
        (lambda d: {"obs": d["obs"].astype(object)}, "Python objects"),
        (lambda d: {"obs_dim": np.array(4)}, r"'obs' has shape"),
        (lambda d: {"reward": d["reward"].astype(np.float64)}, "'reward' is float64"),
        (lambda d: {"action": None}, "lacks"),
        (lambda d: {"obs": np.where(np.arange(len(d["obs"]))[:, None] == 30, np.nan, d["obs"])}, "NaN"),
    ],
    ids=["version", "format", "offsets-end", "offsets-order", "pickled", "dims", "dtype", "missing", "nan"],
)
def test_a_corrupt_export_is_refused_and_leaves_no_pool(exports, tmp_path, change, message):
    bad = tmp_path / "bad.npz"
    rewrite(exports["counting"], bad, **change(read(exports["counting"])))
    with pytest.raises(ValueError, match=message) as error:
        pool_tasks({"pendulum": exports["pendulum"], "counting": bad}, tmp_path / "pool")
    assert "'counting'" in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npz"]


def test_files_that_are_not_exports_are_refused(exports, tmp_path):
    np.save(tmp_path / "array.npy", np.zeros(3))
    (tmp_path / "text.npz").write_text("not an archive")
    cases = (("array.npy", "single array"), ("text.npz", "episode export"), ("no.npz", "No such"))
    for file, message in cases:
        with pytest.raises(ValueError, match=message):
            pool_tasks({"task": tmp_path / file}, tmp_path / "pool")
    assert not (tmp_path / "pool").exists()


def test_task_names_must_be_unique_and_non_empty(exports, tmp_path):
    with pytest.raises(ValueError, match="unique.*'a'"):
        pool_tasks([("a", exports["pendulum"]), ("a", exports["counting"])], tmp_path / "pool")
    with pytest.raises(ValueError, match="non-empty"):
        pool_tasks({" ": exports["pendulum"]}, tmp_path / "pool")
    with pytest.raises(ValueError, match="no task"):
        pool_tasks({}, tmp_path / "pool")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_is_replaced_only_when_asked_and_only_if_a_pool(exports, tmp_path):
    target = tmp_path / "pool"
    pool_tasks({"pendulum": exports["pendulum"]}, target)
    with pytest.raises(ValueError, match="overwrite=True"):
        pool_tasks({"counting": exports["counting"]}, target)
    assert load_pool(target).tasks == ("pendulum",)
    replaced = pool_tasks({"counting": exports["counting"]}, target, overwrite=True)
    assert replaced.tasks == ("counting",) and replaced.obs_dim == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pool"]
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a task pool"):
        pool_tasks({"counting": exports["counting"]}, foreign, overwrite=True)
    assert (foreign / "notes.txt").read_text() == "keep me"
    (tmp_path / "empty").mkdir()
    assert pool_tasks({"pendulum": exports["pendulum"]}, tmp_path / "empty").num_episodes == 4


def test_load_pool_names_the_file_and_the_problem(pool, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no meta.json"):
        load_pool(tmp_path / "empty")
    with pytest.raises(ValueError, match="not a directory"):
        load_pool(pool.path / "obs.npy")

    def broken(edit_meta=None, **arrays):
        """A copy of the pool with meta.json edited and some arrays replaced."""
        copy = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        copy.mkdir()
        meta = json.loads((pool.path / "meta.json").read_text())
        (copy / "meta.json").write_text(json.dumps(edit_meta(meta) if edit_meta else meta))
        for name in ("obs", "action", "reward", "task", "episode_starts"):
            np.save(copy / f"{name}.npy", arrays.get(name, np.load(pool.path / f"{name}.npy")))
        return copy

    cases = [
        (broken(lambda m: {**m, "format": "other.format"}), r"meta.json: format 'other.format'"),
        (broken(lambda m: {**m, "version": 7}), r"meta.json: version 7"),
        (broken(lambda m: {**m, "obs_dim": 9}), r"meta.json: 'obs_dim' is 9"),
        (broken(lambda m: {**m, "tasks": [m["tasks"][0], m["tasks"][0]]}), r"meta.json.*unique"),
        (broken(lambda m: {**m, "tasks": [{**m["tasks"][0], "entries": -1}]}), r"'entries' is -1"),
        (broken(obs=np.asarray(pool.obs, np.float64)), r"obs.npy is float64"),
        (broken(task=np.zeros(pool.num_entries, np.int16)), r"task.npy: the task ids"),
        (broken(episode_starts=np.asarray(pool.episode_starts) * 0), r"episode_starts.npy"),
        (broken(reward=np.array([object()] * pool.num_entries)), r"reward.npy is not a readable"),
    ]
    for path, message in cases:
        with pytest.raises(ValueError, match=message):
            load_pool(path)
    (cases[0][0] / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match="meta.json is not readable JSON"):
        load_pool(cases[0][0])


# ---------------------------------------------------------------------- the reference's released data
REFERENCE_DATA = Path(__file__).parent / "fixtures" / "tdmpc2" / "reference_data"
CHUNKS = [REFERENCE_DATA / "chunk_0.pt", REFERENCE_DATA / "chunk_1.pt"]
REFERENCE_TASKS = {"reach": (3, 1, 500), "push": (4, 2, 100)}  # task ids 0 and 1 of the chunks


def recorded_chunk(i: int) -> dict[str, np.ndarray]:
    recorded = load_fixture(REFERENCE_DATA / "expected.npz")
    return {key: recorded[f"chunk_{i}/{key}"] for key in ("obs", "action", "reward", "task")}


@pytest.mark.parametrize("i", [0, 1])
def test_reference_chunks_read_as_written(i):
    """Files in the reference's layout (a TensorDict saved with torch.save, written by tensordict 0.2.1)
    read back exactly, without tensordict installed."""
    data, recorded = read_reference_chunk(CHUNKS[i]), recorded_chunk(i)
    assert set(data) == set(recorded)
    for key in recorded:
        np.testing.assert_array_equal(data[key], recorded[key])


def test_reference_data_pools_each_task_in_order_without_padding(tmp_path):
    pool = pool_reference_data(CHUNKS, REFERENCE_TASKS, tmp_path / "pool")
    assert pool.tasks == ("reach", "push")
    assert (pool.obs_dims, pool.action_dims, pool.episode_lengths) == ((3, 4), (1, 2), (500, 100))
    assert (pool.obs_dim, pool.action_dim) == (4, 2)  # the widest task's, not the data's padding (5)
    assert pool.discounts == (discount_from_episode_length(500), discount_from_episode_length(100))
    chunks = [recorded_chunk(0), recorded_chunk(1)]
    for k, name in enumerate(pool.tasks):
        o, a, _ = REFERENCE_TASKS[name]
        expected = [(c, i) for c in chunks for i in np.flatnonzero(c["task"][:, 0] == k)]  # file order
        episodes = list(pool.episodes(name))
        assert len(episodes) == len(expected) == 3
        for (obs, action, reward), (c, i) in zip(episodes, expected, strict=True):
            np.testing.assert_array_equal(obs, c["obs"][i, :, :o])
            np.testing.assert_array_equal(action[1:], c["action"][i, 1:, :a])
            np.testing.assert_array_equal(reward[1:], c["reward"][i, 1:])
            assert not action[0].any() and reward[0] == 0.0  # entry 0: no action, no (NaN) reward
    assert np.all(pool.obs[pool.task == 0, 3:] == 0.0) and np.all(pool.action[pool.task == 0, 1:] == 0.0)
    batch = pool.sample(np.random.default_rng(0), 8, HORIZON)
    assert all(np.isfinite(v).all() for v in batch.values())


def test_a_code_payload_in_a_data_file_does_not_run(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    torch.save({"obs": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match="not a TensorDict"):
        read_reference_chunk(tmp_path / "evil.pt")
    with pytest.raises(ValueError, match="not a TensorDict"):
        pool_reference_data([tmp_path / "evil.pt"], REFERENCE_TASKS, tmp_path / "pool")
    assert not marker.exists() and not (tmp_path / "pool").exists()


def write_chunk(path: Path, **changes: np.ndarray) -> Path:
    """chunk_0's arrays with ``changes``, saved as a plain dict of tensors (also read)."""
    arrays = {**recorded_chunk(0), **changes}
    torch.save({key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in arrays.items()}, path)
    return path


NAN_IN_AN_OBSERVATION = np.where(np.arange(5) == 2, np.nan, recorded_chunk(0)["obs"])
TASK_CHANGING_MID_EPISODE = recorded_chunk(0)["task"] * np.r_[1, 1, 1, 1, 1, 0]


@pytest.mark.parametrize(
    "tasks, change, message",
    [
        ({"reach": (3, 1, 500)}, {}, "task ids 0..1; the tasks given are ids 0..0"),
        (
            REFERENCE_TASKS,
            {"obs": np.where(np.arange(5) == 2, np.nan, recorded_chunk(0)["obs"])},
            "non-finite",
        ),
        (
            REFERENCE_TASKS,
            {"task": recorded_chunk(0)["task"] * np.r_[1, 1, 1, 1, 1, 0]},
            "different task ids",
        ),
        ({"reach": (3, 1, 500), "push": (6, 2, 100)}, {}, "said to have 6 observations"),
        ({"reach": (3, 1, 500), "push": (4, 2, 100), "other": (2, 1, 50)}, {}, r"no episode of \['other'\]"),
        ({"reach": (3, 1, 500), "push": (4, 2)}, {}, "needs \\(obs_dim, action_dim, episode_length\\)"),
        (REFERENCE_TASKS, {"reward": recorded_chunk(0)["reward"][:, :4]}, "entries of shapes"),
    ],
)
def test_bad_reference_data_is_refused_and_writes_nothing(tmp_path, tasks, change, message):
    chunk = write_chunk(tmp_path / "chunk.pt", **change)
    with pytest.raises(ValueError, match=message):
        pool_reference_data([chunk], tasks, tmp_path / "pool")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunk.pt"]

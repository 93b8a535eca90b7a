"""Seed groups: a model built with a list of seeds runs every seed in one program, and seed ``i`` of the
group does what a single-seed model with that seed does (to float tolerance)."""

from __future__ import annotations

import json
import warnings
import zipfile

import gymnasium as gym
import jax
import numpy as np
import pytest
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.logger import KVWriter, Logger
from stable_baselines3.common.save_util import save_to_pkl
from stable_baselines3.common.vec_env import VecEnvWrapper

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.common import replay as replay_module
from sb3_worldmodels.common.seed_group import HandOuts
from sb3_worldmodels.common.seed_lanes import SEED_COUNTERS, interquartile_mean
from sb3_worldmodels.common.training import NonFiniteUpdateError
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE
from tests.probe_envs import ChainEnv
from tests.test_tdmpc2_loop import StopAt

SEEDS = [3, 7]


def assert_trees_close(a, b, rtol=1e-4, atol=2e-5):
    leaves_a, tree_a = jax.tree_util.tree_flatten(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


class Captured(KVWriter):
    """Every logged key with its values."""

    def __init__(self) -> None:
        self.values: dict[str, list] = {}

    def write(self, key_values, key_excluded, step=0) -> None:
        for key, value in key_values.items():
            self.values.setdefault(key, []).append(value)


def capture_logs(model) -> Captured:
    writer = Captured()
    model.set_logger(Logger(None, [writer]))
    return writer


def test_dreamerv3_group_seed_equals_single_seed_run():
    """CartPole's episodes end at different steps per seed: the seeds owe different updates per step
    (masked in the group's call) and count different rows; each seed still equals its own run."""
    group = DreamerV3("CartPole-v1", n_envs=2, seed=SEEDS, **DREAMER_SMOKE)
    logs = capture_logs(group)
    group.learn(64, log_interval=1)
    rows = [lane.num_timesteps for lane in group._lanes]
    assert min(rows) == group.num_timesteps >= 64
    # Within tolerance over the first ~50 updates: a seed's parameters move by about the learning
    # rate (4e-5) per update, so one update more or less (an unmasked padding update) shows.
    for i, seed in enumerate(SEEDS):
        single = DreamerV3("CartPole-v1", n_envs=2, seed=seed, **DREAMER_SMOKE)
        single.learn(rows[i])
        lane = group._lanes[i]
        assert single.num_timesteps == lane.num_timesteps
        assert single._n_updates == lane._n_updates > 0
        stored = single.replay_buffer.rows_added_per_env
        np.testing.assert_array_equal(stored, lane.replay_buffer.rows_added_per_env)
        first = single.replay_buffer.read_rows(0, np.arange(20))
        np.testing.assert_array_equal(first["obs"], lane.replay_buffer.read_rows(0, np.arange(20))["obs"])
        mine = group.seed_model(i).policy.state
        assert_trees_close(mine["agent"].params, single.policy.state["agent"].params)
        np.testing.assert_array_equal(np.asarray(mine["act_key"]), np.asarray(single.policy.state["act_key"]))
    for seed in SEEDS:
        assert any(key.startswith(f"seed_{seed}/train/") for key in logs.values)
    assert "train/n_updates" in logs.values
    assert any(key.startswith(f"seed_{SEEDS[1]}/rollout/ep_rew_mean") for key in logs.values)
    assert "rollout/ep_rew_iqm" in logs.values


def pendulum(n_envs: int):
    return make_vec_env(lambda: gym.make("Pendulum-v1", max_episode_steps=20), n_envs=n_envs)


def test_tdmpc2_group_seed_equals_single_seed_run():
    settings = {**TDMPC2_SMOKE, "seed_steps": 25}
    group = TDMPC2(pendulum(2 * len(SEEDS)), seed=SEEDS, **settings)
    group.learn(60)
    for i, seed in enumerate(SEEDS):
        single = TDMPC2(pendulum(2), seed=seed, **settings)
        single.learn(60)
        lane = group._lanes[i]
        assert single._n_updates == lane._n_updates > 0
        stored, _ = single.replay_buffer.export_state()
        theirs, _ = lane.replay_buffer.export_state()
        assert stored.keys() == theirs.keys()
        for key in stored:  # the same episodes (floats follow the actions: close, not bit for bit)
            if np.issubdtype(stored[key].dtype, np.floating):
                np.testing.assert_allclose(stored[key], theirs[key], rtol=1e-4, atol=1e-5, err_msg=key)
            else:
                np.testing.assert_array_equal(stored[key], theirs[key], err_msg=key)
        mine = group.seed_model(i).policy.state
        assert_trees_close(mine["agent"].params, single.policy.state["agent"].params)


def test_seed_model_acts_evaluates_and_saves(tmp_path):
    group = TDMPC2(pendulum(2), seed=[0, 1], **{**TDMPC2_SMOKE, "seed_steps": 10})
    group.learn(24)
    model = group.seed_model(1)
    assert isinstance(model, TDMPC2) and model.seed == 1 and model.seeds is None
    mean, _ = evaluate_policy(model, pendulum(1), n_eval_episodes=1)
    assert np.isfinite(mean)
    model.save(tmp_path / "seed1.zip")
    loaded = TDMPC2.load(tmp_path / "seed1.zip")
    obs = np.zeros((1, 3), np.float32)
    np.testing.assert_allclose(
        model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0]
    )


@pytest.mark.parametrize(
    ("seed", "message"),
    [([1, 1], "must differ"), ([], "one or more"), (["a"], "one or more"), ("3", "list of ints")],
)
def test_bad_seed_lists_are_refused(seed, message):
    with pytest.raises((ValueError, TypeError), match=message):
        TDMPC2(pendulum(2), seed=seed, **TDMPC2_SMOKE)


def test_group_needs_envs_per_seed():
    with pytest.raises(ValueError, match="not a multiple of 2"):
        TDMPC2(pendulum(3), seed=[0, 1], **TDMPC2_SMOKE)


class Passthrough(VecEnvWrapper):
    def reset(self):
        return self.venv.reset()

    def step_wait(self):
        return self.venv.step_wait()


def test_a_wrapped_vec_env_is_seeded_seed_major():
    """The seeds reach the VecEnv whose reset reads them (rl_zoo3 wraps its envs, e.g. VecNormalize)."""
    group = TDMPC2(Passthrough(pendulum(4)), seed=[3, 7], **TDMPC2_SMOKE)
    assert group.env.unwrapped._seeds == [3, 4, 7, 8]
    first = group.env.reset()
    for i, seed in enumerate((3, 4, 7, 8)):
        alone = gym.make("Pendulum-v1")
        np.testing.assert_allclose(first[i], alone.reset(seed=seed)[0], rtol=1e-6)


def test_interquartile_mean():
    assert interquartile_mean([1.0, 2.0, 3.0]) == 2.0
    assert interquartile_mean([0.0, 1.0, 2.0, 100.0]) == 1.5
    assert interquartile_mean([-50.0, 1.0, 2.0, 3.0, 90.0]) == 2.0


def test_settings_per_seed_equal_single_seed_runs_with_those_settings():
    """A learning rate and a loss scale given one value per seed: each seed runs as a single-seed
    model given its own values (one program for the group)."""
    settings = {**TDMPC2_SMOKE, "seed_steps": 25}
    rates, coefs = [1e-3, 3e-4], [20.0, 5.0]
    group = TDMPC2(
        pendulum(2 * len(SEEDS)), seed=SEEDS, learning_rate=rates, consistency_coef=coefs, **settings
    )
    group.learn(50)
    for i, seed in enumerate(SEEDS):
        single = TDMPC2(pendulum(2), seed=seed, learning_rate=rates[i], consistency_coef=coefs[i], **settings)
        single.learn(50)
        assert single._n_updates == group._lanes[i]._n_updates > 0
        assert_trees_close(
            group.seed_model(i).policy.state["agent"].params, single.policy.state["agent"].params
        )
    assert group.seed_model(1).consistency_coef == coefs[1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": 0, "consistency_coef": [1.0, 2.0]}, "needs a list of seeds"),
        ({"seed": [0, 1], "consistency_coef": [1.0, 2.0, 3.0]}, "One value per seed"),
        ({"seed": [0, 1], "learning_rate": [1e-3]}, "One value per seed"),
        ({"seed": [0, 1], "dropout": [0.0, 0.01]}, "dropout cannot take one value per seed"),
        ({"seed": [0, 1], "num_q": [2, 4]}, "num_q cannot take one value per seed"),
    ],
)
def test_settings_per_seed_are_refused_where_they_cannot_be(kwargs, message):
    settings = {**TDMPC2_SMOKE, **kwargs}
    with pytest.raises(ValueError, match=message):
        TDMPC2(pendulum(2), **settings)


# ------------------------------------------------------------------ files, predict and the SB3 surface
GROUP_SEEDS = [0, 1]
TDMPC2_CHAIN = {**TDMPC2_SMOKE, "seed_steps": 10}
DREAMER_CHAIN = {**DREAMER_SMOKE, "n_envs": None}
SPLIT = {TDMPC2: (TDMPC2_CHAIN, 30), DreamerV3: (DREAMER_CHAIN, 33)}  # steps that end at an episode's end


def chain(n_envs: int = len(GROUP_SEEDS)):
    """One env per seed of a two-seed group: deterministic episodes of 10 steps."""
    return make_vec_env(lambda: TimeLimit(ChainEnv(), 10), n_envs=n_envs)


def tdmpc2_group(**overrides):
    return TDMPC2(chain(), seed=GROUP_SEEDS, **{**TDMPC2_CHAIN, **overrides})


def lane_counters(model) -> list[tuple]:
    return [
        (
            lane.num_timesteps,
            lane._n_updates,
            lane._owed_updates,
            lane.at_episode_boundary,
            getattr(lane, "_rows", None),
            lane._schedule.prev if hasattr(lane, "_schedule") else None,
            [info["r"] for info in lane.ep_info_buffer],
        )
        for lane in model._lanes
    ]


def split_run_equals_whole_run(cls, tmp_path) -> None:
    settings, half = SPLIT[cls]
    whole = cls(chain(), seed=GROUP_SEEDS, **settings)
    whole.learn(2 * half)
    first = cls(chain(), seed=GROUP_SEEDS, **settings)
    first.learn(half)
    first.save(tmp_path / "group.zip")
    first.save_replay_buffer(tmp_path / "group_replay.pkl")

    second = cls.load(tmp_path / "group.zip", env=chain())
    assert second.seeds == tuple(GROUP_SEEDS) and len(second._lanes) == len(GROUP_SEEDS)
    assert lane_counters(second) == lane_counters(first)
    assert not hasattr(second, SEED_COUNTERS)
    second.load_replay_buffer(tmp_path / "group_replay.pkl")
    with warnings.catch_warnings():  # the replay and a boundary: nothing for the resume to warn about
        warnings.filterwarnings("error", message="Continuing a loaded")
        second.learn(half, reset_num_timesteps=False)

    assert second.num_timesteps == whole.num_timesteps and lane_counters(second) == lane_counters(whole)
    leaves = jax.tree_util.tree_leaves_with_path(whole.policy.state)
    for (path, a), b in zip(leaves, jax.tree_util.tree_leaves(second.policy.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))


def test_tdmpc2_group_split_by_save_and_load_equals_the_whole_run(tmp_path):
    split_run_equals_whole_run(TDMPC2, tmp_path)


def test_dreamerv3_group_split_by_save_and_load_equals_the_whole_run(tmp_path):
    split_run_equals_whole_run(DreamerV3, tmp_path)


def test_a_group_checkpoint_is_plain_data_and_its_counters_must_fit(tmp_path):
    group = tdmpc2_group(learning_rate=[1e-3, 3e-4], consistency_coef=[20.0, 5.0])
    group.save(tmp_path / "group.zip")
    loaded = TDMPC2.load(tmp_path / "group.zip")
    assert [(lane.learning_rate, lane.consistency_coef) for lane in loaded._lanes] == [
        (1e-3, 20.0),
        (3e-4, 5.0),
    ]
    with zipfile.ZipFile(tmp_path / "group.zip") as archive:
        data = json.loads(archive.read("data"))
    assert not [key for key, value in data.items() if isinstance(value, dict) and ":serialized:" in value]
    assert len(data[SEED_COUNTERS]) == 2 and data["seeds"]["items"] == GROUP_SEEDS
    with pytest.raises(ValueError, match="per-seed counters .* do not fit a group of 2 seeds"):
        TDMPC2.load(tmp_path / "group.zip", custom_objects={SEED_COUNTERS: [{"num_timesteps": 3}]})
    with pytest.raises(ValueError, match="needs n_envs envs per seed"):
        TDMPC2.load(tmp_path / "group.zip", env=chain(3))
    single = TDMPC2(chain(1), seed=0, **TDMPC2_CHAIN)
    single.save(tmp_path / "single.zip")
    with zipfile.ZipFile(tmp_path / "single.zip") as archive:
        assert SEED_COUNTERS not in json.loads(archive.read("data"))
    assert TDMPC2.load(tmp_path / "single.zip").seeds is None


def test_hand_outs_give_back_the_stacked_array_for_its_own_pieces_only():
    whole = np.arange(6.0).reshape(3, 2)
    pieces = [whole[i] for i in range(3)]
    hand_outs = HandOuts()
    hand_outs.hand(whole, pieces)
    assert hand_outs.stacked(pieces) is whole
    assert hand_outs.stacked(pieces[::-1]) is None  # another seed order
    assert hand_outs.stacked([pieces[0], whole[1], pieces[2]]) is None  # an equal copy is not a piece
    assert hand_outs.stacked([np.zeros(2)] * 3) is None
    tree = {"a": np.ones((2, 3)), "b": (np.zeros((2, 1)),)}
    per_seed = [jax.tree_util.tree_map(lambda x, i=i: x[i], tree) for i in range(2)]
    hand_outs.hand_tree(tree, per_seed)
    assert hand_outs.stacked([p["b"][0] for p in per_seed]) is tree["b"][0]
    hand_outs.clear()
    assert hand_outs.stacked(pieces) is None


def test_a_group_hands_its_lanes_pieces_and_takes_them_back_stacked():
    """After a step each lane carries its piece of the acting call's outputs (a read-only host view);
    the next call's argument is the group's array itself, not the pieces stacked again."""
    group = tdmpc2_group()
    group.learn(12)
    lanes = group._lanes
    carried = [lane._rollout.prev_mean for lane in lanes]
    assert all(isinstance(c, np.ndarray) and not c.flags.writeable for c in carried)
    stacked = group._stacked_arguments([(c,) for c in carried])[0]
    assert isinstance(stacked, jax.Array) and stacked.shape == (2, *carried[0].shape)
    for i, c in enumerate(carried):
        np.testing.assert_array_equal(np.asarray(stacked[i]), c)
    with pytest.raises(ValueError, match="read-only"):
        carried[0][...] = 0.0
    fresh = group._stacked_arguments([(np.array(c),) for c in carried])[0]  # copies: stacked anew
    assert fresh is not stacked


def test_a_non_finite_update_of_one_seed_stops_the_group_and_keeps_every_seed():
    group = tdmpc2_group()
    group.learn(30)
    updates = [lane._n_updates for lane in group._lanes]
    assert min(updates) > 0
    before = [np.asarray(leaf).copy() for leaf in jax.tree_util.tree_leaves(group.policy.state["agent"])]
    group._lanes[1].replay_buffer._data["reward"][...] = np.nan  # seed 1's replay only
    with pytest.raises(
        NonFiniteUpdateError, match=rf"Seed 1 \(index 1\): Update {updates[1] + 1} produced non-finite"
    ):
        group.learn(10, reset_num_timesteps=False)
    assert [lane._n_updates for lane in group._lanes] == updates
    for kept, leaf in zip(before, jax.tree_util.tree_leaves(group.policy.state["agent"]), strict=True):
        np.testing.assert_array_equal(kept, np.asarray(leaf))


class _UnsettledAtRolloutStart(BaseCallback):
    """Records, before each step's acting call, whether a training call is waiting to be settled."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[bool, int]] = []

    def _on_rollout_start(self) -> None:
        self.seen.append((self.model._unsettled is not None, self.model._n_updates))

    def _on_step(self) -> bool:
        assert self.model._unsettled is None  # the acting call of this step settled it
        return True


def test_a_groups_last_training_call_settles_at_the_next_acting_call():
    group = tdmpc2_group()
    watch = _UnsettledAtRolloutStart()
    group.learn(30, callback=watch)
    waiting = [n for unsettled, n in watch.seen if unsettled]
    assert waiting, "no training call was left to settle at the next acting call"
    # Before the acting call settles it, the waiting call's updates are not counted yet.
    assert all(n < group._n_updates for n in waiting)
    assert group._unsettled is None  # learn settles the last one before it returns
    assert group._n_updates == max(lane._n_updates for lane in group._lanes) > 0


def test_group_replay_file_holds_every_seed_and_must_fit_the_group(tmp_path):
    group = tdmpc2_group()
    group.learn(12)
    group.save_replay_buffer(tmp_path / "group.pkl")
    with zipfile.ZipFile(tmp_path / "group.pkl") as archive:
        names = archive.namelist()
    assert {name.split("/")[0] for name in names} == {"__meta__.npy", "seed_0", "seed_1"}
    assert not list(tmp_path.glob(".*tmp*"))  # written atomically: no temporary file left

    loaded = tdmpc2_group()
    loaded.load_replay_buffer(tmp_path / "group.pkl")
    for i, (mine, theirs) in enumerate(zip(loaded._lanes, group._lanes, strict=True)):
        assert mine.replay_buffer is loaded.replay_buffer[i]
        mine_arrays, theirs_arrays = (
            mine.replay_buffer.export_state()[0],
            theirs.replay_buffer.export_state()[0],
        )
        assert mine_arrays.keys() == theirs_arrays.keys()
        for key, value in mine_arrays.items():
            np.testing.assert_array_equal(value, theirs_arrays[key], err_msg=key)

    single = TDMPC2(chain(1), seed=0, **TDMPC2_CHAIN)
    with pytest.raises(ValueError, match="replays of a seed group \\(2 seeds"):
        single.load_replay_buffer(tmp_path / "group.pkl")
    single.learn(12)
    single.save_replay_buffer(tmp_path / "single.pkl")
    save_to_pkl(tmp_path / "pickled.pkl", single.replay_buffer)
    others = [
        (tdmpc2_group(), tmp_path / "single.pkl", "holds one seed's replay"),
        (tdmpc2_group(), tmp_path / "pickled.pkl", "pickled replay of one seed"),
        (TDMPC2(chain(3), seed=[0, 1, 2], **TDMPC2_CHAIN), tmp_path / "group.pkl", "replays of 2 seeds"),
        (tdmpc2_group(horizon=2), tmp_path / "group.pkl", "seed index 0: .*samples windows"),
        (
            TDMPC2(chain(4), seed=GROUP_SEEDS, **TDMPC2_CHAIN),
            tmp_path / "group.pkl",
            "seed index 0: .*n_envs",
        ),
    ]
    for model, path, message in others:
        with pytest.raises(ValueError, match=message):
            model.load_replay_buffer(path)
        assert model.replay_buffer is None and all(lane.replay_buffer is None for lane in model._lanes)


def test_group_predict_acts_as_the_named_seeds_model():
    group = tdmpc2_group()
    group.learn(12)
    obs = np.array([[0.3, 1.0], [0.7, 1.0]], np.float32)
    plan = np.zeros((2, group._config.horizon, 1), np.float32)

    def each_seed():
        out = []
        for i in range(len(GROUP_SEEDS)):
            model = group.seed_model(i)
            action, state = group.predict(obs, deterministic=True, seed_index=i)
            expected, expected_state = model.predict(obs, deterministic=True)
            np.testing.assert_array_equal(action, expected)
            np.testing.assert_array_equal(state[0], expected_state[0])
            rollout = group.predict_rollout(obs, np.ones((2, 3, 1), np.float32), seed_index=i)
            np.testing.assert_array_equal(
                rollout["reward"], model.predict_rollout(obs, np.ones((2, 3, 1)))["reward"]
            )
            planned = group.predict_plan_rollout(obs, plan, seed_index=i)
            np.testing.assert_array_equal(planned["value"], model.predict_plan_rollout(obs, plan)["value"])
            out.append(rollout["reward"])
        return out

    before = each_seed()
    group.learn(12, reset_num_timesteps=False)  # the seeds' states change: predict follows them
    after = each_seed()
    assert not np.array_equal(before[0], after[0])
    assert all(lane.policy.state is None for lane in group._lanes)

    for call in (
        lambda: group.predict(obs),
        lambda: group.policy.predict(obs),
        lambda: group.predict_rollout(obs, plan),
    ):
        with pytest.raises(ValueError, match=r"needs seed_index=i.*group.seed_model\(i\)"):
            call()
    with pytest.raises(IndexError, match="seed_index 2 outside"):
        group.predict(obs, seed_index=2)
    with pytest.raises(ValueError, match="evaluate_policy"):
        evaluate_policy(group, chain(1), n_eval_episodes=1)
    single = group.seed_model(0)
    expected = single.predict(obs, deterministic=True)[0]
    np.testing.assert_array_equal(single.predict(obs, deterministic=True, seed_index=0)[0], expected)
    with pytest.raises(ValueError, match="for a seed group"):
        single.predict(obs, seed_index=1)
    with pytest.raises(ValueError, match=r"seed_model\(i\).policy.save"):
        group.policy.save("unused.zip")


def test_replay_memory_counts_every_seed(monkeypatch):
    group = tdmpc2_group(buffer_size=1_000_000)
    assert group.replay_bytes_per_seed == 0
    replay, rows = group._lanes[0]._replay_for_run(20_000, True)
    one_seed = replay.bytes_to_reserve(rows)
    monkeypatch.setattr(replay_module, "available_memory", lambda: int(one_seed * 1.5))
    with pytest.raises(MemoryError, match="GiB for the replay .*does not fit"):
        group.learn(20_000)  # the two seeds' replays need twice what one does
    assert group.replay_buffer is None and group.num_timesteps == 0 and group._last_obs is None
    monkeypatch.undo()
    group.learn(12)
    held = [lane.replay_buffer.nbytes for lane in group._lanes]
    assert group.replay_bytes_per_seed == sum(held) // 2 > 0


def test_group_env_learn_twice_progress_bar_and_checkpoints(tmp_path):
    group = tdmpc2_group()
    assert group.get_env().num_envs == 2
    with pytest.raises(ValueError, match="needs a VecEnv of 2 envs, seed-major"):
        group.set_env(chain(3))
    group.set_env(chain())
    saves = CheckpointCallback(save_freq=6, save_path=str(tmp_path), save_replay_buffer=True)
    group.learn(12, callback=saves, progress_bar=True)
    counted = [lane.num_timesteps for lane in group._lanes]
    group.learn(6, reset_num_timesteps=False)
    assert [lane.num_timesteps for lane in group._lanes] == [n + 6 for n in counted]
    assert group.num_timesteps == 18

    loaded = TDMPC2.load(tmp_path / "rl_model_12_steps.zip", env=chain())
    loaded.load_replay_buffer(tmp_path / "rl_model_replay_buffer_12_steps.pkl")
    assert loaded.seeds == (0, 1) and [lane.num_timesteps for lane in loaded._lanes] == counted


def test_eval_callback_on_a_group_is_refused_before_anything_changes():
    group = tdmpc2_group()
    for callback in (EvalCallback(chain(1)), [CheckpointCallback(10, "unused"), EvalCallback(chain(1))]):
        with pytest.raises(ValueError, match=r"EvalCallback evaluates model.predict.*seed_model\(i\)"):
            group.learn(10, callback=callback)
    assert group.num_timesteps == 0 and group.replay_buffer is None and group._last_obs is None


def test_a_groups_step_update_runs_while_its_env_steps_and_a_stop_drops_it():
    """After the seed phase each step's group update is dispatched before the step's env step and taken
    by ``train`` (the seeds' same updates); a callback that stops ``learn`` at such a step leaves the
    group as a run that ended one step earlier: parameters, counters and every seed's replay draws."""
    taken = []
    stopped, ended = tdmpc2_group(), tdmpc2_group()
    takes = stopped._takes_group_staged
    stopped._takes_group_staged = lambda staged, owed: taken.append(takes(staged, owed)) or taken[-1]
    stopped.learn(40, callback=StopAt(30))  # steps 0..29; step 29's update is dropped
    ended.learn(29)
    assert taken and all(taken) and len(taken) == 29 - 1 - TDMPC2_CHAIN["seed_steps"]
    assert stopped.num_timesteps == 30 and ended.num_timesteps == 29
    assert [lane._n_updates for lane in stopped._lanes] == [lane._n_updates for lane in ended._lanes]
    same = jax.tree_util.tree_map(np.array_equal, stopped.policy.state["agent"], ended.policy.state["agent"])
    assert all(jax.tree_util.tree_leaves(same))
    for mine, theirs in zip(stopped._lanes, ended._lanes, strict=True):
        assert mine.replay_buffer.rng.bit_generator.state == theirs.replay_buffer.rng.bit_generator.state

"""SeedGroupEvalCallback: SB3's EvalCallback for one seed, and for a seed group an evaluation of every
seed during ``learn`` (their mean decides the best model and stops training)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback, StopTrainingOnRewardThreshold
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_worldmodels import TDMPC2, DreamerV3, SeedGroupEvalCallback, TDMPC2MultiTask
from sb3_worldmodels.common.seed_lanes import interquartile_mean
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS
from tests.test_seed_groups import assert_trees_close, capture_logs
from tests.test_tdmpc2_multitask import small_pool  # noqa: F401 (a fixture)

SEEDS = [0, 1]
EPISODE = 20  # Pendulum's episodes cut to 20 steps (a training episode ends before the first update)
UNTRAINED = 10 * EPISODE  # seed_steps past the runs here: no update compiled, only the planner


def pendulum(n_envs: int, seed: int | None = None):
    return make_vec_env(lambda: gym.make("Pendulum-v1", max_episode_steps=EPISODE), n_envs=n_envs, seed=seed)


def tiny_tdmpc2(seed, seed_steps: int = UNTRAINED) -> TDMPC2:
    n_seeds = len(seed) if isinstance(seed, list) else 1
    return TDMPC2(pendulum(n_seeds), seed=seed, seed_steps=seed_steps, **SMOKE_SETTINGS)


class KeepSeedModels(BaseCallback):
    """After each evaluation (as ``callback_after_eval``): every seed's model as it was evaluated."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[list[TDMPC2]] = []

    def _on_step(self) -> bool:
        self.kept.append([self.model.seed_model(i) for i in range(len(self.model.seeds))])
        return True


@pytest.mark.parametrize("trained", [False, True], ids=["untrained", "trained"])
def test_a_group_evaluates_every_seed_logs_their_mean_and_saves_the_best_group(tmp_path, trained):
    """Each seed's returns are evaluate_policy's for its seed_model(i) on the same eval episodes (one
    seed after another on the eval env); the mean over the seeds is eval/mean_reward and picks the
    best model, which is the whole group at that evaluation. Untrained, the seeds differ by their
    initial parameters and the evaluations by their episodes; trained, also by their updates."""
    group = tiny_tdmpc2(SEEDS, seed_steps=EPISODE if trained else UNTRAINED)
    logs = capture_logs(group)
    kept = KeepSeedModels()
    evaluation = SeedGroupEvalCallback(
        pendulum(1, seed=100),
        callback_after_eval=kept,
        eval_freq=EPISODE,
        n_eval_episodes=1,
        log_path=str(tmp_path),
        best_model_save_path=str(tmp_path),
        verbose=0,
    )
    group.learn(2 * EPISODE, callback=evaluation)
    assert (group._n_updates > 0) == trained and len(kept.kept) == 2

    replay_env = pendulum(1, seed=100)  # the eval env again: the same episodes, in the same order
    expected = [
        [
            evaluate_policy(model, replay_env, n_eval_episodes=1, return_episode_rewards=True)
            for model in models
        ]
        for models in kept.kept
    ]
    per_seed = np.array([[np.mean(returns) for returns, _ in row] for row in expected])  # (E, S)
    for i, seed in enumerate(SEEDS):
        np.testing.assert_allclose(logs.values[f"seed_{seed}/eval/mean_reward"], per_seed[:, i], rtol=1e-6)
    np.testing.assert_allclose(logs.values["eval/mean_reward"], per_seed.mean(axis=1), rtol=1e-6)
    iqm = [interquartile_mean(list(row)) for row in per_seed]
    np.testing.assert_allclose(logs.values["eval/mean_reward_iqm"], iqm, rtol=1e-6)
    assert evaluation.last_mean_reward == pytest.approx(per_seed[-1].mean(), rel=1e-6)
    assert evaluation.best_mean_reward == pytest.approx(per_seed.mean(axis=1).max(), rel=1e-6)

    with np.load(tmp_path / "evaluations.npz") as saved:
        assert list(saved["seeds"]) == SEEDS
        np.testing.assert_array_equal(saved["timesteps"], [EPISODE, 2 * EPISODE])
        assert saved["results"].shape == saved["ep_lengths"].shape == (2, len(SEEDS))  # seed-major
        np.testing.assert_allclose(saved["results"], per_seed, rtol=1e-6)
        np.testing.assert_array_equal(saved["ep_lengths"], np.full((2, len(SEEDS)), EPISODE))
    assert not list(tmp_path.glob(".*.tmp*"))  # written atomically, no temporary left

    best = TDMPC2.load(tmp_path / "best_model.zip")
    best_index = int(np.argmax(per_seed.mean(axis=1)))
    assert best.seeds == tuple(SEEDS) and best.num_timesteps == (best_index + 1) * EPISODE
    for i in range(len(SEEDS)):
        assert_trees_close(
            best.seed_model(i).policy.state["agent"].params,
            kept.kept[best_index][i].policy.state["agent"].params,
            rtol=0,
            atol=0,
        )


def test_a_reached_reward_threshold_stops_the_groups_learn():
    group = tiny_tdmpc2(SEEDS)
    stop = StopTrainingOnRewardThreshold(reward_threshold=-1e9, verbose=0)
    evaluation = SeedGroupEvalCallback(
        pendulum(1, seed=100), callback_on_new_best=stop, eval_freq=EPISODE, n_eval_episodes=1, verbose=0
    )
    group.learn(4 * EPISODE, callback=evaluation)
    assert group.num_timesteps == EPISODE and [lane.num_timesteps for lane in group._lanes] == [EPISODE] * 2


def test_for_one_seed_it_is_sb3s_eval_callback(tmp_path):
    """The same run with SB3's EvalCallback and with ours: the same logs, evaluations and best model."""
    runs = []
    for name, callback_class in (("sb3", EvalCallback), ("ours", SeedGroupEvalCallback)):
        model = tiny_tdmpc2(5)
        logs = capture_logs(model)
        evaluation = callback_class(
            pendulum(1, seed=100),
            eval_freq=EPISODE + 5,
            n_eval_episodes=2,
            log_path=str(tmp_path / name),
            best_model_save_path=str(tmp_path / name),
            verbose=0,
        )
        model.learn(EPISODE + 5, callback=evaluation)
        with np.load(tmp_path / name / "evaluations.npz") as saved:
            files = {key: saved[key] for key in saved.files}
        best = TDMPC2.load(tmp_path / name / "best_model.zip").policy.state["agent"].params
        runs.append((logs.values, files, best, evaluation.last_mean_reward))
    (sb3_logs, sb3_files, sb3_best, sb3_mean), (logs, files, best, mean) = runs
    assert "eval/mean_reward_iqm" not in logs and sorted(files) == sorted(sb3_files) and mean == sb3_mean
    for key in ("eval/mean_reward", "eval/mean_ep_length"):
        assert logs[key] == sb3_logs[key]
    for key, value in sb3_files.items():
        np.testing.assert_array_equal(files[key], value)
    assert_trees_close(best, sb3_best, rtol=0, atol=0)


def test_sb3s_eval_callback_on_a_group_is_refused_naming_this_one():
    group = tiny_tdmpc2(SEEDS)
    with pytest.raises(ValueError, match=r"SeedGroupEvalCallback\(eval_env, \.\.\.\).*seed_model\(i\)"):
        group.learn(10, callback=EvalCallback(pendulum(1)))
    assert group.num_timesteps == 0 and group.replay_buffer is None


@pytest.mark.parametrize("seed", [0, [0, 1]], ids=["one-seed", "group"])
def test_a_multitask_model_refuses_it_for_its_own_callback(small_pool, seed):  # noqa: F811
    model = tiny_multitask(small_pool, seed)
    for callback_class in (SeedGroupEvalCallback, EvalCallback):
        callback = callback_class(pendulum(1), eval_freq=1, verbose=0)
        with pytest.raises(
            ValueError, match=rf"{callback_class.__name__} plays one eval env.*MultiTaskEvalCallback"
        ):
            model.learn(2, callback=[callback])
    assert model.num_timesteps == 0


def tiny_multitask(pool, seed) -> TDMPC2MultiTask:
    settings = {k: v for k, v in SMOKE_SETTINGS.items() if k not in ("model_size", "batch_size")}
    return TDMPC2MultiTask(pool, model_size=1, batch_size=16, task_dim=8, seed=seed, **settings)


def test_a_dreamerv3_group_is_evaluated_seed_by_seed_and_its_best_group_loads(tmp_path):
    group = DreamerV3("CartPole-v1", n_envs=1, seed=SEEDS, learning_starts=UNTRAINED, **DREAMER_SMOKE)
    logs = capture_logs(group)
    evaluation = SeedGroupEvalCallback(
        make_vec_env("CartPole-v1", n_envs=1, seed=100),
        eval_freq=EPISODE,
        n_eval_episodes=2,
        log_path=str(tmp_path),
        best_model_save_path=str(tmp_path),
        verbose=0,
    )
    group.learn(EPISODE, callback=evaluation)
    per_seed = [logs.values[f"seed_{seed}/eval/mean_reward"][-1] for seed in SEEDS]
    assert logs.values["eval/mean_reward"] == [pytest.approx(np.mean(per_seed), rel=1e-6)]
    with np.load(tmp_path / "evaluations.npz") as saved:
        assert saved["results"].shape == (1, 2 * len(SEEDS)) and list(saved["seeds"]) == SEEDS
        np.testing.assert_allclose(saved["results"][0].reshape(len(SEEDS), 2).mean(axis=1), per_seed)
    best = DreamerV3.load(tmp_path / "best_model.zip")
    assert best.seeds == tuple(SEEDS) and best.num_timesteps == group.num_timesteps

"""Crafter with the DreamerV3 reference's settings (``sb3_worldmodels.envs.crafter``).

crafter generates each world in pure Python (about 1-2 s a reset at its default 64 x 64 tile area
without numba), so most tests here use a 32 x 32 tile world (``area``, passed to ``crafter.Env``),
which resets in a fraction of that; the observation is the same 9 x 9 tile view either way.
"""

from __future__ import annotations

import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest

crafter = pytest.importorskip("crafter")

from sb3_worldmodels.envs.crafter import (  # noqa: E402
    CrafterEnv,
    crafter_score,
    crafter_success_rates,
    make_crafter_env,
)

SMALL = dict(area=(32, 32))  # a smaller world: quicker resets


def rollout(env: gym.Env, actions: list[int]) -> list[tuple]:
    steps = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append((obs.copy(), reward, terminated, truncated, info["achievements"], info["inventory"]))
        if terminated or truncated:
            break
    return steps


def assert_same(first: list[tuple], second: list[tuple]) -> None:
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1:] == b[1:]


def test_spaces_and_first_steps():
    env = make_crafter_env(seed=0)  # the reference's settings: 64 x 64 images, 64 x 64 world
    assert env.observation_space == gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    assert env.action_space == gym.spaces.Discrete(17) == gym.spaces.Discrete(len(crafter.constants.actions))
    assert env.unwrapped.action_names[0] == "noop" and len(env.unwrapped.achievement_names) == 22
    obs, info = env.reset()
    assert obs.shape == (64, 64, 3) and obs.dtype == np.uint8 and env.observation_space.contains(obs)
    assert obs.flags.c_contiguous and obs.std() > 0  # an image, not a blank
    assert info["achievements"] == dict.fromkeys(crafter.constants.achievements, 0)
    assert info["inventory"]["health"] == 9
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert env.observation_space.contains(obs) and isinstance(reward, float)
    assert (terminated, truncated) == (False, False)
    assert set(info["achievements"]) == set(crafter.constants.achievements)
    assert info["discount"] == 1.0 and {"inventory", "semantic", "player_pos", "reward"} <= set(info)
    obs = make_crafter_env(size=96, **SMALL).reset(seed=0)[0]
    assert obs.shape == (96, 96, 3)


def test_env_checkers_pass():
    from gymnasium.utils.env_checker import check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    with warnings.catch_warnings():  # "not able to test alternative render modes" (no env spec)
        warnings.filterwarnings("ignore", message=".*alternative render modes.*")
        check_env(make_crafter_env(render_mode="rgb_array", **SMALL))
    sb3_check_env(make_crafter_env(**SMALL))


def test_seeded_resets_and_trajectories_repeat():
    actions = list(np.random.default_rng(0).integers(17, size=40))
    env, other = make_crafter_env(**SMALL), make_crafter_env(**SMALL)
    obs, _ = env.reset(seed=3)
    np.testing.assert_array_equal(other.reset(seed=3)[0], obs)
    assert_same(rollout(env, actions), rollout(other, actions))
    # Reseeding the same env restarts the same sequence of worlds.
    np.testing.assert_array_equal(env.reset(seed=3)[0], obs)
    first = rollout(env, actions)
    # An unseeded reset goes on to the seed's next world (crafter: hash((seed, episode))), the same in
    # both envs, and differs from the first one.
    second_obs = env.reset()[0]
    other.reset(seed=3)
    np.testing.assert_array_equal(other.reset()[0], second_obs)
    assert not np.array_equal(second_obs, obs)
    # make_crafter_env(seed=s): the first reset is reset(seed=s).
    seeded = make_crafter_env(seed=3, **SMALL)
    np.testing.assert_array_equal(seeded.reset()[0], obs)
    assert_same(rollout(seeded, actions), first)


def test_different_seeds_give_different_worlds():
    env = make_crafter_env(**SMALL)
    images = [env.reset(seed=seed)[0] for seed in (0, 1)]
    assert not np.array_equal(*images)
    semantic = [make_crafter_env(seed=seed, **SMALL) for seed in (0, 1)]
    maps = []
    for each in semantic:
        each.reset()
        maps.append(each.step(0)[4]["semantic"])
    assert not np.array_equal(*maps)


def test_time_limit_truncates():
    env = make_crafter_env(length=5, **SMALL)
    env.reset(seed=0)
    flags = [env.step(0)[2:4] for _ in range(5)]
    assert flags == [(False, False)] * 4 + [(False, True)]


@pytest.mark.parametrize("reward", [True, False])
def test_death_terminates(reward):
    env = make_crafter_env(reward=reward, **SMALL)
    env.reset(seed=0)
    # Dying takes crafter hundreds of steps (starving, or a zombie at night); set the player's health
    # to 0 instead, through crafter's own player object (crafter 1.8.3's ``Env._player``). The next
    # noop cannot regenerate it (that needs 26 steps of recovery), so crafter reports done with
    # discount 0, which is a termination.
    env.unwrapped.env._player.health = 0
    obs, step_reward, terminated, truncated, info = env.step(0)
    assert (terminated, truncated) == (True, False) and info["discount"] == 0.0
    assert info["reward"] == pytest.approx(-0.9)  # the task reward: health 9 -> 0, divided by 10
    assert step_reward == (pytest.approx(-0.9) if reward else 0.0)  # crafter_noreward: 0


def test_achievements_and_score():
    env = make_crafter_env(**SMALL)
    env.reset(seed=0)
    info = env.step(0)[4]
    info["achievements"]["collect_wood"] = 7  # a copy: crafter's own counts are not touched
    assert env.unwrapped.env._player.achievements["collect_wood"] == 0
    none = dict.fromkeys(crafter.constants.achievements, 0)
    every = dict.fromkeys(crafter.constants.achievements, 1)
    assert crafter_score([none]) == 0.0
    assert crafter_score([every, every]) == pytest.approx(100.0)
    wood = {**none, "collect_wood": 3}
    assert crafter_success_rates([wood, none])["collect_wood"] == 50.0
    assert crafter_score([wood, none]) == pytest.approx(np.exp(np.log(51.0) / 22) - 1)
    with pytest.raises(ValueError):
        crafter_score([])


def test_bad_settings_and_use_before_reset():
    with pytest.raises(ValueError, match="size"):
        make_crafter_env(size=8)
    with pytest.raises(ValueError, match="length"):
        make_crafter_env(length=0)
    with pytest.raises(ValueError, match="render_mode"):
        make_crafter_env(render_mode="human")
    env = make_crafter_env(**SMALL)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="not in"):
        env.step(17)


def test_copy_and_pickle_go_on_identically():
    import copy
    import pickle

    env = make_crafter_env(**SMALL)
    env.reset(seed=0)
    env.step(3)
    actions = [5, 1, 4, 5, 2]
    copies = [copy.deepcopy(env), pickle.loads(pickle.dumps(env))]
    expected = rollout(env, actions)
    for each in copies:
        assert_same(rollout(each, actions), expected)


def test_missing_crafter_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "crafter", None)  # ``import crafter`` now raises ImportError
    with pytest.raises(ImportError, match=r"sb3_worldmodels\[crafter\]"):
        CrafterEnv()


def test_dreamerv3_smoke():
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_worldmodels import DreamerV3
    from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as SMOKE

    env = make_vec_env(lambda: make_crafter_env(size=32, area=(32, 32)), n_envs=1, seed=0)
    # Collection only (learning_starts): DreamerV3's updates on images are tested in test_dreamerv3_images.
    model = DreamerV3("CnnPolicy", env, **SMOKE, cnn_depth=2, seed=0, learning_starts=1_000).learn(64)
    assert model.replay_buffer.rows_per_env.sum() >= 64 and model._n_updates == 0
    obs = env.reset()
    action, _ = model.predict(obs)  # the acting step that learn() compiled
    assert action.shape == (1,) and env.action_space.contains(int(action[0]))
    env.step(action)

"""Atari with the DreamerV3 reference's settings (``sb3_worldmodels.envs.atari``), against raw ALE.

The raw env is ale-py's own Gymnasium env at frame skip 1 without sticky actions and with all 18
actions; one step of ours must be 4 of its frames, the last two max-pooled, resized with Pillow's
bilinear filter and turned gray as the reference does (``embodied/envs/atari.py@2411f7d``).
"""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
from PIL import Image

ale_py = pytest.importorskip("ale_py")
gym.register_envs(ale_py)

from sb3_worldmodels.envs.atari import GRAY_WEIGHTS, make_dreamer_atari_env  # noqa: E402

FIRE = 1


def raw_env(game: str = "Pong") -> gym.Env:
    return gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0, full_action_space=True)


def expected_image(frames: list[np.ndarray], size: int, gray: bool) -> np.ndarray:
    """The reference's observation from the raw frames of one step (atari.py:154-167@2411f7d)."""
    image = np.max(np.stack(frames), 0)
    image = np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.BILINEAR))
    if gray:
        image = (image * GRAY_WEIGHTS).sum(-1).astype(np.uint8)[:, :, None]
    return image


@pytest.mark.parametrize("size", [64, 96])
@pytest.mark.parametrize("gray", [True, False])
def test_spaces_shapes_and_dtypes(size, gray):
    env = make_dreamer_atari_env("Pong", size=size, gray=gray, seed=0)
    shape = (size, size, 1 if gray else 3)
    assert env.observation_space == gym.spaces.Box(0, 255, shape, np.uint8)
    assert env.action_space == gym.spaces.Discrete(18)
    obs, info = env.reset(seed=1)
    assert obs.shape == shape and obs.dtype == np.uint8 and env.observation_space.contains(obs)
    assert info["lives"] == 0  # Pong has no lives
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert env.observation_space.contains(obs) and isinstance(reward, float)
    assert (terminated, truncated) == (False, False) and info["episode_frame_number"] == 4


def test_env_checkers_pass():
    from gymnasium.utils.env_checker import check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    check_env(make_dreamer_atari_env("Breakout", size=64, gray=False), skip_render_check=True)
    sb3_check_env(make_dreamer_atari_env("Breakout", size=64))


@pytest.mark.parametrize(("game", "size", "gray", "steps"), [("Pong", 96, True, 80), ("Pong", 64, False, 80)])
def test_one_step_is_four_raw_frames_max_pooled_and_resized(game, size, gray, steps):
    env = make_dreamer_atari_env(game, size=size, gray=gray, sticky=False)
    raw = raw_env(game)
    obs, _ = env.reset(seed=5)
    frame, _ = raw.reset(seed=5)
    np.testing.assert_array_equal(obs, expected_image([frame, frame], size, gray))  # the reset frame
    actions = np.random.default_rng(0).integers(18, size=steps)
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        frames, total = [], 0.0
        for _ in range(4):
            frame, r, *_ = raw.step(int(action))
            frames.append(frame)
            total += float(r)
        np.testing.assert_array_equal(obs, expected_image(frames[-2:], size, gray))
        assert reward == total and not (terminated or truncated)
    assert info["episode_frame_number"] == raw.unwrapped.ale.getEpisodeFrameNumber() == 4 * steps


def test_rewards_are_summed_over_the_repeats():
    env, raw = make_dreamer_atari_env("Pong", size=64, sticky=False), raw_env()
    env.reset(seed=0)
    raw.reset(seed=0)
    rewards, raw_rewards = [], []
    for _ in range(80):  # the computer scores its first point at frame 256
        rewards.append(env.step(0)[1])
        raw_rewards.append(sum(float(raw.step(0)[1]) for _ in range(4)))
    assert rewards == raw_rewards and min(rewards) == -1.0


def first_life_loss_frame(actions: int) -> int:
    raw = raw_env("Breakout")
    raw.reset(seed=0)
    lives, frame = raw.unwrapped.ale.lives(), 0
    while raw.unwrapped.ale.lives() == lives:
        raw.step(actions)
        frame += 1
    return frame


@pytest.mark.parametrize("lives", ["unused", "discount", "reset"])
def test_life_loss_handling(lives):
    lost_at = first_life_loss_frame(FIRE)  # frame 97: the first repeat of agent step 25
    assert lost_at % 4 == 1
    env = make_dreamer_atari_env("Breakout", size=64, sticky=False, lives=lives)
    obs, info = env.reset(seed=0)
    assert info["lives"] == 5
    for _ in range(lost_at // 4):
        obs, _, terminated, truncated, info = env.step(FIRE)
        assert not (terminated or truncated or info["life_loss"])
    previous = obs
    obs, _, terminated, truncated, info = env.step(FIRE)
    assert info["life_loss"] and info["lives"] == 4 and not truncated
    if lives == "unused":  # the repeat runs to its end; the game goes on
        assert not terminated and info["episode_frame_number"] == lost_at + 3
    else:  # the repeat stops at the lost life, before any frame of this step was captured
        assert info["episode_frame_number"] == lost_at
        np.testing.assert_array_equal(obs, previous)
        assert terminated == (lives == "reset")
    if lives == "reset":  # the next episode is a new game
        assert env.reset()[1]["lives"] == 5


def test_length_truncates_in_emulator_frames():
    env = make_dreamer_atari_env("Pong", size=64, length=40, seed=0)
    for step in range(1, 11):
        _, _, terminated, truncated, info = env.step(0)
        assert not terminated and truncated == (step == 10)
    assert info["episode_frame_number"] == 40


def test_noops_and_autostart_at_reset():
    env = make_dreamer_atari_env("Breakout", size=64, sticky=False, noops=30)
    counts = set()
    for seed in range(8):
        env.reset(seed=seed)
        counts.add(env.unwrapped.ale.getEpisodeFrameNumber())  # the NOOPs played
    assert len(counts) > 1 and all(0 <= n <= 30 for n in counts)
    env = make_dreamer_atari_env("Breakout", size=64, sticky=False, autostart=True)
    env.reset(seed=0)
    assert env.unwrapped.ale.getEpisodeFrameNumber() == 2  # FIRE, UP


@pytest.mark.parametrize("sticky", [True, False])
def test_sticky_actions_take_effect(sticky):
    """The setting reaches the ALE before the ROM loads (the reference sets it after, where it is
    ignored): with sticky actions, runs with different seeds but the same actions diverge."""
    rams = []
    for seed in (1, 2):
        env = make_dreamer_atari_env("Pong", size=64, sticky=sticky, seed=seed)
        for action in np.random.default_rng(0).integers(18, size=60):
            env.step(action)
        rams.append(env.unwrapped.ale.getRAM().copy())
    assert np.array_equal(*rams) != sticky


def test_seeded_runs_repeat_and_seeds_differ():
    def run(seed: int) -> tuple[np.ndarray, list[float]]:
        env = make_dreamer_atari_env("Pong", size=64, noops=30, seed=seed)  # sticky actions on
        observations, rewards = [env.reset()[0]], []
        for action in np.random.default_rng(0).integers(18, size=40):
            obs, reward, *_ = env.step(action)
            observations.append(obs)
            rewards.append(reward)
        return np.stack(observations), rewards

    first, again, other = run(3), run(3), run(4)
    np.testing.assert_array_equal(first[0], again[0])
    assert first[1] == again[1]
    assert not np.array_equal(first[0], other[0])


def test_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match="closest: breakout"):
        make_dreamer_atari_env("Breakot")
    with pytest.raises(ValueError, match="Gymnasium env id"):
        make_dreamer_atari_env("ALE/Pong-v5")
    with pytest.raises(ValueError, match="lives"):
        make_dreamer_atari_env("Pong", lives="episodic")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'repeat' argument"):
        make_dreamer_atari_env("Pong", frameskip=4)
    monkeypatch.setitem(sys.modules, "ale_py", None)
    with pytest.raises(ImportError, match=r"pip install ale-py"):
        make_dreamer_atari_env("Pong")


def test_sb3_atari_pipeline_is_taken_as_it_is():
    """SB3's own pipeline (make_atari_env + VecFrameStack: 84 x 84 x 4) goes to DreamerV3 unchanged:
    the frames are padded to 96 x 96 inside the encoder (D18) and predict answers with valid actions."""
    pytest.importorskip("cv2")  # SB3's AtariWrapper resizes with OpenCV
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    from sb3_worldmodels import DreamerV3
    from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as SMOKE

    venv = VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=2, seed=0), n_stack=4)
    obs = venv.reset()
    assert venv.observation_space.shape == (84, 84, 4) and obs.shape == (2, 84, 84, 4)
    model = DreamerV3("CnnPolicy", venv, **SMOKE, cnn_depth=2, seed=0)
    assert model._config.image_shape == (84, 84, 4) and model._config.image_padding == ((6, 6), (6, 6))
    action, _ = model.predict(obs)
    assert action.shape == (2,) and all(venv.action_space.contains(int(a)) for a in action)
    venv.close()


def test_dreamerv3_collects_and_predicts_on_atari():
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_worldmodels import DreamerV3
    from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as SMOKE

    venv = make_vec_env(lambda: make_dreamer_atari_env("Pong", size=16), n_envs=1, seed=0)
    # Collection only (learning_starts): DreamerV3's updates on images are tested in test_dreamerv3_images.
    model = DreamerV3("CnnPolicy", venv, **SMOKE, cnn_depth=2, seed=0, learning_starts=1_000).learn(64)
    assert model.replay_buffer.rows_per_env.sum() >= 64 and model._n_updates == 0
    obs = venv.reset()
    action, _ = model.predict(obs)
    assert action.shape == (1,) and venv.action_space.contains(int(action[0]))

"""TD-MPC2 from pixels through the SB3 surface (the later upstream code's ``obs: rgb``, @eece801):
64 x 64 uint8 images in the replay, the pixel encoder in the update and the planner, the shift
augmentation drawn fresh at every encode, predict/save/load, channel orders, and the refusals.

The encoder's layers against the reference are in test_tdmpc2_pixels.py. The tiny settings keep the
pixel encoder's output (num_channels x 16) equal to the latent width, as the reference requires."""

from __future__ import annotations

import functools

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor

from sb3_worldmodels import TDMPC2
from sb3_worldmodels.blocks.images import SHIFT_PAD, shift_images
from sb3_worldmodels.blocks.optim import get_learning_rate
from sb3_worldmodels.common.training import training_call
from sb3_worldmodels.data.episodes import export_episodes
from sb3_worldmodels.tdmpc2 import agent as core
from sb3_worldmodels.tdmpc2 import networks as N
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS, preset

LENGTH = 20  # agent steps per episode
PIXELS = {**SMOKE_SETTINGS, "latent_dim": 64, "num_channels": 4}  # 4 x 4 x 4 = 64; SimNorm groups of 8
TINY = {**PIXELS, "seed_steps": 50, "seed": 0}
FIELDS = {k: v for k, v in PIXELS.items() if k != "model_size"}  # preset(1, **FIELDS)


class DotEnv(gym.Env):
    """A bright square on a dark 64 x 64 image, its column the state x in [-1, 1]; the action moves it
    (x += 0.2 a), the reward is -|x|. ``size`` and ``vector`` (a Dict {"image", "vector"}) make the
    spaces the agent refuses."""

    metadata: dict = {"render_modes": []}  # noqa: RUF012

    def __init__(self, size: int = 64, vector: bool = False) -> None:
        self.size = size
        image = spaces.Box(0, 255, (size, size, 3), np.uint8)
        vec = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.observation_space = spaces.Dict({"image": image, "vector": vec}) if vector else image
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.vector, self.x = vector, 0.0

    def _obs(self):
        image = np.full((self.size, self.size, 3), 20, np.uint8)
        col = int(round((self.size - 8) * (self.x + 1) / 2))
        image[self.size // 2 - 4 : self.size // 2 + 4, col : col + 8] = (255, 200, 60)
        return {"image": image, "vector": np.array([self.x], np.float32)} if self.vector else image

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-1.0, 1.0))
        return self._obs(), {}

    def step(self, action):
        self.x = float(np.clip(self.x + 0.2 * float(np.asarray(action).reshape(-1)[0]), -1.0, 1.0))
        return self._obs(), -abs(self.x), False, False, {}


def dot_env(**kwargs) -> gym.Env:
    return gym.wrappers.TimeLimit(DotEnv(**kwargs), LENGTH)


@pytest.fixture(scope="module")
def trained():
    # SB3 wraps the channel-last env in VecTransposeImage: the model's space is channel-first.
    model = TDMPC2("CnnPolicy", dot_env(), **TINY)
    init = jax.tree_util.tree_map(np.asarray, model.policy.state["agent"].params)
    model.learn(200)
    return model, init


def test_learns_from_uint8_images_in_the_replay(trained):
    model, init = trained
    cfg = model._config
    assert model.observation_space.shape == (3, 64, 64)  # VecTransposeImage
    assert cfg.image_shape == (64, 64, 3) and cfg.obs_dim == 0 and cfg.latent_dim == 64
    assert set(model.policy.state["agent"].params["encoder"]) == {"2", "4", "6", "8"}  # conv, no MLP
    replay = model.replay_buffer
    assert replay.fields["obs"] == ((64, 64, 3), np.dtype(np.uint8))
    row = 64 * 64 * 3 + 4 + 4 + 4  # uint8 image, action (1,), reward, terminated (float32)
    assert model.replay_bytes_per_seed == replay.nbytes == replay._slots * row
    batch = replay.sample(4)
    assert batch["obs"].dtype == np.uint8 and batch["obs"].shape == (cfg.horizon + 1, 4, 64, 64, 3)
    # stored channel-last as the env renders them: the square's colour on the last axis
    assert {tuple(p) for p in batch["obs"].reshape(-1, 3)} <= {(20, 20, 20), (255, 200, 60)}
    # updates ran (50 at the end of the seed phase, then one per step) and trained the conv encoder:
    # every kernel moved (the last conv's bias only by rounding: it shifts whole SimNorm groups, see
    # PixelEncoder)
    state = model.policy.state["agent"]
    assert int(state.updates) == 50 + (200 - 51)
    for name, conv in state.params["encoder"].items():
        assert all(np.all(np.isfinite(leaf)) for leaf in conv.values())
        assert not np.array_equal(init["encoder"][name]["kernel"], conv["kernel"]), name
    assert replay.num_episodes == 200 // LENGTH - 1  # the last one is stored at the next step


@pytest.mark.filterwarnings("ignore:TDMPC2.predict was called twice")
def test_predict_save_load_and_channel_orders(trained, tmp_path):
    model, _ = trained
    env = DotEnv()
    obs = env.reset(seed=1)[0][None]  # (1, 64, 64, 3) channel-last (one row: evaluate_policy's shapes)
    first = model.predict(obs, deterministic=True)
    chw = np.moveaxis(obs, -1, 1)  # what the VecTransposeImage env gives
    again = model.predict(chw, deterministic=True)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1][0], again[1][0])
    single = model.predict(chw[0], deterministic=True)[0]  # one observation, no batch axis
    np.testing.assert_array_equal(single, first[0][0])
    model.predict(obs, deterministic=False)  # the predict stream moves; the deterministic one does not
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], first[0])
    assert first[0].shape == (1, 1) and np.all(np.abs(first[0]) <= 1.0)

    rollout = model.predict_rollout(chw[0], np.zeros((4, 1), np.float32))
    assert rollout["reward"].shape == (4,) and rollout["latent"].shape == (5, 64)
    assert np.all(np.isfinite(rollout["value"]))

    path = tmp_path / "pixels.zip"
    model.save(path)
    loaded = TDMPC2.load(path)
    assert loaded._config == model._config and loaded.observation_space == model.observation_space
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], first[0])
    out = loaded.predict_rollout(chw[0], np.zeros((4, 1), np.float32))
    np.testing.assert_array_equal(out["latent"], rollout["latent"])

    model.save_replay_buffer(tmp_path / "replay.pkl")
    loaded.load_replay_buffer(tmp_path / "replay.pkl")
    assert loaded.replay_buffer.fields["obs"] == ((64, 64, 3), np.dtype(np.uint8))
    np.testing.assert_array_equal(loaded.replay_buffer._data["obs"], model.replay_buffer._data["obs"])

    mean, _ = evaluate_policy(loaded, Monitor(dot_env()), n_eval_episodes=1, deterministic=True)
    assert -float(LENGTH) <= mean <= 0.0


def test_every_encode_draws_its_own_shift(trained):
    model, _ = trained
    cfg, params = model._config, model.policy.state["agent"].params

    # acting: one offset pair per env, drawn from the env's key, apart from the planner's key
    keys = jax.random.split(jax.random.PRNGKey(3), 16)
    plan_keys, shifts = core.pixel_act_keys(keys)
    _, shifts_other = core.pixel_act_keys(jax.random.split(jax.random.PRNGKey(4), 16))
    assert shifts.shape == (16, 2) and shifts.dtype == jnp.int32
    assert not np.array_equal(np.asarray(plan_keys), np.asarray(keys))
    assert not np.array_equal(np.asarray(shifts), np.asarray(shifts_other))
    s = np.asarray(shifts)
    a = np.flatnonzero(np.any(s != s[0], axis=1))[0]  # an env whose offsets differ from env 0's
    # the same image, encoded unshifted, at offset pad (the identity) and at the two envs' offsets
    image = jnp.asarray(DotEnv().reset(seed=0)[0])[None]  # (1, 64, 64, 3)
    plain = np.asarray(N.encode(cfg, params, image))[0]
    offsets = jnp.asarray(np.stack([[SHIFT_PAD, SHIFT_PAD], s[0], s[a]]))
    z = np.asarray(N.encode(cfg, params, jnp.repeat(image, 3, axis=0), shifts=offsets))
    centred = shift_images(image, jnp.full((1, 2), SHIFT_PAD))
    np.testing.assert_array_equal(np.asarray(centred), np.asarray(image))
    np.testing.assert_allclose(z[0], plain, rtol=1e-6, atol=1e-7)  # (another batch size: rounding)
    assert not np.allclose(z[1], z[2], rtol=1e-6, atol=1e-7)

    # the update: one pair per image of the window, fresh per update key; none for state agents
    noise = core.sample_update_noise(cfg, jax.random.PRNGKey(0), 16)
    other = core.sample_update_noise(cfg, jax.random.PRNGKey(1), 16)
    assert noise.shifts.shape == (cfg.horizon + 1, 16, 2)
    assert int(noise.shifts.min()) >= 0 and int(noise.shifts.max()) <= 2 * SHIFT_PAD
    assert len(np.unique(np.asarray(noise.shifts))) == 2 * SHIFT_PAD + 1
    assert not np.array_equal(np.asarray(noise.shifts), np.asarray(other.shifts))
    state_cfg = preset(1, **{**FIELDS, "latent_dim": 16, "obs_dim": 3})
    state_noise = core.sample_update_noise(state_cfg, jax.random.PRNGKey(0), 16)
    keys5 = jax.random.split(jax.random.PRNGKey(0), 5)  # the state path's draws are unchanged
    assert state_noise.shifts is None
    np.testing.assert_array_equal(np.asarray(state_noise.eps_td), jax.random.normal(keys5[0], (3, 16, 1)))

    # the world-model loss encodes obs[0] (the rollout's start) and obs[1:] (the consistency and TD
    # targets) each shifted by its own draws
    batch = model.replay_buffer.sample(16)
    batch = {
        "obs": jnp.asarray(batch["obs"]),
        "action": jnp.asarray(batch["action"][1:]),
        "reward": jnp.asarray(batch["reward"][1:]),
    }
    wm, target_qs = core._wm_params(params), model.policy.state["agent"].target_qs
    loss = jax.jit(functools.partial(core.world_model_loss, cfg))
    _, tensors = loss(wm, params["pi"], target_qs, batch, noise)
    expected = N.encode(cfg, params, batch["obs"], shifts=noise.shifts)  # (H+1, B, L)
    np.testing.assert_allclose(tensors["zs"][0], expected[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(tensors["next_z"], expected[1:], rtol=1e-6, atol=1e-7)


def test_the_encoder_learns_at_the_scaled_rate(trained):
    # Adam's first step from fresh moments moves each parameter by lr·sign(g) (times its group's rate):
    # the conv encoder's largest move is enc_lr_scale·lr, the dynamics' lr (tdmpc2.py:20-27@eece801).
    model, _ = trained
    cfg = model._config
    state = model.policy.state["agent"]
    fresh = core.with_params(cfg, state, state.params, state.target_qs)
    batch = model.replay_buffer.sample(cfg.batch_size, count=1)
    batch = {
        "obs": jnp.asarray(batch["obs"]),
        "action": jnp.asarray(batch["action"][:, 1:]),
        "reward": jnp.asarray(batch["reward"][:, 1:]),
        "terminated": jnp.asarray(batch["terminated"][:, 1:]),
    }
    new, _ = training_call(core)(cfg, fresh, batch, None)  # the program learn() compiled
    lr = float(get_learning_rate(state.wm_opt))

    def largest_move(name):
        before = jax.tree_util.tree_leaves(state.params[name])
        after = jax.tree_util.tree_leaves(new.params[name])
        return max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(before, after, strict=True)
        )

    # (|g| / (|g| + 1e-8) of the largest gradients is just below 1)
    assert largest_move("encoder") == pytest.approx(cfg.enc_lr_scale * lr, rel=0.02)
    assert largest_move("dynamics") == pytest.approx(lr, rel=0.02)


def test_bad_inputs_are_refused_saying_why(trained):
    model, _ = trained
    with pytest.raises(
        ValueError,
        match=r"num_channels x 4 x 4 = 32 x 16 = 512.*latent_dim=16.*model_size=5.*"
        r"num_channels=latent_dim/16 \(= 1\).*latent_dim=num_channels x 16 \(= 512\)",
    ):
        TDMPC2(dot_env(), **SMOKE_SETTINGS, num_channels=32)
    with pytest.raises(ValueError, match=r"latent_dim=24 is not a multiple of 16.*num_channels x 4 x 4"):
        TDMPC2(dot_env(), **{**SMOKE_SETTINGS, "latent_dim": 24})
    with pytest.raises(
        ValueError, match=r"84 x 84 pixels.*64 x 64.*layers.py:141@eece801.*ResizeObservation"
    ):
        TDMPC2(dot_env(size=84), **TINY)
    with pytest.raises(ValueError, match=r"image \(64, 64, 3\) and 1 vector values.*one observation type"):
        TDMPC2("MultiInputPolicy", dot_env(vector=True), **TINY)
    with pytest.raises(ValueError, match="multi-task agent cannot learn from images"):
        preset(
            1,
            **FIELDS,
            obs_dim=0,
            image_shape=(64, 64, 9),
            task_dim=8,
            action_dims=(1,),
            episode_lengths=(10,),
        )
    with pytest.raises(ValueError, match="neither a vector"):
        preset(1, **FIELDS, obs_dim=0)
    assert preset(5, obs_dim=0, image_shape=[64, 64, 9]).image_shape == (64, 64, 9)  # 32 x 16 = 512
    assert preset(1, obs_dim=0, image_shape=(64, 64, 9), num_channels=8).latent_dim == 128
    # without num_channels, the latent width gives it (docs/deviations.md T20)
    assert preset(1, obs_dim=0, image_shape=(64, 64, 9)).num_channels == 8
    assert preset(19, obs_dim=0, image_shape=(64, 64, 9)).num_channels == 48
    assert preset(1, obs_dim=3).num_channels is None  # state observations have no pixel encoder
    with pytest.raises(ValueError, match="learns from images.*cannot be exported"):
        export_episodes(model, "unused.npz")

"""DreamerV3 from pixels through the SB3 surface: image spaces at the numpy boundary (channel orders,
grayscale, float pixels, mixed Dict observations), uint8 replay storage, predict/save/load, and bad
input. The networks' parity with the reference is in test_dreamerv3_parity_images.py."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_worldmodels import DreamerV3
from sb3_worldmodels.common.boundary import ObservationAdapter, UnsupportedSpaceError
from sb3_worldmodels.dreamerv3 import agent as core
from sb3_worldmodels.dreamerv3 import networks as N
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS, preset
from tests.probe_envs import ColourEnv

TINY = {**SMOKE_SETTINGS, "cnn_depth": 2, "seed": 0}


def core_init(config):
    return core.init_state(config, jax.random.PRNGKey(0))


def colour_vec(n: int = 2, **kwargs):
    return make_vec_env(ColourEnv, n_envs=n, seed=0, env_kwargs=kwargs)


@pytest.mark.parametrize(
    ("layout", "dtype"),
    # A 2-D float Box is a matrix of values (the reference's rank rule); a 2-D uint8 Box a grayscale image.
    [("hwc", np.uint8), ("chw", np.uint8), ("hw", np.uint8), ("hwc", np.float32), ("chw", np.float32)],
)
def test_adapter_gives_channel_last_uint8(layout, dtype):
    env = ColourEnv(layout=layout, dtype=dtype)
    adapter = ObservationAdapter.from_space(env.observation_space, "DreamerV3", allow_images=True)
    channels = 1 if layout == "hw" else 3
    assert adapter.image_shape == (16, 16, channels) and adapter.dim == 0
    batch = np.stack([env.reset(seed=s)[0] for s in range(4)])
    out = adapter.convert(batch)
    assert (
        set(out) == {"image"}
        and out["image"].dtype == np.uint8
        and out["image"].shape == (4, 16, 16, channels)
    )
    expected = batch[..., None] if layout == "hw" else np.moveaxis(batch, 1, -1) if layout == "chw" else batch
    np.testing.assert_array_equal(out["image"], expected.astype(np.uint8))
    if layout == "chw":  # a channel-last image is taken for a channel-first space (SB3's maybe_transpose)
        np.testing.assert_array_equal(adapter.convert(np.moveaxis(batch, 1, -1))["image"], out["image"])


def test_adapter_mixed_dict_and_refusals():
    env = ColourEnv(vector=True)
    adapter = ObservationAdapter.from_space(env.observation_space, "DreamerV3", allow_images=True)
    assert (
        adapter.dim == 2
        and adapter.image_keys == (("image", 3),)
        and adapter.decoder_keys == (("vector", 2),)
    )
    obs = env.reset(seed=0)[0]
    out = adapter.convert({k: v[None] for k, v in obs.items()})
    np.testing.assert_array_equal(out["vector"], [[1.0, 0.0]])
    assert out["image"].shape == (1, 16, 16, 3)

    floats = ObservationAdapter.from_space(
        ColourEnv(dtype=np.float32).observation_space, "x", allow_images=True
    )
    for bad in (300.0, np.nan, -1.0, np.inf):
        image = np.zeros((1, 16, 16, 3), np.float32)
        image[0, 3, 4, 1] = bad
        with pytest.raises(ValueError, match=rf"holds {bad} at \(0, 3, 4, 1\) at step 7.*within \[0, 255\]"):
            floats.convert(image, " at step 7")
    with pytest.raises(ValueError, match=r"shape \(20, 20, 3\).*ResizeObservation"):
        floats.convert(np.zeros((1, 20, 20, 3), np.float32))
    with pytest.raises(UnsupportedSpaceError, match="low=0 and high=255"):
        ObservationAdapter.from_space(spaces.Box(0.0, 1.0, (16, 16, 3), np.float32), "x", allow_images=True)
    two_sizes = spaces.Dict(
        {"a": spaces.Box(0, 255, (16, 16, 3), np.uint8), "b": spaces.Box(0, 255, (8, 8, 3), np.uint8)}
    )
    with pytest.raises(UnsupportedSpaceError, match="share height and width"):
        ObservationAdapter.from_space(two_sizes, "x", allow_images=True)
    with pytest.raises(UnsupportedSpaceError, match="Agent X does not learn from pixels"):
        ObservationAdapter.from_space(env.observation_space, "Agent X")  # an agent without images


def test_config_pads_images_to_the_encoder_grid_and_refuses_what_it_cannot_take():
    config = preset("12m", obs_dim=0, image_shape=(64, 64, 3))
    assert config.cnn_depths == (16, 32, 48, 64, 64) and config.image_grid == (4, 4)
    assert config.image_padding == ((0, 0), (0, 0)) and config.embed_dim == 4 * 4 * 64
    atari = preset("1m", obs_dim=0, image_shape=(84, 84, 4))  # SB3's make_atari_env + VecFrameStack
    assert atari.image_grid == (6, 6) and atari.image_padding == ((6, 6), (6, 6))
    assert preset("1m", obs_dim=0, image_shape=(21, 40, 3)).image_padding == ((5, 6), (4, 4))
    with pytest.raises(ValueError, match="divisible by 8"):
        preset("1m", obs_dim=0, image_shape=(64, 64, 3), cnn_depth=1)
    with pytest.raises(ValueError, match="neither a vector"):
        preset("1m", obs_dim=0)


def test_padded_images_keep_the_grid_and_are_cropped_back():
    """An 84 x 84 stack (SB3's Atari pipeline) runs the reference's layers on the image padded to
    96 x 96 around its centre; the decoder's 96 x 96 output is cropped back to 84 x 84, so every
    decoded pixel is one of the observation's and the loss covers the observation's pixels only."""
    small = {k: v for k, v in SMOKE_SETTINGS.items() if k != "model_size"}
    config = preset("1m", obs_dim=0, image_shape=(84, 84, 4), **small, cnn_depth=2)
    state = core_init(config)
    nets = N.make_networks(config)
    image = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 84, 84, 4)), jnp.uint8)
    embed = nets.enc.apply({"params": state.params["enc"]}, {"image": image})
    assert embed.shape == (2, config.embed_dim) and config.embed_dim == 6 * 6 * config.cnn_depths[-1]
    # The padding is zero after scaling: the encoder of a mid-grey 96 x 96 frame around the image
    # sees exactly what the padded encoder sees.
    framed = jnp.zeros((2, 96, 96, 4), jnp.float32).at[:, 6:90, 6:90].set(image * N.PIXEL_SCALE - 0.5)
    unpadded = dataclasses.replace(nets.enc, padding=((0, 0), (0, 0)))
    grey = (framed + 0.5) / N.PIXEL_SCALE  # back to pixel units: 127.5 in the frame
    np.testing.assert_allclose(
        unpadded.apply({"params": state.params["enc"]}, {"image": grey}), embed, atol=1e-4
    )
    feat = jnp.zeros((2, config.feat_dim), jnp.float32)
    decoded = nets.dec.apply({"params": state.params["dec"]}, feat)["image"]
    assert decoded.shape == (2, 84, 84, 4)


@pytest.fixture(scope="module")
def pixel_model():
    # SB3 wraps the channel-last env in VecTransposeImage: the model sees a channel-first space.
    model = DreamerV3("CnnPolicy", colour_vec(2), **TINY)
    model.learn(48)
    return model


def test_replay_stores_uint8_images(pixel_model):
    model = pixel_model
    assert model.observation_space.shape == (3, 16, 16)  # VecTransposeImage
    replay = model.replay_buffer
    assert "obs" not in replay.fields and replay.fields["image"] == ((16, 16, 3), np.dtype(np.uint8))
    assert replay.bytes_per_row == 16 * 16 * 3 + sum(
        int(np.prod(shape)) * dtype.itemsize
        for name, (shape, dtype) in replay.fields.items()
        if name != "image"
    )
    assert model.replay_bytes_per_seed == replay.nbytes > 0
    rows = replay.read_rows(0, np.arange(3))
    assert rows["image"].dtype == np.uint8
    assert set(np.unique(rows["image"])) <= {0, 255}  # the env's colours, stored exactly


def test_predict_save_load_and_evaluate(pixel_model, tmp_path):
    model = pixel_model
    env = ColourEnv()
    obs = np.stack([env.reset(seed=s)[0] for s in range(3)])  # channel-last, as Gymnasium gives them
    action, state = model.predict(obs, deterministic=True)
    same, _ = model.predict(np.moveaxis(obs, -1, 1), deterministic=True)  # channel-first, as the VecEnv
    np.testing.assert_array_equal(action, same)
    model.save(tmp_path / "pixels.zip")
    loaded = DreamerV3.load(tmp_path / "pixels.zip")
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], action)
    rollout = model.predict_rollout(obs, np.zeros((3, 4), np.int64), state)
    assert "observation" not in rollout and rollout["image"].shape == (3, 4, 16, 16, 3)
    assert np.all((rollout["image"] >= 0) & (rollout["image"] <= 1))
    mean, _ = evaluate_policy(model, colour_vec(1), n_eval_episodes=2)
    assert 0 <= mean <= 10


def test_mixed_dict_observation_learns_and_resumes(tmp_path):
    model = DreamerV3("MultiInputPolicy", colour_vec(2, vector=True), **TINY)
    cfg = model._config
    assert cfg.obs_dim == 2 and cfg.image_shape == (16, 16, 3) and cfg.image_keys == (("image", 3),)
    params = model.policy.state["agent"].params
    assert {"mlp0", "conv0"} <= set(params["enc"]) and {"out_vector", "imgout", "space0"} <= set(
        params["dec"]
    )
    model.learn(32)
    assert set(model.replay_buffer.fields) >= {"obs", "image"}
    model.save(tmp_path / "mixed.zip")
    loaded = DreamerV3.load(tmp_path / "mixed.zip", env=colour_vec(2, vector=True))
    loaded.learn(16, reset_num_timesteps=False)
    assert loaded.num_timesteps >= model.num_timesteps + 16

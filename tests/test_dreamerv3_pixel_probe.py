"""DreamerV3 learns from pixels a little, on a probe with a known answer (tests/probe_envs.ColourEnv)."""

from __future__ import annotations

import numpy as np
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import DreamerV3
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS
from tests.probe_envs import ColourEnv

TINY = {**SMOKE_SETTINGS, "cnn_depth": 2, "seed": 0}


def test_pixel_probe_learns_which_colour_pays():
    """Learned a little from pixels: the image is red or green, action 0 pays on red and 1 on green.
    After 2,500 rows the world model predicts the reward of each (colour, action) pair from the
    image, and the actor picks the paying action for each colour (a random policy earns 5 of 10)."""
    settings = {
        **TINY,
        **dict(units=32, deter=64, hidden=32, classes=8, stoch=8, batch_size=8, batch_length=8),
        **dict(train_ratio=64, learning_rate=1e-3, imag_horizon=5),
    }
    model = DreamerV3("CnnPolicy", make_vec_env(ColourEnv, n_envs=4, seed=0), **settings)
    model.learn(2_500)
    red, green = np.zeros((2, 16, 16, 3), np.uint8)
    red[..., 0], green[..., 1] = 255, 255
    images = np.stack([red, green, red, green])
    reward = model.predict_rollout(images, np.array([[0], [0], [1], [1]]))["reward"][:, 0]
    np.testing.assert_allclose(reward, [1.0, 0.0, 0.0, 1.0], atol=0.2)
    actions, _ = model.predict(images[:2], deterministic=True)
    np.testing.assert_array_equal(actions, [0, 1])
    assert np.mean([e["r"] for e in list(model.ep_info_buffer)[-20:]]) >= 8.0

"""Both agents as drop-in replacements for SB3's off-policy algorithms: SB3's own test envs (which do
not state their episode length), SB3's ``policy_kwargs=dict(net_arch=...)``, and SB3's save/load tests
(tests/test_save_load.py of stable-baselines3) ported to DreamerV3 and TDMPC2."""

from __future__ import annotations

import warnings

import pytest
from stable_baselines3.common.envs import IdentityEnvBox
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE

TINY = {
    DreamerV3: {**DREAMER_SMOKE, "seed": 0},
    TDMPC2: {**TDMPC2_SMOKE, "seed": 0},
}
MODEL_LIST = [DreamerV3, TDMPC2]


def identity_env(ep_length: int = 20) -> DummyVecEnv:
    """SB3's IdentityEnvBox (Box(-10, 10) observations and actions), which states no episode length."""
    return DummyVecEnv([lambda: IdentityEnvBox(-10, 10, ep_length=ep_length)])


def unknown_length_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "does not state it" in str(w.message)]


# ------------------------------------------------------------------ episodes of unknown length
def test_tdmpc2_on_an_env_without_episode_length_takes_sb3_defaults_and_warns_once(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = TDMPC2("MlpPolicy", identity_env(), **TINY[TDMPC2])
    (message,) = unknown_length_warnings(caught)
    assert "episode_length" in message and "0.99" in message and "1000" in message
    assert model.gamma == pytest.approx(0.99) and model.discount == pytest.approx(0.99)
    assert model.seed_steps == 1000 and model._config.discount == pytest.approx(0.99)

    model.save(tmp_path / "model.zip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = TDMPC2.load(tmp_path / "model.zip", env=identity_env())
    assert not unknown_length_warnings(caught)  # resolved once, saved with the model
    assert (loaded.discount, loaded.seed_steps) == (model.discount, 1000)


@pytest.mark.parametrize(
    ("given", "discount", "seed_steps", "named"),
    [
        ({"gamma": 0.9}, 0.9, 1000, "seed_steps (learning_starts) = 1000"),
        ({"learning_starts": 30}, 0.99, 30, "discount (gamma) = 0.99"),
        ({"gamma": 0.9, "learning_starts": 30}, 0.9, 30, None),
        ({"episode_length": 200}, 0.975, 1000, None),  # the reference's rule when the length is known
    ],
)
def test_tdmpc2_without_episode_length_keeps_what_is_given(given, discount, seed_steps, named):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = TDMPC2("MlpPolicy", identity_env(), **TINY[TDMPC2], **given)
    assert model.discount == pytest.approx(discount) and model.seed_steps == seed_steps
    found = unknown_length_warnings(caught)
    if named is None:
        assert not found
    else:
        (message,) = found
        assert f"takes {named}," in message and message.count(") = ") == 1  # that default alone


def test_tdmpc2_learns_on_sb3s_identity_env():
    model = TDMPC2("MlpPolicy", identity_env(ep_length=10), learning_starts=20, **TINY[TDMPC2])
    model.learn(40)
    assert model._n_updates == 20 + 19  # seed_steps updates in a row at step 20, then one per step
    assert model.replay_buffer.num_episodes >= 3

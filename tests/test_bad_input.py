"""A catalogue of bad inputs: each gets a clear error naming the problem, and leaves the model as it was.

Constructor arguments are checked before anything is built; ``predict`` arguments before anything
runs (a refused call changes no state: checked by hashing the whole agent state).
"""

from __future__ import annotations

import hashlib

import gymnasium as gym
import jax
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.common.boundary import UnsupportedSpaceError
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE
from tests.probe_envs import ChainEnv

AGENTS = {
    "dreamerv3": (DreamerV3, {**DREAMER_SMOKE, "seed": 0}),
    "tdmpc2": (TDMPC2, {**TDMPC2_SMOKE, "seed": 0, "seed_steps": 10}),
}


def chain_env(n: int = 1):
    return make_vec_env(lambda: TimeLimit(ChainEnv(), 10), n_envs=n)


def build(agent: str, env=None, **kwargs):
    cls, settings = AGENTS[agent]
    return cls(chain_env() if env is None else env, **{**settings, **kwargs})


def state_hash(model) -> str:
    digest = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(model.policy.state):
        digest.update(np.asarray(leaf).tobytes())
    return digest.hexdigest()


class FlatBoxEnv(ChainEnv):
    """An action dimension with low == high (Gymnasium itself refuses low > high)."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = spaces.Box(np.array([-1.0, 1.0], np.float32), np.array([1.0, 1.0], np.float32))


CONSTRUCTOR_CASES = [
    # (agent, kwargs, error, words the message must contain)
    ("dreamerv3", {"n_envs": 0}, ValueError, "n_envs"),
    ("tdmpc2", {"n_envs": -2}, ValueError, "n_envs"),
    ("dreamerv3", {"n_envs": 2.5}, ValueError, "n_envs"),
    ("dreamerv3", {"action_repeat": 0}, ValueError, "action_repeat"),
    ("tdmpc2", {"action_repeat": -1}, ValueError, "action_repeat"),
    ("dreamerv3", {"units": 0}, ValueError, "units"),
    ("dreamerv3", {"deter": -8}, ValueError, "deter"),
    ("dreamerv3", {"imag_horizon": 0}, ValueError, "imag_horizon"),
    ("dreamerv3", {"batch_size": 0}, ValueError, "batch_size"),
    ("dreamerv3", {"batch_length": 0}, ValueError, "batch_length"),
    ("dreamerv3", {"classes": 2.0}, ValueError, "classes"),
    ("dreamerv3", {"lam": 1.5}, ValueError, "lam"),
    ("dreamerv3", {"unimix": 1.0}, ValueError, "unimix"),
    ("dreamerv3", {"free_nats": -1.0}, ValueError, "free_nats"),
    ("dreamerv3", {"train_ratio": float("nan")}, ValueError, "train_ratio"),
    ("dreamerv3", {"return_horizon": 1.0}, ValueError, "return_horizon"),
    ("dreamerv3", {"minstd": 2.0, "maxstd": 1.0}, ValueError, "maxstd"),
    ("dreamerv3", {"matmul_precision": "fast"}, ValueError, "matmul_precision"),
    ("tdmpc2", {"batch_size": 0}, ValueError, "batch_size"),
    ("tdmpc2", {"horizon": 0}, ValueError, "horizon"),
    ("tdmpc2", {"iterations": 0}, ValueError, "iterations"),
    ("tdmpc2", {"mlp_dim": -1}, ValueError, "mlp_dim"),
    ("tdmpc2", {"num_samples": 0}, ValueError, "num_samples"),
    ("tdmpc2", {"tau": 0.0}, ValueError, "tau"),
    ("tdmpc2", {"rho": 2.0}, ValueError, "rho"),
    ("tdmpc2", {"dropout": 1.0}, ValueError, "dropout"),
    ("tdmpc2", {"discount": 1.0}, ValueError, "discount"),
    ("tdmpc2", {"grad_clip_norm": 0.0}, ValueError, "grad_clip_norm"),
    ("tdmpc2", {"vmin": 10.0, "vmax": -10.0}, ValueError, "vmin"),
    ("tdmpc2", {"num_bins": 1}, ValueError, "num_bins"),
    ("tdmpc2", {"temperature": -0.5}, ValueError, "temperature"),
]


@pytest.mark.parametrize(("agent", "kwargs", "error", "words"), CONSTRUCTOR_CASES)
def test_constructor_refuses_out_of_range_settings(agent, kwargs, error, words):
    with pytest.raises(error, match=words):
        build(agent, **kwargs)


@pytest.mark.parametrize("agent", list(AGENTS))
def test_unknown_names_and_spaces_are_named(agent):
    cls, settings = AGENTS[agent]
    with pytest.raises(ValueError, match="neither a registered Gymnasium env id.*Did you mean 'Pendulum-v1'"):
        cls("Pendulum-v9", **settings)
    with pytest.raises(ValueError, match="MlpPolicy"):
        cls("MlpPolicyy", chain_env(), **settings)
    if not cls.allow_images:
        with pytest.raises(ValueError, match="does not learn from images"):
            cls("CnnPolicy", chain_env(), **settings)
    with pytest.raises(UnsupportedSpaceError, match="low must be below high"):
        cls(make_vec_env(lambda: TimeLimit(FlatBoxEnv(), 10), n_envs=1), **settings)


@pytest.fixture(scope="module", params=list(AGENTS))
def model(request):
    return build(request.param, chain_env(2))


def _predict_cases(model):
    obs = model.env.reset()
    _, state = model.predict(obs, deterministic=True)
    wrong_rows = tuple(np.concatenate([s, s]) for s in state)
    return [
        ("deterministic as a string", dict(deterministic="False"), TypeError, "deterministic must be a bool"),
        ("deterministic as None", dict(deterministic=None), TypeError, "deterministic must be a bool"),
        ("episode_start too short", dict(state=state, episode_start=[True]), ValueError, "episode_start"),
        ("episode_start 2-d", dict(state=state, episode_start=np.ones((2, 2))), ValueError, "episode_start"),
        ("state for other rows", dict(state=wrong_rows), ValueError, "state must be"),
        ("state with an extra entry", dict(state=(*state, state[0])), ValueError, "state must be"),
        ("state not a tuple", dict(state=np.zeros(3)), ValueError, "state must be"),
        ("state of wrong width", dict(state=tuple(s[:, :1] for s in state)), ValueError, "state must be"),
    ], obs


def test_predict_refuses_bad_arguments_and_changes_nothing(model):
    cases, obs = _predict_cases(model)
    before, calls = state_hash(model), model._predict_calls
    for name, kwargs, error, words in cases:
        with pytest.raises(error, match=words):
            model.predict(obs, **kwargs)
        assert state_hash(model) == before and model._predict_calls == calls, name


def test_predict_compiles_once_per_power_of_two(model):
    """New batch sizes reuse the acting step compiled for the next power of two."""
    from sb3_worldmodels.dreamerv3 import agent as dreamer_core
    from sb3_worldmodels.tdmpc2 import agent as tdmpc2_core

    jitted = dreamer_core.policy_step_jit if isinstance(model, DreamerV3) else tdmpc2_core.act_jit
    obs = np.stack([np.asarray(model.env.reset())[0]] * 8)
    model.predict(obs[:5], deterministic=True)
    size = jitted._cache_size()
    for n in (6, 7, 8):
        action, state = model.predict(obs[:n], deterministic=True)
        assert len(action) == n and all(len(s) == n for s in state)
    assert jitted._cache_size() == size
    # Padding does not change the rows asked for (5 and 6 rows run the same 8-row program).
    np.testing.assert_array_equal(
        model.predict(obs[:5], deterministic=True)[0], model.predict(obs[:6], deterministic=True)[0][:5]
    )


def test_a_gymnasium_env_is_accepted_as_is():
    assert DreamerV3(gym.make("Pendulum-v1"), **AGENTS["dreamerv3"][1]).n_envs == 1


def test_a_replay_buffer_with_another_batch_length_is_refused(tmp_path):
    model = build("dreamerv3", learning_starts=1_000)  # rows only: no update to compile
    model.learn(30)
    assert model._n_updates == 0 and model.replay_buffer.size() > 0
    model.save_replay_buffer(tmp_path / "rb.pkl")
    other = build("dreamerv3", batch_length=DREAMER_SMOKE["batch_length"] + 2)
    with pytest.raises(ValueError, match="batch_length"):
        other.load_replay_buffer(tmp_path / "rb.pkl")
    assert other.replay_buffer is None


class EndlessEnv(ChainEnv):
    """An env that never ends an episode."""

    def step(self, action):
        obs, reward, _, _, info = super().step(action)
        return obs, reward, False, False, info


def test_tdmpc2_says_when_episodes_never_end():
    model = build("tdmpc2", make_vec_env(EndlessEnv, n_envs=1), episode_length=10, buffer_size=40)
    with pytest.warns(UserWarning, match="no episode has finished"):
        with pytest.raises(ValueError, match="without ending.*TimeLimit"):
            model.learn(100)
    assert model.replay_buffer.longest_running <= 41


def test_one_discrete_observation_gets_a_0d_array_as_sb3():
    model = DreamerV3("CartPole-v1", **{**DREAMER_SMOKE, "n_envs": 1, "seed": 0})
    action, _ = model.predict(model.env.reset()[0], deterministic=True)
    assert isinstance(action, np.ndarray) and action.shape == () and action.dtype.kind == "i"

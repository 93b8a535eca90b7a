"""SB3's off-policy keywords, parameter API and policy object, as a user swapping algorithms meets them."""

from __future__ import annotations

import hashlib

import jax
import numpy as np
import pytest
import torch as th
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.common.policy import JaxPolicy
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE
from tests.probe_envs import ChainEnv

AGENTS = {
    "dreamerv3": (DreamerV3, {**DREAMER_SMOKE, "seed": 0}),
    "tdmpc2": (TDMPC2, {**TDMPC2_SMOKE, "seed": 0, "seed_steps": 10}),
}


def chain():
    return make_vec_env(lambda: TimeLimit(ChainEnv(), 10), n_envs=1)


def build(agent: str, **kwargs):
    cls, settings = AGENTS[agent]
    return cls(chain(), **{**settings, **kwargs})


def state_hash(model) -> str:
    digest = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(model.policy.state):
        digest.update(np.asarray(leaf).tobytes())
    return digest.hexdigest()


def test_sb3_keywords_with_a_meaning_here_are_accepted():
    dreamer = build("dreamerv3", buffer_size=4_000, gamma=0.99, tau=0.05)
    assert dreamer.buffer_size == 4_000 and dreamer.slow_rate == 0.05
    assert dreamer.gamma == pytest.approx(0.99) and dreamer.return_horizon == pytest.approx(100.0)
    settings = {k: v for k, v in AGENTS["tdmpc2"][1].items() if k != "seed_steps"}
    tdmpc2 = TDMPC2(chain(), learning_starts=123, gamma=0.9, **settings)
    assert tdmpc2.seed_steps == 123 and tdmpc2.gamma == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("agent", "kwargs", "words"),
    [
        ("tdmpc2", {"learning_starts": 10}, "either learning_starts"),  # seed_steps is set too
        ("dreamerv3", {"gamma": 1.0}, "gamma must be"),
        ("dreamerv3", {"train_freq": 4}, "train_freq: it decides when to update itself"),
        ("tdmpc2", {"train_freq": (1, "episode")}, "train_freq"),
        ("tdmpc2", {"gradient_steps": 2}, "gradient_steps"),
        ("tdmpc2", {"ent_coef": "auto"}, "ent_coef: it is SAC's; the agent's entropy bonus is entropy_coef"),
        ("dreamerv3", {"target_update_interval": 100}, "DQN"),
        ("dreamerv3", {"policy_delay": 2}, "TD3"),
        ("tdmpc2", {"policy_kwargs": {"net_arch": [64, 64, 64]}}, "net_arch"),
        (
            "dreamerv3",
            {"replay_buffer_kwargs": {"handle_timeout_termination": False}},
            "replay_buffer_kwargs",
        ),
    ],
)
def test_sb3_keywords_without_a_meaning_are_refused_saying_why(agent, kwargs, words):
    with pytest.raises(ValueError, match=words):
        build(agent, **kwargs)


def test_an_unknown_keyword_suggests_the_closest_name():
    with pytest.raises(TypeError, match="'imag_horizn'.*Did you mean 'imag_horizon'"):
        build("dreamerv3", imag_horizn=10)


@pytest.mark.parametrize("agent", list(AGENTS))
def test_get_parameters_holds_float_tensors_and_round_trips(agent):
    model = build(agent)
    model.learn(40)
    params = model.get_parameters()
    assert list(params) == ["policy"]
    assert all(t.dtype.is_floating_point for t in params["policy"].values())
    other = build(agent, seed=1)
    other.set_parameters(params)
    mine, theirs = model.get_parameters()["policy"], other.get_parameters()["policy"]
    assert all(th.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.parametrize("agent", list(AGENTS))
def test_set_parameters_partial_needs_exact_match_false(agent):
    model, donor = build(agent), build(agent, seed=1)
    part = dict(list(donor.get_parameters()["policy"].items())[:3])
    before = state_hash(model)
    with pytest.raises(RuntimeError, match="missing"):
        model.set_parameters({"policy": part})
    assert state_hash(model) == before
    untouched = {k: v for k, v in model.get_parameters()["policy"].items() if k not in part}
    model.set_parameters({"policy": part}, exact_match=False)
    now = model.get_parameters()["policy"]
    assert all(th.equal(now[k], part[k]) for k in part)
    assert all(th.equal(now[k], untouched[k]) for k in untouched)
    with pytest.raises(RuntimeError, match="shape"):
        model.set_parameters({"policy": {next(iter(part)): th.zeros(7, 3)}}, exact_match=False)


@pytest.mark.parametrize("agent", list(AGENTS))
def test_the_policy_object_predicts_and_saves_alone(agent, tmp_path):
    model = build(agent)
    obs = np.array([[0.0, 1.0], [0.3, 1.0]], np.float32)
    action, state = model.policy.predict(obs, deterministic=True)
    expected, _ = model.predict(obs, deterministic=True)
    np.testing.assert_array_equal(action, expected)
    model.policy.save(tmp_path / "policy.pth")  # written as named, as SB3's policy files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.pth"]  # no temporary file left
    loaded = JaxPolicy.load(tmp_path / "policy.pth")
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], expected)
    assert loaded.state["agent"] is not model.policy.state["agent"]
    with pytest.raises(RuntimeError, match="not attached to a model"):
        JaxPolicy(model.observation_space, model.action_space).save(tmp_path / "alone.pth")

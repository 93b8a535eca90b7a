"""What the SB3 classes hand the pure cores, checked against the reference's own rules.

The parity tests build configs directly; these build the agents the way a user does (an env id, a
dm_control env, a Dict observation) and check what reaches the jitted functions: the episode length
and its discount, the planner's iterations, ``model.gamma``, the decoder's output layers, the matmul
precision, and that ``predict(deterministic=True)`` is a function of its inputs.
"""

from __future__ import annotations

import re

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import TDMPC2, ActionRepeat, DreamerV3, make_dmc_env
from sb3_worldmodels.blocks.jit import agent_jit
from sb3_worldmodels.dreamerv3 import agent as dreamer_core
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
from sb3_worldmodels.dreamerv3.config import preset as dreamer_preset
from sb3_worldmodels.dreamerv3.reference_weights import params_from_reference, path_to_ref, ref_to_path
from sb3_worldmodels.envs.wrappers import agent_steps_per_episode
from sb3_worldmodels.tdmpc2 import agent as tdmpc2_core
from sb3_worldmodels.tdmpc2.agent import act_jit, train_many_jit
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE
from sb3_worldmodels.tdmpc2.config import preset as tdmpc2_preset
from tests.probe_envs import ChainEnv, DictObsEnv

TD_TINY = {**TDMPC2_SMOKE, "seed": 0}
DV3_TINY = {**DREAMER_SMOKE, "n_envs": 1, "seed": 0}


class WideActionEnv(ChainEnv):
    """ChainEnv with a 21-dimensional action (the reference plans 2 more iterations from 20 on)."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = spaces.Box(-1.0, 1.0, (21,), np.float32)


# ------------------------------------------------------------------ episode length (TD-MPC2)


def test_episode_length_is_read_from_dm_control_and_time_limits():
    # shimmy's dm_control envs have no max_episode_steps: dm_control's own step limit (1000) counts.
    import shimmy  # noqa: F401  (registers the dm_control ids)

    assert gym.make("dm_control/walker-walk-v0").spec.max_episode_steps is None
    assert agent_steps_per_episode(make_dmc_env("walker-walk")) == 500  # action repeat 2
    assert agent_steps_per_episode(make_dmc_env("walker-walk", action_repeat=1)) == 1000
    assert agent_steps_per_episode(ActionRepeat(gym.make("Pendulum-v1"), 4)) == 50
    assert agent_steps_per_episode(TimeLimit(ActionRepeat(ChainEnv(), 2), 30)) == 30  # outside: agent steps
    assert agent_steps_per_episode(ChainEnv()) is None


def test_tdmpc2_takes_the_papers_settings_from_a_dm_control_env():
    # The paper's DMC setting: 500 agent steps per episode -> discount 0.99, 2,500 seed steps.
    for model in (
        TDMPC2(make_dmc_env("walker-walk"), **TD_TINY),
        TDMPC2("dm_control/walker-walk-v0", action_repeat=2, **TD_TINY),
    ):
        assert model.discount == pytest.approx(0.99) and model.seed_steps == 2500
        assert model._config.discount == pytest.approx(0.99)
    unrepeated = TDMPC2(make_dmc_env("walker-walk", action_repeat=1), **TD_TINY)
    assert unrepeated.discount == pytest.approx(0.995) and unrepeated.seed_steps == 5000


def test_tdmpc2_takes_sb3_defaults_for_an_env_whose_episode_length_it_cannot_know():
    env = make_vec_env(ChainEnv, n_envs=1)
    with pytest.warns(UserWarning, match="episode_length"):
        unknown = TDMPC2(env, **TD_TINY)
    assert unknown.discount == pytest.approx(0.99) and unknown.seed_steps == 1000
    given = TDMPC2(env, episode_length=200, **TD_TINY)
    assert given.discount == pytest.approx(0.975) and given.seed_steps == 1000
    both = TDMPC2(env, discount=0.9, seed_steps=10, **TD_TINY)
    assert (both.discount, both.seed_steps) == (0.9, 10)


def test_tdmpc2_adds_two_iterations_to_any_count_for_wide_actions():
    wide = make_vec_env(lambda: TimeLimit(WideActionEnv(), 10), n_envs=1)
    narrow = make_vec_env(lambda: TimeLimit(ChainEnv(), 10), n_envs=1)
    settings = {**TD_TINY, "iterations": 3}
    assert TDMPC2(wide, **settings)._config.iterations == 5
    assert TDMPC2(narrow, **settings)._config.iterations == 3
    model = TDMPC2(wide, **{**TD_TINY, "iterations": 6})
    assert model.iterations == 6 and model._config.iterations == 8  # the attribute stays as configured


# ------------------------------------------------------------------ gamma


def test_gamma_is_each_agents_discount_and_survives_save_load(tmp_path):
    td = TDMPC2(make_vec_env(lambda: TimeLimit(ChainEnv(), 200), n_envs=1), **TD_TINY)
    assert td.gamma == pytest.approx(0.975) == td.discount
    dv3 = DreamerV3(make_vec_env(lambda: TimeLimit(ChainEnv(), 20), n_envs=1), **DV3_TINY)
    assert dv3.gamma == pytest.approx(1 - 1 / 333)
    td.save(tmp_path / "td.zip")
    dv3.save(tmp_path / "dv3.zip")
    assert TDMPC2.load(tmp_path / "td.zip").gamma == pytest.approx(0.975)
    assert DreamerV3.load(tmp_path / "dv3.zip").gamma == pytest.approx(1 - 1 / 333)


# ------------------------------------------------------------------ decoder outputs (DreamerV3)


def test_dreamerv3_decodes_each_observation_key_with_its_own_layer():
    model = DreamerV3(make_vec_env(DictObsEnv, n_envs=1), **DV3_TINY)
    dec = model.policy.state["agent"].params["dec"]
    assert model._config.obs_keys == (("height", 1), ("position", 2))  # the Dict space's (sorted) order
    assert dec["out_position"]["kernel"].shape == (16, 2) and dec["out_height"]["kernel"].shape == (16, 1)
    assert "out_vector" not in dec
    flat = DreamerV3(make_vec_env(ChainEnv, n_envs=1), **DV3_TINY).policy.state["agent"].params["dec"]
    assert set(k for k in flat if k.startswith("out_")) == {"out_vector"}
    # Both keys' layers train, each with its own adaptive-clipping norm, and the model acts.
    model.learn(40)
    after = model.policy.state["agent"].params["dec"]
    for key in ("out_position", "out_height"):
        assert not np.array_equal(np.asarray(after[key]["kernel"]), np.asarray(dec[key]["kernel"]))
    obs = {"position": np.zeros((1, 2)), "height": np.zeros((1,))}
    assert model.predict(obs, deterministic=True)[0].shape == (1, 1)


def test_reference_decoder_keys_map_to_our_layers():
    assert ref_to_path("agent/dec/out_image/out/kernel") == ("params", ("dec", "out_vector", "kernel"))
    keyed = ref_to_path("agent/dec/out_orientations/out/bias", keyed_decoder=True)
    assert keyed == ("params", ("dec", "out_orientations", "bias"))
    assert path_to_ref(("dec", "out_orientations", "kernel")) == "agent/dec/out_orientations/out/kernel"
    config = dreamer_preset(
        "1m", **{k: v for k, v in DREAMER_SMOKE.items() if k != "model_size"},
        obs_dim=3, obs_keys=(("position", 2), ("height", 1)),
    )  # fmt: skip
    params, slow = dreamer_core.init_params(config, jax.random.PRNGKey(0))
    flat = {}
    for tree, prefix in ((params, ()), (slow, ("slowcritic",))):
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            names = prefix + tuple(str(k.key) for k in path)
            ref = path_to_ref(names)
            if names[0] in ("rew", "critic", "slowcritic") and names[-2] == "out":
                leaf = np.pad(np.asarray(leaf), [(0, 0)] * (leaf.ndim - 1) + [(0, 1)])  # the 256th logit
            flat[ref] = leaf
    back, _ = params_from_reference(flat, config)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ------------------------------------------------------------------ matmul precision


def _dot_precisions(lowered) -> list[str]:
    text = lowered.as_text()
    ops = re.findall(r"stablehlo\.(?:dot_general|convolution)[^\n]*", text)
    assert ops, "no matmul found in the lowered program"
    return [m.group(1) if (m := re.search(r"precision = \[(\w+)", op)) else "NONE" for op in ops]


def _tdmpc2_lowerings(precision: str):
    settings = {k: v for k, v in TDMPC2_SMOKE.items() if k != "model_size"}
    config = tdmpc2_preset(1, obs_dim=3, action_dim=2, matmul_precision=precision, **settings)
    state = tdmpc2_core.init_state(config, jax.random.PRNGKey(0))
    h, b = config.horizon, config.batch_size
    batch = {
        "obs": jnp.zeros((1, h + 1, b, 3)),
        "action": jnp.zeros((1, h, b, 2)),
        "reward": jnp.zeros((1, h, b)),
        "terminated": jnp.zeros((1, h, b)),
    }
    act = act_jit.lower(
        config,
        state.params,
        jnp.zeros((1, 3)),
        jnp.zeros((1, h, 2)),
        jnp.zeros(1, bool),
        jax.random.PRNGKey(0),
    )
    return [act, train_many_jit.lower(config, state, batch)]


def _dreamerv3_lowerings(precision: str):
    settings = {k: v for k, v in DREAMER_SMOKE.items() if k not in ("model_size", "train_ratio")}
    config = dreamer_preset("1m", obs_dim=3, action_dim=2, matmul_precision=precision, **settings)
    state = dreamer_core.init_state(config, jax.random.PRNGKey(0))
    b, t = config.batch_size, config.batch_length + 1
    batch = {
        "obs": jnp.zeros((1, b, t, 3)),
        "action": jnp.zeros((1, b, t, 2)),
        "reward": jnp.zeros((1, b, t)),
        "is_first": jnp.zeros((1, b, t), bool),
        "is_last": jnp.zeros((1, b, t), bool),
        "is_terminal": jnp.zeros((1, b, t), bool),
        "deter": jnp.zeros((1, b, t, config.deter)),
        "stoch": jnp.zeros((1, b, t, config.stoch), jnp.int32),
    }
    act = dreamer_core.policy_step_jit.lower(
        config,
        dreamer_core.policy_params(state),
        dreamer_core.init_carry(config, 1),
        jnp.zeros((1, 3)),
        jnp.ones(1, bool),
        jax.random.PRNGKey(0),
    )
    return [act, dreamer_core.train_many_jit.lower(config, state, batch)]


@pytest.mark.parametrize("lowerings", [_tdmpc2_lowerings, _dreamerv3_lowerings], ids=["tdmpc2", "dreamerv3"])
def test_every_matmul_is_pinned_to_float32(lowerings):
    """On GPUs JAX's default precision runs float32 matmuls as TF32; the references ran float32
    GEMMs. Every dot of acting and of the update (backward included) must ask for HIGHEST."""
    for lowered in lowerings("float32"):
        precisions = _dot_precisions(lowered)
        assert set(precisions) == {"HIGHEST"}, precisions
    for lowered in lowerings("default"):
        assert "HIGHEST" not in set(_dot_precisions(lowered))


def test_agent_jit_refuses_an_unknown_precision():
    fn = agent_jit(lambda config, x: x @ x)

    class Config:
        matmul_precision = "fast"

    with pytest.raises(ValueError, match="matmul_precision"):
        fn(Config(), jnp.ones((2, 2)))
    with pytest.raises(ValueError, match="matmul_precision"):
        TDMPC2(make_vec_env(lambda: TimeLimit(ChainEnv(), 10), n_envs=1), matmul_precision="tf32", **TD_TINY)


# ------------------------------------------------------------------ predict is a function of its inputs


def _answers(model, obs, state):
    action, _ = model.predict(obs, state=state, episode_start=np.zeros(len(obs), bool), deterministic=True)
    return np.asarray(action)


@pytest.mark.parametrize("agent", ["tdmpc2", "dreamerv3"])
def test_deterministic_predict_depends_only_on_its_inputs(agent, tmp_path):
    env = make_vec_env(lambda: TimeLimit(ChainEnv(), 20), n_envs=2, seed=0)
    if agent == "tdmpc2":
        model = TDMPC2(env, seed_steps=10, **TD_TINY)
    else:
        model = DreamerV3(env, **{**DV3_TINY, "n_envs": None})
    model.learn(30)  # past the seed phase: the planner runs
    obs = model.env.reset()
    _, state = model.predict(obs, deterministic=True)
    first = _answers(model, obs, state)
    for _ in range(3):  # other calls in between, deterministic or not
        model.predict(obs + 0.25, deterministic=False)
        model.predict(obs + 0.5, state=state, episode_start=np.ones(2, bool), deterministic=True)
    np.testing.assert_array_equal(_answers(model, obs, state), first)
    # Each env's action depends on its own row only: the same row alone gives the same action, to the
    # rounding of a program for another batch size (CPU kernels may block rows differently by count).
    single_state = tuple(np.asarray(s)[1:] for s in state)
    np.testing.assert_allclose(_answers(model, obs[1:], single_state), first[1:], rtol=1e-5, atol=1e-7)
    model.save(tmp_path / "model.zip")
    loaded = type(model).load(tmp_path / "model.zip")
    np.testing.assert_array_equal(_answers(loaded, obs, state), first)
    # Sampling still samples: the stochastic stream advances from call to call.
    if agent == "tdmpc2":
        draws = {
            tuple(np.round(model.predict(obs, state=state, deterministic=False)[0].ravel(), 6))
            for _ in range(4)
        }
        assert len(draws) > 1

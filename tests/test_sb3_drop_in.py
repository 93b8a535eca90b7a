"""Both agents as drop-in replacements for SB3's off-policy algorithms: SB3's own test envs (which do
not state their episode length), SB3's ``policy_kwargs=dict(net_arch=...)``, and SB3's save/load tests
(tests/test_save_load.py of stable-baselines3) ported to DreamerV3 and TDMPC2."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from copy import deepcopy

import jax
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.envs import IdentityEnvBox
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.common.policy_file import ACTING_STATE
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
    model = sb3_model(TDMPC2, identity_env(ep_length=10), learning_starts=20)
    model.learn(40)
    assert model._n_updates == 20 + 19  # seed_steps updates in a row at step 20, then one per step
    assert model.replay_buffer.num_episodes >= 3


# ------------------------------------------------------------------ policy_kwargs=dict(net_arch=...)
WIDTH = {DreamerV3: "units", TDMPC2: "mlp_dim"}
SB3_NET_ARCH = {DreamerV3: [16], TDMPC2: [16, 16]}
"""SB3's tests' net_arch ([16]) for each agent (TD-MPC2's MLPs have 2 hidden layers): the size of every
model of this file that learns, so that they share their compiled programs."""


def sized(model_class, **kwargs):
    """A tiny model on the identity env whose MLP width is left to ``kwargs`` (net_arch)."""
    settings = {k: v for k, v in TINY[model_class].items() if k != WIDTH[model_class]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TD-MPC2's unknown episode length
        return model_class("MlpPolicy", identity_env(), learning_starts=10, **{**settings, **kwargs})


@pytest.mark.parametrize(
    ("model_class", "net_arch", "expected"),
    [
        (DreamerV3, [24, 24], {"units": 24, "actor_layers": 2, "critic_layers": 2}),
        (
            DreamerV3,
            {"pi": [24], "vf": [24, 24, 24, 24]},
            {"units": 24, "actor_layers": 1, "critic_layers": 4},
        ),
        (DreamerV3, {"pi": [24, 24], "qf": [24]}, {"units": 24, "actor_layers": 2, "critic_layers": 1}),
        (TDMPC2, [24, 24], {"mlp_dim": 24}),
        (TDMPC2, {"pi": [24, 24], "qf": [24, 24]}, {"mlp_dim": 24}),
        (TDMPC2, {"pi": [24, 24], "qf": [24, 24], "vf": [24, 24]}, {"mlp_dim": 24}),
    ],
)
def test_net_arch_sizes_the_agents_mlps(model_class, net_arch, expected):
    model = sized(model_class, policy_kwargs={"net_arch": net_arch})
    for field, value in expected.items():
        assert getattr(model, field) == value and getattr(model._config, field) == value
    assert model.policy_kwargs == {"net_arch": net_arch}
    params = model.policy.state["agent"].params
    depths = (
        {"pi": 2}
        if model_class is TDMPC2
        else {"actor": expected["actor_layers"], "critic": expected["critic_layers"]}
    )
    for network, depth in depths.items():  # the weight matrices (in, 24) of the hidden layers
        assert hidden_weights(params[network], 24) == depth


def hidden_weights(tree, width: int) -> int:
    """How many 2-d weight matrices of ``tree`` output ``width`` values (the hidden layers)."""
    return sum(np.ndim(leaf) == 2 and np.shape(leaf)[-1] == width for leaf in jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize(
    ("model_class", "policy_kwargs", "words"),
    [
        (TDMPC2, {"net_arch": [24, 24, 24]}, "TD-MPC2's have 2, as the reference's"),
        (DreamerV3, {"net_arch": [400, 300]}, "share one width: give equal widths, e.g. \\[400, 400\\]"),
        (DreamerV3, {"net_arch": {"pi": [32, 32], "qf": [64, 64]}}, "one width \\(units\\) sizes every MLP"),
        (TDMPC2, {"net_arch": {"pi": [32, 32]}}, "leaves out the critic"),
        (DreamerV3, {"net_arch": {"pi": [32], "qf": [32], "vf": [32, 32]}}, "one critic"),
        (DreamerV3, {"net_arch": {"pi": [32], "value": [32]}}, "name no network"),
        (TDMPC2, {"net_arch": []}, "no hidden layer"),
        (TDMPC2, {"net_arch": [64.0, 64.0]}, "positive integer widths"),
        (TDMPC2, {"net_arch": [dict(pi=[64], vf=[64])]}, "a list of hidden widths"),
        (DreamerV3, {"net_arch": [32], "activation_fn": "tanh"}, "only net_arch.*SiLU"),
        (TDMPC2, {"n_critics": 2}, "only net_arch.*\\['n_critics'\\]"),
    ],
)
def test_net_arch_that_cannot_be_mapped_is_refused_with_the_reason(model_class, policy_kwargs, words):
    with pytest.raises(ValueError, match=words):
        sized(model_class, policy_kwargs=policy_kwargs)


@pytest.mark.parametrize("model_class", MODEL_LIST)
def test_net_arch_against_an_explicit_setting(model_class):
    width = WIDTH[model_class]
    with pytest.raises(ValueError, match=f"sets {width}=24, but {width}=32 was given too"):
        sized(model_class, policy_kwargs={"net_arch": [24, 24]}, **{width: 32})
    agreeing = sized(model_class, policy_kwargs={"net_arch": [24, 24]}, **{width: 24})
    assert agreeing._config.__dict__[width] == 24
    if model_class is DreamerV3:
        with pytest.raises(ValueError, match="sets actor_layers=2, but actor_layers=5"):
            sized(model_class, policy_kwargs={"net_arch": [24, 24]}, actor_layers=5)


@pytest.mark.parametrize("model_class", MODEL_LIST)
def test_a_model_built_with_net_arch_round_trips_save_and_load(model_class, tmp_path):
    policy_kwargs = {"net_arch": SB3_NET_ARCH[model_class]}
    model = sized(model_class, policy_kwargs=policy_kwargs)
    model.learn(30)
    observations = np.linspace(-10, 10, 10, dtype=np.float32)[:, None]
    actions, _ = model.predict(observations, deterministic=True)
    model.save(tmp_path / "model.zip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = model_class.load(tmp_path / "model.zip", env=identity_env(), policy_kwargs=policy_kwargs)
    assert loaded._config == model._config and loaded.policy_kwargs == policy_kwargs
    np.testing.assert_array_equal(loaded.predict(observations, deterministic=True)[0], actions)
    with pytest.raises(ValueError, match="do not equal the stored policy kwargs"):
        model_class.load(tmp_path / "model.zip", policy_kwargs={"net_arch": [32, 32]})


# ------------------------------------------------------------------ SB3's tests/test_save_load.py, ported
# Adapted where the agents legitimately differ: TD-MPC2's MLPs have 2 hidden layers (net_arch [16, 16]
# for SB3's [16]); the models compute with JAX, so their torch device is always the CPU; a policy holds
# no torch module (no th.compile); a policy file holds the acting parameters, not the optimiser state.


def sb3_model(model_class, env, **kwargs):
    """``model_class("MlpPolicy", env, policy_kwargs=dict(net_arch=...), **kwargs)`` at a tiny size."""
    settings = {k: v for k, v in TINY[model_class].items() if k != WIDTH[model_class]}
    policy_kwargs = {"net_arch": SB3_NET_ARCH[model_class]}
    return model_class("MlpPolicy", env, policy_kwargs=policy_kwargs, **{**settings, **kwargs})


def sb3_observations(env) -> np.ndarray:
    env.reset()
    return np.concatenate([env.step([env.action_space.sample()])[0] for _ in range(10)], axis=0)


@pytest.mark.filterwarnings("ignore:TD-MPC2 sets its discount")
@pytest.mark.parametrize("model_class", MODEL_LIST)
def test_save_load(tmp_path, model_class):
    env = DummyVecEnv([lambda: IdentityEnvBox(-10, 10)])
    model = sb3_model(model_class, env, learning_rate=1e-3, learning_starts=64, verbose=1)
    model.learn(total_timesteps=128)
    observations = sb3_observations(env)
    original_params = deepcopy(model.get_parameters())

    invalid_object_params = deepcopy(original_params)
    invalid_object_params["I_should_not_be_a_valid_object"] = "and_I_am_an_invalid_tensor"
    with pytest.raises(ValueError):
        model.set_parameters(invalid_object_params, exact_match=True)
    with pytest.raises(ValueError):
        model.set_parameters(invalid_object_params, exact_match=False)
    missing_object_params = dict(list(original_params.items())[:-1])
    with pytest.raises(ValueError):
        model.set_parameters(missing_object_params, exact_match=True)
    missing_state_dict_tensor_params = {
        name: dict(list(params.items())[:-1]) for name, params in original_params.items()
    }
    with pytest.raises(RuntimeError):
        model.set_parameters(missing_state_dict_tensor_params, exact_match=True)

    # th.rand_like needs float tensors: get_parameters holds nothing else.
    random_params = {
        name: OrderedDict((key, th.rand_like(value)) for key, value in list(params.items())[:-1])
        for name, params in original_params.items()
    }
    model.set_parameters(random_params, exact_match=False)
    new_params = model.get_parameters()
    for name in original_params:
        last_key = list(original_params[name])[-1]
        for key in original_params[name]:
            changed = not th.allclose(original_params[name][key], new_params[name][key])
            assert changed == (key != last_key), key
    params = new_params
    selected_actions, _ = model.predict(observations, deterministic=True)
    model.save(tmp_path / "test_save.zip")
    del model

    for device in ["auto", "cpu", "cuda"]:
        model = model_class.load(str(tmp_path / "test_save.zip"), env=env, device=device)
        assert model.device.type == "cpu" and model.policy.device.type == "cpu"
        new_params = model.get_parameters()
        for name in new_params:
            for key in params[name]:
                assert th.allclose(params[name][key], new_params[name][key]), key
        new_selected_actions, _ = model.predict(observations, deterministic=True)
        assert np.allclose(selected_actions, new_selected_actions, 1e-4)
        model.learn(total_timesteps=128)
        del model


@pytest.mark.filterwarnings("ignore:TD-MPC2 sets its discount")
@pytest.mark.parametrize("model_class", MODEL_LIST)
def test_save_load_policy(tmp_path, model_class):
    env = DummyVecEnv([lambda: IdentityEnvBox(-10, 10)])
    model = sb3_model(model_class, env, learning_rate=1e-3, learning_starts=64, verbose=1)
    model.learn(total_timesteps=128)
    observations = sb3_observations(env)
    policy = model.policy
    policy_class = policy.__class__
    params = deepcopy(policy.state_dict())
    random_params = {name: th.rand_like(param) for name, param in params.items()}
    policy.load_state_dict(random_params)
    new_params = policy.state_dict()
    for key in params:
        assert not th.allclose(params[key], new_params[key]), "Parameters did not change as expected."
    params = new_params
    selected_actions, _ = policy.predict(observations, deterministic=True)

    policy.save(tmp_path / "policy.pkl")
    del policy, model
    policy = policy_class.load(tmp_path / "policy.pkl")

    new_params = policy.state_dict()
    acting = [key for key in params if key.startswith(ACTING_STATE)]
    assert acting and len(acting) < len(params)  # the networks, not the optimiser state
    for key in acting:
        assert th.allclose(params[key], new_params[key]), (
            "Policy parameters not the same after save and load."
        )
    new_selected_actions, _ = policy.predict(observations, deterministic=True)
    assert np.allclose(selected_actions, new_selected_actions, 1e-4)


@pytest.mark.filterwarnings("ignore:TD-MPC2 sets its discount")
@pytest.mark.parametrize("model_class", MODEL_LIST)
def test_save_load_replay_buffer(tmp_path, model_class):
    path = tmp_path / "logs/replay_buffer.pkl"
    path.parent.mkdir(exist_ok=True, parents=True)
    model = sb3_model(
        model_class, IdentityEnvBox(-10, 10, ep_length=50), buffer_size=1000, learning_starts=100
    )
    model.learn(150)
    old_arrays, old_meta = model.replay_buffer.export_state()
    model.save_replay_buffer(path)
    model.replay_buffer = None
    model.load_replay_buffer(path)
    arrays, meta = model.replay_buffer.export_state()
    assert sorted(arrays) == sorted(old_arrays)
    assert all(np.array_equal(arrays[name], old_arrays[name]) for name in arrays)
    # SB3's ReplayBuffer.extend has no counterpart (the replay stores sequences the collector writes):
    # the loaded replay is trained on instead.
    updates = model._n_updates
    model.learn(50, reset_num_timesteps=False)
    assert model._n_updates > updates


@pytest.mark.parametrize("model_class", MODEL_LIST)
def test_warn_buffer(recwarn, model_class):
    """SB3's own warnings on repeated learn calls are about optimize_memory_usage, which the agents
    refuse; repeated learn calls on an env of unknown episode length warn about nothing else."""
    warnings.filterwarnings(action="ignore", category=DeprecationWarning)
    # TD-MPC2 given gamma, as SB3's default: it would otherwise warn once that it took it.
    gamma = {"gamma": 0.99} if model_class is TDMPC2 else {}
    model = sb3_model(model_class, IdentityEnvBox(-10, 10), buffer_size=100, learning_starts=10, **gamma)
    model.learn(50)
    model.learn(50, reset_num_timesteps=False)
    assert len(recwarn) == 0, [str(w.message) for w in recwarn]
    model.learn(50)
    assert len(recwarn) == 0, [str(w.message) for w in recwarn]


@pytest.mark.filterwarnings("ignore:TD-MPC2 sets its discount")
@pytest.mark.parametrize("model_class", MODEL_LIST)
def test_continuing_a_loaded_model_warns_when_its_replay_was_not_loaded(tmp_path, model_class):
    env = DummyVecEnv([lambda: IdentityEnvBox(-10, 10, ep_length=20)])
    model = sb3_model(model_class, env, learning_starts=30)
    model.learn(42 if model_class is DreamerV3 else 40)  # two whole episodes (DreamerV3 counts 21 rows each)
    model.save(tmp_path / "model.zip")
    model.save_replay_buffer(tmp_path / "replay.pkl")
    without = model_class.load(tmp_path / "model.zip", env=env)
    with pytest.warns(UserWarning, match="its replay buffer was not loaded.*load_replay_buffer"):
        without.learn(20, reset_num_timesteps=False)
    with_replay = model_class.load(tmp_path / "model.zip", env=env)
    with_replay.load_replay_buffer(tmp_path / "replay.pkl")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with_replay.learn(20, reset_num_timesteps=False)

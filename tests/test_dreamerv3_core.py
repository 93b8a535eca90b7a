"""Fast checks of the pure DreamerV3 core on tiny sizes: shapes, parameter counts, jit stability,
determinism, ``train_many`` vs ``train_step``, carry resets and where each loss sends gradients."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sb3_worldmodels.dreamerv3 import agent as A
from sb3_worldmodels.dreamerv3.config import MODEL_SIZES, DreamerV3Config, preset

TINY = dict(units=16, deter=32, hidden=16, classes=4, stoch=4, blocks=4, imag_horizon=3)
B, T = 2, 4


def tiny_config(discrete: bool = True) -> DreamerV3Config:
    return preset(
        "1m",
        obs_dim=3,
        action_dim=2 if discrete else 1,
        discrete=discrete,
        batch_size=B,
        batch_length=T,
        **TINY,
    )


def make_batch(
    config: DreamerV3Config, seed: int = 0, leading: tuple[int, ...] = ()
) -> dict[str, np.ndarray]:
    """Random (..., B, T+1) replay windows with episode boundaries."""
    rng = np.random.default_rng(seed)
    shape = (*leading, B, T + 1)
    if config.discrete:
        action = np.eye(config.action_dim, dtype=np.float32)[rng.integers(0, config.action_dim, shape)]
    else:
        action = rng.normal(size=(*shape, config.action_dim)).astype(np.float32)
    is_first = rng.random(shape) < 0.2
    is_last = np.zeros(shape, bool)
    is_last[..., :-1] = is_first[..., 1:]
    is_terminal = is_last & (rng.random(shape) < 0.5)
    return {
        "obs": rng.normal(size=(*shape, config.obs_dim)).astype(np.float32),
        "action": action,
        "reward": rng.normal(size=shape).astype(np.float32),
        "is_first": is_first,
        "is_last": is_last,
        "is_terminal": is_terminal,
        "deter": rng.normal(size=(*shape, config.deter)).astype(np.float32),
        "stoch": rng.integers(0, config.classes, (*shape, config.stoch)).astype(np.int32),
    }


def expected_param_count(config: DreamerV3Config) -> int:
    """Optimised parameters counted from the reference's layer shapes (nets.py:16-884@2411f7d,
    agent.py:63-83@2411f7d), independently of flax."""
    U, D, H, S, C, G = config.units, config.deter, config.hidden, config.stoch, config.classes, config.blocks
    O, A_, F = config.obs_dim, config.action_dim, config.feat_dim

    def normed(i: int, o: int) -> int:  # kernel, bias, norm scale
        return i * o + 2 * o

    def out(i: int, o: int) -> int:  # kernel, bias
        return i * o + o

    def mlp(i: int, layers: int) -> int:
        return normed(i, U) + (layers - 1) * normed(U, U)

    enc = mlp(O, config.enc_layers)
    dyn = (
        normed(D, H)
        + normed(S * C, H)
        + normed(A_, H)
        + G * (D // G + 3 * H) * (D // G) + 2 * D  # dyn0: block kernel, bias, norm scale
        + G * (D // G) * (3 * D // G) + 3 * D  # dyncore: block kernel, bias
        + normed(D, H) + (config.img_layers - 1) * normed(H, H) + out(H, S * C)
        + normed(D + U, H) + (config.obs_layers - 1) * normed(H, H) + out(H, S * C)
    )  # fmt: skip
    dec = mlp(F, config.dec_layers) + out(U, O)
    rew = mlp(F, config.rew_layers) + out(U, config.bins)
    con = mlp(F, config.con_layers) + out(U, 1)
    actor = mlp(F, config.actor_layers) + out(U, A_) * (1 if config.discrete else 2)
    critic = mlp(F, config.critic_layers) + out(U, config.bins)
    return enc + dyn + dec + rew + con + actor + critic


@pytest.mark.parametrize("model_size", sorted(MODEL_SIZES))
def test_param_counts(model_size: str) -> None:
    for obs_dim, action_dim, discrete in ((4, 2, True), (3, 1, False)):
        config = preset(model_size, obs_dim=obs_dim, action_dim=action_dim, discrete=discrete)
        assert A.param_count(config) == expected_param_count(config)
    # The reference's "1m" agents (fixture README): 637,511 (CartPole-like) and 637,318 (Pendulum-like)
    # optimised parameters, with reward/critic output layers of 256 units whose last one is dropped;
    # ours have 255, i.e. 2·(U + 1) = 130 fewer.
    if model_size == "1m":
        padding = 2 * (64 + 1)
        assert A.param_count(preset("1m", obs_dim=4, action_dim=2, discrete=True)) == 637_511 - padding
        assert A.param_count(preset("1m", obs_dim=3, action_dim=1, discrete=False)) == 637_318 - padding


@pytest.fixture(scope="module")
def trained() -> dict[str, Any]:
    """A tiny discrete agent, one update done with the jitted train_step."""
    config = tiny_config(True)
    state = A.init_state(config, jax.random.PRNGKey(0))
    batch = make_batch(config)
    new_state, metrics, latents = A.train_step_jit(config, state, batch)
    return {
        "config": config,
        "state": state,
        "batch": batch,
        "new": new_state,
        "metrics": metrics,
        "lat": latents,
    }


def _leaves_meta(tree: Any) -> list[tuple[tuple[int, ...], Any]]:
    return [(np.shape(x), jnp.asarray(x).dtype) for x in jax.tree_util.tree_leaves(tree)]


def test_init_state_structure(trained: dict[str, Any]) -> None:
    state, config = trained["state"], trained["config"]
    assert set(state.params) == set(A.MODULES)
    assert jax.tree_util.tree_structure(state.slow_critic) == jax.tree_util.tree_structure(
        state.params["critic"]
    )
    assert state.key.dtype == jnp.uint32 and state.key.shape == (2,)
    assert state.updates.dtype == jnp.int32 and int(state.updates) == 0
    assert float(state.retnorm.low) == float(state.retnorm.high) == 0.0
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(state.params))
    # Zero-initialised outputs (nets.py:816-884@2411f7d): reward and critic heads predict uniform bins.
    for name in ("rew", "critic"):
        assert not np.any(state.params[name]["out"]["kernel"])
        assert state.params[name]["out"]["kernel"].shape == (config.units, config.bins)
    assert set(A.policy_params(state)) == {"enc", "dyn", "actor"}


def test_train_step_outputs(trained: dict[str, Any]) -> None:
    config, metrics, latents, new = trained["config"], trained["metrics"], trained["lat"], trained["new"]
    assert latents["deter"].shape == (B, T, config.deter) and latents["deter"].dtype == jnp.float32
    assert latents["stoch"].shape == (B, T, config.stoch) and latents["stoch"].dtype == jnp.int32
    for key in ("rec", "rew", "con", "dyn", "rep", "actor", "critic", "repval"):
        assert f"{key}_loss" in metrics
    for key in (
        "loss",
        "grad_norm",
        "update_norm",
        "param_norm",
        "retnorm_scale",
        "return_mean",
        "actor_entropy",
    ):
        assert key in metrics
    terminal = bool(np.any(trained["batch"]["is_terminal"][:, 1:]))
    for key, value in metrics.items():
        assert value.shape == () and value.dtype == jnp.float32, key
        # Split statistics of a class the batch lacks are NaN, as in the reference.
        absent = key in ("constats/neg_loss", "constats/neg_acc") and not terminal
        assert np.isnan(value) if absent else np.isfinite(value), key
    # First update: warmup factor 0, slow critic copies the critic, counter and key advance.
    assert float(metrics["update_norm"]) == 0.0
    assert int(new.updates) == 1
    assert not np.array_equal(new.key, trained["state"].key)
    for a, b in zip(
        jax.tree_util.tree_leaves(new.slow_critic),
        jax.tree_util.tree_leaves(new.params["critic"]),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


def test_state_is_stable_under_jit(trained: dict[str, Any]) -> None:
    """Structure, shapes and dtypes survive updates, so the jitted update is never retraced."""
    config, state, new = trained["config"], trained["state"], trained["new"]
    assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(state)
    assert _leaves_meta(new) == _leaves_meta(state)
    before = A.train_step_jit._cache_size()
    for seed in (1, 2):
        new, _, _ = A.train_step_jit(config, new, make_batch(config, seed))
    assert A.train_step_jit._cache_size() == before
    assert int(new.updates) == 3


def test_deterministic_for_a_fixed_key(trained: dict[str, Any]) -> None:
    config, state, batch = trained["config"], trained["state"], trained["batch"]
    again, metrics, latents = A.train_step_jit(config, state, batch)
    for a, b in zip(jax.tree_util.tree_leaves(again), jax.tree_util.tree_leaves(trained["new"]), strict=True):
        np.testing.assert_array_equal(a, b)
    for key in metrics:
        np.testing.assert_array_equal(metrics[key], trained["metrics"][key])
    other = state._replace(key=jax.random.PRNGKey(1))
    _, other_metrics, _ = A.train_step_jit(config, other, batch)
    assert float(other_metrics["actor_loss"]) != float(metrics["actor_loss"])


def test_train_many_equals_train_steps(trained: dict[str, Any]) -> None:
    config, state = trained["config"], trained["state"]
    batches = make_batch(config, seed=5, leading=(2,))
    many, metrics, latents = A.train_many_jit(config, state, batches)
    single = state
    singles = []
    for k in range(2):
        single, m, lat = A.train_step_jit(config, single, {key: v[k] for key, v in batches.items()})
        singles.append((m, lat))
    assert latents["deter"].shape == (2, B, T, config.deter) and latents["stoch"].shape == (
        2,
        B,
        T,
        config.stoch,
    )
    for a, b in zip(jax.tree_util.tree_leaves(many), jax.tree_util.tree_leaves(single), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for k, (_, lat) in enumerate(singles):
        np.testing.assert_allclose(latents["deter"][k], lat["deter"], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(latents["stoch"][k], lat["stoch"])
    # Metrics of every update, with a leading K (not averaged).
    for key in metrics:
        assert metrics[key].shape == (2,), key
        for k, (m, _) in enumerate(singles):
            np.testing.assert_allclose(metrics[key][k], m[key], rtol=1e-4, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("discrete", [True, False])
def test_policy_step(discrete: bool) -> None:
    config = tiny_config(discrete)
    state = A.init_state(config, jax.random.PRNGKey(0))
    params = A.policy_params(state)
    n = 3
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(n, config.obs_dim)), jnp.float32)
    first = jnp.ones((n,), bool)
    key = jax.random.PRNGKey(7)
    action, carry, deter, stoch = A.policy_step_jit(config, params, A.init_carry(config, n), obs, first, key)
    assert action.shape == (n, config.action_dim) and action.dtype == jnp.float32
    assert deter.shape == (n, config.deter) and deter.dtype == jnp.float32
    assert stoch.shape == (n, config.stoch) and stoch.dtype == jnp.int32
    assert isinstance(carry, A.Carry)
    assert carry.stoch.shape == (n, config.stoch, config.classes)
    np.testing.assert_array_equal(carry.deter, deter)
    np.testing.assert_array_equal(carry.action, action)
    np.testing.assert_array_equal(jnp.argmax(carry.stoch, -1), stoch)
    np.testing.assert_array_equal(carry.stoch.sum(-1), 1.0)
    if discrete:
        np.testing.assert_array_equal(action.sum(-1), 1.0)
    # Same key, same result; is_first resets whatever carry came in.
    busy = A.Carry(carry.deter + 1.0, carry.stoch, carry.action + 0.5)
    again = A.policy_step_jit(config, params, busy, obs, first, key)
    for a, b in zip(again, (action, carry, deter, stoch), strict=True):
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
            np.testing.assert_array_equal(x, y)
    # Without the reset the carry matters.
    cont = A.policy_step_jit(config, params, busy, obs, jnp.zeros((n,), bool), key)
    assert not np.allclose(cont[2], deter)
    # Deterministic mode: the argmax / tanh mean, independent of the key.
    det = A.policy_step_jit(config, params, carry, obs, first, key, deterministic=True)
    det2 = A.policy_step_jit(config, params, carry, obs, first, jax.random.PRNGKey(99), deterministic=True)
    np.testing.assert_array_equal(det[0], det2[0])
    np.testing.assert_array_equal(det[3], det2[3])
    if not discrete:
        assert np.all(np.abs(det[0]) < 1.0)


def test_gradient_paths(trained: dict[str, Any]) -> None:
    """Actor and critic losses reach only their own heads (inputs are stop-gradiented,
    agent.py:267-298,104-109@2411f7d);
    the replay critic loss also trains encoder and RSSM; the world-model losses never touch the actor."""
    config, state, batch = trained["config"], trained["state"], trained["batch"]
    noise = A.sample_update_noise(config, jax.random.PRNGKey(3), B, T)

    def term_means(params: dict) -> jax.Array:
        _, aux = A.loss_fn(config, params, state.slow_critic, state.retnorm, batch, noise)
        losses = aux["internals"]["losses"]
        wm = sum(losses[k].mean() for k in ("rec", "rew", "con", "dyn", "rep"))
        return jnp.stack([losses["actor"].mean(), losses["critic"].mean(), losses["repval"].mean(), wm])

    # Non-zero reward/critic output layers, so that gradients can flow back through them at all.
    params = jax.tree_util.tree_map(lambda x: x, state.params)
    for i, name in enumerate(("rew", "critic")):
        kernel = params[name]["out"]["kernel"]
        params[name]["out"]["kernel"] = 0.01 * jax.random.normal(jax.random.PRNGKey(i), kernel.shape)
    jac = jax.jit(jax.jacrev(term_means))(params)

    def touched(row: int) -> set[str]:
        return {m for m in A.MODULES if any(np.any(x[row]) for x in jax.tree_util.tree_leaves(jac[m]))}

    assert touched(0) == {"actor"}
    assert touched(1) == {"critic"}
    assert touched(2) == {"critic", "enc", "dyn"}
    assert touched(3) == {"enc", "dyn", "dec", "rew", "con"}


def test_init_state_parameters_and_optimizer_state() -> None:
    """init_state assembles init_params of the split-off key and the optimiser's own fresh state."""
    config = tiny_config(False)
    key = jax.random.PRNGKey(4)
    state = A.init_state(config, key)
    params, slow = jax.jit(A.init_params, static_argnums=0)(config, jax.random.split(key)[1])
    leaves = jax.tree_util.tree_leaves
    for a, b in zip(leaves((state.params, state.slow_critic)), leaves((params, slow)), strict=True):
        np.testing.assert_array_equal(a, b)
    fresh = A.make_optimizer(config).init(state.params)
    assert jax.tree_util.tree_structure(state.opt_state) == jax.tree_util.tree_structure(fresh)
    for a, b in zip(leaves(state.opt_state), leaves(fresh), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    # Kernel scales follow fan-in and outscale (nets.py:816-884@2411f7d): std 1/sqrt(fan-in) within
    # sampling error.
    kernel = np.asarray(state.params["dyn"]["dyn0"]["kernel"])
    fan_in = kernel.shape[0] * kernel.shape[1]
    assert abs(kernel.std() * np.sqrt(fan_in) - 1.0) < 0.1
    assert np.abs(kernel).max() <= 2 * 1.1368 / np.sqrt(fan_in) * (1 + 1e-6)
    actor_out = np.asarray(state.params["actor"]["out"]["kernel"])
    assert 0 < np.abs(actor_out).max() <= 2 * 1.1368 * 0.01 / np.sqrt(actor_out.shape[0]) * (1 + 1e-6)


def _perturbed_params(config):
    state = A.init_state(config, jax.random.PRNGKey(5))
    return jax.tree_util.tree_map(  # non-trivial biases, norm scales and output layers
        lambda x: x + 0.1 * jax.random.normal(jax.random.PRNGKey(x.size), x.shape), state.params
    )


def _assert_trees_close(ours, ref, tol=1e-5):
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("discrete", [False, True])
def test_fused_heads_equal_each_network_alone(discrete: bool) -> None:
    """Heads: networks run together (first layers in one matmul) give each network's own output."""
    from sb3_worldmodels.dreamerv3 import networks as N

    config = tiny_config(discrete)
    p = _perturbed_params(config)
    nets = N.make_networks(config)
    feat = jnp.asarray(np.random.default_rng(0).normal(size=(5, config.feat_dim)), jnp.float32)
    names = ("dec", "rew", "con", "critic", "actor")
    together = N.heads(config, {**{k: p[k] for k in names}, "slow": p["critic"]}, feat)
    for name in ("dec", "rew", "con", "critic", "actor", "slow"):
        kind = "critic" if name == "slow" else name
        alone = getattr(nets, kind).apply({"params": p[kind]}, feat)
        _assert_trees_close(together[name], alone)
        _assert_trees_close(N.heads(config, {name: p[kind]}, feat)[name], alone)


def _reference_layout_gru(config, dyn, deter, stoch, action):
    """The block GRU step written as the reference lays it out (nets.py:119-173@2411f7d): dyn0 and
    dyncore as block-diagonal layers on the flat [h_g, u] per block, gates split per block."""
    from flax import linen as nn

    from sb3_worldmodels.blocks.layers import BlockLinear, NormedDense

    g, d = config.blocks, config.deter

    class Step(nn.Module):
        @nn.compact
        def __call__(self, deter, stoch, action):
            action = action / jnp.maximum(1.0, jnp.abs(action))
            u = jnp.concatenate(
                [
                    NormedDense(config.hidden, name="dynin0")(deter),
                    NormedDense(config.hidden, name="dynin1")(stoch.reshape(stoch.shape[0], -1)),
                    NormedDense(config.hidden, name="dynin2")(action),
                ],
                -1,
            )
            u = jnp.broadcast_to(u[:, None, :], (u.shape[0], g, u.shape[-1]))
            x = jnp.concatenate([deter.reshape(-1, g, d // g), u], -1).reshape(deter.shape[0], -1)
            x = BlockLinear(d, g, norm=True, act="silu", name="dyn0")(x)
            x = BlockLinear(3 * d, g, name="dyncore")(x).reshape(-1, g, 3, d // g)
            reset, cand, update = (x[:, :, i].reshape(-1, d) for i in range(3))
            cand = jnp.tanh(jax.nn.sigmoid(reset) * cand)
            update = jax.nn.sigmoid(update - 1.0)
            return update * cand + (1.0 - update) * deter

    layers = ("dynin0", "dynin1", "dynin2", "dyn0", "dyncore")
    return Step().apply({"params": {k: dyn[k] for k in layers}}, deter, stoch, action)


@pytest.mark.parametrize("for_gradient", [False, True])
def test_rssm_block_first_step_equals_the_reference_layout(for_gradient: bool) -> None:
    """RSSM.core (block-first, dyn0's kernel split by prepare, optionally with transposed copies)
    computes the reference's block GRU step, with and without prepared arrays; its gradient too."""
    from sb3_worldmodels.dreamerv3 import networks as N

    config = tiny_config(False)
    dyn = _perturbed_params(config)["dyn"]
    rng = np.random.default_rng(0)
    n = 5
    deter = jnp.asarray(rng.normal(size=(n, config.deter)), jnp.float32)
    stoch = jax.nn.one_hot(rng.integers(0, config.classes, (n, config.stoch)), config.classes)
    action = jnp.asarray(3 * rng.normal(size=(n, config.action_dim)), jnp.float32)

    def ours(dyn, prepared):
        return N.rssm_step(config, dyn, prepared, deter, N.to_blocks(config, deter), stoch, action)

    ref = _reference_layout_gru(config, dyn, deter, stoch, action)
    new, blocks = ours(dyn, N.rssm_prepare(config, dyn, for_gradient))
    _assert_trees_close(new, ref)
    _assert_trees_close(blocks, N.to_blocks(config, ref))
    _assert_trees_close(ours(dyn, None)[0], ref)  # prepared inline when not given

    def loss(fn):
        return lambda p: jnp.sum(jnp.sin(fn(p)))

    grad = jax.grad(loss(lambda p: ours(p, N.rssm_prepare(config, p, for_gradient))[0]))(dyn)
    grad_ref = jax.grad(loss(lambda p: _reference_layout_gru(config, p, deter, stoch, action)))(dyn)
    for name, g in grad_ref.items():
        _assert_trees_close(grad[name], g, tol=1e-4)

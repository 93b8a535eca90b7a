"""Tests of sb3_worldmodels.blocks.layers: initialiser, RMSNorm, dense layers, BlockLinear, SimNorm."""

from __future__ import annotations

import math
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sb3_worldmodels import blocks as B
from sb3_worldmodels.blocks import layers as L
from tests.parity_helpers import load_fixture

FIXTURES = Path(__file__).parent / "fixtures"


def key(seed: int = 0) -> jax.Array:
    """PRNG key; the "rbg" implementation compiles about 3x faster than threefry on CPU."""
    return jax.random.key(seed, impl="rbg")


def shapes(tree: object) -> object:
    return jax.tree_util.tree_map(lambda x: tuple(x.shape), tree)


def param_shapes(module: nn.Module, x: np.ndarray) -> object:
    """Parameter shapes without running (or compiling) the initialiser."""
    return shapes(jax.eval_shape(module.init, key(0), x))


def random_params(module: nn.Module, x: np.ndarray, seed: int = 0) -> dict:
    """Numpy N(0, 1) parameters of the module's shapes, for tests of the forward math."""
    rng = np.random.default_rng(seed)
    abstract = jax.eval_shape(module.init, key(0), x)
    return jax.tree_util.tree_map(lambda a: rng.normal(size=a.shape).astype(np.float32), abstract)


def rms_norm_np(x: np.ndarray, scale: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    return x / np.sqrt(np.mean(np.square(x), -1, keepdims=True) + eps) * scale


def silu_np(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


# --------------------------------------------------------------------------------------------
# Initialiser
# --------------------------------------------------------------------------------------------

# (shape, outscale, fan_in_axes, expected fan-in); drawn together in one compiled call.
INIT_CASES = {
    "dense-0.01": ((256, 512), 0.01, None, 256),
    "block": ((8, 128, 32), 1.0, None, 1024),
    "conv": ((5, 5, 16, 32), 1.0, None, 400),
    "axes": ((64, 100, 50), 0.5, (0,), 64),
}


@jax.jit
def _draw_all(key: jax.Array) -> dict[str, jax.Array]:
    keys = jax.random.split(key, len(INIT_CASES))
    return {
        name: B.trunc_normal_fan_in(outscale, axes)(k, shape, jnp.float32)
        for k, (name, (shape, outscale, axes, _)) in zip(keys, INIT_CASES.items(), strict=True)
    }


def test_trunc_normal_fan_in_statistics() -> None:
    draws = _draw_all(key(0))
    for name, (shape, outscale, _, fan_in) in INIT_CASES.items():
        w = np.asarray(draws[name])
        assert w.shape == shape and w.dtype == np.float32, name
        target = outscale / math.sqrt(fan_in)
        np.testing.assert_allclose(w.std(), target, rtol=0.03, err_msg=name)
        assert abs(w.mean()) < 0.03 * target, name
        bound = 2 * B.TRUNC_NORMAL_STD_CORRECTION * target
        assert np.abs(w).max() <= bound * (1 + 1e-6), name
        assert np.abs(w).max() > 0.95 * bound, name  # truncated at ±2 std of the underlying normal


def test_trunc_normal_zero_outscale_gives_exact_zeros() -> None:
    zeros = B.trunc_normal_fan_in(0.0)(key(0), (64, 256), jnp.float32)
    assert zeros.dtype == jnp.float32 and zeros.shape == (64, 256)
    np.testing.assert_array_equal(zeros, 0.0)
    assert not np.any(np.signbit(np.asarray(zeros)))


def test_init_from_one_draw_cuts_the_kernels_in_order_from_one_draw() -> None:
    """Each fan-in kernel is its own slice of one truncated-normal draw, scaled by its own std; a
    zero-outscale kernel takes no values; outside the helper each kernel draws from its own key."""
    from sb3_worldmodels.blocks.layers import init_from_one_draw

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = B.Dense(5, name="a")(x)
            x = B.Dense(4, outscale=0.0, name="zero")(x)
            return B.Dense(3, outscale=0.5, name="b")(x)

    x, key = jnp.zeros((1, 6)), jax.random.PRNGKey(3)
    params = jax.jit(lambda k: init_from_one_draw(lambda k: Net().init(k, x), k))(key)["params"]
    draw = np.asarray(jax.random.truncated_normal(key, -2.0, 2.0, (6 * 5 + 4 * 3,), jnp.float32))
    std = B.TRUNC_NORMAL_STD_CORRECTION
    np.testing.assert_allclose(params["a"]["kernel"], draw[:30].reshape(6, 5) * std / math.sqrt(6), rtol=1e-6)
    np.testing.assert_array_equal(params["zero"]["kernel"], np.zeros((5, 4)))
    np.testing.assert_allclose(params["b"]["kernel"], draw[30:].reshape(4, 3) * std * 0.5 / 2.0, rtol=1e-6)
    per_kernel = Net().init(key, x)["params"]
    assert not np.allclose(per_kernel["a"]["kernel"], params["a"]["kernel"])


def test_initialiser_agrees_with_reference_initial_parameters() -> None:
    """The reference's own init (fixture) has std outscale/sqrt(fan_in) and the same truncation."""
    ref = load_fixture(FIXTURES / "dreamerv3" / "agent1m_params_init.npz")
    cases = {  # name: (outscale, fan_in)
        "agent/actor/h0/kernel": (1.0, 640),
        "agent/dyn/dyn0/kernel": (1.0, 8 * 256),
        "agent/dyn/dyncore/kernel": (1.0, 8 * 64),
        "agent/dyn/imglogit/kernel": (1.0, 64),
        "agent/dec/out_vector/out/kernel": (0.1, 64),
        "agent/actor/action/out/kernel": (0.01, 64),
    }
    for name, (outscale, fan_in) in cases.items():
        w = ref[name]
        target = outscale / math.sqrt(fan_in)
        rtol = 4 / math.sqrt(w.size)  # a few standard errors of the sample std
        np.testing.assert_allclose(w.std(), target, rtol=rtol, err_msg=name)
        assert np.abs(w).max() <= 2 * B.TRUNC_NORMAL_STD_CORRECTION * target * (1 + 1e-6), name
    for name in ("agent/critic/dist/out/kernel", "agent/rew/dist/out/kernel", "agent/actor/h0/bias"):
        np.testing.assert_array_equal(ref[name], 0.0)
    np.testing.assert_array_equal(ref["agent/actor/h0/norm/scale"], 1.0)


# --------------------------------------------------------------------------------------------
# Norms and activations
# --------------------------------------------------------------------------------------------


def test_rmsnorm_matches_fixture() -> None:
    fx = load_fixture(FIXTURES / "dreamerv3" / "rmsnorm.npz")
    assert float(fx["eps"]) == pytest.approx(1e-4)
    module = B.RMSNorm()
    assert param_shapes(module, fx["x"]) == {"params": {"scale": (8,)}}
    apply = jax.jit(module.apply)
    out = apply({"params": {"scale": np.ones(8, np.float32)}}, fx["x"])
    np.testing.assert_allclose(out, fx["out_scale_ones"], rtol=1e-6, atol=1e-6)
    out = apply({"params": {"scale": fx["scale_random"]}}, fx["x"])
    np.testing.assert_allclose(out, fx["out_scale_random"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out, rms_norm_np(fx["x"], fx["scale_random"]), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[2], 0.0)  # the zero row stays zero thanks to eps


def test_simnorm_matches_fixture_and_sums_to_one() -> None:
    fx = load_fixture(FIXTURES / "tdmpc2" / "math.npz")
    simnorm = jax.jit(B.simnorm, static_argnames="dim")
    for key in ("2d", "512", "3d"):
        x = fx[f"simnorm_{key}_x"]
        out = np.asarray(simnorm(x, dim=8))
        np.testing.assert_allclose(out, fx[f"simnorm_{key}_y"], rtol=1e-5, atol=1e-7)
        groups = out.reshape(*out.shape[:-1], -1, 8).sum(-1)
        np.testing.assert_allclose(groups, 1.0, rtol=1e-6)
    with pytest.raises(ValueError):
        B.simnorm(jnp.zeros((2, 10)), dim=8)


def test_activations() -> None:
    x = np.linspace(-6, 6, 25, dtype=np.float32)
    np.testing.assert_allclose(jax.jit(B.mish)(x), x * np.tanh(np.log1p(np.exp(x))), rtol=1e-5, atol=1e-6)
    wide = np.linspace(-100, 100, 20001)  # closed form in float64, across the guard at 20
    exact = wide * np.tanh(np.log1p(np.exp(wide)))
    np.testing.assert_allclose(B.mish(jnp.asarray(wide, jnp.float32)), exact, rtol=2e-6, atol=1e-30)
    grad = jax.vmap(jax.grad(B.mish))(jnp.asarray(wide, jnp.float32))
    assert np.all(np.isfinite(grad)) and abs(float(grad[-1]) - 1.0) < 1e-6
    np.testing.assert_allclose(jax.jit(B.get_act("silu"))(x), silu_np(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(B.get_act(None)(x), x)
    np.testing.assert_array_equal(B.get_act("none")(x), x)
    with pytest.raises(KeyError):
        B.get_act("swish2")


# --------------------------------------------------------------------------------------------
# Modules: parameter trees, initial values, forward math
# --------------------------------------------------------------------------------------------


class _Hidden(nn.Module):
    """B.hidden_layers in a module of its own."""

    units: int
    layers: int
    prefix: str = "h"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return B.hidden_layers(x, self.units, self.layers, self.prefix)


class _Head(nn.Module):
    """Mirrors a reference head: hidden layers "h0".."h{n-1}", output "out", and a block layer."""

    layers: int = 3

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = _Hidden(16, self.layers, prefix="h", name="mlp")(x)
        out = B.Dense(5, outscale=0.0, name="out")(h)
        block = B.BlockLinear(32, blocks=8, norm=True, act="silu", name="block")(jnp.tile(x, (1, 8)))
        return out, block


def test_param_tree_names_and_initial_values() -> None:
    x = np.ones((2, 8), np.float32)
    hidden = {"bias": (16,), "norm": {"scale": (16,)}}
    assert param_shapes(_Head(), x) == {
        "params": {
            "mlp": {f"h{i}": {"kernel": (8 if i == 0 else 16, 16), **hidden} for i in range(3)},
            "out": {"kernel": (16, 5), "bias": (5,)},
            "block": {"kernel": (8, 8, 4), "bias": (32,), "norm": {"scale": (32,)}},
        }
    }
    # Initial values (one hidden layer keeps the compile small).
    head = _Head(layers=1)
    params = jax.tree_util.tree_map(np.asarray, jax.jit(head.init)(key(0), x)["params"])
    np.testing.assert_array_equal(params["mlp"]["h0"]["bias"], 0.0)
    np.testing.assert_array_equal(params["mlp"]["h0"]["norm"]["scale"], 1.0)
    np.testing.assert_allclose(np.std(params["mlp"]["h0"]["kernel"]), 1 / math.sqrt(8), rtol=0.2)
    np.testing.assert_array_equal(params["out"]["kernel"], 0.0)  # outscale 0
    np.testing.assert_array_equal(params["out"]["bias"], 0.0)
    np.testing.assert_array_equal(params["block"]["norm"]["scale"], 1.0)
    # BlockLinear fan-in is the full input width 64 (std 1/8), not the block width 8 (std 0.35).
    np.testing.assert_allclose(np.std(params["block"]["kernel"]), 1 / 8, rtol=0.2)
    out, _ = jax.jit(head.apply)({"params": params}, x)
    np.testing.assert_array_equal(out, 0.0)
    # Other names and variants.
    assert sorted(param_shapes(_Hidden(4, 2, prefix="mlp"), x)["params"]) == ["mlp0", "mlp1"]
    layer_variant = param_shapes(B.NormedDense(8, act="mish", norm="layer"), x)
    assert layer_variant == {
        "params": {"kernel": (8, 8), "bias": (8,), "norm": {"scale": (8,), "bias": (8,)}}
    }
    assert param_shapes(B.NormedDense(8, norm="none"), x) == {"params": {"kernel": (8, 8), "bias": (8,)}}
    assert param_shapes(B.Dense(3, outscale=0.01), x) == {"params": {"kernel": (8, 3), "bias": (3,)}}


def test_normed_dense_and_mlp_math() -> None:
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    layer = B.NormedDense(8)
    p = random_params(layer, x)["params"]
    h = rms_norm_np(x @ p["kernel"] + p["bias"], p["norm"]["scale"])
    np.testing.assert_allclose(jax.jit(layer.apply)({"params": p}, x), silu_np(h), rtol=1e-5, atol=1e-5)
    mlp = _Hidden(8, 2, prefix="h")
    p = random_params(mlp, x, seed=1)["params"]
    h = x
    for name in ("h0", "h1"):
        h = silu_np(rms_norm_np(h @ p[name]["kernel"] + p[name]["bias"], p[name]["norm"]["scale"]))
    np.testing.assert_allclose(jax.jit(mlp.apply)({"params": p}, x), h, rtol=1e-5, atol=1e-5)
    dense = B.Dense(3)
    p = random_params(dense, x, seed=2)["params"]
    np.testing.assert_allclose(
        jax.jit(dense.apply)({"params": p}, x), x @ p["kernel"] + p["bias"], rtol=1e-5, atol=1e-5
    )


def test_layer_norm_is_pytorchs() -> None:
    """LayerNorm: (x − mean) / sqrt(biased var + 1e-5) · scale + bias, alone and before Mish or SimNorm."""
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32) * 3.0
    p = random_params(B.NormedDense(8, act="none", norm="layer"), x)["params"]
    y = x @ p["kernel"] + p["bias"]
    u = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-5)
    u = u * p["norm"]["scale"] + p["norm"]["bias"]
    for act, expected in (
        ("none", u),
        ("mish", u * np.tanh(np.log1p(np.exp(u)))),
        ("simnorm", B.simnorm(jnp.asarray(u), 2)),
    ):
        layer = B.NormedDense(8, act=act, norm="layer", simnorm_dim=2)
        np.testing.assert_allclose(jax.jit(layer.apply)({"params": p}, x), expected, rtol=1e-5, atol=1e-5)


def test_layer_norm_one_pass_statistics_round_as_the_mean_to_spread_ratio_says() -> None:
    """The mean and variance come from one pass (E[x²] − E[x]²): against float64's two-pass LayerNorm a
    row whose mean is r standard deviations from 0 is within 1e-6·(1 + r²) (3e-4 at r = 30; hidden
    layers' rows sit near r = 0, since LayerNorm is blind to a row's common mode and training never
    grows it); a constant row's variance is 0, never negative."""
    rng = np.random.default_rng(0)
    ones, zeros = jnp.ones(384), jnp.zeros(384)
    for ratio in (0.0, 1.0, 3.0, 10.0, 30.0):
        x = rng.normal(size=(64, 384)) + ratio * rng.choice([-1.0, 1.0], size=(64, 1))
        centred = x - x.mean(-1, keepdims=True)
        want = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + L.LN_EPS)
        got = np.asarray(jax.jit(L.layer_norm)(jnp.asarray(x, jnp.float32), ones, zeros))
        np.testing.assert_allclose(got, want, atol=1e-6 * (1.0 + ratio**2), err_msg=f"mean/std {ratio}")
    flat = np.asarray(jax.jit(L.layer_norm)(jnp.full((3, 384), 7.3, jnp.float32), ones, zeros))
    assert np.isfinite(flat).all() and np.abs(flat).max() < 0.1


def test_layer_norm_mish_backward_equals_autodiff_of_the_plain_formulas():
    """The hand-written backward pass of LayerNorm → Mish against autodiff of x·tanh(softplus(x)) after
    the textbook LayerNorm, on inputs that reach Mish's flat tail and its pass-through above 20."""
    rng = np.random.default_rng(0)
    y = jnp.asarray(rng.normal(size=(6, 5, 16)) * rng.choice([0.01, 1.0, 30.0], size=(6, 5, 1)), jnp.float32)
    scale = jnp.asarray(rng.normal(size=16) * 8.0, jnp.float32)
    bias = jnp.asarray(rng.normal(size=16) * 4.0, jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=y.shape), jnp.float32)

    def plain(y, scale, bias):
        mean = jnp.mean(y, -1, keepdims=True)
        var = jnp.var(y, -1, keepdims=True)
        u = (y - mean) / jnp.sqrt(var + 1e-5) * scale + bias
        return u * jnp.tanh(jax.nn.softplus(u))

    u = np.asarray(L.layer_norm(y, scale, bias))
    assert (u > 20).any() and (u < -8).any()  # both tails are exercised
    out, vjp = jax.vjp(L.layer_norm_mish, y, scale, bias)
    ref_out, ref_vjp = jax.vjp(plain, y, scale, bias)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
    for got, want in zip(vjp(cotangent), ref_vjp(cotangent), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * float(np.abs(want).max()))


# --------------------------------------------------------------------------------------------
# BlockLinear
# --------------------------------------------------------------------------------------------


def _block_diagonal(kernel: np.ndarray) -> np.ndarray:
    g, i, o = kernel.shape
    full = np.zeros((g * i, g * o), kernel.dtype)
    for b in range(g):
        full[b * i : (b + 1) * i, b * o : (b + 1) * o] = kernel[b]
    return full


@pytest.mark.parametrize(("width", "padded"), [(12, 12), (10, 12)])
def test_block_linear_equals_block_diagonal_dense(width: int, padded: int) -> None:
    x = np.random.default_rng(1).normal(size=(2, 3, width)).astype(np.float32)
    layer = B.BlockLinear(8, blocks=4)
    assert param_shapes(layer, x) == {"params": {"kernel": (4, padded // 4, 2), "bias": (8,)}}
    p = random_params(layer, x)["params"]
    apply = jax.jit(layer.apply)
    out = np.asarray(apply({"params": p}, x))
    x_pad = np.concatenate([x, np.zeros((2, 3, padded - width), np.float32)], -1)
    np.testing.assert_allclose(out, x_pad @ _block_diagonal(p["kernel"]) + p["bias"], rtol=1e-5, atol=1e-5)
    # Output block b only depends on input block b.
    x2 = x.copy()
    x2[..., : padded // 4] += 1.0
    out2 = np.asarray(apply({"params": p}, x2))
    np.testing.assert_array_equal(out2[..., 2:], out[..., 2:])
    assert not np.allclose(out2[..., :2], out[..., :2])


def test_block_linear_norm_and_act() -> None:
    x = np.random.default_rng(2).normal(size=(5, 64)).astype(np.float32)
    layer = B.BlockLinear(32, blocks=8, norm=True, act="silu")
    p = random_params(layer, x)["params"]
    h = rms_norm_np(x @ _block_diagonal(p["kernel"]) + p["bias"], p["norm"]["scale"])
    np.testing.assert_allclose(jax.jit(layer.apply)({"params": p}, x), silu_np(h), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        jax.eval_shape(B.BlockLinear(30, blocks=8).init, key(0), x)


def test_pretransposed_matmuls_match_plain_values_and_gradients() -> None:
    """The custom-gradient matmuls give x @ W and the gradients of x @ W, and none to the copy."""
    from sb3_worldmodels.blocks.layers import block_matmul, block_matmul_pretransposed, matmul_pretransposed

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(3, 5, 7)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(7, 4)), jnp.float32)
    probe = jnp.asarray(rng.normal(size=(3, 5, 4)), jnp.float32)

    def plain(x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.sum(jnp.sin(x @ w) * probe)

    def custom(x: jax.Array, w: jax.Array, wt: jax.Array) -> jax.Array:
        return jnp.sum(jnp.sin(matmul_pretransposed(x, w, wt)) * probe)

    np.testing.assert_allclose(matmul_pretransposed(x, w, w.T), x @ w, rtol=1e-6)
    expected = jax.grad(plain, (0, 1))(x, w)
    got = jax.grad(custom, (0, 1, 2))(x, w, w.T)
    for a, b in zip(got[:2], expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[2], 0.0)

    xb = jnp.asarray(rng.normal(size=(2, 5, 7)), jnp.float32)  # (G, M, I)
    wb = jnp.asarray(rng.normal(size=(2, 7, 4)), jnp.float32)  # (G, I, O)
    probe_b = jnp.asarray(rng.normal(size=(2, 5, 4)), jnp.float32)

    def plain_b(x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.sum(jnp.sin(block_matmul(x, w)) * probe_b)

    def custom_b(x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.sum(jnp.sin(block_matmul_pretransposed(x, w, jnp.swapaxes(w, 1, 2))) * probe_b)

    np.testing.assert_allclose(block_matmul(xb, wb), jnp.einsum("gmi,gio->gmo", xb, wb), rtol=1e-5)
    for a, b in zip(jax.grad(custom_b, (0, 1))(xb, wb), jax.grad(plain_b, (0, 1))(xb, wb), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

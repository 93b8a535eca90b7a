"""Tests of sb3_worldmodels.blocks.math, .distributions and .normalizers.

Reference values come from tests/fixtures/{dreamerv3,tdmpc2}/*.npz (recorded from the reference
code on CPU, float32); closed forms are checked alongside.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sb3_worldmodels import blocks as B
from tests.parity_helpers import load_fixture

FIXTURES = Path(__file__).parent / "fixtures"
EPS32 = float(np.finfo(np.float32).eps)


def key(seed: int = 0) -> jax.Array:
    """PRNG key; the "rbg" implementation compiles about 3x faster than threefry on CPU."""
    return jax.random.key(seed, impl="rbg")


def jit_numpy(fn: Callable[..., Any], static_argnames: tuple[str, ...] = ()) -> Callable[..., Any]:
    """jit ``fn`` and return its outputs as numpy arrays.

    One compile per input shape, and no op-by-op work (each op compiled separately) on the results,
    keeps the suite fast on CPU.
    """
    jitted = jax.jit(fn, static_argnames=static_argnames)
    return lambda *args, **kwargs: jax.tree_util.tree_map(np.asarray, jitted(*args, **kwargs))


# The blocks under test, jitted; hyperparameters are static.
_STATIC = {
    "unimix_logits": ("mix",),
    "free_nats": ("free",),
    "normal_head": ("minstd", "maxstd"),
    "imagined_lambda_return": ("lam",),
    "replay_lambda_return": ("gamma", "lam"),
    "symlog_twohot_encode": ("num_bins", "vmin", "vmax"),
    "symlog_twohot_log_prob": ("num_bins", "vmin", "vmax"),
    "symlog_twohot_mean": ("num_bins", "vmin", "vmax"),
    "percentile_norm_update": ("rate", "perclo", "perchi"),
    "percentile_norm_scale": ("limit",),
    "ema_update": ("rate",),
    "running_scale_update": ("tau", "perclo", "perchi"),
}
_JITTED = [
    "symlog",
    "symexp",
    "twohot_encode",
    "twohot_log_prob",
    "twohot_mean",
    "imagination_weight",
    "categorical_kl",
    "categorical_entropy",
    "categorical_log_prob",
    "onehot_mode",
    "normal_log_prob",
    "normal_entropy",
    "bernoulli_log_prob",
    "symlog_mse_log_prob",
    "running_scale_apply",
    *_STATIC,
]
J = SimpleNamespace(**{name: jit_numpy(getattr(B, name), _STATIC.get(name, ())) for name in _JITTED})


def softmax(x: np.ndarray) -> np.ndarray:
    """Float64 softmax over the last axis (test-side reference)."""
    z = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def f32(x: object) -> np.ndarray:
    return np.asarray(x, np.float32)


def dv3(name: str) -> dict[str, np.ndarray]:
    return load_fixture(FIXTURES / "dreamerv3" / f"{name}.npz")


def tdm() -> dict[str, np.ndarray]:
    return load_fixture(FIXTURES / "tdmpc2" / "math.npz")


# --------------------------------------------------------------------------------------------
# symlog / symexp
# --------------------------------------------------------------------------------------------


def test_symlog_symexp_match_dreamerv3_fixture() -> None:
    f = dv3("symlog")
    np.testing.assert_allclose(J.symlog(f["x"]), f["symlog_x"], rtol=1e-6, atol=0)
    np.testing.assert_allclose(J.symexp(J.symlog(f["x"])), f["symexp_symlog_x"], rtol=1e-6, atol=0)
    np.testing.assert_allclose(J.symexp(f["y"]), f["symexp_y"], rtol=1e-6, atol=0)  # ±89 → ±inf


def test_symlog_symexp_match_tdmpc2_fixture() -> None:
    # TD-MPC2 computes log(1 + |x|) and exp(|x|) − 1; ours use log1p/expm1, which differ only by
    # the rounding of 1 + |x| (at most half an ulp of 1, 6e-8) for small |x|.
    f = tdm()
    np.testing.assert_allclose(J.symlog(f["symlog_x"]), f["symlog_y"], rtol=1e-6, atol=6e-8)
    np.testing.assert_allclose(J.symexp(f["symexp_x"]), f["symexp_y"], rtol=1e-6, atol=6e-8)
    np.testing.assert_allclose(
        J.symexp(J.symlog(f["symexp_symlog_roundtrip_x"])), f["symexp_symlog_roundtrip_y"], rtol=1e-6
    )


def test_symlog_symexp_are_inverse_and_odd() -> None:
    x = np.concatenate([-np.logspace(-6, 8, 50), [0.0], np.logspace(-6, 8, 50)]).astype(np.float32)
    np.testing.assert_allclose(J.symexp(J.symlog(x)), x, rtol=2e-6)
    y = np.linspace(-30, 30, 101, dtype=np.float32)
    np.testing.assert_allclose(J.symlog(J.symexp(y)), y, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(J.symlog(-x), -J.symlog(x))
    assert float(J.symlog(0.0)) == 0.0
    np.testing.assert_allclose(J.symlog(np.float32(np.e - 1)), 1.0, rtol=1e-7)


# --------------------------------------------------------------------------------------------
# DreamerV3 symexp two-hot
# --------------------------------------------------------------------------------------------


def test_symexp_bins_structure() -> None:
    bins = B.symexp_bins(255)
    assert bins.shape == (255,) and bins.dtype == np.float32
    assert bins[127] == 0.0
    np.testing.assert_array_equal(bins, -bins[::-1])  # exactly antisymmetric
    assert np.all(np.diff(bins) > 0)
    np.testing.assert_allclose(bins[-1], 4.851652e8, rtol=1e-6)
    np.testing.assert_allclose(bins[128:131], [0.17055772, 0.37020537, 0.6039045], rtol=1e-6)
    # Built in float64 and rounded once: each bin is the correctly rounded symexp of its grid point.
    grid = np.linspace(-20.0, 20.0, 255)
    np.testing.assert_array_equal(bins, (np.sign(grid) * np.expm1(np.abs(grid))).astype(np.float32))
    small = B.symexp_bins(5)
    np.testing.assert_allclose(
        small, [-np.expm1(20), -np.expm1(10), 0, np.expm1(10), np.expm1(20)], rtol=1e-7
    )
    for bad in (1, 8):
        with pytest.raises(ValueError):
            B.symexp_bins(bad)


def test_symexp_bins_close_to_reference_bins() -> None:
    # The reference's float32 jnp.linspace + expm1 rounds some grid points differently (≤ 18 ulp,
    # 1.2e-6 relative); documented in docs/deviations.md.
    ref = dv3("twohot")["bins"]
    ours = B.symexp_bins(255)
    np.testing.assert_allclose(ours, ref, rtol=1.5e-6, atol=0)
    assert ours[127] == ref[127] == 0.0 and ours[-1] == ref[-1]


def test_twohot_encode_matches_fixture_exactly() -> None:
    f = dv3("twohot")
    np.testing.assert_array_equal(J.twohot_encode(f["targets"], f["bins"]), f["target_vectors"])


def test_twohot_encode_then_mean_is_clipped_value() -> None:
    bins = B.symexp_bins(255)
    x = np.array([0.0, 1e-6, -0.3, 1.0, -3.7, 123.456, 1e4, -2.5e7, 4.9e8, -1e12], np.float32)
    target = np.asarray(J.twohot_encode(x, bins))
    np.testing.assert_allclose(target.sum(-1), 1.0, rtol=1e-6)
    assert np.all((target > 0).sum(-1) <= 2)
    decoded = target.astype(np.float64) @ bins.astype(np.float64)
    np.testing.assert_allclose(decoded, np.clip(x, bins[0], bins[-1]), rtol=1e-6, atol=1e-6)
    # Exact bins get a single 1.
    np.testing.assert_array_equal(
        J.twohot_encode(bins[[0, 100, 127, 254]], bins), np.eye(255)[[0, 100, 127, 254]]
    )


def test_twohot_log_prob_matches_fixture() -> None:
    f = dv3("twohot")
    np.testing.assert_allclose(
        J.twohot_log_prob(f["logits_random"], f["targets"], f["bins"]),
        f["log_prob_random"],
        rtol=1e-6,
        atol=1e-6,
    )
    zeros = np.zeros_like(f["logits_random"])
    np.testing.assert_allclose(
        J.twohot_log_prob(zeros, f["targets"], f["bins"]), f["log_prob_zero_logits"], rtol=1e-6
    )
    np.testing.assert_allclose(f["log_prob_zero_logits"], -np.log(255.0), rtol=1e-6)


def test_twohot_log_prob_gradients_equal_autodiff_of_the_dense_form() -> None:
    """The CPU form's hand-written backward (weights at two bins − total weight · softmax) against
    autodiff of Σ twohot(x)·log_softmax(logits), for logits and the targets (whose gradient reaches
    them through the two weights), with targets on a bin, between bins and beyond both ends."""
    f = dv3("twohot")
    bins = jnp.asarray(f["bins"])
    logits = 3.0 * jax.random.normal(key(3), (6, 4, 255))
    x = 40.0 * jax.random.normal(key(4), (6, 4))
    x = x.at[0, 0].set(bins[100]).at[0, 1].set(1e12).at[0, 2].set(-1e12).at[0, 3].set(bins[127] + 1e-3)
    cotangent = jax.random.normal(key(5), (6, 4))

    def dense(lg: jax.Array, t: jax.Array) -> jax.Array:
        target = B.twohot_encode(t, bins)
        return jnp.sum(cotangent * jnp.sum(target * jax.nn.log_softmax(lg, -1), -1))

    def ours(lg: jax.Array, t: jax.Array) -> jax.Array:
        return jnp.sum(cotangent * B.twohot_log_prob(lg, t, bins))

    with B.backend.gather_free_forms(False):
        got = jax.jit(jax.value_and_grad(ours, (0, 1)))(logits, x)
    want = jax.jit(jax.value_and_grad(dense, (0, 1)))(logits, x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(got[1][0], want[1][0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[1][1], want[1][1], rtol=1e-5, atol=1e-9)


def test_twohot_mean_is_exactly_zero_for_uniform_probabilities() -> None:
    for bins in (B.symexp_bins(255), dv3("twohot")["bins"], np.array([-3e8, -1.0, 1.0, 3e8], np.float32)):
        logits = np.zeros((3, bins.shape[0]), np.float32)
        logits[1] = 7.5
        np.testing.assert_array_equal(J.twohot_mean(logits, bins), 0.0)
    # Even bin counts pair the halves; a non-uniform row is the plain expectation.
    np.testing.assert_allclose(
        J.twohot_mean(
            np.log(np.array([0.1, 0.2, 0.3, 0.4], np.float32)), np.array([-3, -1, 1, 3], np.float32)
        ),
        1.0,
        rtol=1e-6,
    )


def test_twohot_mean_matches_reference_up_to_documented_jit_difference() -> None:
    f = dv3("twohot")
    logits, bins = f["mean_logits"], f["bins"]
    probs = softmax(logits.astype(np.float64))
    # Float32 error scale of the sum Σ p_i·b_i.
    scale = probs @ np.abs(bins.astype(np.float64))
    jitted = np.asarray(J.twohot_mean(logits, bins))
    exact = probs @ bins.astype(np.float64)
    # Closer to the exact expectation of the float32 probabilities than float32 rounding allows
    # for the terms, and within that of the reference's eager (op-by-op) result.
    assert np.all(np.abs(jitted - exact) <= 2 * EPS32 * scale)
    assert np.all(np.abs(jitted - f["mean_symmetric"]) <= 4 * EPS32 * scale)
    # Row 0 has zero logits: the reference gives 0 eagerly and −0.1644754 under jit (FMA), ours 0.
    assert jitted[0] == 0.0 and f["mean_symmetric"][0] == 0.0
    assert f["mean_symmetric_jit"][0] == np.float32(-0.1644754)
    assert jitted[0] - f["mean_symmetric_jit"][0] == np.float32(0.1644754)
    rest = slice(1, None)
    assert np.all(np.abs(jitted[rest] - f["mean_symmetric_jit"][rest]) <= 4 * EPS32 * scale[rest])
    # One-hot-like logits land on their bin.
    np.testing.assert_allclose(jitted[5:], f["mean_symmetric"][5:], rtol=1e-6, atol=1e-6)


def test_twohot_mean_gradient_is_finite() -> None:
    bins = B.symexp_bins(255)
    grad = np.asarray(jax.jit(jax.grad(lambda lg: B.twohot_mean(lg, bins)))(np.zeros(255, np.float32)))
    # d mean / d logit_j = p_j·(b_j − mean) = b_j/255 at zero logits, up to float32 error.
    np.testing.assert_allclose(grad, bins / 255.0, rtol=1e-5, atol=EPS32 * bins[-1] / 255)


# --------------------------------------------------------------------------------------------
# TD-MPC2 two-hot in symlog space
# --------------------------------------------------------------------------------------------


def test_symlog_twohot_bins_match_fixture() -> None:
    np.testing.assert_allclose(B.symlog_twohot_bins(101, -10.0, 10.0), tdm()["dreg_bins"], rtol=0, atol=1e-6)


def test_symlog_twohot_encode_matches_fixture() -> None:
    f = tdm()
    out = np.asarray(J.symlog_twohot_encode(f["two_hot_x"][:, 0], 101, -10.0, 10.0))
    np.testing.assert_allclose(out, f["two_hot_y"], rtol=0, atol=2e-5)
    np.testing.assert_allclose(out.sum(-1), 1.0, rtol=1e-6)
    centres = B.symlog_twohot_bins(101, -10.0, 10.0)
    np.testing.assert_allclose(out @ centres, f["two_hot_symlog_clamped"][:, 0], rtol=1e-5, atol=1e-5)


def test_symlog_twohot_log_prob_and_mean_match_fixture() -> None:
    f = tdm()
    lp = J.symlog_twohot_log_prob(f["soft_ce_logits"], f["soft_ce_target"][:, 0], 101, -10.0, 10.0)
    np.testing.assert_allclose(-np.asarray(lp), f["soft_ce_y"][:, 0], rtol=1e-5, atol=1e-5)
    mean = J.symlog_twohot_mean(f["two_hot_inv_logits"], 101, -10.0, 10.0)
    np.testing.assert_allclose(mean, f["two_hot_inv_y"][:, 0], rtol=1e-5, atol=1e-6)
    with np.errstate(divide="ignore"):
        logits = np.log(np.asarray(J.symlog_twohot_encode(f["two_hot_x"][:, 0], 101, -10.0, 10.0)))
    roundtrip = np.asarray(J.symlog_twohot_mean(logits, 101, -10.0, 10.0))
    np.testing.assert_allclose(roundtrip, f["two_hot_inv_roundtrip_y"][:, 0], rtol=1e-4, atol=1e-5)
    # Closed form: decode(encode(x)) = symexp(clip(symlog(x), −10, 10)).
    expected = np.sign(f["two_hot_x"][:, 0]) * np.expm1(
        np.clip(np.log1p(np.abs(f["two_hot_x"][:, 0])), 0, 10)
    )
    np.testing.assert_allclose(roundtrip, expected, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------------
# λ-returns
# --------------------------------------------------------------------------------------------


def _loop_lambda_return(rew: np.ndarray, disc: np.ndarray, val: np.ndarray, lam: np.ndarray) -> np.ndarray:
    lam = np.broadcast_to(lam, val.shape)
    out = np.zeros((val.shape[0], val.shape[1] - 1))
    ret = val[:, -1].astype(np.float64)
    for t in reversed(range(val.shape[1] - 1)):
        ret = rew[:, t + 1] + disc[:, t + 1] * ((1 - lam[:, t + 1]) * val[:, t + 1] + lam[:, t + 1] * ret)
        out[:, t] = ret
    return out


def test_imagined_lambda_return_matches_fixture() -> None:
    f = dv3("lambda_return")
    assert f["imag_discount"] == 1.0
    ret = J.imagined_lambda_return(f["imag_rew"], f["imag_con"], f["imag_tarval"], 0.95)
    assert ret.shape == (3, 15)
    np.testing.assert_allclose(ret, f["imag_ret"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(J.imagination_weight(f["imag_con"]), f["imag_weight"], rtol=1e-6)
    np.testing.assert_allclose(J.imagination_weight(f["imag_con"]), np.cumprod(f["imag_con"], 1), rtol=1e-6)


def test_lambda_return_closed_forms() -> None:
    rng = np.random.default_rng(0)
    n, h = 4, 6
    rew = rng.normal(size=(n, h + 1)).astype(np.float32)
    con = rng.uniform(0.5, 1.0, size=(n, h + 1)).astype(np.float32)
    val = rng.normal(size=(n, h + 1)).astype(np.float32)
    # λ = 1: discounted Monte-Carlo sum of rewards plus the discounted bootstrap v_H.
    mc = np.zeros((n, h))
    for k in range(h):
        disc = np.ones(n)
        for j in range(k + 1, h + 1):
            mc[:, k] += disc * rew[:, j]
            disc = disc * con[:, j]
        mc[:, k] += disc * val[:, h]
    np.testing.assert_allclose(J.imagined_lambda_return(rew, con, val, 1.0), mc, rtol=1e-5, atol=1e-5)
    # λ = 0: one-step TD targets.
    td = rew[:, 1:] + con[:, 1:] * val[:, 1:]
    np.testing.assert_allclose(J.imagined_lambda_return(rew, con, val, 0.0), td, rtol=1e-6, atol=1e-6)
    # General λ: the recursion written as a Python loop.
    loop = _loop_lambda_return(rew, con, val, np.float32(0.95))
    np.testing.assert_allclose(J.imagined_lambda_return(rew, con, val, 0.95), loop, rtol=1e-5, atol=1e-5)


def test_replay_lambda_return_matches_fixture_and_loop() -> None:
    f = dv3("lambda_return")
    gamma = 1 - 1 / 333
    args = (f["replay_reward"], f["replay_is_terminal"], f["replay_is_last"], f["replay_boot"])
    ret = np.asarray(J.replay_lambda_return(*args, gamma, 0.95))
    assert ret.shape == (2, 7)
    np.testing.assert_allclose(ret, f["replay_ret"], rtol=1e-5, atol=1e-6)
    live = (1 - f["replay_is_terminal"]) * gamma
    lam = 0.95 * (1 - f["replay_is_last"])
    np.testing.assert_allclose(
        ret, _loop_lambda_return(f["replay_reward"], live, f["replay_boot"], lam), rtol=1e-5
    )
    # Row 0 terminates at t = 3, so G_2 = r_3 exactly (live_3 = 0).
    assert f["replay_is_terminal"][0, 3]
    np.testing.assert_allclose(ret[0, 2], f["replay_reward"][0, 3], rtol=1e-6)
    # Row 1 is truncated at t = 5: G_4 bootstraps fully from b_5 (λ'_5 = 0).
    assert f["replay_is_last"][1, 5] and not f["replay_is_terminal"][1, 5]
    np.testing.assert_allclose(
        ret[1, 4], f["replay_reward"][1, 5] + gamma * f["replay_boot"][1, 5], rtol=1e-6
    )


# --------------------------------------------------------------------------------------------
# Distributions
# --------------------------------------------------------------------------------------------


@jit_numpy
def _rssm_terms(raw_post: jax.Array, raw_prior: jax.Array) -> dict[str, jax.Array]:
    post = B.unimix_logits(raw_post, 0.01)
    prior = B.unimix_logits(raw_prior, 0.01)
    kl = B.categorical_kl(post, prior).sum(-1)  # sum over the S = 32 latents
    return {
        "post": post,
        "prior": prior,
        "kl": kl,
        "free": B.free_nats(kl, 1.0),
        "entropy": B.categorical_entropy(post).sum(-1),
    }


@pytest.mark.parametrize("classes", [4, 16])
def test_unimix_kl_entropy_match_fixture(classes: int) -> None:
    f = dv3("unimix_kl")
    c = f"C{classes}_"
    out = _rssm_terms(f[c + "raw_post_logits"], f[c + "raw_prior_logits"])
    np.testing.assert_allclose(out["post"], f[c + "post_logits_unimix"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["prior"], f[c + "prior_logits_unimix"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(softmax(out["post"]), f[c + "post_probs_unimix"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out["kl"], f[c + "kl_post_prior"], rtol=1e-6, atol=1e-6)
    assert out["kl"][0, 0] == 0.0  # post == prior in row [0, 0]
    np.testing.assert_allclose(out["free"], f[c + "dyn_loss_free1"], rtol=1e-6)
    np.testing.assert_allclose(out["free"], f[c + "rep_loss_free1"], rtol=1e-6)
    assert out["free"][0, 0] == 1.0
    np.testing.assert_allclose(out["entropy"], f[c + "post_entropy"], rtol=1e-6, atol=1e-5)


@jit_numpy
def _categorical_closed_forms(logits: jax.Array, other: jax.Array) -> dict[str, jax.Array]:
    return {
        "kl_self": B.categorical_kl(logits, logits),
        "kl_other": B.categorical_kl(logits, other),
        "entropy_uniform": B.categorical_entropy(jnp.zeros(7)),
        "mix_all": B.unimix_logits(logits, 1.0),
        "mix_none": B.unimix_logits(logits, 0.0),
        "mix_peak": B.unimix_logits(jnp.array([100.0, 0.0, 0.0, 0.0]), 0.01),
    }


def test_categorical_closed_forms() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 7)).astype(np.float32) * 3
    out = _categorical_closed_forms(logits, rng.normal(size=(5, 7)).astype(np.float32))
    np.testing.assert_allclose(out["kl_self"], 0.0, atol=1e-6)
    assert np.all(out["kl_other"] > 0)
    np.testing.assert_allclose(out["entropy_uniform"], np.log(7), rtol=1e-6)
    np.testing.assert_allclose(out["mix_all"], np.full((5, 7), -np.log(7)), rtol=1e-6)
    np.testing.assert_allclose(out["mix_none"], np.log(softmax(logits)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.exp(out["mix_peak"]), [0.9925, 0.0025, 0.0025, 0.0025], rtol=1e-5)


@jit_numpy
def _discrete_head(pre_logits: jax.Array, actions: jax.Array) -> dict[str, jax.Array]:
    logits = B.unimix_logits(pre_logits, 0.01)
    return {
        "logits": logits,
        "log_prob": B.categorical_log_prob(logits, actions),
        "entropy": B.categorical_entropy(logits),
        "maxent": B.categorical_entropy(jnp.zeros(pre_logits.shape[-1])),
    }


@pytest.mark.parametrize("classes", [2, 5])
def test_discrete_actor_head_matches_fixture(classes: int) -> None:
    f = dv3("actor_heads")
    c = f"disc{classes}_"
    out = _discrete_head(f[c + "pre_logits"], f[c + "actions_onehot"])
    np.testing.assert_allclose(out["logits"], f[c + "logits_unimix"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(softmax(out["logits"]), f[c + "probs"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out["log_prob"], f[c + "log_prob"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["entropy"], f[c + "entropy"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["maxent"], f[c + "maxent"], rtol=1e-6)


def test_onehot_mode() -> None:
    np.testing.assert_array_equal(J.onehot_mode(f32([[0.0, 3.0, 1.0]])), [[0.0, 1.0, 0.0]])


@jit_numpy
def _normal_head(pre_out: jax.Array, pre_std: jax.Array, actions: jax.Array) -> dict[str, jax.Array]:
    mean, std = B.normal_head(pre_out, pre_std, 0.1, 1.0)
    return {
        "mean": mean,
        "std": std,
        "log_prob": B.normal_log_prob(mean, std, actions),
        "entropy": B.normal_entropy(std),
        "minent": B.normal_entropy(jnp.full(3, 0.1)),
        "maxent": B.normal_entropy(jnp.ones(3)),
    }


def test_normal_head_matches_fixture() -> None:
    f = dv3("actor_heads")
    out = _normal_head(f["cont_pre_out"], f["cont_pre_std"], f["cont_actions"])
    np.testing.assert_allclose(out["mean"], f["cont_mean"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out["std"], f["cont_std"], rtol=1e-6, atol=1e-7)
    assert np.all(out["std"] >= 0.1) and np.all(out["std"] <= 1.0)
    np.testing.assert_allclose(out["log_prob"], f["cont_log_prob"], rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(out["entropy"], f["cont_entropy"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["minent"], f["cont_minent"], rtol=1e-6)
    np.testing.assert_allclose(out["maxent"], f["cont_maxent"], rtol=1e-6)
    # At zero pre-activations: mean 0, std 0.9·σ(2) + 0.1 ≈ 0.893.
    np.testing.assert_allclose(f["cont_std"][0], 0.9 / (1 + np.exp(-2.0)) + 0.1, rtol=1e-6)


def test_normal_closed_forms() -> None:
    mean = f32([0.3, -0.2])
    std = f32([0.5, 2.0])
    at_mean = -np.sum(np.log([0.5, 2.0]) + 0.5 * np.log(2 * np.pi))
    np.testing.assert_allclose(J.normal_log_prob(mean, std, mean), at_mean, rtol=1e-6)


def test_bernoulli_and_symlog_mse_match_fixture() -> None:
    f = dv3("symlog_mse_and_binary")
    np.testing.assert_allclose(
        J.bernoulli_log_prob(f["cont_logits"], f["cont_labels"]), f["cont_log_prob"], rtol=1e-6
    )
    np.testing.assert_allclose(
        1 / (1 + np.exp(-f["cont_logits"].astype(np.float64))), f["cont_mean"], rtol=1e-6
    )
    np.testing.assert_allclose(
        J.symlog_mse_log_prob(f["mse_out"], f["mse_target"]), f["mse_log_prob"], rtol=1e-6
    )
    np.testing.assert_allclose(J.symexp(f["mse_out"]), f["mse_mean"], rtol=1e-6)


def test_bernoulli_and_symlog_mse_closed_forms() -> None:
    lp = np.asarray(J.bernoulli_log_prob(f32([100.0, 100.0, -100.0]), f32([1.0, 0.0, 0.5])))
    assert np.all(np.isfinite(lp))
    np.testing.assert_allclose(lp, [0.0, -100.0, -50.0], atol=1e-6)
    np.testing.assert_allclose(J.bernoulli_log_prob(0.0, 0.3), np.log(0.5), rtol=1e-6)
    # Squared errors below 1e-8 count as zero; larger ones are summed.
    tiny = J.symlog_mse_log_prob(f32([[1e-5, -5e-5], [2e-4, 0.0]]), np.zeros((2, 2), np.float32))
    assert tiny[0] == 0.0
    np.testing.assert_allclose(tiny[1], -4e-8, rtol=1e-5)
    pred = f32([[1e-5, 0.0, 2.0]])
    np.testing.assert_allclose(J.symlog_mse_log_prob(pred, np.zeros((1, 3), np.float32)), [-4.0], rtol=1e-6)
    np.testing.assert_allclose(
        J.symlog_mse_log_prob(f32([0.0, 1e-3]), np.zeros(2, np.float32)), -1e-6, rtol=1e-4
    )


# --------------------------------------------------------------------------------------------
# Normalisers
# --------------------------------------------------------------------------------------------


def test_percentile_norm_matches_fixture() -> None:
    f = dv3("moments_perc")
    state = B.percentile_norm_init()
    for i in range(5):
        state = J.percentile_norm_update(state, f["batches"][i], 0.01, 5.0, 95.0)
        offset, scale = J.percentile_norm_scale(state, 1.0)
        np.testing.assert_allclose(state.low, f["low"][i], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(state.high, f["high"][i], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(offset, f["offset"][i], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(scale, f["scale"][i], rtol=1e-6)


def test_percentile_norm_scale_floor_and_ema() -> None:
    state = B.percentile_norm_init()
    assert float(state.low) == 0.0 and float(state.high) == 0.0
    assert float(J.percentile_norm_scale(state, 1.0)[1]) == 1.0
    x = np.linspace(0.0, 100.0, 101, dtype=np.float32)  # P5 = 5, P95 = 95
    state = J.percentile_norm_update(state, x, 0.5)
    np.testing.assert_allclose([state.low, state.high], [2.5, 47.5], rtol=1e-6)
    offset, scale = J.percentile_norm_scale(state, 1.0)
    assert float(offset) == float(state.low)
    np.testing.assert_allclose(scale, 45.0, rtol=1e-6)
    assert float(J.percentile_norm_scale(state, 100.0)[1]) == 100.0


def test_ema_update_matches_slow_critic_fixture() -> None:
    f = dv3("slow_critic")
    slow = {"w": f["slow_init_w"], "b": f["slow_init_b"]}
    for i in range(3):
        src = {"w": f[f"call{i}_src_w"], "b": f[f"call{i}_src_b"]}
        # The recorded counter is read after the call: the copy happens when it was 0 before.
        slow = J.ema_update(slow, src, 0.02, np.asarray(f[f"call{i}_updates_counter"] - 1 == 0))
        for k in ("w", "b"):
            np.testing.assert_allclose(slow[k], f[f"call{i}_slow_{k}"], rtol=1e-6, atol=1e-8)
        if i == 0:  # the first call is an exact copy
            np.testing.assert_array_equal(slow["w"], src["w"])
    mixed = J.ema_update({"a": np.zeros(2, np.float32)}, {"a": np.ones(2, np.float32)}, 0.25, False)
    np.testing.assert_allclose(mixed["a"], 0.25, rtol=1e-7)


def test_running_scale_matches_fixture() -> None:
    f = tdm()
    for name in ("b256", "b8"):
        state = B.running_scale_init()
        assert float(state.value) == 1.0
        for i in range(5):
            x = f[f"scale_{name}_batches"][i]
            state = J.running_scale_update(state, x, 0.01)
            np.testing.assert_allclose(state.value, f[f"scale_{name}_value"][i, 0], rtol=1e-6)
            np.testing.assert_allclose(
                J.running_scale_apply(state, x), f[f"scale_{name}_scaled"][i], rtol=1e-6
            )
            np.testing.assert_allclose(
                np.percentile(x[:, 0], [5, 95]), f[f"scale_{name}_percentiles"][i, :, 0], rtol=1e-5, atol=1e-5
            )


def test_running_scale_floor() -> None:
    state = B.running_scale_init()
    for _ in range(3):
        state = J.running_scale_update(state, np.zeros((16, 1), np.float32), 0.5)  # spread 0 → clamped to 1
    assert float(state.value) == 1.0
    state = J.running_scale_update(
        state, np.linspace(0.0, 100.0, 101, dtype=np.float32)[:, None], 0.5
    )  # spread 90
    np.testing.assert_allclose(state.value, 1.0 + 0.5 * (90.0 - 1.0), rtol=1e-6)


def test_balance_stats_closed_form() -> None:
    """Loss and accuracy per class on a hand-counted example; an absent class gives NaN."""
    mean = np.array([0.9, 0.2, 0.7, 0.4], np.float32)
    loss = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    target = np.array([1.0, 1.0, 0.0, 0.0], np.float32)
    stats = {k: float(v) for k, v in B.distributions.balance_stats(mean, loss, target, 0.5).items()}
    assert stats == pytest.approx(
        {
            "pos_loss": 1.5,
            "neg_loss": 3.5,
            "pos_acc": 0.5,
            "neg_acc": 0.5,
            "rate": 0.5,
            "avg": 0.5,
            "pred": 0.55,
        }
    )
    only_pos = B.distributions.balance_stats(mean[:2], loss[:2], target[:2], 0.5)
    assert np.isnan(only_pos["neg_loss"]) and np.isnan(only_pos["neg_acc"])
    assert float(only_pos["pos_loss"]) == pytest.approx(1.5)


def test_split_statistics_aggregate_over_updates_that_have_the_class() -> None:
    from sb3_worldmodels.common.training import aggregate_metric as _aggregate

    values = np.array([1.0, np.nan, 3.0])
    assert _aggregate("constats/neg_loss", values) == 2.0
    assert np.isnan(_aggregate("constats/neg_loss", np.array([np.nan, np.nan])))
    assert np.isnan(_aggregate("con_loss", values))  # a NaN loss is never hidden

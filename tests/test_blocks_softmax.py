"""The short-axis softmax forms (blocks.softmax) against jax.nn's: values, gradients, ties, shapes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sb3_worldmodels.blocks import distributions as D
from sb3_worldmodels.blocks import softmax as SM
from sb3_worldmodels.blocks.layers import simnorm


def _logits(shape: tuple[int, ...], seed: int = 0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape) * 3.0, jnp.float32)


def test_short_axes_take_the_unrolled_forms_on_cpu_only_up_to_the_limit() -> None:
    assert jax.default_backend() == "cpu"
    assert SM.small_axis(2) and SM.small_axis(SM.SMALL_AXIS) and not SM.small_axis(SM.SMALL_AXIS + 1)
    text = jax.jit(SM.softmax).lower(_logits((64, 32, 4))).as_text()
    assert "reduce" not in text  # the point of the forms: no reduction op over the short axis
    assert "reduce" in jax.jit(SM.softmax).lower(_logits((64, 255))).as_text()


@pytest.mark.parametrize("classes", [2, 4, 8, 16, 17])
def test_values_and_gradients_equal_jax_nn(classes: int) -> None:
    x = _logits((5, 7, classes))
    weights = _logits((5, 7, classes), seed=1)
    for ours, theirs in ((SM.softmax, jax.nn.softmax), (SM.log_softmax, jax.nn.log_softmax)):
        np.testing.assert_allclose(ours(x), theirs(x, axis=-1), rtol=1e-6, atol=1e-6)
        got = jax.grad(lambda x, f=ours: jnp.sum(jnp.sin(f(x)) * weights))(x)
        want = jax.grad(lambda x, f=theirs: jnp.sum(jnp.sin(f(x, axis=-1)) * weights))(x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(SM.sum_last(x), x.sum(-1), rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(SM.max_last(x, keepdims=True), x.max(-1, keepdims=True))
    got = jax.grad(lambda x: jnp.sum(SM.sum_last(x) ** 2))(x)
    np.testing.assert_allclose(got, jax.grad(lambda x: jnp.sum(x.sum(-1) ** 2))(x), rtol=1e-6, atol=1e-5)


def test_the_callers_keep_their_values_under_jit_and_vmap() -> None:
    x, y = _logits((3, 6, 4)), _logits((3, 6, 4), seed=2)
    probs = jax.nn.softmax(x, -1)
    np.testing.assert_allclose(D.unimix_logits(x, 0.01), jnp.log(0.99 * probs + 0.0025), rtol=1e-6, atol=1e-6)
    logq, logp = jax.nn.log_softmax(x, -1), jax.nn.log_softmax(y, -1)
    kl = jnp.sum(jnp.exp(logq) * (logq - logp), -1)
    np.testing.assert_allclose(jax.jit(jax.vmap(D.categorical_kl))(x, y), kl, rtol=1e-5, atol=1e-6)
    entropy = -jnp.sum(jnp.exp(logq) * logq, -1)
    np.testing.assert_allclose(D.categorical_entropy(x), entropy, rtol=1e-5, atol=1e-6)
    z = _logits((4, 64))
    groups = jax.nn.softmax(z.reshape(4, 8, 8), -1).reshape(4, 64)
    np.testing.assert_allclose(jax.jit(simnorm)(z), groups, rtol=1e-6, atol=1e-7)

"""The hashed Bernoulli masks used for dropout: the mixer against its integer definition, and the
statistics a dropout mask needs (rate, independence of neighbours and of keys)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sb3_worldmodels.blocks.random import hash_bernoulli, mix32


def _mix32_python(x: int) -> int:
    m = 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & m
    x ^= x >> 15
    x = (x * 0x846CA68B) & m
    return x ^ (x >> 16)


def test_mix32_matches_its_integer_definition_and_is_a_bijection():
    rng = np.random.default_rng(0)
    xs = rng.integers(0, 2**32, size=1000, dtype=np.uint64).astype(np.uint32)
    got = np.asarray(mix32(jnp.asarray(xs)))
    np.testing.assert_array_equal(got, [_mix32_python(int(x)) for x in xs])
    dense = np.asarray(mix32(jnp.arange(2**20, dtype=jnp.uint32)))
    assert np.unique(dense).size == 2**20


def test_rate_and_independence_of_masks():
    p, shape = 0.01, (2, 256, 384)
    masks = np.stack([np.asarray(hash_bernoulli(jax.random.PRNGKey(s), p, shape)) for s in range(20)])
    n = masks[0].size
    rates = masks.reshape(20, -1).mean(1)
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(rates.mean() - p) < 5 * sigma / np.sqrt(20)
    assert np.all(np.abs(rates - p) < 5 * sigma)
    # Neighbours along every axis and masks of successive keys agree as often as independent flips.
    flat = masks.reshape(20, -1).astype(float)
    joint = (flat[:, :-1] * flat[:, 1:]).mean()
    rows = (masks[:, :, :-1].astype(float) * masks[:, :, 1:]).mean()
    keys = (flat[:-1] * flat[1:]).mean()
    for value in (joint, rows, keys):
        assert abs(value - p * p) < 6 * np.sqrt(p * p / (19 * n))


def test_same_key_same_mask_and_the_edges():
    key = jax.random.PRNGKey(3)
    a = hash_bernoulli(key, 0.3, (7, 5))
    np.testing.assert_array_equal(a, hash_bernoulli(key, 0.3, (7, 5)))
    assert not np.array_equal(a, hash_bernoulli(jax.random.PRNGKey(4), 0.3, (7, 5)))
    assert not np.asarray(hash_bernoulli(key, 0.0, (100,))).any()
    assert np.asarray(hash_bernoulli(key, 1.0, (100,))).all()
    with pytest.raises(ValueError, match="outside"):
        hash_bernoulli(key, 1.5, (3,))

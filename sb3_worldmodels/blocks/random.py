"""Randomness helpers: cheap dropout masks, cheap uniform/Gumbel/normal noise, and keys derived from data.

``jax.random.bernoulli`` runs Threefry-2x32 (20 rounds) per pair of elements; XLA's CPU code for it
takes about 18 ns per element on this project's 2-core machine, which made TD-MPC2's Q dropout (a
few million draws per update and per plan) 13-16% of its update's time. Dropout masks need
independent coin flips, not a cryptographic stream: :func:`hash_bernoulli` hashes each element's
index with two rounds of a 32-bit integer mixer ("lowbias32", seeded by two words drawn from the
key's Threefry stream), about 30 times cheaper. Masks of different keys are independent for all
practical purposes (tested: rate, neighbours, cross-key agreement).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry_2x32

from sb3_worldmodels.blocks.backend import gather_free

Array = jax.Array


def mix32(x: Array) -> Array:
    """lowbias32 (Wellons): a bijective 32-bit mixer with low avalanche bias; uint32 → uint32."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def hash_bernoulli(key: Array, p: float, shape: tuple[int, ...]) -> Array:
    """Boolean array of ``shape``, each element True with probability ``p`` (to 2⁻³² resolution).

    Same contract as ``jax.random.bernoulli(key, p, shape)`` with a different stream; ``p`` is static.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"probability {p} is outside [0, 1]")
    if p == 1.0:
        return jnp.ones(shape, bool)
    seed = jax.random.bits(key, (2,), jnp.uint32)
    index = jax.lax.iota(jnp.uint32, int(np.prod(shape))).reshape(shape)
    threshold = jnp.uint32(min(round(p * 2.0**32), 2**32 - 1))
    return mix32(mix32(index ^ seed[0]) + seed[1]) < threshold


@jax.jit
def fold_in_rows(key: Array, data: Array) -> Array:
    """One key per row: ``fold_in(key, data[i])`` for (n,) uint32 ``data`` → (n, 2) keys."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, data)


def threefry_uniform(key: Array, n: int) -> Array:
    """(n,) float32 uniforms in [0, 1): the Threefry-2x32 hash of a counter, 23 bits per value.

    The hash of one counter pair gives two values (half the hashing of ``jax.random.uniform`` in its
    default "partitionable" counter layout, about 3x faster on CPU). Same map from bits to floats.
    """
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    bits = threefry_2x32(key, jnp.arange(n + n % 2, dtype=jnp.uint32))[:n]
    floats = jax.lax.bitcast_convert_type((bits >> 9) | np.uint32(0x3F800000), jnp.float32)
    return floats - 1.0


def gumbel_and_normal_noise(
    key: Array, shapes: dict[str, tuple[int, ...]], normal: tuple[str, ...] = ()
) -> dict[str, Array]:
    """Noise arrays of the given shapes cut from one :func:`threefry_uniform` draw: standard normal for
    the names in ``normal``, standard Gumbel for the others. The maps from uniforms are those of
    ``jax.random.normal`` and ``jax.random.gumbel``. One draw compiles much faster than one per array
    (each is its own copy of the generator's hash)."""
    sizes = [int(np.prod(shape)) for shape in shapes.values()]
    u = threefry_uniform(key, sum(sizes))
    out, offset = {}, 0
    for (name, shape), size in zip(shapes.items(), sizes, strict=True):
        x = u[offset : offset + size].reshape(shape)
        offset += size
        if name in normal:
            lo = np.nextafter(np.float32(-1.0), np.float32(0.0))
            out[name] = np.float32(np.sqrt(2.0)) * jax.lax.erf_inv(jnp.maximum(lo, x * (1.0 - lo) + lo))
        else:
            tiny = np.finfo(np.float32).tiny
            out[name] = -jnp.log(-jnp.log(jnp.maximum(tiny, x * (1.0 - tiny) + tiny)))
    return out


SHUFFLE_EXPONENT = 3
"""``jax.random.permutation``'s rounds: ceil(3·ln(n) / ln(2³² − 1)) sorts by fresh 32-bit keys (one
up to n = 1625)."""


def choice_without_replacement(key: Array, n: int, k: int) -> Array:
    """``jax.random.choice(key, n, (k,), replace=False)``: k distinct integers of [0, n), (k,) int32.

    The gather-free form (:func:`~sb3_worldmodels.blocks.backend.gather_free`) draws the same numbers:
    ``jax.random.permutation``'s rounds of a stable sort by fresh random 32-bit keys, each element's
    place found by counting the keys below it (ties by position) instead of sorting.
    """
    if not gather_free():
        return jax.random.choice(key, n, (k,), replace=False)
    if not 0 < k <= n:
        raise ValueError(f"choice_without_replacement draws 0 < k <= n integers, got k={k}, n={n}.")
    order = jnp.arange(n, dtype=jnp.int32)
    position = jax.lax.broadcasted_iota(jnp.int32, (n, n), 0)
    rounds = int(np.ceil(SHUFFLE_EXPONENT * np.log(max(1, n)) / np.log(np.iinfo(np.uint32).max)))
    for _ in range(rounds):
        key, subkey = jax.random.split(key)
        sort_keys = jax.random.bits(subkey, (n,), jnp.uint32)
        mine, other = sort_keys[:, None], sort_keys[None, :]  # [i, j]: element i against element j
        ahead = (other < mine) | ((other == mine) & (position.T < position))
        place = jnp.sum(ahead, axis=1, dtype=jnp.int32)  # element i's place after the stable sort
        at = place[None, :] == position  # [p, i]: element i goes to place p
        order = jnp.sum(jnp.where(at, order[None, :], 0), axis=1, dtype=jnp.int32)
    return order[:k]

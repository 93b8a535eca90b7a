"""Scalar transforms, two-hot regression and λ-returns shared by DreamerV3 and TD-MPC2.

Pure functions on float32 arrays. Shape symbols: N imagination starts, H imagination horizon,
B batch rows, T sequence length, n number of bins. References: DreamerV3
agent.py:301-373@2411f7d, jaxutils.py:76-81,210-274@2411f7d, nets.py:462-471@2411f7d; TD-MPC2
math.py:5-9,48-95@b67b21c.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels.blocks.backend import count_at_most, gather_free, scan_unroll, select_along

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

__all__ = [
    "imagination_weight",
    "imagined_lambda_return",
    "lambda_return",
    "replay_lambda_return",
    "symexp",
    "symexp_bins",
    "symlog",
    "symlog_twohot_bins",
    "symlog_twohot_encode",
    "symlog_twohot_log_prob",
    "symlog_twohot_mean",
    "twohot_encode",
    "twohot_log_prob",
    "twohot_mean",
]


# --------------------------------------------------------------------------------------------
# symlog / symexp (jaxutils.py:76-81@2411f7d, math.py:5-9@b67b21c)
# --------------------------------------------------------------------------------------------


def symlog(x: ArrayLike) -> Array:
    """sign(x)·log(1 + |x|), elementwise; any shape."""
    x = jnp.asarray(x)
    return jnp.sign(x) * jnp.log1p(jnp.abs(x))


def symexp(x: ArrayLike) -> Array:
    """sign(x)·(exp(|x|) − 1), the inverse of :func:`symlog`; elementwise, any shape."""
    x = jnp.asarray(x)
    return jnp.sign(x) * jnp.expm1(jnp.abs(x))


# --------------------------------------------------------------------------------------------
# DreamerV3 two-hot over symexp-spaced bins, in raw units (nets.py:462-471@2411f7d,
# jaxutils.py:210-274@2411f7d)
# --------------------------------------------------------------------------------------------


def symexp_bins(num_bins: int = 255) -> np.ndarray:
    """Bins of the DreamerV3 reward/critic heads: symexp of a symlog-space grid on [−20, 20].

    ``half = symexp(linspace(−20, 0, (n+1)/2))`` and ``bins = [half, −reverse(half[:-1])]``: the
    two halves share the zero bin. The values are computed in float64 and rounded once to float32,
    so the result is exactly antisymmetric (``bins[i] == -bins[n-1-i]``), strictly increasing and
    exactly 0 in the middle. The reference builds them in float32 (jnp.linspace, expm1), which
    rounds some bins differently (up to 1.2e-6 relative for n = 255; docs/deviations.md).

    Args:
        num_bins: odd bin count n ≥ 3 (even counts would duplicate the zero bin).

    Returns:
        (n,) float32 numpy array; for n = 255 the ends are ±4.851652e8.
    """
    if num_bins < 3 or num_bins % 2 == 0:
        raise ValueError(f"num_bins must be odd and at least 3, got {num_bins}")
    grid = np.linspace(-20.0, 0.0, (num_bins - 1) // 2 + 1, dtype=np.float64)
    half = (np.sign(grid) * np.expm1(np.abs(grid))).astype(np.float32)
    return np.concatenate([half, -half[:-1][::-1]])


def _twohot_pair(x: ArrayLike, bins: ArrayLike) -> tuple[Array, Array, Array, Array]:
    """The two bins of :func:`twohot_encode` and their weights: (below, above) int32 and
    (weight_below, weight_above) float32, each (...)."""
    x = jnp.asarray(x, jnp.float32)
    bins = jnp.asarray(bins, jnp.float32)
    n = bins.shape[-1]
    if gather_free():  # count(bins <= x) by comparing with every bin, the two bins read by masked sums
        count = count_at_most(bins, x)
        below = jnp.clip(count - 1, 0, n - 1)
        above = jnp.clip(count, 0, n - 1)
        same = below == above
        dist_below = jnp.where(same, 1.0, jnp.abs(select_along(bins, below) - x))
        dist_above = jnp.where(same, 1.0, jnp.abs(select_along(bins, above) - x))
    else:  # count(bins <= x) by binary search: the same integers as comparing with every bin
        count = jnp.searchsorted(bins, x, side="right").astype(jnp.int32)
        below = jnp.clip(count - 1, 0, n - 1)
        above = jnp.clip(count, 0, n - 1)
        same = below == above
        dist_below = jnp.where(same, 1.0, jnp.abs(bins[below] - x))
        dist_above = jnp.where(same, 1.0, jnp.abs(bins[above] - x))
    total = dist_below + dist_above
    return below, above, dist_above / total, dist_below / total


def twohot_encode(x: ArrayLike, bins: ArrayLike) -> Array:
    """Two-hot target weights of scalars ``x`` against increasing ``bins`` (raw units).

    The mass is split between the nearest bins below and above ``x`` in inverse proportion to
    the distance; a value equal to a bin gives that bin weight 1; values outside the range go
    entirely to the end bin.

    Args:
        x: (...) float32 scalars.
        bins: (n,) strictly increasing float32 bins.

    Returns:
        (..., n) float32 weights, each row summing to 1.
    """
    below, above, weight_below, weight_above = _twohot_pair(x, bins)
    n = jnp.shape(bins)[-1]
    return (
        jax.nn.one_hot(below, n, dtype=jnp.float32) * weight_below[..., None]
        + jax.nn.one_hot(above, n, dtype=jnp.float32) * weight_above[..., None]
    )


def twohot_log_prob(logits: ArrayLike, x: ArrayLike, bins: ArrayLike) -> Array:
    """Σ_i twohot(x)_i · log_softmax(logits)_i, the log-likelihood of ``x``.

    Only the two bins with weight are read (the other terms of the sum are exact zeros), so no
    (..., n) target is built: on CPU by gathers, on accelerators by masked sums over the bins
    (:func:`~sb3_worldmodels.blocks.backend.gather_free`); the backward pass is written out. No
    stop-gradient is applied to ``x``; callers pass ``sg(target)``.

    Args:
        logits: (..., n) float32.
        x: (...) float32 targets in raw units.
        bins: (n,) float32 bins.

    Returns:
        (...) float32.
    """
    logits = jnp.asarray(logits, jnp.float32)
    pair = _twohot_pair(x, bins)
    shape = jnp.broadcast_shapes(logits.shape[:-1], pair[0].shape)
    logits = jnp.broadcast_to(logits, (*shape, logits.shape[-1]))
    return _pair_log_prob(logits, *(jnp.broadcast_to(part, shape) for part in pair))


@jax.custom_vjp
def _pair_log_prob(
    logits: Array, below: Array, above: Array, weight_below: Array, weight_above: Array
) -> Array:
    """weight_below·log_softmax(logits)[below] + weight_above·log_softmax(logits)[above], (...), with
    the closed-form gradient (weights at the two bins − total weight · softmax) in one elementwise
    pass over the bins: autodiff of the gathers scatters into a zeroed (..., n) array instead, which on
    CPU costs more than the loss, and adds a reduction over the bins (tested against autodiff)."""
    return _pair_log_prob_fwd(logits, below, above, weight_below, weight_above)[0]


def _pair_log_prob_fwd(
    logits: Array, below: Array, above: Array, weight_below: Array, weight_above: Array
) -> tuple[Array, tuple[Array, ...]]:
    logp = jax.nn.log_softmax(logits, axis=-1)
    if gather_free():
        lp_below, lp_above = select_along(logp, below), select_along(logp, above)
    else:
        lp_below = jnp.take_along_axis(logp, below[..., None], axis=-1)[..., 0]
        lp_above = jnp.take_along_axis(logp, above[..., None], axis=-1)[..., 0]
    out = weight_below * lp_below + weight_above * lp_above
    return out, (logp, below, above, weight_below, weight_above, lp_below, lp_above)


def _pair_log_prob_bwd(res: tuple[Array, ...], g: Array) -> tuple[Array | None, ...]:
    logp, below, above, weight_below, weight_above, lp_below, lp_above = res
    g_below, g_above = g * weight_below, g * weight_above
    index = jax.lax.broadcasted_iota(jnp.int32, logp.shape, logp.ndim - 1)
    d_logits = (
        jnp.where(index == below[..., None], g_below[..., None], 0.0)
        + jnp.where(index == above[..., None], g_above[..., None], 0.0)
        - (g_below + g_above)[..., None] * jnp.exp(logp)
    )
    return d_logits, None, None, g * lp_below, g * lp_above


_pair_log_prob.defvjp(_pair_log_prob_fwd, _pair_log_prob_bwd)


def twohot_mean(logits: ArrayLike, bins: ArrayLike) -> Array:
    """Exact symmetric expectation Σ_i softmax(logits)_i · bins_i for antisymmetric bins.

    The mirrored bins are paired: with m = n // 2 and odd n, the sum is
    ``p_m·b_m + Σ_i (p_{m+1+i} − p_{m−1−i})·b_{m+1+i}`` (b_m = 0); for even n the pairs are
    ``(p_{m+i} − p_{m−1−i})·b_{m+i}``. Equal mirrored probabilities (e.g. zero logits) cancel
    before any multiplication by the ±4.85e8 end bins, so uniform probabilities give exactly 0.0
    under ``jax.jit`` too (the reference gives −0.1644754 there, because fused multiply-adds
    break its pairing; docs/deviations.md).

    Args:
        logits: (..., n) float32.
        bins: (n,) float32 bins with ``bins[i] == -bins[n-1-i]`` (see :func:`symexp_bins`); an
            even n pairs the two halves without a middle bin.

    Returns:
        (...) float32 expectation in raw units.
    """
    logits = jnp.asarray(logits, jnp.float32)
    bins = jnp.asarray(bins, jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    n = probs.shape[-1]
    m = n // 2
    lower = probs[..., :m][..., ::-1]
    if n % 2 == 1:
        upper = probs[..., m + 1 :]
        return probs[..., m] * bins[m] + jnp.sum((upper - lower) * bins[m + 1 :], axis=-1)
    upper = probs[..., m:]
    return jnp.sum((upper - lower) * bins[m:], axis=-1)


# --------------------------------------------------------------------------------------------
# TD-MPC2 two-hot in symlog space (math.py:48-95@b67b21c)
# --------------------------------------------------------------------------------------------


def symlog_twohot_bins(num_bins: int, vmin: float, vmax: float) -> np.ndarray:
    """(num_bins,) float32 bin centres equally spaced on [vmin, vmax] in symlog space."""
    if num_bins < 2:
        raise ValueError(f"num_bins must be at least 2, got {num_bins}")
    return np.linspace(vmin, vmax, num_bins, dtype=np.float64).astype(np.float32)


def symlog_twohot_encode(x: ArrayLike, num_bins: int, vmin: float, vmax: float) -> Array:
    """TD-MPC2 two-hot of ``clip(symlog(x), vmin, vmax)`` over linear symlog-space bins.

    With bin size s = (vmax − vmin)/(n − 1), k = floor((y − vmin)/s) and w = (y − vmin)/s − k,
    weight 1 − w goes to bin k and w to bin (k + 1) mod n (the wrap only occurs at y = vmax,
    where w = 0).

    Args:
        x: (...) float32 raw scalars.

    Returns:
        (..., num_bins) float32 weights.
    """
    bin_size = (vmax - vmin) / (num_bins - 1)
    y = jnp.clip(symlog(jnp.asarray(x, jnp.float32)), vmin, vmax)
    pos = (y - vmin) / bin_size
    k = jnp.floor(pos)
    w = pos - k
    k = k.astype(jnp.int32)
    return (
        jax.nn.one_hot(k, num_bins, dtype=jnp.float32) * (1.0 - w)[..., None]
        + jax.nn.one_hot((k + 1) % num_bins, num_bins, dtype=jnp.float32) * w[..., None]
    )


def symlog_twohot_log_prob(logits: ArrayLike, x: ArrayLike, num_bins: int, vmin: float, vmax: float) -> Array:
    """Σ_j twohot(x)_j · log_softmax(logits)_j; TD-MPC2's ``soft_ce`` is its negative.

    Args:
        logits: (..., num_bins) float32.
        x: (...) float32 raw targets.

    Returns:
        (...) float32.
    """
    target = symlog_twohot_encode(x, num_bins, vmin, vmax)
    logits = jnp.asarray(logits, jnp.float32)
    return jnp.sum(target * jax.nn.log_softmax(logits, axis=-1), axis=-1)


def symlog_twohot_mean(logits: ArrayLike, num_bins: int, vmin: float, vmax: float) -> Array:
    """symexp(Σ_j softmax(logits)_j · centre_j): expectation in symlog space, then symexp.

    Args:
        logits: (..., num_bins) float32.

    Returns:
        (...) float32 in raw units.
    """
    centres = jnp.asarray(symlog_twohot_bins(num_bins, vmin, vmax))
    probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    return symexp(jnp.sum(probs * centres, axis=-1))


# --------------------------------------------------------------------------------------------
# λ-returns (agent.py:301-326,352-373@2411f7d)
# --------------------------------------------------------------------------------------------


def lambda_return(reward: ArrayLike, disc: ArrayLike, value: ArrayLike, lam: ArrayLike) -> Array:
    """Generic λ-return over a time axis, computed by a reverse ``jax.lax.scan``.

    G_{T−1} = v_{T−1};  G_t = r_{t+1} + d_{t+1}·((1 − λ_{t+1})·v_{t+1} + λ_{t+1}·G_{t+1}).
    Index 0 of ``reward``, ``disc`` and ``lam`` is never read.

    Args:
        reward: (B, T) float32, r_t received on entering step t.
        disc: (B, T) float32, discount (or continue probability) on entering step t.
        value: (B, T) float32 bootstrap values v_t.
        lam: scalar or (B, T) float32 λ_t.

    Returns:
        (B, T − 1) float32 returns G_0 … G_{T−2}.
    """
    reward = jnp.asarray(reward, jnp.float32)
    disc = jnp.asarray(disc, jnp.float32)
    value = jnp.asarray(value, jnp.float32)
    lam = jnp.broadcast_to(jnp.asarray(lam, jnp.float32), value.shape)
    # Time-major slices of steps 1..T-1, the "next" step of each returned index.
    rew_next = reward[:, 1:].T
    disc_next = disc[:, 1:].T
    val_next = value[:, 1:].T
    lam_next = lam[:, 1:].T

    def step(ret_next: Array, xs: tuple[Array, Array, Array, Array]) -> tuple[Array, Array]:
        r, d, v, lm = xs
        ret = r + d * ((1.0 - lm) * v + lm * ret_next)
        return ret, ret

    xs = (rew_next, disc_next, val_next, lam_next)
    _, rets = jax.lax.scan(step, value[:, -1], xs, reverse=True, unroll=scan_unroll())
    return rets.T


def imagined_lambda_return(reward: ArrayLike, cont: ArrayLike, value: ArrayLike, lam: float) -> Array:
    """DreamerV3 imagined λ-return (agent.py:320-326@2411f7d); the explicit discount is 1 because ``cont``
    holds γ.

    R_H = v_H;  R_k = r_{k+1} + c_{k+1}·((1 − λ)·v_{k+1} + λ·R_{k+1}) for k = H−1 … 0.
    ``reward[:, 0]`` and ``cont[:, 0]`` (the start step) do not enter the returns; ``cont[:, 0]``
    only enters :func:`imagination_weight`.

    Args:
        reward: (N, H+1) float32, index 0 = start.
        cont: (N, H+1) float32 continue probabilities.
        value: (N, H+1) float32 critic values.
        lam: λ (0.95 in DreamerV3).

    Returns:
        (N, H) float32 returns R_0 … R_{H−1}.
    """
    return lambda_return(reward, cont, value, lam)


def imagination_weight(cont: ArrayLike) -> Array:
    """w_k = Π_{j ≤ k} c_j, the loss weight of imagined step k (agent.py:301-317@2411f7d).

    Args:
        cont: (N, H+1) float32, index 0 = 1 − is_terminal of the start step.

    Returns:
        (N, H+1) float32.
    """
    return jnp.cumprod(jnp.asarray(cont, jnp.float32), axis=1)


def replay_lambda_return(
    reward: ArrayLike,
    is_terminal: ArrayLike,
    is_last: ArrayLike,
    boot: ArrayLike,
    gamma: float,
    lam: float,
) -> Array:
    """DreamerV3 replay ("repval") λ-return (agent.py:352-373@2411f7d).

    With live_t = (1 − is_terminal_t)·γ and λ'_t = λ·(1 − is_last_t):
    G_{T−1} = b_{T−1};  G_t = r_{t+1} + live_{t+1}·((1 − λ'_{t+1})·b_{t+1} + λ'_{t+1}·G_{t+1}).

    Args:
        reward: (B, T) float32 replay rewards.
        is_terminal: (B, T) bool.
        is_last: (B, T) bool.
        boot: (B, T) float32 bootstrap values (the imagined R_0 started at each step).
        gamma: discount γ (1 − 1/333 in DreamerV3).
        lam: λ (0.95).

    Returns:
        (B, T − 1) float32 returns G_0 … G_{T−2}.
    """
    live = (1.0 - jnp.asarray(is_terminal, jnp.float32)) * gamma
    lam_t = lam * (1.0 - jnp.asarray(is_last, jnp.float32))
    return lambda_return(reward, live, boot, lam_t)

"""Running statistics as pure ``init`` / ``update`` / ``apply`` functions over small states.

- DreamerV3 percentile return normaliser (jaxutils.py:301-395@2411f7d).
- Exponential moving average of parameter pytrees, e.g. the slow critic (jaxutils.py:732-757@2411f7d).
- TD-MPC2 ``RunningScale`` (scale.py:4-47@b67b21c).

All statistics are float32 and never carry gradients.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from sb3_worldmodels.blocks.backend import gather_free, percentiles

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

__all__ = [
    "PercentileNormState",
    "RunningScaleState",
    "ema_update",
    "percentile_norm_init",
    "percentile_norm_scale",
    "percentile_norm_update",
    "running_scale_apply",
    "running_scale_init",
    "running_scale_update",
]


# --------------------------------------------------------------------------------------------
# DreamerV3 percentile return normaliser
# --------------------------------------------------------------------------------------------


class PercentileNormState(NamedTuple):
    """EMA of the low and high return percentiles; both () float32, starting at 0."""

    low: Array
    high: Array


def percentile_norm_init() -> PercentileNormState:
    """State with low = high = 0 (no bias correction, as in the reference)."""
    return PercentileNormState(low=jnp.zeros((), jnp.float32), high=jnp.zeros((), jnp.float32))


def percentile_norm_update(
    state: PercentileNormState,
    x: ArrayLike,
    rate: float,
    perclo: float = 5.0,
    perchi: float = 95.0,
) -> PercentileNormState:
    """low ← (1 − rate)·low + rate·P_lo(x); high likewise with P_hi(x).

    Percentiles are taken over all elements of ``x`` with linear interpolation
    (``jnp.percentile``'s default; on accelerators the same values without a sort,
    :func:`~sb3_worldmodels.blocks.backend.percentiles`).

    Args:
        state: current statistics.
        x: (...) float32 values, e.g. the (N, H) imagined returns; not differentiated.
        rate: EMA rate (0.01 in DreamerV3).
        perclo: lower percentile in [0, 100].
        perchi: upper percentile in [0, 100].

    Returns:
        The updated state.
    """
    x = jax.lax.stop_gradient(jnp.asarray(x, jnp.float32)).reshape(-1)
    if gather_free():
        lo, hi = percentiles(x, (perclo, perchi))
    else:
        lo = jnp.percentile(x, perclo)
        hi = jnp.percentile(x, perchi)
    return PercentileNormState(
        low=(1.0 - rate) * state.low + rate * lo,
        high=(1.0 - rate) * state.high + rate * hi,
    )


def percentile_norm_scale(state: PercentileNormState, limit: float = 1.0) -> tuple[Array, Array]:
    """(offset, scale) = (low, max(limit, high − low)); advantages are divided by ``scale``.

    Returns:
        Two () float32 arrays.
    """
    return state.low, jnp.maximum(jnp.float32(limit), state.high - state.low)


# --------------------------------------------------------------------------------------------
# Exponential moving average of pytrees (slow critic, target networks)
# --------------------------------------------------------------------------------------------


def ema_update(slow: Any, online: Any, rate: float | ArrayLike, first: bool | ArrayLike) -> Any:
    """Copy ``online`` when ``first``, else ``rate·online + (1 − rate)·slow``, leaf by leaf.

    The copy is exact (a select, not a blend), so a slow critic equals the critic after the first
    call. ``first`` may be a Python bool or a traced () bool, e.g. ``counter == 0``.

    Args:
        slow: pytree of arrays.
        online: pytree with the same structure, shapes and dtypes.
        rate: mixing fraction (0.02 for DreamerV3's slow critic, τ = 0.01 for TD-MPC2's target Q).
        first: whether to copy.

    Returns:
        The new slow pytree.
    """
    online = jax.lax.stop_gradient(online)

    def mix(s: Array, o: Array) -> Array:
        blended = rate * o + (1.0 - rate) * s
        return jnp.where(first, o, blended).astype(s.dtype)

    return jax.tree_util.tree_map(mix, slow, online)


# --------------------------------------------------------------------------------------------
# TD-MPC2 RunningScale
# --------------------------------------------------------------------------------------------


class RunningScaleState(NamedTuple):
    """TD-MPC2 policy-loss scale S; () float32, starting at 1."""

    value: Array


def running_scale_init() -> RunningScaleState:
    """State with S = 1."""
    return RunningScaleState(value=jnp.ones((), jnp.float32))


def running_scale_update(
    state: RunningScaleState,
    x: ArrayLike,
    tau: float,
    perclo: float = 5.0,
    perchi: float = 95.0,
) -> RunningScaleState:
    """S ← S + τ·(max(P95(x) − P5(x), 1) − S).

    Percentiles use linear interpolation between order statistics at position p·(B − 1)/100, as
    the reference's sort-based percentile does; they are taken over all elements of ``x``.

    Args:
        state: current scale.
        x: (B,) or (B, 1) float32, e.g. the t = 0 Q values; not differentiated.
        tau: EMA rate (0.01, shared with the target-network EMA).

    Returns:
        The updated state.
    """
    x = jax.lax.stop_gradient(jnp.asarray(x, jnp.float32)).reshape(-1)
    if gather_free():
        lo, hi = percentiles(x, (perclo, perchi))
        spread = hi - lo
    else:
        spread = jnp.percentile(x, perchi) - jnp.percentile(x, perclo)
    target = jnp.maximum(spread, 1.0)
    return RunningScaleState(value=state.value + tau * (target - state.value))


def running_scale_apply(state: RunningScaleState, x: ArrayLike) -> Array:
    """x · (1/S), elementwise; any shape."""
    return jnp.asarray(x, jnp.float32) * (1.0 / state.value)

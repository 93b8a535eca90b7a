"""Formulations chosen per backend: lookups without gathers on accelerators, and how far the agents'
sequential scans are unrolled.

On a TPU, a lookup of one element per row (``table[idx]``, ``jnp.take_along_axis``), the binary
search of ``jnp.searchsorted`` (a while loop of such lookups) and a sort run as gathers, loops and
sorts whose time grows with a leading seed axis: ``bins[idx]`` for (8, 15, 1024) indices into 255
bins takes about 1.1 ms on a TPU v5e, the same values selected by a masked sum over the bins about
0.05 ms. Elementwise selects and reductions cost little there. The gather-free forms here compare an
iota with the index and sum the one selected term (every other term is an exact zero, so the value
is the looked-up one; its gradient is the lookup's), count comparisons instead of searching, and
select order statistics by counting instead of sorting.

The switch: :func:`gather_free` says whether the programs traced now use these forms. By default
(``"auto"``) they do on every backend but the CPU, where the programs stay those tuned and
parity-tested with gathers, searches and sorts. :func:`gather_free_forms` (a context manager) and
:func:`set_gather_free` force either form, e.g. to test the accelerator's programs on a CPU, and the
environment variable :data:`ENV_VAR` sets the mode of a process (read at import). The
agents' jitted functions (:func:`~sb3_worldmodels.blocks.jit.agent_jit`) keep one program per form,
each traced under the form it was built for; a plain ``jax.jit`` of an agent function keeps whatever
form it was first traced under.

The scans over time (DreamerV3's posterior and imagination rollouts and its λ-returns, TD-MPC2's
planning iterations) run :func:`scan_unroll` steps per loop iteration (``jax.lax.scan``'s ``unroll``):
1 unless the environment variable :data:`SCAN_UNROLL_ENV_VAR` or :func:`scan_unroll_steps` sets it.
An unrolled loop runs the same operations; on an accelerator it saves the loop's per-step overhead
and lets the compiler overlap consecutive steps, at the price of a longer compile.
:func:`program_form` is what a program is kept by (the gather-free switch and the unroll), and
:func:`traced_in_form` traces under one.

Both forms give the same values (tests/test_gather_free.py): exactly, but for the sign of a zero
(a masked sum gives +0.0 where the lookup read −0.0); gradients that several rows send to one table
entry (a multi-task embedding row) are summed in another order.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

__all__ = [
    "ENV_VAR",
    "GATHER_FREE_MODES",
    "SCAN_UNROLL_ENV_VAR",
    "count_at_most",
    "gather_free",
    "gather_free_forms",
    "gather_free_mode",
    "order_statistics",
    "percentiles",
    "program_form",
    "scan_unroll",
    "scan_unroll_steps",
    "select_along",
    "select_rows",
    "set_gather_free",
    "traced_in_form",
]

GATHER_FREE_MODES = ("auto", "on", "off")
"""Values of :func:`set_gather_free`: "auto" (gather-free on every backend but the CPU), "on", "off"."""

ENV_VAR = "SB3WM_GATHER_FREE"
"""Environment variable with the process's mode (one of :data:`GATHER_FREE_MODES`; "auto" if unset)."""


def gather_free_mode() -> str:
    """The mode set (one of :data:`GATHER_FREE_MODES`)."""
    return _mode


def gather_free() -> bool:
    """Whether programs traced now use the gather-free forms: the forced value, else (``"auto"``)
    whether JAX's default backend is not the CPU."""
    if _mode == "auto":
        return jax.default_backend() != "cpu"
    return _mode == "on"


def _check_mode(mode: str | bool) -> str:
    if isinstance(mode, bool):
        return "on" if mode else "off"
    if mode not in GATHER_FREE_MODES:
        raise ValueError(f"the gather-free mode must be one of {GATHER_FREE_MODES} or a bool, got {mode!r}.")
    return mode


def _mode_from_environment() -> str:
    mode = os.environ.get(ENV_VAR, "auto")
    if mode not in GATHER_FREE_MODES:
        raise ValueError(f"{ENV_VAR}={mode!r}: the gather-free mode must be one of {GATHER_FREE_MODES}.")
    return mode


_mode = _mode_from_environment()


def set_gather_free(mode: str | bool) -> None:
    """Set the mode for the programs traced from now on: "auto", "on" (True) or "off" (False)."""
    global _mode
    _mode = _check_mode(mode)


@contextlib.contextmanager
def gather_free_forms(mode: str | bool = True) -> Iterator[None]:
    """Trace with the gather-free forms on (True, "on"), off (False, "off") or chosen by the backend
    ("auto") inside the ``with`` block; the previous mode is restored after it."""
    global _mode
    previous, _mode = _mode, _check_mode(mode)
    try:
        yield
    finally:
        _mode = previous


SCAN_UNROLL_ENV_VAR = "SB3WM_SCAN_UNROLL"
"""Environment variable with the process's scan unroll (a positive integer; 1 if unset)."""


def _check_unroll(steps: int) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"the scan unroll must be a positive integer (1: no unrolling), got {steps!r}.")
    return steps


def _unroll_from_environment() -> int:
    value = os.environ.get(SCAN_UNROLL_ENV_VAR, "1")
    try:
        return _check_unroll(int(value))
    except ValueError:
        raise ValueError(
            f"{SCAN_UNROLL_ENV_VAR}={value!r}: the scan unroll must be a positive integer (1: no unrolling)."
        ) from None


_unroll = _unroll_from_environment()


def scan_unroll() -> int:
    """Steps per loop iteration of the agents' scans over time in the programs traced now."""
    return _unroll


@contextlib.contextmanager
def scan_unroll_steps(steps: int) -> Iterator[None]:
    """Trace the agents' scans with ``steps`` steps per loop iteration inside the ``with`` block."""
    global _unroll
    previous, _unroll = _unroll, _check_unroll(steps)
    try:
        yield
    finally:
        _unroll = previous


def program_form() -> tuple[bool, int]:
    """What a program traced now depends on beyond its config: (:func:`gather_free`, :func:`scan_unroll`)."""
    return gather_free(), scan_unroll()


@contextlib.contextmanager
def traced_in_form(form: tuple[bool, int]) -> Iterator[None]:
    """Trace in ``form`` (a :func:`program_form`) inside the ``with`` block."""
    free, steps = form
    with gather_free_forms(free), scan_unroll_steps(steps):
        yield


# ------------------------------------------------------------------------------------------------
# Lookups as masked sums
# ------------------------------------------------------------------------------------------------


def select_along(values: ArrayLike, index: ArrayLike) -> Array:
    """``values[..., index]`` row by row without a gather: Σ_i [i == index]·values_i over the last axis.

    The gather-free form of ``jnp.take_along_axis(values, index[..., None], -1)[..., 0]`` (and of
    ``values[index]`` for a 1-D ``values``). Out-of-range indices give 0.

    Args:
        values: (..., n) numeric.
        index: (...) integers, broadcastable against ``values`` without its last axis.

    Returns:
        (...) in the dtype of ``values``.
    """
    values = jnp.asarray(values)
    index = jnp.asarray(index)
    hit = jax.lax.broadcasted_iota(jnp.int32, (values.shape[-1],), 0) == index[..., None]
    return jnp.sum(jnp.where(hit, values, jnp.zeros((), values.dtype)), axis=-1, dtype=values.dtype)


def select_rows(table: ArrayLike, index: ArrayLike, axis: int = 0) -> Array:
    """``jnp.take(table, index, axis)`` without a gather: Σ_i [i == index]·table[..., i, ...] over
    ``axis`` (``table[index]`` for axis 0).

    Args:
        table: (*P, n, *R) numeric or bool, n on ``axis``.
        index: integers of any shape I.

    Returns:
        (*P, *I, *R) in the dtype of ``table``. Out-of-range indices give zeros (False).
    """
    table = jnp.asarray(table)
    index = jnp.asarray(index)
    axis = axis % table.ndim
    before, after = axis, table.ndim - axis - 1
    hit = jax.lax.broadcasted_iota(jnp.int32, (table.shape[axis],), 0) == index[..., None]  # (*I, n)
    hit = hit.reshape((1,) * before + hit.shape + (1,) * after)  # (1.., *I, n, 1..)
    table = table.reshape(table.shape[:axis] + (1,) * index.ndim + table.shape[axis:])  # (*P, 1.., n, *R)
    reduced = before + index.ndim
    if table.dtype == jnp.bool_:
        return jnp.any(hit & table, axis=reduced)
    return jnp.sum(jnp.where(hit, table, jnp.zeros((), table.dtype)), axis=reduced, dtype=table.dtype)


def count_at_most(sorted_values: ArrayLike, x: ArrayLike) -> Array:
    """#{i : not x < sorted_values_i} per element of ``x``, by comparing with every value: the same
    integers as ``jnp.searchsorted(sorted_values, x, side="right")`` for increasing values without
    NaN (for every x, NaN included: it counts every value, as NaN sorts last).

    Args:
        sorted_values: (n,) increasing, no NaN.
        x: any shape.

    Returns:
        int32 of the shape of ``x``.
    """
    sorted_values = jnp.asarray(sorted_values)
    x = jnp.asarray(x)
    return jnp.sum(~(x[..., None] < sorted_values), axis=-1, dtype=jnp.int32)


# ------------------------------------------------------------------------------------------------
# Order statistics by counting
# ------------------------------------------------------------------------------------------------

_RADIX_BITS = 4
"""Bits of the order statistic found per counting pass of :func:`order_statistics` (8 passes)."""


def _sort_keys(x: Array) -> Array:
    """float32 → uint32 keys in the order of ``lax.sort`` (−0.0 as 0.0, every NaN last)."""
    x = jnp.where(x == 0.0, jnp.float32(0.0), x)
    x = jnp.where(jnp.isnan(x), jnp.float32(np.nan), x)
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    negative = (bits >> 31) == 1
    return jnp.where(negative, ~bits, bits | np.uint32(0x80000000))


def _from_sort_keys(keys: Array) -> Array:
    non_negative = (keys >> 31) == 1
    bits = jnp.where(non_negative, keys & np.uint32(0x7FFFFFFF), ~keys)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def order_statistics(x: ArrayLike, ranks: ArrayLike) -> Array:
    """The ``ranks``-th smallest elements of ``x`` (0-based), without a sort: ``jnp.sort(x)[ranks]``.

    Each statistic's bit pattern is found 4 bits at a time, from the highest: of the 15 candidates
    that extend the bits found so far, the largest v with #{x < v} <= rank is kept (8 passes, each
    counting (r, 15, n) comparisons). The result is an element of ``x``, with −0.0 given as 0.0.

    Args:
        x: (n,) float32; NaNs order last, as ``lax.sort`` puts them.
        ranks: (r,) integers in [0, n).

    Returns:
        (r,) float32.
    """
    keys = _sort_keys(jnp.asarray(x, jnp.float32).reshape(-1))
    ranks = jnp.asarray(ranks, jnp.int32)
    digits = jnp.arange(1, 2**_RADIX_BITS, dtype=jnp.uint32)
    found = jnp.zeros(ranks.shape, jnp.uint32)
    for shift in range(32 - _RADIX_BITS, -1, -_RADIX_BITS):
        candidates = found[..., None] | (digits << np.uint32(shift))  # (r, 15)
        below = jnp.sum(keys < candidates[..., None], axis=-1, dtype=jnp.int32)  # (r, 15)
        digit = jnp.sum(below <= ranks[..., None], axis=-1, dtype=jnp.int32).astype(jnp.uint32)
        found = found | (digit << np.uint32(shift))
    return _from_sort_keys(found)


def percentiles(x: ArrayLike, q: Sequence[float]) -> Array:
    """``jnp.percentile(x, q[i])`` (all elements, linear interpolation) for each ``q[i]``, the order
    statistics selected by :func:`order_statistics` instead of a sort. The interpolation is
    ``jnp.quantile``'s, in its order of operations; a NaN anywhere gives NaN.

    Args:
        x: any shape, float32.
        q: percentiles in [0, 100].

    Returns:
        (len(q),) float32.
    """
    x = jnp.asarray(x, jnp.float32).reshape(-1)
    n = jnp.float32(x.shape[0])
    pos = jnp.true_divide(jnp.asarray(q, jnp.float32), 100.0) * (n - 1)
    low, high = jnp.floor(pos), jnp.ceil(pos)
    high_weight = pos - low
    low_weight = 1.0 - high_weight
    low = jnp.clip(low, 0, n - 1).astype(jnp.int32)
    high = jnp.clip(high, 0, n - 1).astype(jnp.int32)
    values = order_statistics(x, jnp.concatenate([low, high]))
    low_value, high_value = values[: len(q)], values[len(q) :]
    result = low_value * low_weight + high_value * high_weight
    return jnp.where(jnp.any(jnp.isnan(x)), jnp.float32(np.nan), result)

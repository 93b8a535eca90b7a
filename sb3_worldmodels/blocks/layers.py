"""flax.linen layers shared by the world models: fan-in init, RMSNorm, dense and block-linear layers.

Parameter names mirror the reference state names (``<layer>/kernel``, ``<layer>/bias``,
``<layer>/norm/scale``), so a reference checkpoint maps onto the flax tree one to one.
Parameters are float32; ``dtype`` is the compute dtype (float32 by default). References:
DreamerV3 nets.py:594-758,816-884@2411f7d and TD-MPC2 layers.py:50-97@b67b21c.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels.blocks.convolution import conv2d

Array = jax.Array
Initializer = Callable[[Array, Sequence[int], Any], Array]
T = TypeVar("T")

__all__ = [
    "PREPARED",
    "RMS_EPS",
    "TRUNC_NORMAL_STD_CORRECTION",
    "BlockLinear",
    "Conv",
    "Dense",
    "NormedDense",
    "RMSNorm",
    "block_matmul",
    "block_matmul_pretransposed",
    "get_act",
    "hidden_layers",
    "init_from_one_draw",
    "layer_norm",
    "matmul_pretransposed",
    "mish",
    "rms_norm",
    "simnorm",
    "trunc_normal_fan_in",
]

TRUNC_NORMAL_STD_CORRECTION = 1.1368
"""≈ 1/0.8796, the std of a standard normal truncated to [−2, 2]; undoes the truncation
(nets.py:816-884@2411f7d)."""

RMS_EPS = 1e-4
"""Epsilon of :class:`RMSNorm` (DreamerV3 nets.py:728@2411f7d)."""

PREPARED = "prepared"
"""Variable collection of arrays derived from the parameters once per call, outside loops: a layer
with a ``kernel_t`` there (the transposed kernel) runs its input gradient on it
(:func:`matmul_pretransposed`). Passed to ``apply`` next to ``"params"``, same paths."""


# --------------------------------------------------------------------------------------------
# Initialiser and activations
# --------------------------------------------------------------------------------------------


def trunc_normal_fan_in(outscale: float = 1.0, fan_in_axes: Sequence[int] | None = None) -> Initializer:
    """Truncated N(0, 1) on [−2, 2] × 1.1368 × sqrt(1/fan_in) × outscale (DreamerV3 nets.py:816-884@2411f7d).

    The effective std is ``outscale / sqrt(fan_in)``; ``outscale == 0`` gives exact zeros.

    Args:
        outscale: multiplier of the std (1.0 hidden layers, 0.01 actor outputs, 0.0 reward and
            critic outputs, 0.1 vector-decoder outputs).
        fan_in_axes: kernel axes whose sizes multiply to fan-in. Default: every axis but the last,
            which covers a dense kernel (I, O) → I, a block kernel (G, I/G, O/G) → I and a conv
            kernel (k, k, I, O) → k·k·I.

    Returns:
        A flax initializer ``init(key, shape, dtype) -> array``.
    """

    def init(key: Array, shape: Sequence[int], dtype: Any = jnp.float32) -> Array:
        shape = tuple(shape)
        if outscale == 0.0:
            return jnp.zeros(shape, dtype)
        axes = range(len(shape) - 1) if fan_in_axes is None else fan_in_axes
        fan_in = int(np.prod([shape[a] for a in axes]))
        std = TRUNC_NORMAL_STD_CORRECTION * math.sqrt(1.0 / fan_in) * outscale
        return (_standard_truncated_normal(key, shape) * std).astype(dtype)

    return init


class _Draws:
    """Standard truncated-normal values handed out in order (``values`` None: only counted)."""

    def __init__(self, values: Array | None) -> None:
        self.values, self.taken = values, 0

    def take(self, shape: tuple[int, ...]) -> Array:
        size = int(np.prod(shape))
        start, self.taken = self.taken, self.taken + size
        if self.values is None:
            return jnp.zeros(shape, jnp.float32)
        return self.values[start : start + size].reshape(shape)


_ONE_DRAW: contextvars.ContextVar[_Draws | None] = contextvars.ContextVar("one_draw", default=None)


def _standard_truncated_normal(key: Array, shape: tuple[int, ...]) -> Array:
    draws = _ONE_DRAW.get()
    if draws is None:
        return jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32)
    return draws.take(shape)


def init_from_one_draw(init: Callable[[Array], T], key: Array) -> T:
    """``init(key)`` (e.g. a flax ``init``) with every :func:`trunc_normal_fan_in` kernel cut, in
    order of creation, from one draw of ``key`` (same distributions, other values).

    A draw per kernel puts a random-number generator per kernel into the jitted init: for DreamerV3's
    "1m" model 13,000 compiled instructions and 3.3 s to compile on CPU against 0.8 s for one draw,
    paid each time a model is built. Traceable; ``init`` is traced twice (the first time only to
    count the values)."""
    counter = _Draws(None)
    token = _ONE_DRAW.set(counter)
    try:
        jax.eval_shape(init, key)
    finally:
        _ONE_DRAW.reset(token)
    draws = _Draws(jax.random.truncated_normal(key, -2.0, 2.0, (counter.taken,), jnp.float32))
    token = _ONE_DRAW.set(draws)
    try:
        return init(key)
    finally:
        _ONE_DRAW.reset(token)


def mish(x: Array) -> Array:
    """x·tanh(softplus(x)), TD-MPC2's activation (not the same as SiLU).

    Computed as x·n/(n + 2) with n = eˣ(eˣ + 2), which equals tanh(log(1 + eˣ)), with one
    exponential instead of three transcendentals (within 5e-7 relative of the direct form; about 3x
    cheaper on CPU, where it is a third of a hidden layer's time). Above 20 it is x to float32
    precision.
    """
    e = jnp.exp(jnp.minimum(x, 20.0))
    n = e * (e + 2.0)
    return jnp.where(x > 20.0, x, x * n / (n + 2.0))


_ACTS: dict[str, Callable[[Array], Array]] = {
    "none": lambda x: x,
    "silu": jax.nn.silu,
    "mish": mish,
    "relu": jax.nn.relu,
    "elu": jax.nn.elu,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
}


def get_act(name: str | None) -> Callable[[Array], Array]:
    """Activation by name: none, silu, mish, relu, elu, tanh, sigmoid (None means none)."""
    key = "none" if name is None else name
    if key not in _ACTS:
        raise KeyError(f"unknown activation {name!r}; choose from {sorted(_ACTS)}")
    return _ACTS[key]


def simnorm(x: Array, dim: int = 8) -> Array:
    """TD-MPC2 SimNorm: softmax within consecutive groups of ``dim`` features of the last axis.

    Args:
        x: (..., L) with L divisible by ``dim``.

    Returns:
        (..., L); each group of ``dim`` outputs sums to 1.
    """
    shape = x.shape
    if shape[-1] % dim:
        raise ValueError(f"last axis {shape[-1]} is not divisible by simnorm dim {dim}")
    groups = x.reshape(*shape[:-1], shape[-1] // dim, dim)
    return jax.nn.softmax(groups, axis=-1).reshape(shape)


def layer_norm(name: str | None = None, eps: float = 1e-5) -> nn.LayerNorm:
    """flax LayerNorm with PyTorch's eps 1e-5 (flax defaults to 1e-6), for TD-MPC2
    (layers.py:50-72@b67b21c)."""
    return nn.LayerNorm(epsilon=eps, name=name)


def block_matmul(x: Array, kernel: Array) -> Array:
    """Block-first batched matmul: x (G, ..., I) and kernel (G, I, O) → (G, ..., O).

    With the block axis leading on both operands and the output, XLA runs one batched matmul with no
    transposed operand (a block axis in the middle of ``x``, as in ``"...gi,gio->...go"``, makes XLA
    transpose operands and results around the dot, several times slower on CPU).
    """
    return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (1,)), ((0,), (0,))))


@jax.custom_vjp
def matmul_pretransposed(x: Array, kernel: Array, kernel_t: Array) -> Array:
    """``x @ kernel`` whose input gradient multiplies by ``kernel_t`` (= kernel.T, given by the caller).

    x (..., I), kernel (I, O), kernel_t (O, I) → (..., O). Same values and gradients as ``x @ kernel``
    (``kernel_t`` gets none). The reverse pass of a recurrence runs one small ``g @ kernel.T`` per
    step; XLA's CPU dot with a transposed right operand is several times slower than with a
    row-major one at a few rows (measured 0.36 vs 0.06 ms at 16x512x192), so the transpose is made
    once, outside the loop.
    """
    return x @ kernel


def _matmul_pt_fwd(x: Array, kernel: Array, kernel_t: Array) -> tuple[Array, tuple[Array, Array]]:
    return x @ kernel, (x, kernel_t)


def _matmul_pt_bwd(res: tuple[Array, Array], g: Array) -> tuple[Array, Array, None]:
    x, kernel_t = res
    x2 = x.reshape(-1, x.shape[-1])
    g2 = g.reshape(-1, g.shape[-1])
    return g @ kernel_t, jax.lax.dot_general(x2, g2, (((0,), (0,)), ((), ()))), None


matmul_pretransposed.defvjp(_matmul_pt_fwd, _matmul_pt_bwd)


@jax.custom_vjp
def block_matmul_pretransposed(x: Array, kernel: Array, kernel_t: Array) -> Array:
    """:func:`block_matmul` whose input gradient uses ``kernel_t`` (G, O, I) = kernel transposed per block.

    x (G, M, I), kernel (G, I, O) → (G, M, O); see :func:`matmul_pretransposed` for why.
    """
    return block_matmul(x, kernel)


def _block_pt_fwd(x: Array, kernel: Array, kernel_t: Array) -> tuple[Array, tuple[Array, Array]]:
    return block_matmul(x, kernel), (x, kernel_t)


def _block_pt_bwd(res: tuple[Array, Array], g: Array) -> tuple[Array, Array, None]:
    x, kernel_t = res
    dkernel = jax.lax.dot_general(x, g, (((1,), (1,)), ((0,), (0,))))
    return block_matmul(g, kernel_t), dkernel, None


block_matmul_pretransposed.defvjp(_block_pt_fwd, _block_pt_bwd)


# --------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------


def rms_norm(x: Array, scale: Array, axis: int | tuple[int, ...] = -1, eps: float = RMS_EPS) -> Array:
    """x · rsqrt(mean(x², axis) + eps) · scale (:class:`RMSNorm` over ``axis``)."""
    ms = jnp.mean(jnp.square(x), axis=axis, keepdims=True)
    return x * jax.lax.rsqrt(ms + eps) * scale


def _matmul(layer: nn.Module, x: Array, kernel: Array) -> Array:
    """x @ kernel, by :func:`matmul_pretransposed` when the layer has a :data:`PREPARED` ``kernel_t``."""
    if layer.has_variable(PREPARED, "kernel_t"):
        return matmul_pretransposed(x, kernel, layer.get_variable(PREPARED, "kernel_t"))
    return x @ kernel


class RMSNorm(nn.Module):
    """y = x · rsqrt(mean(x², last axis) + eps) · scale; ``scale`` (F,) starts at ones, no offset.

    Input (..., F) → output (..., F) in the input dtype.
    """

    eps: float = RMS_EPS

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        return rms_norm(x, scale.astype(x.dtype), eps=self.eps)


def _make_norm(norm: str, name: str) -> nn.Module | None:
    if norm == "rms":
        return RMSNorm(name=name)
    if norm == "layer":
        return layer_norm(name=name)
    if norm == "none":
        return None
    raise KeyError(f"unknown norm {norm!r}; choose from 'rms', 'layer', 'none'")


class Dense(nn.Module):
    """Plain output layer x @ kernel + bias, without norm or activation.

    ``kernel`` (I, units) uses :func:`trunc_normal_fan_in` with ``outscale``; ``bias`` (units,)
    is zeros. Input (..., I) → output (..., units).
    """

    units: int
    outscale: float = 1.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        kernel = self.param(
            "kernel", trunc_normal_fan_in(self.outscale), (x.shape[-1], self.units), jnp.float32
        )
        bias = self.param("bias", nn.initializers.zeros, (self.units,), jnp.float32)
        x = jnp.asarray(x, self.dtype)
        return _matmul(self, x, kernel.astype(self.dtype)) + bias.astype(self.dtype)


class NormedDense(nn.Module):
    """Hidden layer: x @ kernel + bias → norm (submodule ``norm``) → activation (nets.py:594-635@2411f7d).

    Params ``{"kernel": (I, units), "bias": (units,), "norm": {"scale": (units,)}}`` for
    ``norm="rms"``; ``norm="layer"`` gives flax LayerNorm's ``scale``/``bias`` under ``norm``;
    ``norm="none"`` has no ``norm`` entry. Input (..., I) → output (..., units).
    """

    units: int
    act: str = "silu"
    norm: str = "rms"
    outscale: float = 1.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array, preactivation: Array | None = None) -> Array:
        """``preactivation``: x @ kernel + bias computed by the caller (e.g. several layers that read
        the same x in one matmul); the layer then applies only its norm and activation."""
        kernel = self.param(
            "kernel", trunc_normal_fan_in(self.outscale), (x.shape[-1], self.units), jnp.float32
        )
        bias = self.param("bias", nn.initializers.zeros, (self.units,), jnp.float32)
        if preactivation is not None:
            x = preactivation
        else:
            x = jnp.asarray(x, self.dtype)
            x = _matmul(self, x, kernel.astype(self.dtype)) + bias.astype(self.dtype)
        norm = _make_norm(self.norm, "norm")
        if norm is not None:
            x = norm(x)
        return get_act(self.act)(x)


def hidden_layers(
    x: Array,
    units: int,
    layers: int,
    prefix: str = "h",
    first: Array | None = None,
    act: str = "silu",
    norm: str = "rms",
) -> Array:
    """``layers`` × :class:`NormedDense` of width ``units``, named ``f"{prefix}{i}"``, in the calling
    module's scope (call it inside a compact method); ``first``: the first layer's preactivation when
    the caller computed it (see :class:`NormedDense`).

    Input (..., I) → output (..., units); zero layers return the input unchanged.
    """
    for i in range(layers):
        x = NormedDense(units, act=act, norm=norm, name=f"{prefix}{i}")(x, first if i == 0 else None)
    return x


class BlockLinear(nn.Module):
    """Block-diagonal linear layer with G blocks (DreamerV3 nets.py:638-701@2411f7d, used by the block GRU).

    The input (..., I) is laid out block-major (block g owns features [g·I'/G, (g+1)·I'/G)); it
    is zero-padded at the end to I' = G·ceil(I/G), reshaped to (..., G, I'/G), multiplied per
    block by ``kernel`` (G, I'/G, O/G), flattened block-major to (..., O) and ``bias`` (O,) is
    added. Then an optional RMSNorm over all O features (``norm/scale``) and the activation.
    The kernel's fan-in is the full input width I' (not I'/G).

    Input (..., I) → output (..., O) with O = ``units``, which must be divisible by G.
    """

    units: int
    blocks: int
    norm: bool = False
    act: str = "none"
    outscale: float = 1.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        g = self.blocks
        if self.units % g:
            raise ValueError(f"units={self.units} is not divisible by blocks={g}")
        x = jnp.asarray(x, self.dtype)
        pad = (-x.shape[-1]) % g
        if pad:
            x = jnp.concatenate([x, jnp.zeros((*x.shape[:-1], pad), x.dtype)], axis=-1)
        in_width = x.shape[-1]
        kernel = self.param(
            "kernel",
            trunc_normal_fan_in(self.outscale),
            (g, in_width // g, self.units // g),
            jnp.float32,
        )
        bias = self.param("bias", nn.initializers.zeros, (self.units,), jnp.float32)
        lead = x.shape[:-1]
        # Block axis first: (G, M, I/G) @ (G, I/G, O/G) is a plain batched matmul.
        x = jnp.swapaxes(x.reshape(-1, g, in_width // g), 0, 1)
        x = jnp.swapaxes(block_matmul(x, kernel.astype(self.dtype)), 0, 1)
        x = x.reshape(*lead, self.units) + bias.astype(self.dtype)
        if self.norm:
            x = RMSNorm(name="norm")(x)
        return get_act(self.act)(x)


class Conv(nn.Module):
    """2-D convolution on channel-last images → optional RMSNorm over channels (``norm/scale``) →
    activation (DreamerV3 nets.py:533-590@2411f7d).

    ``kernel`` (k, k, I, depth) uses :func:`trunc_normal_fan_in` (fan-in k·k·I, also when transposed)
    with ``outscale``; ``bias`` (depth,) zeros. SAME padding. ``transpose``: ``jax.lax.conv_transpose``
    (the kernel not flipped), which multiplies the height and width by ``stride``; otherwise a plain
    strided convolution, which divides them (rounding up). Both computed by
    :func:`~sb3_worldmodels.blocks.convolution.conv2d`.

    Input (..., H, W, I) → output (..., H', W', depth); leading axes are flattened around the call.
    """

    depth: int
    kernel: int
    stride: int = 1
    transpose: bool = False
    norm: bool = True
    act: str = "silu"
    outscale: float = 1.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        k = self.kernel
        shape = (k, k, x.shape[-1], self.depth)
        kernel = self.param("kernel", trunc_normal_fan_in(self.outscale), shape, jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (self.depth,), jnp.float32)
        lead = x.shape[:-3]
        x = jnp.asarray(x, self.dtype).reshape(-1, *x.shape[-3:])
        x = conv2d(x, kernel.astype(self.dtype), self.stride, self.transpose) + bias.astype(self.dtype)
        if self.norm:
            x = RMSNorm(name="norm")(x)
        x = get_act(self.act)(x)
        return x.reshape(*lead, *x.shape[1:])

"""flax.linen layers of both agents: dense, normed dense, block-linear and convolution layers, their
initialisers, norms (RMSNorm; PyTorch's LayerNorm) and activations.

A layer takes its kernel's initialiser (``kernel_init``; DreamerV3's fan-in truncated normal by
default) and its norm (``norm``: "rms", "layer" or "none") as arguments. Parameter names are
``<layer>/kernel``, ``<layer>/bias`` and ``<layer>/norm/scale`` (and ``norm/bias`` for a LayerNorm),
which map onto the references' state names one to one. Parameters are float32; ``dtype`` is the
compute dtype (float32 by default; :mod:`~sb3_worldmodels.blocks.precision`): a layer casts its input
and its parameters to it at use, so its output is in that dtype (a :class:`Dense` may return another,
``output_dtype``) and its parameters' gradients are float32. References: DreamerV3
nets.py:594-758,816-884@2411f7d and TD-MPC2 layers.py:7-97@b67b21c, init.py:4-22@b67b21c.
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
from sb3_worldmodels.blocks.random import hash_bernoulli
from sb3_worldmodels.blocks.softmax import softmax

Array = jax.Array
Initializer = Callable[[Array, Sequence[int], Any], Array]
T = TypeVar("T")

__all__ = [
    "LN_EPS",
    "PREPARED",
    "RMS_EPS",
    "TRUNC_NORMAL_STD_CORRECTION",
    "BlockLinear",
    "Conv",
    "Dense",
    "LayerNorm",
    "NormedDense",
    "RMSNorm",
    "block_matmul",
    "block_matmul_pretransposed",
    "dropout",
    "get_act",
    "hidden_layers",
    "init_from_one_draw",
    "is_mask",
    "layer_norm",
    "layer_norm_mish",
    "matmul_pretransposed",
    "mish",
    "rms_norm",
    "simnorm",
    "torch_default_uniform",
    "trunc_normal_fan_in",
]

TRUNC_NORMAL_STD_CORRECTION = 1.1368
"""≈ 1/0.8796, the std of a standard normal truncated to [−2, 2]; undoes the truncation
(nets.py:816-884@2411f7d)."""

RMS_EPS = 1e-4
"""Epsilon of :class:`RMSNorm` (DreamerV3 nets.py:728@2411f7d)."""

LN_EPS = 1e-5
"""Epsilon of :class:`LayerNorm`: PyTorch's ``nn.LayerNorm`` default (TD-MPC2 layers.py:50-72@b67b21c)."""

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


def torch_default_uniform(fan_in: int) -> Initializer:
    """U(−1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's default init of an ``nn.Conv2d``'s weight
    (``kaiming_uniform_(a=sqrt(5))``) and of its bias, fan_in = in·kh·kw (the bias's bound is the
    kernel's, so the caller gives the fan-in)."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: Array, shape: Sequence[int], dtype: Any = jnp.float32) -> Array:
        return jax.random.uniform(key, tuple(shape), dtype, -bound, bound)

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
    return softmax(groups).reshape(shape)


def _mean_rstd(x: Array, eps: float = LN_EPS) -> tuple[Array, Array]:
    """Mean and 1/sqrt(biased var + eps) over the last axis, (..., 1) each, from one pass over x
    (var = E[x²] − E[x]², clipped at 0): on CPU the two-pass form writes x − mean out before reducing
    it. Rounding grows with a row's |mean| / std = r, about 3e-7·(1 + r²) of the result (tested)."""
    mean = jnp.mean(x, -1, keepdims=True)
    var = jnp.maximum(jnp.mean(jnp.square(x), -1, keepdims=True) - jnp.square(mean), 0.0)
    return mean, jax.lax.rsqrt(var + eps)


def layer_norm(x: Array, scale: Array, bias: Array, eps: float = LN_EPS) -> Array:
    """PyTorch's LayerNorm over the last axis: (x − mean) / sqrt(biased var + eps) · scale + bias."""
    mean, rstd = _mean_rstd(x, eps)
    return (x - mean) * rstd * scale + bias


@jax.custom_vjp
def layer_norm_mish(y: Array, scale: Array, bias: Array) -> Array:
    """mish(layer_norm(y)), TD-MPC2's hidden-layer activation, with a hand-written backward pass.

    y (..., F), scale and bias (F,) → (..., F). The backward pass recomputes the forward from y (one
    saved array) and applies the closed forms of both derivatives; autodiff's version of the same
    math is about a third more elementwise work, which on CPU is as costly as the matmuls of a
    small layer. Gradients agree with autodiff to float32 rounding (tested).
    """
    return mish(layer_norm(y, scale, bias))


def _ln_mish_fwd(y: Array, scale: Array, bias: Array) -> tuple[Array, tuple[Array, Array, Array]]:
    return mish(layer_norm(y, scale, bias)), (y, scale, bias)


def _ln_mish_bwd(res: tuple[Array, Array, Array], g: Array) -> tuple[Array, Array, Array]:
    y, scale, bias = res
    mean, rstd = _mean_rstd(y)
    xhat = (y - mean) * rstd
    u = xhat * scale + bias
    e = jnp.exp(jnp.minimum(u, 20.0))
    n = e * (e + 2.0)
    inv = 1.0 / (n + 2.0)
    # mish(u) = u·n/(n + 2), n = eᵘ(eᵘ + 2): mish'(u) = n/(n + 2) + u·4eᵘ(eᵘ + 1)/(n + 2)²; above 20
    # the forward passes u through (:func:`mish`), so the second term is 0 there.
    gu = g * (n * inv + jnp.where(u > 20.0, 0.0, 4.0 * u * e * (e + 1.0) * inv * inv))
    lead = tuple(range(g.ndim - 1))
    gx = gu * scale
    dy = rstd * (gx - jnp.mean(gx, -1, keepdims=True) - xhat * jnp.mean(gx * xhat, -1, keepdims=True))
    return dy, jnp.sum(gu * xhat, lead), jnp.sum(gu, lead)


layer_norm_mish.defvjp(_ln_mish_fwd, _ln_mish_bwd)


def dropout(x: Array, key: Array, rate: float, masks: str = "hash") -> Array:
    """Inverted dropout: zero each element with probability ``rate``, scale the rest by 1/(1 − rate).

    ``masks``: "hash" draws the mask with :func:`~sb3_worldmodels.blocks.random.hash_bernoulli`
    (cheap on CPU), "threefry" with ``jax.random.bernoulli``. A bool ``key`` of x's shape is an
    explicit keep-mask instead (used by the parity tests to replay recorded masks).
    """
    if is_mask(key):
        keep = key
    elif masks == "threefry":
        keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    else:
        keep = hash_bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def is_mask(key: Array) -> bool:
    """Whether a dropout ``key`` is an explicit bool keep-mask rather than a PRNG key (trace-time)."""
    return getattr(key, "dtype", None) == jnp.bool_


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


class LayerNorm(nn.Module):
    """PyTorch's LayerNorm over the last axis (eps :data:`LN_EPS`): ``scale`` (F,) ones and ``bias``
    (F,) zeros; ``mish``: followed by Mish, with :func:`layer_norm_mish`'s backward pass.

    Input (..., F) → output (..., F) in the input dtype, computed in float32 (a bfloat16 input is
    cast up and the output back, as DreamerV3's layer norm, nets.py:742-752@2411f7d).
    """

    mish: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (x.shape[-1],), jnp.float32)
        y = jnp.asarray(x, jnp.float32)
        y = layer_norm_mish(y, scale, bias) if self.mish else layer_norm(y, scale, bias)
        return y.astype(x.dtype)


NORMS = ("rms", "layer", "none")
"""The norms a layer takes: :class:`RMSNorm`, :class:`LayerNorm` (PyTorch's) or none."""


def _norm_and_act(x: Array, norm: str, act: str, simnorm_dim: int) -> Array:
    """``norm`` (submodule "norm" of the calling compact method) then the activation ``act``; a
    LayerNorm followed by Mish runs as :func:`layer_norm_mish`. "simnorm" groups ``simnorm_dim``."""
    if norm not in NORMS:
        raise KeyError(f"unknown norm {norm!r}; choose from {NORMS}")
    if norm == "layer" and act == "mish":
        return LayerNorm(mish=True, name="norm")(x)
    if norm == "layer":
        x = LayerNorm(name="norm")(x)
    elif norm == "rms":
        x = RMSNorm(name="norm")(x)
    return simnorm(x, simnorm_dim) if act == "simnorm" else get_act(act)(x)


def _kernel_init(layer: Any) -> Initializer:
    """A layer's ``kernel_init``, or :func:`trunc_normal_fan_in` with its ``outscale``."""
    init: Initializer = layer.kernel_init or trunc_normal_fan_in(layer.outscale)
    return init


class Dense(nn.Module):
    """Plain output layer x @ kernel + bias, without norm or activation.

    ``kernel`` (I, units) from ``kernel_init`` (default :func:`trunc_normal_fan_in` with
    ``outscale``); ``bias`` (units,) zeros. Input (..., I) → output (..., units) in ``output_dtype``
    (None: the compute dtype ``dtype``); an output layer whose values parameterise a distribution
    returns float32 (DreamerV3 nets.py:437,443@2411f7d).
    """

    units: int
    outscale: float = 1.0
    kernel_init: Initializer | None = None
    dtype: Any = jnp.float32
    output_dtype: Any = None

    @nn.compact
    def __call__(self, x: Array) -> Array:
        kernel = self.param("kernel", _kernel_init(self), (x.shape[-1], self.units), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (self.units,), jnp.float32)
        x = jnp.asarray(x, self.dtype)
        y = _matmul(self, x, kernel.astype(self.dtype)) + bias.astype(self.dtype)
        return y if self.output_dtype is None else y.astype(self.output_dtype)


class NormedDense(nn.Module):
    """Hidden layer: x @ kernel + bias → [dropout] → norm (submodule ``norm``) → activation
    (DreamerV3 nets.py:594-635@2411f7d; TD-MPC2's NormedLinear, layers.py:50-72@b67b21c).

    Params ``{"kernel": (I, units), "bias": (units,), "norm": {"scale": (units,)}}`` for
    ``norm="rms"``, and ``"norm": {"scale", "bias"}`` for ``norm="layer"`` (PyTorch's LayerNorm);
    ``norm="none"`` has no ``norm`` entry. ``kernel`` from ``kernel_init`` (default
    :func:`trunc_normal_fan_in` with ``outscale``), ``bias`` zeros. ``act``: a :func:`get_act` name or
    "simnorm" (groups of ``simnorm_dim``). Input (..., I) → output (..., units).
    """

    units: int
    act: str = "silu"
    norm: str = "rms"
    outscale: float = 1.0
    kernel_init: Initializer | None = None
    simnorm_dim: int = 8
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(
        self, x: Array, preactivation: Array | None = None, drop: tuple[Array, float, str] | None = None
    ) -> Array:
        """``preactivation``: x @ kernel + bias computed by the caller (e.g. several layers that read
        the same x in one matmul); the layer then applies only its norm and activation. ``drop``:
        (key, rate, masks) of :func:`dropout`, applied before the norm."""
        kernel = self.param("kernel", _kernel_init(self), (x.shape[-1], self.units), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (self.units,), jnp.float32)
        if preactivation is not None:
            x = preactivation
        else:
            x = jnp.asarray(x, self.dtype)
            x = _matmul(self, x, kernel.astype(self.dtype)) + bias.astype(self.dtype)
        if drop is not None:
            x = dropout(x, *drop)
        return _norm_and_act(x, self.norm, self.act, self.simnorm_dim)


def hidden_layers(
    x: Array,
    units: int,
    layers: int,
    prefix: str = "h",
    first: Array | None = None,
    act: str = "silu",
    norm: str = "rms",
    kernel_init: Initializer | None = None,
    drop: tuple[Array, float, str] | None = None,
    dtype: Any = jnp.float32,
) -> Array:
    """``layers`` × :class:`NormedDense` of width ``units``, named ``f"{prefix}{i}"``, in the calling
    module's scope (call it inside a compact method); ``first``: the first layer's preactivation when
    the caller computed it, ``drop``: the first layer's dropout (see :class:`NormedDense`); ``dtype``:
    the compute dtype.

    Input (..., I) → output (..., units) in ``dtype``; zero layers return the input unchanged.
    """
    for i in range(layers):
        layer = NormedDense(
            units, act=act, norm=norm, kernel_init=kernel_init, dtype=dtype, name=f"{prefix}{i}"
        )
        x = layer(x, first if i == 0 else None, drop if i == 0 else None)
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
    """2-D convolution on channel-last images → norm over channels (``norm/...``) → activation
    (DreamerV3 nets.py:533-590@2411f7d; TD-MPC2's ``nn.Conv2d``, layers.py:142-147@eece801).

    ``kernel`` (k, k, I, depth) from ``kernel_init`` (default :func:`trunc_normal_fan_in`, fan-in
    k·k·I also when transposed, with ``outscale``); ``bias`` (depth,) from ``bias_init`` (default
    zeros). ``padding`` SAME or VALID. ``transpose``: ``jax.lax.conv_transpose`` (the kernel not
    flipped), which multiplies the height and width by ``stride``; otherwise a plain strided
    convolution (cross-correlation, as PyTorch's), which divides them. Both computed by
    :func:`~sb3_worldmodels.blocks.convolution.conv2d`.

    Input (..., H, W, I) → output (..., H', W', depth); leading axes are flattened around the call.
    """

    depth: int
    kernel: int
    stride: int = 1
    transpose: bool = False
    padding: str = "SAME"
    norm: str = "rms"
    act: str = "silu"
    outscale: float = 1.0
    kernel_init: Initializer | None = None
    bias_init: Initializer = nn.initializers.zeros
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        k = self.kernel
        shape = (k, k, x.shape[-1], self.depth)
        kernel = self.param("kernel", _kernel_init(self), shape, jnp.float32)
        bias = self.param("bias", self.bias_init, (self.depth,), jnp.float32)
        lead = x.shape[:-3]
        x = jnp.asarray(x, self.dtype).reshape(-1, *x.shape[-3:])
        kernel = kernel.astype(self.dtype)
        x = conv2d(x, kernel, self.stride, self.transpose, self.padding) + bias.astype(self.dtype)
        x = _norm_and_act(x, self.norm, self.act, 8)
        return x.reshape(*lead, *x.shape[1:])

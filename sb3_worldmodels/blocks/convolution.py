"""2-D convolutions on channel-last images, rearranged for XLA:CPU: the same sums as
``jax.lax.conv_general_dilated`` (SAME or VALID) / ``jax.lax.conv_transpose`` (SAME), several times faster
on a CPU at the few channels of pixel encoders and decoders, and without XLA:CPU's slow gradients
inside a scan loop.

Two rearrangements (benchmarks/conv_speed.py measures both):

* **Space to depth** (on a CPU). On an image whose sides are even, a stride-1 or stride-2 convolution is a
  stride-1 convolution of the image's 2x2 blocks (4x the channels) with a kernel of block offsets,
  and a stride-2 transposed convolution is a stride-1 convolution whose output channels are the
  2x2 blocks of the output. A convolution with few channels (3 to 4 at 64x64) then runs on 12 to 16,
  where XLA's kernels are efficient; no multiplication by the zeros of a dilated input is done.
* **Gradients as forward convolutions.** The stride-1 convolution's input gradient (a convolution of
  the output gradient with the flipped kernel) and weight gradient (the input and the output gradient
  correlated, batch and channel axes swapped) are written as forward convolutions with XLA's standard
  layouts. XLA:CPU computes its own form of the weight gradient inside a ``lax.scan`` body 20-100x
  slower than outside one (DreamerV3's training calls scan several updates).

A third form, :func:`conv2d_patches`, computes a convolution as one matmul of the image's patches: a
matrix unit then contracts k·k·I values at once instead of the I image channels of one tap.
:func:`conv2d`'s ``method`` chooses the block convolution, the patches or ``jax.lax``;
:data:`DEFAULT_CONV_METHOD` holds each backend's choice.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels.blocks.breaks import broken

Array = jax.Array

_NUMBERS = ("NHWC", "HWIO", "NHWC")
_BLOCK = 2
"""Side of the blocks of the space-to-depth rearrangement."""


CHUNK_IMAGES = 32
"""Images per step of the block convolutions' loops over a batch: the kernel gradient
(:func:`_weight_grad`) and, for kernels of at least :data:`CHUNK_MIN_TAPS` taps times input channels,
the forward pass and input gradient (:func:`conv_stride1`). A chunk's images stay in cache between
the rearrangements and the convolution (docs/lab/notes.md "Pixel convolutions on a CPU")."""

CHUNK_MIN_TAPS = 256
"""k·k·I from which :func:`conv_stride1` runs over chunks of images: on a CPU with AVX-512 a forward
pass over chunks took 0.6-0.9 times as long at k·k·I of 288-1,152 and 1.07-1.09 times at 108-144."""


def _correlate(x: Array, kernel: Array, pads: tuple[int, int]) -> Array:
    return jax.lax.conv_general_dilated(x, kernel, (1, 1), [pads, pads], dimension_numbers=_NUMBERS)


def _chunked(x: Array) -> Array:
    """``x`` (N, ...) zero-padded to whole chunks of :data:`CHUNK_IMAGES` images: (chunks, m, ...)."""
    n, m = x.shape[0], CHUNK_IMAGES
    chunks = -(-n // m)
    return jnp.pad(x, [(0, chunks * m - n)] + [(0, 0)] * (x.ndim - 1)).reshape(chunks, m, *x.shape[1:])


def _over_chunks(fn: Callable[[Array], Array], x: Array) -> Array:
    """``fn`` over chunks of :data:`CHUNK_IMAGES` images of ``x`` (N, ...), stacked back (the zero
    padding's results dropped)."""
    if x.shape[0] <= CHUNK_IMAGES:
        return fn(x)
    out = jax.lax.map(fn, _chunked(x))
    return out.reshape(-1, *out.shape[2:])[: x.shape[0]]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def conv_stride1(x: Array, kernel: Array, pads: tuple[int, int]) -> Array:
    """Stride-1 correlation: (N, H, W, I) with (k, k, I, O), ``pads`` = (low, high) zero padding of
    both spatial axes → (N, H + low + high − k + 1, W + ..., O); over chunks of images for large kernels."""
    if kernel.shape[0] * kernel.shape[1] * kernel.shape[2] < CHUNK_MIN_TAPS:
        return _correlate(x, kernel, pads)
    return _over_chunks(lambda xs: _correlate(xs, kernel, pads), x)


def _conv_stride1_fwd(x: Array, kernel: Array, pads: tuple[int, int]) -> tuple[Array, tuple[Array, Array]]:
    return conv_stride1(x, kernel, pads), (x, kernel)


def _conv_stride1_bwd(
    pads: tuple[int, int], residuals: tuple[Array, Array], grad: Array
) -> tuple[Array, Array]:
    x, kernel = residuals
    k = kernel.shape[0]
    low, high = pads
    # dx[v] = sum_i grad[v + low - i] kernel[i]: the flipped kernel, input and output channels swapped.
    flipped = jnp.swapaxes(kernel if broken("conv_input_grad_flip") else kernel[::-1, ::-1], 2, 3)
    dx = conv_stride1(grad, flipped, (k - 1 - low, k - 1 - high))
    return dx, _weight_grad(x, grad, pads)


def _weight_grad(x: Array, grad: Array, pads: tuple[int, int]) -> Array:
    """The stride-1 correlation's kernel gradient (k, k, I, O) for input ``x`` (N, H, W, I) and output
    gradient ``grad`` (N, H', W', O): dkernel[i, j, c, o] = sum_{n,h,w} x_padded[n, h + i, w + j, c]
    grad[n, h, w, o], a correlation with the images as the contracted channels and x's channels as the
    batch, summed over chunks of :data:`CHUNK_IMAGES` images (a zero-padded batch adds nothing), so
    that each chunk's images-last transpose stays in cache."""

    def correlate(xs: Array, gs: Array) -> Array:  # (m, ...) images → (I, k, k, O)
        return _correlate(jnp.transpose(xs, (3, 1, 2, 0)), jnp.transpose(gs, (1, 2, 0, 3)), pads)

    if x.shape[0] <= CHUNK_IMAGES:
        dkernel = correlate(x, grad)
    else:

        def add(total: Array, pair: tuple[Array, Array]) -> tuple[Array, None]:
            return total + correlate(*pair), None

        xs, gs = _chunked(x), _chunked(grad)
        dkernel, _ = jax.lax.scan(add, correlate(xs[0], gs[0]), (xs[1:], gs[1:]))
    return jnp.transpose(dkernel, (1, 2, 0, 3))


conv_stride1.defvjp(_conv_stride1_fwd, _conv_stride1_bwd)


def same_pads(size: int, k: int, stride: int, transpose: bool) -> tuple[int, int]:
    """(low, high) SAME padding of one spatial axis, as ``jax.lax`` computes it: for a convolution
    (``lax.padtype_to_pads``) or, ``transpose``, for ``lax.conv_transpose`` (on the dilated input)."""
    if transpose:
        total = k + stride - 2
        low = k - 1 if stride > k - 1 else math.ceil(total / 2)
        return low, total - low
    total = max((-(-size // stride) - 1) * stride + k - size, 0)
    return total // 2, total - total // 2


def _space_to_depth(x: Array) -> Array:
    """(N, H, W, C) → (N, H/2, W/2, 2·2·C), channels ordered (row phase, column phase, c)."""
    n, h, w, c = x.shape
    b = _BLOCK
    return (
        x.reshape(n, h // b, b, w // b, b, c)
        .transpose(0, 1, 3, 2, 4, 5)
        .reshape(n, h // b, w // b, b * b * c)
    )


def _depth_to_space(y: Array, channels: int) -> Array:
    """Inverse of :func:`_space_to_depth`: (N, H, W, 2·2·C) → (N, 2H, 2W, C)."""
    n, h, w, _ = y.shape
    b = _BLOCK
    return y.reshape(n, h, w, b, b, channels).transpose(0, 1, 3, 2, 4, 5).reshape(n, h * b, w * b, channels)


@functools.cache
def _block_taps(
    k: int, stride: int, low: int, transpose: bool, shift: int = 0
) -> tuple[np.ndarray, tuple[int, int]]:
    """One axis of the block kernel: a 0/1 array S (offsets, input phases, output phases, k) with
    S[d, q, p, i] = 1 where kernel tap i joins output phase p to input phase q of the block d − dmin
    away, and the (low, high) padding, in blocks, of the block convolution. ``shift``: input pixels
    every tap is moved by (0; the break ``conv_block_taps``)."""
    b = _BLOCK
    taps = []
    if transpose:  # output u = b·a + p reads dilated input u + i − low, nonzero at multiples of b
        for p in range(b):
            for i in range(k):
                t = p + i - low
                if t % b == 0:
                    taps.append((t // b, 0, p, i))
    else:  # output u = (b/stride)·a + p reads input stride·u + i − low = b·(a + d) + q
        for p in range(b // stride):
            for i in range(k):
                t = stride * p + i - low + shift
                taps.append((t // b, t % b, p, i))
    dmin = min(t[0] for t in taps)
    dmax = max(t[0] for t in taps)
    select = np.zeros(
        (dmax - dmin + 1, 1 if transpose else b, b if transpose else b // stride, k), np.float32
    )
    for d, q, p, i in taps:
        select[d - dmin, q, p, i] = 1.0
    return select, (-dmin, dmax)


CONV_METHODS = ("lax", "blocks", "patches")
"""How :func:`conv2d` computes: ``jax.lax``'s convolution, the block convolution (space to depth, module
docstring), or one matmul of the image's patches (:func:`conv2d_patches`)."""

DEFAULT_CONV_METHOD = {"cpu": "blocks"}
"""The method :func:`conv2d` uses on each backend (``jax.default_backend()``), "lax" where none is
named: the block convolution is XLA:CPU's fast form (benchmarks/conv_speed.py). A benchmark may
change an entry before it compiles, to time a whole program with another method."""


def conv2d(
    x: Array,
    kernel: Array,
    stride: int = 1,
    transpose: bool = False,
    padding: str = "SAME",
    method: str | None = None,
) -> Array:
    """2-D convolution, (N, H, W, I) with (k, k, I, O) → (N, H', W', O): equal (up to float rounding)
    to ``lax.conv_general_dilated(x, kernel, (s, s), padding)`` (SAME: H' = ceil(H/s); VALID:
    H' = (H − k) // s + 1) or, with ``transpose`` (SAME only), ``lax.conv_transpose(x, kernel, (s, s),
    "SAME")`` (H' = s·H, kernel not flipped).

    ``method`` (:data:`CONV_METHODS`; None: the backend's, :data:`DEFAULT_CONV_METHOD`): "blocks" runs
    strides 1 and 2 of square kernels on square images as one stride-1 block convolution (module
    docstring; a VALID convolution of an odd side first gets a zero row and column it never reads,
    and its output is cropped to H'); other strides, a SAME convolution of an odd side and rectangular
    images use ``jax.lax``. "patches" computes a convolution (not a transposed one, which uses the
    blocks) as :func:`conv2d_patches`.
    """
    _, h, w, _ = x.shape
    k = kernel.shape[0]
    if padding not in ("SAME", "VALID") or (transpose and padding != "SAME"):
        raise ValueError(f"conv2d: padding must be 'SAME' or (not transposed) 'VALID', got {padding!r}.")
    if method is None:
        method = DEFAULT_CONV_METHOD.get(jax.default_backend(), "lax")
    if method not in CONV_METHODS:
        raise ValueError(f"conv2d: method must be one of {CONV_METHODS}, got {method!r}.")
    if method == "patches" and not transpose:
        return conv2d_patches(x, kernel, stride, padding)
    valid = padding == "VALID"
    blocks_apply = h == w and (valid or h % _BLOCK == 0) and stride in (1, _BLOCK) and kernel.shape[1] == k
    if method == "lax" or not blocks_apply:
        strides = (stride, stride)
        if transpose:
            return jax.lax.conv_transpose(x, kernel, strides, "SAME", dimension_numbers=_NUMBERS)
        return jax.lax.conv_general_dilated(x, kernel, strides, padding, dimension_numbers=_NUMBERS)
    if valid:
        size = (h - k) // stride + 1
        if h % _BLOCK:
            x = jnp.pad(x, ((0, 0), (0, 1), (0, 1), (0, 0)))
        # The whole padded block output, then cropped: XLA:CPU runs a block convolution whose output
        # side equals its input's 3-5x faster than the smaller VALID one (forward and weight gradient;
        # TD-MPC2's first layer, 64x64: docs/lab/notes.md "Pixel convolutions on a CPU").
        return _conv2d_blocks(x, kernel, stride, False, 0)[:, :size, :size]
    low, _ = same_pads(h, k, stride, transpose)
    return _conv2d_blocks(x, kernel, stride, transpose, low)


def conv2d_patches(x: Array, kernel: Array, stride: int = 1, padding: str = "SAME") -> Array:
    """A convolution as one matmul: the image's patches, k·k static strided slices side by side
    ((N·H'·W', k·k·I), tap-major as the kernel's (k, k, I) axes), times the kernel as a (k·k·I, O)
    matrix. A matrix unit then contracts k·k·I values at once instead of I per tap (I = 3 or 9 image
    channels). Gradients by autodiff (a matmul, and slices' transposes). Same shapes as :func:`conv2d`."""
    n, h, w, channels = x.shape
    k, kw = kernel.shape[:2]
    if padding == "SAME":
        rows, cols = same_pads(h, k, stride, False), same_pads(w, kw, stride, False)
        x = jnp.pad(x, ((0, 0), rows, cols, (0, 0)))
    out_h, out_w = (x.shape[1] - k) // stride + 1, (x.shape[2] - kw) // stride + 1
    span_h, span_w = stride * (out_h - 1) + 1, stride * (out_w - 1) + 1
    taps = [x[:, i : i + span_h : stride, j : j + span_w : stride, :] for i in range(k) for j in range(kw)]
    patches = jnp.concatenate(taps, axis=-1).reshape(-1, k * kw * channels)
    return jnp.dot(patches, kernel.reshape(k * kw * channels, -1)).reshape(n, out_h, out_w, -1)


def _conv2d_blocks(x: Array, kernel: Array, stride: int, transpose: bool, low: int) -> Array:
    """:func:`conv2d` as a block convolution: even square sides, stride 1 or 2, ``low`` zero rows and
    columns before the image (those after it are implied)."""
    out = kernel.shape[-1]
    if transpose and stride == 1:  # conv_transpose at stride 1: a convolution with its padding
        transpose = False
    shift = 1 if broken("conv_block_taps") else 0
    select, pads = _block_taps(kernel.shape[0], stride, low, transpose, shift)
    offsets, in_phases, out_phases = select.shape[:3]
    s = jnp.asarray(select, kernel.dtype)
    # A 0/1 selection of the kernel's taps: exact at any matmul precision with HIGHEST.
    taps = jnp.einsum("aqpi,bwvj,ijco->abqwcpvo", s, s, kernel, precision=jax.lax.Precision.HIGHEST)
    block_kernel = taps.reshape(
        offsets, offsets, in_phases * in_phases * kernel.shape[2], out_phases * out_phases * out
    )
    y = conv_stride1(x if transpose else _space_to_depth(x), block_kernel, pads)
    return _depth_to_space(y, out) if out_phases > 1 else y

"""Image operations on channel-last (..., H, W, C) batches: the random-shift augmentation.

TD-MPC2's ``ShiftAug`` (tdmpc2/common/layers.py:36-59@eece801, adapted from DrQ-v2) pads each image
by replicating its border ``pad`` pixels wide, then samples it with ``F.grid_sample`` on a grid moved
by a whole number of pixels drawn per image in [0, 2·pad]: an integer translation, i.e. a crop of the
padded image. Here the crop is done directly (:func:`shift_images`), with the offsets as an input,
and the draw is a separate function of a PRNG key (:func:`random_shifts`).

The reference's bilinear sampling reproduces the crop up to float32 rounding of its sampling grid
(measured on 64×64 images: at most 1.3e-3 on pixel values 0-255; tests/fixtures/tdmpc2/README.md);
the crop here is exact and keeps the input dtype (uint8 stays uint8).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sb3_worldmodels.blocks.backend import gather_free

Array = jax.Array

SHIFT_PAD = 3
"""Padding (and largest offset / 2) of TD-MPC2's shift augmentation (``ShiftAug(pad=3)``,
layers.py:41,143@eece801)."""


def pad_replicate(images: Array, pad: int = SHIFT_PAD) -> Array:
    """(..., H, W, C) → (..., H + 2·pad, W + 2·pad, C): each border row and column repeated ``pad``
    times (``F.pad(x, (pad,) * 4, 'replicate')``, layers.py:50@eece801). Keeps the dtype."""
    widths = [(0, 0)] * (images.ndim - 3) + [(pad, pad), (pad, pad), (0, 0)]
    return jnp.pad(images, widths, mode="edge")


SHIFT_METHODS = ("slice", "select", "matmul")
"""How :func:`shift_images` crops: a dynamic slice per image (vmapped: one gather), a select among the
2·pad + 1 static crops of each axis, or two one-hot matmuls per image (rows, then columns). All exact."""

DEFAULT_SHIFT_METHOD: dict[str, str] = {}
"""A method :func:`shift_images` uses on a backend whatever the gather-free switch says (none named by
default; a benchmark may name one before it traces)."""


def shift_images(images: Array, shifts: Array, pad: int = SHIFT_PAD, method: str | None = None) -> Array:
    """The shift augmentation with given offsets: crop (H, W) of the replicate-padded image.

    Args:
        images: (..., H, W, C), any dtype (kept).
        shifts: (..., 2) integers in [0, 2·pad], one pair per image: ``shifts[..., 0]`` is the column
            (x, width) offset and ``shifts[..., 1]`` the row (y, height) offset, the order of the
            reference's grid (layers.py:54-58@eece801). Output pixel (i, j) is padded pixel
            (i + shifts[..., 1], j + shifts[..., 0]); offset ``pad`` in both is the identity.
        method: :data:`SHIFT_METHODS`. None: the backend's in :data:`DEFAULT_SHIFT_METHOD`, else
            "select" where the programs are gather-free (:func:`~sb3_worldmodels.blocks.backend.gather_free`:
            on accelerators, whose gathers are slow), "slice" elsewhere (on a CPU the fastest).

    Returns:
        (..., H, W, C) in the dtype of ``images``. Offsets outside [0, 2·pad] are clamped to it.
    """
    height, width, channels = images.shape[-3:]
    lead = images.shape[:-3]
    if shifts.shape != (*lead, 2):
        raise ValueError(f"shifts must have shape {(*lead, 2)} for images {images.shape}, got {shifts.shape}")
    if method is None:
        method = DEFAULT_SHIFT_METHOD.get(jax.default_backend(), "select" if gather_free() else "slice")
    if method not in SHIFT_METHODS:
        raise ValueError(f"shift_images: method must be one of {SHIFT_METHODS}, got {method!r}.")
    padded = pad_replicate(images, pad).reshape(-1, height + 2 * pad, width + 2 * pad, channels)
    offsets = jnp.clip(jnp.asarray(shifts, jnp.int32).reshape(-1, 2), 0, 2 * pad)
    if method == "select":
        return _shift_by_select(padded, offsets, height, width).reshape(images.shape)
    if method == "matmul":
        return _shift_by_matmul(padded, offsets, height, width).reshape(images.shape)

    def crop(image: Array, offset: Array) -> Array:
        return jax.lax.dynamic_slice(image, (offset[1], offset[0], 0), (height, width, channels))

    return jax.vmap(crop)(padded, offsets).reshape(images.shape)


def _shift_by_select(padded: Array, offsets: Array, height: int, width: int) -> Array:
    """(N, H + 2p, W + 2p, C) crops chosen per image among the static ones, rows then columns."""
    span = padded.shape[1] - height
    row_offset, col_offset = offsets[:, 1, None, None, None], offsets[:, 0, None, None, None]
    rows = padded[:, :height]
    for k in range(1, span + 1):
        rows = jnp.where(row_offset == k, padded[:, k : k + height], rows)
    out = rows[:, :, :width]
    for k in range(1, span + 1):
        out = jnp.where(col_offset == k, rows[:, :, k : k + width], out)
    return out


def _shift_by_matmul(padded: Array, offsets: Array, height: int, width: int) -> Array:
    """(N, H + 2p, W + 2p, C) crops as one-hot row and column selections: uint8 images multiplied in
    bfloat16 (exact for integers up to 256), others in float32 at full precision; sums in float32."""
    dtype = jnp.bfloat16 if padded.dtype == jnp.uint8 else jnp.float32
    rows = jax.nn.one_hot(offsets[:, 1, None] + jnp.arange(height), padded.shape[1], dtype=dtype)
    cols = jax.nn.one_hot(offsets[:, 0, None] + jnp.arange(width), padded.shape[2], dtype=dtype)
    out = jnp.einsum(
        "niy,nyxc,njx->nijc",
        rows,
        padded.astype(dtype),
        cols,
        preferred_element_type=jnp.float32,
        precision=jax.lax.Precision.HIGHEST,
    )
    return out.astype(padded.dtype)


def random_shifts(key: Array, batch_shape: tuple[int, ...], pad: int = SHIFT_PAD) -> Array:
    """(*batch_shape, 2) int32 offsets, each uniform on {0, ..., 2·pad}, independent per image and
    axis (``torch.randint(0, 2 * pad + 1, size=(n, 1, 1, 2))``, layers.py:56@eece801; another
    random stream)."""
    return jax.random.randint(key, (*batch_shape, 2), 0, 2 * pad + 1, jnp.int32)

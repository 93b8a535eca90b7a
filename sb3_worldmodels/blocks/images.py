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

Array = jax.Array

SHIFT_PAD = 3
"""Padding (and largest offset / 2) of TD-MPC2's shift augmentation (``ShiftAug(pad=3)``,
layers.py:41,143@eece801)."""


def pad_replicate(images: Array, pad: int = SHIFT_PAD) -> Array:
    """(..., H, W, C) → (..., H + 2·pad, W + 2·pad, C): each border row and column repeated ``pad``
    times (``F.pad(x, (pad,) * 4, 'replicate')``, layers.py:50@eece801). Keeps the dtype."""
    widths = [(0, 0)] * (images.ndim - 3) + [(pad, pad), (pad, pad), (0, 0)]
    return jnp.pad(images, widths, mode="edge")


def shift_images(images: Array, shifts: Array, pad: int = SHIFT_PAD) -> Array:
    """The shift augmentation with given offsets: crop (H, W) of the replicate-padded image.

    Args:
        images: (..., H, W, C), any dtype (kept).
        shifts: (..., 2) integers in [0, 2·pad], one pair per image: ``shifts[..., 0]`` is the column
            (x, width) offset and ``shifts[..., 1]`` the row (y, height) offset, the order of the
            reference's grid (layers.py:54-58@eece801). Output pixel (i, j) is padded pixel
            (i + shifts[..., 1], j + shifts[..., 0]); offset ``pad`` in both is the identity.

    Returns:
        (..., H, W, C) in the dtype of ``images``. Offsets outside [0, 2·pad] are clamped to it.
    """
    height, width, channels = images.shape[-3:]
    lead = images.shape[:-3]
    if shifts.shape != (*lead, 2):
        raise ValueError(f"shifts must have shape {(*lead, 2)} for images {images.shape}, got {shifts.shape}")
    padded = pad_replicate(images, pad).reshape(-1, height + 2 * pad, width + 2 * pad, channels)
    offsets = jnp.asarray(shifts, jnp.int32).reshape(-1, 2)

    def crop(image: Array, offset: Array) -> Array:
        return jax.lax.dynamic_slice(image, (offset[1], offset[0], 0), (height, width, channels))

    return jax.vmap(crop)(padded, offsets).reshape(images.shape)


def random_shifts(key: Array, batch_shape: tuple[int, ...], pad: int = SHIFT_PAD) -> Array:
    """(*batch_shape, 2) int32 offsets, each uniform on {0, ..., 2·pad}, independent per image and
    axis (``torch.randint(0, 2 * pad + 1, size=(n, 1, 1, 2))``, layers.py:56@eece801; another
    random stream)."""
    return jax.random.randint(key, (*batch_shape, 2), 0, 2 * pad + 1, jnp.int32)

"""The rearranged convolutions equal jax.lax's, values and gradients (blocks/convolution.py)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sb3_worldmodels.blocks import convolution
from sb3_worldmodels.blocks.convolution import conv2d, conv2d_patches, conv_stride1, same_pads

NUMBERS = ("NHWC", "HWIO", "NHWC")


def lax_conv(x, kernel, stride, transpose, padding="SAME"):
    strides = (stride, stride)
    if transpose:
        return jax.lax.conv_transpose(x, kernel, strides, "SAME", dimension_numbers=NUMBERS)
    return jax.lax.conv_general_dilated(x, kernel, strides, padding, dimension_numbers=NUMBERS)


CASES = [  # (side, in, out, kernel, stride, transpose[, padding])
    (8, 3, 4, 5, 1, False),
    (8, 4, 6, 5, 2, False),
    (8, 2, 3, 4, 2, False),
    (8, 2, 3, 3, 1, False),
    (4, 5, 4, 5, 2, True),
    (8, 3, 2, 5, 1, True),
    (8, 3, 2, 4, 1, True),
    (6, 2, 3, 4, 2, True),
    (6, 2, 3, 3, 2, True),
    (7, 2, 3, 5, 2, False),  # odd side: jax.lax itself
    (5, 2, 3, 5, 2, True),
    (16, 9, 4, 7, 2, False, "VALID"),  # TD-MPC2's pixel encoder: 7/2, 5/2, 3/2, 3/1
    (13, 4, 4, 5, 2, False, "VALID"),
    (7, 4, 4, 3, 2, False, "VALID"),
    (6, 4, 4, 3, 1, False, "VALID"),
    (9, 2, 3, 3, 1, False, "VALID"),
]


@pytest.mark.parametrize("case", CASES)
def test_conv2d_equals_lax_values_and_gradients(case):
    side, cin, cout, k, stride, transpose, *rest = case
    padding = rest[0] if rest else "SAME"
    rng = np.random.default_rng(side * 100 + cin * 10 + k)
    x = jnp.asarray(rng.normal(size=(3, side, side, cin)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(k, k, cin, cout)), jnp.float32)
    ours = conv2d(x, kernel, stride, transpose, padding)
    theirs = lax_conv(x, kernel, stride, transpose, padding)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    weights = jnp.asarray(rng.normal(size=theirs.shape), jnp.float32)

    def loss(conv):
        return lambda x, kernel: jnp.sum(weights * conv(x, kernel, stride, transpose, padding))

    ours_grads = jax.grad(loss(conv2d), (0, 1))(x, kernel)
    for g_ours, g_theirs in zip(ours_grads, jax.grad(loss(lax_conv), (0, 1))(x, kernel), strict=True):
        np.testing.assert_allclose(g_ours, g_theirs, rtol=1e-4, atol=1e-4)


def test_conv_stride1_gradients_inside_a_scan_equal_lax():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 3, 6, 6, 2)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(3, 3, 2, 4)), jnp.float32)

    def run(conv):
        def body(kernel, images):
            grad = jax.grad(lambda k: jnp.sum(jnp.sin(conv(images, k))))(kernel)
            return kernel - 0.1 * grad, None

        return jax.lax.scan(body, kernel, x)[0]

    ours = run(lambda images, k: conv_stride1(images, k, (1, 2)))
    theirs = run(
        lambda images, k: jax.lax.conv_general_dilated(
            images, k, (1, 1), [(1, 2)] * 2, dimension_numbers=NUMBERS
        )
    )
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("images", [8, 11])
@pytest.mark.parametrize("case", [(16, 9, 4, 7, 2, False, "VALID"), (8, 3, 2, 4, 2, True, "SAME")])
def test_chunks_of_images_equal_lax(monkeypatch, images, case):
    """Values, input and kernel gradients computed over chunks of images (4 here; a batch of 11 is
    zero-padded to 12) equal jax.lax's over the whole batch, for a VALID stride-2 convolution and a
    transposed one."""
    monkeypatch.setattr(convolution, "CHUNK_IMAGES", 4)
    side, cin, cout, k, stride, transpose, padding = case
    rng = np.random.default_rng(images)
    x = jnp.asarray(rng.normal(size=(images, side, side, cin)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(k, k, cin, cout)), jnp.float32)
    theirs = lax_conv(x, kernel, stride, transpose, padding)
    blocks = functools.partial(conv2d, method="blocks")
    ours = jax.jit(lambda x, kernel: blocks(x, kernel, stride, transpose, padding))(x, kernel)
    # Each output sums up to 7 * 7 * 9 products of normal numbers, in another order than lax's: its
    # float32 rounding, about 1e-6 of the outputs' scale (tens), depends on the CPU's kernels.
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6 * float(np.abs(theirs).max()))
    weights = jnp.asarray(rng.normal(size=theirs.shape), jnp.float32)

    def loss(conv):
        return lambda x, kernel: jnp.sum(weights * conv(x, kernel, stride, transpose, padding))

    ours_grads = jax.jit(jax.grad(loss(blocks), (0, 1)))(x, kernel)
    for g_ours, g_theirs in zip(ours_grads, jax.grad(loss(lax_conv), (0, 1))(x, kernel), strict=True):
        np.testing.assert_allclose(g_ours, g_theirs, rtol=1e-4, atol=1e-4)


def test_bad_padding_is_refused():
    x, kernel = jnp.zeros((1, 4, 4, 1)), jnp.zeros((3, 3, 1, 1))
    with pytest.raises(ValueError, match="padding"):
        conv2d(x, kernel, 2, True, "VALID")


def test_same_pads_match_lax():
    for size in (4, 5, 8, 64):
        for k in (1, 3, 4, 5, 7):
            for stride in (1, 2):
                assert same_pads(size, k, stride, False) == tuple(
                    jax.lax.padtype_to_pads((size,), (k,), (stride,), "SAME")[0]
                )


def test_methods_choose_the_program_on_any_backend():
    """``method="lax"`` is jax.lax's own program; "blocks" and "patches" other sums of the same
    products; the default on a CPU is "blocks"."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(2, 16, 16, 9)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(7, 7, 9, 4)), jnp.float32)
    lax_out = lax_conv(x, kernel, 2, False, "VALID")
    assert bool(jnp.all(conv2d(x, kernel, 2, padding="VALID", method="lax") == lax_out))
    blocks = conv2d(x, kernel, 2, padding="VALID", method="blocks")
    np.testing.assert_allclose(blocks, lax_out, rtol=1e-5, atol=1e-4)  # sums of 441 products ~ 20
    assert not bool(jnp.all(blocks == lax_out))  # another program: rounding differs somewhere
    assert bool(jnp.all(conv2d(x, kernel, 2, padding="VALID") == blocks))  # this test runs on a CPU
    with pytest.raises(ValueError, match="method must be one of"):
        conv2d(x, kernel, 2, padding="VALID", method="fft")


@pytest.mark.parametrize("case", CASES)
def test_patches_equal_lax_values_and_gradients(case):
    side, cin, cout, k, stride, transpose, *rest = case
    padding = rest[0] if rest else "SAME"
    rng = np.random.default_rng(side * 100 + cin * 10 + k + 1)
    x = jnp.asarray(rng.normal(size=(3, side, side, cin)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(k, k, cin, cout)), jnp.float32)
    weights = jnp.asarray(rng.normal(size=lax_conv(x, kernel, stride, transpose, padding).shape), jnp.float32)

    def loss(method):
        def conv(x, kernel):
            if method == "lax":
                return jnp.sum(weights * lax_conv(x, kernel, stride, transpose, padding))
            return jnp.sum(weights * conv2d(x, kernel, stride, transpose, padding, method=method))

        return conv

    np.testing.assert_allclose(loss("patches")(x, kernel), loss("lax")(x, kernel), rtol=1e-5, atol=1e-3)
    ours = jax.grad(loss("patches"), (0, 1))(x, kernel)
    for g_ours, g_theirs in zip(ours, jax.grad(loss("lax"), (0, 1))(x, kernel), strict=True):
        np.testing.assert_allclose(g_ours, g_theirs, rtol=1e-4, atol=1e-4)


def test_patches_of_a_rectangular_image_with_a_broken_tap_order_differ():
    """The patches' tap order must match the kernel's (k, k, I) layout: transposing the kernel's two
    spatial axes (a tap order of columns first) changes the result."""
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(2, 10, 12, 3)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(3, 3, 3, 5)), jnp.float32)
    expected = lax_conv(x, kernel, 1, False, "SAME")
    np.testing.assert_allclose(conv2d_patches(x, kernel, 1, "SAME"), expected, rtol=1e-5, atol=1e-5)
    swapped = conv2d_patches(x, jnp.swapaxes(kernel, 0, 1), 1, "SAME")
    assert float(jnp.max(jnp.abs(swapped - expected))) > 0.1

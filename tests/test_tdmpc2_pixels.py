"""TD-MPC2's pixel encoder and shift augmentation against numbers recorded from the reference code
(nicklashansen/tdmpc2 @eece801, tdmpc2/common/layers.py:36-71,136-164): every layer, the latent and
the parameter gradients of a scalar loss. See tests/fixtures/tdmpc2/README.md, "Pixel encoder"."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sb3_worldmodels.blocks.backend import gather_free_forms
from sb3_worldmodels.blocks.images import SHIFT_METHODS, SHIFT_PAD, pad_replicate, random_shifts, shift_images
from sb3_worldmodels.blocks.layers import simnorm
from sb3_worldmodels.tdmpc2 import networks as N
from tests.parity_helpers import (  # noqa: F401 (highest_precision: a fixture)
    TDMPC2_FIXTURES,
    assert_close,
    highest_precision,
    load_fixture,
)

pytestmark = pytest.mark.usefixtures("highest_precision")

CONVS = ("2", "4", "6", "8")  # the reference's Sequential indices of the convolutions
LAYERS = {  # our sown intermediate -> recorded output of the reference's Sequential
    "conv2": "out_2_conv",
    "relu3": "out_3_relu",
    "conv4": "out_4_conv",
    "relu5": "out_5_relu",
    "conv6": "out_6_conv",
    "relu7": "out_7_relu",
    "conv8": "out_8_conv",
}


@pytest.fixture(scope="module")
def rec() -> dict[str, np.ndarray]:
    return load_fixture(TDMPC2_FIXTURES / "pixel_encoder.npz")


def params_from_reference(rec: dict, prefix: str = "") -> dict:
    """Our parameter tree from the recorded state dict: Conv2d weight (out, in, kh, kw) → kernel
    (kh, kw, in, out)."""
    return {
        n: {
            "kernel": jnp.asarray(rec[f"{prefix}_encoder.rgb.{n}.weight"].transpose(2, 3, 1, 0)),
            "bias": jnp.asarray(rec[f"{prefix}_encoder.rgb.{n}.bias"]),
        }
        for n in CONVS
    }


def channel_last(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(x, -3, -1))


def channel_first(x) -> np.ndarray:
    return np.moveaxis(np.asarray(x), -1, -3)


def run(params: dict, obs, shifts=None) -> tuple[jax.Array, dict]:
    """The latent and the sown intermediates (first value of each)."""
    z, state = N.PixelEncoder().apply({"params": params}, obs, shifts, mutable=["intermediates"])
    return z, {k: v[0] for k, v in state["intermediates"].items()}


# ------------------------------------------------------------------------------------------------
# Shift augmentation (layers.py:36-59@eece801)
# ------------------------------------------------------------------------------------------------


def test_replicate_padding_matches_reference(rec):
    padded = pad_replicate(jnp.asarray(channel_last(rec["obs"])))
    assert padded.dtype == jnp.uint8 and padded.shape == (4, 70, 70, 9)
    np.testing.assert_array_equal(channel_first(padded).astype(np.float32), rec["shift_padded"])


def test_shift_matches_reference_grid_sample(rec):
    """The reference's grid_sample with integer shifts is the integer crop up to float32 rounding of its
    sampling grid (recorded: at most 1.3e-3 on 0-255 pixels); ours is the exact crop."""
    obs = jnp.asarray(channel_last(rec["obs"]))
    shifts = jnp.asarray(rec["shift_xy"])
    assert np.all((rec["shift_xy"] >= 0) & (rec["shift_xy"] <= 2 * SHIFT_PAD))
    out = shift_images(obs, shifts)
    assert out.dtype == jnp.uint8  # exact: the dtype is kept
    ref = rec["out_0_shiftaug"]
    assert_close("shifted", channel_first(out).astype(np.float32), ref)
    assert np.abs(channel_first(out) - ref).max() < 2e-3
    # the exact crop of the recorded padded image, offsets (x, y) = (column, row)
    padded = rec["shift_padded"]
    crop = np.stack([padded[n, :, y : y + 64, x : x + 64] for n, (x, y) in enumerate(rec["shift_xy"])])
    np.testing.assert_array_equal(channel_first(out).astype(np.float32), crop)
    # the (x, y) order matters: the recorded shifts have x != y
    swapped = shift_images(obs, shifts[:, ::-1])
    assert np.abs(channel_first(swapped).astype(np.float32) - ref).max() > 10


def test_shift_identity_and_leading_axes():
    images = jax.random.randint(jax.random.PRNGKey(0), (2, 3, 16, 16, 5), 0, 256).astype(jnp.uint8)
    centre = jnp.full((2, 3, 2), SHIFT_PAD)
    np.testing.assert_array_equal(shift_images(images, centre), images)
    shifts = random_shifts(jax.random.PRNGKey(1), (2, 3))
    flat = shift_images(images.reshape(6, 16, 16, 5), shifts.reshape(6, 2))
    np.testing.assert_array_equal(shift_images(images, shifts), flat.reshape(images.shape))
    # offset 0 in x moves the left border column in three times
    left = shift_images(images[:1, 0], jnp.asarray([[0, SHIFT_PAD]]))[0]
    for j in range(SHIFT_PAD + 1):
        np.testing.assert_array_equal(left[:, j], images[0, 0, :, 0])
    np.testing.assert_array_equal(left[:, SHIFT_PAD + 1 :], images[0, 0, :, 1:-SHIFT_PAD])
    with pytest.raises(ValueError, match="shifts must have shape"):
        shift_images(images, shifts[0])


@pytest.mark.parametrize("method", SHIFT_METHODS)
@pytest.mark.parametrize("dtype", [jnp.uint8, jnp.float32])
def test_every_shift_method_is_the_same_crop(method, dtype):
    """The backends' ways of the shift are the same exact crop (uint8 images and float ones), offsets
    out of range clamped alike, and the methods are told apart (a bad name is refused)."""
    key_images, key_float, key_shifts = jax.random.split(jax.random.PRNGKey(3), 3)
    images = jax.random.randint(key_images, (2, 3, 12, 12, 5), 0, 256).astype(dtype)
    if dtype == jnp.float32:  # values that bfloat16 would round
        images = images + jax.random.uniform(key_float, images.shape)
    shifts = random_shifts(key_shifts, (2, 3)).at[0, 0].set(jnp.asarray([-2, 9]))
    expected = jnp.stack(
        [
            pad_replicate(image)[
                min(max(y, 0), 6) : min(max(y, 0), 6) + 12, min(max(x, 0), 6) : min(max(x, 0), 6) + 12
            ]
            for image, (x, y) in zip(
                images.reshape(6, 12, 12, 5), np.asarray(shifts).reshape(6, 2), strict=True
            )
        ]
    ).reshape(images.shape)
    out = jax.jit(lambda i, s: shift_images(i, s, method=method))(images, shifts)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(ValueError, match="method must be one of"):
        shift_images(images, shifts, method="roll")


def test_the_gather_free_programs_shift_without_a_gather():
    """Where the programs are gather-free (accelerators; forced here) the shift is the select, the same
    crop; elsewhere the dynamic slices, one gather."""
    images = jax.random.randint(jax.random.PRNGKey(4), (6, 12, 12, 9), 0, 256).astype(jnp.uint8)
    shifts = random_shifts(jax.random.PRNGKey(5), (6,))
    with gather_free_forms(True):  # new functions: a traced function is cached whatever the form
        free = str(jax.make_jaxpr(lambda i, s: shift_images(i, s))(images, shifts))
        out = jax.jit(lambda i, s: shift_images(i, s))(images, shifts)
    with gather_free_forms(False):
        sliced = str(jax.make_jaxpr(lambda i, s: shift_images(i, s))(images, shifts))
        expected = jax.jit(lambda i, s: shift_images(i, s))(images, shifts)
    assert "gather" not in free and "gather" in sliced
    np.testing.assert_array_equal(out, expected)


def test_random_shift_draw():
    shifts = random_shifts(jax.random.PRNGKey(0), (4096,))
    assert shifts.shape == (4096, 2) and jnp.issubdtype(shifts.dtype, jnp.integer)
    values, counts = np.unique(np.asarray(shifts), return_counts=True)
    np.testing.assert_array_equal(values, np.arange(2 * SHIFT_PAD + 1))
    assert counts.min() > 0.8 * shifts.size / 7  # about uniform on {0, ..., 6}
    assert not np.array_equal(shifts, random_shifts(jax.random.PRNGKey(1), (4096,)))
    assert np.mean(np.asarray(shifts[:, 0]) == np.asarray(shifts[:, 1])) < 0.2  # x, y drawn apart


# ------------------------------------------------------------------------------------------------
# Encoder (layers.py:136-164@eece801)
# ------------------------------------------------------------------------------------------------


def test_parameter_layout_and_init(rec):
    """Our tree has the reference's names and (transposed) shapes; init is PyTorch's Conv2d default
    U(±1/sqrt(fan_in)), which the reference keeps (init.py:4-16@eece801 leaves convs alone)."""
    ours = N.init_pixel_encoder(jax.random.PRNGKey(0), (64, 64, 9))
    ref = params_from_reference(rec)
    shapes = lambda t: jax.tree_util.tree_map(lambda x: x.shape, t)  # noqa: E731
    assert shapes(ours) == shapes(ref)
    assert ours["2"]["kernel"].shape == (7, 7, 9, 32)
    for n, k, _ in N.PIXEL_CONVS:
        bound = 1 / np.sqrt(k * k * ours[n]["kernel"].shape[2])
        for leaf in ("kernel", "bias"):
            for tree in (ours, ref):
                assert np.abs(tree[n][leaf]).max() <= bound
        for tree in (ours, ref):  # U(−b, b) has std b/sqrt(3)
            assert abs(float(np.std(tree[n]["kernel"])) / (bound / np.sqrt(3)) - 1) < 0.05


def test_latent_width():
    assert N.pixel_feature_shape(64, 64) == (4, 4)
    assert N.pixel_latent_dim(64, 64, 32) == 512 == N.pixel_latent_dim()


def test_every_layer_matches_reference(rec):
    params = params_from_reference(rec)
    z, inter = run(params, jnp.asarray(channel_last(rec["obs"])), jnp.asarray(rec["shift_xy"]))
    assert_close("preprocessed", channel_first(inter["preprocessed"]), rec["out_0_shiftaug"] / 255.0 - 0.5)
    for ours, ref in LAYERS.items():
        assert_close(ours, channel_first(inter[ours]), rec[ref])
    assert_close("flat", inter["flat"], rec["out_9_flatten"])
    assert_close("latent", z, rec["out_10_simnorm"])
    np.testing.assert_allclose(np.asarray(z).reshape(4, 64, 8).sum(-1), 1.0, rtol=1e-6)


def test_conv_stack_matches_reference_on_its_shifted_input(rec):
    """The layers after ShiftAug alone: fed the reference's own shifted (float) images."""
    z, inter = run(params_from_reference(rec), jnp.asarray(channel_last(rec["out_0_shiftaug"])))
    for ours, ref in LAYERS.items():
        assert_close(ours, channel_first(inter[ours]), rec[ref])
    assert_close("latent", z, rec["out_10_simnorm"])


def test_flatten_order_matters(rec):
    """A channel-last (h, w, C) flatten of the same features gives another latent: the reference
    flattens channel-first (nn.Flatten on (N, C, h, w)), so each SimNorm group is 8 positions of one
    channel."""
    _, inter = run(
        params_from_reference(rec), jnp.asarray(channel_last(rec["obs"])), jnp.asarray(rec["shift_xy"])
    )
    wrong = simnorm(inter["conv8"].reshape(4, -1), 8)
    assert np.abs(np.asarray(wrong) - rec["out_10_simnorm"]).max() > 1e-2


def test_gradients_match_reference(rec):
    """d/dθ Σ latent·w for the recorded weights w. The last conv's bias adds the same constant to every
    element of its SimNorm groups (two rows of one channel), so its gradient is 0 analytically; the
    reference records float rounding (1.6e-7) there."""
    params = params_from_reference(rec)
    obs, shifts, w = (
        jnp.asarray(x) for x in (channel_last(rec["obs"]), rec["shift_xy"], rec["loss_weights"])
    )

    def loss_fn(p):
        return jnp.sum(N.PixelEncoder().apply({"params": p}, obs, shifts) * w)

    loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
    assert_close("loss", loss, rec["loss"])
    largest = max(np.abs(rec[k]).max() for k in rec if k.startswith("grad/"))  # 0.63 (6.bias)
    for n in CONVS:
        assert_close(
            f"grad {n}.weight", grads[n]["kernel"].transpose(3, 2, 0, 1), rec[f"grad/_encoder.rgb.{n}.weight"]
        )
        bias_ref = rec[f"grad/_encoder.rgb.{n}.bias"]
        if n == "8":
            assert np.abs(bias_ref).max() < 1e-5 * largest and np.abs(grads[n]["bias"]).max() < 1e-5 * largest
        else:
            assert_close(f"grad {n}.bias", grads[n]["bias"], bias_ref)
    # the last bias indeed does not move the latent
    moved = {**params, "8": {**params["8"], "bias": params["8"]["bias"] + 0.5}}
    np.testing.assert_allclose(
        N.PixelEncoder().apply({"params": moved}, obs, shifts), rec["out_10_simnorm"], rtol=1e-5, atol=1e-7
    )


def test_time_major_batches_equal_per_step_calls(rec):
    """(T, B, H, W, C) with per-image shifts equals one call per step (the reference's loop over the
    first axis of 5-D observations, world_model.py:110-111@eece801)."""
    params = params_from_reference(rec)
    obs = jnp.asarray(channel_last(rec["obs"])).reshape(2, 2, 64, 64, 9)
    shifts = jnp.asarray(rec["shift_xy"]).reshape(2, 2, 2)
    enc = jax.jit(lambda o, s: N.PixelEncoder().apply({"params": params}, o, s))
    z = enc(obs, shifts)
    assert z.shape == (2, 2, 512)
    for t in range(2):
        assert_close(f"step {t}", z[t], enc(obs[t], shifts[t]))
    assert_close("latent", z.reshape(4, 512), rec["out_10_simnorm"])

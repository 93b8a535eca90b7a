"""Parity of the DreamerV3 image encoder and decoder with the reference's recorded training step on an
image observation (tests/fixtures/dreamerv3/agent1m_image_*, fixture README "1m" agent with an image
observation): the "1m" CartPole-like agent with a 64 x 64 RGB image beside its 4-vector.

Loaded from the reference's initial parameters and run through one update with its recorded samples,
as tests/test_dreamerv3_parity.py does for vectors (same noise injection, same two-hot-mean
substitution, same tolerances); compared: every encoder convolution, the decoder's first map and every
transposed convolution on the recorded image, the embedding, the decoded images, both reconstruction
losses, every other loss and metric, and the optimiser moments after the update (whose ν = 0.001·g²
statistics square every gradient, the image layers' included). The recorded gradients themselves are
not kept in the repository (``DROPPED`` in tools/pack_fixtures.py); the vector agents' are compared
element by element in tests/test_dreamerv3_parity.py.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sb3_worldmodels.dreamerv3 import agent as A
from sb3_worldmodels.dreamerv3 import networks as N
from sb3_worldmodels.dreamerv3.config import DreamerV3Config, preset
from sb3_worldmodels.dreamerv3.reference_weights import flatten_tree, params_from_reference, path_to_ref
from tests.parity_helpers import DREAMERV3_METRICS as METRICS
from tests.parity_helpers import DREAMERV3_TERMS as TERMS
from tests.parity_helpers import assert_close, dreamerv3_update_record, moment_tree
from tests.test_dreamerv3_parity import (
    fixture_batch,
    initial_state,
    load,
    recorded_noise,
    reference_means,
)

PREFIX = "agent1m_image_"
PARAM_COUNT = 749_810  # the reference's optimised parameters (opt_param_count), 256-logit heads


def image_config() -> DreamerV3Config:
    return preset(
        "1m",
        obs_dim=4,
        obs_keys=(("vector", 4),),
        image_shape=(64, 64, 3),
        image_keys=(("image", 3),),
        action_dim=2,
        discrete=True,
        batch_size=2,
        batch_length=8,
    )


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    config = image_config()
    state = initial_state(config, load(f"{PREFIX}params_init"))
    params = state.params
    data = load(f"{PREFIX}batch")
    batch = {**fixture_batch(data, config), "image": data["image"]}
    forward = load(f"{PREFIX}forward")
    with reference_means():
        update = jax.jit(A.update_with_noise, static_argnames="config")
        new_state, metrics, latents, aux = update(config, state, batch, recorded_noise(forward, config))
    return {
        **dreamerv3_update_record(state, new_state, metrics, latents, aux),
        "config": config,
        "params": params,
        "batch": batch,
        "forward": forward,
        "train": load(f"{PREFIX}train_step"),
    }


def test_image_layers_map_one_to_one() -> None:
    config = image_config()
    flat = load(f"{PREFIX}params_init")
    params, _ = params_from_reference(flat, config)
    padding = 2 * (config.units + 1)  # the reference's 256th reward/critic logit
    assert A.param_count(config) + padding == PARAM_COUNT
    image_layers = {
        path_to_ref(p) for p in flatten_tree(params) if p[1].startswith(("conv", "space", "imgout"))
    }
    assert image_layers == {k for k in flat if "/conv" in k or "/space" in k or "/imgout" in k}
    assert config.embed_dim == 64 + 4 * 4 * 16 and params["dyn"]["obs0"]["kernel"].shape == (512 + 320, 64)


def _intermediates(module: nn.Module, params: dict, *args: Any) -> dict[str, np.ndarray]:
    """Each submodule's output of one ``module.apply`` by name (flax's captured intermediates)."""
    _, state = module.apply({"params": params}, *args, capture_intermediates=True, mutable=["intermediates"])
    return {k: np.asarray(v["__call__"][0]) for k, v in state["intermediates"].items() if k != "__call__"}


def test_encoder_and_decoder_layers(run: dict[str, Any]) -> None:
    """Row 0, trained step 0 through every convolution (fixture: one image through every layer)."""
    config, params, fw = run["config"], run["params"], run["forward"]
    nets = N.make_networks(config)
    image = run["batch"]["image"][0:1, 1]
    obs = {"vector": run["batch"]["obs"][0:1, 1], "image": image}
    enc = _intermediates(nets.enc, params["enc"], obs)
    for i in range(5):
        assert_close(f"encoder conv{i}", enc[f"conv{i}"], fw[f"enc/conv{i}"])
    feat = N.features(jnp.asarray(fw["obs/deter"][0:1, 0]), jnp.asarray(fw["obs/stoch"][0:1, 0]))
    dec = _intermediates(nets.dec, params["dec"], feat)
    for i in range(4):
        assert_close(f"decoder conv{i}", dec[f"conv{i}"], fw[f"dec/conv{i}"])
    assert_close("decoder output conv", dec["imgout"], fw["dec/imgout"])
    assert_close("decoded image", jax.nn.sigmoid(dec["imgout"]), fw["dec/image_mean_row0_t0"])


def test_decoder_first_map(run: dict[str, Any]) -> None:
    """The 4 x 4 map the decoder starts from, for all 16 rows: space0 (block-linear from deter, laid
    out (G, h, w, c) → (h, w, G·c)), space1hid and space1 (from stoch), their normed sum."""
    config, params, fw = run["config"], run["params"], run["forward"]
    feat = N.features(jnp.asarray(fw["obs/deter"]), jnp.asarray(fw["obs/stoch"])).reshape(16, -1)
    dec = _intermediates(N.make_networks(config).dec, params["dec"], feat)
    assert_close("space0", dec["space0"], fw["dec/space0_raw"])
    assert_close("space1hid", dec["space1hid"], fw["dec/space1hid"])
    assert_close("space1", dec["space1"].reshape(16, 4, 4, 16), fw["dec/space1"])
    assert_close("space map", jax.nn.silu(dec["spacenorm"]), fw["dec/space"])


def test_forward_and_losses(run: dict[str, Any]) -> None:
    r, fw, train, metrics = run["internals"], run["forward"], run["train"], run["metrics"]
    assert_close("embed", r["embed"], fw["enc/embed"])
    assert_close("posterior deter", r["post_deter"], fw["obs/deter"])
    assert_close("posterior logits", r["post_logits"], fw["obs/logit"])
    np.testing.assert_array_equal(r["post_stoch"], fw["obs/stoch"])
    assert_close("decoded vector", r["dec_out"]["vector"], fw["dec/vector_out_symlog"])
    assert_close("decoded images", r["dec_out"]["image"][:, :, ::4, ::4], fw["dec/image_mean_stride4"])
    assert_close("image loss", r["losses"]["rec_image"], fw["loss/image"])
    assert_close("vector loss", r["losses"]["rec"], fw["loss/vector"])
    # The reference's image_loss metric is XLA's fused sum of 196,608 squares (README: 924.18994
    # against 924.19438 in float64): compared at 1e-5.
    assert_close(
        "image_loss metric", metrics["rec_image_loss"], train["image_loss"], rtol=1e-5, scale_tol=0.0
    )
    for ours, (ref, scale) in TERMS.items():
        assert_close(f"{ours} loss", scale * r["losses"][ours], fw[f"losses_scaled/{ref}_loss"])
        assert_close(f"{ours}_loss metric", metrics[f"{ours}_loss"], train[f"{ref}_loss"])
    assert_close("total loss", metrics["loss"], fw["loss/total"], rtol=1e-5, scale_tol=0.0)
    for ours, ref in METRICS.items():
        if ours == "value_std":
            assert abs(float(metrics[ours]) - float(train[ref])) <= 1e-6, ours
            continue
        assert_close(ours, metrics[ours], train[ref], rtol=1e-4 if "norm" in ours else 2e-5, scale_tol=0.0)


def test_optimizer_moments_after_the_update(run: dict[str, Any]) -> None:
    """ν and μ after the update, as whole-tensor statistics [Σx, Σ|x|, max|x|] (the fixture stores no
    elements): ν = 0.001·g² checks every gradient's square; μ = 0.1·g/√ν̂ is ±0.1 where g is not tiny,
    so its Σx (sign cancellations) is left out and Σ|x|, max|x| compared. The reference's unread 256th
    reward and critic logits get no gradient, so their zero moments leave the statistics as ours."""
    after = load(f"{PREFIX}params_after_train")
    opt_state = run["state"].opt_state
    rms, momentum = opt_state.inner_state[1], opt_state.inner_state[2]
    assert int(after["agent/opt/state/rms_count"]) == int(rms.count) == 1
    params = run["state"].params
    for key, vector, rtol in (("rms_nu", rms.nu, 2e-4), ("momentum_mu", momentum.mu, 1e-3)):
        for path, value in flatten_tree(moment_tree(vector, params)).items():
            ref = after[f"stats/{key}/{path_to_ref(path)}"]
            ours = np.asarray(value, np.float64).reshape(-1)
            stats = np.array([ours.sum(), np.abs(ours).sum(), np.abs(ours).max()])
            chosen = slice(0, 3) if key == "rms_nu" else slice(1, 3)
            np.testing.assert_allclose(
                stats[chosen], ref[chosen], rtol=rtol, atol=1e-12, err_msg=f"{key} {path}"
            )

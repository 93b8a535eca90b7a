"""Tests of sb3_worldmodels.blocks.optim against the reference optimiser fixture and closed forms."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sb3_worldmodels import blocks as B
from tests.parity_helpers import load_fixture, moment_tree

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = ("kernel", "bias", "scale")


def load() -> dict[str, np.ndarray]:
    return load_fixture(FIXTURES / "dreamerv3" / "optimizer.npz")


def tree(fx: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {n: fx[f"{prefix}_{n}"] for n in NAMES}


def assert_tree_close(actual: dict, expected: dict, rtol: float, atol: float, what: str) -> None:
    for n in NAMES:
        np.testing.assert_allclose(actual[n], expected[n], rtol=rtol, atol=atol, err_msg=f"{what}/{n}")


def test_stages_match_reference_transforms() -> None:
    """AGC, RMS and momentum outputs at each of the 5 steps, fed the pre-step params."""
    fx = load()
    stages = [
        B.scale_by_agc(0.3, 1e-3),
        B.scale_by_rms_corrected(0.999, 1e-20),
        B.scale_by_momentum_corrected(0.9),
    ]
    keys = ("after_agc", "after_rms", "after_momentum")

    @jax.jit
    def run(grads: dict, states: list, params: dict) -> tuple[list, list]:
        outs, new_states = [], []
        for stage, state in zip(stages, states, strict=True):
            grads, state = stage.update(grads, state, params)
            outs.append(grads)
            new_states.append(state)
        return outs, new_states

    params = tree(fx, "init")
    states = [s.init(params) for s in stages]
    for i in range(5):
        outs, states = run(tree(fx, f"step{i}_grad"), states, params)
        for key, out in zip(keys, outs, strict=True):
            assert_tree_close(out, tree(fx, f"step{i}_{key}"), 1e-5, 1e-12, f"step{i}/{key}")
        params = tree(fx, f"step{i}_params")


def test_laprop_matches_reference_over_five_steps() -> None:
    fx = load()
    params = {n: jnp.asarray(v) for n, v in tree(fx, "init").items()}
    opt = B.laprop(learning_rate=4e-5, beta1=0.9, beta2=0.999, eps=1e-20, agc=0.3, pmin=1e-3, warmup=1000)
    state = opt.init(params)

    @jax.jit
    def step(grads: dict, state: optax.OptState, params: dict) -> tuple[dict, optax.OptState, dict]:
        updates, state = opt.update(grads, state, params)
        return updates, state, optax.apply_updates(params, updates)

    for i in range(5):
        updates, state, params = step(tree(fx, f"step{i}_grad"), state, params)
        assert_tree_close(updates, tree(fx, f"step{i}_update"), 1e-5, 1e-15, f"step{i}/update")
        assert_tree_close(params, tree(fx, f"step{i}_params"), 1e-6, 1e-9, f"step{i}/params")
        rms, mom, warm = state.inner_state[1], state.inner_state[2], state.inner_state[4]
        nu, mu = moment_tree(rms.nu, params), moment_tree(mom.mu, params)
        assert_tree_close(nu, tree(fx, f"step{i}_state_rms_nu"), 1e-5, 1e-20, f"step{i}/nu")
        assert_tree_close(mu, tree(fx, f"step{i}_state_momentum_mu"), 1e-5, 1e-12, f"step{i}/mu")
        assert int(rms.count) == fx[f"step{i}_state_rms_count"]
        assert int(mom.count) == fx[f"step{i}_state_momentum_count"]
        assert int(warm.count) == fx[f"step{i}_opt_step_after"]
        if i == 0:  # warmup factor 0/1000: the first update is exactly zero
            for n in NAMES:
                np.testing.assert_array_equal(updates[n], 0.0)


def test_first_full_rate_update_is_minus_lr_times_sign() -> None:
    """With bias correction, step 1 of RMS gives g/|g| and of momentum gives its input."""
    params = {"w": jnp.array([1.0, -2.0, 3.0]), "z": jnp.zeros(2)}
    grads = {"w": jnp.array([1e-4, -2e-4, 0.0]), "z": jnp.array([1e-5, -1e-5])}
    opt = B.laprop(learning_rate=0.1, warmup=0)
    updates, _ = jax.jit(opt.update)(grads, opt.init(params), params)
    # (1 − β₂^t in float32 differs from 1 − β₂ by 1.3e-5 relative, hence the tolerance.)
    np.testing.assert_allclose(updates["w"], [-0.1, 0.1, 0.0], rtol=2e-5)
    np.testing.assert_allclose(updates["z"], [-0.1, 0.1], rtol=2e-5)


def test_agc_closed_form() -> None:
    agc = B.scale_by_agc(clip=0.3, pmin=1e-3)
    params = {"big": jnp.full((4,), 10.0), "zero": jnp.zeros(3), "small": jnp.full((4,), 10.0)}
    grads = {"big": jnp.full((4,), 5.0), "zero": jnp.array([1.0, 0.0, 0.0]), "small": jnp.full((4,), 0.5)}
    out, _ = jax.jit(agc.update)(grads, agc.init(params), params)
    # ‖w‖ = 20 → limit 6; ‖g‖ = 10 is clipped to norm 6.
    np.testing.assert_allclose(np.linalg.norm(out["big"]), 6.0, rtol=1e-6)
    np.testing.assert_allclose(out["big"], grads["big"] * 0.6, rtol=1e-6)
    # A zero tensor has limit 0.3·1e-3.
    np.testing.assert_allclose(out["zero"], [3e-4, 0.0, 0.0], rtol=1e-5)
    # Below the limit nothing changes.
    np.testing.assert_array_equal(out["small"], grads["small"])


def test_warmup_factor_sequence() -> None:
    warm = B.scale_by_warmup(4)
    state = warm.init({"x": jnp.zeros(())})
    update = jax.jit(warm.update)
    factors = []
    for _ in range(7):
        out, state = update({"x": jnp.ones(())}, state)
        factors.append(float(out["x"]))
    np.testing.assert_allclose(factors, [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0], rtol=1e-7)
    assert int(state.count) == 7


def test_learning_rate_changes_without_recompiling() -> None:
    params = {"w": jnp.array([1.0, -1.0])}
    grads = {"w": jnp.array([1e-3, -2e-3])}
    opt = B.laprop(learning_rate=1e-3, warmup=0)
    traces = []

    @jax.jit
    def step(state: optax.OptState) -> jax.Array:
        traces.append(1)
        updates, _ = opt.update(grads, state, params)
        return updates["w"]

    state = opt.init(params)
    assert B.get_learning_rate(state).dtype == jnp.float32
    first = step(state)
    state = B.with_learning_rate(state, 4e-3)
    np.testing.assert_allclose(B.get_learning_rate(state), 4e-3, rtol=1e-7)
    second = step(state)
    np.testing.assert_allclose(second, 4 * np.asarray(first), rtol=1e-6)
    assert len(traces) == 1
    # The setter finds the state inside a larger pytree and leaves everything else alone.
    agent = {"opt": state, "step": jnp.int32(3), "name": None}
    agent = B.with_learning_rate(agent, 2e-3)
    np.testing.assert_allclose(B.get_learning_rate(agent["opt"]), 2e-3, rtol=1e-7)
    assert int(agent["step"]) == 3 and agent["name"] is None
    # Assigning the documented dict entry works too.
    state.hyperparams["learning_rate"] = jnp.float32(1e-3)
    np.testing.assert_allclose(step(state), first, rtol=1e-6)
    assert len(traces) == 1

"""Each test-only break switch (sb3_worldmodels.blocks.breaks) changes the result of the term it names,
and nothing when off; tools/break_one_term.py then checks that the parity tests catch each one."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sb3_worldmodels.blocks import breaks
from sb3_worldmodels.blocks.convolution import conv2d
from sb3_worldmodels.blocks.jit import COMPILER_OPTIONS
from sb3_worldmodels.blocks.optim import laprop
from sb3_worldmodels.dreamerv3 import agent as A
from sb3_worldmodels.dreamerv3.config import preset as dreamer_preset
from sb3_worldmodels.tdmpc2 import agent as core
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS
from sb3_worldmodels.tdmpc2.config import preset as tdmpc2_preset

Observe = Callable[[Any], Any]

COMPILED_ONCE = {**COMPILER_OPTIONS, "xla_backend_optimization_level": 0}
"""XLA options of the updates below: each switch's update is compiled for one call, and without LLVM's
optimisations it compiles in about half the time (what it computes is the same program)."""


def compile_once(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn(config, ...)`` jitted with ``config`` static, under :data:`COMPILED_ONCE`."""
    return jax.jit(fn, static_argnums=0, compiler_options=COMPILED_ONCE)


def differs(a: Any, b: Any) -> bool:
    leaves = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    return any(not np.array_equal(np.asarray(x), np.asarray(y)) for x, y in leaves)


def test_unknown_names_are_refused():
    with pytest.raises(KeyError, match="unknown break 'rhoo'"):
        breaks.broken("rhoo")
    with pytest.raises(KeyError, match=r"unknown breaks \['nope'\]"):
        with breaks.switched_on("nope"):
            pass
    assert not any(breaks.broken(name) for name in breaks.BREAKS)  # all off outside switched_on


# ------------------------------------------------------------------------------------------------
# TD-MPC2: one update from a state whose every term is active
# ------------------------------------------------------------------------------------------------

TDMPC2_TERMS: dict[str, Observe] = {
    "consistency_coef": lambda out: out[1]["total_loss"],
    "rho": lambda out: (out[1]["reward_loss"], out[1]["value_loss"]),
    "td_discount": lambda out: out[2]["internals"]["td_targets"],
    "td_stop_gradient": lambda out: out[0].params["encoder"],
    "running_scale": lambda out: out[1]["pi_loss"],
    "running_scale_rate": lambda out: out[1]["pi_scale"],
    "world_model_clip": lambda out: out[0].params["dynamics"],
    "policy_clip": lambda out: out[0].params["pi"],
    "stale_pi_grad": lambda out: out[1]["grad_norm"],
    "encoder_lr": lambda out: out[0].params["encoder"],
    "target_tau": lambda out: out[0].target_qs,
    "entropy_coef": lambda out: out[1]["pi_loss"],
}


@functools.cache
def tdmpc2_case() -> tuple[Any, Any, dict, Any]:
    """(config, state, batch, noise): the state after one update (Adam moments, a stale policy
    gradient, Q members apart from their targets), the RunningScale at 2.5, both clips active (the
    world model's gradient norm is about 5.8 and the policy's about 0.006 against 0.005); computed
    with no switch on."""
    config = tdmpc2_preset(**{**SMOKE_SETTINGS, "obs_dim": 3, "action_dim": 2, "grad_clip_norm": 0.005})
    h, b = config.horizon, config.batch_size
    rng = np.random.default_rng(0)
    batch = {
        "obs": jnp.asarray(rng.normal(size=(h + 1, b, 3)), jnp.float32),
        "action": jnp.asarray(rng.uniform(-1, 1, size=(h, b, 2)), jnp.float32),
        "reward": jnp.asarray(rng.normal(size=(h, b)), jnp.float32),
    }
    state = core.init_state(config, jax.random.PRNGKey(0))
    # core.train_step, through the program the unbroken update below uses (one compilation fewer)
    key, noise_key = jax.random.split(state.key)
    first_noise = core.sample_update_noise(config, noise_key, b)
    state, _, _ = compile_once(core.update_with_noise)(config, state, batch, first_noise)
    state = state._replace(key=key, scale=state.scale._replace(value=jnp.float32(2.5)))
    noise = core.sample_update_noise(config, jax.random.PRNGKey(1), b)
    return config, state, batch, noise


def tdmpc2_update() -> Any:
    config, state, batch, noise = tdmpc2_case()
    return compile_once(core.update_with_noise)(config, state, batch, noise)


@functools.cache
def tdmpc2_unbroken() -> Any:
    return tdmpc2_update()


def test_the_tdmpc2_breaks_are_all_listed():
    listed = {name for name, brk in breaks.BREAKS.items() if brk.agent == "tdmpc2"}
    assert listed == set(TDMPC2_TERMS)


@pytest.mark.parametrize("name", sorted(TDMPC2_TERMS))
def test_each_tdmpc2_switch_changes_its_term(name):
    observe = TDMPC2_TERMS[name]
    tdmpc2_unbroken()  # the case and the unbroken update, computed before switching (and cached)
    with breaks.switched_on(name):
        broken = tdmpc2_update()
    assert differs(observe(broken), observe(tdmpc2_unbroken()))


# ------------------------------------------------------------------------------------------------
# DreamerV3: the update's terms on a tiny model with a vector and an image; the optimiser's and the
# convolutions' on their own functions
# ------------------------------------------------------------------------------------------------

B, T = 2, 3

DREAMERV3_TERMS: dict[str, Observe] = {
    "rep_scale": lambda out: out[1]["loss"],
    "repval_scale": lambda out: out[1]["loss"],
    "image_loss_scale": lambda out: out[1]["loss"],
    "free_nats": lambda out: out[3]["internals"]["losses"]["dyn"],
    "rep_stop_gradient": lambda out: out[3]["grads"]["dyn"],
    "continue_target": lambda out: out[3]["internals"]["losses"]["con"],
    "imagination_weight": lambda out: out[3]["internals"]["img_weight"],
    "lambda": lambda out: out[3]["internals"]["ret"],
    "retnorm_rate": lambda out: out[0].retnorm,
    "return_normaliser": lambda out: out[3]["internals"]["adv"],
    "slowreg": lambda out: out[3]["internals"]["losses"]["critic"],
    "actor_entropy": lambda out: out[3]["internals"]["losses"]["actor"],
    "slow_critic_copy": lambda out: out[0].slow_critic,
    "slow_critic_rate": lambda out: out[0].slow_critic,
    "pixel_offset": lambda out: out[3]["internals"]["embed"],
    "decoder_space_layout": lambda out: out[3]["internals"]["dec_out"]["image"],
}
"""Switches observed on one update (the slow critic's copy from the first update, its rate from the
second), the others on the optimiser and the convolution below."""

IMAGE_TERMS = frozenset({"image_loss_scale", "pixel_offset", "decoder_space_layout"})
"""The switches whose terms need an image; the others are observed on the same model without one,
whose update compiles in about half the time."""


@functools.cache
def dreamerv3_case(image: bool) -> tuple[Any, Any, dict, Any]:
    config = dreamer_preset(
        "1m",
        obs_dim=3,
        action_dim=2,
        discrete=True,
        image_shape=(32, 32, 3) if image else None,
        cnn_depth=2,
        batch_size=B,
        batch_length=T,
        units=16,
        deter=32,
        hidden=16,
        classes=4,
        stoch=4,
        blocks=4,
        imag_horizon=3,
    )
    rng = np.random.default_rng(0)
    shape = (B, T + 1)
    is_last = np.zeros(shape, bool)
    is_last[0, -1] = True
    batch = {
        "obs": rng.normal(size=(*shape, 3)).astype(np.float32),
        **({"image": rng.integers(0, 256, (*shape, 32, 32, 3)).astype(np.uint8)} if image else {}),
        "action": np.eye(2, dtype=np.float32)[rng.integers(0, 2, shape)],
        "reward": rng.normal(size=shape).astype(np.float32),
        "is_first": np.zeros(shape, bool),
        "is_last": is_last,
        "is_terminal": is_last,
        "deter": rng.normal(size=(*shape, config.deter)).astype(np.float32),
        "stoch": rng.integers(0, config.classes, (*shape, config.stoch)).astype(np.int32),
    }
    state = A.init_state(config, jax.random.PRNGKey(0))
    # Nonzero rewards and values (their output layers start at zero) and a return range above 1, so
    # that the returns, their normaliser and the advantages' scale all show.
    params, slow = dict(state.params), state.slow_critic
    for name in ("rew", "critic"):
        out = params[name]["out"]
        kernel = jnp.asarray(rng.normal(size=out["kernel"].shape) * 0.5, jnp.float32)
        params[name] = {**params[name], "out": {**out, "kernel": kernel}}
    slow = {**slow, "out": {**slow["out"], "kernel": params["critic"]["out"]["kernel"]}}
    retnorm = state.retnorm._replace(low=jnp.float32(-5.0), high=jnp.float32(5.0))
    state = state._replace(params=params, slow_critic=slow, retnorm=retnorm)
    noise = A.sample_update_noise(config, jax.random.PRNGKey(1), B, T)
    return config, state, batch, noise


def dreamerv3_update(second: bool, image: bool) -> Any:
    """The first update from a fresh state, or with ``second`` the update after it (from the
    unbroken first update), of the model with or without an image."""
    config, state, batch, noise = dreamerv3_case(image)
    start = dreamerv3_unbroken(False, image)[0] if second else state
    return compile_once(A.update_with_noise)(config, start, batch, noise)


@functools.cache
def dreamerv3_unbroken(second: bool, image: bool) -> Any:
    return dreamerv3_update(second, image)


def test_the_dreamerv3_breaks_are_all_listed():
    listed = {name for name, brk in breaks.BREAKS.items() if brk.agent == "dreamerv3"}
    assert listed == set(DREAMERV3_TERMS) | {"warmup", "agc_limit", "conv_input_grad_flip", "conv_block_taps"}


@pytest.mark.parametrize("name", sorted(DREAMERV3_TERMS))
def test_each_dreamerv3_switch_changes_its_term(name):
    observe = DREAMERV3_TERMS[name]
    second, image = name == "slow_critic_rate", name in IMAGE_TERMS
    dreamerv3_unbroken(second, image)  # computed before switching (and cached)
    with breaks.switched_on(name):
        broken = dreamerv3_update(second, image)
    assert differs(observe(broken), observe(dreamerv3_unbroken(second, image)))


def test_the_optimiser_switches_change_its_update():
    """warmup: the first update is no longer zero; agc_limit: a zero parameter's update is clipped to
    nothing instead of to clip·pmin."""
    params = {"zero": jnp.zeros(3), "w": jnp.ones(3)}
    grads = {"zero": jnp.full(3, 0.5), "w": jnp.full(3, 2.0)}

    def two_updates() -> Any:
        opt = laprop(learning_rate=1e-3, warmup=10)
        state = opt.init(params)
        first, state = opt.update(grads, state, params)
        second, _ = opt.update(grads, state, params)
        return first, second

    (first, second) = two_updates()
    with breaks.switched_on("warmup"):
        warm_first, _ = two_updates()
    assert differs(warm_first, first) and not differs(first, jax.tree_util.tree_map(jnp.zeros_like, first))
    with breaks.switched_on("agc_limit"):
        _, agc_second = two_updates()
    assert differs(agc_second["zero"], second["zero"]) and not differs(agc_second["w"], second["w"])


def test_the_convolution_switches_change_its_values_or_input_gradient():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(1, 8, 8, 2)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(3, 3, 2, 4)), jnp.float32)

    def value_and_input_grad() -> tuple[Any, Any]:
        fn = lambda x: jnp.sum(jnp.sin(conv2d(x, kernel, 2)))  # noqa: E731
        return jax.value_and_grad(fn)(x)

    value, grad = value_and_input_grad()
    with breaks.switched_on("conv_input_grad_flip"):
        flip_value, flip_grad = value_and_input_grad()
    assert not differs(flip_value, value) and differs(flip_grad, grad)
    with breaks.switched_on("conv_block_taps"):
        taps_value, _ = value_and_input_grad()
    assert differs(taps_value, value)

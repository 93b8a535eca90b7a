"""Test-only switches that break one term of an update, to check that the parity tests catch each
break (``tools/break_one_term.py``, ``tests/test_breaks.py``).

Every switch is listed in :data:`BREAKS` with the agent and what it breaks. The code of the term asks
:func:`broken` while it is traced; with no switch on (always, outside those checks) the answer is
False and the traced program is exactly the one without the check: nothing is added to it.

Switches are turned on for a whole process by the environment variable :data:`ENV_VAR` (names
separated by commas, read at import), which the break-one-term check sets for the parity tests it
runs, or inside :func:`switched_on`. Both clear JAX's caches of traced functions when they change
the switches, so that what runs next is traced with them.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from typing import NamedTuple

import jax

__all__ = ["BREAKS", "ENV_VAR", "Break", "broken", "switched_on"]

ENV_VAR = "SB3WM_BREAKS"
"""Comma-separated names of :data:`BREAKS` to switch on for the process (read at import)."""


class Break(NamedTuple):
    agent: str
    """"dreamerv3" or "tdmpc2": whose parity tests must catch it."""
    what: str
    """What the switch breaks, in words."""


BREAKS: dict[str, Break] = {
    # DreamerV3: loss scales, normaliser, stop-gradients, targets, optimiser, image paths
    "rep_scale": Break("dreamerv3", "representation loss weighted like the dynamics loss (0.1 -> 1.0)"),
    "repval_scale": Break("dreamerv3", "replay-critic loss scale 0.3 -> 1.0"),
    "free_nats": Break("dreamerv3", "free nats removed from the dynamics loss"),
    "rep_stop_gradient": Break("dreamerv3", "stop-gradient on the prior in the representation loss removed"),
    "return_normaliser": Break("dreamerv3", "advantages not divided by the return scale"),
    "retnorm_rate": Break("dreamerv3", "return-normaliser EMA rate doubled"),
    "slowreg": Break("dreamerv3", "critic's regulariser toward the slow critic removed"),
    "actor_entropy": Break("dreamerv3", "actor entropy bonus removed"),
    "continue_target": Break("dreamerv3", "continue target without the discount (contdisc)"),
    "lambda": Break("dreamerv3", "imagined returns with lambda 1 instead of 0.95"),
    "imagination_weight": Break("dreamerv3", "imagined losses not weighted by the cumulative continue"),
    "slow_critic_copy": Break("dreamerv3", "slow critic not copied from the critic at the first update"),
    "slow_critic_rate": Break("dreamerv3", "slow-critic EMA rate halved"),
    "warmup": Break("dreamerv3", "learning-rate warmup read after the count is incremented"),
    "agc_limit": Break("dreamerv3", "adaptive gradient clipping limit without the pmin floor"),
    "pixel_offset": Break("dreamerv3", "image encoder input in [0, 1] instead of [-0.5, 0.5]"),
    "decoder_space_layout": Break("dreamerv3", "image decoder's block-linear map without its block layout"),
    "image_loss_scale": Break("dreamerv3", "image reconstruction loss weighted 0.5"),
    "conv_input_grad_flip": Break("dreamerv3", "convolutions' input gradient with the kernel not flipped"),
    "conv_block_taps": Break("dreamerv3", "convolutions' block kernel one input pixel off"),
    # TD-MPC2: coefficients, targets, normaliser, clip, optimiser
    "consistency_coef": Break("tdmpc2", "consistency loss coefficient 20 -> 10"),
    "rho": Break("tdmpc2", "temporal weights rho^t dropped from the reward and value losses"),
    "td_discount": Break("tdmpc2", "TD target without the discount"),
    "td_stop_gradient": Break("tdmpc2", "the next latent of the consistency target not stop-gradiented"),
    "running_scale": Break("tdmpc2", "policy loss not divided by the RunningScale"),
    "running_scale_rate": Break("tdmpc2", "RunningScale EMA rate doubled"),
    "world_model_clip": Break("tdmpc2", "world-model gradient clipping removed"),
    "policy_clip": Break("tdmpc2", "policy gradient clipping removed"),
    "stale_pi_grad": Break("tdmpc2", "the previous policy gradient left out of the world-model clip norm"),
    "encoder_lr": Break("tdmpc2", "encoder learning rate not scaled by 0.3"),
    "target_tau": Break("tdmpc2", "target Qs updated with rate 2 tau"),
    "entropy_coef": Break("tdmpc2", "policy entropy term removed"),
}
"""Every switch: name → (agent, what it breaks)."""


def _from_environment() -> frozenset[str]:
    names = frozenset(n.strip() for n in os.environ.get(ENV_VAR, "").split(",") if n.strip())
    _check_names(names, f"the environment variable {ENV_VAR}")
    return names


def _check_names(names: frozenset[str], where: str) -> None:
    unknown = sorted(names - set(BREAKS))
    if unknown:
        raise KeyError(f"{where} names unknown breaks {unknown}; choose from {sorted(BREAKS)}.")


_FROM_ENVIRONMENT = _from_environment()
_ON: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("breaks_on", default=_FROM_ENVIRONMENT)


def broken(name: str) -> bool:
    """Whether the switch ``name`` (of :data:`BREAKS`) is on; asked at trace time."""
    if name not in BREAKS:
        raise KeyError(f"unknown break {name!r}; choose from {sorted(BREAKS)}.")
    return name in _ON.get()


@contextlib.contextmanager
def switched_on(*names: str) -> Iterator[None]:
    """Within the block, the switches ``names`` are on (and the others as before). JAX's trace caches
    are cleared on entry and exit: jitted functions run inside are traced with the switches."""
    on = frozenset(names)
    _check_names(on, "switched_on")
    token = _ON.set(_ON.get() | on)
    jax.clear_caches()
    try:
        yield
    finally:
        _ON.reset(token)
        jax.clear_caches()

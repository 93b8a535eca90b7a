"""The TD-MPC2 update's loss terms (tdmpc2.py:169-263@b67b21c; terminations
tdmpc2.py:258,283-305@7ec6bc8): the TD targets, :func:`world_model_loss` with one function per term
(:func:`consistency_loss`, :func:`reward_loss`, :func:`value_loss`, :func:`termination_loss`),
their weighted sum (:func:`weighted_world_model_loss`) and :func:`policy_loss`; every random draw
comes in an :class:`UpdateNoise`.

Pure functions of explicit arguments; ``config`` is a static (hashable) argument. Shape symbols as in
:mod:`~sb3_worldmodels.tdmpc2.agent`: H horizon, B batch, L latent, A action, K Q members.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sb3_worldmodels.blocks.backend import gather_free, select_rows
from sb3_worldmodels.blocks.breaks import broken
from sb3_worldmodels.blocks.images import shift_images
from sb3_worldmodels.blocks.math import symlog_twohot_log_prob
from sb3_worldmodels.blocks.normalizers import (
    RunningScaleState,
    running_scale_apply,
    running_scale_update,
)
from sb3_worldmodels.tdmpc2 import networks as N
from sb3_worldmodels.tdmpc2.config import TDMPC2Config

Array = jax.Array
sg = jax.lax.stop_gradient


class UpdateNoise(NamedTuple):
    """All randomness of one update (draw order of the reference: eps_td, pair_td, eps_pi, pair_pi)."""

    eps_td: Array
    """(H, B, A) policy noise of the TD targets."""
    pair_td: Array
    """(2,) int32 target-Q members of the TD targets."""
    eps_pi: Array
    """(H+1, B, A) policy noise of the policy step."""
    pair_pi: Array
    """(2,) int32 Q members of the policy step."""
    dropout: Array | None
    """(3, 2) keys of the Q dropout masks (TD target, value loss, policy loss), or None (no dropout).
    A tuple of three bool keep-masks instead replays given masks (the parity tests' recorded ones)."""
    shifts: Array | None = None
    """Pixel observations: (H+1, B, 2) int32 shift offsets in [0, 2·pad] of each image of the window
    (:func:`~sb3_worldmodels.blocks.images.shift_images`): [0] for the rollout's start ``obs[0]``,
    [1:] for the targets ``obs[1:]``; the reference draws them at its two encodes
    (tdmpc2.py:262,270@eece801), one draw per image. None: no shift (and for state observations)."""


# ------------------------------------------------------------------------------------------------
# World model and policy losses (tdmpc2.py:169-263)
# ------------------------------------------------------------------------------------------------


def _dropout_key(config: TDMPC2Config, keys: Array | None, index: int, train: bool) -> Array | None:
    """The dropout key of a Q evaluation, or None where ``config.q_dropout`` switches it off."""
    return keys[index] if keys is not None and _dropout_on(config, train) else None


def _dropout_on(config: TDMPC2Config, train: bool) -> bool:
    """Whether a Q evaluation draws dropout: "always" (b67b21c), "train" (losses only), "off"."""
    return config.q_dropout == "always" or (config.q_dropout == "train" and train)


def _rho(config: TDMPC2Config, n: int) -> Array:
    """(n,) ρ^t, the temporal weights of the reward, value and policy losses."""
    return jnp.asarray(config.rho ** np.arange(n), jnp.float32)


def _loss_rho(config: TDMPC2Config) -> Array:
    """(H,) the reward and value losses' ρ^t."""
    return jnp.ones(config.horizon) if broken("rho") else _rho(config, config.horizon)


def td_target(
    config: TDMPC2Config,
    params: dict,
    target_qs: dict,
    next_z: Array,
    reward: Array,
    terminated: Array | None,
    eps: Array,
    pair: Array,
    dropout_key: Array | None,
    task: Array | None = None,
) -> tuple[Array, dict]:
    """r + γ·(1 − terminated)·min of a target-Q pair at (z', π(z')) (``tdmpc2.py:197-212@b67b21c``;
    ``tdmpc2.py:258@7ec6bc8``).

    next_z (H, B, L), reward (H, B), terminated (H, B) or None → (H, B), and the pieces. Multi-task:
    ``task`` (B,) ids condition the networks and pick each row's discount (tdmpc2.py:211@b67b21c).
    """
    cond = None if task is None else N.task_conditioning(config, params, task)
    _, action, _, _ = N.policy(config, params, next_z, eps, cond)
    q = N.q_pair_value(config, target_qs, next_z, action, pair, dropout_key, "min", cond)
    cont = 1.0 if terminated is None else 1.0 - terminated
    if broken("td_discount"):
        return reward + cont * q, {"td_pi_action": action, "td_q_target_min": q}
    return reward + discount(config, task) * cont * q, {"td_pi_action": action, "td_q_target_min": q}


def discount(config: TDMPC2Config, task: Array | None = None) -> float | Array:
    """γ: the config's, or multi-task each row's task discount (B,) (float32, tdmpc2.py:31-33@b67b21c)."""
    if task is None:
        return config.discount
    if gather_free():
        return select_rows(np.asarray(config.task_discounts, np.float32), task)
    return jnp.asarray(config.task_discounts, jnp.float32)[task]


def world_model_loss(
    config: TDMPC2Config, wm: dict, pi: dict, target_qs: dict, batch: dict[str, Array], noise: UpdateNoise
) -> tuple[dict[str, Array], dict[str, Array]]:
    """The world model's loss terms on one batch (``tdmpc2.py:214-263``), differentiable w.r.t. ``wm``:
    the TD targets, the latent rollout from the first observation, the heads on it, then one function
    per term (:func:`consistency_loss`, :func:`reward_loss`, :func:`value_loss` and, episodic,
    :func:`termination_loss`).

    Args:
        wm: the world-model modules; pi: policy parameters (TD targets only, not differentiated).
        batch: "obs" (H+1, B, O) (pixels: (H+1, B, H_img, W_img, C) uint8), "action" (H, B, A),
            "reward" (H, B)[, "terminated" (H, B)][, "task" (B,) int32 task ids, multi-task].

    Returns:
        (losses, tensors): the terms by name, () each, and the tensors by name ("zs" (H+1, B, L)
        rollout latents, "next_z", "td_targets", "q_logits", "reward_logits", ...).
    """
    params = {**wm, "pi": pi}
    obs, action, reward = batch["obs"], batch["action"], batch["reward"]
    if config.image_shape and noise.shifts is not None:  # ShiftAug at both encodes, one draw per image
        obs = shift_images(obs, noise.shifts)
    terminated = batch.get("terminated") if config.episodic else None
    task = batch["task"] if config.multitask else None
    cond = None if task is None else N.task_conditioning(config, params, task)
    next_z = N.encode(config, params, obs[1:], cond)
    next_z = next_z if broken("td_stop_gradient") else sg(next_z)
    td, td_parts = td_target(
        config,
        sg(params),
        sg(target_qs),
        next_z,
        reward,
        terminated,
        noise.eps_td,
        noise.pair_td,
        _dropout_key(config, noise.dropout, 0, train=False),
        task,
    )
    td = sg(td)

    z = N.encode(config, params, obs[0], cond)
    latents = [z]
    for t in range(config.horizon):
        z = N.next_latent(config, params, z, action[t], cond)
        latents.append(z)
    zs = jnp.stack(latents)
    q_logits = N.q_logits(
        config,
        params["qs"],
        zs[:-1],
        action,
        _dropout_key(config, noise.dropout, 1, train=True),
        cond,
    )  # (K, H, B, n)
    rew_logits = N.reward_logits(config, params, zs[:-1], action, cond)  # (H, B, n)
    losses = {
        "consistency": consistency_loss(config, latents[1:], next_z),
        "reward": reward_loss(config, rew_logits, reward),
        "value": value_loss(config, q_logits, td),
    }
    tensors = {
        "zs": zs,
        "next_z": next_z,
        "td_targets": td,
        "z0": zs[0],
        "q_logits": q_logits,
        "reward_logits": rew_logits,
        **td_parts,
    }
    if config.episodic:
        logits = N.termination_logit(config, params, zs[1:])  # (H, B)
        losses["termination"] = termination_loss(logits, terminated)  # type: ignore[arg-type]
        tensors["termination_logits"] = logits
    return losses, tensors


def consistency_loss(config: TDMPC2Config, predicted: list[Array], next_z: Array) -> Array:
    """mean_t ρ^t·MSE of the predicted latents (H of (B, L)) against the next observations' encodings
    next_z (H, B, L) (tdmpc2.py:236-241,248@b67b21c) → (), in float32 (the latents may be in the
    compute dtype)."""
    loss = jnp.zeros((), jnp.float32)
    for t, z in enumerate(predicted):
        error = jnp.asarray(z, jnp.float32) - jnp.asarray(next_z[t], jnp.float32)
        loss += jnp.mean(jnp.square(error)) * config.rho**t
    return loss * (1.0 / config.horizon)


def reward_loss(config: TDMPC2Config, logits: Array, reward: Array) -> Array:
    """mean_t ρ^t·mean_B of the reward head's soft cross-entropy: logits (H, B, n) against the rewards
    (H, B) two-hot in symlog space (tdmpc2.py:244-249@b67b21c) → ()."""
    ce = -symlog_twohot_log_prob(logits, reward, config.num_bins, config.vmin, config.vmax)  # (H, B)
    return jnp.sum(ce.mean(-1) * _loss_rho(config)) * (1.0 / config.horizon)


def value_loss(config: TDMPC2Config, q_logits: Array, td_targets: Array) -> Array:
    """Σ_k mean_t ρ^t·mean_B of each Q member's soft cross-entropy: q_logits (K, H, B, n) against the
    TD targets (H, B) (tdmpc2.py:244-250@b67b21c) → ()."""
    bins = (config.num_bins, config.vmin, config.vmax)
    ce = -symlog_twohot_log_prob(q_logits, td_targets[None], *bins)  # (K, H, B)
    h = config.horizon
    return jnp.sum(ce.mean(-1) * _loss_rho(config)) * (1.0 / (h * config.num_q))


def termination_loss(logits: Array, terminated: Array) -> Array:
    """Episodic: mean binary cross-entropy of the termination logits (H, B) against the flags (H, B)
    (tdmpc2.py:283-305@7ec6bc8) → ()."""
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, terminated))


LOSS_COEFS = {
    "consistency": "consistency_coef",
    "reward": "reward_coef",
    "value": "value_coef",
    "termination": "termination_coef",
}
"""Each world-model loss term's weight: the config field (tdmpc2.py:252-256@b67b21c)."""


def weighted_world_model_loss(
    config: TDMPC2Config, wm: dict, pi: dict, target_qs: dict, batch: dict[str, Array], noise: UpdateNoise
) -> tuple[Array, tuple[dict[str, Array], dict[str, Array]]]:
    """Σ coefficient·term of :func:`world_model_loss` → (total, (losses, tensors)), what the world
    model's step differentiates."""
    losses, tensors = world_model_loss(config, wm, pi, target_qs, batch, noise)
    coefs = {name: getattr(config, field) for name, field in LOSS_COEFS.items()}
    if broken("consistency_coef"):
        coefs["consistency"] *= 0.5
    weighted = [coefs[name] * loss for name, loss in losses.items()]
    total = weighted[0]
    for term in weighted[1:]:
        total = total + term
    return total, (losses, tensors)


def policy_loss(
    config: TDMPC2Config,
    pi: dict,
    qs: dict,
    zs: Array,
    scale: RunningScaleState,
    noise: UpdateNoise,
    task: N.Task | None = None,
) -> tuple[Array, dict]:
    """The policy loss on detached latents zs (H+1, B, L) with the (updated, frozen) Q members
    (``tdmpc2.py:169-195``): mean_t ρ^t·mean_B(α·log π − Q/S), S the RunningScale updated on Q[0].
    Multi-task: ``task`` conditions both; only ``pi`` is differentiated, so the embedding gets no
    policy gradient (world_model.py:67-69@b67b21c)."""
    _, action, log_pi, _ = N.policy(config, {"pi": pi}, zs, noise.eps_pi, task)
    drop = _dropout_key(config, noise.dropout, 2, train=True)
    q = N.q_pair_value(config, sg(qs), zs, action, noise.pair_pi, drop, "avg", task)
    scale = running_scale_update(scale, q[0], 2 * config.tau if broken("running_scale_rate") else config.tau)
    scaled = q if broken("running_scale") else running_scale_apply(scale, q)
    rho = _rho(config, config.horizon + 1)
    entropy_coef = 0.0 if broken("entropy_coef") else config.entropy_coef
    loss = jnp.mean(jnp.mean(entropy_coef * log_pi - scaled, -1) * rho)
    return loss, {"scale": scale, "q_avg_unscaled": q, "action": action, "log_pi": log_pi}

"""The pure-JAX TD-MPC2 core: state, update and MPPI planning (tdmpc2.py:69-286@b67b21c; terminations
tdmpc2.py:127-137,258,283-305@7ec6bc8).

Everything here is a pure function of explicit arguments; ``config`` is a static (hashable) argument.

- :func:`init_state` builds a :class:`TDMPC2State`.
- :func:`update_with_noise` is one ``TDMPC2.update`` (world-model step, policy step, target EMA) with
  every random draw given; :func:`train_step` draws them from the state's key and :func:`train_many`
  scans it over a leading K axis of batches. The loss terms it differentiates are in
  :mod:`~sb3_worldmodels.tdmpc2.losses` (importable from here too).
- :func:`plan_with_noise` is one ``TDMPC2.plan`` for one env with every draw given; :func:`act`
  encodes a batch of observations and plans for each env (vmapped), drawing from a key.

Pixel observations (``config.image_shape``, later upstream code @eece801): observations are uint8
images (..., H, W, C) and every encode shifts them by offsets drawn fresh for that encode, as the
reference's ShiftAug does in every forward pass, acting, planning and evaluation included
(layers.py:36-59,142-143@eece801; world_model.py:104-111@eece801): the update draws one offset pair
per image of the window (:attr:`UpdateNoise.shifts`), :func:`act` one per env from the env's key.

Shape symbols: H horizon, B batch, L latent, A action, O observation, K Q members, S samples,
P policy trajectories, E elites, I MPPI iterations, n envs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from sb3_worldmodels.blocks.backend import count_at_most, gather_free, scan_unroll, select_rows
from sb3_worldmodels.blocks.breaks import broken
from sb3_worldmodels.blocks.images import random_shifts
from sb3_worldmodels.blocks.jit import agent_jit, scan_updates
from sb3_worldmodels.blocks.normalizers import RunningScaleState, running_scale_init
from sb3_worldmodels.blocks.optim import adam, get_learning_rate, squared_global_norm, with_learning_rate
from sb3_worldmodels.blocks.random import choice_without_replacement
from sb3_worldmodels.tdmpc2 import networks as N
from sb3_worldmodels.tdmpc2.config import TDMPC2Config
from sb3_worldmodels.tdmpc2.losses import LOSS_COEFS as LOSS_COEFS
from sb3_worldmodels.tdmpc2.losses import (
    UpdateNoise,
    _dropout_on,
    discount,
    policy_loss,
    weighted_world_model_loss,
)
from sb3_worldmodels.tdmpc2.losses import _dropout_key as _dropout_key
from sb3_worldmodels.tdmpc2.losses import consistency_loss as consistency_loss
from sb3_worldmodels.tdmpc2.losses import reward_loss as reward_loss
from sb3_worldmodels.tdmpc2.losses import td_target as td_target
from sb3_worldmodels.tdmpc2.losses import termination_loss as termination_loss
from sb3_worldmodels.tdmpc2.losses import value_loss as value_loss
from sb3_worldmodels.tdmpc2.losses import world_model_loss as world_model_loss

Array = jax.Array
sg = jax.lax.stop_gradient

WORLD_MODEL_MODULES = ("encoder", "dynamics", "reward", "qs", "termination", "task_emb")
"""Modules of the world-model Adam group (``tdmpc2.py:17-24``; termination only when episodic)."""


class TDMPC2State(NamedTuple):
    """Everything one agent's update reads and writes."""

    params: dict
    """{"encoder", "dynamics", "reward", "pi", "qs"[, "termination"]} (see :mod:`.networks`)."""
    target_qs: dict
    """EMA copy of ``params["qs"]``."""
    wm_opt: Any
    """Adam state over the world-model modules, with the learning rate (:func:`make_optimizers`)."""
    pi_opt: Any
    """Adam state over ``params["pi"]``, with the learning rate."""
    scale: RunningScaleState
    """RunningScale of the policy loss."""
    pi_grad_sq: Array
    """() float32, squared norm of the last clipped policy gradient (0 before the first update)."""
    key: Array
    """(2,) uint32 PRNG key of the updates."""
    updates: Array
    """() int32 number of updates done."""


class PlanNoise(NamedTuple):
    """All randomness of one plan for one env (``tdmpc2.py:116-167``)."""

    pi_traj: Array
    """(H, P, A) policy noise of the policy trajectories."""
    mppi: Array
    """(I, H, S−P, A) N(0, 1) sampling noise per iteration."""
    value_pi: Array
    """(I, S, A) policy noise at the terminal latents of the value estimates."""
    value_pair: Array
    """(I, 2) int32 Q members of the terminal values."""
    elite_u: Array
    """() float32 uniform in [0, 1): the final elite is drawn by inverse CDF of the scores (as numpy's
    weighted ``choice``)."""
    elite_pick: Array
    """() int32 index into the final elites that replaces that draw when >= 0 (recorded draws)."""
    final: Array
    """(A,) N(0, 1) exploration noise (used when not deterministic)."""
    dropout: Array | None
    """(I, 2) keys of the terminal values' Q dropout, or None."""


# ------------------------------------------------------------------------------------------------
# Initialisation
# ------------------------------------------------------------------------------------------------


class Optimizers(NamedTuple):
    """The two Adams of tdmpc2.py:20-27@b67b21c (:func:`~sb3_worldmodels.blocks.optim.adam`)."""

    world_model: optax.GradientTransformation
    """Over :data:`WORLD_MODEL_MODULES`, the encoder at ``enc_lr_scale`` times the rate."""
    policy: optax.GradientTransformation
    """Over ``params["pi"]``, its own epsilon."""


def make_optimizers(config: TDMPC2Config) -> Optimizers:
    """The world model's and the policy's Adam, each with the learning rate in its state (the SB3
    class writes its schedule there, :func:`set_learning_rate`)."""
    betas = (config.beta1, config.beta2)
    enc_lr_scale = 1.0 if broken("encoder_lr") else config.enc_lr_scale
    return Optimizers(
        world_model=adam(config.learning_rate, *betas, config.eps, {"encoder": enc_lr_scale}),
        policy=adam(config.learning_rate, *betas, config.pi_eps),
    )


def _wm_params(params: dict) -> dict:
    return {k: params[k] for k in WORLD_MODEL_MODULES if k in params}


def init_state(config: TDMPC2Config, key: Array) -> TDMPC2State:
    """A fresh agent state from a (2,) uint32 PRNG key."""
    key = jnp.asarray(key)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    key, init_key = jax.random.split(key)
    params, target_qs = init_params_jit(config, init_key)
    optimizers = make_optimizers(config)
    return TDMPC2State(
        params=params,
        target_qs=target_qs,
        wm_opt=optimizers.world_model.init(_wm_params(params)),
        pi_opt=optimizers.policy.init(params["pi"]),
        scale=running_scale_init(),
        pi_grad_sq=jnp.zeros((), jnp.float32),
        key=key,
        updates=jnp.zeros((), jnp.int32),
    )


def with_params(config: TDMPC2Config, state: TDMPC2State, params: dict, target_qs: dict) -> TDMPC2State:
    """``state`` with other parameters and fresh optimiser states for them (e.g. a checkpoint's), at
    the state's learning rate."""
    optimizers = make_optimizers(config)
    fresh = state._replace(
        params=params,
        target_qs=target_qs,
        wm_opt=optimizers.world_model.init(_wm_params(params)),
        pi_opt=optimizers.policy.init(params["pi"]),
    )
    return set_learning_rate(fresh, get_learning_rate(state.wm_opt))


# ------------------------------------------------------------------------------------------------
# Update (tdmpc2.py:169-286)
# ------------------------------------------------------------------------------------------------


def _clip_factor(norm: Array, max_norm: float) -> Array:
    """PyTorch's clip_grad_norm_: multiply by min(1, max_norm / (norm + 1e-6))."""
    return jnp.minimum(1.0, max_norm / (norm + 1e-6))


def update_with_noise(
    config: TDMPC2Config, state: TDMPC2State, batch: dict[str, Array], noise: UpdateNoise
) -> tuple[TDMPC2State, dict[str, Array], dict[str, Any]]:
    """One update with the given draws (``tdmpc2.py:214-286``); ``state.key`` is left unchanged.

    Returns (new state, scalar metrics, aux {"internals", "pi"}). Multi-task: the embedding rows of the
    batch's tasks are renormalised before the world-model step and again before the policy step, as
    the reference's lookups do in place (world_model.py:19@b67b21c).
    """
    params = state.params
    if config.multitask:
        params = N.renormalise_task_embeddings(params, batch["task"])
    wm, pi = _wm_params(params), params["pi"]
    grad_fn = jax.value_and_grad(weighted_world_model_loss, argnums=1, has_aux=True)
    (total, (losses, tensors)), grads = grad_fn(config, wm, pi, state.target_qs, batch, noise)

    # Clip jointly with the policy's stale gradient (tdmpc2.py:180,232,267@b67b21c), then Adam.
    wm_sq = squared_global_norm(grads)
    stale = state.pi_grad_sq if config.stale_pi_grad_in_clip and not broken("stale_pi_grad") else 0.0
    grad_norm = jnp.sqrt(wm_sq + stale)
    if not broken("world_model_clip"):
        grads = jax.tree_util.tree_map(lambda g: g * _clip_factor(grad_norm, config.grad_clip_norm), grads)
    optimizers = make_optimizers(config)
    wm_updates, wm_opt = optimizers.world_model.update(grads, state.wm_opt)
    wm = optax.apply_updates(wm, wm_updates)

    # Policy step on the pre-update latents with the post-update Q members.
    zs = sg(tensors["zs"])
    task = None
    if config.multitask:
        wm = N.renormalise_task_embeddings(wm, batch["task"])
        task = N.task_conditioning(config, wm, batch["task"])
    pi_grad_fn = jax.value_and_grad(policy_loss, argnums=1, has_aux=True)
    (pi_loss, pi_aux), pi_grads = pi_grad_fn(config, pi, wm["qs"], zs, state.scale, noise, task)
    pi_norm = jnp.sqrt(squared_global_norm(pi_grads))
    clip = jnp.ones_like(pi_norm) if broken("policy_clip") else _clip_factor(pi_norm, config.grad_clip_norm)
    pi_grads = jax.tree_util.tree_map(lambda g: g * clip, pi_grads)
    pi_updates, pi_opt = optimizers.policy.update(pi_grads, state.pi_opt)
    pi = optax.apply_updates(pi, pi_updates)

    # Target Qs: lerp toward the updated online Qs.
    tau = 2 * config.tau if broken("target_tau") else config.tau
    target_qs = jax.tree_util.tree_map(lambda t, q: t + tau * (q - t), state.target_qs, wm["qs"])
    new_state = state._replace(
        params={**wm, "pi": pi},
        target_qs=target_qs,
        wm_opt=wm_opt,
        pi_opt=pi_opt,
        scale=pi_aux["scale"],
        pi_grad_sq=jnp.square(pi_norm * clip),
        updates=state.updates + 1,
    )
    metrics = {f"{k}_loss": v for k, v in losses.items()}
    metrics.update(
        pi_loss=pi_loss,
        total_loss=total,
        grad_norm=grad_norm,
        pi_grad_norm=pi_norm,
        pi_scale=pi_aux["scale"].value,
    )
    internals = {k: v for k, v in tensors.items() if k != "zs"}
    internals.update(
        pi_step_action=pi_aux["action"],
        pi_step_log_pi=pi_aux["log_pi"],
        pi_step_q_avg_unscaled=pi_aux["q_avg_unscaled"],
        zs=zs,
    )
    return new_state, metrics, {"internals": internals}


def sample_update_noise(config: TDMPC2Config, key: Array, batch_size: int) -> UpdateNoise:
    """Fresh draws for one update on a batch of B windows (pixels: with the images' shift offsets)."""
    keys = jax.random.split(key, 6 if config.image_shape else 5)
    h, a, k = config.horizon, config.action_dim, config.num_q
    return UpdateNoise(
        eps_td=jax.random.normal(keys[0], (h, batch_size, a), jnp.float32),
        pair_td=choice_without_replacement(keys[1], k, 2).astype(jnp.int32),
        eps_pi=jax.random.normal(keys[2], (h + 1, batch_size, a), jnp.float32),
        pair_pi=choice_without_replacement(keys[3], k, 2).astype(jnp.int32),
        dropout=jax.random.split(keys[4], 3),
        shifts=random_shifts(keys[5], (h + 1, batch_size)) if config.image_shape else None,
    )


def train_step(
    config: TDMPC2Config, state: TDMPC2State, batch: dict[str, Array]
) -> tuple[TDMPC2State, dict[str, Array]]:
    """One update on a batch (see :func:`world_model_loss` for its layout), drawing from ``state.key``."""
    key, noise_key = jax.random.split(state.key)
    noise = sample_update_noise(config, noise_key, batch["reward"].shape[1])
    new_state, metrics, _ = update_with_noise(config, state, batch, noise)
    return new_state._replace(key=key), metrics


def train_many(
    config: TDMPC2Config, state: TDMPC2State, batches: dict[str, Array]
) -> tuple[TDMPC2State, dict[str, Array]]:
    """K updates in one call, scanned over the leading K axis of ``batches`` (no loop when K is 1,
    :func:`~sb3_worldmodels.blocks.jit.scan_updates`); metrics get a leading K."""
    return scan_updates(lambda s, b: train_step(config, s, b), state, batches)


# ------------------------------------------------------------------------------------------------
# Planning (tdmpc2.py:69-167)
# ------------------------------------------------------------------------------------------------


def estimate_value(
    config: TDMPC2Config,
    params: dict,
    z: Array,
    actions: Array,
    pi_eps: Array,
    pair: Array,
    dropout_key: Array | None,
    task: Array | None = None,
) -> Array:
    """Σ_t γ^t r̂_t + γ^H·avgQ(z_H, π(z_H)) for candidates ``actions`` (H, S, A) from z (S, L) → (S,).

    Episodic: a candidate stops collecting once the termination head fires (tdmpc2.py:127-137@7ec6bc8).
    Multi-task: ``task`` () is the task id; γ is its float32 discount, its powers taken in float32
    (tdmpc2.py:89-103@b67b21c).
    """
    cond = None if task is None else N.task_conditioning(config, params, task)
    gamma = discount(config, task)
    latents = [z]  # the rollout first, then every step's reward (and termination) in one call (H, S)
    for t in range(config.horizon):
        latents.append(N.next_latent(config, params, latents[-1], actions[t], cond))
    z = latents[-1]
    rewards = N.decode(config, N.reward_logits(config, params, jnp.stack(latents[:-1]), actions, cond))
    if config.episodic:
        ends = N.termination_logit(config, params, jnp.stack(latents[1:]))
        fired = (jax.nn.sigmoid(ends) > 0.5).astype(jnp.float32)
    value = jnp.zeros(z.shape[:-1], jnp.float32)
    done = jnp.zeros(z.shape[:-1], jnp.float32)
    weight: float | Array = 1.0
    for t in range(config.horizon):
        value = value + weight * (1.0 - done) * rewards[t]
        if config.episodic:
            done = jnp.minimum(1.0, done + fired[t])
        weight *= gamma
    _, action, _, _ = N.policy(config, params, z, pi_eps, cond)
    q = N.q_pair_value(config, params["qs"], z, action, pair, dropout_key, "avg", cond)
    return value + weight * (1.0 - done) * q


def plan_with_noise(
    config: TDMPC2Config,
    params: dict,
    z: Array,
    prev_mean: Array,
    first: Array,
    deterministic: Array,
    noise: PlanNoise,
    task: Array | None = None,
) -> tuple[Array, Array, dict[str, Array]]:
    """MPPI for one env (``tdmpc2.py:105-167``).

    Args:
        z: (L,) latent of the current observation; prev_mean: (H, A) the previous plan's mean.
        first: () bool, the episode's first step (no warm start); deterministic: () bool, no final
            noise (the reference's eval mode).
        task: () task id (multi-task): the candidates, means and stds are masked to its action
            dimensions (tdmpc2.py:141-142,156-158@b67b21c).

    Returns:
        (action (A,) in [−1, 1], the new plan mean (H, A), per-iteration internals).
    """
    h, a = config.horizon, config.action_dim
    p, s, e = config.num_pi_trajs, config.num_samples, config.num_elites

    cond = None if task is None else N.task_conditioning(config, params, task)
    zp = jnp.broadcast_to(z, (p, z.shape[-1]))
    pi_steps = []
    for t in range(h):
        _, act, _, _ = N.policy(config, params, zp, noise.pi_traj[t], cond)
        pi_steps.append(act)
        if t < h - 1:
            zp = N.next_latent(config, params, zp, act, cond)
    pi_actions = jnp.stack(pi_steps)  # (H, P, A)

    warm = jnp.concatenate([prev_mean[1:], jnp.zeros((1, a), jnp.float32)], 0)
    mean = jnp.where(first, jnp.zeros((h, a), jnp.float32), warm)
    std = jnp.full((h, a), config.max_std, jnp.float32)
    zs = jnp.broadcast_to(z, (s, z.shape[-1]))

    def iteration(carry: tuple[Array, Array], xs: tuple) -> tuple[tuple[Array, Array], dict]:
        mean, std = carry
        mppi_eps, pi_eps, pair, drop = xs
        sampled = jnp.clip(mean[:, None] + std[:, None] * mppi_eps, -1.0, 1.0)
        actions = jnp.concatenate([pi_actions, sampled], 1)  # (H, S, A)
        if cond is not None:
            actions = actions * cond.mask
        value = estimate_value(config, params, zs, actions, pi_eps, pair, drop, task)
        value = jnp.nan_to_num(value, nan=0.0)
        elite_value, elite_idxs = jax.lax.top_k(value, e)
        if gather_free():  # each elite's actions by a masked sum over the samples
            elite_actions = select_rows(actions, elite_idxs, axis=1)
        else:
            elite_actions = actions[:, elite_idxs]  # (H, E, A)
        score = jnp.exp(config.temperature * (elite_value - jnp.max(elite_value)))
        score = score / jnp.sum(score)
        total = jnp.sum(score) + 1e-9
        new_mean = jnp.sum(score[:, None] * elite_actions, 1) / total
        new_std = jnp.sqrt(jnp.sum(score[:, None] * jnp.square(elite_actions - new_mean[:, None]), 1) / total)
        new_std = jnp.clip(new_std, config.min_std, config.max_std)
        if cond is not None:
            new_mean, new_std = new_mean * cond.mask, new_std * cond.mask
        out = {
            "mean_before": mean,
            "std_before": std,
            "actions": actions,
            "values": value,
            "elite_idxs": elite_idxs,
            "elite_actions": elite_actions,
            "score": score,
            "mean_after": new_mean,
            "std_after": new_std,
        }
        return (new_mean, new_std), out

    drops = noise.dropout if noise.dropout is not None and _dropout_on(config, train=False) else None
    xs = (noise.mppi, noise.value_pi, noise.value_pair, drops)
    if drops is None:

        def without_dropout(carry: tuple[Array, Array], x: tuple) -> tuple[tuple[Array, Array], dict]:
            return iteration(carry, (*x, None))

        (mean, std), iters = jax.lax.scan(without_dropout, (mean, std), xs[:3], unroll=scan_unroll())
    else:
        (mean, std), iters = jax.lax.scan(iteration, (mean, std), xs, unroll=scan_unroll())

    score = iters["score"][-1]
    cdf = jnp.cumsum(score)
    if gather_free():  # the search by counting, the pick by a masked sum over the elites
        drawn = jnp.minimum(count_at_most(cdf, noise.elite_u * cdf[-1]), e - 1)
        pick = jnp.where(noise.elite_pick >= 0, noise.elite_pick, drawn)
        chosen = select_rows(iters["elite_actions"][-1], pick, axis=1)  # (H, A)
    else:
        drawn = jnp.minimum(jnp.searchsorted(cdf, noise.elite_u * cdf[-1], side="right"), e - 1)
        pick = jnp.where(noise.elite_pick >= 0, noise.elite_pick, drawn)
        chosen = iters["elite_actions"][-1][:, pick]  # (H, A)
    action = chosen[0] + jnp.where(deterministic, 0.0, 1.0) * std[0] * noise.final
    return jnp.clip(action, -1.0, 1.0), mean, {**iters, "action_before_noise": chosen[0], "std": std}


def sample_plan_noise(config: TDMPC2Config, key: Array, iterations: int) -> PlanNoise:
    """Fresh draws for one plan of one env; the elite pick is drawn later, from the final scores."""
    h, a, k = config.horizon, config.action_dim, config.num_q
    p, s = config.num_pi_trajs, config.num_samples
    keys = jax.random.split(key, 7)
    pairs = jax.vmap(lambda kk: choice_without_replacement(kk, k, 2))(jax.random.split(keys[6], iterations))
    return PlanNoise(
        pi_traj=jax.random.normal(keys[0], (h, p, a), jnp.float32),
        mppi=jax.random.normal(keys[1], (iterations, h, s - p, a), jnp.float32),
        value_pi=jax.random.normal(keys[2], (iterations, s, a), jnp.float32),
        value_pair=pairs.astype(jnp.int32),
        elite_u=jax.random.uniform(keys[3], (), jnp.float32),
        elite_pick=jnp.full((), -1, jnp.int32),
        final=jax.random.normal(keys[4], (a,), jnp.float32),
        dropout=jax.random.split(keys[5], iterations),
    )


def act(
    config: TDMPC2Config,
    params: dict,
    obs: Array,
    prev_mean: Array,
    first: Array,
    key: Array,
    deterministic: bool = False,
    task: Array | None = None,
) -> tuple[Array, Array]:
    """Encode n observations (n, O) and plan for each env: returns actions (n, A) and plan means (n, H, A).

    ``prev_mean`` (n, H, A) is each env's previous plan; ``first`` (n,) bool restarts it (t0).
    ``key`` is one PRNG key (2,), split into one per env, or the envs' own keys (n, 2). Multi-task:
    ``task`` (n,) int32 gives each env's task id; the embedding rows are renormalised as at the
    reference's lookups, for this call only (docs/deviations.md T16). Pixels: obs (n, H, W, C) uint8,
    each image shifted by offsets drawn from its env's key (:func:`pixel_act_keys`), as the
    reference's ShiftAug at every encode (tdmpc2.py:112-117,153@eece801), deterministic included.
    ``deterministic``: the reference's eval mode, no exploration noise on the chosen action.
    """
    if task is not None:
        params = N.renormalise_task_embeddings(params, task)
    keys = key if key.ndim == 2 else jax.random.split(key, obs.shape[0])
    shifts = None
    if config.image_shape:
        keys, shifts = pixel_act_keys(keys)
    cond = None if task is None else N.task_conditioning(config, params, task)
    z = N.encode(config, params, obs, cond, shifts)
    noise = jax.vmap(lambda k: sample_plan_noise(config, k, config.iterations))(keys)
    if task is None:

        def one(z: Array, prev: Array, f: Array, nz: PlanNoise) -> tuple[Array, Array]:
            action, mean, _ = plan_with_noise(config, params, z, prev, f, jnp.asarray(deterministic), nz)
            return action, mean

        return jax.vmap(one)(z, prev_mean, first, noise)

    def one_task(z: Array, prev: Array, f: Array, nz: PlanNoise, k: Array) -> tuple[Array, Array]:
        action, mean, _ = plan_with_noise(config, params, z, prev, f, jnp.asarray(deterministic), nz, k)
        return action, mean

    return jax.vmap(one_task)(z, prev_mean, first, noise, task)


def pixel_act_keys(keys: Array) -> tuple[Array, Array]:
    """Pixels: each env's key (n, 2) → (its planning key (n, 2), its image's shift offsets (n, 2)), two
    independent draws from one key (so a deterministic ``predict`` row key fixes both)."""
    pairs = jax.vmap(jax.random.split)(keys)  # (n, 2, 2)
    shifts = jax.vmap(lambda k: random_shifts(k, ()))(pairs[:, 1])
    return pairs[:, 0], shifts


def random_actions(key: Array, n: int, action_dim: int) -> Array:
    """Uniform actions in [−1, 1] for the seed phase: (n, A)."""
    return jax.random.uniform(key, (n, action_dim), jnp.float32, -1.0, 1.0)


def seed_actions(config: TDMPC2Config, state: None, key: Array, n_envs: int) -> Array:
    """The seed phase's acting call: :func:`random_actions` for ``n_envs`` envs, (n_envs, A) (``state``
    is None: the call reads nothing of the agent's state)."""
    return random_actions(key, n_envs, config.action_dim)


def predict_rollout(config: TDMPC2Config, params: dict, obs: Array, actions: Array) -> dict[str, Array]:
    """What the world model expects along given actions, open loop, without dropout.

    obs (n, O), actions (n, T, A) in [-1, 1] → "reward" (n, T) (decoded reward head), "latent"
    (n, T + 1, L) and "value" (n,): the mean of all Q members at the last latent with the policy's
    mean action (the planner's bootstrap). Episodic: "continue" (n, T), the probability that the
    episode goes on after each step. Pixels: obs (n, H, W, C) uint8, encoded unshifted (no sampling
    here; the shift augmentation's offset ``pad`` is the identity).
    """
    z = N.encode(config, params, obs)

    def step(z: Array, action: Array) -> tuple[Array, tuple[Array, Array, Array]]:
        reward = N.decode(config, N.reward_logits(config, params, z, action))
        z_next = N.next_latent(config, params, z, action)
        if config.episodic:
            alive = 1.0 - jax.nn.sigmoid(N.termination_logit(config, params, z_next))
        else:
            alive = jnp.ones_like(reward)
        return z_next, (reward, z_next, alive)

    z_last, (rewards, latents, alive) = jax.lax.scan(step, z, jnp.swapaxes(actions, 0, 1))
    no_noise = jnp.zeros(z_last.shape[:-1] + (config.action_dim,), jnp.float32)
    mean_action, _, _, _ = N.policy(config, params, z_last, no_noise)
    value = jnp.mean(N.decode(config, N.q_logits(config, params["qs"], z_last, mean_action, None)), axis=0)
    out = {
        "reward": jnp.swapaxes(rewards, 0, 1),
        "latent": jnp.concatenate([z[:, None], jnp.swapaxes(latents, 0, 1)], axis=1).astype(jnp.float32),
        "value": value,
    }
    if config.episodic:
        out["continue"] = jnp.swapaxes(alive, 0, 1)
    return out


def set_learning_rate(state: TDMPC2State, learning_rate: float | Array) -> TDMPC2State:
    """``state`` with both optimisers' learning rate set (a () float32 array: the update is not
    retraced)."""
    return with_learning_rate(state, learning_rate)


init_params_jit = agent_jit(N.init_params)
"""Jitted :func:`~sb3_worldmodels.tdmpc2.networks.init_params`; ``config`` is static."""
act_jit = agent_jit(act, static_argnames=("deterministic",))
"""Jitted :func:`act`; ``config`` and ``deterministic`` are static."""
seed_actions_jit = agent_jit(seed_actions, static_argnames=("n_envs",))
"""Jitted :func:`seed_actions`; ``config`` and ``n_envs`` are static."""
train_many_jit = agent_jit(train_many)
"""Jitted :func:`train_many`; ``config`` is static."""
predict_rollout_jit = agent_jit(predict_rollout)
"""Jitted :func:`predict_rollout`; ``config`` is static."""

"""The latent rollouts of the DreamerV3 core and the draws they use: the posterior along replay rows
(:func:`observe`), imagination from posterior states (:func:`imagine`), the latent samples
(:func:`sample_onehot`, :func:`sample_latent`: float32 draws returned in the compute dtype), the
actor's distribution helpers, and all randomness of one update (:class:`UpdateNoise`,
:func:`sample_update_noise`).

Pure functions of explicit arguments; ``config`` is a static (hashable) argument. Shape symbols as in
:mod:`~sb3_worldmodels.dreamerv3.agent`: B batch rows, T trained steps, N = B·T imagination starts,
H imagination horizon, D deter, S stoch latents, C classes, A action width, F = D + S·C, n bins.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from sb3_worldmodels.blocks.backend import scan_unroll
from sb3_worldmodels.blocks.distributions import (
    categorical_entropy,
    categorical_log_prob,
    normal_entropy,
    normal_head,
    normal_log_prob,
    onehot_mode,
    unimix_logits,
)
from sb3_worldmodels.blocks.math import symexp_bins, twohot_mean
from sb3_worldmodels.blocks.random import gumbel_and_normal_noise
from sb3_worldmodels.blocks.softmax import softmax
from sb3_worldmodels.dreamerv3 import networks as N
from sb3_worldmodels.dreamerv3.config import DreamerV3Config

Array = jax.Array
sg = jax.lax.stop_gradient


class Carry(NamedTuple):
    """Acting state per env (nets.py:39-45@2411f7d, driver.py:34-81@2411f7d); zeros at the start."""

    deter: Array
    """(n, D) float32 deterministic state."""
    stoch: Array
    """(n, S, C) float32 one-hot stochastic state."""
    action: Array
    """(n, A) float32 previous action (one-hot for discrete actions)."""


class UpdateNoise(NamedTuple):
    """All randomness of one update (jaxutils.py:103-121@2411f7d, nets.py:486-493@2411f7d,
    agent.py:267-298@2411f7d); see :func:`sample_update_noise`."""

    post: Array
    """(B, T, S, C) Gumbel noise of the posterior samples of the replay rollout."""
    imag_stoch: Array
    """(H, N, S, C) Gumbel noise of the imagined latents (step j = 1..H at index j − 1)."""
    imag_action: Array
    """(H+1, N, A) actor noise for imagined steps 0..H: Gumbel (discrete) or ε ~ N(0, 1) (continuous)."""


# ------------------------------------------------------------------------------------------------
# Network helpers
# ------------------------------------------------------------------------------------------------


def sample_onehot(logits: Array, gumbel: Array, dtype: Any = jnp.float32) -> Array:
    """Straight-through one-hot sample onehot + (p − sg(p)) (jaxutils.py:103-121@2411f7d), by Gumbel-max.

    ``argmax(logits + gumbel)`` with i.i.d. standard Gumbel noise is an exact categorical sample.
    Taking the noise as an input makes the sample source injectable: a recorded one-hot ``y`` is
    reproduced with ``gumbel = 1e9 * y``. The forward value is exactly the one-hot; the gradient
    flows to p = softmax(logits). Computed in float32 (the reference's distribution casts its
    log-probabilities up, nets.py:220@2411f7d), returned in ``dtype`` (the compute dtype of the
    latent, nets.py:70,89@2411f7d).

    Args:
        logits: (..., C) log-probabilities.
        gumbel: (..., C) float32 noise.

    Returns:
        (..., C) in ``dtype``.
    """
    logits = jnp.asarray(logits, jnp.float32)
    onehot = onehot_mode(logits + gumbel)
    probs = softmax(logits)
    return (onehot + (probs - jax.lax.stop_gradient(probs))).astype(dtype)


def actor_dist(config: DreamerV3Config, out: Array, std_pre: Array | None) -> tuple[Array, Array | None]:
    """Actor distribution parameters (nets.py:486-493,518-529@2411f7d).

    Discrete: (unimixed log-probabilities (..., A), None). Continuous: (mean = tanh(out),
    std in [minstd, maxstd]), each (..., A).
    """
    if config.discrete:
        return unimix_logits(out, config.actor_unimix), None
    return normal_head(out, std_pre, config.minstd, config.maxstd)  # type: ignore[arg-type]


def sample_latent(config: DreamerV3Config, logits: Array, gumbel: Array) -> Array:
    """The forward value of :func:`sample_onehot` (no gradient path): argmax(logits + gumbel) as a
    one-hot in the compute dtype (nets.py:89@2411f7d); logits (..., S, C) → (..., S, C)."""
    return onehot_mode(jnp.asarray(logits, jnp.float32) + gumbel).astype(config.dtype)


def actor_sample(config: DreamerV3Config, dist: tuple[Array, Array | None], noise: Array) -> Array:
    """Sample an action from :func:`actor_dist` parameters with injected noise, (..., A) → (..., A).

    Discrete: ``noise`` is Gumbel noise, the result a straight-through one-hot. Continuous: ``noise``
    is ε ~ N(0, 1) and the action mean + std·ε, not squashed and not clipped.
    """
    if config.discrete:
        return sample_onehot(dist[0], noise)
    mean, std = dist
    return mean + std * noise  # type: ignore[operator]


def actor_mode(config: DreamerV3Config, dist: tuple[Array, Array | None]) -> Array:
    """The deterministic action: argmax one-hot (discrete) or tanh mean (continuous)."""
    if config.discrete:
        return onehot_mode(dist[0])
    return dist[0]


def head_bins(config: DreamerV3Config) -> Array:
    return jnp.asarray(symexp_bins(config.bins))


def state_heads(params: dict) -> dict[str, dict]:
    """The networks that read a model state, for :func:`N.heads`: decoder, reward, continue, critic."""
    return {k: params[k] for k in ("dec", "rew", "con", "critic")}


def actor_distribution(config: DreamerV3Config, actor: dict, feat: Array) -> tuple[Array, Array | None]:
    return actor_dist(config, *N.heads(config, {"actor": actor}, feat)["actor"])


def _critic_logits(config: DreamerV3Config, critic: dict, feat: Array) -> Array:
    logits: Array = N.heads(config, {"critic": critic}, feat)["critic"]
    return logits


def _actor_log_prob(config: DreamerV3Config, dist: tuple[Array, Array | None], action: Array) -> Array:
    if config.discrete:
        return categorical_log_prob(dist[0], action)
    return normal_log_prob(dist[0], dist[1], action)  # type: ignore[arg-type]


def actor_entropy(config: DreamerV3Config, dist: tuple[Array, Array | None]) -> Array:
    if config.discrete:
        return categorical_entropy(dist[0])
    return normal_entropy(dist[1])  # type: ignore[arg-type]


def _sample_no_grad(config: DreamerV3Config, dist: tuple[Array, Array | None], noise: Array) -> Array:
    """The forward value of :func:`actor_sample`: the straight-through term p − sg(p) is exactly 0."""
    if config.discrete:
        return onehot_mode(dist[0] + noise)
    return dist[0] + dist[1] * noise  # type: ignore[operator]


# ------------------------------------------------------------------------------------------------
# Noise and rollouts
# ------------------------------------------------------------------------------------------------


def _draw_noise(config: DreamerV3Config, key: Array, shapes: dict[str, tuple[int, ...]]) -> dict[str, Array]:
    """Gumbel noise for the categorical samples and the action noise (Gumbel for a discrete actor,
    ε ~ N(0, 1) for a continuous one), of the given shapes, cut from one uniform draw
    (:func:`~sb3_worldmodels.blocks.random.gumbel_and_normal_noise`; "action" is the action noise)."""
    return gumbel_and_normal_noise(key, shapes, normal=() if config.discrete else ("action",))


def _flat_latent(x: Array) -> Array:
    """(..., S, C) → (..., S·C): a latent or its noise as a scan carries or takes it, reshaped per
    step where the classes are reduced.

    On a TPU an array whose last axis is C (4 classes for "1m") is stored padded or relaid; the whole
    (H, N, S, C) noise relaid before the scan cost more than the scan's own matmuls in the 8-seed
    update's profile. The same numbers either way."""
    return x.reshape(*x.shape[:-2], -1)


def sample_update_noise(config: DreamerV3Config, key: Array, batch_size: int, length: int) -> UpdateNoise:
    """Fresh noise for one update on a (B, T) trained window."""
    s, c, h, a = config.stoch, config.classes, config.imag_horizon, config.action_dim
    n = batch_size * length
    shapes = {"post": (batch_size, length, s, c), "imag_stoch": (h, n, s, c), "action": (h + 1, n, a)}
    noise = _draw_noise(config, key, shapes)
    return UpdateNoise(post=noise["post"], imag_stoch=noise["imag_stoch"], imag_action=noise["action"])


def observe(
    config: DreamerV3Config,
    dyn: dict,
    start: Carry,
    prev_action: Array,
    embed: Array,
    is_first: Array,
    noise: Array,
) -> tuple[Array, Array, Array]:
    """Posterior rollout over T (nets.py:53-76@2411f7d, agent.py:246-251@2411f7d): returns deter (B, T, D),
    stoch (B, T, S, C) (straight-through samples) and posterior log-probabilities (B, T, S, C), all
    in the compute dtype (the start state is cast to it, nets.py:58@2411f7d).

    The action projection ``dynin2`` does not depend on the recurrent state, so it runs once for all
    (B, T) rows before the scan.
    """
    prep = N.rssm_prepare(config, dyn, for_gradient=True)
    dtype = config.dtype
    keep = 1.0 - is_first.astype(dtype)
    action_input = N.rssm_action_input(config, dyn, prev_action * keep[..., None])

    def step(carry: tuple[Array, ...], xs: tuple[Array, ...]) -> tuple[tuple[Array, ...], tuple]:
        deter, blocks, stoch = carry  # stoch flat, (B, S·C), as in imagine
        act, emb, k, gumbel = xs
        deter, blocks = N.rssm_step(
            config, dyn, prep, deter * k[:, None], blocks * k[:, None], stoch * k[:, None], action_input=act
        )
        logits = N.rssm_posterior(config, dyn, deter, emb, prep)
        stoch = _flat_latent(sample_onehot(logits, gumbel.reshape(logits.shape), dtype))
        return (deter, blocks, stoch), (deter, stoch, _flat_latent(logits))

    xs = tuple(jnp.swapaxes(x, 0, 1) for x in (action_input, embed, keep, _flat_latent(noise)))
    deter = start.deter.astype(dtype)
    carry = (deter, N.to_blocks(config, deter), _flat_latent(start.stoch.astype(dtype)))
    _, (deter, stoch, logits) = jax.lax.scan(step, carry, xs, unroll=scan_unroll())  # type: ignore[arg-type]
    grouped = (*stoch.shape[:-1], config.stoch, config.classes)
    stoch, logits = stoch.reshape(grouped), logits.reshape(grouped)
    return tuple(jnp.swapaxes(x, 0, 1) for x in (deter, stoch, logits))  # type: ignore[return-value]


class _Imagined(NamedTuple):
    """An imagined rollout, time-major (see :func:`imagine`)."""

    feat: Array
    """(H, N, F) features of the states 0..H−1 (state 0 is the start)."""
    action: Array
    """(H, N, A) actions 0..H−1 (action k is taken in state k)."""
    prior: Array
    """(H, N, S, C) prior log-probabilities of the states 1..H."""
    slow_logits: Array
    """(H, N, n) slow-critic logits of the states 0..H−1."""
    rew_logits: Array
    """(H, N, n) reward logits of the states 0..H−1."""
    con_logits: Array
    """(H, N) continue logits of the states 0..H−1."""
    slow_value: Array
    """(H, N) slow-critic means of the states 0..H−1."""
    reward: Array
    """(H, N) reward means of the states 0..H−1."""
    cont: Array
    """(H, N) continue probabilities of the states 0..H−1."""
    last: Array
    """(N, F) features of the last state H."""


def imagine(
    config: DreamerV3Config,
    params: dict,
    deter: Array,
    stoch: Array,
    noise: UpdateNoise,
    heads: dict | None = None,
) -> _Imagined:
    """Imagination from N start states over H steps (agent.py:267-298@2411f7d), entirely without gradient.

    Step k takes state k, samples action k with ``noise.imag_action[k]`` (cast to the compute dtype
    right after sampling, agent.py:272,291@2411f7d, so the actor's log-probability is that of the
    rounded action), and steps the prior with ``noise.imag_stoch[k]`` to state k + 1. The last state's
    action (``imag_action[H]``) is not needed by the loss; :func:`loss_fn` computes it for its
    diagnostics only.

    The heads that need no gradient (``heads``: {"slow", "rew", "con"}, the slow critic and the
    reward and continue heads, whose outputs are stop-gradiented) run on each state inside the
    scan, their first layers in one matmul with the actor's: on 1/H of the rows at a time their
    activations stay in cache, and only the means and logits come out. Without ``heads`` (acting
    only) those outputs are None.

    Args:
        params: {"dyn", "actor"} (stop-gradiented here: no loss gradient reaches them this way).
        deter: (N, D) start deter; stoch: (N, S, C) start stoch.
    """
    params, heads = sg(params), sg(heads)
    dyn = params["dyn"]
    prep = N.rssm_prepare(config, dyn)
    bins = head_bins(config)
    frozen = {} if heads is None else {k: heads[k] for k in ("slow", "rew", "con")}
    nets = {"actor": params["actor"], **frozen}

    def step(carry: tuple[Array, ...], xs: tuple[Array, Array]) -> tuple[tuple, tuple]:
        deter, blocks, stoch = carry  # stoch flat, (N, S·C): the features' and the GRU's input as it is
        latent_noise, action_noise = xs
        feat = jnp.concatenate([deter, stoch], -1)
        out = N.heads(config, nets, feat)
        dist = actor_dist(config, *out["actor"])
        action = _sample_no_grad(config, dist, action_noise).astype(config.dtype)
        outs = (None,) * 6
        if heads is not None:
            slow, rew, con = out["slow"], out["rew"], out["con"][..., 0]
            outs = (slow, rew, con, twohot_mean(slow, bins), twohot_mean(rew, bins), jax.nn.sigmoid(con))  # type: ignore[assignment]
        deter, blocks = N.rssm_step(config, dyn, prep, deter, blocks, stoch, action)
        logits = N.rssm_prior(config, dyn, deter)
        stoch = _flat_latent(sample_latent(config, logits, latent_noise.reshape(logits.shape)))
        return (deter, blocks, stoch), (feat, action, logits, *outs)

    deter, stoch = sg(deter).astype(config.dtype), sg(stoch).astype(config.dtype)
    carry = (deter, N.to_blocks(config, deter), _flat_latent(stoch))
    xs = (_flat_latent(noise.imag_stoch), noise.imag_action[:-1])
    (deter, _, stoch), outs = jax.lax.scan(step, carry, xs, unroll=scan_unroll())
    return _Imagined(*outs, last=jnp.concatenate([deter, stoch], -1))  # type: ignore[misc]

"""The pure-JAX DreamerV3 core: state, acting, loss and update (agent.py:101-415@2411f7d,
jaxutils.py:398-550@2411f7d; replay context agent.py:172-183@29eb964).

Everything here is a pure function of explicit arguments; ``config`` is a static (hashable) argument.

- :func:`init_state` builds a :class:`DreamerState` (params, slow critic, optimiser state, return
  normaliser, PRNG key, update counter).
- :func:`policy_step` takes one acting step for ``n`` envs, threading a :class:`Carry`.
- :func:`loss_fn` is the loss of one batch: :func:`world_model_loss`, :func:`imagination_loss` (actor
  and critic) and :func:`replay_value_loss`, as the reference's loss groups.
- :func:`train_step` does one update on a batch of (B, T+1) replay windows; :func:`train_many` scans
  it over a leading K axis. Jitted versions: :data:`policy_step_jit`, :data:`train_step_jit`,
  :data:`train_many_jit`.

Randomness is injectable: every sample of the update (posterior latents, imagined latents, imagined
actions) is drawn from a :class:`UpdateNoise` pytree (Gumbel-max for categoricals, ε ~ N(0, 1) for the
continuous actor). :func:`train_step` draws that noise from the state's key; :func:`update_with_noise`
and :func:`loss_fn` take it as an argument, which is how recorded reference samples are replayed.

Shape symbols: B batch rows, T trained steps (the window has T+1 rows, row 0 is the replay context),
N = B·T imagination starts, H imagination horizon, D deter, S stoch latents, C classes, A action
width, O observation width, F = D + S·C, n bins.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sb3_worldmodels.blocks.breaks import broken
from sb3_worldmodels.blocks.distributions import (
    balance_stats,
    bernoulli_log_prob,
    categorical_entropy,
    categorical_kl,
    categorical_log_prob,
    free_nats,
    normal_entropy,
    normal_log_prob,
    onehot_mode,
    symlog_mse_log_prob,
)
from sb3_worldmodels.blocks.jit import agent_jit, scan_updates
from sb3_worldmodels.blocks.math import (
    imagination_weight,
    imagined_lambda_return,
    replay_lambda_return,
    symexp,
    symexp_bins,
    twohot_log_prob,
    twohot_mean,
)
from sb3_worldmodels.blocks.normalizers import (
    PercentileNormState,
    ema_update,
    percentile_norm_init,
    percentile_norm_scale,
    percentile_norm_update,
)
from sb3_worldmodels.blocks.optim import global_norm, laprop, with_learning_rate
from sb3_worldmodels.blocks.random import gumbel_and_normal_noise
from sb3_worldmodels.dreamerv3 import networks as N
from sb3_worldmodels.dreamerv3.config import DreamerV3Config
from sb3_worldmodels.dreamerv3.networks import (
    MODULES,
    actor_dist,
    actor_mode,
    features,
    init_params,
    sample_onehot,
)

Array = jax.Array
sg = jax.lax.stop_gradient

__all__ = [
    "MODULES",
    "Carry",
    "DreamerState",
    "UpdateNoise",
    "init_carry",
    "init_params",
    "imagination_loss",
    "init_state",
    "loss_fn",
    "make_optimizer",
    "param_count",
    "policy_params",
    "policy_step",
    "policy_step_jit",
    "replay_value_loss",
    "sample_update_noise",
    "set_learning_rate",
    "train_many",
    "train_many_jit",
    "train_step",
    "train_step_jit",
    "update_with_noise",
    "world_model_loss",
]

POLICY_MODULES = ("enc", "dyn", "actor")
"""The modules :func:`policy_step` needs (the reference's policy keys ``/(enc|dyn|actor)/``)."""


class Carry(NamedTuple):
    """Acting state per env (nets.py:39-45@2411f7d, driver.py:34-81@2411f7d); zeros at the start."""

    deter: Array
    """(n, D) float32 deterministic state."""
    stoch: Array
    """(n, S, C) float32 one-hot stochastic state."""
    action: Array
    """(n, A) float32 previous action (one-hot for discrete actions)."""


class DreamerState(NamedTuple):
    """Everything one agent's update reads and writes."""

    params: dict
    """{"enc", "dyn", "dec", "rew", "con", "actor", "critic"} flax parameter trees (optimised)."""
    slow_critic: dict
    """Parameter tree of the slow critic (critic structure; EMA, not optimised)."""
    opt_state: Any
    """:func:`~sb3_worldmodels.blocks.optim.laprop` state over ``params``."""
    retnorm: PercentileNormState
    """Return normaliser (5th/95th percentile EMAs)."""
    key: Array
    """(2,) uint32 PRNG key, split inside :func:`train_step` and returned advanced."""
    updates: Array
    """() int32 number of updates done (the slow critic copies the critic on the first)."""


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
# Initialisation
# ------------------------------------------------------------------------------------------------


def make_optimizer(config: DreamerV3Config) -> optax.GradientTransformation:
    """LaProp + AGC + warmup over all optimised modules (jaxutils.py:398-550,659-712@2411f7d); one
    learning rate."""
    if config.weight_decay:
        raise ValueError("weight_decay is not supported by the DreamerV3 core (the reference uses 0).")
    return laprop(
        learning_rate=config.learning_rate,
        beta1=config.beta1,
        beta2=config.beta2,
        eps=config.eps,
        agc=config.agc,
        pmin=config.agc_pmin,
        warmup=config.warmup,
    )


def head_bins(config: DreamerV3Config) -> Array:
    return jnp.asarray(symexp_bins(config.bins))


def init_state(config: DreamerV3Config, key: Array) -> DreamerState:
    """A fresh agent state from a (2,) uint32 PRNG key.

    The parameters are :func:`init_params` of the split-off key (jitted); the optimiser state is all
    zeros but the learning rate.
    """
    key = jnp.asarray(key)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    key, init_key = jax.random.split(key)
    params, slow_critic = init_params_jit(config, init_key)
    opt_shapes = jax.eval_shape(make_optimizer(config).init, params)
    opt_state = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), opt_shapes)
    params, slow_critic, opt_state = jax.device_put((params, slow_critic, opt_state))
    return DreamerState(
        params=params,
        slow_critic=slow_critic,
        opt_state=with_learning_rate(opt_state, config.learning_rate),
        retnorm=percentile_norm_init(),
        key=key,
        updates=jnp.asarray(np.int32(0)),
    )


def init_carry(config: DreamerV3Config, n: int) -> Carry:
    """Zero acting state for ``n`` envs (nets.py:39-45@2411f7d)."""
    return Carry(
        deter=jnp.zeros((n, config.deter), jnp.float32),
        stoch=jnp.zeros((n, config.stoch, config.classes), jnp.float32),
        action=jnp.zeros((n, config.action_dim), jnp.float32),
    )


def policy_params(state: DreamerState) -> dict:
    """The parameters :func:`policy_step` needs: {"enc", "dyn", "actor"}."""
    return {k: state.params[k] for k in POLICY_MODULES}


# ------------------------------------------------------------------------------------------------
# Network helpers
# ------------------------------------------------------------------------------------------------


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
# Acting
# ------------------------------------------------------------------------------------------------


def policy_step(
    config: DreamerV3Config,
    params: dict,
    carry: Carry,
    obs: N.Observation,
    is_first: Array,
    key: Array,
    deterministic: bool = False,
) -> tuple[Array, Carry, Array, Array]:
    """One acting step for ``n`` envs (nets.py:53-76@2411f7d obs_step, agent.py:145-180@2411f7d,
    agent.py:158-160@2411f7d).

    Args:
        params: at least {"enc", "dyn", "actor"} (see :func:`policy_params`).
        carry: the previous :class:`Carry`.
        obs: (n, O) float32 raw observations (symlog is applied inside the encoder), or with an image a
            dict with "image" (n, H, W, C) uint8 (and "vector" (n, O)).
        is_first: (n,) bool; the carry (deter, stoch, previous action) is zeroed where true.
        key: PRNG key for the posterior and action samples.
        deterministic: use the posterior's mode and the actor's mode (argmax / tanh mean).

    Returns:
        action (n, A) float32 (one-hot, or the unclipped Normal sample), the new carry,
        the posterior deter (n, D) float32 and stoch indices (n, S) int32 for the replay.
    """
    keep = 1.0 - jnp.asarray(is_first, jnp.float32)
    deter = carry.deter * keep[:, None]
    stoch = carry.stoch * keep[:, None, None]
    prev_action = carry.action * keep[:, None]
    embed = N.encode(config, params["enc"], obs)
    dyn = params["dyn"]
    prep = N.rssm_prepare(config, dyn)
    deter, _ = N.rssm_step(config, dyn, prep, deter, N.to_blocks(config, deter), stoch, prev_action)
    logits = N.rssm_posterior(config, dyn, deter, embed, prep)
    if deterministic:
        stoch = onehot_mode(logits)
    else:
        noise = _draw_noise(
            config, key, {"stoch": logits.shape, "action": (logits.shape[0], config.action_dim)}
        )
        stoch = onehot_mode(logits + noise["stoch"])
    dist = actor_distribution(config, params["actor"], features(deter, stoch))
    if deterministic:
        action = actor_mode(config, dist)
    else:
        action = _sample_no_grad(config, dist, noise["action"])
    action = sg(action)
    stoch = sg(stoch)
    return action, Carry(deter, stoch, action), deter, jnp.argmax(stoch, -1).astype(jnp.int32)


def _draw_noise(config: DreamerV3Config, key: Array, shapes: dict[str, tuple[int, ...]]) -> dict[str, Array]:
    """Gumbel noise for the categorical samples and the action noise (Gumbel for a discrete actor,
    ε ~ N(0, 1) for a continuous one), of the given shapes, cut from one uniform draw
    (:func:`~sb3_worldmodels.blocks.random.gumbel_and_normal_noise`; "action" is the action noise)."""
    return gumbel_and_normal_noise(key, shapes, normal=() if config.discrete else ("action",))


# ------------------------------------------------------------------------------------------------
# Loss
# ------------------------------------------------------------------------------------------------


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
    stoch (B, T, S, C) (straight-through samples) and posterior log-probabilities (B, T, S, C).

    The action projection ``dynin2`` does not depend on the recurrent state, so it runs once for all
    (B, T) rows before the scan.
    """
    prep = N.rssm_prepare(config, dyn, for_gradient=True)
    keep = 1.0 - is_first.astype(jnp.float32)
    action_input = N.rssm_action_input(config, dyn, prev_action * keep[..., None])

    def step(carry: tuple[Array, ...], xs: tuple[Array, ...]) -> tuple[tuple[Array, ...], tuple]:
        deter, blocks, stoch = carry
        act, emb, k, gumbel = xs
        deter, blocks = N.rssm_step(
            config,
            dyn,
            prep,
            deter * k[:, None],
            blocks * k[:, None],
            stoch * k[:, None, None],
            action_input=act,
        )
        logits = N.rssm_posterior(config, dyn, deter, emb, prep)
        stoch = sample_onehot(logits, gumbel)
        return (deter, blocks, stoch), (deter, stoch, logits)

    xs = tuple(jnp.swapaxes(x, 0, 1) for x in (action_input, embed, keep, noise))
    carry = (start.deter, N.to_blocks(config, start.deter), start.stoch)
    _, outs = jax.lax.scan(step, carry, xs)  # type: ignore[arg-type]
    return tuple(jnp.swapaxes(x, 0, 1) for x in outs)  # type: ignore[return-value]


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

    Step k takes state k, samples action k with ``noise.imag_action[k]``, and steps the prior with
    ``noise.imag_stoch[k]`` to state k + 1. The last state's action (``imag_action[H]``) is not needed
    by the loss; :func:`loss_fn` computes it for its diagnostics only.

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
        deter, blocks, stoch = carry
        latent_noise, action_noise = xs
        feat = features(deter, stoch)
        out = N.heads(config, nets, feat)
        dist = actor_dist(config, *out["actor"])
        action = _sample_no_grad(config, dist, action_noise)
        outs = (None,) * 6
        if heads is not None:
            slow, rew, con = out["slow"], out["rew"], out["con"][..., 0]
            outs = (slow, rew, con, twohot_mean(slow, bins), twohot_mean(rew, bins), jax.nn.sigmoid(con))  # type: ignore[assignment]
        deter, blocks = N.rssm_step(config, dyn, prep, deter, blocks, stoch, action)
        logits = N.rssm_prior(config, dyn, deter)
        stoch = onehot_mode(logits + latent_noise)
        return (deter, blocks, stoch), (feat, action, logits, *outs)

    deter, stoch = sg(deter), sg(stoch)
    carry = (deter, N.to_blocks(config, deter), stoch)
    (deter, _, stoch), outs = jax.lax.scan(step, carry, (noise.imag_stoch, noise.imag_action[:-1]))
    return _Imagined(*outs, last=features(deter, stoch))  # type: ignore[misc]


def predict_rollout(
    config: DreamerV3Config, params: dict, deter: Array, stoch: Array, actions: Array
) -> dict[str, Array]:
    """What the world model expects along given actions, open loop from posterior states.

    Like the reference's open-loop report (reporting only, no part of training): the prior steps the
    latent with each action in turn, then the decoder and heads read each state. Here the prior's
    mode is taken (no sampling), so a prediction is a function of its inputs (deviations D20).

    Args:
        params: {"dyn", "dec", "rew", "con", "critic"} at least.
        deter: (n, D) and stoch (n, S, C): posterior states, e.g. the carry after ``policy_step``.
        actions: (n, T, A) agent actions (one-hot for discrete, [-1, 1] for continuous).

    Returns:
        "observation" (n, T, O) decoded vector observations (symexp of the decoder's output; absent
        without a vector), "image" (n, T, H, W, C) decoded images in [0, 1] (with an image), "reward"
        (n, T) the reward head's mean (the reward of each step), "continue" (n, T) the continue
        head's probability, "value" (n,) the critic's mean at the last state, "deter" (n, T, D).
    """
    dyn = params["dyn"]
    prep = N.rssm_prepare(config, dyn)
    bins = head_bins(config)
    nets = state_heads(params)

    def step(carry: tuple[Array, Array, Array], action: Array) -> tuple[tuple, tuple]:
        deter, blocks, stoch = carry
        deter, blocks = N.rssm_step(config, dyn, prep, deter, blocks, stoch, action)
        stoch = onehot_mode(N.rssm_prior(config, dyn, deter))
        heads = N.heads(config, nets, features(deter, stoch))
        out = (
            {k: symexp(v) if k == "vector" else v for k, v in heads["dec"].items()},
            twohot_mean(heads["rew"], bins),
            jax.nn.sigmoid(heads["con"][..., 0]),
            twohot_mean(heads["critic"], bins),
            deter,
        )
        return (deter, blocks, stoch), out

    carry = (deter, N.to_blocks(config, deter), stoch)
    _, (obs, reward, cont, value, deters) = jax.lax.scan(step, carry, jnp.swapaxes(actions, 0, 1))
    major = functools.partial(jnp.swapaxes, axis1=0, axis2=1)
    decoded = {"observation": major(obs["vector"])} if "vector" in obs else {}
    if "image" in obs:
        decoded["image"] = major(obs["image"])
    return {
        **decoded,
        "reward": major(reward),
        "continue": major(cont),
        "value": value[-1],
        "deter": major(deters),
    }


def _batch_major(steps: Array, last: Array) -> Array:
    """(H, N, ...) and (N, ...) → (N, H+1, ...)."""
    return jnp.swapaxes(jnp.concatenate([steps, last[None]], 0), 0, 1)


def loss_fn(
    config: DreamerV3Config,
    params: dict,
    slow_critic: dict,
    retnorm: PercentileNormState,
    batch: dict[str, Array],
    noise: UpdateNoise,
) -> tuple[Array, dict[str, Any]]:
    """The total DreamerV3 loss of one batch (agent.py:246-373,413-415@2411f7d;
    agent.py:172-183@29eb964), differentiable w.r.t. ``params``: the world model's losses
    (:func:`world_model_loss`), the actor's and critic's on imagined trajectories
    (:func:`imagination_loss`) and the replay critic's (:func:`replay_value_loss`), each scaled.

    Args:
        params: the optimised parameter trees.
        slow_critic: slow-critic parameters (not differentiated).
        retnorm: the return normaliser before this step; it is updated inside (before use,
        jaxutils.py:301-395@2411f7d).
        batch: (B, T+1, ...) replay windows, row 0 the context (see :func:`train_step`).
        noise: the update's randomness (:func:`sample_update_noise`).

    Returns:
        (total loss, aux) with aux = {"metrics": scalar dict, "retnorm": new normaliser state,
        "latents": {"deter": (B, T, D), "stoch": (B, T, S) int32}, "internals": every intermediate
        tensor by name (for tests and diagnostics; unused outputs cost nothing under jit)}.

    How the work is laid out: heads that read the same features share one matmul for their first
    layers (decoder, reward, continue and critic on the replay features; actor and critic on the
    imagined ones); the heads whose imagined outputs carry no gradient (slow critic, reward,
    continue) run inside the imagination scan (:func:`imagine`); imagined tensors are time-major
    (H, N, ...); each head runs only on the imagined states the loss reads, and the diagnostics'
    other rows are computed apart (dropped under jit when unused).
    """
    frozen = sg({"slow": slow_critic, "rew": params["rew"], "con": params["con"], "critic": params["critic"]})
    rows = _trained_rows(config, batch)
    losses, wm = world_model_loss(config, params, frozen, rows, noise)
    imag_losses, imag, retnorm = imagination_loss(config, params, frozen, wm, rows, retnorm, noise)
    replay_ret, repval = replay_value_loss(config, wm, rows, imag["ret"])
    losses = {**losses, **imag_losses, "repval": repval}
    scales = {
        "rec": config.rec_scale,
        "rec_image": config.rec_image_scale,
        "rew": config.rew_scale,
        "con": config.con_scale,
        "dyn": config.dyn_scale,
        "rep": config.rep_scale,
        "actor": config.actor_scale,
        "critic": config.critic_scale,
        "repval": config.repval_scale,
    }
    if broken("rep_scale"):
        scales["rep"] = config.dyn_scale
    if broken("repval_scale"):
        scales["repval"] = 1.0
    if broken("image_loss_scale"):
        scales["rec_image"] = 0.5 * config.rec_image_scale
    means = {k: v.mean() for k, v in losses.items()}
    total: Array = sum(scales[k] * means[k] for k in losses)  # type: ignore[assignment]
    metrics = _loss_metrics(config, means, total, wm, imag, rows, retnorm, replay_ret, losses["rew"])
    internals = {
        **wm,
        **_imagination_internals(config, params, frozen, imag, noise),
        "replay_ret": replay_ret,
        "losses": losses,
    }
    latents = {"deter": sg(wm["post_deter"]), "stoch": jnp.argmax(wm["post_stoch"], -1).astype(jnp.int32)}
    aux = {"metrics": metrics, "retnorm": retnorm, "latents": latents, "internals": internals}
    return total, aux


def _trained_rows(config: DreamerV3Config, batch: dict[str, Array]) -> dict[str, Any]:
    """The trained rows t = 1..T of (B, T+1, ...) windows, float32, and the context of row 0.

    Context (agent.py:188-199@2411f7d, with the fix agent.py:172-183@29eb964): row 0 gives the
    initial latent and previous action."""
    f32 = jnp.float32
    is_terminal = batch["is_terminal"][:, 1:]
    return {
        "start": Carry(
            deter=batch["deter"][:, 0].astype(f32),
            stoch=jax.nn.one_hot(batch["stoch"][:, 0], config.classes, dtype=f32),
            action=batch["action"][:, 0].astype(f32),
        ),
        "prev_action": batch["action"][:, :-1].astype(f32),  # action t-1 for trained rows t = 1..T
        "obs": _trained_observation(config, batch),
        "reward": batch["reward"][:, 1:].astype(f32),
        "is_first": batch["is_first"][:, 1:],
        "is_last": batch["is_last"][:, 1:],
        "is_terminal": is_terminal,
        "cont": 1.0 - is_terminal.astype(f32),
    }


def _trained_observation(config: DreamerV3Config, batch: dict[str, Array]) -> N.Observation:
    """The trained rows' observation (an :data:`~.networks.Observation`): "obs" (B, T, O) float32
    and, with an image, "image" (B, T, H, W, C) uint8 from the batch's rows 1..T."""
    vector = batch["obs"][:, 1:].astype(jnp.float32) if config.obs_dim else None
    if not config.image_shape:
        return vector  # type: ignore[return-value]
    image = batch["image"][:, 1:]
    return {"image": image} if vector is None else {"vector": vector, "image": image}


def reconstruction_losses(
    config: DreamerV3Config, dec: dict[str, Array], obs: N.Observation
) -> dict[str, Array]:
    """The decoder's negative log-likelihoods (B, T): "rec", summed over the vector's keys (symlog MSE,
    jaxutils.py:179-207@2411f7d), and "rec_image", summed over every image key's pixels and channels
    (the squared error against the image / 255, ``MSEDist(..., 3, 'sum')``, nets.py:362@2411f7d,
    agent.py:469-470@2411f7d); each only when the observation has it."""
    vector, image = N.split_observation(obs)
    losses = {}
    if vector is not None:
        losses["rec"] = -symlog_mse_log_prob(dec["vector"], vector)
    if image is not None:
        target = jnp.asarray(image, jnp.float32) * N.PIXEL_SCALE
        losses["rec_image"] = jnp.square(dec["image"] - target).sum((-3, -2, -1))
    return losses


def world_model_loss(
    config: DreamerV3Config, params: dict, frozen: dict, rows: dict[str, Any], noise: UpdateNoise
) -> tuple[dict[str, Array], dict[str, Array]]:
    """The world model's losses (agent.py:246-261@2411f7d): reconstruction, reward, continue and the
    dyn/rep KL terms, (B, T) each; and its tensors, with the replay critic's logits on the same
    posterior features (agent.py:352-373@2411f7d). ``frozen``: the heads without gradient.

    Returns (losses, tensors), each by name (the convention of both agents' loss functions)."""
    bins = head_bins(config)
    embed = N.encode(config, params["enc"], rows["obs"])
    deter, stoch, post = observe(
        config, params["dyn"], rows["start"], rows["prev_action"], embed, rows["is_first"], noise.post
    )
    prior = N.rssm_prior(config, params["dyn"], deter)
    feat = features(deter, stoch)
    heads = N.heads(config, state_heads(params), feat)
    dec_out, rew_logits, replay_logits = heads["dec"], heads["rew"], heads["critic"]
    con_logits = heads["con"][..., 0]
    dyn_kl = categorical_kl(sg(post), prior).sum(-1)
    rep_kl = categorical_kl(post, prior if broken("rep_stop_gradient") else sg(prior)).sum(-1)
    losses = {
        **reconstruction_losses(config, dec_out, rows["obs"]),
        "rew": -twohot_log_prob(rew_logits, rows["reward"], bins),
        "con": -bernoulli_log_prob(
            con_logits, rows["cont"] * (1.0 if broken("continue_target") else config.gamma)
        ),
        "dyn": dyn_kl if broken("free_nats") else free_nats(dyn_kl, config.free_nats),
        "rep": free_nats(rep_kl, config.free_nats),
    }
    tensors = {
        "embed": embed,
        "post_deter": deter,
        "post_stoch": stoch,
        "post_logits": post,
        "prior_logits": prior,
        "dyn_kl": dyn_kl,
        "rep_kl": rep_kl,
        "dec_out": dec_out,
        "rew_logits": rew_logits,
        "con_logits": con_logits,
        "replay_critic_logits": replay_logits,
        "replay_critic_mean": twohot_mean(replay_logits, bins),
        "replay_slow_mean": sg(twohot_mean(_critic_logits(config, frozen["slow"], sg(feat)), bins)),
    }
    return losses, tensors


def imagination_loss(
    config: DreamerV3Config,
    params: dict,
    frozen: dict,
    wm: dict[str, Array],
    rows: dict[str, Any],
    retnorm: PercentileNormState,
    noise: UpdateNoise,
) -> tuple[dict[str, Array], dict[str, Any], PercentileNormState]:
    """The actor's and critic's losses (N, H) on trajectories imagined from all N = B·T posterior
    states (agent.py:267-350@2411f7d): imagination, time-major, annotated with the replay's reward
    and continue at the start (agent.py:301-317@2411f7d); lambda returns; the return normaliser,
    updated before use (agent.py:320-326@2411f7d, jaxutils.py:301-395@2411f7d); the actor
    (agent.py:329-342@2411f7d) and critic (agent.py:345-350@2411f7d). Returns (losses, tensors,
    the new normaliser)."""
    bins = head_bins(config)
    reward, cont = rows["reward"], rows["cont"]
    n = reward.size
    img = imagine(
        config,
        {"dyn": params["dyn"], "actor": params["actor"]},
        wm["post_deter"].reshape(n, -1),
        wm["post_stoch"].reshape(n, config.stoch, config.classes),
        noise,
        heads={"slow": frozen["slow"], "rew": frozen["rew"], "con": frozen["con"]},
    )
    img_feat, last_feat = sg(img.feat), sg(img.last)
    steps = N.heads(config, {"actor": params["actor"], "critic": params["critic"]}, img_feat)
    dist = actor_dist(config, *steps["actor"])  # steps 0..H-1
    critic_logits = steps["critic"]  # steps 0..H-1
    last = N.heads(config, {k: frozen[k] for k in ("critic", "rew", "con")}, last_feat)
    last_critic_logits, last_rew_logits = last["critic"], last["rew"]
    last_con_logits = last["con"][..., 0]

    # (N, H+1) sequences, index 0 = start: the start's reward and continue come from the replay.
    img_reward = jnp.concatenate(
        [reward.reshape(n, 1), img.reward[1:].T, twohot_mean(last_rew_logits, bins)[:, None]], 1
    )
    img_cont = jnp.concatenate(
        [cont.reshape(n, 1), img.cont[1:].T, jax.nn.sigmoid(last_con_logits)[:, None]], 1
    )
    img_reward, img_cont = sg(img_reward), sg(img_cont)
    weight = sg(jnp.ones_like(img_cont) if broken("imagination_weight") else imagination_weight(img_cont))
    value = jnp.concatenate(
        [twohot_mean(critic_logits, bins).T, twohot_mean(last_critic_logits, bins)[:, None]], 1
    )
    slow_value = sg(img.slow_value)  # (H, N)

    lam = 1.0 if broken("lambda") else config.lam
    ret = sg(imagined_lambda_return(img_reward, img_cont, sg(value), lam))  # (N, H)
    retnorm_rate = 2 * config.retnorm_rate if broken("retnorm_rate") else config.retnorm_rate
    retnorm = percentile_norm_update(retnorm, ret, retnorm_rate)
    _, ret_scale = percentile_norm_scale(retnorm, config.retnorm_limit)
    adv = sg(ret - value[:, :-1]) if broken("return_normaliser") else sg((ret - value[:, :-1]) / ret_scale)
    log_pi = _actor_log_prob(config, dist, img.action).T
    entropy = actor_entropy(config, dist).T
    critic_lp = twohot_log_prob(critic_logits, ret.T, bins)
    slowreg = 0.0 if broken("slowreg") else config.slowreg
    critic_lp += slowreg * twohot_log_prob(critic_logits, slow_value, bins)
    actent = 0.0 if broken("actor_entropy") else config.actent
    losses = {
        "actor": -weight[:, :-1] * (log_pi * adv + actent * entropy),
        "critic": -weight[:, :-1] * critic_lp.T,
    }
    tensors = {
        "img": img,
        "dist": dist,
        "critic_logits": critic_logits,
        "last_critic_logits": last_critic_logits,
        "last_rew_logits": last_rew_logits,
        "last_con_logits": last_con_logits,
        "img_reward": img_reward,
        "img_cont": img_cont,
        "img_weight": weight,
        "img_value": value,
        "slow_value": slow_value,
        "ret": ret,
        "ret_scale": ret_scale,
        "adv": adv,
        "entropy": entropy,
    }
    return losses, tensors, retnorm


def replay_value_loss(
    config: DreamerV3Config, wm: dict[str, Array], rows: dict[str, Any], ret: Array
) -> tuple[Array, Array]:
    """The replay critic's loss (agent.py:352-373@2411f7d): the critic on the posterior states, with
    gradient, toward lambda returns of the replay rows bootstrapped by the imagined returns' first
    step, and toward the slow critic. Returns (replay returns (B, T-1), loss (B, T-1))."""
    bins = head_bins(config)
    reward, is_last = rows["reward"], rows["is_last"]
    b, t = reward.shape
    boot = ret[:, 0].reshape(b, t)
    replay_ret = sg(
        replay_lambda_return(reward, rows["is_terminal"], is_last, boot, config.gamma, config.repval_lam)
    )
    replay_logits, replay_slow = wm["replay_critic_logits"], wm["replay_slow_mean"]
    live = 1.0 - is_last[:, :-1].astype(jnp.float32)
    loss = -live * (
        twohot_log_prob(replay_logits[:, :-1], replay_ret, bins)
        + config.slowreg * twohot_log_prob(replay_logits[:, :-1], replay_slow[:, :-1], bins)
    )
    return replay_ret, loss


def _loss_metrics(
    config: DreamerV3Config,
    means: dict[str, Array],
    total: Array,
    wm: dict[str, Array],
    imag: dict[str, Any],
    rows: dict[str, Any],
    retnorm: PercentileNormState,
    replay_ret: Array,
    rew_loss: Array,
) -> dict[str, Array]:
    """The update's scalar metrics: each loss, the return normaliser, the spread of returns, values
    and rewards (the reference logs these as ret/*, val/*, rew/*), entropies, and the heads' loss and
    accuracy on rare rows (terminations, rewards), as the reference logs them."""
    bins = head_bins(config)
    ret, value, img_reward = imag["ret"], imag["img_value"], imag["img_reward"]
    metrics = {f"{k}_loss": v for k, v in means.items()}
    metrics.update(
        loss=total,
        retnorm_scale=imag["ret_scale"],
        retnorm_low=retnorm.low,
        retnorm_high=retnorm.high,
        return_mean=ret.mean(),
        return_std=ret.std(),
        return_min=ret.min(),
        return_max=ret.max(),
        value_mean=value.mean(),
        value_std=value.std(),
        adv_mean=imag["adv"].mean(),
        weight_mean=imag["img_weight"].mean(),
        imag_reward_mean=img_reward.mean(),
        imag_reward_std=img_reward.std(),
        replay_return_mean=replay_ret.mean(),
        actor_entropy=imag["entropy"].mean(),
        post_entropy=categorical_entropy(wm["post_logits"]).sum(-1).mean(),
        prior_entropy=categorical_entropy(wm["prior_logits"]).sum(-1).mean(),
    )
    con_logits, cont = wm["con_logits"], rows["cont"]
    con_stats = balance_stats(jax.nn.sigmoid(con_logits), -bernoulli_log_prob(con_logits, cont), cont, 0.5)
    rew_stats = balance_stats(twohot_mean(wm["rew_logits"], bins), rew_loss, rows["reward"], 0.1)
    metrics.update({f"constats/{k}": v for k, v in con_stats.items()})
    metrics.update({f"rewstats/{k}": v for k, v in rew_stats.items()})
    return metrics


def _imagination_internals(
    config: DreamerV3Config, params: dict, frozen: dict, imag: dict[str, Any], noise: UpdateNoise
) -> dict[str, Any]:
    """Diagnostics of the imagined trajectories, batch-major with all H+1 steps (unused under jit,
    they cost nothing)."""
    bins, d = head_bins(config), config.deter
    img = imag["img"]
    last_feat = sg(img.last)
    n = last_feat.shape[0]
    last_dist = actor_distribution(config, sg(params["actor"]), last_feat)
    last_action = _sample_no_grad(config, last_dist, noise.imag_action[-1])
    last_slow_logits = _critic_logits(config, frozen["slow"], last_feat)
    img_all_feat = jnp.concatenate([sg(img.feat), last_feat[None]], 0)
    return {
        "img_deter": jnp.swapaxes(img_all_feat[..., :d], 0, 1),
        "img_stoch": jnp.swapaxes(img_all_feat[..., d:], 0, 1).reshape(n, -1, config.stoch, config.classes),
        "img_action": _batch_major(img.action, last_action),
        "img_prior_logits": jnp.swapaxes(img.prior, 0, 1),
        "img_rew_logits": _batch_major(img.rew_logits, imag["last_rew_logits"]),
        "img_con_logits": _batch_major(img.con_logits, imag["last_con_logits"]),
        "img_reward": imag["img_reward"],
        "img_cont": imag["img_cont"],
        "img_weight": imag["img_weight"],
        "img_actor": tuple(
            None if x is None else _batch_major(x, y)  # type: ignore[arg-type]
            for x, y in zip(imag["dist"], last_dist, strict=True)
        ),
        "img_critic_logits": _batch_major(imag["critic_logits"], imag["last_critic_logits"]),
        "img_slow_logits": _batch_major(img.slow_logits, last_slow_logits),
        "img_value": imag["img_value"],
        "img_slow_value": _batch_major(imag["slow_value"], sg(twohot_mean(last_slow_logits, bins))),
        "ret": imag["ret"],
        "adv": imag["adv"],
    }


# ------------------------------------------------------------------------------------------------
# Update
# ------------------------------------------------------------------------------------------------


def update_with_noise(
    config: DreamerV3Config, state: DreamerState, batch: dict[str, Array], noise: UpdateNoise
) -> tuple[DreamerState, dict[str, Array], dict[str, Array], dict[str, Any]]:
    """One update with given noise (the reference's train step after sampling,
    agent.py:188-218@2411f7d); ``state.key`` is left unchanged.

    Returns:
        (new state, scalar metrics, replay latents, aux with "grads" (before AGC), "updates" (the applied
        parameter deltas before the add) and "internals" (see :func:`loss_fn`)).
    """
    grad_fn = jax.value_and_grad(loss_fn, argnums=1, has_aux=True)
    (_, aux), grads = grad_fn(config, state.params, state.slow_critic, state.retnorm, batch, noise)
    updates, opt_state = make_optimizer(config).update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    slow_rate = 0.5 * config.slow_rate if broken("slow_critic_rate") else config.slow_rate
    first = state.updates < 0 if broken("slow_critic_copy") else state.updates == 0
    slow_critic = ema_update(state.slow_critic, params["critic"], slow_rate, first)
    metrics = dict(aux["metrics"])
    metrics.update(
        grad_norm=global_norm(grads),
        update_norm=global_norm(updates),
        param_norm=global_norm(state.params),
    )
    new_state = DreamerState(
        params=params,
        slow_critic=slow_critic,
        opt_state=opt_state,
        retnorm=aux["retnorm"],
        key=state.key,
        updates=state.updates + 1,
    )
    extra = {"grads": grads, "updates": updates, "internals": aux["internals"]}
    return new_state, metrics, aux["latents"], extra


def train_step(
    config: DreamerV3Config, state: DreamerState, batch: dict[str, Array]
) -> tuple[DreamerState, dict[str, Array], dict[str, Array]]:
    """One DreamerV3 update on a batch of replay windows (agent.py:188-218@2411f7d;
    agent.py:172-183@29eb964).

    Args:
        batch: arrays with a leading (B, T+1): "obs" (B, T+1, O) f32, "action" (B, T+1, A) f32
            (one-hot for discrete), "reward" (B, T+1) f32, "is_first"/"is_last"/"is_terminal"
            (B, T+1) bool, "deter" (B, T+1, D) f32 and "stoch" (B, T+1, S) int32 stored latents.
            Row 0 is the replay context: its latent and action start the rollout; rows 1..T train.

    Returns:
        (new state, scalar metrics, replay latents {"deter": (B, T, D) f32, "stoch": (B, T, S) int32}
        for write-back into rows 1..T).
    """
    key, noise_key = jax.random.split(state.key)
    b, t1 = batch["reward"].shape
    noise = sample_update_noise(config, noise_key, b, t1 - 1)
    new_state, metrics, latents, _ = update_with_noise(config, state, batch, noise)
    return new_state._replace(key=key), metrics, latents


def train_many(
    config: DreamerV3Config, state: DreamerState, batches: dict[str, Array]
) -> tuple[DreamerState, dict[str, Array], dict[str, Array]]:
    """K updates in one call: :func:`train_step` scanned over the leading K axis (no loop when K is 1,
    :func:`~sb3_worldmodels.blocks.jit.scan_updates`).

    Returns:
        (state after K updates, metrics of every update with a leading K, latents with a leading K).
    """

    def body(carry: DreamerState, batch: dict[str, Array]) -> tuple[DreamerState, tuple[dict, dict]]:
        carry, metrics, latents = train_step(config, carry, batch)
        return carry, (metrics, latents)

    state, (metrics, latents) = scan_updates(body, state, batches)
    return state, metrics, latents


def set_learning_rate(state: DreamerState, learning_rate: float) -> DreamerState:
    """``state`` with the optimiser's learning rate set (a () float32 array: no retrace)."""
    return with_learning_rate(state, learning_rate)


policy_step_jit = agent_jit(policy_step, static_argnames=("deterministic",))
"""Jitted :func:`policy_step`; ``config`` and ``deterministic`` are static."""
train_step_jit = agent_jit(train_step)
"""Jitted :func:`train_step`; ``config`` is static."""
train_many_jit = agent_jit(train_many)
"""Jitted :func:`train_many`; ``config`` is static."""
predict_rollout_jit = agent_jit(predict_rollout)
"""Jitted :func:`predict_rollout`; ``config`` is static."""
init_params_jit = agent_jit(init_params)
"""Jitted :func:`~sb3_worldmodels.dreamerv3.networks.init_params`; ``config`` is static."""


@functools.cache
def param_count(config: DreamerV3Config) -> int:
    """Number of optimised parameters (excluding the slow critic) for a config."""
    shapes = jax.eval_shape(lambda k: init_params(config, k)[0], jax.ShapeDtypeStruct((2,), jnp.uint32))
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes)))

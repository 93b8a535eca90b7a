"""The pure-JAX DreamerV3 core: state, acting, loss and update (``specs/dreamerv3.md`` §3-§11, §15).

Everything here is a pure function of explicit arguments; ``config`` is a static (hashable) argument.

- :func:`init_state` builds a :class:`DreamerState` (params, slow critic, optimiser state, return
  normaliser, PRNG key, update counter).
- :func:`policy_step` takes one acting step for ``n`` envs, threading a :class:`Carry`.
- :func:`train_step` does one update on a batch of (B, T+1) replay windows; :func:`train_many` scans
  it over a leading K axis. Jitted versions: :data:`policy_step_jit`, :data:`train_step_jit`,
  :data:`train_many_jit`.

Randomness is injectable: every sample of the update (posterior latents, imagined latents, imagined
actions) is drawn from a :class:`Noise` pytree (Gumbel-max for categoricals, ε ~ N(0, 1) for the
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

from sb3_worldmodels.blocks.distributions import (
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
from sb3_worldmodels.blocks.math import (
    imagination_weight,
    imagined_lambda_return,
    replay_lambda_return,
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
from sb3_worldmodels.blocks.optim import laprop
from sb3_worldmodels.dreamerv3.config import DreamerV3Config
from sb3_worldmodels.dreamerv3.networks import (
    actor_dist,
    actor_mode,
    actor_sample,
    features,
    make_networks,
    sample_onehot,
)

Array = jax.Array
sg = jax.lax.stop_gradient

__all__ = [
    "MODULES",
    "Carry",
    "DreamerState",
    "Noise",
    "init_carry",
    "init_params",
    "init_state",
    "loss_fn",
    "make_optimizer",
    "param_count",
    "policy_params",
    "policy_step",
    "policy_step_jit",
    "sample_noise",
    "train_many",
    "train_many_jit",
    "train_step",
    "train_step_jit",
    "update_with_noise",
]

MODULES = ("enc", "dyn", "dec", "rew", "con", "actor", "critic")
"""The optimised modules, in the reference's order (agent.py:101-103)."""

POLICY_MODULES = ("enc", "dyn", "actor")
"""The modules :func:`policy_step` needs (the reference's policy keys ``/(enc|dyn|actor)/``)."""


class Carry(NamedTuple):
    """Acting state per env (§3.1, §13.1); zeros at the start."""

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


class Noise(NamedTuple):
    """All randomness of one update (§3.5, §7.1, §7.3); see :func:`sample_noise`."""

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
    """LaProp + AGC + warmup over all optimised modules (§10); one learning rate."""
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


def _bins(config: DreamerV3Config) -> Array:
    return jnp.asarray(symexp_bins(config.bins))


def init_params(config: DreamerV3Config, key: Array) -> tuple[dict, dict]:
    """Fresh parameters (§8.2): (params of :data:`MODULES`, an independently initialised slow critic)."""
    nets = make_networks(config)
    keys = dict(zip((*MODULES, "slow_critic"), jax.random.split(key, len(MODULES) + 1), strict=True))
    n = 1
    deter = jnp.zeros((n, config.deter), jnp.float32)
    stoch = jnp.zeros((n, config.stoch, config.classes), jnp.float32)
    action = jnp.zeros((n, config.action_dim), jnp.float32)
    obs = jnp.zeros((n, config.obs_dim), jnp.float32)
    feat = jnp.zeros((n, config.feat_dim), jnp.float32)
    embed = jnp.zeros((n, config.units), jnp.float32)
    params = {
        "enc": nets.enc.init(keys["enc"], obs)["params"],
        "dyn": nets.dyn.init(keys["dyn"], deter, stoch, action, embed)["params"],
        "dec": nets.dec.init(keys["dec"], feat)["params"],
        "rew": nets.rew.init(keys["rew"], feat)["params"],
        "con": nets.con.init(keys["con"], feat)["params"],
        "actor": nets.actor.init(keys["actor"], feat)["params"],
        "critic": nets.critic.init(keys["critic"], feat)["params"],
    }
    slow_critic = nets.critic.init(keys["slow_critic"], feat)["params"]
    return params, slow_critic


def init_state(config: DreamerV3Config, key: Array) -> DreamerState:
    """A fresh agent state from a (2,) uint32 PRNG key."""
    key = jnp.asarray(key)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    key, init_key = jax.random.split(key)
    params, slow_critic = init_params(config, init_key)
    return DreamerState(
        params=params,
        slow_critic=slow_critic,
        opt_state=make_optimizer(config).init(params),
        retnorm=percentile_norm_init(),
        key=key,
        updates=jnp.zeros((), jnp.int32),
    )


def init_carry(config: DreamerV3Config, n: int) -> Carry:
    """Zero acting state for ``n`` envs (§3.1)."""
    return Carry(
        deter=jnp.zeros((n, config.deter), jnp.float32),
        stoch=jnp.zeros((n, config.stoch, config.classes), jnp.float32),
        action=jnp.zeros((n, config.action_dim), jnp.float32),
    )


def policy_params(state: DreamerState) -> dict:
    """The parameters :func:`policy_step` needs: {"enc", "dyn", "actor"}."""
    return {k: state.params[k] for k in POLICY_MODULES}


# ------------------------------------------------------------------------------------------------
# Module application helpers
# ------------------------------------------------------------------------------------------------


def _apply(module: Any, params: dict, *args: Any, method: Any = None) -> Any:
    return module.apply({"params": params}, *args, method=method)


def _core(config: DreamerV3Config, dyn: dict, deter: Array, stoch: Array, action: Array) -> Array:
    rssm = make_networks(config).dyn
    return _apply(rssm, dyn, deter, stoch, action, method=type(rssm).core)


def _prior(config: DreamerV3Config, dyn: dict, deter: Array) -> Array:
    rssm = make_networks(config).dyn
    return _apply(rssm, dyn, deter, method=type(rssm).prior)


def _posterior(config: DreamerV3Config, dyn: dict, deter: Array, embed: Array) -> Array:
    rssm = make_networks(config).dyn
    return _apply(rssm, dyn, deter, embed, method=type(rssm).posterior)


def _actor(config: DreamerV3Config, actor: dict, feat: Array) -> tuple[Array, Array | None]:
    return actor_dist(config, *_apply(make_networks(config).actor, actor, feat))


def _actor_log_prob(config: DreamerV3Config, dist: tuple[Array, Array | None], action: Array) -> Array:
    if config.discrete:
        return categorical_log_prob(dist[0], action)
    return normal_log_prob(dist[0], dist[1], action)


def _actor_entropy(config: DreamerV3Config, dist: tuple[Array, Array | None]) -> Array:
    if config.discrete:
        return categorical_entropy(dist[0])
    return normal_entropy(dist[1])


# ------------------------------------------------------------------------------------------------
# Acting
# ------------------------------------------------------------------------------------------------


def policy_step(
    config: DreamerV3Config,
    params: dict,
    carry: Carry,
    obs: Array,
    is_first: Array,
    key: Array,
    deterministic: bool = False,
) -> tuple[Array, Carry, Array, Array]:
    """One acting step for ``n`` envs (§3.6 obs_step, §7.1, §11.1).

    Args:
        params: at least {"enc", "dyn", "actor"} (see :func:`policy_params`).
        carry: the previous :class:`Carry`.
        obs: (n, O) float32 raw observations (symlog is applied inside the encoder).
        is_first: (n,) bool; the carry (deter, stoch, previous action) is zeroed where true.
        key: PRNG key for the posterior and action samples.
        deterministic: use the posterior's mode and the actor's mode (argmax / tanh mean).

    Returns:
        action (n, A) float32 (one-hot, or the unclipped Normal sample), the new carry,
        the posterior deter (n, D) float32 and stoch indices (n, S) int32 for the replay.
    """
    nets = make_networks(config)
    keep = 1.0 - jnp.asarray(is_first, jnp.float32)
    deter = carry.deter * keep[:, None]
    stoch = carry.stoch * keep[:, None, None]
    prev_action = carry.action * keep[:, None]
    embed = _apply(nets.enc, params["enc"], obs)
    deter = _core(config, params["dyn"], deter, stoch, prev_action)
    logits = _posterior(config, params["dyn"], deter, embed)
    latent_key, action_key = jax.random.split(key)
    if deterministic:
        stoch = onehot_mode(logits)
    else:
        stoch = sample_onehot(logits, jax.random.gumbel(latent_key, logits.shape, jnp.float32))
    dist = _actor(config, params["actor"], features(deter, stoch))
    if deterministic:
        action = actor_mode(config, dist)
    else:
        action = actor_sample(config, dist, _action_noise(config, action_key, dist[0].shape))
    action = sg(action)
    stoch = sg(stoch)
    return action, Carry(deter, stoch, action), deter, jnp.argmax(stoch, -1).astype(jnp.int32)


def _action_noise(config: DreamerV3Config, key: Array, shape: tuple[int, ...]) -> Array:
    if config.discrete:
        return jax.random.gumbel(key, shape, jnp.float32)
    return jax.random.normal(key, shape, jnp.float32)


# ------------------------------------------------------------------------------------------------
# Loss
# ------------------------------------------------------------------------------------------------


def sample_noise(config: DreamerV3Config, key: Array, batch_size: int, length: int) -> Noise:
    """Fresh noise for one update on a (B, T) trained window."""
    s, c, h, a = config.stoch, config.classes, config.imag_horizon, config.action_dim
    n = batch_size * length
    post_key, stoch_key, action_key = jax.random.split(key, 3)
    return Noise(
        post=jax.random.gumbel(post_key, (batch_size, length, s, c), jnp.float32),
        imag_stoch=jax.random.gumbel(stoch_key, (h, n, s, c), jnp.float32),
        imag_action=_action_noise(config, action_key, (h + 1, n, a)),
    )


def _observe(
    config: DreamerV3Config,
    dyn: dict,
    start: Carry,
    prev_action: Array,
    embed: Array,
    is_first: Array,
    noise: Array,
) -> tuple[Array, Array, Array]:
    """Posterior rollout over T (§3.6, §6): returns deter (B, T, D), stoch (B, T, S, C) (straight-through
    samples) and posterior log-probabilities (B, T, S, C)."""

    def step(carry: tuple[Array, Array], xs: tuple[Array, ...]) -> tuple[tuple[Array, Array], tuple]:
        deter, stoch = carry
        action, emb, first, gumbel = xs
        keep = 1.0 - first.astype(jnp.float32)
        deter = _core(config, dyn, deter * keep[:, None], stoch * keep[:, None, None], action * keep[:, None])
        logits = _posterior(config, dyn, deter, emb)
        stoch = sample_onehot(logits, gumbel)
        return (deter, stoch), (deter, stoch, logits)

    xs = tuple(jnp.swapaxes(x, 0, 1) for x in (prev_action, embed, is_first, noise))
    _, outs = jax.lax.scan(step, (start.deter, start.stoch), xs)
    return tuple(jnp.swapaxes(x, 0, 1) for x in outs)


def _imagine(
    config: DreamerV3Config,
    params: dict,
    deter: Array,
    stoch: Array,
    noise: Noise,
) -> tuple[Array, Array, Array, Array]:
    """Imagination from N start states over H steps (§7.3), entirely without gradient.

    Args:
        params: {"dyn", "actor"} (stop-gradiented here: no loss gradient reaches them this way).
        deter: (N, D) start deter; stoch: (N, S, C) start stoch.

    Returns:
        deter (N, H+1, D), stoch (N, H+1, S, C), actions (N, H+1, A), prior log-probs (N, H, S, C);
        index 0 is the start state and its action.
    """
    params = sg(params)
    deter, stoch = sg(deter), sg(stoch)

    def policy(deter: Array, stoch: Array, action_noise: Array) -> Array:
        dist = _actor(config, params["actor"], features(deter, stoch))
        return sg(actor_sample(config, dist, action_noise))

    def step(carry: tuple[Array, Array, Array], xs: tuple[Array, Array]) -> tuple[tuple, tuple]:
        deter, stoch, action = carry
        latent_noise, action_noise = xs
        deter = _core(config, params["dyn"], deter, stoch, action)
        logits = _prior(config, params["dyn"], deter)
        stoch = sg(sample_onehot(logits, latent_noise))
        action = policy(deter, stoch, action_noise)
        return (deter, stoch, action), (deter, stoch, action, logits)

    action = policy(deter, stoch, noise.imag_action[0])

    _, (deters, stochs, actions, logits) = jax.lax.scan(
        step, (deter, stoch, action), (noise.imag_stoch, noise.imag_action[1:])
    )

    def with_start(start: Array, steps: Array) -> Array:  # (N, ...), (H, N, ...) -> (N, H+1, ...)
        return jnp.concatenate([start[:, None], jnp.swapaxes(steps, 0, 1)], 1)

    imagined = (with_start(deter, deters), with_start(stoch, stochs), with_start(action, actions))
    return (*imagined, jnp.swapaxes(logits, 0, 1))


def loss_fn(
    config: DreamerV3Config,
    params: dict,
    slow_critic: dict,
    retnorm: PercentileNormState,
    batch: dict[str, Array],
    noise: Noise,
) -> tuple[Array, dict[str, Any]]:
    """The total DreamerV3 loss of one batch (§6-§8.1, §11), differentiable w.r.t. ``params``.

    Args:
        params: the optimised parameter trees.
        slow_critic: slow-critic parameters (not differentiated).
        retnorm: the return normaliser before this step; it is updated inside (before use, §7.6).
        batch: (B, T+1, ...) replay windows, row 0 the context (see :func:`train_step`).
        noise: the update's randomness (:func:`sample_noise`).

    Returns:
        (total loss, aux) with aux = {"metrics": scalar dict, "retnorm": new normaliser state,
        "latents": {"deter": (B, T, D), "stoch": (B, T, S) int32}, "internals": every intermediate
        tensor by name (for tests and diagnostics; unused outputs cost nothing under jit)}.
    """
    nets = make_networks(config)
    bins = _bins(config)
    f32 = jnp.float32

    # Context (§11.2, with the 29eb964 fix): row 0 gives the initial latent and previous action.
    start = Carry(
        deter=batch["deter"][:, 0].astype(f32),
        stoch=jax.nn.one_hot(batch["stoch"][:, 0], config.classes, dtype=f32),
        action=batch["action"][:, 0].astype(f32),
    )
    prev_action = batch["action"][:, :-1].astype(f32)  # action t-1 for trained rows t = 1..T
    obs = batch["obs"][:, 1:].astype(f32)
    reward = batch["reward"][:, 1:].astype(f32)
    is_first = batch["is_first"][:, 1:]
    is_last = batch["is_last"][:, 1:]
    is_terminal = batch["is_terminal"][:, 1:]
    cont = 1.0 - is_terminal.astype(f32)
    b, t = reward.shape

    # World model (§3-§6).
    embed = _apply(nets.enc, params["enc"], obs)
    deter, stoch, post = _observe(config, params["dyn"], start, prev_action, embed, is_first, noise.post)
    prior = _prior(config, params["dyn"], deter)
    feat = features(deter, stoch)
    dec_out = _apply(nets.dec, params["dec"], feat)
    rew_logits = _apply(nets.rew, params["rew"], feat)
    con_logits = _apply(nets.con, params["con"], feat)[..., 0]
    dyn_kl = categorical_kl(sg(post), prior).sum(-1)
    rep_kl = categorical_kl(post, sg(prior)).sum(-1)
    losses = {
        "rec": -symlog_mse_log_prob(dec_out, obs),
        "rew": -twohot_log_prob(rew_logits, reward, bins),
        "con": -bernoulli_log_prob(con_logits, cont * config.gamma),
        "dyn": free_nats(dyn_kl, config.free_nats),
        "rep": free_nats(rep_kl, config.free_nats),
    }

    # Imagination from all B·T posterior states (§7.3), annotated (§7.4).
    n = b * t
    img_deter, img_stoch, img_action, img_prior = _imagine(
        config,
        {"dyn": params["dyn"], "actor": params["actor"]},
        deter.reshape(n, -1),
        stoch.reshape(n, config.stoch, config.classes),
        noise,
    )
    img_feat = sg(features(img_deter, img_stoch))
    img_rew_logits = _apply(nets.rew, params["rew"], img_feat)
    img_con_logits = _apply(nets.con, params["con"], img_feat)[..., 0]
    img_reward = jnp.concatenate([reward.reshape(n, 1), twohot_mean(img_rew_logits, bins)[:, 1:]], 1)
    img_cont = jnp.concatenate([cont.reshape(n, 1), jax.nn.sigmoid(img_con_logits)[:, 1:]], 1)
    img_reward, img_cont = sg(img_reward), sg(img_cont)
    weight = sg(imagination_weight(img_cont))
    dist = _actor(config, params["actor"], img_feat)
    critic_logits = _apply(nets.critic, params["critic"], img_feat)
    slow_logits = _apply(nets.critic, sg(slow_critic), img_feat)
    value = twohot_mean(critic_logits, bins)
    slow_value = sg(twohot_mean(slow_logits, bins))

    # Returns, normaliser (updated before use, §7.5-§7.6), actor (§7.7) and critic (§7.8).
    ret = sg(imagined_lambda_return(img_reward, img_cont, sg(value), config.lam))
    retnorm = percentile_norm_update(retnorm, ret, config.retnorm_rate)
    ret_offset, ret_scale = percentile_norm_scale(retnorm, config.retnorm_limit)
    adv = sg((ret - value[:, :-1]) / ret_scale)
    log_pi = _actor_log_prob(config, dist, sg(img_action))[:, :-1]
    entropy = _actor_entropy(config, dist)[:, :-1]
    losses["actor"] = -weight[:, :-1] * (log_pi * adv + config.actent * entropy)
    losses["critic"] = -weight[:, :-1] * (
        twohot_log_prob(critic_logits[:, :-1], ret, bins)
        + config.slowreg * twohot_log_prob(critic_logits[:, :-1], slow_value[:, :-1], bins)
    )

    # Replay critic (§7.9): critic on the posterior states with gradient, bootstrapped by R_0.
    replay_logits = _apply(nets.critic, params["critic"], feat)
    replay_slow = sg(twohot_mean(_apply(nets.critic, sg(slow_critic), feat), bins))
    boot = ret[:, 0].reshape(b, t)
    replay_ret = sg(replay_lambda_return(reward, is_terminal, is_last, boot, config.gamma, config.repval_lam))
    live = 1.0 - is_last[:, :-1].astype(f32)
    losses["repval"] = -live * (
        twohot_log_prob(replay_logits[:, :-1], replay_ret, bins)
        + config.slowreg * twohot_log_prob(replay_logits[:, :-1], replay_slow[:, :-1], bins)
    )

    scales = {
        "rec": config.rec_scale,
        "rew": config.rew_scale,
        "con": config.con_scale,
        "dyn": config.dyn_scale,
        "rep": config.rep_scale,
        "actor": config.actor_scale,
        "critic": config.critic_scale,
        "repval": config.repval_scale,
    }
    means = {k: v.mean() for k, v in losses.items()}
    total = sum(scales[k] * means[k] for k in losses)

    metrics = {f"{k}_loss": v for k, v in means.items()}
    metrics.update(
        loss=total,
        retnorm_scale=ret_scale,
        retnorm_low=retnorm.low,
        retnorm_high=retnorm.high,
        return_mean=ret.mean(),
        value_mean=value.mean(),
        adv_mean=adv.mean(),
        weight_mean=weight.mean(),
        imag_reward_mean=img_reward.mean(),
        replay_return_mean=replay_ret.mean(),
        actor_entropy=entropy.mean(),
        post_entropy=categorical_entropy(post).sum(-1).mean(),
        prior_entropy=categorical_entropy(prior).sum(-1).mean(),
    )
    internals = {
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
        "replay_slow_mean": replay_slow,
        "img_deter": img_deter,
        "img_stoch": img_stoch,
        "img_action": img_action,
        "img_prior_logits": img_prior,
        "img_rew_logits": img_rew_logits,
        "img_con_logits": img_con_logits,
        "img_reward": img_reward,
        "img_cont": img_cont,
        "img_weight": weight,
        "img_actor": dist,
        "img_critic_logits": critic_logits,
        "img_slow_logits": slow_logits,
        "img_value": value,
        "img_slow_value": slow_value,
        "ret": ret,
        "adv": adv,
        "replay_ret": replay_ret,
        "losses": losses,
    }
    latents = {"deter": sg(deter), "stoch": jnp.argmax(stoch, -1).astype(jnp.int32)}
    aux = {"metrics": metrics, "retnorm": retnorm, "latents": latents, "internals": internals}
    return total, aux


# ------------------------------------------------------------------------------------------------
# Update
# ------------------------------------------------------------------------------------------------


def update_with_noise(
    config: DreamerV3Config, state: DreamerState, batch: dict[str, Array], noise: Noise
) -> tuple[DreamerState, dict[str, Array], dict[str, Array], dict[str, Any]]:
    """One update with given noise (§15 steps 2-9); ``state.key`` is left unchanged.

    Returns:
        (new state, scalar metrics, replay latents, aux with "grads" (before AGC), "updates" (the applied
        parameter deltas before the add) and "internals" (see :func:`loss_fn`)).
    """
    grad_fn = jax.value_and_grad(loss_fn, argnums=1, has_aux=True)
    (_, aux), grads = grad_fn(config, state.params, state.slow_critic, state.retnorm, batch, noise)
    updates, opt_state = make_optimizer(config).update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    slow_critic = ema_update(state.slow_critic, params["critic"], config.slow_rate, state.updates == 0)
    metrics = dict(aux["metrics"])
    metrics.update(
        grad_norm=optax.tree.norm(grads),
        update_norm=optax.tree.norm(updates),
        param_norm=optax.tree.norm(state.params),
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
    """One DreamerV3 update on a batch of replay windows (§11, §15).

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
    noise = sample_noise(config, noise_key, b, t1 - 1)
    new_state, metrics, latents, _ = update_with_noise(config, state, batch, noise)
    return new_state._replace(key=key), metrics, latents


def train_many(
    config: DreamerV3Config, state: DreamerState, batches: dict[str, Array]
) -> tuple[DreamerState, dict[str, Array], dict[str, Array]]:
    """K updates in one call: ``jax.lax.scan`` of :func:`train_step` over the leading K axis.

    Returns:
        (state after K updates, metrics averaged over the K updates, latents with a leading K).
    """

    def body(carry: DreamerState, batch: dict[str, Array]) -> tuple[DreamerState, tuple[dict, dict]]:
        carry, metrics, latents = train_step(config, carry, batch)
        return carry, (metrics, latents)

    state, (metrics, latents) = jax.lax.scan(body, state, batches)
    return state, jax.tree_util.tree_map(lambda x: x.mean(0), metrics), latents


policy_step_jit = jax.jit(policy_step, static_argnames=("config", "deterministic"))
"""Jitted :func:`policy_step`; ``config`` and ``deterministic`` are static."""
train_step_jit = jax.jit(train_step, static_argnames=("config",))
"""Jitted :func:`train_step`; ``config`` is static."""
train_many_jit = jax.jit(train_many, static_argnames=("config",))
"""Jitted :func:`train_many`; ``config`` is static."""


@functools.cache
def param_count(config: DreamerV3Config) -> int:
    """Number of optimised parameters (excluding the slow critic) for a config."""
    shapes = jax.eval_shape(lambda k: init_params(config, k)[0], jax.ShapeDtypeStruct((2,), jnp.uint32))
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes)))

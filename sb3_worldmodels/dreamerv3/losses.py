"""The DreamerV3 loss of one batch (agent.py:246-373,413-415@2411f7d; agent.py:172-183@29eb964):
:func:`loss_fn` sums the scaled terms of :func:`world_model_loss` (reconstruction, reward, continue,
dyn/rep KL), :func:`imagination_loss` (actor and critic on imagined trajectories) and
:func:`replay_value_loss` (the replay critic), as the reference's loss groups; each term function
returns (losses, tensors) by name.

Pure functions of explicit arguments; ``config`` is a static (hashable) argument. Shape symbols as in
:mod:`~sb3_worldmodels.dreamerv3.agent`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from sb3_worldmodels.blocks.breaks import broken
from sb3_worldmodels.blocks.distributions import (
    balance_stats,
    bernoulli_log_prob,
    categorical_entropy,
    categorical_kl,
    free_nats,
    symlog_mse_log_prob,
)
from sb3_worldmodels.blocks.math import (
    imagination_weight,
    imagined_lambda_return,
    replay_lambda_return,
    twohot_log_prob,
    twohot_mean,
)
from sb3_worldmodels.blocks.normalizers import (
    PercentileNormState,
    percentile_norm_scale,
    percentile_norm_update,
)
from sb3_worldmodels.dreamerv3 import networks as N
from sb3_worldmodels.dreamerv3.config import DreamerV3Config
from sb3_worldmodels.dreamerv3.networks import features
from sb3_worldmodels.dreamerv3.rollouts import (
    Carry,
    UpdateNoise,
    _actor_log_prob,
    _critic_logits,
    _sample_no_grad,
    actor_dist,
    actor_distribution,
    actor_entropy,
    head_bins,
    imagine,
    observe,
    state_heads,
)

Array = jax.Array
sg = jax.lax.stop_gradient


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
    latents = {  # the replay's latents: deter as float32 (its compute-dtype values), agent.py:119-131@2411f7d
        "deter": sg(wm["post_deter"]).astype(jnp.float32),
        "stoch": jnp.argmax(wm["post_stoch"], -1).astype(jnp.int32),
    }
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
    (the squared error against the image / 255 in the compute dtype, ``MSEDist(..., 3, 'sum')``,
    nets.py:362@2411f7d, agent.py:257,469-470@2411f7d); each only when the observation has it."""
    vector, image = N.split_observation(obs)
    losses = {}
    if vector is not None:
        losses["rec"] = -symlog_mse_log_prob(dec["vector"], vector)
    if image is not None:
        target = N.pixels(image, config.dtype).astype(jnp.float32)
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
    last_action = _sample_no_grad(config, last_dist, noise.imag_action[-1]).astype(config.dtype)
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

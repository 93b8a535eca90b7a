"""The pure-JAX DreamerV3 core: state, acting, loss and update (agent.py:101-415@2411f7d,
jaxutils.py:398-550@2411f7d; replay context agent.py:172-183@29eb964).

Everything here is a pure function of explicit arguments; ``config`` is a static (hashable) argument.

- :func:`init_state` builds a :class:`DreamerState` (params, slow critic, optimiser state, return
  normaliser, PRNG key, update counter).
- :func:`policy_step` takes one acting step for ``n`` envs, threading a :class:`Carry`.
- :func:`loss_fn` is the loss of one batch: :func:`world_model_loss`, :func:`imagination_loss` (actor
  and critic) and :func:`replay_value_loss`, as the reference's loss groups
  (:mod:`~sb3_worldmodels.dreamerv3.losses`, on the rollouts :func:`observe` and :func:`imagine` of
  :mod:`~sb3_worldmodels.dreamerv3.rollouts`; both importable from here too).
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
from sb3_worldmodels.blocks.distributions import onehot_mode
from sb3_worldmodels.blocks.jit import agent_jit, scan_updates
from sb3_worldmodels.blocks.math import symexp, twohot_mean
from sb3_worldmodels.blocks.normalizers import PercentileNormState, ema_update, percentile_norm_init
from sb3_worldmodels.blocks.optim import global_norm, laprop, with_learning_rate
from sb3_worldmodels.dreamerv3 import networks as N
from sb3_worldmodels.dreamerv3.config import DreamerV3Config
from sb3_worldmodels.dreamerv3.losses import (
    imagination_loss,
    loss_fn,
    reconstruction_losses,
    replay_value_loss,
    world_model_loss,
)
from sb3_worldmodels.dreamerv3.networks import MODULES, features, init_params
from sb3_worldmodels.dreamerv3.rollouts import (
    Carry,
    UpdateNoise,
    _draw_noise,
    _sample_no_grad,
    actor_distribution,
    actor_entropy,
    actor_mode,
    head_bins,
    imagine,
    observe,
    sample_latent,
    sample_update_noise,
    state_heads,
)

Array = jax.Array
sg = jax.lax.stop_gradient

__all__ = [
    "Carry",
    "DreamerState",
    "MODULES",
    "UpdateNoise",
    "actor_distribution",
    "actor_entropy",
    "head_bins",
    "imagination_loss",
    "imagine",
    "init_carry",
    "init_params",
    "init_state",
    "loss_fn",
    "make_optimizer",
    "observe",
    "param_count",
    "policy_params",
    "policy_step",
    "policy_step_jit",
    "reconstruction_losses",
    "replay_value_loss",
    "sample_update_noise",
    "set_learning_rate",
    "state_heads",
    "train_many",
    "train_many_jit",
    "train_step",
    "train_step_jit",
    "update_with_noise",
    "world_model_loss",
]

POLICY_MODULES = ("enc", "dyn", "actor")
"""The modules :func:`policy_step` needs (the reference's policy keys ``/(enc|dyn|actor)/``)."""


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
        the posterior deter (n, D) float32 and stoch indices (n, S) int32 for the replay. The carry
        and the replay's deter hold the compute dtype's values as float32 (agent.py:119-131@2411f7d);
        the action is the float32 sample, as the reference's env action.
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
        stoch = onehot_mode(logits).astype(config.dtype)
    else:
        noise = _draw_noise(
            config, key, {"stoch": logits.shape, "action": (logits.shape[0], config.action_dim)}
        )
        stoch = sample_latent(config, logits, noise["stoch"])
    dist = actor_distribution(config, params["actor"], features(deter, stoch))
    if deterministic:
        action = actor_mode(config, dist)
    else:
        action = _sample_no_grad(config, dist, noise["action"])
    action = sg(action)
    deter, stoch = sg(deter).astype(jnp.float32), sg(stoch).astype(jnp.float32)
    return action, Carry(deter, stoch, action), deter, jnp.argmax(stoch, -1).astype(jnp.int32)


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
        stoch = onehot_mode(N.rssm_prior(config, dyn, deter)).astype(config.dtype)
        heads = N.heads(config, nets, features(deter, stoch))
        out = (
            {k: symexp(v) if k == "vector" else v for k, v in heads["dec"].items()},
            twohot_mean(heads["rew"], bins),
            jax.nn.sigmoid(heads["con"][..., 0]),
            twohot_mean(heads["critic"], bins),
            deter,
        )
        return (deter, blocks, stoch), out

    deter, stoch = deter.astype(config.dtype), stoch.astype(config.dtype)
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
        "deter": major(deters).astype(jnp.float32),
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

"""The pure-JAX DreamerV3 core: state, acting, loss and update (agent.py:101-415@2411f7d,
jaxutils.py:398-550@2411f7d; replay context agent.py:172-183@29eb964).

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
from jax.extend.random import threefry_2x32

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
from sb3_worldmodels.blocks.jit import agent_jit
from sb3_worldmodels.blocks.layers import TRUNC_NORMAL_STD_CORRECTION
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
from sb3_worldmodels.dreamerv3 import networks as N
from sb3_worldmodels.dreamerv3.config import DreamerV3Config
from sb3_worldmodels.dreamerv3.networks import (
    actor_dist,
    actor_mode,
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
    "set_learning_rate",
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


class Noise(NamedTuple):
    """All randomness of one update (jaxutils.py:103-121@2411f7d, nets.py:486-493@2411f7d,
    agent.py:267-298@2411f7d); see :func:`sample_noise`."""

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


def _flax_init(config: DreamerV3Config, key: Array) -> tuple[dict, dict]:
    """The modules' own flax ``init``; :func:`init_params` uses its tree structure and shapes."""
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


@functools.cache
def _param_layout(config: DreamerV3Config) -> tuple[Any, list[tuple[tuple[int, ...], float, float]], int]:
    """(tree structure, per leaf (shape, kernel std or 0, fill value), number of drawn values)."""
    shapes = jax.eval_shape(lambda k: _flax_init(config, k), jax.ShapeDtypeStruct((2,), jnp.uint32))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    specs = []
    for path, leaf in leaves:
        tree, *names = [getattr(k, "key", getattr(k, "idx", None)) for k in path]
        std = 0.0
        if names[-1] == "kernel":
            module = names[0] if tree == 0 else "critic"  # tree 1 is the slow critic
            outscale = N.outscale(module, names[-2])  # type: ignore[arg-type]
            std = TRUNC_NORMAL_STD_CORRECTION * outscale / float(np.sqrt(np.prod(leaf.shape[:-1])))
        specs.append((tuple(leaf.shape), std, 1.0 if names[-1] == "scale" else 0.0))
    total = sum(int(np.prod(shape)) for shape, std, _ in specs if std)
    return treedef, specs, total


@functools.partial(jax.jit, static_argnums=1)
def _kernel_draw(key: Array, total: int) -> Array:
    return jax.random.truncated_normal(key, -2.0, 2.0, (total,), jnp.float32)


def _assemble_params(config: DreamerV3Config, key: Array, xp: Any) -> tuple[dict, dict]:
    treedef, specs, total = _param_layout(config)
    flat = _kernel_draw(key, total)
    if xp is np:
        flat = np.asarray(flat)
    values, offset = [], 0
    for shape, std, fill in specs:
        if not std:  # biases, norm scales and zero-scaled kernels
            values.append(xp.full(shape, fill, np.float32))
            continue
        size = int(np.prod(shape))
        values.append(flat[offset : offset + size].reshape(shape) * np.float32(std))
        offset += size
    return jax.tree_util.tree_unflatten(treedef, values)


def init_params(config: DreamerV3Config, key: Array) -> tuple[dict, dict]:
    """Fresh parameters (nets.py:816-884@2411f7d): (params of :data:`MODULES`, an independently initialised
    slow critic).

    The trees are those of the flax modules (:func:`~sb3_worldmodels.dreamerv3.networks.make_networks`)
    and the values follow their initialisers' distributions: every kernel N(0, 1) truncated to
    [−2, 2] times 1.1368·outscale/sqrt(fan-in) (fan-in: all kernel axes but the last; outscale from
    :data:`~sb3_worldmodels.dreamerv3.networks.OUTSCALES`, else 1), biases 0 and norm scales 1. All
    kernels are cut from one draw of ``key``: one small computation to compile instead of one per
    layer (running flax's init op by op compiles every operation separately and takes seconds).
    Traceable (e.g. under ``jax.eval_shape``).
    """
    return _assemble_params(config, key, jnp)


def init_state(config: DreamerV3Config, key: Array) -> DreamerState:
    """A fresh agent state from a (2,) uint32 PRNG key.

    The parameters equal :func:`init_params` of the split-off key; they and the optimiser state (all
    zeros but the learning rate) are assembled on the host around one jitted draw.
    """
    key = jnp.asarray(key)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    key, init_key = jax.random.split(key)
    params, slow_critic = _assemble_params(config, init_key, np)
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
# Network helpers (pure functions of networks.py on the parameter trees)
# ------------------------------------------------------------------------------------------------


def _trunk(p: dict, prefix: str, layers: int) -> tuple[dict, str, int]:
    return (p, prefix, layers)


def _actor_trunk(config: DreamerV3Config, p: dict) -> tuple[dict, str, int]:
    return (p, "h", config.actor_layers)


def _critic_trunk(config: DreamerV3Config, p: dict) -> tuple[dict, str, int]:
    return (p, "h", config.critic_layers)


def state_head_trunks(config: DreamerV3Config, params: dict) -> list[tuple[dict, str, int]]:
    """The trunks that read a model state: decoder, reward, continue, critic (for :func:`N.mlp_trunks`)."""
    return [
        _trunk(params["dec"], "mlp", config.dec_layers),
        _trunk(params["rew"], "h", config.rew_layers),
        _trunk(params["con"], "h", config.con_layers),
        _critic_trunk(config, params["critic"]),
    ]


def actor_distribution(config: DreamerV3Config, actor: dict, feat: Array) -> tuple[Array, Array | None]:
    (hidden,) = N.mlp_trunks(feat, [_actor_trunk(config, actor)])
    return actor_dist(config, *N.actor_out(actor, hidden))


def _critic_logits(config: DreamerV3Config, critic: dict, feat: Array) -> Array:
    (hidden,) = N.mlp_trunks(feat, [_critic_trunk(config, critic)])
    return N.head_out(critic, hidden)


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
    obs: Array,
    is_first: Array,
    key: Array,
    deterministic: bool = False,
) -> tuple[Array, Carry, Array, Array]:
    """One acting step for ``n`` envs (nets.py:53-76@2411f7d obs_step, agent.py:145-180@2411f7d,
    agent.py:158-160@2411f7d).

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
    keep = 1.0 - jnp.asarray(is_first, jnp.float32)
    deter = carry.deter * keep[:, None]
    stoch = carry.stoch * keep[:, None, None]
    prev_action = carry.action * keep[:, None]
    embed = N.encode(config, params["enc"], obs)
    dyn = N.rssm_prepare(config, params["dyn"])
    deter = N.rssm_core(config, dyn, deter, stoch, prev_action)
    logits = N.rssm_posterior(config, dyn, deter, embed)
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


def _uniform(key: Array, n: int) -> Array:
    """(n,) float32 uniforms in [0, 1): the Threefry-2x32 hash of a counter, 23 bits per value.

    The hash of one counter pair gives two values (half the hashing of ``jax.random.uniform`` in its
    default "partitionable" counter layout, about 3x faster on CPU). Same map from bits to floats.
    """
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    bits = threefry_2x32(key, jnp.arange(n + n % 2, dtype=jnp.uint32))[:n]
    floats = jax.lax.bitcast_convert_type((bits >> 9) | np.uint32(0x3F800000), jnp.float32)
    return floats - 1.0


def _draw_noise(config: DreamerV3Config, key: Array, shapes: dict[str, tuple[int, ...]]) -> dict[str, Array]:
    """Gumbel noise for the categorical samples and the action noise (Gumbel for a discrete actor,
    ε ~ N(0, 1) for a continuous one), of the given shapes, cut from one uniform draw.

    ``shapes`` maps names to shapes; the name "action" is the action noise, every other one Gumbel.
    The maps from uniforms are those of ``jax.random.gumbel`` and ``jax.random.normal``. One draw
    compiles much faster than one per array (each is its own copy of the generator's hash).
    """
    sizes = [int(np.prod(shape)) for shape in shapes.values()]
    u = _uniform(key, sum(sizes))
    out, offset = {}, 0
    for (name, shape), size in zip(shapes.items(), sizes, strict=True):
        x = u[offset : offset + size].reshape(shape)
        offset += size
        if name == "action" and not config.discrete:
            lo = np.nextafter(np.float32(-1.0), np.float32(0.0))
            out[name] = np.float32(np.sqrt(2.0)) * jax.lax.erf_inv(jnp.maximum(lo, x * (1.0 - lo) + lo))
        else:
            tiny = np.finfo(np.float32).tiny
            out[name] = -jnp.log(-jnp.log(jnp.maximum(tiny, x * (1.0 - tiny) + tiny)))
    return out


# ------------------------------------------------------------------------------------------------
# Loss
# ------------------------------------------------------------------------------------------------


def sample_noise(config: DreamerV3Config, key: Array, batch_size: int, length: int) -> Noise:
    """Fresh noise for one update on a (B, T) trained window."""
    s, c, h, a = config.stoch, config.classes, config.imag_horizon, config.action_dim
    n = batch_size * length
    shapes = {"post": (batch_size, length, s, c), "imag_stoch": (h, n, s, c), "action": (h + 1, n, a)}
    noise = _draw_noise(config, key, shapes)
    return Noise(post=noise["post"], imag_stoch=noise["imag_stoch"], imag_action=noise["action"])


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
    p = N.rssm_prepare(config, dyn, for_gradient=True)
    keep = 1.0 - is_first.astype(jnp.float32)
    action = prev_action * keep[..., None]
    action = action / sg(jnp.maximum(1.0, jnp.abs(action)))
    dynin2 = N.normed_dense(p["dynin2"], action)

    def step(carry: tuple[Array, ...], xs: tuple[Array, ...]) -> tuple[tuple[Array, ...], tuple]:
        deter, blocks, stoch = carry
        act, emb, k, gumbel = xs
        deter, blocks = N.rssm_core_blocks(
            config,
            p,
            deter * k[:, None],
            blocks * k[:, None],
            stoch * k[:, None, None],
            None,  # type: ignore[arg-type]
            act,
        )
        logits = N.rssm_posterior(config, p, deter, emb)
        stoch = sample_onehot(logits, gumbel)
        return (deter, blocks, stoch), (deter, stoch, logits)

    xs = tuple(jnp.swapaxes(x, 0, 1) for x in (dynin2, embed, keep, noise))
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
    config: DreamerV3Config, params: dict, deter: Array, stoch: Array, noise: Noise, heads: dict | None = None
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
    dyn, actor = N.rssm_prepare(config, params["dyn"]), params["actor"]
    bins = head_bins(config)

    def step(carry: tuple[Array, ...], xs: tuple[Array, Array]) -> tuple[tuple, tuple]:
        deter, blocks, stoch = carry
        latent_noise, action_noise = xs
        feat = features(deter, stoch)
        trunks = [_actor_trunk(config, actor)]
        if heads is not None:
            trunks += [
                _critic_trunk(config, heads["slow"]),
                _trunk(heads["rew"], "h", config.rew_layers),
                _trunk(heads["con"], "h", config.con_layers),
            ]
        hidden = N.mlp_trunks(feat, trunks)
        dist = actor_dist(config, *N.actor_out(actor, hidden[0]))
        action = _sample_no_grad(config, dist, action_noise)
        outs = (None,) * 6
        if heads is not None:
            slow = N.head_out(heads["slow"], hidden[1])
            rew = N.head_out(heads["rew"], hidden[2])
            con = N.head_out(heads["con"], hidden[3])[..., 0]
            outs = (slow, rew, con, twohot_mean(slow, bins), twohot_mean(rew, bins), jax.nn.sigmoid(con))  # type: ignore[assignment]
        deter, blocks = N.rssm_core_blocks(config, dyn, deter, blocks, stoch, action)
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
        "observation" (n, T, O) decoded observations (symexp of the decoder's output), "reward"
        (n, T) the reward head's mean (the reward of each step), "continue" (n, T) the continue
        head's probability, "value" (n,) the critic's mean at the last state, "deter" (n, T, D).
    """
    dyn = N.rssm_prepare(config, params["dyn"])
    bins = head_bins(config)
    trunks = state_head_trunks(config, params)

    def step(carry: tuple[Array, Array, Array], action: Array) -> tuple[tuple, tuple]:
        deter, blocks, stoch = carry
        deter, blocks = N.rssm_core_blocks(config, dyn, deter, blocks, stoch, action)
        stoch = onehot_mode(N.rssm_prior(config, dyn, deter))
        dec_h, rew_h, con_h, critic_h = N.mlp_trunks(features(deter, stoch), trunks)
        out = (
            symexp(N.decode(config, params["dec"], dec_h)),
            twohot_mean(N.head_out(params["rew"], rew_h), bins),
            jax.nn.sigmoid(N.head_out(params["con"], con_h)[..., 0]),
            twohot_mean(N.head_out(params["critic"], critic_h), bins),
            deter,
        )
        return (deter, blocks, stoch), out

    carry = (deter, N.to_blocks(config, deter), stoch)
    _, (obs, reward, cont, value, deters) = jax.lax.scan(step, carry, jnp.swapaxes(actions, 0, 1))
    major = functools.partial(jnp.swapaxes, axis1=0, axis2=1)
    return {
        "observation": major(obs),
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
    noise: Noise,
) -> tuple[Array, dict[str, Any]]:
    """The total DreamerV3 loss of one batch (agent.py:246-373,413-415@2411f7d;
    agent.py:172-183@29eb964), differentiable w.r.t. ``params``.

    Args:
        params: the optimised parameter trees.
        slow_critic: slow-critic parameters (not differentiated).
        retnorm: the return normaliser before this step; it is updated inside (before use,
        jaxutils.py:301-395@2411f7d).
        batch: (B, T+1, ...) replay windows, row 0 the context (see :func:`train_step`).
        noise: the update's randomness (:func:`sample_noise`).

    Returns:
        (total loss, aux) with aux = {"metrics": scalar dict, "retnorm": new normaliser state,
        "latents": {"deter": (B, T, D), "stoch": (B, T, S) int32}, "internals": every intermediate
        tensor by name (for tests and diagnostics; unused outputs cost nothing under jit)}.

    How the work is laid out (the math is that of the spec): heads that read the same features
    share one matmul for their first layers (decoder, reward, continue and critic on the replay
    features; actor and critic on the imagined ones); the heads whose imagined outputs carry no
    gradient (slow critic, reward, continue) run inside the imagination scan (:func:`imagine`);
    imagined tensors are time-major (H, N, ...); each head runs only on the imagined states the loss
    reads, and the diagnostics' other rows are computed apart (dropped under jit when unused).
    """
    bins = head_bins(config)
    f32 = jnp.float32
    nog = sg({"slow": slow_critic, "rew": params["rew"], "con": params["con"], "critic": params["critic"]})

    # Context (agent.py:188-199@2411f7d, with the fix agent.py:172-183@29eb964): row 0 gives the initial
    # latent and previous action.
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

    # World model (agent.py:246-261@2411f7d) and the replay critic's logits (agent.py:352-373@2411f7d), all
    # heads on the posterior features.
    embed = N.encode(config, params["enc"], obs)
    deter, stoch, post = observe(config, params["dyn"], start, prev_action, embed, is_first, noise.post)
    prior = N.rssm_prior(config, params["dyn"], deter)
    feat = features(deter, stoch)
    dec_h, rew_h, con_h, critic_h = N.mlp_trunks(feat, state_head_trunks(config, params))
    dec_out = N.decode(config, params["dec"], dec_h)
    rew_logits = N.head_out(params["rew"], rew_h)
    con_logits = N.head_out(params["con"], con_h)[..., 0]
    replay_logits = N.head_out(params["critic"], critic_h)
    replay_slow = sg(twohot_mean(_critic_logits(config, nog["slow"], sg(feat)), bins))
    dyn_kl = categorical_kl(sg(post), prior).sum(-1)
    rep_kl = categorical_kl(post, sg(prior)).sum(-1)
    losses = {
        "rec": -symlog_mse_log_prob(dec_out, obs),
        "rew": -twohot_log_prob(rew_logits, reward, bins),
        "con": -bernoulli_log_prob(con_logits, cont * config.gamma),
        "dyn": free_nats(dyn_kl, config.free_nats),
        "rep": free_nats(rep_kl, config.free_nats),
    }

    # Imagination from all B·T posterior states (agent.py:267-298@2411f7d), time-major, annotated
    # (agent.py:301-317@2411f7d).
    n = b * t
    img = imagine(
        config,
        {"dyn": params["dyn"], "actor": params["actor"]},
        deter.reshape(n, -1),
        stoch.reshape(n, config.stoch, config.classes),
        noise,
        heads={"slow": nog["slow"], "rew": nog["rew"], "con": nog["con"]},
    )
    img_feat, last_feat = sg(img.feat), sg(img.last)
    actor_h, critic_h = N.mlp_trunks(
        img_feat, [_actor_trunk(config, params["actor"]), _critic_trunk(config, params["critic"])]
    )
    dist = actor_dist(config, *N.actor_out(params["actor"], actor_h))  # steps 0..H-1
    critic_logits = N.head_out(params["critic"], critic_h)  # steps 0..H-1
    last_critic_h, last_rew_h, last_con_h = N.mlp_trunks(
        last_feat,
        [
            _critic_trunk(config, nog["critic"]),
            _trunk(nog["rew"], "h", config.rew_layers),
            _trunk(nog["con"], "h", config.con_layers),
        ],
    )
    last_critic_logits = N.head_out(nog["critic"], last_critic_h)
    last_rew_logits = N.head_out(nog["rew"], last_rew_h)
    last_con_logits = N.head_out(nog["con"], last_con_h)[..., 0]

    # (N, H+1) sequences, index 0 = start: the start's reward and continue come from the replay.
    img_reward = jnp.concatenate(
        [reward.reshape(n, 1), img.reward[1:].T, twohot_mean(last_rew_logits, bins)[:, None]], 1
    )
    img_cont = jnp.concatenate(
        [cont.reshape(n, 1), img.cont[1:].T, jax.nn.sigmoid(last_con_logits)[:, None]], 1
    )
    img_reward, img_cont = sg(img_reward), sg(img_cont)
    weight = sg(imagination_weight(img_cont))
    value = jnp.concatenate(
        [twohot_mean(critic_logits, bins).T, twohot_mean(last_critic_logits, bins)[:, None]], 1
    )
    slow_value = sg(img.slow_value)  # (H, N)

    # Returns, normaliser (updated before use, agent.py:320-326@2411f7d, jaxutils.py:301-395@2411f7d),
    # actor (agent.py:329-342@2411f7d) and critic (agent.py:345-350@2411f7d).
    ret = sg(imagined_lambda_return(img_reward, img_cont, sg(value), config.lam))  # (N, H)
    retnorm = percentile_norm_update(retnorm, ret, config.retnorm_rate)
    ret_offset, ret_scale = percentile_norm_scale(retnorm, config.retnorm_limit)
    adv = sg((ret - value[:, :-1]) / ret_scale)
    log_pi = _actor_log_prob(config, dist, img.action).T
    entropy = actor_entropy(config, dist).T
    losses["actor"] = -weight[:, :-1] * (log_pi * adv + config.actent * entropy)
    critic_lp = twohot_log_prob(critic_logits, ret.T, bins)
    critic_lp += config.slowreg * twohot_log_prob(critic_logits, slow_value, bins)
    losses["critic"] = -weight[:, :-1] * critic_lp.T

    # Replay critic (agent.py:352-373@2411f7d): critic on the posterior states with gradient, bootstrapped by
    # R_0.
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
        loss=total,  # type: ignore[arg-type]
        retnorm_scale=ret_scale,
        retnorm_low=retnorm.low,
        retnorm_high=retnorm.high,
        return_mean=ret.mean(),
        # The spread the return normaliser sees (the reference logs these as ret/*, val/*, rew/*).
        return_std=ret.std(),
        return_min=ret.min(),
        return_max=ret.max(),
        value_mean=value.mean(),
        value_std=value.std(),
        adv_mean=adv.mean(),
        weight_mean=weight.mean(),
        imag_reward_mean=img_reward.mean(),
        imag_reward_std=img_reward.std(),
        replay_return_mean=replay_ret.mean(),
        actor_entropy=entropy.mean(),
        post_entropy=categorical_entropy(post).sum(-1).mean(),
        prior_entropy=categorical_entropy(prior).sum(-1).mean(),
    )
    # The heads' loss and accuracy on rare rows (terminations, rewards), as the reference logs them.
    con_stats = balance_stats(jax.nn.sigmoid(con_logits), -bernoulli_log_prob(con_logits, cont), cont, 0.5)
    rew_stats = balance_stats(twohot_mean(rew_logits, bins), losses["rew"], reward, 0.1)
    metrics.update({f"constats/{k}": v for k, v in con_stats.items()})
    metrics.update({f"rewstats/{k}": v for k, v in rew_stats.items()})

    # Diagnostics, batch-major with all H+1 steps (unused under jit, they cost nothing).
    d = config.deter
    last_dist = actor_distribution(config, sg(params["actor"]), last_feat)
    last_action = _sample_no_grad(config, last_dist, noise.imag_action[-1])
    last_slow_logits = _critic_logits(config, nog["slow"], last_feat)
    img_all_feat = jnp.concatenate([img_feat, last_feat[None]], 0)
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
        "img_deter": jnp.swapaxes(img_all_feat[..., :d], 0, 1),
        "img_stoch": jnp.swapaxes(img_all_feat[..., d:], 0, 1).reshape(n, -1, config.stoch, config.classes),
        "img_action": _batch_major(img.action, last_action),
        "img_prior_logits": jnp.swapaxes(img.prior, 0, 1),
        "img_rew_logits": _batch_major(img.rew_logits, last_rew_logits),
        "img_con_logits": _batch_major(img.con_logits, last_con_logits),
        "img_reward": img_reward,
        "img_cont": img_cont,
        "img_weight": weight,
        "img_actor": tuple(
            None if x is None else _batch_major(x, y)  # type: ignore[arg-type]
            for x, y in zip(dist, last_dist, strict=True)
        ),
        "img_critic_logits": _batch_major(critic_logits, last_critic_logits),
        "img_slow_logits": _batch_major(img.slow_logits, last_slow_logits),
        "img_value": value,
        "img_slow_value": _batch_major(slow_value, sg(twohot_mean(last_slow_logits, bins))),
        "ret": ret,
        "adv": adv,
        "replay_ret": replay_ret,
        "losses": losses,
    }
    latents = {"deter": sg(deter), "stoch": jnp.argmax(stoch, -1).astype(jnp.int32)}
    aux = {"metrics": metrics, "retnorm": retnorm, "latents": latents, "internals": internals}
    return total, aux  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------------
# Update
# ------------------------------------------------------------------------------------------------


def update_with_noise(
    config: DreamerV3Config, state: DreamerState, batch: dict[str, Array], noise: Noise
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
    slow_critic = ema_update(state.slow_critic, params["critic"], config.slow_rate, state.updates == 0)
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
    noise = sample_noise(config, noise_key, b, t1 - 1)
    new_state, metrics, latents, _ = update_with_noise(config, state, batch, noise)
    return new_state._replace(key=key), metrics, latents


def train_many(
    config: DreamerV3Config, state: DreamerState, batches: dict[str, Array]
) -> tuple[DreamerState, dict[str, Array], dict[str, Array]]:
    """K updates in one call: ``jax.lax.scan`` of :func:`train_step` over the leading K axis.

    Returns:
        (state after K updates, metrics of every update with a leading K, latents with a leading K).
    """

    def body(carry: DreamerState, batch: dict[str, Array]) -> tuple[DreamerState, tuple[dict, dict]]:
        carry, metrics, latents = train_step(config, carry, batch)
        return carry, (metrics, latents)

    state, (metrics, latents) = jax.lax.scan(body, state, batches)
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


@functools.cache
def param_count(config: DreamerV3Config) -> int:
    """Number of optimised parameters (excluding the slow critic) for a config."""
    shapes = jax.eval_shape(lambda k: init_params(config, k)[0], jax.ShapeDtypeStruct((2,), jnp.uint32))
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes)))

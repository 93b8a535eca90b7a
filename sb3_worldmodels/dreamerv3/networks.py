"""DreamerV3 networks for flat vector observations (flax.linen), and their sampling helpers.

Module and parameter names mirror the reference state names (nets.py:16-813@2411f7d, agent.py:63-83@2411f7d),
so a reference checkpoint maps onto these trees one to one:

- ``enc``: ``mlp0..`` (symlog, then Linear+RMSNorm+SiLU layers; the last activation is the embedding).
- ``dyn``: the RSSM: ``dynin0..2``, ``dyn0`` and ``dyncore`` (block GRU), ``img0..``/``imglogit`` (prior),
  ``obs0..``/``obslogit`` (posterior).
- ``dec``: ``mlp0..`` and one ``out_<key>`` per observation key (``out_vector`` for a flat vector;
  symlog-space predictions, outscale 0.1).
- ``rew``/``con``/``critic`` (and the slow critic): ``h0..`` and ``out``.
- ``actor``: ``h0..``, ``out`` and, for continuous actions, ``std``.

Shape symbols: D deter, H hidden, S stoch latents, C classes, G blocks, U units, O observation width,
A action width, F = D + S·C feature width, n bins. Everything is float32.

The flax modules define the parameter trees (names, shapes, initialisers) and are the readable
reference of each network. The training and acting code runs the pure functions of the second half
of this file on the same trees instead (:func:`encode`, :func:`rssm_core`, :func:`mlp_trunks`, ...):
they compute the same math, but let the agent share work between networks, e.g. one matmul for the
first layers of all heads that read the same features, the block GRU in a block-first layout
(batched matmuls without transposed operands) and loop-invariant kernel rearrangements hoisted
out of the scans. ``tests/test_dreamerv3_core.py`` checks both paths agree.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels.blocks.distributions import normal_head, onehot_mode, unimix_logits
from sb3_worldmodels.blocks.layers import (
    RMS_EPS,
    TRUNC_NORMAL_STD_CORRECTION,
    BlockLinear,
    Dense,
    NormedDense,
    block_matmul,
    block_matmul_pretransposed,
    matmul_pretransposed,
)
from sb3_worldmodels.blocks.math import symlog
from sb3_worldmodels.dreamerv3.config import DreamerV3Config

Array = jax.Array

__all__ = [
    "OUTSCALES",
    "RSSM",
    "Actor",
    "Decoder",
    "Encoder",
    "Head",
    "Networks",
    "actor_dist",
    "actor_mode",
    "actor_out",
    "actor_sample",
    "decode",
    "dense",
    "encode",
    "features",
    "head_out",
    "make_networks",
    "mlp_trunks",
    "normed_dense",
    "rms_norm",
    "rssm_core",
    "rssm_core_blocks",
    "rssm_logits",
    "rssm_posterior",
    "rssm_prepare",
    "rssm_prior",
    "sample_onehot",
    "to_blocks",
]


DECODER_OUTSCALE = 0.1
"""Init scale of every decoder output layer ``out_<key>``: the reference builds them as ``Dist``
modules without an outscale, so the class default 0.1 applies (nets.py:321,408,420@2411f7d)."""

OUTSCALES: dict[tuple[str, str], float] = {
    ("rew", "out"): 0.0,
    ("con", "out"): 1.0,
    ("actor", "out"): 0.01,
    ("actor", "std"): 0.01,
    ("critic", "out"): 0.0,
}
"""Init scale of the output layers (module, layer) (nets.py:816-884@2411f7d); see :func:`outscale`."""


def outscale(module: str, layer: str) -> float:
    """The init scale of a kernel: :data:`OUTSCALES`, :data:`DECODER_OUTSCALE` for the decoder's
    ``out_<key>`` layers, else 1.0."""
    if module == "dec" and layer.startswith("out_"):
        return DECODER_OUTSCALE
    return OUTSCALES.get((module, layer), 1.0)


class Encoder(nn.Module):
    """symlog(obs) → ``layers`` × [Linear(U) + RMSNorm + SiLU] (nets.py:249-256@2411f7d).
    (..., O) → (..., U)."""

    units: int
    layers: int = 3

    @nn.compact
    def __call__(self, obs: Array) -> Array:
        x = symlog(jnp.asarray(obs, jnp.float32))
        for i in range(self.layers):
            x = NormedDense(self.units, name=f"mlp{i}")(x)
        return x


class Decoder(nn.Module):
    """Features → ``layers`` hidden layers → one output Linear per observation key (nets.py:310-321
    @2411f7d): ``out_<key>`` of the key's width, outscale 0.1. The reference clips each layer's
    gradient by its own norm (AGC per tensor), so the keys are separate layers, not one merged layer.

    (..., F) → (..., O): the keys' predictions in symlog space, concatenated in ``outputs`` order.
    """

    units: int
    outputs: tuple[tuple[str, int], ...]
    """(key, width) of each observation key, in the flat observation's order."""
    layers: int = 3

    @nn.compact
    def __call__(self, feat: Array) -> Array:
        x = feat
        for i in range(self.layers):
            x = NormedDense(self.units, name=f"mlp{i}")(x)
        outs = [Dense(w, outscale=DECODER_OUTSCALE, name=f"out_{k}")(x) for k, w in self.outputs]
        return jnp.concatenate(outs, -1)


class Head(nn.Module):
    """``layers`` hidden layers ``h{i}`` → ``out`` Linear(outputs) with ``outscale`` (nets.py:432-438@2411f7d,
    configs.yaml:122-123,129@2411f7d).

    Reward and critic: outputs = n bins, outscale 0; continue: outputs = 1, outscale 1.
    (..., F) → (..., outputs).
    """

    units: int
    layers: int
    outputs: int
    outscale: float

    @nn.compact
    def __call__(self, feat: Array) -> Array:
        x = feat
        for i in range(self.layers):
            x = NormedDense(self.units, name=f"h{i}")(x)
        return Dense(self.outputs, outscale=self.outscale, name="out")(x)


class Actor(nn.Module):
    """``layers`` hidden layers ``h{i}`` → ``out`` Linear(A) [+ ``std`` Linear(A)], outscale 0.01
    (agent.py:63-70@2411f7d).

    Returns ``(out, std_pre)``, each (..., A); ``std_pre`` is None for discrete actions.
    """

    units: int
    layers: int
    action_dim: int
    discrete: bool

    @nn.compact
    def __call__(self, feat: Array) -> tuple[Array, Array | None]:
        x = feat
        for i in range(self.layers):
            x = NormedDense(self.units, name=f"h{i}")(x)
        out = Dense(self.action_dim, outscale=OUTSCALES["actor", "out"], name="out")(x)
        std = None
        if not self.discrete:
            std = Dense(self.action_dim, outscale=OUTSCALES["actor", "std"], name="std")(x)
        return out, std


class RSSM(nn.Module):
    """Recurrent state-space model with a block GRU core (nets.py:16-220@2411f7d).

    Methods (apply with ``method=``): :meth:`core` (block GRU step), :meth:`prior` and
    :meth:`posterior` (unimixed categorical log-probabilities). ``__call__`` touches every layer
    and is used for initialisation.
    """

    deter: int
    hidden: int
    stoch: int
    classes: int
    blocks: int
    img_layers: int = 2
    obs_layers: int = 1
    unimix: float = 0.01

    def setup(self) -> None:
        self.dynin0 = NormedDense(self.hidden)
        self.dynin1 = NormedDense(self.hidden)
        self.dynin2 = NormedDense(self.hidden)
        self.dyn0 = BlockLinear(self.deter, self.blocks, norm=True, act="silu")
        self.dyncore = BlockLinear(3 * self.deter, self.blocks)
        self.img = [NormedDense(self.hidden, name=f"img{i}") for i in range(self.img_layers)]
        self.imglogit = Dense(self.stoch * self.classes)
        self.obs = [NormedDense(self.hidden, name=f"obs{i}") for i in range(self.obs_layers)]
        self.obslogit = Dense(self.stoch * self.classes)

    def core(self, deter: Array, stoch: Array, action: Array) -> Array:
        """Block GRU step (nets.py:119-173@2411f7d): h (..., D), z (..., S, C), a (..., A) → h' (..., D)."""
        g = self.blocks
        stoch = stoch.reshape(*stoch.shape[:-2], self.stoch * self.classes)
        action = action / jax.lax.stop_gradient(jnp.maximum(1.0, jnp.abs(action)))
        u = jnp.concatenate([self.dynin0(deter), self.dynin1(stoch), self.dynin2(action)], -1)
        u = jnp.broadcast_to(u[..., None, :], (*u.shape[:-1], g, u.shape[-1]))
        x = jnp.concatenate([deter.reshape(*deter.shape[:-1], g, self.deter // g), u], -1)
        x = self.dyn0(x.reshape(*x.shape[:-2], -1))
        x = self.dyncore(x)
        # Per block: (reset, cand, update) chunks of D/G, each re-flattened block-major to D.
        x = x.reshape(*x.shape[:-1], g, 3, self.deter // g)
        reset, cand, update = (x[..., i, :].reshape(*x.shape[:-3], self.deter) for i in range(3))
        reset = jax.nn.sigmoid(reset)
        cand = jnp.tanh(reset * cand)
        update = jax.nn.sigmoid(update - 1.0)
        return update * cand + (1.0 - update) * deter

    def prior(self, deter: Array) -> Array:
        """(..., D) → unimixed prior log-probabilities (..., S, C) (nets.py:112-117@2411f7d)."""
        x = deter
        for layer in self.img:
            x = layer(x)
        return self._logits(self.imglogit(x))

    def posterior(self, deter: Array, embed: Array) -> Array:
        """h' (..., D), embed (..., U) → unimixed posterior log-probabilities (..., S, C)
        (nets.py:66-69@2411f7d)."""
        x = jnp.concatenate([deter, embed], -1)
        for layer in self.obs:
            x = layer(x)
        return self._logits(self.obslogit(x))

    def _logits(self, x: Array) -> Array:
        x = x.reshape(*x.shape[:-1], self.stoch, self.classes)
        return unimix_logits(x, self.unimix)

    def __call__(self, deter: Array, stoch: Array, action: Array, embed: Array) -> tuple[Array, Array, Array]:
        """Initialisation entry: returns (h', posterior logits, prior logits)."""
        deter = self.core(deter, stoch, action)
        return deter, self.posterior(deter, embed), self.prior(deter)


@dataclasses.dataclass(frozen=True)
class Networks:
    """The module objects of one agent; parameters live in the state, not here."""

    enc: Encoder
    dyn: RSSM
    dec: Decoder
    rew: Head
    con: Head
    actor: Actor
    critic: Head


@functools.cache
def make_networks(config: DreamerV3Config) -> Networks:
    """Build (and cache per config) the flax modules of an agent."""
    u = config.units
    return Networks(
        enc=Encoder(u, config.enc_layers),
        dyn=RSSM(
            deter=config.deter,
            hidden=config.hidden,
            stoch=config.stoch,
            classes=config.classes,
            blocks=config.blocks,
            img_layers=config.img_layers,
            obs_layers=config.obs_layers,
            unimix=config.unimix,
        ),
        dec=Decoder(u, config.decoder_outputs, config.dec_layers),
        rew=Head(u, config.rew_layers, config.bins, outscale=OUTSCALES["rew", "out"]),
        con=Head(u, config.con_layers, 1, outscale=OUTSCALES["con", "out"]),
        actor=Actor(u, config.actor_layers, config.action_dim, config.discrete),
        critic=Head(u, config.critic_layers, config.bins, outscale=OUTSCALES["critic", "out"]),
    )


def features(deter: Array, stoch: Array) -> Array:
    """Model features [deter, flat stoch] (nets.py:786-813@2411f7d):
    (..., D), (..., S, C) → (..., D + S·C)."""
    return jnp.concatenate([deter, stoch.reshape(*stoch.shape[:-2], -1)], -1)


def sample_onehot(logits: Array, gumbel: Array) -> Array:
    """Straight-through one-hot sample onehot + (p − sg(p)) (jaxutils.py:103-121@2411f7d), by Gumbel-max.

    ``argmax(logits + gumbel)`` with i.i.d. standard Gumbel noise is an exact categorical sample.
    Taking the noise as an input makes the sample source injectable: a recorded one-hot ``y`` is
    reproduced with ``gumbel = 1e9 * y``. The forward value is exactly the one-hot; the gradient
    flows to p = softmax(logits).

    Args:
        logits: (..., C) float32 log-probabilities.
        gumbel: (..., C) float32 noise.

    Returns:
        (..., C) float32.
    """
    onehot = onehot_mode(logits + gumbel)
    probs = jax.nn.softmax(logits, -1)
    return onehot + (probs - jax.lax.stop_gradient(probs))


def actor_dist(config: DreamerV3Config, out: Array, std_pre: Array | None) -> tuple[Array, Array | None]:
    """Actor distribution parameters (nets.py:486-493,518-529@2411f7d).

    Discrete: (unimixed log-probabilities (..., A), None). Continuous: (mean = tanh(out),
    std in [minstd, maxstd]), each (..., A).
    """
    if config.discrete:
        return unimix_logits(out, config.actor_unimix), None
    return normal_head(out, std_pre, config.minstd, config.maxstd)  # type: ignore[arg-type]


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


# ------------------------------------------------------------------------------------------------
# Pure forward functions on the parameter trees (what the agent runs)
# ------------------------------------------------------------------------------------------------


def dense(p: dict, x: Array) -> Array:
    """x @ kernel + bias, as :class:`~sb3_worldmodels.blocks.layers.Dense` (with a "kernel_t", the
    transposed kernel of :func:`with_transposed_kernels`, its gradient runs on that copy)."""
    if "kernel_t" in p:
        return matmul_pretransposed(x, p["kernel"], p["kernel_t"]) + p["bias"]
    return x @ p["kernel"] + p["bias"]


def with_transposed_kernels(p: dict, names: Sequence[str]) -> dict:
    """``p`` with a "kernel_t" (the transposed kernel) added to the layers ``names``: for layers run
    with gradient inside a recurrence (see :func:`~sb3_worldmodels.blocks.layers.matmul_pretransposed`)."""
    return {k: ({**v, "kernel_t": v["kernel"].T} if k in names else v) for k, v in p.items()}


def rms_norm(scale: Array, x: Array, axis: int | tuple[int, ...] = -1) -> Array:
    """x · rsqrt(mean(x², axis) + eps) · scale, as :class:`~sb3_worldmodels.blocks.layers.RMSNorm`."""
    ms = jnp.mean(jnp.square(x), axis=axis, keepdims=True)
    return x * jax.lax.rsqrt(ms + RMS_EPS) * scale


def _norm_act(p: dict, x: Array) -> Array:
    return jax.nn.silu(rms_norm(p["norm"]["scale"], x))


def normed_dense(p: dict, x: Array) -> Array:
    """Hidden layer (Linear + RMSNorm + SiLU), as :class:`~sb3_worldmodels.blocks.layers.NormedDense`."""
    return _norm_act(p, dense(p, x))


def _mlp_rest(p: dict, x: Array, prefix: str, start: int, layers: int) -> Array:
    for i in range(start, layers):
        x = normed_dense(p[f"{prefix}{i}"], x)
    return x


def mlp_trunks(x: Array, trunks: Sequence[tuple[dict, str, int]]) -> list[Array]:
    """The hidden layers of several MLPs that read the same input ``x``.

    Each trunk is (params, layer prefix, number of layers); its output is the last hidden layer (or
    ``x`` itself for zero layers). The first layers of all trunks run as one matmul of ``x`` with the
    concatenated kernels, which reads ``x`` once; per column this is the same dot product as running
    each layer on its own. (..., I) → [(..., U_i)].
    """
    first = [p[f"{prefix}0"] for p, prefix, layers in trunks if layers > 0]
    if len(first) > 1:
        kernel = jnp.concatenate([q["kernel"] for q in first], -1)
        bias = jnp.concatenate([q["bias"] for q in first], -1)
        split = np.cumsum([q["bias"].shape[-1] for q in first])[:-1]
        outs = iter(jnp.split(x @ kernel + bias, split, axis=-1))
    else:
        outs = iter([dense(q, x) for q in first])
    result = []
    for p, prefix, layers in trunks:
        if layers == 0:
            result.append(x)
            continue
        h = _norm_act(p[f"{prefix}0"], next(outs))
        result.append(_mlp_rest(p, h, prefix, 1, layers))
    return result


def encode(config: DreamerV3Config, p: dict, obs: Array) -> Array:
    """:class:`Encoder`: (..., O) raw observations → (..., U) embedding."""
    x = symlog(jnp.asarray(obs, jnp.float32))
    return _mlp_rest(p, x, "mlp", 0, config.enc_layers)


def decode(config: DreamerV3Config, p: dict, hidden: Array) -> Array:
    """:class:`Decoder` output layers on its last hidden layer (see :func:`mlp_trunks`): (..., O)."""
    outs = [dense(p[f"out_{key}"], hidden) for key, _ in config.decoder_outputs]
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, -1)


def head_out(p: dict, hidden: Array) -> Array:
    """:class:`Head` output layer (reward, continue, critic) on its last hidden layer."""
    return dense(p["out"], hidden)


def actor_out(p: dict, hidden: Array) -> tuple[Array, Array | None]:
    """:class:`Actor` outputs ``(out, std_pre)`` on its last hidden layer (std_pre None if discrete)."""
    return dense(p["out"], hidden), (dense(p["std"], hidden) if "std" in p else None)


def rssm_prepare(config: DreamerV3Config, p: dict, for_gradient: bool = False) -> dict:
    """Rearranged RSSM parameters for :func:`rssm_core` (computed once, outside the scans).

    dyn0's block kernel (G, D/G + 3H, D/G) acts on [h_g, u] per block. Its h rows stay a block
    kernel (G, D/G, D/G); its u rows, shared by all blocks, become one dense (3H, D) kernel whose
    output is already block-major, so u is never repeated G times.
    """
    g, dg = config.blocks, config.deter // config.blocks
    k0 = p["dyn0"]["kernel"]
    out = {
        **p,
        "dyn0_h": k0[:, :dg, :],
        "dyn0_u": jnp.transpose(k0[:, dg:, :], (1, 0, 2)).reshape(-1, config.deter),
        "dyn0_bias": p["dyn0"]["bias"].reshape(g, 1, dg),
        "dyn0_scale": p["dyn0"]["norm"]["scale"].reshape(g, 1, dg),
        "core_bias": p["dyncore"]["bias"].reshape(g, 1, 3 * dg),
    }
    if for_gradient:  # transposed copies for the reverse pass (see matmul_pretransposed)
        recurrent = ("dynin0", "dynin1", *(f"obs{i}" for i in range(config.obs_layers)), "obslogit")
        out = with_transposed_kernels(out, recurrent)
        out["dyn0_h_t"] = jnp.swapaxes(out["dyn0_h"], 1, 2)
        out["dyn0_u_t"] = out["dyn0_u"].T
        out["dyncore_t"] = jnp.swapaxes(p["dyncore"]["kernel"], 1, 2)
    return out


def rssm_core(
    config: DreamerV3Config, p: dict, deter: Array, stoch: Array, action: Array, dynin2: Array | None = None
) -> Array:
    """:meth:`RSSM.core` on prepared parameters (:func:`rssm_prepare`): block GRU step
    (nets.py:119-173@2411f7d).

    deter (M, D), stoch (M, S, C) or (M, S·C), action (M, A) → (M, D); ``dynin2`` optionally gives
    the action projection precomputed (it does not depend on the recurrent state).
    """
    return rssm_core_blocks(config, p, deter, to_blocks(config, deter), stoch, action, dynin2)[0]


def to_blocks(config: DreamerV3Config, deter: Array) -> Array:
    """(M, D) → (G, M, D/G): the block-first view of a deter state used by :func:`rssm_core_blocks`."""
    return jnp.swapaxes(deter.reshape(deter.shape[0], config.blocks, -1), 0, 1)


def rssm_core_blocks(
    config: DreamerV3Config,
    p: dict,
    deter: Array,
    blocks: Array,
    stoch: Array,
    action: Array,
    dynin2: Array | None = None,
) -> tuple[Array, Array]:
    """:func:`rssm_core` for a recurrence that carries the state in both layouts.

    ``blocks`` is ``to_blocks(config, deter)``; returns the new state as (deter (M, D), blocks
    (G, M, D/G)). The GRU runs block-first (batched matmuls over G, RMSNorm over all D features).
    Carrying both layouts through a scan saves one transpose per step and keeps XLA from fusing the
    gate math into the transpose back to (M, D) (a strided loop several times slower on CPU).
    """
    g, dg = config.blocks, config.deter // config.blocks
    m = deter.shape[0]
    stoch = stoch.reshape(m, -1)
    if dynin2 is None:
        action = action / jax.lax.stop_gradient(jnp.maximum(1.0, jnp.abs(action)))
        dynin2 = normed_dense(p["dynin2"], action)
    u = jnp.concatenate([normed_dense(p["dynin0"], deter), normed_dense(p["dynin1"], stoch), dynin2], -1)
    if "dyn0_u_t" in p:  # prepared for gradient
        x = block_matmul_pretransposed(blocks, p["dyn0_h"], p["dyn0_h_t"])
        x += to_blocks(config, matmul_pretransposed(u, p["dyn0_u"], p["dyn0_u_t"]))
    else:
        x = block_matmul(blocks, p["dyn0_h"]) + to_blocks(config, u @ p["dyn0_u"])
    x = jax.nn.silu(rms_norm(p["dyn0_scale"], x + p["dyn0_bias"], axis=(0, 2)))
    if "dyncore_t" in p:
        x = block_matmul_pretransposed(x, p["dyncore"]["kernel"], p["dyncore_t"]) + p["core_bias"]
    else:
        x = block_matmul(x, p["dyncore"]["kernel"]) + p["core_bias"]
    reset = jax.nn.sigmoid(x[..., :dg])
    cand = jnp.tanh(reset * x[..., dg : 2 * dg])
    update = jax.nn.sigmoid(x[..., 2 * dg :] - 1.0)
    new = update * cand + (1.0 - update) * blocks
    return jnp.swapaxes(new, 0, 1).reshape(m, g * dg), new


def rssm_logits(config: DreamerV3Config, x: Array) -> Array:
    """Logit layer output (..., S·C) → unimixed log-probabilities (..., S, C) (nets.py:207-220@2411f7d)."""
    x = x.reshape(*x.shape[:-1], config.stoch, config.classes)
    return unimix_logits(x, config.unimix)


def rssm_prior(config: DreamerV3Config, p: dict, deter: Array) -> Array:
    """:meth:`RSSM.prior`: (..., D) → (..., S, C)."""
    x = _mlp_rest(p, deter, "img", 0, config.img_layers)
    return rssm_logits(config, dense(p["imglogit"], x))


def rssm_posterior(config: DreamerV3Config, p: dict, deter: Array, embed: Array) -> Array:
    """:meth:`RSSM.posterior`: h' (..., D), embed (..., U) → (..., S, C)."""
    x = _mlp_rest(p, jnp.concatenate([deter, embed], -1), "obs", 0, config.obs_layers)
    return rssm_logits(config, dense(p["obslogit"], x))


# ------------------------------------------------------------------------------------------------
# Initialisation
# ------------------------------------------------------------------------------------------------

MODULES = ("enc", "dyn", "dec", "rew", "con", "actor", "critic")
"""The optimised modules, in the reference's order (agent.py:101-103)."""


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
            scale = outscale(module, names[-2])  # type: ignore[arg-type]
            std = TRUNC_NORMAL_STD_CORRECTION * scale / float(np.sqrt(np.prod(leaf.shape[:-1])))
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


def init_params(config: DreamerV3Config, key: Array, on_host: bool = False) -> tuple[dict, dict]:
    """Fresh parameters (nets.py:816-884@2411f7d): (params of :data:`MODULES`, an independently initialised
    slow critic).

    The trees are those of the flax modules (:func:`~sb3_worldmodels.dreamerv3.networks.make_networks`)
    and the values follow their initialisers' distributions: every kernel N(0, 1) truncated to
    [−2, 2] times 1.1368·outscale/sqrt(fan-in) (fan-in: all kernel axes but the last; outscale from
    :data:`~sb3_worldmodels.dreamerv3.networks.OUTSCALES`, else 1), biases 0 and norm scales 1. All
    kernels are cut from one draw of ``key``: one small computation to compile instead of one per
    layer (running flax's init op by op compiles every operation separately and takes seconds).
    Traceable (e.g. under ``jax.eval_shape``); ``on_host`` gives numpy arrays, assembled around one
    jitted draw.
    """
    return _assemble_params(config, key, np if on_host else jnp)

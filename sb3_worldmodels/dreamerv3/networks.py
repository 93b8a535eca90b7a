"""DreamerV3 networks for flat vector observations (flax.linen), and their sampling helpers.

Module and parameter names mirror the reference state names (``specs/dreamerv3.md`` §2-§5, §7), so a
reference checkpoint maps onto these trees one to one:

- ``enc``: ``mlp0..`` (symlog, then Linear+RMSNorm+SiLU layers; the last activation is the embedding).
- ``dyn``: the RSSM: ``dynin0..2``, ``dyn0`` and ``dyncore`` (block GRU), ``img0..``/``imglogit`` (prior),
  ``obs0..``/``obslogit`` (posterior).
- ``dec``: ``mlp0..`` and ``out_vector`` (symlog-space prediction, outscale 0.1).
- ``rew``/``con``/``critic`` (and the slow critic): ``h0..`` and ``out``.
- ``actor``: ``h0..``, ``out`` and, for continuous actions, ``std``.

Shape symbols: D deter, H hidden, S stoch latents, C classes, G blocks, U units, O observation width,
A action width, F = D + S·C feature width, n bins. Everything is float32.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from sb3_worldmodels.blocks.distributions import normal_head, onehot_mode, unimix_logits
from sb3_worldmodels.blocks.layers import BlockLinear, Dense, NormedDense
from sb3_worldmodels.blocks.math import symlog
from sb3_worldmodels.dreamerv3.config import DreamerV3Config

Array = jax.Array

__all__ = [
    "RSSM",
    "Actor",
    "Decoder",
    "Encoder",
    "Head",
    "Networks",
    "actor_dist",
    "actor_mode",
    "actor_sample",
    "features",
    "make_networks",
    "sample_onehot",
]


class Encoder(nn.Module):
    """symlog(obs) → ``layers`` × [Linear(U) + RMSNorm + SiLU] (§4.1). (..., O) → (..., U)."""

    units: int
    layers: int = 3

    @nn.compact
    def __call__(self, obs: Array) -> Array:
        x = symlog(jnp.asarray(obs, jnp.float32))
        for i in range(self.layers):
            x = NormedDense(self.units, name=f"mlp{i}")(x)
        return x


class Decoder(nn.Module):
    """Features → ``layers`` hidden layers → ``out_vector`` Linear(O), outscale 0.1 (§4.2).

    (..., F) → (..., O), the prediction in symlog space (its mean is symexp of it).
    """

    units: int
    obs_dim: int
    layers: int = 3

    @nn.compact
    def __call__(self, feat: Array) -> Array:
        x = feat
        for i in range(self.layers):
            x = NormedDense(self.units, name=f"mlp{i}")(x)
        return Dense(self.obs_dim, outscale=0.1, name="out_vector")(x)


class Head(nn.Module):
    """``layers`` hidden layers ``h{i}`` → ``out`` Linear(outputs) with ``outscale`` (§5, §7.2).

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
    """``layers`` hidden layers ``h{i}`` → ``out`` Linear(A) [+ ``std`` Linear(A)], outscale 0.01 (§7.1).

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
        out = Dense(self.action_dim, outscale=0.01, name="out")(x)
        std = None if self.discrete else Dense(self.action_dim, outscale=0.01, name="std")(x)
        return out, std


class RSSM(nn.Module):
    """Recurrent state-space model with a block GRU core (§3).

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
        """Block GRU step (§3.2): h (..., D), z (..., S, C), a (..., A) → h' (..., D)."""
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
        """(..., D) → unimixed prior log-probabilities (..., S, C) (§3.3)."""
        x = deter
        for layer in self.img:
            x = layer(x)
        return self._logits(self.imglogit(x))

    def posterior(self, deter: Array, embed: Array) -> Array:
        """h' (..., D), embed (..., U) → unimixed posterior log-probabilities (..., S, C) (§3.4)."""
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
        dec=Decoder(u, config.obs_dim, config.dec_layers),
        rew=Head(u, config.rew_layers, config.bins, outscale=0.0),
        con=Head(u, config.con_layers, 1, outscale=1.0),
        actor=Actor(u, config.actor_layers, config.action_dim, config.discrete),
        critic=Head(u, config.critic_layers, config.bins, outscale=0.0),
    )


def features(deter: Array, stoch: Array) -> Array:
    """Model features [deter, flat stoch] (§2.5): (..., D), (..., S, C) → (..., D + S·C)."""
    return jnp.concatenate([deter, stoch.reshape(*stoch.shape[:-2], -1)], -1)


def sample_onehot(logits: Array, gumbel: Array) -> Array:
    """Straight-through one-hot sample onehot + (p − sg(p)) (§3.5, §9.5), by Gumbel-max.

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
    """Actor distribution parameters (§7.1).

    Discrete: (unimixed log-probabilities (..., A), None). Continuous: (mean = tanh(out),
    std in [minstd, maxstd]), each (..., A).
    """
    if config.discrete:
        return unimix_logits(out, config.actor_unimix), None
    return normal_head(out, std_pre, config.minstd, config.maxstd)


def actor_sample(config: DreamerV3Config, dist: tuple[Array, Array | None], noise: Array) -> Array:
    """Sample an action from :func:`actor_dist` parameters with injected noise, (..., A) → (..., A).

    Discrete: ``noise`` is Gumbel noise, the result a straight-through one-hot. Continuous: ``noise``
    is ε ~ N(0, 1) and the action mean + std·ε, not squashed and not clipped.
    """
    if config.discrete:
        return sample_onehot(dist[0], noise)
    mean, std = dist
    return mean + std * noise


def actor_mode(config: DreamerV3Config, dist: tuple[Array, Array | None]) -> Array:
    """The deterministic action: argmax one-hot (discrete) or tanh mean (continuous)."""
    if config.discrete:
        return onehot_mode(dist[0])
    return dist[0]

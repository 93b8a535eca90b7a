"""DreamerV3 networks for flat vector observations, as flax.linen modules that are what runs.

Module and parameter names mirror the reference state names (nets.py:16-813@2411f7d, agent.py:63-83@2411f7d),
so a reference checkpoint maps onto these trees one to one:

- ``enc``: ``mlp0..`` (symlog, then Linear+RMSNorm+SiLU layers; the last activation is the embedding).
- ``dyn``: the RSSM: ``dynin0..2``, ``dyn0`` and ``dyncore`` (block GRU), ``img0..``/``imglogit`` (prior),
  ``obs0..``/``obslogit`` (posterior).
- ``dec``: ``mlp0..`` and one ``out_<key>`` per observation key (``out_vector`` for a flat vector;
  symlog-space predictions, outscale 0.1).
- ``rew``/``con``/``critic`` (and the slow critic): ``h0..`` and ``out``.
- ``actor``: ``h0..``, ``out`` and, for continuous actions, ``std``.

The functions after the modules apply them to one agent's parameter trees (:func:`encode`,
:func:`heads`, :func:`rssm_step`, ...). Two layouts make them fast without a second definition:
:class:`Heads` runs several networks that read the same input with their first layers as one matmul,
and :class:`RSSM` runs its block GRU block-first on arrays rearranged once per call
(:meth:`RSSM.prepare`, the ``"prepared"`` collection), outside the scans that step it.

Every module computes in the config's compute dtype (``dtype``, :attr:`DreamerV3Config.dtype`): the
layers cast their float32 parameters at use (:mod:`~sb3_worldmodels.blocks.layers`); the encoder's
symlog runs in float32 before the first layer's cast, and the outputs that parameterise a
distribution (decoder, reward, continue, critic, actor) are float32, as the reference's
(nets.py:249-256,362,437,443@2411f7d). The RSSM's states, samples and unimixed log-probabilities are in
the compute dtype (nets.py:58-95,207-220@2411f7d).

Shape symbols: D deter, H hidden, S stoch latents, C classes, G blocks, U units, O observation width,
A action width, F = D + S·C feature width, n bins, M rows.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels.blocks.breaks import broken
from sb3_worldmodels.blocks.distributions import unimix_logits
from sb3_worldmodels.blocks.layers import (
    PREPARED,
    BlockLinear,
    Conv,
    Dense,
    NormedDense,
    RMSNorm,
    block_matmul,
    block_matmul_pretransposed,
    hidden_layers,
    init_from_one_draw,
    matmul_pretransposed,
    rms_norm,
)
from sb3_worldmodels.blocks.math import symlog
from sb3_worldmodels.dreamerv3.config import DreamerV3Config

Array = jax.Array

__all__ = [
    "MODULES",
    "OUTSCALES",
    "RSSM",
    "Actor",
    "Decoder",
    "Encoder",
    "Head",
    "Heads",
    "Networks",
    "Observation",
    "encode",
    "example_observation",
    "features",
    "heads",
    "init_params",
    "make_networks",
    "pixels",
    "rssm_action_input",
    "rssm_posterior",
    "rssm_prepare",
    "rssm_prior",
    "rssm_step",
    "split_observation",
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
"""Init scale of the output layers (module, layer) (nets.py:816-884@2411f7d); other kernels 1.0."""

DECODER_SPACE_BLOCKS = 8
"""Blocks of the image decoder's ``space0`` BlockLinear from deter (``dec.simple.block_space: 8``,
configs.yaml:121@2411f7d), whatever the RSSM's ``blocks``."""

PIXEL_SCALE = np.float32(1.0 / 255.0)
"""uint8 pixels times this are in [0, 1]: the reference divides by 255.0 (agent.py:469-470@2411f7d),
which XLA compiles to a multiplication by the rounded reciprocal; multiplying here gives its values."""

MODULES = ("enc", "dyn", "dec", "rew", "con", "actor", "critic")
"""The optimised modules, in the reference's order (agent.py:101-103@2411f7d)."""


# ------------------------------------------------------------------------------------------------
# Modules
# ------------------------------------------------------------------------------------------------


Observation = Array | dict[str, Array]
"""What the encoder reads: the flat float32 vector (..., O), or for an image observation a dict with
"image" (..., H, W, C) uint8 and, when the observation also has vector keys, "vector" (..., O)."""


def pixels(image: Array | None, dtype: Any) -> Array:
    """uint8 pixels (...) as values in [0, 1] of the compute ``dtype``: the reference casts the image to
    the compute dtype and divides by 255 there (agent.py:469-470@2411f7d)."""
    return jnp.asarray(image, dtype) * PIXEL_SCALE.astype(dtype)


def split_observation(obs: Observation) -> tuple[Array | None, Array | None]:
    """(vector or None, image or None) of an :data:`Observation`."""
    if isinstance(obs, dict):
        return obs.get("vector"), obs.get("image")
    return obs, None


class Encoder(nn.Module):
    """The vector path symlog(obs) → ``layers`` × [Linear(U) + RMSNorm + SiLU] (``mlp{i}``,
    nets.py:249-256@2411f7d) and the image path image · :data:`PIXEL_SCALE` − 0.5 → ``conv{i}``
    [Conv(depth_i, k, stride 1 then 2) + RMSNorm + SiLU] → flatten (h, w, c) (nets.py:258-267@2411f7d),
    concatenated in that order (nets.py:270@2411f7d).

    An image whose sides are not multiples of 16 is zero-padded (after scaling) around its centre, so
    that the reference's layers apply unchanged (``padding``; none for 64 x 64 or 96 x 96).

    :data:`Observation` (...) → (..., U + h · w · depths[-1]) with (h, w) the final grid (either part
    alone without the other).
    """

    units: int
    layers: int = 3
    vector: bool = True
    depths: tuple[int, ...] = ()
    kernel: int = 5
    padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    """Zero rows and columns around the scaled image (sides not multiples of 16; ``image_padding``)."""
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, obs: Observation) -> Array:
        vector, image = split_observation(obs)
        outs = []
        if self.vector:
            x = symlog(jnp.asarray(vector, jnp.float32))  # in float32, before the layers' cast
            outs.append(hidden_layers(x, self.units, self.layers, "mlp", dtype=self.dtype))
        if self.depths:
            x = pixels(image, self.dtype)
            x = x if broken("pixel_offset") else x - 0.5
            if any(self.padding[0] + self.padding[1]):
                x = jnp.pad(x, [(0, 0)] * (x.ndim - 3) + [*self.padding, (0, 0)])
            for i, depth in enumerate(self.depths):
                x = Conv(depth, self.kernel, 1 if i == 0 else 2, dtype=self.dtype, name=f"conv{i}")(x)
            outs.append(x.reshape(*x.shape[:-3], -1))
        return outs[0] if len(outs) == 1 else jnp.concatenate(outs, -1)


class Decoder(nn.Module):
    """The observation's reconstruction from the features [deter, flat stoch] (nets.py:310-362@2411f7d).

    Vector keys: ``layers`` hidden layers ``mlp{i}`` → one output Linear per key, ``out_<key>`` of the
    key's width, outscale 0.1 (the reference clips each layer's gradient by its own norm, so the keys
    are separate layers, not one merged layer). Image: deter → ``space0`` BlockLinear(h·w·d, G)
    laid out (G, h, w, c) → (h, w, G·c); stoch → ``space1hid`` [Linear(2U) + RMSNorm + SiLU] →
    ``space1`` Linear to (h, w, d); the sum → ``spacenorm`` RMSNorm + SiLU; ``conv{i}`` transposed
    convolutions (stride 2, RMSNorm + SiLU) with the encoder's depths but the last, in reverse; then
    ``imgout``, a stride-1 transposed convolution to the image's channels (outscale 1), cropped by the
    encoder's ``padding``, and a sigmoid
    (nets.py:326-357@2411f7d), d = depths[-1].

    (..., F) → {"vector": (..., O) the keys' predictions in symlog space concatenated in ``outputs``
    order, "image": (..., H, W, C) the predicted image in [0, 1]}, each only when the observation
    has it, float32.
    """

    units: int
    outputs: tuple[tuple[str, int], ...]
    """(key, width) of each vector key, in the flat observation's order (empty: no vector)."""
    layers: int = 3
    image_channels: int = 0
    depths: tuple[int, ...] = ()
    kernel: int = 5
    grid: tuple[int, int] = (0, 0)
    """(h, w) of the first map (the encoder's last)."""
    padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    """Rows and columns cropped from the output (the encoder's padding)."""
    deter: int = 0
    blocks: int = 1
    dtype: Any = jnp.float32
    prefix: ClassVar[str] = "mlp"

    @nn.compact
    def __call__(self, feat: Array, first: Array | None = None) -> dict[str, Array]:
        out = {}
        if self.outputs:
            x = hidden_layers(feat, self.units, self.layers, self.prefix, first, dtype=self.dtype)
            outs = [
                Dense(w, DECODER_OUTSCALE, dtype=self.dtype, output_dtype=jnp.float32, name=f"out_{k}")(x)
                for k, w in self.outputs
            ]
            out["vector"] = outs[0] if len(outs) == 1 else jnp.concatenate(outs, -1)
        if self.image_channels:
            out["image"] = self._image(feat)
        return out

    def _image(self, feat: Array) -> Array:
        g, (h, w), depth, dtype = self.blocks, self.grid, self.depths[-1], self.dtype
        deter, stoch = feat[..., : self.deter], feat[..., self.deter :]
        x0 = BlockLinear(h * w * depth, g, dtype=dtype, name="space0")(deter)
        x0 = x0.reshape(*x0.shape[:-1], g, h, w, depth // g)
        x0 = x0 if broken("decoder_space_layout") else jnp.moveaxis(x0, -4, -2)
        x0 = x0.reshape(*x0.shape[:-4], h, w, depth)
        x1 = NormedDense(2 * self.units, dtype=dtype, name="space1hid")(stoch)
        x1 = Dense(h * w * depth, dtype=dtype, name="space1")(x1).reshape(*x1.shape[:-1], h, w, depth)
        x = jax.nn.silu(RMSNorm(name="spacenorm")(x0 + x1))
        for i in reversed(range(len(self.depths) - 1)):
            x = Conv(self.depths[i], self.kernel, 2, transpose=True, dtype=dtype, name=f"conv{i}")(x)
        out = Conv(
            self.image_channels,
            self.kernel,
            1,
            transpose=True,
            norm="none",
            act="none",
            dtype=dtype,
            name="imgout",
        )
        x = out(x)
        (top, bottom), (left, right) = self.padding
        if top + bottom + left + right:
            x = x[..., top : x.shape[-3] - bottom, left : x.shape[-2] - right, :]
        return jax.nn.sigmoid(x).astype(jnp.float32)  # the image distribution's mean (nets.py:362)


class Head(nn.Module):
    """``layers`` hidden layers ``h{i}`` → ``out`` Linear(outputs) with ``outscale`` (nets.py:432-438@2411f7d,
    configs.yaml:122-123,129@2411f7d).

    Reward and critic: outputs = n bins, outscale 0; continue: outputs = 1, outscale 1.
    (..., F) → (..., outputs) float32.
    """

    units: int
    layers: int
    outputs: int
    outscale: float
    dtype: Any = jnp.float32
    prefix: ClassVar[str] = "h"

    @nn.compact
    def __call__(self, feat: Array, first: Array | None = None) -> Array:
        x = hidden_layers(feat, self.units, self.layers, self.prefix, first, dtype=self.dtype)
        out = Dense(self.outputs, self.outscale, dtype=self.dtype, output_dtype=jnp.float32, name="out")
        return out(x)


class Actor(nn.Module):
    """``layers`` hidden layers ``h{i}`` → ``out`` Linear(A) [+ ``std`` Linear(A)], outscale 0.01
    (agent.py:63-70@2411f7d).

    Returns ``(out, std_pre)``, each (..., A) float32; ``std_pre`` is None for discrete actions (see
    :func:`actor_dist`).
    """

    units: int
    layers: int
    action_dim: int
    discrete: bool
    dtype: Any = jnp.float32
    prefix: ClassVar[str] = "h"

    @nn.compact
    def __call__(self, feat: Array, first: Array | None = None) -> tuple[Array, Array | None]:
        x = hidden_layers(feat, self.units, self.layers, self.prefix, first, dtype=self.dtype)
        kinds = ("out",) if self.discrete else ("out", "std")
        dtypes = {"dtype": self.dtype, "output_dtype": jnp.float32}
        outs = [Dense(self.action_dim, OUTSCALES["actor", k], **dtypes, name=k)(x) for k in kinds]
        return outs[0], outs[1] if len(outs) > 1 else None


HEAD_KINDS = {"slow": "critic"}
"""The network kind of a parameter-tree name that is not a kind itself (the slow critic)."""


def _network(config: DreamerV3Config, kind: str, name: str | None = None) -> nn.Module:
    """The module of one network kind (enc, dec, rew, con, critic, actor) of ``config``."""
    u, dtype = config.units, config.dtype
    image = bool(config.image_shape)
    depths = config.cnn_depths if image else ()
    if kind == "enc":
        padding = config.image_padding
        return Encoder(
            u, config.enc_layers, bool(config.obs_dim), depths, config.cnn_kernel, padding, dtype, name=name
        )
    if kind == "dec":
        return Decoder(
            u,
            config.decoder_outputs,
            config.dec_layers if config.obs_dim else 0,
            config.image_shape[-1] if image else 0,
            depths,
            config.cnn_kernel,
            config.image_grid,
            config.image_padding,
            config.deter,
            DECODER_SPACE_BLOCKS,
            dtype,
            name=name,
        )
    if kind == "actor":
        return Actor(u, config.actor_layers, config.action_dim, config.discrete, dtype, name=name)
    layers = {"rew": config.rew_layers, "con": config.con_layers, "critic": config.critic_layers}[kind]
    outputs = 1 if kind == "con" else config.bins
    return Head(u, layers, outputs, OUTSCALES[kind, "out"], dtype, name=name)


class Heads(nn.Module):
    """Networks that read the same input, run together: ``nets`` = (parameter-tree name, kind) pairs.

    The first layers of all of them run as one matmul of the input with their concatenated kernels
    (the input is read once; per column it is the same dot product as each layer on its own), then
    each network continues on its slice. (..., F) → one output per network, in ``nets`` order.
    """

    config: DreamerV3Config
    nets: tuple[tuple[str, str], ...]

    @nn.compact
    def __call__(self, x: Array) -> tuple[Any, ...]:
        modules = [_network(self.config, kind, name) for name, kind in self.nets]
        firsts = self._first_layers(x, modules)
        return tuple(m(x, first) for m, first in zip(modules, firsts, strict=True))

    def _first_layers(self, x: Array, modules: list[nn.Module]) -> list[Array | None]:
        """The first layers' preactivations (None where a network runs its own)."""
        deep = [m for m in modules if m.layers > 0]
        if len(deep) < 2 or self.is_initializing():
            return [None] * len(modules)
        params, dtype = self.variables["params"], self.config.dtype
        first = [params[str(m.name)][f"{m.prefix}0"] for m in deep]
        kernel = jnp.concatenate([q["kernel"] for q in first], -1).astype(dtype)
        bias = jnp.concatenate([q["bias"] for q in first], -1).astype(dtype)
        split = np.cumsum([q["bias"].shape[-1] for q in first])[:-1]
        outs = iter(jnp.split(jnp.asarray(x, dtype) @ kernel + bias, split, axis=-1))
        return [next(outs) if m.layers > 0 else None for m in modules]


class RSSM(nn.Module):
    """Recurrent state-space model with a block GRU core (nets.py:16-220@2411f7d).

    Methods (apply with ``method=``): :meth:`prepare`, :meth:`action_input`, :meth:`core` (block GRU
    step), :meth:`prior` and :meth:`posterior` (unimixed categorical log-probabilities).
    ``__call__`` creates every parameter and is used for initialisation.

    The block GRU runs block-first: its state is carried as (M, D) and as (G, M, D/G) blocks
    (:func:`to_blocks`), its block kernels as batched matmuls over G. :meth:`prepare` rearranges
    ``dyn0``'s block kernel (G, D/G + 3H, D/G), which acts on [h_g, u] per block: its h rows stay a
    block kernel (G, D/G, D/G); its u rows, shared by all blocks, become one dense (3H, D) kernel whose
    output is already block-major, so u is never repeated G times.
    """

    deter: int
    hidden: int
    stoch: int
    classes: int
    blocks: int
    img_layers: int = 2
    obs_layers: int = 1
    unimix: float = 0.01
    dtype: Any = jnp.float32
    """The compute dtype: of every layer, the state (deter, blocks) and the log-probabilities."""

    def setup(self) -> None:
        dtype = self.dtype
        self.dynin0 = NormedDense(self.hidden, dtype=dtype)
        self.dynin1 = NormedDense(self.hidden, dtype=dtype)
        self.dynin2 = NormedDense(self.hidden, dtype=dtype)
        self.dyn0 = BlockLinear(self.deter, self.blocks, norm=True, act="silu", dtype=dtype)
        self.dyncore = BlockLinear(3 * self.deter, self.blocks, dtype=dtype)
        self.img = [NormedDense(self.hidden, dtype=dtype, name=f"img{i}") for i in range(self.img_layers)]
        self.imglogit = Dense(self.stoch * self.classes, dtype=dtype)
        self.obs = [NormedDense(self.hidden, dtype=dtype, name=f"obs{i}") for i in range(self.obs_layers)]
        self.obslogit = Dense(self.stoch * self.classes, dtype=dtype)

    def prepare(self, for_gradient: bool = False) -> dict:
        """The ``"prepared"`` collection: the block kernels rearranged for :meth:`core` and, when
        ``for_gradient``, transposed copies of the kernels used inside a differentiated recurrence
        (see :func:`~sb3_worldmodels.blocks.layers.matmul_pretransposed`); all in the compute dtype,
        cast once here rather than at every step."""
        p = self.variables["params"]
        g, dg, dtype = self.blocks, self.deter // self.blocks, self.dtype
        k0 = p["dyn0"]["kernel"].astype(dtype)
        dyn0 = {
            "h": k0[:, :dg, :],
            "u": jnp.transpose(k0[:, dg:, :], (1, 0, 2)).reshape(-1, self.deter),
            "bias": p["dyn0"]["bias"].astype(dtype).reshape(g, 1, dg),
            "scale": p["dyn0"]["norm"]["scale"].astype(dtype).reshape(g, 1, dg),
        }
        out: dict[str, dict] = {
            "dyn0": dyn0,
            "dyncore": {"bias": p["dyncore"]["bias"].astype(dtype).reshape(g, 1, 3 * dg)},
        }
        if for_gradient:
            recurrent = ("dynin0", "dynin1", *(f"obs{i}" for i in range(self.obs_layers)), "obslogit")
            out.update({k: {"kernel_t": v["kernel"].T.astype(dtype)} for k, v in p.items() if k in recurrent})
            dyn0["h_t"] = jnp.swapaxes(dyn0["h"], 1, 2)
            dyn0["u_t"] = dyn0["u"].T
            out["dyncore"]["kernel_t"] = jnp.swapaxes(p["dyncore"]["kernel"], 1, 2).astype(dtype)
        return out

    def action_input(self, action: Array) -> Array:
        """The GRU's action projection (..., A) → (..., H): the action, in the compute dtype, scaled to
        at most 1 in absolute value (nets.py:82,130-131@2411f7d), then ``dynin2``. It does not depend
        on the recurrent state."""
        action = jnp.asarray(action, self.dtype)
        action = action / jax.lax.stop_gradient(jnp.maximum(1.0, jnp.abs(action)))
        return self.dynin2(action)

    def core(
        self,
        deter: Array,
        blocks: Array,
        stoch: Array,
        action: Array | None = None,
        action_input: Array | None = None,
    ) -> tuple[Array, Array]:
        """Block GRU step (nets.py:119-173@2411f7d): deter (M, D) with its blocks (G, M, D/G), stoch
        (M, S, C) or (M, S·C) and the action (M, A) (or its :meth:`action_input`) → the new state as
        (deter (M, D), blocks (G, M, D/G)).

        Carrying both layouts through a scan saves one transpose per step and keeps XLA from fusing
        the gate math into the transpose back to (M, D) (a strided loop several times slower on CPU).
        The state is computed and returned in the compute dtype (the inputs are cast to it,
        nets.py:58,82@2411f7d).
        """
        g, dg, dtype = self.blocks, self.deter // self.blocks, self.dtype
        prep = self.variables[PREPARED] if self.has_variable(PREPARED, "dyn0") else self.prepare()
        dyn0, dyncore = prep["dyn0"], prep["dyncore"]
        m = deter.shape[0]
        deter, blocks = jnp.asarray(deter, dtype), jnp.asarray(blocks, dtype)
        stoch = jnp.asarray(stoch, dtype).reshape(m, -1)
        if action_input is None:
            action_input = self.action_input(action)  # type: ignore[arg-type]
        u = jnp.concatenate([self.dynin0(deter), self.dynin1(stoch), action_input], -1)
        if "u_t" in dyn0:
            x = block_matmul_pretransposed(blocks, dyn0["h"], dyn0["h_t"])
            x += _to_blocks(g, matmul_pretransposed(u, dyn0["u"], dyn0["u_t"]))
        else:
            x = block_matmul(blocks, dyn0["h"]) + _to_blocks(g, u @ dyn0["u"])
        x = jax.nn.silu(rms_norm(x + dyn0["bias"], dyn0["scale"], axis=(0, 2)))
        kernel = self.variables["params"]["dyncore"]["kernel"].astype(dtype)
        if "kernel_t" in dyncore:
            x = block_matmul_pretransposed(x, kernel, dyncore["kernel_t"]) + dyncore["bias"]
        else:
            x = block_matmul(x, kernel) + dyncore["bias"]
        # Per block: (reset, cand, update) chunks of D/G.
        reset = jax.nn.sigmoid(x[..., :dg])
        cand = jnp.tanh(reset * x[..., dg : 2 * dg])
        update = jax.nn.sigmoid(x[..., 2 * dg :] - 1.0)
        new = update * cand + (1.0 - update) * blocks
        return jnp.swapaxes(new, 0, 1).reshape(m, g * dg), new

    def prior(self, deter: Array) -> Array:
        """(..., D) → unimixed prior log-probabilities (..., S, C) in the compute dtype
        (nets.py:112-117@2411f7d)."""
        x = deter
        for layer in self.img:
            x = layer(x)
        return self._logits(self.imglogit(x))

    def posterior(self, deter: Array, embed: Array) -> Array:
        """h' (..., D), embed (..., U) → unimixed posterior log-probabilities (..., S, C) in the compute
        dtype (nets.py:66-69@2411f7d)."""
        x = jnp.concatenate([jnp.asarray(deter, self.dtype), jnp.asarray(embed, self.dtype)], -1)
        for layer in self.obs:
            x = layer(x)
        return self._logits(self.obslogit(x))

    def _logits(self, x: Array) -> Array:
        """Logit layer output (..., S·C) → unimixed log-probabilities (..., S, C), computed in the
        layer's (compute) dtype as the reference's (nets.py:207-220@2411f7d)."""
        x = x.reshape(*x.shape[:-1], self.stoch, self.classes)
        return unimix_logits(x, self.unimix)

    def __call__(self, deter: Array, stoch: Array, action: Array, embed: Array) -> tuple[Array, Array, Array]:
        """Initialisation entry: creates every parameter; returns (h', posterior, prior)."""
        if self.is_initializing():  # the block layers' parameters, read by core() in its own layout
            dg = self.deter // self.blocks
            self.dyn0(jnp.zeros((1, self.blocks * (dg + 3 * self.hidden)), jnp.float32))
            self.dyncore(jnp.zeros((1, self.deter), jnp.float32))
        deter, _ = self.core(deter, _to_blocks(self.blocks, deter), stoch, action)
        return deter, self.posterior(deter, embed), self.prior(deter)


def _to_blocks(blocks: int, deter: Array) -> Array:
    return jnp.swapaxes(deter.reshape(deter.shape[0], blocks, -1), 0, 1)


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
    return Networks(
        dyn=RSSM(
            deter=config.deter,
            hidden=config.hidden,
            stoch=config.stoch,
            classes=config.classes,
            blocks=config.blocks,
            img_layers=config.img_layers,
            obs_layers=config.obs_layers,
            unimix=config.unimix,
            dtype=config.dtype,
        ),
        **{kind: _network(config, kind) for kind in ("enc", "dec", "rew", "con", "actor", "critic")},  # type: ignore[arg-type]
    )


@functools.cache
def _heads_module(config: DreamerV3Config, nets: tuple[tuple[str, str], ...]) -> Heads:
    return Heads(config, nets)


def features(deter: Array, stoch: Array) -> Array:
    """Model features [deter, flat stoch] (nets.py:786-813@2411f7d):
    (..., D), (..., S, C) → (..., D + S·C)."""
    return jnp.concatenate([deter, stoch.reshape(*stoch.shape[:-2], -1)], -1)


# ------------------------------------------------------------------------------------------------
# Applying the modules to an agent's parameter trees
# ------------------------------------------------------------------------------------------------


def encode(config: DreamerV3Config, params: dict, obs: Observation) -> Array:
    """:class:`Encoder`: raw observations (an :data:`Observation`) → (..., E) embedding, E =
    ``config.embed_dim``."""
    out: Array = make_networks(config).enc.apply({"params": params}, obs)  # type: ignore[assignment]
    return out


def heads(config: DreamerV3Config, params: dict[str, dict], x: Array) -> dict[str, Any]:
    """The networks named in ``params`` (dec, rew, con, critic, actor, or slow: a critic) on the same
    input x (..., F), their first layers in one matmul (:class:`Heads`); their outputs by name (the
    decoder's (..., O), a head's (..., outputs), the actor's ``(out, std_pre)``)."""
    nets = tuple((name, HEAD_KINDS.get(name, name)) for name in params)
    outs = _heads_module(config, nets).apply({"params": params}, x)
    return dict(zip(params, outs, strict=True))


def _rssm(config: DreamerV3Config, params: dict, prepared: dict | None, method: str, *args: Any) -> Any:
    variables = {"params": params} if prepared is None else {"params": params, PREPARED: prepared}
    rssm = make_networks(config).dyn
    return rssm.apply(variables, *args, method=getattr(RSSM, method))


def rssm_prepare(config: DreamerV3Config, params: dict, for_gradient: bool = False) -> dict:
    """:meth:`RSSM.prepare`: the ``prepared`` arrays of the other ``rssm_*`` functions, computed once
    outside the loops that step the RSSM."""
    out: dict = _rssm(config, params, None, "prepare", for_gradient)
    return out


def rssm_action_input(config: DreamerV3Config, params: dict, action: Array) -> Array:
    """:meth:`RSSM.action_input`: (..., A) → (..., H), to compute for all steps before a scan."""
    out: Array = _rssm(config, params, None, "action_input", action)
    return out


def rssm_step(
    config: DreamerV3Config,
    params: dict,
    prepared: dict,
    deter: Array,
    blocks: Array,
    stoch: Array,
    action: Array | None = None,
    action_input: Array | None = None,
) -> tuple[Array, Array]:
    """:meth:`RSSM.core`: (deter (M, D), blocks (G, M, D/G)) after one GRU step."""
    args = (deter, blocks, stoch, action, action_input)
    out: tuple[Array, Array] = _rssm(config, params, prepared, "core", *args)
    return out


def rssm_prior(config: DreamerV3Config, params: dict, deter: Array) -> Array:
    """:meth:`RSSM.prior`: (..., D) → (..., S, C)."""
    out: Array = _rssm(config, params, None, "prior", deter)
    return out


def rssm_posterior(
    config: DreamerV3Config, params: dict, deter: Array, embed: Array, prepared: dict | None = None
) -> Array:
    """:meth:`RSSM.posterior`: h' (..., D), embed (..., U) → (..., S, C); with ``prepared`` for
    gradient, its kernels' transposed copies serve the reverse pass."""
    out: Array = _rssm(config, params, prepared, "posterior", deter, embed)
    return out


def to_blocks(config: DreamerV3Config, deter: Array) -> Array:
    """(M, D) → (G, M, D/G): the block-first view of a deter state carried beside it by :func:`rssm_step`."""
    return _to_blocks(config.blocks, deter)


# ------------------------------------------------------------------------------------------------
# Initialisation
# ------------------------------------------------------------------------------------------------


def init_params(config: DreamerV3Config, key: Array) -> tuple[dict, dict]:
    """Fresh parameters from the modules' initialisers (nets.py:816-884@2411f7d): (params of
    :data:`MODULES`, an independently initialised slow critic).

    Every kernel N(0, 1) truncated to [−2, 2] times 1.1368·outscale/sqrt(fan-in) (fan-in: all kernel
    axes but the last; outscale from :data:`OUTSCALES`, 0.1 for the decoder's outputs, else 1),
    biases 0 and norm scales 1; the kernels' values cut from one draw of ``key``
    (:func:`~sb3_worldmodels.blocks.layers.init_from_one_draw`). Traceable (jit it: run op by op,
    every operation compiles apart).
    """
    return init_from_one_draw(functools.partial(_init_modules, config), key)


def _init_modules(config: DreamerV3Config, key: Array) -> tuple[dict, dict]:
    nets = make_networks(config)
    keys = dict(zip((*MODULES, "slow_critic"), jax.random.split(key, len(MODULES) + 1), strict=True))
    n = 1
    deter = jnp.zeros((n, config.deter), jnp.float32)
    stoch = jnp.zeros((n, config.stoch, config.classes), jnp.float32)
    action = jnp.zeros((n, config.action_dim), jnp.float32)
    obs = example_observation(config, n)
    feat = jnp.zeros((n, config.feat_dim), jnp.float32)
    embed = jnp.zeros((n, config.embed_dim), jnp.float32)
    inputs = {"enc": (obs,), "dyn": (deter, stoch, action, embed)}
    params = {m: getattr(nets, m).init(keys[m], *inputs.get(m, (feat,)))["params"] for m in MODULES}
    slow_critic = nets.critic.init(keys["slow_critic"], feat)["params"]
    return params, slow_critic


def example_observation(config: DreamerV3Config, n: int) -> Observation:
    """Zero observations of ``config``'s layout for n rows (an :data:`Observation`)."""
    vector = jnp.zeros((n, config.obs_dim), jnp.float32)
    if not config.image_shape:
        return vector
    image = jnp.zeros((n, *config.image_shape), jnp.uint8)
    return {"vector": vector, "image": image} if config.obs_dim else {"image": image}

"""TD-MPC2 networks as flax modules (layers.py:7-97@b67b21c, world_model.py:20-174@b67b21c,
init.py:4-22@b67b21c, math.py:5-95@b67b21c).

:class:`MLP` (of the shared :mod:`~sb3_worldmodels.blocks.layers`) is the one definition of every
network; :func:`make_networks` builds the agent's set and the functions below (:func:`encode`,
:func:`next_latent`, :func:`q_logits`, ...) apply them to the parameter tree of one agent
(:func:`init_params`):

- ``"encoder"``, ``"dynamics"``, ``"reward"``, ``"pi"`` (and ``"termination"`` when episodic): dicts
  ``{"0": layer, "1": layer, ...}`` in the reference's layer order (``_encoder.state.i``,
  ``_dynamics.i``, ...);
- ``"qs"``: the K Q members with every leaf stacked on a leading K axis (``_Qs.params``);
- ``"task_emb"`` (multi-task): the (tasks, task_dim) embedding table (``_task_emb.weight``).

Multi-task networks read the task embedding of each row after their first input (the latent or the
observation) and before the action (world_model.py:82-95@b67b21c): pass a :class:`Task`.

A normed layer is ``{"kernel" (in, out), "bias" (out,), "norm": {"scale" (out,), "bias" (out,)}}``
(the reference's ``ln.weight`` and ``ln.bias``); a plain output layer ``{"kernel", "bias"}``. Kernels
are (in, out), the transpose of PyTorch's weights.

Pixel observations (later upstream code, @eece801): :class:`PixelEncoder`, the reference's ``conv``
encoder (layers.py:36-71,136-164@eece801), on channel-last uint8 images (..., H, W, C) with the
shift augmentation of :mod:`sb3_worldmodels.blocks.images`; its parameters ``{"2", "4", "6", "8"}``
are the reference's ``_encoder.rgb.{2,4,6,8}`` convolutions, kernels (kh, kw, in, out) (PyTorch's
Conv2d weight (out, in, kh, kw) transposed by (2, 3, 1, 0)). With ``config.image_shape`` it is the
agent's ``"encoder"`` (in place of the state MLP: the reference builds the encoder of its one
observation type, layers.py:153-164@eece801) and :func:`encode` takes images and their shift offsets.

Shape symbols: L latent, A action, O observation, K ensemble members, n bins.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels.blocks.backend import gather_free, select_rows
from sb3_worldmodels.blocks.images import SHIFT_PAD, shift_images
from sb3_worldmodels.blocks.layers import (
    Conv,
    Dense,
    NormedDense,
    hidden_layers,
    is_mask,
    simnorm,
    torch_default_uniform,
)
from sb3_worldmodels.blocks.math import symlog_twohot_mean
from sb3_worldmodels.tdmpc2.config import TDMPC2Config

Array = jax.Array

LN_EPS = 1e-5
"""PyTorch's LayerNorm epsilon (nn.LayerNorm's default in NormedLinear, layers.py:50-72@b67b21c)."""
INIT_STD = 0.02
"""Std of every linear weight at init (``init.py:4-22``; the ±2 absolute truncation is a no-op)."""


# ------------------------------------------------------------------------------------------------
# The reference's mlp (layers.py:75-97@b67b21c) from the shared layers
# ------------------------------------------------------------------------------------------------


INIT_STD = 0.02
"""Std of every linear weight at init (``init.py:4-22``; the ±2 absolute truncation is a no-op)."""


class MLP(nn.Module):
    """The reference ``mlp`` (layers.py:75-97@b67b21c): ``layers`` NormedLinear layers of width ``units``
    (affine → LayerNorm (eps 1e-5) → Mish; dropout on the first one only), then the output layer: a
    SimNorm NormedLinear (``output`` "simnorm") or a plain linear layer ("linear"; "zero":
    zero-initialised, the reward head and every Q member, world_model.py:29-31@b67b21c).

    Every kernel N(0, 0.02²), biases 0, LayerNorm scale 1 and offset 0 (init.py:4-22@b67b21c). Layers
    are named "0", "1", ... as the reference's ``nn.Sequential``; a normed layer's parameters are
    ``{"kernel" (in, out), "bias", "norm": {"scale", "bias"}}``, a plain one's ``{"kernel", "bias"}``.
    (..., in) → (..., out): a SimNorm output (a latent) in the compute dtype ``dtype``, a linear one
    (the logits and parameters of the reward, value, policy and termination distributions) in float32.
    """

    units: int
    layers: int
    out: int
    output: str = "linear"
    simnorm_dim: int = 8
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array, drop: tuple[Array, float, str] | None = None) -> Array:
        init = nn.initializers.normal(INIT_STD)
        layers = {"act": "mish", "norm": "layer", "kernel_init": init, "drop": drop, "dtype": self.dtype}
        x = hidden_layers(x, self.units, self.layers, "", **layers)
        last = str(self.layers)
        if self.output == "simnorm":
            head = NormedDense(
                self.out,
                "simnorm",
                "layer",
                kernel_init=init,
                simnorm_dim=self.simnorm_dim,
                dtype=self.dtype,
                name=last,
            )
            return head(x)
        zero = self.output == "zero"
        out = Dense(
            self.out,
            kernel_init=nn.initializers.zeros if zero else init,
            dtype=self.dtype,
            output_dtype=jnp.float32,
            name=last,
        )
        return out(x)


# ------------------------------------------------------------------------------------------------
# Pixel encoder (layers.py:36-71,136-164@eece801)
# ------------------------------------------------------------------------------------------------

NUM_CHANNELS = 32
"""Output channels of every convolution of the pixel encoder (``num_channels``, config.yaml:58@eece801;
no model-size preset changes it, common/__init__.py:1-24@eece801)."""

PIXEL_CONVS: tuple[tuple[str, int, int], ...] = (("2", 7, 2), ("4", 5, 2), ("6", 3, 2), ("8", 3, 1))
"""(name, kernel size, stride) of the encoder's convolutions in order, named by their index in the
reference's ``nn.Sequential`` (layers.py:142-147@eece801). Padding VALID (Conv2d's default 0)."""


def _conv(features: int, kernel: int, stride: int, channels: int, name: str, dtype: Any) -> Conv:
    """``nn.Conv2d(channels, features, kernel, stride)``: VALID padding, no norm or activation, kernel
    and bias U(±1/sqrt(k·k·channels)), PyTorch's default, which the reference keeps for its
    convolutions (``init.weight_init`` re-initialises Linear, Embedding and ParameterList only,
    init.py:4-16@eece801, applied at world_model.py:31@eece801)."""
    init = torch_default_uniform(kernel * kernel * channels)
    return Conv(
        features,
        kernel,
        stride,
        padding="VALID",
        norm="none",
        act="none",
        kernel_init=init,
        bias_init=init,
        dtype=dtype,
        name=name,
    )


def pixel_feature_shape(height: int = 64, width: int = 64) -> tuple[int, int]:
    """(h, w) of the last convolution's output for (height, width) images: (4, 4) at 64×64."""
    for _, k, stride in PIXEL_CONVS:
        height, width = (height - k) // stride + 1, (width - k) // stride + 1
    return height, width


def pixel_latent_dim(height: int = 64, width: int = 64, num_channels: int = NUM_CHANNELS) -> int:
    """Width of the pixel encoder's latent: num_channels·h·w (32·4·4 = 512 at 64×64). The reference
    never projects it to ``latent_dim`` (layers.py:136-150@eece801): its dynamics, heads and the
    update's latent buffer assume ``latent_dim`` wide latents (world_model.py:26-30@eece801,
    tdmpc2.py:269@eece801), so pixel agents work there only where latent_dim equals this width."""
    h, w = pixel_feature_shape(height, width)
    return num_channels * h * w


class PixelEncoder(nn.Module):
    """TD-MPC2's ``conv`` encoder with SimNorm output (layers.py:136-164@eece801), channel-last.

    ShiftAug (optional, given ``shifts``: :func:`~sb3_worldmodels.blocks.images.shift_images`) →
    x / 255 − 0.5 (``PixelPreprocess``, layers.py:62-71@eece801) → conv 7×7 stride 2 → ReLU → conv
    5×5/2 → ReLU → conv 3×3/2 → ReLU → conv 3×3/1 → flatten in the reference's channel-first
    (C, h, w) order → SimNorm (groups of ``simnorm_dim``). Every conv has ``num_channels`` outputs;
    parameters "2", "4", "6", "8" (:data:`PIXEL_CONVS`), the reference's ``_encoder.rgb.<i>``.

    Because of that flatten order, at 64×64 each SimNorm group of 8 is two rows of the 4×4 map of one
    channel, so the last convolution's bias shifts whole groups and gets no gradient (in the
    reference too; true wherever simnorm_dim divides h·w).

    The reference applies ShiftAug in every call, acting and planning included (it does not check
    ``self.training``); ``shifts=None`` here skips it.

    Args:
        obs: (..., H, W, C) images (uint8 0-255, or float in the same range); the reference's are
            64×64 (layers.py:141@eece801) with C = 9, three stacked RGB frames, oldest first
            (dmcontrol.py:66-81@eece801).
        shifts: (..., 2) integer offsets in [0, 2·pad] (x, y) per image, or None.

    Returns:
        (..., L) latents in the compute dtype ``dtype``, L = :func:`pixel_latent_dim` (512 at 64×64
        and 32 channels).
        Intermediates are sown under "intermediates" ("shifted", "preprocessed", "conv2", "relu3",
        "conv4", "relu5", "conv6", "relu7", "conv8", "flat"; Sequential indices of the reference).
    """

    num_channels: int = NUM_CHANNELS
    simnorm_dim: int = 8
    pad: int = SHIFT_PAD
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, obs: Array, shifts: Array | None = None) -> Array:
        lead = obs.shape[:-3]
        x = obs.reshape(-1, *obs.shape[-3:])
        if shifts is not None:
            x = shift_images(x, jnp.reshape(shifts, (-1, 2)), self.pad)
            self.sow("intermediates", "shifted", x)
        x = x.astype(self.dtype) / 255.0 - 0.5
        self.sow("intermediates", "preprocessed", x)
        for i, (name, kernel, stride) in enumerate(PIXEL_CONVS):
            x = _conv(self.num_channels, kernel, stride, x.shape[-1], name, self.dtype)(x)
            self.sow("intermediates", f"conv{name}", x)
            if i < len(PIXEL_CONVS) - 1:
                x = jax.nn.relu(x)
                self.sow("intermediates", f"relu{int(name) + 1}", x)
        x = jnp.transpose(x, (0, 3, 1, 2)).reshape(x.shape[0], -1)  # (C, h, w) order, as nn.Flatten
        self.sow("intermediates", "flat", x)
        return simnorm(x, self.simnorm_dim).reshape(*lead, -1)


def init_pixel_encoder(
    key: Array, image_shape: tuple[int, int, int], num_channels: int = NUM_CHANNELS, simnorm_dim: int = 8
) -> dict:
    """Fresh :class:`PixelEncoder` parameters for (H, W, C) images: every kernel and bias
    U(±1/sqrt(fan_in)), PyTorch's Conv2d default
    (:func:`~sb3_worldmodels.blocks.layers.torch_default_uniform`)."""
    encoder = PixelEncoder(num_channels, simnorm_dim)
    params: dict = encoder.init(key, jnp.zeros((1, *image_shape), jnp.uint8))["params"]
    return params


# ------------------------------------------------------------------------------------------------
# The world model's networks (world_model.py:20-31@b67b21c) and their initialisation
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Networks:
    """The module objects of one agent (world_model.py:24-31@b67b21c); parameters live in the state.
    ``qs`` is one Q member: the K members share its definition and stack their parameters on a
    leading axis (:func:`q_logits`)."""

    encoder: nn.Module
    """The state MLP, or the :class:`PixelEncoder` for an image (layers.py:153-164@eece801)."""
    dynamics: MLP
    reward: MLP
    pi: MLP
    qs: MLP
    termination: MLP | None = None
    """Episodic only (world_model.py:28@7ec6bc8)."""

    def named(self) -> dict[str, nn.Module]:
        """The networks by parameter-tree name, in the order of their initialisation."""
        nets = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        return {name: net for name, net in nets.items() if net is not None}


@functools.cache
def make_networks(config: TDMPC2Config) -> Networks:
    """Build (and cache per config) the flax modules of an agent."""
    lat, hid, norm, dtype = config.latent_dim, config.mlp_dim, config.simnorm_dim, config.dtype
    encoder: nn.Module
    if config.image_shape:
        encoder = PixelEncoder(_num_channels(config), norm, dtype=dtype)
    else:
        encoder = MLP(config.enc_dim, max(config.num_enc_layers - 1, 1), lat, "simnorm", norm, dtype)
    return Networks(
        encoder=encoder,
        dynamics=MLP(hid, 2, lat, "simnorm", norm, dtype),
        reward=MLP(hid, 2, config.num_bins, "zero", dtype=dtype),
        pi=MLP(hid, 2, 2 * config.action_dim, dtype=dtype),
        qs=MLP(hid, 2, config.num_bins, "zero", dtype=dtype),
        termination=MLP(hid, 2, 1, dtype=dtype) if config.episodic else None,
    )


def _num_channels(config: TDMPC2Config) -> int:
    """The pixel encoder's channels (set by :func:`~sb3_worldmodels.tdmpc2.config.preset` for an image)."""
    if config.num_channels is None:
        raise ValueError("TD-MPC2: an image config needs num_channels; build it with preset().")
    return config.num_channels


def _input_width(config: TDMPC2Config, name: str) -> int:
    task = 0 if name == "termination" else config.task_dim
    if name == "encoder":
        return config.obs_dim + task
    return config.latent_dim + task + (config.action_dim if name in ("dynamics", "reward", "qs") else 0)


TASK_EMB_INIT = 0.02
"""The task embedding starts U(−0.02, 0.02) (nn.Embedding in init.py:4-22@b67b21c)."""


def _init_module(net: nn.Module, width: int, key: Array) -> dict:
    return net.init(key, jnp.zeros((1, width), jnp.float32))["params"]


def init_params(config: TDMPC2Config, key: Array) -> tuple[dict, dict]:
    """Fresh (params, target Q params) from the modules' initialisers: weights N(0, 0.02²), biases 0,
    LayerNorm scale 1 and offset 0, the last layers of the reward head and of every Q member zero;
    the target Qs a copy; a multi-task embedding U(−0.02, 0.02) (init.py:4-22@b67b21c,
    world_model.py:29-31@b67b21c). Traceable."""
    nets = make_networks(config).named()
    if config.multitask:  # single-task draws stay those of the key itself
        key, task_key = jax.random.split(key)
    keys = dict(zip(nets, jax.random.split(key, len(nets)), strict=True))
    params: dict = {}
    for name, net in nets.items():
        init = functools.partial(_init_module, net, _input_width(config, name))
        if name == "encoder" and config.image_shape:
            height, width, channels = config.image_shape
            image = (height, width, channels)
            params[name] = init_pixel_encoder(keys[name], image, _num_channels(config), config.simnorm_dim)
        elif name == "qs":  # K independently initialised members, stacked
            params[name] = jax.vmap(init)(jax.random.split(keys[name], config.num_q))
        else:
            params[name] = init(keys[name])
    if config.multitask:
        shape = (config.num_tasks, config.task_dim)
        params["task_emb"] = jax.random.uniform(task_key, shape, jnp.float32, -TASK_EMB_INIT, TASK_EMB_INIT)
    return params, jax.tree_util.tree_map(lambda x: x, params["qs"])


def _run(config: TDMPC2Config, name: str, params: dict, x: Array, drop: tuple | None = None) -> Array:
    """Network ``name`` of :func:`make_networks` applied to x with its parameters ``params``."""
    out: Array = getattr(make_networks(config), name).apply({"params": params}, x, drop)
    return out


# ------------------------------------------------------------------------------------------------
# Multi-task conditioning (world_model.py:19-23,82-95,138-148@b67b21c)
# ------------------------------------------------------------------------------------------------


class Task(NamedTuple):
    """What a multi-task network reads about each row's task."""

    emb: Array
    """(B, task_dim) embedding rows (a (task_dim,) row serves every row)."""
    mask: Array
    """(B, A) 1 for the task's true action dimensions, 0 for the padding (or (A,))."""


def action_masks(config: TDMPC2Config) -> np.ndarray:
    """(tasks, A) float32: row i is 1 on task i's first ``action_dims[i]`` entries
    (world_model.py:21-23@b67b21c)."""
    return (np.arange(config.action_dim)[None] < np.asarray(config.action_dims)[:, None]).astype(np.float32)


def renormalise_task_embeddings(params: dict, task: Array) -> dict:
    """``params`` with the embedding rows of the tasks ``task`` (int, any shape) scaled to norm 1 where
    above it, by 1/(norm + 1e-7): what ``nn.Embedding(max_norm=1)`` does in place to the stored weight
    at every lookup (world_model.py:19@b67b21c). Later lookups and gradients see the result as a plain
    parameter."""
    table = params["task_emb"]
    norm = jnp.sqrt(jnp.sum(jnp.square(table), -1))
    if gather_free():  # the rows used, by comparing every row with every id
        used = jnp.any(jnp.arange(table.shape[0])[:, None] == jnp.ravel(task)[None, :], axis=1)
    else:
        used = jnp.zeros(table.shape[0], bool).at[jnp.ravel(task)].set(True)
    scale = jnp.where(used & (norm > 1.0), 1.0 / (norm + 1e-7), 1.0)
    return {**params, "task_emb": table * scale[:, None]}


def task_conditioning(config: TDMPC2Config, params: dict, task: Array) -> Task:
    """The :class:`Task` of task ids ``task`` (B,) or () from the (already renormalised) table."""
    if gather_free():  # the rows by masked sums over the tasks
        return Task(select_rows(params["task_emb"], task), select_rows(action_masks(config), task))
    return Task(params["task_emb"][task], jnp.asarray(action_masks(config))[task])


def _with_task(x: Array, task: Task | None) -> Array:
    """[x, task embedding] along the last axis, the embedding broadcast over x's leading axes."""
    if task is None:
        return x
    emb = jnp.broadcast_to(task.emb, (*x.shape[:-1], task.emb.shape[-1]))
    return jnp.concatenate([x, emb], -1)


# ------------------------------------------------------------------------------------------------
# Model components (world_model.py)
# ------------------------------------------------------------------------------------------------


def encode(
    config: TDMPC2Config, params: dict, obs: Array, task: Task | None = None, shifts: Array | None = None
) -> Array:
    """(..., O) observations → (..., L) latents (``world_model.py:97-104``).

    With ``config.image_shape``: (..., H, W, C) uint8 images through the :class:`PixelEncoder`
    (world_model.py:104-111@eece801), shifted by ``shifts`` (..., 2) (the reference's ShiftAug, which
    it applies at every encode: draw them fresh per call, e.g. with
    :func:`~sb3_worldmodels.blocks.images.random_shifts`); None leaves the images as they are (the
    same as offset ``pad``).
    """
    if config.image_shape:
        if task is not None:
            raise ValueError("a multi-task TD-MPC2 encodes state observations only (no images).")
        latent: Array = make_networks(config).encoder.apply({"params": params["encoder"]}, obs, shifts)  # type: ignore[assignment]
        return latent
    return _run(config, "encoder", params["encoder"], _with_task(obs, task))


def next_latent(
    config: TDMPC2Config, params: dict, z: Array, action: Array, task: Task | None = None
) -> Array:
    """Latent dynamics d(z, a): (..., L), (..., A) → (..., L) (``:106-113``)."""
    return _run(config, "dynamics", params["dynamics"], jnp.concatenate([_with_task(z, task), action], -1))


def reward_logits(
    config: TDMPC2Config, params: dict, z: Array, action: Array, task: Task | None = None
) -> Array:
    """(..., L), (..., A) → (..., n) reward logits (``:115-122``)."""
    return _run(config, "reward", params["reward"], jnp.concatenate([_with_task(z, task), action], -1))


def termination_logit(config: TDMPC2Config, params: dict, z: Array) -> Array:
    """Episodic only: (..., L) → (...) logit that the transition into z terminated
    (world_model.py:28@7ec6bc8)."""
    return _run(config, "termination", params["termination"], z)[..., 0]


def decode(config: TDMPC2Config, logits: Array) -> Array:
    """two_hot_inv: (..., n) logits → (...) values (expectation in symlog space, then symexp)."""
    return symlog_twohot_mean(logits, config.num_bins, config.vmin, config.vmax)


def q_logits(
    config: TDMPC2Config, qs: dict, z: Array, action: Array, key: Array | None, task: Task | None = None
) -> Array:
    """All K members on the same input: (..., L), (..., A) → (K, ..., n) logits (``:152-174``).

    ``key`` draws independent dropout masks per member (rate ``config.dropout``); None = no dropout.
    A bool ``key`` (K, ..., mlp_dim) gives each member's keep-mask explicitly (see :func:`dropout`).
    """
    return _members_logits(config, qs, jnp.concatenate([_with_task(z, task), action], -1), key, config.num_q)


def _members_logits(config: TDMPC2Config, members: dict, x: Array, key: Array | None, count: int) -> Array:
    """The ``count`` stacked members on the same input x (..., L + A) → (count, ..., n) logits, each with
    its own dropout mask (from ``key``; None = no dropout)."""
    if key is None:
        return jax.vmap(lambda p: _run(config, "qs", p, x))(members)
    drop = (config.dropout, config.dropout_masks)
    keys = key if is_mask(key) else jax.random.split(key, count)
    return jax.vmap(lambda p, k: _run(config, "qs", p, x, (k, *drop)))(members, keys)


def q_pair_value(
    config: TDMPC2Config,
    qs: dict,
    z: Array,
    action: Array,
    pair: Array,
    key: Array | None,
    reduce: str,
    task: Task | None = None,
) -> Array:
    """Decoded values of the two members ``pair`` (2,) int32, combined by "min" or "avg": (...).

    Only the two members are evaluated (the reference evaluates all K, then picks two: the same
    values, and at K = 5 less than half the work; docs/deviations.md T11).
    """
    take = select_rows if gather_free() else (lambda x, index: x[index])  # gather-free: masked sums
    members = jax.tree_util.tree_map(lambda x: take(x, pair), qs)
    if key is not None and is_mask(key):  # explicit masks of all K members: keep the pair's
        key = take(key, pair)
    logits = _members_logits(config, members, jnp.concatenate([_with_task(z, task), action], -1), key, 2)
    values = decode(config, logits)
    a, b = values[0], values[1]
    return jnp.minimum(a, b) if reduce == "min" else 0.5 * (a + b)


def policy(
    config: TDMPC2Config, params: dict, z: Array, eps: Array, task: Task | None = None
) -> tuple[Array, Array, Array, Array]:
    """The policy prior with injected noise ``eps`` ~ N(0, I) (``world_model.py:124-150``).

    Returns (mu, pi, log_pi, log_std): tanh mean, tanh sample, the reference's "log-prob" (the
    Gaussian residual scaled by A, then the tanh correction; math.py:27-45@b67b21c) (...,), and the log-std
    (..., A). Multi-task: mean, log-std and noise are masked to the task's action dimensions and A is
    the task's true action width (world_model.py:138-148@b67b21c).
    """
    out = _run(config, "pi", params["pi"], _with_task(z, task))
    return policy_head(config, out, eps, None if task is None else task.mask)


def policy_head(
    config: TDMPC2Config, out: Array, eps: Array, mask: Array | None = None
) -> tuple[Array, Array, Array, Array]:
    """:func:`policy` after its MLP: out (..., 2A) = [pre-tanh mean, raw log-std], eps (..., A), the
    optional action mask (..., A)."""
    mean, raw = jnp.split(out, 2, axis=-1)
    log_std = config.log_std_min + 0.5 * (config.log_std_max - config.log_std_min) * (jnp.tanh(raw) + 1.0)
    size: float | Array = config.action_dim
    if mask is not None:
        mean, log_std, eps = mean * mask, log_std * mask, eps * mask
        size = jnp.sum(mask, -1)
    residual = jnp.sum(-0.5 * jnp.square(eps) - log_std, -1)
    log_pi = residual * size - 0.5 * math.log(2 * math.pi) * size
    u = mean + eps * jnp.exp(log_std)
    mu, pi = jnp.tanh(mean), jnp.tanh(u)
    log_pi = log_pi - jnp.sum(jnp.log(jax.nn.relu(1.0 - jnp.square(pi)) + 1e-6), -1)
    return mu, pi, log_pi, log_std


# ------------------------------------------------------------------------------------------------
# One task of a multi-task model as a single-task model
# ------------------------------------------------------------------------------------------------


def same_layout(a: dict, b: dict) -> bool:
    """Whether two parameter trees have the same structure and leaf shapes."""
    shapes = functools.partial(jax.tree_util.tree_map, np.shape)
    return bool(shapes(a) == shapes(b))


def single_task_params(
    config: TDMPC2Config, params: dict, target_qs: dict, task: int, obs_dim: int
) -> tuple[dict, dict]:
    """The parameters of multi-task ``config`` specialised to task ``task``, as a single-task model
    with ``obs_dim`` observations and the task's ``action_dims[task]`` actions: the same functions on
    that task's inputs.

    Each first layer reads [input, embedding(, padded action)]: the task's (renormalised) embedding is
    a constant there, so its product with the kernel's embedding rows joins the bias; the rows of the
    padded observation and action columns, always zero for this task, are dropped. The policy keeps
    the mean and log-std outputs of the task's action dimensions. The target Qs likewise.
    """
    table = renormalise_task_embeddings(params, jnp.asarray([task]))["task_emb"]
    emb = table[task]
    lat, t, a = config.latent_dim, config.task_dim, config.action_dims[task]
    hi = jax.lax.Precision.HIGHEST

    def first(layer: dict, kept: list[tuple[int, int]], emb_at: int) -> dict:
        kernel = layer["kernel"]  # (in, out), or (K, in, out) for the Q members
        folded = jnp.einsum("t,...to->...o", emb, kernel[..., emb_at : emb_at + t, :], precision=hi)
        rows = jnp.concatenate([kernel[..., lo:hi_, :] for lo, hi_ in kept], axis=-2)
        return {**layer, "kernel": rows, "bias": layer["bias"] + folded}

    def with_first(net: dict, kept: list[tuple[int, int]], emb_at: int) -> dict:
        return {**net, "0": first(net["0"], kept, emb_at)}

    action_rows = [(0, lat), (lat + t, lat + t + a)]
    out = {key: value for key, value in params.items() if key != "task_emb"}
    out["encoder"] = with_first(params["encoder"], [(0, obs_dim)], config.obs_dim)
    for name in ("dynamics", "reward", "qs"):
        out[name] = with_first(params[name], action_rows, lat)
    pi = with_first(params["pi"], [(0, lat)], lat)
    last = str(len(pi) - 1)
    columns = np.r_[0:a, config.action_dim : config.action_dim + a]  # [mean, log-std] of the task's dims
    pi[last] = {"kernel": pi[last]["kernel"][:, columns], "bias": pi[last]["bias"][columns]}
    out["pi"] = pi
    return out, with_first(target_qs, action_rows, lat)

"""DreamerV3 hyperparameters: one frozen dataclass, with the model-size presets.

Every default is the paper-era value of danijar/dreamerv3 @2411f7d (+ fix 29eb964), cited as
``configs.yaml:LINE`` of that commit unless said otherwise. The defaults are those of the paper's
proprio setting, the ``dmc_proprio`` block (size12m, ``train_ratio`` 512, configs.yaml:233-238), not
of the ``defaults`` block (200m sizes, ``train_ratio`` 32; docs/deviations.md D23). Each field is
documented here once; the SB3 class (:class:`sb3_worldmodels.DreamerV3`) takes the same names as
keyword arguments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sb3_worldmodels.blocks.checks import (
    INT_AT_LEAST_1,
    NON_NEGATIVE,
    POSITIVE,
    PROBABILITY_BELOW_1,
    UNIT_HALF_OPEN,
    check_fields,
)
from sb3_worldmodels.blocks.jit import check_matmul_precision
from sb3_worldmodels.blocks.precision import compute_dtype, resolve_compute_dtype
from sb3_worldmodels.blocks.seeds import SeedSettings, with_settings

# preset -> (units U, deter D, hidden H, classes C); configs.yaml:149-177. The rules D = 8U, H = U,
# C = U/16 extend to "1m" (U = 64), which 2411f7d does not have (docs/deviations.md).
MODEL_SIZES: dict[str, tuple[int, int, int, int]] = {
    "1m": (64, 512, 64, 4),
    "12m": (256, 2048, 256, 16),
    "25m": (384, 3072, 384, 24),
    "50m": (512, 4096, 512, 32),
    "100m": (768, 6144, 768, 48),
    "200m": (1024, 8192, 1024, 64),
    "400m": (1536, 12288, 1536, 96),
}

ACCELERATOR_DTYPE = "bfloat16"
"""What ``compute_dtype="auto"`` resolves to on a GPU or TPU: the reference's compute dtype
(configs.yaml:24@2411f7d)."""

CNN_DEPTHS: dict[str, int] = {"1m": 4, "12m": 16, "25m": 24, "50m": 32, "100m": 48, "200m": 64, "400m": 96}
"""Base depth of the image encoder and decoder per preset (``.*\\.depth``, configs.yaml:149-177@2411f7d;
the rule depth = U/16 for "1m")."""


@dataclass(frozen=True)
class DreamerV3Config:
    """Static configuration of one DreamerV3 agent (hashable: it is a jit static argument).

    Space-derived fields (``obs_dim``, ``action_dim``, ``discrete``) are filled by the SB3 class.
    """

    # --- spaces (set from the env) ---
    obs_dim: int = 4
    """Width of the flat float32 observation vector (set from the env; the reference concatenates all
    vector keys, nets.py:249-256@2411f7d)."""
    action_dim: int = 1
    """Width of the flat action: the class count for a Discrete space, else the Box size (set from the
    env; the reference concatenates action keys in sorted order, jaxutils.py:715-719@2411f7d)."""
    discrete: bool = False
    """True for a Discrete action space (one-hot actions, categorical actor; ``actor_dist_disc: onehot``,
    configs.yaml:130@2411f7d)."""
    obs_keys: tuple[tuple[str, int], ...] = ()
    """(key, width) of each key of a Dict observation, in the flat vector's order: the decoder has one
    output layer per key, as the reference (nets.py:310-321@2411f7d). Empty: one key "vector"."""
    image_shape: tuple[int, ...] = ()
    """(H, W, C) of the image input, channel-last, every image key's channels side by side (the
    reference concatenates image keys along channels, nets.py:241,260@2411f7d); empty: no image
    (set from the env). Sides that are not multiples of 2 ** (len(cnn_mults) - 1) are padded
    (:attr:`image_padding`)."""
    image_keys: tuple[tuple[str, int], ...] = ()
    """(key, channels) of each image key, in the channels' order: each key is its own decoder output
    and loss term (nets.py:360-362@2411f7d). Empty with an image: one key "image"."""

    # --- network sizes (configs.yaml:113-146; presets :149-177) ---
    units: int = 256
    """U, width of every MLP layer (enc, dec, rew, con, actor, critic): ``units``,
    configs.yaml:117,121-123,128-129@2411f7d; 256 is the size12m preset, configs.yaml:152@2411f7d."""
    deter: int = 2048
    """D, width of the deterministic RSSM state h (``rssm.deter``, configs.yaml:113@2411f7d; 2048 is
    size12m, configs.yaml:150@2411f7d)."""
    hidden: int = 256
    """H, width of the RSSM's hidden layers (dynin*, img*, obs0) (``rssm.hidden``,
    configs.yaml:113@2411f7d; 256 is size12m, configs.yaml:150@2411f7d)."""
    classes: int = 16
    """C, classes per categorical latent (``rssm.classes``, configs.yaml:113@2411f7d; 16 is size12m,
    configs.yaml:150@2411f7d)."""
    stoch: int = 32
    """S, number of categorical latents (never overridden by a preset; ``rssm.stoch``,
    configs.yaml:113@2411f7d)."""
    blocks: int = 8
    """G, blocks of the block-diagonal GRU (``rssm.blocks``, configs.yaml:113@2411f7d;
    nets.py:119-173@2411f7d)."""
    enc_layers: int = 3
    """Hidden layers of the vector encoder MLP (``enc.simple.layers``, configs.yaml:117@2411f7d)."""
    dec_layers: int = 3
    """Hidden layers of the vector decoder MLP (``dec.simple.layers``, configs.yaml:121@2411f7d)."""
    rew_layers: int = 1
    """Hidden layers of the reward head (``rewhead.layers``, configs.yaml:122@2411f7d)."""
    con_layers: int = 1
    """Hidden layers of the continue head (``conhead.layers``, configs.yaml:123@2411f7d)."""
    actor_layers: int = 3
    """Hidden layers of the actor (``actor.layers``, configs.yaml:128@2411f7d)."""
    critic_layers: int = 3
    """Hidden layers of the critic and the slow critic (``critic.layers``, configs.yaml:129@2411f7d)."""
    img_layers: int = 2
    """Hidden layers of the prior ("img") net (imglayers: 2, configs.yaml:113@2411f7d)."""
    obs_layers: int = 1
    """Hidden layers of the posterior ("obs") net (obslayers: 1, configs.yaml:113@2411f7d)."""
    cnn_depth: int = 16
    """Base depth of the image encoder and decoder (``enc.simple.depth``/``dec.simple.depth``,
    configs.yaml:117,121@2411f7d; 16 is size12m, configs.yaml:151@2411f7d; :data:`CNN_DEPTHS`)."""
    cnn_mults: tuple[int, ...] = (1, 2, 3, 4, 4)
    """Depth multipliers of the encoder's convolutions; the decoder's transposed convolutions use all
    but the last, in reverse (``mults``, configs.yaml:117,121@2411f7d)."""
    cnn_kernel: int = 5
    """Kernel size of every (transposed) convolution (``kernel``, configs.yaml:117,121@2411f7d). The
    first encoder convolution and the decoder's output convolution have stride 1 (``debug_outer``), the
    others stride 2, so the encoder ends at :attr:`image_grid`."""
    bins: int = 255
    """Bins of the reward and critic two-hot heads (symexp spaced, nets.py:462-471@2411f7d; ``bins: 255``,
    configs.yaml:122,129@2411f7d)."""

    # --- world model loss ---
    free_nats: float = 1.0
    """Free nats of the dyn/rep KL, applied after summing over latents (configs.yaml:125@2411f7d)."""
    unimix: float = 0.01
    """Uniform mixture of the RSSM categoricals (``rssm.unimix``, configs.yaml:113@2411f7d)."""
    actor_unimix: float = 0.01
    """Uniform mixture of a discrete actor's categorical (``actor.unimix``, configs.yaml:128@2411f7d)."""
    dyn_scale: float = 1.0
    """Scale of the dynamics KL loss KL(sg(q) || p), which trains the prior (``loss_scales.dyn``,
    configs.yaml:96@2411f7d)."""
    rep_scale: float = 0.1
    """Scale of the representation KL loss KL(q || sg(p)), which trains the posterior
    (``loss_scales.rep``, configs.yaml:96@2411f7d)."""
    rec_scale: float = 1.0
    """Scale of the observation (decoder) loss (``loss_scales.dec_mlp``, configs.yaml:96@2411f7d)."""
    rec_image_scale: float = 1.0
    """Scale of each image key's decoder loss (``loss_scales.dec_cnn``, configs.yaml:96@2411f7d)."""
    rew_scale: float = 1.0
    """Scale of the reward-head loss (``loss_scales.reward``, configs.yaml:96@2411f7d)."""
    con_scale: float = 1.0
    """Scale of the continue-head loss (``loss_scales.cont``, configs.yaml:96@2411f7d)."""
    actor_scale: float = 1.0
    """Scale of the actor loss (``loss_scales.actor``, configs.yaml:96@2411f7d)."""
    critic_scale: float = 1.0
    """Scale of the imagined critic loss (``loss_scales.critic``, configs.yaml:96@2411f7d)."""
    repval_scale: float = 0.3
    """Scale of the replay critic loss (``loss_scales.replay_critic``, configs.yaml:96@2411f7d)."""

    # --- schedule ---
    train_ratio: float = 512.0
    """Replayed (trained) rows per collected row: an update every B*T/train_ratio rows. 512 is the
    ``dmc_proprio`` block (configs.yaml:236@2411f7d); the ``defaults`` block has 32.0 (configs.yaml:52)."""
    train_fill: int = 0
    """Rows collected before training may start: updates run from the row counter ``train_fill`` on
    (``step >= train_fill``, embodied/run/train.py:81@2411f7d; ``run.train_fill: 0``,
    configs.yaml:53@2411f7d). Unlike SB3's ``learning_starts`` it does not change how the agent acts."""
    batch_size: int = 16
    """B, sequences per batch (``batch_size``, configs.yaml:91@2411f7d)."""
    batch_length: int = 64
    """T, trained rows per sequence; each sampled window has T + 1 rows (``batch_length: 65`` with
    ``replay_context: 1``, configs.yaml:92-94@2411f7d)."""

    # --- actor-critic ---
    imag_horizon: int = 15
    """Imagined steps per start state (imag_length: 15, configs.yaml:134@2411f7d)."""
    return_horizon: float = 333.0
    """1 / (1 - gamma); the continue target is (1 - terminal) * (1 - 1/horizon) (contdisc) (``horizon: 333``,
    ``contdisc: True``, configs.yaml:136,124@2411f7d)."""
    lam: float = 0.95
    """Lambda of the imagined returns (return_lambda, configs.yaml:137@2411f7d)."""
    repval_lam: float = 0.95
    """Lambda of the replay returns (return_lambda_replay, configs.yaml:138@2411f7d)."""
    actent: float = 3e-4
    """Actor entropy scale (``actent``, configs.yaml:144@2411f7d)."""
    slowreg: float = 1.0
    """Weight of the critic's regression toward the slow critic (``slowreg``, configs.yaml:145@2411f7d)."""
    slow_rate: float = 0.02
    """EMA fraction of the slow critic, every update (first update copies) (``slow_critic_update: 1``,
    ``slow_critic_fraction: 0.02``, configs.yaml:139-140@2411f7d)."""
    retnorm_rate: float = 0.01
    """EMA rate of the 5th/95th return percentiles (``retnorm.rate``, configs.yaml:141@2411f7d)."""
    retnorm_limit: float = 1.0
    """Lower limit of the return scale max(limit, P95 - P5) (``retnorm.limit``, configs.yaml:141@2411f7d)."""
    minstd: float = 0.1
    """Lower std bound of the continuous actor (``actor.minstd``, configs.yaml:128@2411f7d)."""
    maxstd: float = 1.0
    """Upper std bound of the continuous actor: std = (max - min) * sigmoid(x + 2) + min
    (nets.py:486-493@2411f7d; ``actor.maxstd``, configs.yaml:128@2411f7d)."""

    # --- optimiser: LaProp + AGC (configs.yaml:97; jaxutils.py:398-550) ---
    learning_rate: float = 4e-5
    """Base learning rate. The SB3 class leaves this field at its default (so every rate shares one
    compilation) and writes its ``learning_rate`` (float or schedule) into the optimiser state
    (``opt.lr``, configs.yaml:97@2411f7d)."""
    agc: float = 0.3
    """Adaptive gradient clipping per parameter tensor: a gradient is scaled down to at most
    agc * max(agc_pmin, |w|) in norm (``opt.agc``, configs.yaml:97@2411f7d; jaxutils.py:659-673@2411f7d)."""
    agc_pmin: float = 1e-3
    """Floor on the parameter norm in the AGC limit, so zero-initialised tensors can still move
    (``opt.pmin``, configs.yaml:97@2411f7d)."""
    beta1: float = 0.9
    """Momentum decay of LaProp, applied to the RMS-normalised gradient (``opt.beta1``,
    configs.yaml:97@2411f7d; jaxutils.py:694-712@2411f7d)."""
    beta2: float = 0.999
    """Decay of LaProp's running mean of squared gradients (``opt.beta2``, configs.yaml:97@2411f7d;
    jaxutils.py:676-691@2411f7d)."""
    eps: float = 1e-20
    """Epsilon added to the RMS denominator of LaProp (``opt.eps``, configs.yaml:97@2411f7d)."""
    warmup: int = 1000
    """Linear warmup: update k (1-based) is scaled by clip((k - 1) / warmup, 0, 1) (``opt.warmup``,
    configs.yaml:97@2411f7d; jaxutils.py:510-524@2411f7d)."""
    weight_decay: float = 0.0
    """Decoupled weight decay; only 0 is accepted (docs/deviations.md D19) (``opt.wd``,
    configs.yaml:97@2411f7d)."""

    # --- numerics ---
    matmul_precision: str = "float32"
    """Precision of every matmul in the jitted functions (:data:`~sb3_worldmodels.blocks.jit.
    MATMUL_PRECISIONS`): float32 by default; "tensorfloat32" or "bfloat16" are faster on recent GPUs,
    "default" is JAX's default (TF32 on recent NVIDIA GPUs). Our own setting: the reference computes
    in bfloat16 with float32 parameters (configs.yaml:24-25@2411f7d; docs/deviations.md D1)."""

    compute_dtype: str = "auto"
    """The dtype the networks compute in (:data:`~sb3_worldmodels.blocks.precision.COMPUTE_DTYPES`):
    "bfloat16" as the reference (``jax.compute_dtype: bfloat16``, configs.yaml:24@2411f7d): every
    matmul, convolution, norm and activation, the GRU's gates, the deter state, the stoch samples and
    the RSSM's unimix in bfloat16; parameters, optimiser state, gradients, the heads' distribution
    parameters, losses, returns and normalisers in float32. "float32": float32 everywhere (the
    reference with ``jax.compute_dtype: float32``, as its fixtures were recorded). "auto" (the default)
    is bfloat16 on a GPU or TPU and float32 on the CPU, which has no fast bfloat16 path
    (docs/deviations.md D1); :func:`preset` resolves it for the backend it runs on."""

    @property
    def dtype(self) -> Any:
        """The jnp dtype of :attr:`compute_dtype` ("auto" resolved for the backend)."""
        return compute_dtype(self.compute_dtype, ACCELERATOR_DTYPE)

    @property
    def decoder_outputs(self) -> tuple[tuple[str, int], ...]:
        """(key, width) of each decoder output layer ``out_<key>``."""
        if not self.obs_dim:
            return ()
        return self.obs_keys or (("vector", self.obs_dim),)

    @property
    def image_outputs(self) -> tuple[tuple[str, int], ...]:
        """(key, channels) of each image decoder output; empty without an image."""
        if not self.image_shape:
            return ()
        return self.image_keys or (("image", self.image_shape[-1]),)

    @property
    def cnn_depths(self) -> tuple[int, ...]:
        """Depth of each encoder convolution."""
        return tuple(self.cnn_depth * m for m in self.cnn_mults)

    @property
    def image_grid(self) -> tuple[int, int]:
        """(h, w) at the encoder's end and the decoder's start: the image side over 2 ** (len(cnn_mults)
        - 1), rounded up ((0, 0) without an image). The reference's ``minres`` (4 for 64 x 64, 6 for 96 x
        96), which it asserts (nets.py:265@2411f7d); a side that is not a multiple is padded
        (:attr:`image_padding`)."""
        if not self.image_shape:
            return (0, 0)
        down = 2 ** (len(self.cnn_mults) - 1)
        return (-(-self.image_shape[0] // down), -(-self.image_shape[1] // down))

    @property
    def image_padding(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """((top, bottom), (left, right)) zero rows and columns that make the scaled image's sides
        multiples of 2 ** (len(cnn_mults) - 1) for the encoder (centred; the decoder's output is cropped
        back), e.g. 84 → 96 with (6, 6); none for 64 x 64 or 96 x 96 images."""
        if not self.image_shape:
            return ((0, 0), (0, 0))
        down = 2 ** (len(self.cnn_mults) - 1)
        pads = []
        for side, cells in zip(self.image_shape[:2], self.image_grid, strict=True):
            extra = cells * down - side
            pads.append((extra // 2, extra - extra // 2))
        return (pads[0], pads[1])

    @property
    def embed_dim(self) -> int:
        """Width of the encoder's output: the vector embedding (U) then the flat image features."""
        height, width = self.image_grid
        return (self.units if self.obs_dim else 0) + height * width * self.cnn_depths[-1]

    @property
    def feat_dim(self) -> int:
        """Width of the model features [deter, flat stoch]."""
        return self.deter + self.stoch * self.classes

    @property
    def gamma(self) -> float:
        return 1.0 - 1.0 / self.return_horizon

    @property
    def updates_per_row(self) -> float:
        """Rate of the reference's when.Ratio: train_ratio / (B * T) updates per row."""
        return self.train_ratio / (self.batch_size * self.batch_length)

    def replace(self, **changes) -> DreamerV3Config:
        return dataclasses.replace(self, **changes)


SMOKE_SETTINGS: dict = dict(
    model_size="1m", units=16, deter=32, hidden=16, classes=4, stoch=4, blocks=4, batch_size=2,
    batch_length=8, train_ratio=16, imag_horizon=3,
)  # fmt: skip
"""Constructor arguments of the smallest DreamerV3 that runs every code path: for smoke runs of the
examples, benchmarks and tests (seconds to compile and run; it learns nothing useful)."""


_RULES = {
    **dict.fromkeys(
        ("action_dim", "units", "deter", "hidden", "classes", "stoch", "blocks", "enc_layers"),
        INT_AT_LEAST_1,
    ),
    **dict.fromkeys(
        ("dec_layers", "rew_layers", "con_layers", "actor_layers", "critic_layers", "img_layers"),
        INT_AT_LEAST_1,
    ),
    **dict.fromkeys(
        ("obs_layers", "cnn_depth", "cnn_kernel", "bins", "batch_size", "batch_length", "imag_horizon"),
        INT_AT_LEAST_1,
    ),
    **dict.fromkeys(("train_ratio", "return_horizon", "minstd", "maxstd", "learning_rate", "agc"), POSITIVE),
    **dict.fromkeys(("agc_pmin", "eps", "retnorm_limit"), POSITIVE),
    **dict.fromkeys(("free_nats", "dyn_scale", "rep_scale", "rec_scale", "rec_image_scale"), NON_NEGATIVE),
    **dict.fromkeys(("rew_scale", "con_scale", "actor_scale", "critic_scale", "repval_scale"), NON_NEGATIVE),
    **dict.fromkeys(("actent", "slowreg", "warmup", "train_fill"), NON_NEGATIVE),
    **dict.fromkeys(("unimix", "actor_unimix", "beta1", "beta2"), PROBABILITY_BELOW_1),
    **dict.fromkeys(("lam", "repval_lam", "slow_rate", "retnorm_rate"), UNIT_HALF_OPEN),
}
"""The valid range of each numeric field (checked by :func:`preset`)."""


def preset(model_size: str, **overrides) -> DreamerV3Config:
    """The config of a named model size, with explicit field overrides (None means keep)."""
    if model_size not in MODEL_SIZES:
        raise ValueError(f"Unknown DreamerV3 model_size {model_size!r}; choose one of {sorted(MODEL_SIZES)}.")
    units, deter, hidden, classes = MODEL_SIZES[model_size]
    base = DreamerV3Config(
        units=units, deter=deter, hidden=hidden, classes=classes, cnn_depth=CNN_DEPTHS[model_size]
    )
    overrides = {k: v for k, v in overrides.items() if v is not None}
    for name in ("cnn_mults", "image_shape"):  # lists after a JSON round trip; the config is hashed
        if name in overrides:
            overrides[name] = tuple(int(v) for v in overrides[name])
    for name in ("obs_keys", "image_keys"):
        if name in overrides:
            overrides[name] = tuple((str(k), int(w)) for k, w in overrides[name])
    return check_config(base.replace(**overrides))


def check_config(cfg: DreamerV3Config) -> DreamerV3Config:
    """``cfg`` with its ``compute_dtype`` resolved for the backend if every field is valid
    (:data:`_RULES` and the rules between fields), else a ValueError naming the field."""
    check_fields(cfg, _RULES, "DreamerV3")
    if cfg.bins < 2 or cfg.return_horizon <= 1 or cfg.maxstd < cfg.minstd:
        raise ValueError(
            f"DreamerV3: bins={cfg.bins} must be >= 2, return_horizon={cfg.return_horizon} above 1 and "
            f"maxstd={cfg.maxstd} at least minstd={cfg.minstd}."
        )
    if cfg.deter % cfg.blocks:
        raise ValueError(f"deter={cfg.deter} must be divisible by blocks={cfg.blocks}.")
    check_matmul_precision(cfg.matmul_precision)
    _check_observation_fields(cfg)
    if cfg.obs_keys and sum(w for _, w in cfg.obs_keys) != cfg.obs_dim:
        raise ValueError(f"obs_keys {cfg.obs_keys} do not add up to obs_dim={cfg.obs_dim}.")
    return cfg.replace(compute_dtype=resolve_compute_dtype(cfg.compute_dtype, ACCELERATOR_DTYPE))


def _check_observation_fields(cfg: DreamerV3Config) -> None:
    if isinstance(cfg.obs_dim, bool) or not isinstance(cfg.obs_dim, int) or cfg.obs_dim < 0:
        raise ValueError(f"DreamerV3: obs_dim={cfg.obs_dim!r} is invalid; it must be an integer >= 0.")
    if not cfg.image_shape:
        if cfg.obs_dim == 0:
            raise ValueError("DreamerV3: the observation has neither a vector (obs_dim=0) nor an image.")
        return
    if len(cfg.image_shape) != 3 or min(cfg.image_shape) < 1 or not cfg.cnn_mults:
        raise ValueError(f"DreamerV3: image_shape={cfg.image_shape} must be (H, W, C), each at least 1.")
    if cfg.cnn_depths[-1] % 8:
        raise ValueError(
            f"DreamerV3: the decoder spreads its first image features over 8 blocks, so the last CNN depth "
            f"{cfg.cnn_depths[-1]} (cnn_depth x cnn_mults[-1]) must be divisible by 8."
        )
    if cfg.image_keys and sum(c for _, c in cfg.image_keys) != cfg.image_shape[2]:
        raise ValueError(f"image_keys {cfg.image_keys} do not add up to {cfg.image_shape[2]} channels.")


PER_SEED_REFUSED: dict[str, str] = {
    "unimix": (
        "it is an attribute of the RSSM module, built once per config (networks.make_networks), so "
        "all seeds share it"
    ),
    "learning_rate": (
        "the rate lives in each seed's optimiser state: set it there with agent.set_learning_rate (a "
        "stacked state carries one rate per seed)"
    ),
    "weight_decay": "only 0 is supported (agent.make_optimizer refuses other values)",
    "train_ratio": (
        "the training schedule reads it on the host to count updates; the compiled functions never see it"
    ),
}
"""The float fields that cannot take one value per seed (:func:`seed_settings`), with the reason;
every other float field can (tests/test_seeds_core.py traces each and checks that it reaches the
update or the acting step)."""


def seed_settings(config: DreamerV3Config, settings: dict[str, list[float]]) -> SeedSettings:
    """``config`` with float fields given one value per seed ({field: S values}) for the agent
    functions' ``over_seeds`` (:func:`~sb3_worldmodels.blocks.seeds.with_settings`); each seed's
    config is checked (:func:`check_config`); :data:`PER_SEED_REFUSED` and non-float fields are
    refused."""
    return with_settings(config, settings, refused=PER_SEED_REFUSED, validate=check_config)

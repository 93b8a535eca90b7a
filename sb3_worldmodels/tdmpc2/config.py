"""TD-MPC2 hyperparameters: one frozen dataclass, with the model-size presets.

Every default is the value of nicklashansen/tdmpc2 @b67b21c, cited as ``config.yaml:LINE`` (or
another file of that commit) unless said otherwise. Each field is documented here once; the SB3
class (:class:`sb3_worldmodels.TDMPC2`) takes the same names as keyword arguments.
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
    UNIT_OPEN,
    check_fields,
)
from sb3_worldmodels.blocks.episodes import discount_from_episode_length
from sb3_worldmodels.blocks.jit import check_matmul_precision
from sb3_worldmodels.blocks.precision import compute_dtype, resolve_compute_dtype
from sb3_worldmodels.blocks.seeds import SeedSettings, with_settings

# size -> (enc_dim, mlp_dim, latent_dim, num_enc_layers, num_q); common/__init__.py:1-23.
MODEL_SIZES: dict[int, tuple[int, int, int, int, int]] = {
    1: (256, 384, 128, 2, 2),
    5: (256, 512, 512, 2, 5),
    19: (1024, 1024, 768, 3, 5),
    48: (1792, 1792, 768, 4, 5),
    317: (4096, 4096, 1376, 5, 8),
}

ACCELERATOR_DTYPE = "float32"
"""What ``compute_dtype="auto"`` resolves to on a GPU or TPU: float32, as the reference computes
(no autocast at b67b21c); bfloat16 is an option (docs/deviations.md T21)."""

Q_DROPOUT_MODES = ("always", "train", "off")
DROPOUT_MASKS = ("hash", "threefry")


@dataclass(frozen=True)
class TDMPC2Config:
    """Static configuration of one single-task TD-MPC2 agent (hashable: a jit static argument).

    Space-derived fields (``obs_dim``, ``action_dim``, ``image_shape``) and ``discount`` are filled by
    the SB3 class.
    """

    # --- spaces (set from the env) ---
    obs_dim: int = 3
    """Width of the flat float32 observation vector (set from the env, as the reference's ``obs_shape``,
    envs/__init__.py:55-60@b67b21c); 0 for an image observation."""
    image_shape: tuple[int, ...] = ()
    """(64, 64, C) of an image observation, channel-last uint8 (C = 3 x stacked frames, 9 for the
    reference's three RGB frames, envs/dmcontrol.py:66-89@eece801), set from the env; empty for a
    vector observation. With an image the encoder is the reference's ``conv`` encoder
    (layers.py:136-150@eece801, ``obs: rgb``, config.yaml:6@eece801), whose output is the latent: see
    ``num_channels``. The reference encodes one observation type, 'state' or 'rgb'
    (layers.py:153-164@eece801): an image cannot come with a vector, and multi-task agents take
    vectors only (their task embedding joins the encoder's input, world_model.py:104-111@eece801)."""
    action_dim: int = 1
    """Width of the action vector, in [-1, 1] (set from the env, as the reference's ``action_dim``,
    envs/__init__.py:55-60@b67b21c)."""

    # --- architecture (config.yaml:52-60; presets common/__init__.py:1-23) ---
    enc_dim: int = 256
    """Width of the encoder's hidden layers (``enc_dim``, config.yaml:54@b67b21c; per size
    common/__init__.py:1-24@b67b21c)."""
    mlp_dim: int = 512
    """Width of the hidden layers of dynamics, reward, policy and Q networks (``mlp_dim``,
    config.yaml:55@b67b21c)."""
    latent_dim: int = 512
    """L, width of the latent state z (SimNorm groups of ``simnorm_dim``) (``latent_dim``,
    config.yaml:56@b67b21c)."""
    num_enc_layers: int = 2
    """Affine layers of the encoder (max(n - 1, 1) hidden layers plus the latent layer)
    (``num_enc_layers``, config.yaml:53@b67b21c; layers.py:75-82@b67b21c)."""
    num_q: int = 5
    """K, members of the Q ensemble (``num_q``, config.yaml:58@b67b21c)."""
    simnorm_dim: int = 8
    """Group size of SimNorm (config.yaml:60@b67b21c)."""
    num_channels: int | None = None
    """Output channels of each of the pixel encoder's four convolutions (``num_channels``,
    config.yaml:58@eece801, 32 at every model size there). The flattened map of a 64 x 64 image is
    num_channels x 4 x 4 wide and is the latent itself (not projected, layers.py:136-150@eece801), so
    it must equal ``latent_dim``. None (the default): latent_dim / 16, set by :func:`preset` for an
    image: the reference's 32 at model size 5, 8 at size 1 (latent 128), 48 at sizes 19 and 48, 86 at
    size 317 (where the reference, with 32, fails; docs/deviations.md T20). Used only with an image."""
    dropout: float = 0.01
    """Dropout rate after the first affine layer of each Q member (config.yaml:59@b67b21c)."""
    q_dropout: str = "always"
    """Where Q dropout is active: "always" is b67b21c (every Q evaluation, target and planning
    included: layers.py:7-27@b67b21c), "train" the later upstream code (value and policy losses only),
    "off". Our own flag; the reference has no such option."""
    dropout_masks: str = "hash"
    """How the dropout masks are drawn: "hash" (cheap hashed coin flips, docs/deviations.md T13) or
    "threefry" (``jax.random.bernoulli``, one Threefry draw per element, about 30x the cost)."""
    num_bins: int = 101
    """Number of two-hot bins of the reward and Q heads, linear in symlog space (config.yaml:47@b67b21c;
    math.py:48-95@b67b21c)."""
    vmin: float = -10.0
    """Lowest bin centre, in symlog space (config.yaml:48@b67b21c)."""
    vmax: float = 10.0
    """Highest bin centre, in symlog space; the bins of the reward and Q heads are linear in symlog
    space (config.yaml:47-49@b67b21c)."""
    log_std_min: float = -10.0
    """Lower end of the policy's log-std, mapped from tanh of the raw output (config.yaml:42@b67b21c;
    math.py:12-14@b67b21c)."""
    log_std_max: float = 2.0
    """Upper end of the policy's log-std; the range is [log_std_min, log_std_max]
    (config.yaml:43@b67b21c)."""

    # --- losses (config.yaml:14-25) ---
    batch_size: int = 256
    """B, windows of H + 1 steps per update (config.yaml:14@b67b21c)."""
    reward_coef: float = 0.1
    """Weight of the reward loss in the world-model loss (config.yaml:15@b67b21c;
    tdmpc2.py:259-263@b67b21c)."""
    value_coef: float = 0.1
    """Weight of the Q (value) loss in the world-model loss (config.yaml:16@b67b21c)."""
    consistency_coef: float = 20.0
    """Weight of the latent consistency loss in the world-model loss (config.yaml:17@b67b21c)."""
    rho: float = 0.5
    """Temporal weight rho^t of the losses over the horizon (config.yaml:18@b67b21c)."""
    entropy_coef: float = 1e-4
    """Weight of the policy's entropy term (its D-scaled log-prob) in the policy loss
    (config.yaml:44@b67b21c; math.py:27-32@b67b21c)."""
    discount: float = 0.99
    """gamma; the SB3 class sets it from the episode length with :func:`discount_from_episode_length`
    (the reference's heuristic, tdmpc2.py:31-48@b67b21c with config.yaml:23-25@b67b21c; 0.99 is its
    value for 500-step DMC episodes)."""
    episodic: bool = False
    """Termination head, masked TD targets and planner masks of the later upstream code
    (world_model.py:28@7ec6bc8, tdmpc2.py:127-137,258,283-305@7ec6bc8; ``episodic: false``,
    config.yaml:7@7ec6bc8)."""
    termination_coef: float = 1.0
    """Weight of the termination loss when ``episodic`` (config.yaml:19@7ec6bc8)."""

    # --- optimisers (tdmpc2.py:20-27) ---
    learning_rate: float = 3e-4
    """Learning rate of both Adams. The SB3 class leaves this field at its default (one compilation
    for every rate) and writes its ``learning_rate`` (float or schedule) into the optimiser states
    (``lr``, config.yaml:19@b67b21c)."""
    beta1: float = 0.9
    """Adam's first-moment decay, both optimisers (PyTorch's default: the reference gives no betas,
    tdmpc2.py:20-27@b67b21c)."""
    beta2: float = 0.999
    """Adam's second-moment decay, both optimisers (PyTorch's default, tdmpc2.py:20-27@b67b21c)."""
    eps: float = 1e-8
    """Adam's epsilon of the world-model optimiser (PyTorch's default, tdmpc2.py:20-26@b67b21c)."""
    pi_eps: float = 1e-5
    """Adam's epsilon of the policy optimiser (``eps=1e-5``, tdmpc2.py:27@b67b21c)."""
    enc_lr_scale: float = 0.3
    """The encoder's learning rate is learning_rate * enc_lr_scale (config.yaml:20@b67b21c;
    tdmpc2.py:21@b67b21c)."""
    grad_clip_norm: float = 20.0
    """Maximum global gradient norm, clipped separately for the world model and the policy
    (config.yaml:21@b67b21c; tdmpc2.py:266-268@b67b21c)."""
    tau: float = 0.01
    """EMA rate of the target Qs and of RunningScale (config.yaml:22@b67b21c)."""
    stale_pi_grad_in_clip: bool = True
    """b67b21c clips the world-model gradient by sqrt(|g_wm|^2 + |g_pi,prev|^2): the previous policy
    gradient is still stored on the policy parameters (tdmpc2.py:180,232,267@b67b21c). Upstream dropped it
    later (603b67c)."""

    # --- planning (config.yaml:31-39) ---
    horizon: int = 3
    """H, steps of the planning rollouts and of the training windows (config.yaml:36@b67b21c)."""
    iterations: int = 6
    """MPPI iterations actually run (the SB3 class passes :func:`planner_iterations` of its own)
    (config.yaml:32@b67b21c; +2 for 20 or more action dims, tdmpc2.py:30@b67b21c)."""
    num_samples: int = 512
    """Candidate action sequences per MPPI iteration (config.yaml:33@b67b21c)."""
    num_elites: int = 64
    """Top candidates that set the next mean and std (config.yaml:34@b67b21c)."""
    num_pi_trajs: int = 24
    """Candidates drawn from the policy prior, fixed across iterations (config.yaml:35@b67b21c)."""
    min_std: float = 0.05
    """Lower clamp of the MPPI std (config.yaml:37@b67b21c)."""
    max_std: float = 2.0
    """Upper clamp of the MPPI std and its initial value each step (config.yaml:38@b67b21c)."""
    temperature: float = 0.5
    """Multiplies the value gap in the elite weights exp(temperature * (v - max v)) (tdmpc2.py:151@b67b21c;
    config.yaml:39@b67b21c)."""

    # --- multi-task (world_model.py:19-23@b67b21c, tdmpc2.py:31-33@b67b21c) ---
    task_dim: int = 0
    """Width of the learned task embedding appended to the inputs of the encoder, dynamics, reward,
    policy and Q networks; 0 = a single-task agent (``task_dim`` 96, common/parser.py:55@b67b21c; 64
    for mt30 at sizes 5, 19 and 48)."""
    action_dims: tuple[int, ...] = ()
    """Multi-task: each task's true action width, in task-id order. Actions are padded to
    ``action_dim``, the largest; the policy, the planner and the losses mask the rest
    (``_action_masks``, world_model.py:21-23@b67b21c)."""
    episode_lengths: tuple[int, ...] = ()
    """Multi-task: each task's episode length in agent steps, which sets its discount
    (:attr:`task_discounts`; tdmpc2.py:31-33@b67b21c)."""

    # --- numerics ---
    matmul_precision: str = "float32"
    """Precision of every matmul in the jitted functions (:data:`~sb3_worldmodels.blocks.jit.
    MATMUL_PRECISIONS`): float32 as the reference ran (float32 GEMMs); "tensorfloat32" or "bfloat16"
    are faster on recent GPUs, "default" is JAX's default (TF32 on recent NVIDIA GPUs). Our own setting:
    the reference has no such option (PyTorch keeps TF32 off for float32 matmuls)."""
    compute_dtype: str = "auto"
    """The dtype the networks compute in (:data:`~sb3_worldmodels.blocks.precision.COMPUTE_DTYPES`).
    "float32": as the reference, which computes in float32 everywhere (no autocast at b67b21c).
    "bfloat16", our option (docs/deviations.md T21): every matmul, convolution and activation and the
    latents in bfloat16, the LayerNorm statistics in float32 (DreamerV3's layer norm,
    nets.py:742-752@2411f7d); parameters, optimiser states, gradients, the reward, value, policy and
    termination heads' outputs, the TD targets, losses, RunningScale and the planner's scores, elite
    means and stds in float32. "auto" (the default) is float32 on every backend."""

    @property
    def dtype(self) -> Any:
        """The jnp dtype of :attr:`compute_dtype` ("auto" resolved)."""
        return compute_dtype(self.compute_dtype, ACCELERATOR_DTYPE)

    @property
    def gamma(self) -> float:
        """The discount under SB3's name."""
        return self.discount

    @property
    def multitask(self) -> bool:
        return self.task_dim > 0

    @property
    def num_tasks(self) -> int:
        return len(self.action_dims)

    @property
    def task_discounts(self) -> tuple[float, ...]:
        """Each task's discount from its episode length (:func:`discount_from_episode_length`); the
        reference keeps them as a float32 tensor (tdmpc2.py:31-33@b67b21c)."""
        return tuple(discount_from_episode_length(length) for length in self.episode_lengths)

    @property
    def pixels(self) -> bool:
        """Whether the observation is an image (the pixel encoder)."""
        return bool(self.image_shape)

    @property
    def bin_size(self) -> float:
        return (self.vmax - self.vmin) / (self.num_bins - 1)

    def replace(self, **changes) -> TDMPC2Config:
        return dataclasses.replace(self, **changes)


def planner_iterations(iterations: int, action_dim: int) -> int:
    """The MPPI iterations the reference runs: the configured count, plus 2 when the action has 20
    or more dimensions (``cfg.iterations += 2*(cfg.action_dim >= 20)``, tdmpc2.py:30@b67b21c)."""
    return int(iterations) + (2 if action_dim >= 20 else 0)


SMOKE_SETTINGS: dict = dict(
    model_size=1, enc_dim=16, mlp_dim=32, latent_dim=16, num_q=2, batch_size=16, num_samples=32,
    num_elites=4, num_pi_trajs=4, iterations=2,
)  # fmt: skip
"""Constructor arguments of the smallest TD-MPC2 that runs every code path: for smoke runs of the
examples, benchmarks and tests (seconds to compile and run; it learns nothing useful)."""


IMAGE_SIDE = 64
"""Height and width of the images the pixel encoder takes (``assert in_shape[-1] == 64``,
layers.py:141@eece801; ShiftAug asserts square images, layers.py:49@eece801)."""
PIXEL_FEATURE_CELLS = 16
"""h x w = 4 x 4 of the pixel encoder's last feature map for 64 x 64 images (convolutions 7/2, 5/2, 3/2,
3/1, VALID: 64 -> 29 -> 13 -> 6 -> 4): its flattened output is ``num_channels`` x 16 wide
(:func:`~sb3_worldmodels.tdmpc2.networks.pixel_latent_dim`)."""

_RULES = {
    **dict.fromkeys(("action_dim", "enc_dim", "mlp_dim", "latent_dim", "num_enc_layers"), INT_AT_LEAST_1),
    **dict.fromkeys(
        ("num_q", "simnorm_dim", "num_bins", "batch_size", "horizon", "iterations"), INT_AT_LEAST_1
    ),
    **dict.fromkeys(("num_samples", "num_elites"), INT_AT_LEAST_1),
    **dict.fromkeys(("reward_coef", "value_coef", "consistency_coef", "entropy_coef"), NON_NEGATIVE),
    **dict.fromkeys(("termination_coef", "num_pi_trajs", "enc_lr_scale"), NON_NEGATIVE),
    **dict.fromkeys(("learning_rate", "grad_clip_norm", "min_std", "max_std", "temperature"), POSITIVE),
    **dict.fromkeys(("eps", "pi_eps"), POSITIVE),
    **dict.fromkeys(("beta1", "beta2"), PROBABILITY_BELOW_1),
    **dict.fromkeys(("rho", "tau"), UNIT_HALF_OPEN),
    "discount": UNIT_OPEN,
    "dropout": PROBABILITY_BELOW_1,
}
"""The valid range of each numeric field (checked by :func:`preset`)."""


def preset(model_size: int, **overrides) -> TDMPC2Config:
    """The config of a model size (1, 5, 19, 48 or 317), with explicit field overrides (None = keep)."""
    if model_size not in MODEL_SIZES:
        raise ValueError(f"Unknown TD-MPC2 model_size {model_size!r}; choose one of {sorted(MODEL_SIZES)}.")
    enc_dim, mlp_dim, latent_dim, num_enc_layers, num_q = MODEL_SIZES[model_size]
    base = TDMPC2Config(
        enc_dim=enc_dim, mlp_dim=mlp_dim, latent_dim=latent_dim, num_enc_layers=num_enc_layers, num_q=num_q
    )
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if "image_shape" in overrides:  # a list after a JSON round trip; the config is hashed
        overrides["image_shape"] = tuple(int(v) for v in overrides["image_shape"])
    cfg = base.replace(**overrides)
    if cfg.image_shape and cfg.num_channels is None:
        if cfg.latent_dim % PIXEL_FEATURE_CELLS:
            raise ValueError(
                f"TD-MPC2: latent_dim={cfg.latent_dim} is not a multiple of 16, and the pixel encoder's "
                "output, num_channels x 4 x 4, is the latent itself (not projected, layers.py:136-150"
                "@eece801): give a latent_dim that is a multiple of 16 (every model size has one)."
            )
        cfg = cfg.replace(num_channels=cfg.latent_dim // PIXEL_FEATURE_CELLS)
    return check_config(cfg)


def check_config(cfg: TDMPC2Config) -> TDMPC2Config:
    """``cfg`` with its ``compute_dtype`` resolved if every field is valid (:data:`_RULES`, the rules
    between fields, the observation and the tasks), else a ValueError naming the field."""
    check_fields(cfg, _RULES, "TD-MPC2")
    if (
        cfg.num_bins < 2
        or cfg.vmin >= cfg.vmax
        or cfg.log_std_min >= cfg.log_std_max
        or cfg.max_std < cfg.min_std
    ):
        raise ValueError(
            "TD-MPC2: num_bins must be >= 2, vmin below vmax, log_std_min below log_std_max and max_std at "
            f"least min_std (got {cfg.num_bins}, {cfg.vmin}/{cfg.vmax}, {cfg.log_std_min}/{cfg.log_std_max}, "
            f"{cfg.min_std}/{cfg.max_std})."
        )
    if cfg.latent_dim % cfg.simnorm_dim:
        raise ValueError(f"latent_dim={cfg.latent_dim} must be divisible by simnorm_dim={cfg.simnorm_dim}.")
    check_matmul_precision(cfg.matmul_precision)
    if cfg.q_dropout not in Q_DROPOUT_MODES:
        raise ValueError(f"q_dropout must be one of {Q_DROPOUT_MODES}, got {cfg.q_dropout!r}.")
    if cfg.dropout_masks not in DROPOUT_MASKS:
        raise ValueError(f"dropout_masks must be one of {DROPOUT_MASKS}, got {cfg.dropout_masks!r}.")
    if cfg.num_q < 2:
        raise ValueError(f"num_q must be at least 2 (targets use a pair of Q members), got {cfg.num_q}.")
    if not cfg.num_pi_trajs < cfg.num_samples or not cfg.num_elites <= cfg.num_samples:
        raise ValueError("num_pi_trajs must be below num_samples and num_elites at most num_samples.")
    _check_tasks(cfg)
    _check_observation(cfg)
    return cfg.replace(compute_dtype=resolve_compute_dtype(cfg.compute_dtype, ACCELERATOR_DTYPE))


def _check_observation(cfg: TDMPC2Config) -> None:
    """A vector (obs_dim >= 1) or a 64 x 64 image whose encoding is ``latent_dim`` wide, not both."""
    obs_dim = cfg.obs_dim
    if isinstance(obs_dim, bool) or not isinstance(obs_dim, int) or obs_dim < 0:
        raise ValueError(f"TD-MPC2: obs_dim={obs_dim!r} is invalid; it must be an integer >= 0.")
    if not cfg.image_shape:
        if obs_dim == 0:
            raise ValueError("TD-MPC2: the observation has neither a vector (obs_dim=0) nor an image.")
        return
    if obs_dim:
        raise ValueError(
            f"TD-MPC2: the observation has an image {cfg.image_shape} and {obs_dim} vector values; TD-MPC2 "
            "encodes one observation type, 'state' or 'rgb' (layers.py:153-164@eece801), not both. Give it "
            "the image alone (e.g. make_dmc_env(task, pixels=True, frame_stack=3)) or the state vector alone."
        )
    if cfg.multitask:
        raise ValueError(
            "TD-MPC2: a multi-task agent cannot learn from images (the reference joins the task "
            "embedding to a state observation, world_model.py:104-111@eece801, and its multi-task data is "
            "state-based): use state observations, or a single-task agent for pixels."
        )
    if len(cfg.image_shape) != 3 or min(cfg.image_shape) < 1:
        raise ValueError(f"TD-MPC2: image_shape={cfg.image_shape} must be (H, W, C), each at least 1.")
    height, width, _ = cfg.image_shape
    if (height, width) != (IMAGE_SIDE, IMAGE_SIDE):
        raise ValueError(
            f"TD-MPC2: images of {height} x {width} pixels; its pixel encoder takes {IMAGE_SIDE} x "
            f"{IMAGE_SIDE} images (the reference asserts it, layers.py:141@eece801). Render them at that "
            "size (make_dmc_env(task, pixels=True) does) or resize them (gymnasium.wrappers."
            "ResizeObservation)."
        )
    if cfg.num_channels is None:
        raise ValueError("TD-MPC2: num_channels is set by preset() for an image; build the config with it.")
    check_fields(cfg, {"num_channels": INT_AT_LEAST_1}, "TD-MPC2")
    width_out = cfg.num_channels * PIXEL_FEATURE_CELLS
    if width_out != cfg.latent_dim:
        raise ValueError(
            f"TD-MPC2: the pixel encoder's output, num_channels x 4 x 4 = {cfg.num_channels} x 16 = "
            f"{width_out} values, is the latent itself (not projected, layers.py:136-150@eece801), but "
            f"latent_dim={cfg.latent_dim}. Use model_size=5 (latent 512 with the default "
            f"num_channels=32), or num_channels=latent_dim/16 (= {cfg.latent_dim / PIXEL_FEATURE_CELLS:g}), "
            f"or latent_dim=num_channels x 16 (= {width_out})."
        )


def _check_tasks(cfg: TDMPC2Config) -> None:
    if cfg.task_dim < 0:
        raise ValueError(f"task_dim must be 0 (single-task) or positive, got {cfg.task_dim}.")
    if not cfg.multitask:
        if cfg.action_dims or cfg.episode_lengths:
            raise ValueError(
                "action_dims and episode_lengths are multi-task settings: give task_dim > 0 too."
            )
        return
    if not cfg.action_dims or len(cfg.action_dims) != len(cfg.episode_lengths):
        raise ValueError(
            f"a multi-task config needs one action width and one episode length per task, got "
            f"action_dims={cfg.action_dims} and episode_lengths={cfg.episode_lengths}."
        )
    if min(cfg.action_dims) < 1 or max(cfg.action_dims) != cfg.action_dim or min(cfg.episode_lengths) < 1:
        raise ValueError(
            f"action_dims must be positive with their largest equal to action_dim={cfg.action_dim}, and "
            f"episode_lengths positive (got {cfg.action_dims}, {cfg.episode_lengths})."
        )
    if cfg.episodic:
        raise ValueError(
            "episodic=True is single-task only, as in the reference (world_model.py:136@7ec6bc8)."
        )


PER_SEED_REFUSED: dict[str, str] = {
    "dropout": (
        "the Q dropout rate is checked and turned into the masks' integer threshold on the host when "
        "the program is built (blocks.random.hash_bernoulli)"
    ),
    "vmin": "it places the two-hot bins, computed with numpy when the program is built",
    "vmax": "it places the two-hot bins, computed with numpy when the program is built",
    "learning_rate": (
        "the rate lives in each seed's optimiser states: set it there with agent.set_learning_rate (a "
        "stacked state carries one rate per seed)"
    ),
}
"""The float fields that cannot take one value per seed (:func:`seed_settings`), with the reason;
every other float field can (tests/test_seeds_core.py traces each and checks that it reaches the
update or the planner)."""


def seed_settings(config: TDMPC2Config, settings: dict[str, list[float]]) -> SeedSettings:
    """``config`` with float fields given one value per seed ({field: S values}) for the agent
    functions' ``over_seeds`` (:func:`~sb3_worldmodels.blocks.seeds.with_settings`); each seed's
    config is checked (:func:`check_config`); :data:`PER_SEED_REFUSED` and non-float fields are
    refused."""
    return with_settings(config, settings, refused=PER_SEED_REFUSED, validate=check_config)

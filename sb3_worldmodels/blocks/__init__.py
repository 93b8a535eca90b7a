"""Pure-JAX building blocks shared by the world-model agents.

- :mod:`~sb3_worldmodels.blocks.math`: symlog/symexp, two-hot regression, λ-returns.
- :mod:`~sb3_worldmodels.blocks.distributions`: categorical, Normal, Bernoulli, symlog-MSE math.
- :mod:`~sb3_worldmodels.blocks.normalizers`: percentile return normaliser, EMA, RunningScale.
- :mod:`~sb3_worldmodels.blocks.layers`: flax layers (fan-in init, RMSNorm, normed dense, hidden layers,
  BlockLinear).
- :mod:`~sb3_worldmodels.blocks.optim`: the agents' optimisers (LaProp with AGC and warmup; Adam with
  per-group learning rates) from one construction, the learning rate injected.
- :mod:`~sb3_worldmodels.blocks.random`: cheap hashed Bernoulli masks for dropout.
- :mod:`~sb3_worldmodels.blocks.seeds`: many seeds in one program (a leading seed axis; settings per
  seed).
- :mod:`~sb3_worldmodels.blocks.devices`: every local device (a seed axis sharded over them; one
  model's batch split over them).
- :mod:`~sb3_worldmodels.blocks.backend`: the forms chosen per backend (gather-free lookups, searches
  and percentiles on accelerators).
- :mod:`~sb3_worldmodels.blocks.precision`: the compute dtypes (float32 or bfloat16 networks over
  float32 parameters).
"""

from sb3_worldmodels.blocks.distributions import (
    bernoulli_log_prob,
    categorical_entropy,
    categorical_kl,
    categorical_log_prob,
    free_nats,
    normal_entropy,
    normal_head,
    normal_log_prob,
    onehot_mode,
    symlog_mse_log_prob,
    unimix_logits,
)
from sb3_worldmodels.blocks.layers import (
    TRUNC_NORMAL_STD_CORRECTION,
    BlockLinear,
    Dense,
    NormedDense,
    RMSNorm,
    get_act,
    hidden_layers,
    mish,
    simnorm,
    trunc_normal_fan_in,
)
from sb3_worldmodels.blocks.math import (
    imagination_weight,
    imagined_lambda_return,
    lambda_return,
    replay_lambda_return,
    symexp,
    symexp_bins,
    symlog,
    symlog_twohot_bins,
    symlog_twohot_encode,
    symlog_twohot_log_prob,
    symlog_twohot_mean,
    twohot_encode,
    twohot_log_prob,
    twohot_mean,
)
from sb3_worldmodels.blocks.normalizers import (
    PercentileNormState,
    RunningScaleState,
    ema_update,
    percentile_norm_init,
    percentile_norm_scale,
    percentile_norm_update,
    running_scale_apply,
    running_scale_init,
    running_scale_update,
)
from sb3_worldmodels.blocks.optim import (
    ScaleByMomentumState,
    ScaleByRmsState,
    WarmupState,
    adam,
    get_learning_rate,
    laprop,
    optimizer,
    over_flat_parameters,
    scale_by_agc,
    scale_by_momentum_corrected,
    scale_by_rms_corrected,
    scale_by_warmup,
    with_learning_rate,
)
from sb3_worldmodels.blocks.random import hash_bernoulli, mix32

__all__ = [
    "TRUNC_NORMAL_STD_CORRECTION",
    "BlockLinear",
    "Dense",
    "NormedDense",
    "PercentileNormState",
    "RMSNorm",
    "RunningScaleState",
    "ScaleByMomentumState",
    "ScaleByRmsState",
    "WarmupState",
    "adam",
    "bernoulli_log_prob",
    "categorical_entropy",
    "categorical_kl",
    "categorical_log_prob",
    "ema_update",
    "free_nats",
    "get_act",
    "hidden_layers",
    "get_learning_rate",
    "hash_bernoulli",
    "imagination_weight",
    "imagined_lambda_return",
    "lambda_return",
    "laprop",
    "mish",
    "mix32",
    "normal_entropy",
    "normal_head",
    "normal_log_prob",
    "onehot_mode",
    "optimizer",
    "over_flat_parameters",
    "percentile_norm_init",
    "percentile_norm_scale",
    "percentile_norm_update",
    "replay_lambda_return",
    "running_scale_apply",
    "running_scale_init",
    "running_scale_update",
    "scale_by_agc",
    "scale_by_momentum_corrected",
    "scale_by_rms_corrected",
    "scale_by_warmup",
    "simnorm",
    "symexp",
    "symexp_bins",
    "symlog",
    "symlog_mse_log_prob",
    "symlog_twohot_bins",
    "symlog_twohot_encode",
    "symlog_twohot_log_prob",
    "symlog_twohot_mean",
    "trunc_normal_fan_in",
    "twohot_encode",
    "twohot_log_prob",
    "twohot_mean",
    "unimix_logits",
    "with_learning_rate",
]

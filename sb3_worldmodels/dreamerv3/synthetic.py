"""Random training batches in the replay's layout, for benchmarks, tools and tests that time, lower
or compare DreamerV3's update without collecting data (the core never imports this module)."""

from __future__ import annotations

import numpy as np

from sb3_worldmodels.dreamerv3.config import DreamerV3Config


def random_batches(
    config: DreamerV3Config, k: int, rng: np.random.Generator, first_rate: float = 0.2
) -> dict[str, np.ndarray]:
    """K training batches of random replay windows with episode boundaries.

    Args:
        config: the agent's config (its spaces, batch_size B, batch_length T, deter, stoch, classes).
        k: leading axis: the updates of one training call.
        rng: numpy generator the values are drawn from.
        first_rate: chance that a row starts an episode (the row before it ends one, half of
            those terminal).

    Returns:
        numpy arrays (K, B, T+1, ...): ``obs`` when ``config.obs_dim`` > 0, ``image`` (uint8) when
        ``config.image_shape`` is set, one-hot ``action`` (discrete) or uniform in [-1, 1], reward,
        the episode flags, and the replayed ``deter``/``stoch`` latents.
    """
    shape = (k, config.batch_size, config.batch_length + 1)
    if config.discrete:
        action = np.eye(config.action_dim, dtype=np.float32)[rng.integers(0, config.action_dim, shape)]
    else:
        action = rng.uniform(-1, 1, size=(*shape, config.action_dim)).astype(np.float32)
    is_first = rng.random(shape) < first_rate
    is_last = np.zeros(shape, bool)
    is_last[..., :-1] = is_first[..., 1:]
    batch = {
        "action": action,
        "reward": rng.normal(size=shape).astype(np.float32),
        "is_first": is_first,
        "is_last": is_last,
        "is_terminal": is_last & (rng.random(shape) < 0.5),
        "deter": rng.normal(size=(*shape, config.deter)).astype(np.float32),
        "stoch": rng.integers(0, config.classes, (*shape, config.stoch)).astype(np.int32),
    }
    if config.obs_dim:
        batch["obs"] = rng.normal(size=(*shape, config.obs_dim)).astype(np.float32)
    if config.image_shape:
        batch["image"] = rng.integers(0, 256, (*shape, *config.image_shape)).astype(np.uint8)
    return batch

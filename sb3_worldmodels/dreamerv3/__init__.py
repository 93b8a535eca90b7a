"""DreamerV3 (danijar/dreamerv3 @2411f7d + 29eb964): config, networks, pure core, SB3 class."""

from sb3_worldmodels.dreamerv3.algorithm import DreamerV3
from sb3_worldmodels.dreamerv3.config import MODEL_SIZES, DreamerV3Config, preset

__all__ = ["MODEL_SIZES", "DreamerV3", "DreamerV3Config", "preset"]

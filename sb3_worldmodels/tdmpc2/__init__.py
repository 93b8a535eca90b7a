"""TD-MPC2 (nicklashansen/tdmpc2 @b67b21c): config, networks and the pure-JAX core."""

from sb3_worldmodels.tdmpc2.config import TDMPC2Config

__all__ = ["TDMPC2Config"]

"""XLA compiler options of the jitted agent functions (defined in :mod:`sb3_worldmodels.blocks.jit`)."""

from __future__ import annotations

from sb3_worldmodels.blocks.jit import COMPILER_OPTIONS

__all__ = ["COMPILER_OPTIONS"]

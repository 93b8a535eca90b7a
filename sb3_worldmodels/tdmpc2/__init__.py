"""TD-MPC2 (nicklashansen/tdmpc2 @b67b21c): config, networks, pure core, SB3 class."""

from sb3_worldmodels.data import (
    TaskPool,
    export_episodes,
    load_pool,
    pool_reference_data,
    pool_tasks,
    read_reference_chunk,
)
from sb3_worldmodels.tdmpc2.algorithm import TDMPC2
from sb3_worldmodels.tdmpc2.config import MODEL_SIZES, TDMPC2Config, preset
from sb3_worldmodels.tdmpc2.multitask import MultiTaskEvalCallback, TDMPC2MultiTask

__all__ = [
    "MODEL_SIZES",
    "MultiTaskEvalCallback",
    "TDMPC2",
    "TDMPC2Config",
    "TDMPC2MultiTask",
    "TaskPool",
    "export_episodes",
    "load_pool",
    "pool_reference_data",
    "pool_tasks",
    "read_reference_chunk",
    "preset",
]

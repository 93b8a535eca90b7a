"""World-model reinforcement learning (DreamerV3, TD-MPC2) as drop-in Stable-Baselines3 algorithms."""

from sb3_worldmodels.blocks.host_memory import keep_freed_memory
from sb3_worldmodels.common.callbacks import WorldModelCallback
from sb3_worldmodels.common.seed_eval import SeedGroupEvalCallback
from sb3_worldmodels.dreamerv3 import DreamerV3, DreamerV3Config
from sb3_worldmodels.envs import (
    ActionRepeat,
    FlattenDictObservation,
    crafter_score,
    make_crafter_env,
    make_dmc_env,
    make_dreamer_atari_env,
)
from sb3_worldmodels.tdmpc2 import (
    TDMPC2,
    MultiTaskEvalCallback,
    TaskPool,
    TDMPC2Config,
    TDMPC2MultiTask,
    export_episodes,
    load_pool,
    pool_reference_data,
    pool_tasks,
)

keep_freed_memory()  # with SB3WM_MALLOC=on: at import, before JAX starts its threads (blocks/host_memory.py)

__version__ = "0.1.0"
__all__ = [
    "TDMPC2",
    "ActionRepeat",
    "DreamerV3",
    "DreamerV3Config",
    "FlattenDictObservation",
    "MultiTaskEvalCallback",
    "SeedGroupEvalCallback",
    "TDMPC2Config",
    "TDMPC2MultiTask",
    "TaskPool",
    "WorldModelCallback",
    "__version__",
    "crafter_score",
    "export_episodes",
    "load_pool",
    "make_crafter_env",
    "make_dmc_env",
    "make_dreamer_atari_env",
    "pool_reference_data",
    "pool_tasks",
]

"""Offline data: episode exports (:mod:`~sb3_worldmodels.data.episodes`), task pools
(:mod:`~sb3_worldmodels.data.pool`) and the reference's released multi-task data
(:mod:`~sb3_worldmodels.data.reference`). Every file is read without running code."""

from sb3_worldmodels.data.episodes import EPISODES_FORMAT, FORMAT_VERSION, export_episodes
from sb3_worldmodels.data.pool import MAX_TASKS, POOL_FORMAT, TaskPool, load_pool, pool_tasks
from sb3_worldmodels.data.reference import pool_reference_data, read_reference_chunk

__all__ = [
    "EPISODES_FORMAT",
    "FORMAT_VERSION",
    "MAX_TASKS",
    "POOL_FORMAT",
    "TaskPool",
    "export_episodes",
    "load_pool",
    "pool_reference_data",
    "pool_tasks",
    "read_reference_chunk",
]

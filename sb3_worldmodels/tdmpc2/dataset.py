"""Old import path of the offline data, kept for users' code: episode exports, task pools and the
reference's data now live in :mod:`sb3_worldmodels.data`."""

from sb3_worldmodels.data.episodes import EPISODES_FORMAT, FORMAT_VERSION, PathLike, export_episodes
from sb3_worldmodels.data.pool import MAX_TASKS, POOL_FORMAT, TaskPool, load_pool, pool_tasks
from sb3_worldmodels.data.reference import pool_reference_data, read_reference_chunk

__all__ = [
    "EPISODES_FORMAT",
    "FORMAT_VERSION",
    "MAX_TASKS",
    "POOL_FORMAT",
    "PathLike",
    "TaskPool",
    "export_episodes",
    "load_pool",
    "pool_reference_data",
    "pool_tasks",
    "read_reference_chunk",
]

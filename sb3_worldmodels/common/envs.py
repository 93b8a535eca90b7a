"""Old import path of the environment helpers, kept for users' code: the env wrappers and dm_control
now live in :mod:`sb3_worldmodels.envs`, the VecEnv helpers in :mod:`sb3_worldmodels.common.vec_env`."""

from sb3_worldmodels.common.vec_env import vec_agent_steps_per_episode, vec_env_from_gymnasium
from sb3_worldmodels.envs.dmc import (
    DMC_CAMERAS,
    DMC_EXTRA_HINT,
    RENDERER_HINT,
    PixelObservation,
    dmc_env_id,
    make_dmc_env,
    register_dm_control,
    use_headless_rendering,
)
from sb3_worldmodels.envs.wrappers import (
    ActionRepeat,
    FlattenDictObservation,
    StackFrames,
    agent_steps_per_episode,
)

__all__ = [
    "DMC_CAMERAS",
    "DMC_EXTRA_HINT",
    "RENDERER_HINT",
    "ActionRepeat",
    "FlattenDictObservation",
    "PixelObservation",
    "StackFrames",
    "agent_steps_per_episode",
    "dmc_env_id",
    "make_dmc_env",
    "register_dm_control",
    "use_headless_rendering",
    "vec_agent_steps_per_episode",
    "vec_env_from_gymnasium",
]

"""Environments set up as the papers run them: dm_control (:mod:`~sb3_worldmodels.envs.dmc`), Atari
(:mod:`~sb3_worldmodels.envs.atari`), Crafter (:mod:`~sb3_worldmodels.envs.crafter`), and wrappers
for any Gymnasium env (:mod:`~sb3_worldmodels.envs.wrappers`). Each family imports its simulator
only when an env is built, with an ImportError naming the extra to install."""

from sb3_worldmodels.envs.atari import DreamerAtari, atari_game_id, make_dreamer_atari_env
from sb3_worldmodels.envs.crafter import CrafterEnv, crafter_score, crafter_success_rates, make_crafter_env
from sb3_worldmodels.envs.dmc import (
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
    "ActionRepeat",
    "CrafterEnv",
    "DreamerAtari",
    "FlattenDictObservation",
    "PixelObservation",
    "StackFrames",
    "agent_steps_per_episode",
    "atari_game_id",
    "crafter_score",
    "crafter_success_rates",
    "dmc_env_id",
    "make_crafter_env",
    "make_dmc_env",
    "make_dreamer_atari_env",
    "register_dm_control",
    "use_headless_rendering",
]

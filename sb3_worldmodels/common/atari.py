"""Old import path of the Atari env, kept for users' code: it lives in :mod:`sb3_worldmodels.envs.atari`."""

from sb3_worldmodels.envs.atari import (
    GRAY_WEIGHTS,
    DreamerAtari,
    LivesMode,
    atari_game_id,
    make_dreamer_atari_env,
)

__all__ = ["GRAY_WEIGHTS", "DreamerAtari", "LivesMode", "atari_game_id", "make_dreamer_atari_env"]

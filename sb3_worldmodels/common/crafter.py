"""Old import path of the Crafter env, kept for users' code: it lives in
:mod:`sb3_worldmodels.envs.crafter`."""

from sb3_worldmodels.envs.crafter import CrafterEnv, crafter_score, crafter_success_rates, make_crafter_env

__all__ = ["CrafterEnv", "crafter_score", "crafter_success_rates", "make_crafter_env"]

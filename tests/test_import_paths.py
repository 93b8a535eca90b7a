"""Every public name users import keeps importing from where it was, as the same object as at its
home (the environments moved to ``sb3_worldmodels.envs``, the offline data to
``sb3_worldmodels.data``; the old modules re-export them)."""

from __future__ import annotations

import importlib

import pytest

# old module -> {public name: the module that now defines it}
MOVED = {
    "sb3_worldmodels.common.envs": {
        "ActionRepeat": "sb3_worldmodels.envs.wrappers",
        "FlattenDictObservation": "sb3_worldmodels.envs.wrappers",
        "StackFrames": "sb3_worldmodels.envs.wrappers",
        "agent_steps_per_episode": "sb3_worldmodels.envs.wrappers",
        "DMC_CAMERAS": "sb3_worldmodels.envs.dmc",
        "DMC_EXTRA_HINT": "sb3_worldmodels.envs.dmc",
        "RENDERER_HINT": "sb3_worldmodels.envs.dmc",
        "PixelObservation": "sb3_worldmodels.envs.dmc",
        "dmc_env_id": "sb3_worldmodels.envs.dmc",
        "make_dmc_env": "sb3_worldmodels.envs.dmc",
        "register_dm_control": "sb3_worldmodels.envs.dmc",
        "use_headless_rendering": "sb3_worldmodels.envs.dmc",
        "vec_env_from_gymnasium": "sb3_worldmodels.common.vec_env",
        "vec_agent_steps_per_episode": "sb3_worldmodels.common.vec_env",
    },
    "sb3_worldmodels.common.atari": {
        name: "sb3_worldmodels.envs.atari"
        for name in ("GRAY_WEIGHTS", "DreamerAtari", "LivesMode", "atari_game_id", "make_dreamer_atari_env")
    },
    "sb3_worldmodels.common.crafter": {
        name: "sb3_worldmodels.envs.crafter"
        for name in ("CrafterEnv", "crafter_score", "crafter_success_rates", "make_crafter_env")
    },
    "sb3_worldmodels": {
        "ActionRepeat": "sb3_worldmodels.envs.wrappers",
        "FlattenDictObservation": "sb3_worldmodels.envs.wrappers",
        "make_dmc_env": "sb3_worldmodels.envs.dmc",
        "make_dreamer_atari_env": "sb3_worldmodels.envs.atari",
        "make_crafter_env": "sb3_worldmodels.envs.crafter",
        "crafter_score": "sb3_worldmodels.envs.crafter",
    },
}
CASES = [(old, name, new) for old, names in MOVED.items() for name, new in names.items()]


@pytest.mark.parametrize(("old", "name", "new"), CASES, ids=[f"{old}.{name}" for old, name, _ in CASES])
def test_a_moved_name_imports_from_its_old_path_as_the_same_object(old, name, new):
    assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), name)


def test_the_old_modules_keep_every_public_name_they_had():
    """A name missing from the table above would not be checked: each old module's public names
    (its ``__all__``) are exactly those the table lists."""
    for old, names in MOVED.items():
        if old == "sb3_worldmodels":
            continue
        assert sorted(importlib.import_module(old).__all__) == sorted(names), old


def test_the_envs_package_exports_its_families():
    envs = importlib.import_module("sb3_worldmodels.envs")
    for name in envs.__all__:
        home = getattr(envs, name).__module__
        assert home.startswith("sb3_worldmodels.envs."), (name, home)

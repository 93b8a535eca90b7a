"""Every public name users import keeps importing from where it was, as the same object as at its
home (the environments moved to ``sb3_worldmodels.envs``, the offline data to
``sb3_worldmodels.data``, the discount heuristic to ``sb3_worldmodels.blocks.episodes``, the shell's
helpers out of ``common/base.py`` into one module per job, the agents' loss terms (and DreamerV3's
rollouts) out of their ``agent.py``; the old modules re-export them)."""

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
    "sb3_worldmodels.tdmpc2.dataset": {
        "EPISODES_FORMAT": "sb3_worldmodels.data.episodes",
        "FORMAT_VERSION": "sb3_worldmodels.data.episodes",
        "PathLike": "sb3_worldmodels.data.episodes",
        "export_episodes": "sb3_worldmodels.data.episodes",
        "MAX_TASKS": "sb3_worldmodels.data.pool",
        "POOL_FORMAT": "sb3_worldmodels.data.pool",
        "TaskPool": "sb3_worldmodels.data.pool",
        "load_pool": "sb3_worldmodels.data.pool",
        "pool_tasks": "sb3_worldmodels.data.pool",
        "pool_reference_data": "sb3_worldmodels.data.reference",
        "read_reference_chunk": "sb3_worldmodels.data.reference",
    },
    "sb3_worldmodels.tdmpc2.config": {"discount_from_episode_length": "sb3_worldmodels.blocks.episodes"},
    "sb3_worldmodels.common.base": {
        "BaseAlgorithm": "stable_baselines3.common.base_class",
        "DETERMINISTIC_PREDICT_SEED": "sb3_worldmodels.common.predict",
        "FOREIGN_KEYWORDS": "sb3_worldmodels.common.sb3_keywords",
        "FORMAT_VERSION": "sb3_worldmodels.common.checkpoints",
        "NonFiniteActionError": "sb3_worldmodels.common.boundary",
        "NonFiniteUpdateError": "sb3_worldmodels.common.training",
        "STATE_FIX": "sb3_worldmodels.common.predict",
        "pad_rows": "sb3_worldmodels.common.predict",
        "padded_rows": "sb3_worldmodels.common.predict",
        "refuse_foreign_keywords": "sb3_worldmodels.common.sb3_keywords",
        "refuse_non_finite_actions": "sb3_worldmodels.common.boundary",
        "row_digests": "sb3_worldmodels.common.predict",
        "take_sb3_alias": "sb3_worldmodels.common.sb3_keywords",
    },
    "sb3_worldmodels.common.policy": {
        "flatten_state": "sb3_worldmodels.common.checkpoints",
        "restore_state": "sb3_worldmodels.common.checkpoints",
    },
    "sb3_worldmodels.tdmpc2": {
        "TaskPool": "sb3_worldmodels.data.pool",
        "export_episodes": "sb3_worldmodels.data.episodes",
        "load_pool": "sb3_worldmodels.data.pool",
        "pool_reference_data": "sb3_worldmodels.data.reference",
        "pool_tasks": "sb3_worldmodels.data.pool",
        "read_reference_chunk": "sb3_worldmodels.data.reference",
    },
    "sb3_worldmodels.dreamerv3.agent": {
        **{
            name: "sb3_worldmodels.dreamerv3.rollouts"
            for name in (
                "Carry",
                "UpdateNoise",
                "actor_distribution",
                "actor_entropy",
                "head_bins",
                "imagine",
                "observe",
                "sample_update_noise",
                "state_heads",
            )
        },
        **{
            name: "sb3_worldmodels.dreamerv3.losses"
            for name in (
                "imagination_loss",
                "loss_fn",
                "reconstruction_losses",
                "replay_value_loss",
                "world_model_loss",
            )
        },
    },
    "sb3_worldmodels.tdmpc2.agent": {
        name: "sb3_worldmodels.tdmpc2.losses"
        for name in (
            "LOSS_COEFS",
            "UpdateNoise",
            "consistency_loss",
            "discount",
            "policy_loss",
            "reward_loss",
            "td_target",
            "termination_loss",
            "value_loss",
            "weighted_world_model_loss",
            "world_model_loss",
        )
    },
    "sb3_worldmodels": {
        "TaskPool": "sb3_worldmodels.data.pool",
        "export_episodes": "sb3_worldmodels.data.episodes",
        "load_pool": "sb3_worldmodels.data.pool",
        "pool_reference_data": "sb3_worldmodels.data.reference",
        "pool_tasks": "sb3_worldmodels.data.pool",
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
        own_modules = ("sb3_worldmodels", "sb3_worldmodels.tdmpc2", "sb3_worldmodels.tdmpc2.config")
        shells = ("sb3_worldmodels.common.base", "sb3_worldmodels.common.policy")
        cores = ("sb3_worldmodels.dreamerv3.agent", "sb3_worldmodels.tdmpc2.agent")
        if old in (*own_modules, *shells, *cores):
            continue  # modules of their own, which re-export a few moved names
        assert sorted(importlib.import_module(old).__all__) == sorted(names), old


@pytest.mark.parametrize("package", ["sb3_worldmodels.envs", "sb3_worldmodels.data"])
def test_the_new_packages_export_their_own_names(package):
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        home = getattr(value, "__module__", None)
        assert home is None or home.startswith(f"{package}."), (name, home)
        assert any(getattr(importlib.import_module(old), name, None) is value for old in MOVED), name

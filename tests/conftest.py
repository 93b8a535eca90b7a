"""Test-session set-up: one JAX persistent compilation cache shared by the whole run.

Compilation dominates the suite (each configuration compiles its update and acting step for tens
of seconds), and many test files build the same tiny configurations: the pytest-xdist workers and
the ``rl_zoo3`` subprocesses all inherit ``JAX_COMPILATION_CACHE_DIR`` set here, so a computation
compiled by one is loaded by the others. The cache is keyed by the compiled program itself, so a hit
can only return the same executable. A run that sets ``JAX_COMPILATION_CACHE_DIR`` itself keeps it;
``SB3WM_TEST_JAX_CACHE=0`` switches the shared cache off; ``SB3WM_TEST_JAX_CACHE=/some/dir`` puts it in
that folder and keeps it after the run, so that CI's second tier (``.ci/run``) loads the programs its
first tier compiled.

The package's own default cache (``sb3_worldmodels.blocks.compile_cache``: a folder of the user's cache
directory) is switched off for the whole run (``SB3WM_COMPILATION_CACHE=off``, inherited by the workers
and subprocesses): no test writes into the user's folder or reads what an earlier run left there, with
or without the shared cache above. tests/test_compile_cache.py runs its own processes with a folder of
their own.

XLA's CPU options are pinned to ``ynn_fusions_off`` (``SB3WM_CPU_OPTIONS``, unless the run names a set)
on every CPU: on one with AVX-512 the package would choose ``llvm_level_1``, whose YNNPACK kernels
pick their blocking by the operands' shapes, so a seed group, a data-parallel batch or a batch of
another size rounds each matmul differently from one seed's program; DreamerV3's optimiser (LaProp,
epsilon 1e-20) turns a near-zero gradient's sign into a whole step, and such rounding grows past the
tolerances of the tests that compare programs of different shapes. The tolerances hold on every CPU
under XLA's own dot kernels; tests/test_blocks_jit.py runs the reference parity tests under the CPU's
own choice.

glibc's allocator is left as it is (``SB3WM_MALLOC=off``, the default too): the package's setting
keeps the heap's peak resident in every worker that runs many programs; tests/test_host_memory.py
runs its own processes with it.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.slowest_first"]  # test files slowest first (its docstring)

_OWNED_CACHE: list[str] = []

os.environ["SB3WM_COMPILATION_CACHE"] = "off"  # see the module docstring
os.environ.setdefault("SB3WM_CPU_OPTIONS", "ynn_fusions_off")  # see the module docstring
os.environ.setdefault("SB3WM_MALLOC", "off")  # see the module docstring

# dm_control picks its OpenGL backend when first imported, which a plugin may do before any test
# (through shimmy): headless EGL for the pixel tests, unless the run chose a backend or has a display.
if "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
    os.environ["MUJOCO_GL"] = "egl"


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: it inherited the controller's settings
        return
    chosen = os.environ.get("SB3WM_TEST_JAX_CACHE", "")
    if chosen == "0" or "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    if chosen:
        os.makedirs(chosen, mode=0o700, exist_ok=True)
        cache = chosen
    else:
        cache = tempfile.mkdtemp(prefix="sb3wm-jax-cache-")
        _OWNED_CACHE.append(cache)
    os.environ.update(
        JAX_COMPILATION_CACHE_DIR=cache,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        # A size limit turns on JAX's file lock around every read and write, so one process never
        # reads an entry another is still writing (the lock uses filelock, a test dependency).
        JAX_COMPILATION_CACHE_MAX_SIZE=str(8 * 2**30),
    )
    if "jax" in sys.modules:  # already imported (by a plugin): the variables above came too late
        jax = sys.modules["jax"]
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        jax.config.update("jax_compilation_cache_max_size", 8 * 2**30)


def pytest_unconfigure(config: pytest.Config) -> None:
    for cache in _OWNED_CACHE:
        shutil.rmtree(cache, ignore_errors=True)


MAPPINGS_BEFORE_CLEARING = 20_000
"""A worker that holds more memory mappings than this after a test file drops JAX's compiled programs.

Every compiled XLA:CPU kernel is a mapping of its own and a process may hold 65,530 (Linux's default
``vm.max_map_count``): a worker that runs many test files, each compiling its own configurations,
its own jitted helpers and eager operations, would abort in a later compile. The agents' functions
keep a few configurations only (``blocks.jit.COMPILED_CONFIGS_KEPT``); the rest is released here.
"""


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs() -> Iterator[None]:
    yield
    if "jax" not in sys.modules:
        return
    from sb3_worldmodels.blocks.jit import memory_mappings

    mappings = memory_mappings()
    if mappings is not None and mappings > MAPPINGS_BEFORE_CLEARING:
        sys.modules["jax"].clear_caches()
        gc.collect()


def _has_dm_control() -> bool:
    try:
        import dm_control  # noqa: F401
        import shimmy  # noqa: F401
    except ImportError:
        return False
    return True


EXTENDED_FILES = {
    "test_examples.py": "the examples run end to end, several learning",
    "test_zoo.py": "rl_zoo3 subprocesses: train, enjoy, resume, Optuna",
    "test_dreamerv3_probes.py": "probe environments learned to their known answers",
    "test_dreamerv3_pixel_probe.py": "a pixel probe learned to its known answer",
    "test_dreamerv3_images.py": "image and mixed observations through learn, save and resume",
    "test_dreamerv3_parity_images.py": "the 64 x 64 image agent against the reference (compiles for minutes)",
    "test_dreamerv3_parity_trained.py": "the trained reference state, several updates",
    "test_dreamerv3_driver_parity.py": "the reference driver's replay and train-ratio record",
    "test_tdmpc2_parity_trained.py": "trained reference states of sizes 1 and 5",
    "test_tdmpc2_pixels_sb3.py": "TD-MPC2 learning from uint8 images",
    "test_atari.py": "Atari envs through the agents",
    "test_crafter.py": "Crafter envs through the agents",
    "test_benchmarks_dmc.py": "a benchmark protocol end to end",
}
"""Test files of the second tier (marker ``extended``), with what makes them slow.

The default run (``python -m pytest -q``, README's command) leaves them out to stay within minutes on
two cores; CI (``.ci/run``) runs them right after it with ``python -m pytest -q -m extended``, so
everything is still tested on every change."""

EXTENDED_TESTS = {
    "test_host_memory.py::test_the_next_call_reuses_the_freed_temporaries": (
        "two fresh processes of 40 calls with 40 MB temporaries each"
    ),
    "test_blocks_jit.py::test_the_reference_parity_holds_under_the_cpus_own_choice": (
        "the parity test files run again in a subprocess under the CPU's own compiler options"
    ),
    "test_sweeps.py::test_zoo_workers_share_a_study_and_a_killed_workers_trial_fails": (
        "three rl_zoo3 workers on one Optuna study, one killed mid-trial"
    ),
    "test_docs.py::test_page_code_runs": "every documentation page's code, run",
    "test_dreamerv3_sb3.py::test_callbacks_eval_checkpoint_progress_tensorboard": "SB3 callbacks in a run",
    "test_dreamerv3_sb3.py::test_subproc_and_dict_observations": "subprocess envs",
    "test_tdmpc2_multitask.py::test_offline_training_on_a_pool_of_two_tasks_fits_each_tasks_rewards": (
        "offline training until it fits"
    ),
    "test_tdmpc2_multitask.py::test_a_single_task_agent_from_a_multitask_model_learns_online_and_saves": (
        "online learning after offline training"
    ),
    "test_tdmpc2_sb3.py::test_probe_learns_the_rewarding_action": "learns a probe",
    "test_breaks.py::test_each_dreamerv3_switch_changes_its_term": (
        "an image agent's update compiled once per break switch"
    ),
    "test_compat.py::test_vec_frame_stack": "stacked frames through learn",
    "test_seeds_core.py::test_a_group_of_pixel_seeds_trains_and_acts_as_each_seed_alone": (
        "both cores' image updates compiled over seeds and alone"
    ),
    "test_seeds_core.py::test_a_group_of_seeds_trains_as_each_seed_alone[dreamerv3-vector]": (
        "DreamerV3's update compiled over seeds and alone"
    ),
    "test_seeds_core.py::test_settings_per_seed_equal_single_seed_runs_and_every_field_reaches_the_program"
    "[dreamerv3-vector]": (
        "DreamerV3's update compiled over seeds and alone (TD-MPC2's stays in the first tier)"
    ),
    "test_seeds_core.py::test_settings_per_seed_equal_single_seed_runs_and_every_field_reaches_the_program"
    "[tdmpc2-vector]": "TD-MPC2's update compiled over seeds and alone, each setting per seed",
    "test_steady_state.py::test_tdmpc2_learn_compiles_nothing_after_the_first_training_call[group of 2]": (
        "a TD-MPC2 group's programs compiled and run through learn twice (one seed stays in the first tier)"
    ),
    "test_gather_free.py::test_one_update_and_one_acting_step_are_the_same_in_both_forms[tdmpc2]": (
        "TD-MPC2's update and plan compiled in both forms"
    ),
    "test_gather_free.py::test_the_gather_free_programs_have_no_gathers_scatters_or_sorts"
    "[tdmpc2-multitask]": "the multi-task update and plan lowered over seeds and alone",
    "test_seed_groups.py::test_replay_memory_counts_every_seed": "a seed group's replay sized through learn",
    "test_sb3_drop_in.py::test_a_model_built_with_net_arch_round_trips_save_and_load[DreamerV3]": (
        "DreamerV3 built, trained and reloaded with SB3's net_arch (TD-MPC2's stays in the first tier)"
    ),
    "test_seed_groups.py::test_dreamerv3_group_seed_equals_single_seed_run": (
        "a group's and each seed's single-seed programs compiled and run side by side"
    ),
    "test_seed_groups.py::test_tdmpc2_group_seed_equals_single_seed_run": (
        "a group's and each seed's single-seed programs compiled and run side by side"
    ),
    "test_seed_groups.py::test_tdmpc2_group_split_by_save_and_load_equals_the_whole_run": (
        "a seed group's programs compiled and run through learn"
    ),
    "test_seed_groups.py::test_group_replay_file_holds_every_seed_and_must_fit_the_group": (
        "a seed group's programs compiled and run through learn"
    ),
    "test_seed_groups.py::test_group_predict_acts_as_the_named_seeds_model": (
        "a seed group's programs compiled and run through learn"
    ),
    "test_seed_groups.py::test_group_env_learn_twice_progress_bar_and_checkpoints": (
        "a seed group's programs compiled and run through learn"
    ),
    "test_seed_groups.py::test_settings_per_seed_equal_single_seed_runs_with_those_settings": (
        "a group's and each seed's single-seed programs compiled and run side by side"
    ),
    "test_seed_groups.py::test_dreamerv3_group_split_by_save_and_load_equals_the_whole_run": (
        "a DreamerV3 group's update compiled and run three times over"
    ),
    "test_seed_eval.py::test_a_group_evaluates_every_seed_logs_their_mean_and_saves_the_best_group"
    "[trained]": "a seed group's update compiled and run through learn, every seed's episodes planned",
    "test_tdmpc2_multitask_seeds.py::test_each_seed_of_a_multitask_group_equals_its_single_seed_model": (
        "a multi-task group's and each seed's single-seed programs compiled and run side by side"
    ),
    "test_tdmpc2_multitask_seeds.py::test_settings_per_seed_equal_single_seed_models_with_those_settings": (
        "a multi-task group's and each seed's single-seed programs compiled and run side by side"
    ),
    "test_tdmpc2_multitask_seeds.py::test_a_group_is_evaluated_seed_by_seed": (
        "a multi-task group's update compiled, every seed's episodes planned"
    ),
    "test_tdmpc2_multitask_seeds.py::test_every_seed_of_a_group_starts_from_a_reference_checkpoint": (
        "size-1 models of the recorded reference built per seed"
    ),
    "test_devices.py::test_a_multitask_group_sharded_over_4_devices_equals_it_on_one": (
        "a multi-task group compiled and run in two fresh processes, on 4 devices and on 1"
    ),
    "test_steady_state.py::test_dreamerv3_group_learn_compiles_nothing_after_the_first_training_call": (
        "a DreamerV3 group's programs compiled and run through learn"
    ),
    "test_compile_cache.py::test_a_second_process_loads_every_agent_program_the_first_compiled": (
        "a tiny TD-MPC2 compiled and trained in a fresh process, then loaded from the cache in another"
    ),
    "test_devices.py::"
    "test_a_pixel_group_with_its_replays_in_device_memory_sharded_over_4_devices_equals_it_on_one": (
        "a pixel group compiled and run in two fresh processes, on 4 devices and on 1 (the vector group "
        "stays in the first tier)"
    ),
    "test_replay_on_device.py::test_a_seed_group_trains_the_same_from_device_copies_of_its_observations": (
        "a seed group trained twice through learn (one model's stays in the first tier)"
    ),
    "test_benchmarks_learning.py::"
    "test_a_seed_group_check_with_its_envs_in_processes_equals_it_in_one_process": (
        "a learning check's smoke run of a seed group, twice (an evaluation in processes stays in the "
        "first tier)"
    ),
    "test_gather_free.py::test_unrolled_scans_give_the_same_update_and_acting_step[dreamerv3]": (
        "DreamerV3's update and acting step compiled rolled and unrolled (TD-MPC2's stay in the first tier)"
    ),
    "test_sb3_drop_in.py::test_save_load_policy[DreamerV3]": (
        "SB3's save_load_policy test on DreamerV3 (TD-MPC2's stays in the first tier)"
    ),
    "test_replay_memory.py::test_a_replay_over_half_the_memory_warns_and_runs[tdmpc2]": (
        "a TD-MPC2 trained on a replay over half the memory (DreamerV3's stays in the first tier)"
    ),
    "test_devices.py::test_a_dreamerv3_group_of_2_seeds_on_a_host_of_4_devices_equals_it_on_one": (
        "a group compiled and run in two fresh processes, on 4 devices and on 1"
    ),
    "test_devices.py::test_dreamerv3_data_parallel_updates_equal_the_one_device_updates": (
        "a model compiled and run in two fresh processes, on 4 devices and on 1"
    ),
    "test_devices.py::test_data_parallel_updates_equal_the_one_device_updates": (
        "a model compiled and run in two fresh processes, on 4 devices and on 1"
    ),
    "test_distributed.py::test_2_processes_train_one_model_as_one_process_on_the_global_batch": (
        "a model trained by 2 jax.distributed processes, its updates again in one, checkpoints resumed"
    ),
    "test_distributed.py::test_processes_that_build_different_models_or_a_seed_group_are_refused": (
        "2 jax.distributed processes, models built in each"
    ),
    "test_gather_free.py::test_one_update_and_one_acting_step_are_the_same_in_both_forms[dreamerv3]": (
        "DreamerV3's update compiled in both forms (TD-MPC2's stays in the first tier)"
    ),
    "test_gather_free.py::test_one_update_and_one_acting_step_are_the_same_in_both_forms[tdmpc2-multitask]": (
        "the multi-task update compiled in both forms (TD-MPC2's stays in the first tier)"
    ),
    "test_envs.py::test_headless_rendering_is_chosen_without_a_display_and_a_missing_renderer_says_how": (
        "renderer subprocesses"
    ),
    "test_benchmarks_learning.py::test_a_seed_group_check_stopped_by_its_budget_resumes_exactly": (
        "a learning check's smoke run of a seed group, three times through learn"
    ),
    "test_compute_dtype.py::test_dreamerv3_bfloat16_update_on_the_reference_batch": (
        "the reference's 1m update compiled in bfloat16 (about 50 s per agent)"
    ),
    "test_compute_dtype.py::test_bfloat16_learns_with_finite_losses_and_saves_its_setting": (
        "a bfloat16 learn, save and load of each agent (the bfloat16 and float32 programs compiled)"
    ),
    "test_seed_groups.py::test_seed_model_acts_evaluates_and_saves": (
        "a seed group trained, one seed's model evaluated and saved"
    ),
    "test_seed_groups.py::test_a_group_hands_its_lanes_pieces_and_takes_them_back_stacked": (
        "a seed group's programs compiled and run through learn"
    ),
    "test_tdmpc2_multitask_seeds.py::test_a_multitask_group_saves_loads_predicts_and_logs_per_seed": (
        "a multi-task seed group trained, saved, loaded and logged"
    ),
    "test_sb3_drop_in.py::test_save_load[DreamerV3]": (
        "SB3's save/load test on DreamerV3 (TD-MPC2's stays in the first tier; tests/test_family.py "
        "saves and loads every agent there)"
    ),
    "test_sb3_drop_in.py::test_tdmpc2_learns_on_sb3s_identity_env": "TD-MPC2 learns SB3's identity env",
    "test_dreamerv3_sb3.py::test_stop_callbacks": (
        "DreamerV3 stopped by each callback (tests/test_family.py checks False stops for every agent)"
    ),
    "test_boundary_fidelity.py::test_deterministic_predict_depends_only_on_its_inputs[dreamerv3]": (
        "DreamerV3's predict repeated on many inputs (TD-MPC2's stays in the first tier)"
    ),
    "test_boundary_fidelity.py::test_dreamerv3_decodes_each_observation_key_with_its_own_layer": (
        "a DreamerV3 with a dict of observations compiled"
    ),
    "test_dreamerv3_core.py::test_gradient_paths": "gradients of every loss term traced through the update",
    "test_tdmpc2_sb3.py::test_schedule_counts_seed_updates_then_one_per_step": (
        "TD-MPC2's schedule counted through learn past its seed phase"
    ),
    "test_tdmpc2_multitask.py::test_act_plans_each_env_for_its_own_task": (
        "a multi-task plan per env compiled"
    ),
    "test_sweeps.py::test_the_zoo_fails_a_dead_workers_trial_retries_it_and_keeps_the_budget[journal]": (
        "rl_zoo3 subprocesses on a journal file (the SQLite study stays in the first tier)"
    ),
    "test_sweeps.py::test_the_zoo_fails_a_dead_workers_trial_retries_it_and_keeps_the_budget[postgresql]": (
        "rl_zoo3 subprocesses on a PostgreSQL server (the SQLite study stays in the first tier)"
    ),
    "test_gather_free.py::test_the_gather_free_programs_have_no_gathers_scatters_or_sorts[dreamerv3]": (
        "DreamerV3's update lowered over seeds and alone (TD-MPC2's stays in the first tier)"
    ),
    "test_seeds_core.py::test_a_group_of_seeds_trains_as_each_seed_alone[tdmpc2-vector]": (
        "TD-MPC2's update compiled over seeds and alone (its plan's equality stays in the first tier)"
    ),
    "test_sb3_drop_in.py::test_save_load_replay_buffer[DreamerV3]": (
        "SB3's replay-buffer save/load test on DreamerV3 (TD-MPC2's stays in the first tier)"
    ),
    "test_boundary_fidelity.py::test_every_matmul_is_pinned_to_float32[dreamerv3]": (
        "DreamerV3's update and acting step lowered (TD-MPC2's stay in the first tier)"
    ),
    "test_sb3_drop_in.py::test_warn_buffer[DreamerV3]": (
        "SB3's replay-buffer warning test on DreamerV3 (TD-MPC2's stays in the first tier)"
    ),
    "test_dreamerv3_sb3.py::test_world_model_callback_phases": (
        "DreamerV3 trained with callbacks twice (tests/test_family.py follows every agent's callbacks)"
    ),
    "test_mesa_bundle.py::test_the_bundle_renders_from_its_own_folder_as_the_system_does": (
        "Mesa packed and dm_control rendered in subprocesses with it and with the system's"
    ),
    "test_breaks.py::test_each_tdmpc2_switch_changes_its_term": (
        "TD-MPC2's update compiled once per break switch (tools/break_one_term.py runs every break)"
    ),
}
"""Single tests of the second tier: ``file::function`` (every parametrisation) or ``file::function[id]``."""


def _is_extended(item: pytest.Item) -> bool:
    name = getattr(item, "originalname", item.name)
    return (
        item.path.name in EXTENDED_FILES
        or f"{item.path.name}::{name}" in EXTENDED_TESTS
        or f"{item.path.name}::{item.name}" in EXTENDED_TESTS
    )


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the second tier; without the ``dmc`` extra (Python 3.13 has no dm_control wheel), skip the
    tests that build dm_control tasks (their code names them) instead of failing them."""
    for item in items:
        if _is_extended(item):
            item.add_marker(pytest.mark.extended)
    if _has_dm_control():
        return
    import inspect

    skip = pytest.mark.skip(reason="needs the dmc extra (dm_control), not installed")
    for item in items:
        function = getattr(item, "function", None)
        source = inspect.getsource(function) if function is not None else ""
        if "dm_control" in source or "dmc" in source or "cartpole-balance" in source:
            item.add_marker(skip)

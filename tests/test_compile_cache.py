"""The persistent compilation cache (``blocks.compile_cache``): which folder a process gets, and that a
second process of the same configuration loads every agent program the first compiled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from sb3_worldmodels.blocks import compile_cache
from sb3_worldmodels.blocks.compile_cache import (
    CACHE_ENV,
    CACHE_MAX_BYTES,
    MIN_COMPILE_SECONDS,
    choose_cache,
    compilation_cache_dir,
)
from sb3_worldmodels.blocks.jit import cache_events

ROOT = Path(__file__).resolve().parents[1]

FRESH_JAX = {
    "jax_enable_compilation_cache": True,
    "jax_compilation_cache_dir": None,
    "jax_persistent_cache_min_compile_time_secs": 1.0,
    "jax_compilation_cache_max_size": -1,
}
"""JAX's settings in a process that configured none."""


def test_the_default_folder_is_in_the_users_cache_directory_with_a_size_limit_and_threshold(tmp_path):
    choice = choose_cache({"XDG_CACHE_HOME": str(tmp_path)}, FRESH_JAX)
    folder = tmp_path / "sb3_worldmodels" / "jax"
    assert choice.settings == {
        "jax_persistent_cache_min_compile_time_secs": MIN_COMPILE_SECONDS,
        "jax_compilation_cache_max_size": CACHE_MAX_BYTES,
        "jax_compilation_cache_dir": str(folder),
    }
    assert list(choice.settings)[-1] == "jax_compilation_cache_dir"  # set last: the cache starts complete
    assert folder.is_dir() and not list(folder.iterdir())  # created; the write check leaves nothing
    assert folder.stat().st_mode & 0o077 == 0  # its owner's only: the entries are programs it runs
    assert choice.warning is None


def test_the_variable_names_the_folder_or_switches_the_cache_off(tmp_path):
    chosen = choose_cache({CACHE_ENV: str(tmp_path / "mine")}, FRESH_JAX)
    assert chosen.settings["jax_compilation_cache_dir"] == str(tmp_path / "mine")
    for off in ("off", "OFF", "0", "false", "no"):
        choice = choose_cache({CACHE_ENV: off, "XDG_CACHE_HOME": str(tmp_path)}, FRESH_JAX)
        assert choice.settings == {} and CACHE_ENV in choice.reason
    assert not (tmp_path / "sb3_worldmodels").exists()


def test_jaxs_own_settings_are_never_overridden(tmp_path):
    environ = {"XDG_CACHE_HOME": str(tmp_path)}
    assert choose_cache(environ, {**FRESH_JAX, "jax_compilation_cache_dir": "/theirs"}).settings == {}
    assert choose_cache(environ, {**FRESH_JAX, "jax_enable_compilation_cache": False}).settings == {}
    # Their threshold and size limit, given as values or through JAX's variables, are kept.
    theirs = {
        **FRESH_JAX,
        "jax_persistent_cache_min_compile_time_secs": 3.0,
        "jax_compilation_cache_max_size": 7,
    }
    assert set(choose_cache(environ, theirs).settings) == {"jax_compilation_cache_dir"}
    by_variables = {
        **environ,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1",
        "JAX_COMPILATION_CACHE_MAX_SIZE": "-1",
    }
    assert set(choose_cache(by_variables, FRESH_JAX).settings) == {"jax_compilation_cache_dir"}


def test_an_unwritable_folder_warns_once_and_runs_without_the_cache(tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("")
    folder = tmp_path / "a_file" / "jax"  # under a file: not even root can create it
    choice = choose_cache({CACHE_ENV: str(folder)}, FRESH_JAX)
    assert choice.settings == {}
    assert choice.warning is not None and str(folder) in choice.warning and CACHE_ENV in choice.warning

    monkeypatch.setenv(CACHE_ENV, str(folder))
    monkeypatch.setattr(compile_cache, "current_jax_settings", lambda: dict(FRESH_JAX))
    monkeypatch.setattr(compile_cache, "_choice", None)  # this process's choice, made again here
    dir_before = jax.config.jax_compilation_cache_dir
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = compile_cache.use_compilation_cache()
        second = compile_cache.use_compilation_cache()
    assert [str(w.message) for w in caught] == [choice.warning]
    assert first is second and first.settings == {}
    assert jax.config.jax_compilation_cache_dir == dir_before


def test_cache_events_name_the_programs_the_cache_answered():
    if compilation_cache_dir() is None:
        pytest.skip("this run has no persistent compilation cache (SB3WM_TEST_JAX_CACHE=0)")
    constant = float(uuid.uuid4().int % 10_000)  # a program no earlier run wrote

    def program() -> jax.stages.Wrapped:
        def cache_events_probe(x: jax.Array) -> jax.Array:
            return jnp.tanh(x) * constant

        return jax.jit(cache_events_probe)

    threshold = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    try:
        x = jnp.ones(3)
        with cache_events() as first:
            program()(x).block_until_ready()
        with cache_events() as second:  # another function object: traced and lowered again, not compiled
            program()(x).block_until_ready()
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", threshold)
    name = "jit(cache_events_probe)"
    assert name in first.misses and name in first.written and name not in first.hits
    assert second.hits == [name] and second.misses == [] and second.written == []


def run_fresh_process(xdg_cache_home: Path) -> dict:
    """tests/compile_cache_run.py with the package's default cache under ``xdg_cache_home``: none of
    this run's JAX cache settings (conftest) and no SB3WM_COMPILATION_CACHE."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE")) and k != CACHE_ENV
    }
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        XDG_CACHE_HOME=str(xdg_cache_home),
        JAX_PLATFORMS="cpu",
    )
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "compile_cache_run.py")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-5000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_every_agent_program_the_first_compiled(tmp_path):
    """Two identical processes train a tiny TD-MPC2 one after the other: the first finds nothing and
    writes its agent programs, the second loads each of them and compiles none of them. Both compile
    the same eager operations, which are not written while they compile faster than the cache's
    threshold; on a loaded machine one may take longer in the second process and be written then."""
    first = run_fresh_process(tmp_path)
    second = run_fresh_process(tmp_path)
    folder = tmp_path / "sb3_worldmodels" / "jax"
    assert first["cache_dir"] == second["cache_dir"] == str(folder)
    assert first["n_updates"] == second["n_updates"] > 0
    agent_programs = {"jit(init_params)", "jit(counted_train_step)", "jit(act)"}
    assert first["hits"] == [] and agent_programs <= set(first["written"])
    assert sorted(second["hits"]) == sorted(first["written"])
    assert not set(second["misses"]) & set(first["written"])  # nothing the first wrote compiled again
    assert set(second["written"]) <= set(first["misses"]) - set(first["written"])  # eager ops only
    assert sorted(second["misses"]) == sorted(m for m in first["misses"] if m not in first["written"])
    assert len(list(folder.glob("*-cache"))) == len(first["written"]) + len(second["written"])

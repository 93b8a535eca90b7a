"""Test-session set-up: one JAX persistent compilation cache shared by the whole run.

Compilation dominates the suite (each configuration compiles its update and acting step for tens
of seconds), and many test files build the same tiny configurations: the pytest-xdist workers and
the ``rl_zoo3`` subprocesses all inherit ``JAX_COMPILATION_CACHE_DIR`` set here, so a computation
compiled by one is loaded by the others. The cache is keyed by the compiled program itself, so a hit
can only return the same executable. A run that sets ``JAX_COMPILATION_CACHE_DIR`` itself keeps it;
``SB3WM_TEST_JAX_CACHE=0`` switches the shared cache off.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import pytest

_OWNED_CACHE: list[str] = []

# dm_control picks its OpenGL backend when first imported, which a plugin may do before any test
# (through shimmy): headless EGL for the pixel tests, unless the run chose a backend or has a display.
if "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
    os.environ["MUJOCO_GL"] = "egl"


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: it inherited the controller's settings
        return
    if os.environ.get("SB3WM_TEST_JAX_CACHE") == "0" or "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without the ``dmc`` extra (Python 3.13 has no dm_control wheel), skip the tests that build
    dm_control tasks (their code names them) instead of failing them."""
    if _has_dm_control():
        return
    import inspect

    skip = pytest.mark.skip(reason="needs the dmc extra (dm_control), not installed")
    for item in items:
        function = getattr(item, "function", None)
        source = inspect.getsource(function) if function is not None else ""
        if "dm_control" in source or "dmc" in source or "cartpole-balance" in source:
            item.add_marker(skip)

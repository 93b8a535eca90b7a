"""JAX's persistent compilation cache, on by default for the agents' programs: a second process of the
same configuration loads its compiled programs from disk instead of compiling them again.

:func:`use_compilation_cache` runs once per process, when the first agent program is built
(:class:`~sb3_worldmodels.blocks.jit.AgentFunction`), not at import. It points JAX's cache
(``jax_compilation_cache_dir``) at :func:`default_cache_dir`, unless:

- ``SB3WM_COMPILATION_CACHE=off`` (also ``0``, ``false``, ``no``): no cache;
- JAX's own cache is already configured (``JAX_COMPILATION_CACHE_DIR``, ``jax.config.update(
  "jax_compilation_cache_dir", ...)``) or switched off (``jax_enable_compilation_cache=False``):
  JAX's settings are left as they are;
- the folder cannot be written: one warning, and the process runs without the cache.

``SB3WM_COMPILATION_CACHE=/some/dir`` chooses the folder. Its entries are compiled programs that the
process runs: a folder it creates is its owner's only, and one that others can write must not be
given. JAX keys each entry by the program, the
compiler options, the jax/jaxlib version, the backend and its version and ``XLA_FLAGS``, so an entry
is only loaded by a process that would have compiled the same program.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import tempfile
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

CACHE_ENV = "SB3WM_COMPILATION_CACHE"
"""The environment variable: ``off`` (or ``0``, ``false``, ``no``) switches the cache off, a path
chooses its folder; unset, empty or ``on``: :func:`default_cache_dir`."""

OFF_VALUES = ("off", "0", "false", "no")
ON_VALUES = ("", "on", "1", "true", "yes")

CACHE_MAX_BYTES = 2 * 2**30
"""The cache's size limit (``jax_compilation_cache_max_size``): past it JAX deletes the least recently
used entries. One small agent's programs take 1-2 MB on a CPU."""

MIN_COMPILE_SECONDS = 0.2
"""Programs that compile faster than this are not written (``jax_persistent_cache_min_compile_time_secs``;
JAX's default, 1 s, would leave out the smallest agent programs: the smoke DreamerV3's acting step
compiles in 0.9 s on a 2-core Xeon). An eager operation on a new shape compiles in 5-50 ms and loads
in 2-9 ms: not worth one file each in a folder whose size limit scans every file at each write."""

JAX_SETTINGS = (
    "jax_enable_compilation_cache",
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_compilation_cache_max_size",
)
"""The JAX settings :func:`choose_cache` reads."""

JAX_DEFAULTS = {"jax_persistent_cache_min_compile_time_secs": 1.0, "jax_compilation_cache_max_size": -1}
"""JAX's own defaults (jax 0.10) of the settings set here: another value was the user's and is kept
(as is one given through its environment variable)."""


@dataclasses.dataclass(frozen=True)
class CacheChoice:
    """What :func:`use_compilation_cache` does: the JAX settings to update (none: JAX left as it is),
    why, and a warning to give."""

    settings: dict[str, Any]
    reason: str
    warning: str | None = None


def default_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_CACHE_HOME/sb3_worldmodels/jax``, else ``~/.cache/sb3_worldmodels/jax``."""
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sb3_worldmodels" / "jax"


def current_jax_settings() -> dict[str, Any]:
    """The values of :data:`JAX_SETTINGS` in this process."""
    return {name: getattr(jax.config, name) for name in JAX_SETTINGS}


def choose_cache(environ: Mapping[str, str], jax_settings: Mapping[str, Any]) -> CacheChoice:
    """The cache a process with these environment variables and JAX settings gets (module docstring);
    the folder is created here if missing, and written once to check it can be."""
    value = environ.get(CACHE_ENV, "").strip()
    if value.lower() in OFF_VALUES:
        return CacheChoice({}, f"{CACHE_ENV}={value}")
    if not jax_settings["jax_enable_compilation_cache"]:
        return CacheChoice({}, "JAX's cache is switched off (jax_enable_compilation_cache)")
    if jax_settings["jax_compilation_cache_dir"]:
        return CacheChoice({}, f"JAX's own cache folder: {jax_settings['jax_compilation_cache_dir']}")
    folder = default_cache_dir(environ) if value.lower() in ON_VALUES else Path(value).expanduser()
    problem = _unwritable(folder)
    if problem is not None:
        return CacheChoice(
            {},
            f"{folder} cannot be written",
            f"The compilation cache folder {folder} cannot be written ({problem}): this process runs "
            f"without the persistent compilation cache and compiles every program. Set {CACHE_ENV} to "
            "a writable folder, or to off.",
        )
    settings: dict[str, Any] = {}
    for name, ours in (
        ("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS),
        ("jax_compilation_cache_max_size", CACHE_MAX_BYTES),
    ):
        if name.upper() not in environ and jax_settings[name] == JAX_DEFAULTS[name]:
            settings[name] = ours
    warning = None
    if "jax_compilation_cache_max_size" in settings and importlib.util.find_spec("filelock") is None:
        del settings["jax_compilation_cache_max_size"]  # JAX's size limit locks the folder with filelock
        warning = (
            f"filelock is not installed: the compilation cache in {folder} has no size limit "
            f"(pip install filelock for a limit of {CACHE_MAX_BYTES / 2**30:g} GiB)."
        )
    settings["jax_compilation_cache_dir"] = str(folder)  # last: the cache starts with the others set
    return CacheChoice(settings, f"{folder}", warning)


_lock = threading.Lock()
_choice: CacheChoice | None = None


def use_compilation_cache() -> CacheChoice:
    """Turn JAX's persistent compilation cache on, once per process (module docstring): what was
    done, the same every call."""
    global _choice
    with _lock:
        if _choice is None:
            _choice = choose_cache(os.environ, current_jax_settings())
            if _choice.warning is not None:
                warnings.warn(_choice.warning, stacklevel=2)
            for name, value in _choice.settings.items():
                jax.config.update(name, value)
        return _choice


def compilation_cache_dir() -> str | None:
    """The folder JAX's persistent cache uses in this process now (ours or the user's own), or None
    when it has none."""
    settings = current_jax_settings()
    return settings["jax_compilation_cache_dir"] if settings["jax_enable_compilation_cache"] else None


def _unwritable(folder: Path) -> str | None:
    """Why ``folder`` (created if missing) cannot hold the cache's files, or None when it can."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)  # new: its owner's only (entries are code)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as error:
        return f"{type(error).__name__}: {error.strerror or error}"
    return None

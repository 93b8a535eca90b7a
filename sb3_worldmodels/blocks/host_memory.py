"""glibc's allocator set to keep freed memory for the next jitted call, on Linux, at import, when asked
(``SB3WM_MALLOC=on``); by default glibc is left as it is.

XLA's CPU runtime allocates each call's temporary buffers as one block (340 MB for a DreamerV3
"1m" update at 16 x 64) from one of its threads. glibc serves a block that large from a fresh
``mmap`` and unmaps it when freed, so every call touches every page of it anew: 87,116 page faults
per update. :func:`keep_freed_memory` sets glibc's ``mallopt`` so that freed memory stays in the
process for the next call: one arena for all threads (``M_ARENA_MAX`` 1; a thread's own arena could
not hold the block and would map it anyway), no ``mmap`` for large blocks (``M_MMAP_MAX`` 0) and no
trimming of the heap's free top below 2 GiB (``M_TRIM_THRESHOLD``).

Why it is not the default: in a process that compiles a program, XLA's compiler leaves the single
arena in a state where the small aligned allocations of every later call (the thunk executor's and
YNNPACK's, from several threads) spend their time in glibc's ``_int_malloc``: a DreamerV3 "1m"
update then takes 516-532 ms instead of 362-387 with glibc left alone, a TD-MPC2 agent step
1.1-1.2x as long, and the compiles 1.5-1.7x (Intel Xeon, AVX-512, 2026-12-06,
``benchmarks/allocator_speed.py``). Only a process that loads every program from the compilation
cache and compiles none gains (the update 325-335 ms instead of 356-377). A learning run compiles
its programs the first time, so the setting is for runs that start from a warm cache and compile
nothing else.

It runs once, when ``sb3_worldmodels`` is imported: threads that already took an arena (JAX's, when
the process ran JAX programs before the import) keep theirs. Never applied where the process chose
its allocator: glibc's own settings (``GLIBC_TUNABLES`` with ``glibc.malloc``, ``MALLOC_ARENA_MAX``
or any other ``MALLOC_*`` variable), another allocator (``LD_PRELOAD``), a C library other than
glibc.
"""

from __future__ import annotations

import ctypes
import os
import sys

MALLOC_ENV = "SB3WM_MALLOC"
"""``on`` (or ``1``, ``true``, ``yes``) sets glibc's allocator at import (:func:`keep_freed_memory`);
unset or anything else leaves it as it is."""

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
"""glibc's ``mallopt`` parameters (malloc.h)."""

SETTINGS: tuple[tuple[int, int], ...] = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1))
"""(parameter, value) pairs, in the order they are set."""

_applied: bool | None = None


def users_own_allocator_settings(environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Whether the process chose its allocator or glibc's settings itself (environment variables)."""
    environ = os.environ if environ is None else environ
    if "glibc.malloc" in environ.get("GLIBC_TUNABLES", "") or environ.get("LD_PRELOAD", "").strip():
        return True
    return any(k.startswith("MALLOC_") for k in environ)


def keep_freed_memory() -> bool:
    """Set :data:`SETTINGS` in glibc once per process where :data:`MALLOC_ENV` asks for it; True where
    they were set (see the module)."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get(MALLOC_ENV, "").strip().lower() not in ("on", "1", "true", "yes"):
        return False
    if not sys.platform.startswith("linux") or users_own_allocator_settings():
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        if not hasattr(libc, "gnu_get_libc_version"):  # not glibc: other mallopt parameters
            return False
    except OSError:
        return False
    _applied = all(libc.mallopt(param, value) == 1 for param, value in SETTINGS)
    return _applied

"""glibc's allocator set to keep freed memory for the next jitted call, on Linux, at import.

XLA's CPU runtime allocates each call's temporary buffers as one block (340 MB for a DreamerV3
"1m" update at 16 x 64) from the thread that runs the program. glibc serves a block that large from a
fresh ``mmap`` and unmaps it when freed, so every call touches every page of it anew: 87,116 page
faults per update, a quarter of its time on an Intel Xeon KVM guest (docs/performance.md, The memory
allocator). :func:`keep_freed_memory` sets glibc's ``mallopt`` so that freed memory stays in the
process for the next call: one arena for all threads (``M_ARENA_MAX`` 1; a thread's own arena could
not hold the block and would map it anyway), no ``mmap`` for large blocks (``M_MMAP_MAX`` 0) and no
trimming of the heap's free top below 2 GiB (``M_TRIM_THRESHOLD``). The process keeps its peak heap
resident, as jemalloc's ``retain`` does. Unlike jemalloc's, glibc's small allocations may take a piece
of a freed block, so on a busy machine a call now and then grows the heap again (and faults its pages).

It runs once, when ``sb3_worldmodels`` is imported: threads that already took an arena (JAX's, when
the process ran JAX programs before the import) keep theirs, so the gain needs the import first.
Left alone: ``SB3WM_MALLOC=off`` (also ``0``, ``false``, ``no``); a process that set glibc's own
settings (``GLIBC_TUNABLES`` with ``glibc.malloc``, ``MALLOC_ARENA_MAX`` or any other ``MALLOC_*``
variable) or preloads another allocator (``LD_PRELOAD``); a C library other than
glibc.
"""

from __future__ import annotations

import ctypes
import os
import sys

MALLOC_ENV = "SB3WM_MALLOC"
"""``off`` (or ``0``, ``false``, ``no``) leaves glibc's allocator as it is."""

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
    """Set :data:`SETTINGS` in glibc once per process; True where they were set (see the module)."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get(MALLOC_ENV, "").strip().lower() in ("off", "0", "false", "no"):
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

"""With SB3WM_MALLOC=on glibc's allocator keeps freed memory for the next jitted call; by default it is
left as it is (blocks/host_memory.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from sb3_worldmodels.blocks.host_memory import MALLOC_ENV, users_own_allocator_settings

# A program whose temporaries (two or three of 40 MB, above glibc's largest mmap threshold) XLA allocates
# per call; the page faults of each of the last 20 of 40 calls. With the setting the heap grows over the
# first calls until the freed blocks fit the next call's (about ten calls), then almost none: on a busy
# machine a small allocation of another thread now and then splits a freed block, and the heap grows
# once more (a call or two of the last 20 fault its temporaries' pages).
PROGRAM = """
import resource
import sb3_worldmodels
import jax, jax.numpy as jnp
from sb3_worldmodels.blocks import host_memory
f = jax.jit(lambda x: jnp.cumsum(x * 2.0).sum())
x = jnp.ones((10_000_000,), jnp.float32)
faults = []
for _ in range(40):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(host_memory._applied, " ".join(map(str, faults[-20:])))
"""


def page_faults_of_the_last_calls(setting: str | None) -> tuple[str, list[int]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    env.pop(MALLOC_ENV, None)
    env["GLIBC_TUNABLES"] = ""
    if setting is not None:
        env[MALLOC_ENV] = setting
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, check=True)
    applied, *faults = out.stdout.split()
    return applied, [int(f) for f in faults]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_the_next_call_reuses_the_freed_temporaries():
    applied, kept = page_faults_of_the_last_calls("on")
    assert applied == "True"
    applied, unmapped = page_faults_of_the_last_calls(None)
    assert applied == "False"
    assert min(unmapped) > 9_000  # every call: a 40 MB temporary is 9,766 pages
    assert np.median(kept) < 100 and sum(kept) < sum(unmapped) / 5, (kept, unmapped)


def test_a_process_that_chose_its_allocator_is_left_alone():
    assert not users_own_allocator_settings({})
    assert not users_own_allocator_settings({"GLIBC_TUNABLES": "glibc.rtld.nns=2", "LD_PRELOAD": " "})
    assert users_own_allocator_settings({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert users_own_allocator_settings({"MALLOC_ARENA_MAX": "4"})
    assert users_own_allocator_settings({"MALLOC_TRIM_THRESHOLD_": "0"})
    assert users_own_allocator_settings({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"})

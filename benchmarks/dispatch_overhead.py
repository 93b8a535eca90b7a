"""What a jitted call costs per array it takes and returns: the same bytes split into more or fewer
arrays, on the backend JAX picks.

    python benchmarks/dispatch_overhead.py                  # 16 MB (TD-MPC2 size 1's state)
    python benchmarks/dispatch_overhead.py --megabytes 71   # size 5's

An agent's training call takes its whole state (parameters, optimiser moments, target networks,
normalisers, keys: 170 arrays for TD-MPC2) and returns the new one. On an accelerator a call whose
device work is a fraction of a millisecond can still take milliseconds if each argument and result
costs the runtime something. Three programs over N float32 arrays of ``--megabytes`` in all, each
timed ``--repeats`` times (median, waited for), for N in ``--arrays``:

- ``update``: every array + 1, the inputs donated (an update's shape: state in, state out);
- ``read``: the sum of every array's first element, one scalar out (arguments alone);
- ``fresh``: N arrays of zeros out, no arguments (results alone).

One JSON line per (program, N): milliseconds median and min, and microseconds per array beyond the
one-array call. Then ``chain``: one array through K dependent small matmuls (128 x 128, float32, which
XLA cannot fuse into one op) in one program, for K in ``--chain``: what each op of a program costs
beyond its arithmetic (microseconds per op beyond K = 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from evaluation import run_record  # noqa: E402

from sb3_worldmodels.blocks.cpu import cpu_info  # noqa: E402


def timed(fn, args: tuple, repeats: int, chain: bool = False) -> list[float]:  # noqa: ANN001
    """Seconds of ``repeats`` calls of ``fn(*args)``, each waited for; ``chain``: each call takes the
    previous call's result (its inputs donated)."""
    out = fn(*args)
    jax.block_until_ready(out)
    times = []
    for _ in range(repeats):
        args = (out,) if chain else args
        start = time.perf_counter()
        out = fn(*args)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - start)
    return times


def arrays(n: int, total_floats: int) -> list[jax.Array]:
    size = max(1, total_floats // n)
    return [jnp.zeros((size,), jnp.float32) + i for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--megabytes", type=float, default=16.0)
    parser.add_argument("--arrays", type=int, nargs="+", default=[1, 10, 50, 170, 500])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--chain", type=int, nargs="+", default=[1, 100, 800])
    args = parser.parse_args()
    total = int(args.megabytes * 1e6 / 4)
    rows = []
    for n in args.arrays:
        size = max(1, total // n)
        update = jax.jit(lambda xs: [x + 1.0 for x in xs], donate_argnums=0)
        read = jax.jit(lambda xs: sum(x[0] for x in xs))
        fresh = jax.jit(lambda n=n, size=size: [jnp.zeros((size,), jnp.float32) for _ in range(n)])
        state = arrays(n, total)
        jax.block_until_ready(state)
        timings = {
            "update": timed(update, (arrays(n, total),), args.repeats, chain=True),
            "read": timed(read, (state,), args.repeats),
            "fresh": timed(fresh, (), args.repeats),
        }
        for name, times in timings.items():
            ms = [1e3 * t for t in times]
            rows.append({"program": name, "arrays": n, "ms_median": statistics.median(ms), "ms_min": min(ms)})
    for k in args.chain:
        weight = jnp.eye(128, dtype=jnp.float32) * 0.5

        def chain(x: jax.Array, k: int = k, weight: jax.Array = weight) -> jax.Array:
            for _ in range(k):
                x = jnp.tanh(x @ weight)
            return x

        ms = [1e3 * t for t in timed(jax.jit(chain), (jnp.ones((128, 128), jnp.float32),), args.repeats)]
        rows.append({"program": "chain", "arrays": k, "ms_median": statistics.median(ms), "ms_min": min(ms)})
    smallest = {"chain": min(args.chain)}
    base = {
        r["program"]: r["ms_median"]
        for r in rows
        if r["arrays"] == smallest.get(r["program"], min(args.arrays))
    }
    machine = {**run_record(), **cpu_info().as_dict()}
    for r in rows:
        extra = r["arrays"] - smallest.get(r["program"], min(args.arrays))
        per = "us_per_op" if r["program"] == "chain" else "us_per_array"
        r[per] = round(1e3 * (r["ms_median"] - base[r["program"]]) / extra, 2) if extra else None
        r["ms_median"], r["ms_min"] = round(r["ms_median"], 3), round(r["ms_min"], 3)
        r.update(megabytes=args.megabytes, jax=jax.__version__, **machine)
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()

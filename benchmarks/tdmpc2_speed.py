"""TD-MPC2 speed on Pendulum-v1-shaped inputs (obs 3, action 1): plan and update milliseconds, compile
seconds and agent steps per second (one plan and one update per agent step, as after the seed phase).

    python benchmarks/tdmpc2_speed.py --size 1 --size 5 --repeats 20
    python benchmarks/tdmpc2_speed.py --size 1 --size 5 --observation vector --observation pixels
    PYTHONPATH=/tmp/base python benchmarks/tdmpc2_speed.py --size 1 --impl sb3wm_base --impl sb3_worldmodels
    python benchmarks/tdmpc2_speed.py --size 1 --compute-dtype float32 --compute-dtype bfloat16
    python benchmarks/tdmpc2_speed.py --size 1 --observation pixels --pixel-methods lax/slice \
        --pixel-methods patches/matmul      # the encoder's convolutions / shift computed other ways

Each timing is a median over ``--repeats`` calls after compilation; plans and updates of every
(size, implementation, compute dtype) row are timed round-robin in one process, so a busy neighbour on
the CPU affects every row alike. ``--impl`` names a package with the layout of ``sb3_worldmodels``
(e.g. an older commit's copy, renamed, on PYTHONPATH) to compare side by side. ``--pixel-methods
CONV/SHIFT`` compiles the pixel programs with ``blocks.convolution.conv2d``'s method CONV and
``blocks.images.shift_images``'s method SHIFT instead of the backend's defaults (one row per value).
Compile times are of compiles: the package's persistent compilation cache is off
(``SB3WM_COMPILATION_CACHE=off`` unless set). Prints one JSON line per row.

``--reference-src`` (the reference's ``tdmpc2/`` folder, nicklashansen/tdmpc2 @ b67b21c) and
``--reference-python`` (a Python with its dependencies) add the reference PyTorch code to the same
round robin, one worker process per size (``reference_tdmpc2_worker.py``; each call timed inside it):

    python benchmarks/tdmpc2_speed.py --size 1 --repeats 15 \
        --reference-src /path/to/tdmpc2/tdmpc2 --reference-python /path/to/venv/bin/python
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from sb3_worldmodels.blocks.backend import scan_unroll  # noqa: E402
from sb3_worldmodels.blocks.cpu import cpu_info  # noqa: E402
from sb3_worldmodels.blocks.jit import cpu_options_name  # noqa: E402
from tools.profile_update import matmul_flops  # noqa: E402

PIXEL_SHAPE = (64, 64, 9)
"""Three stacked 64 x 64 RGB frames, channel-last, as ``make_dmc_env(task, pixels=True, frame_stack=3)``."""


@contextlib.contextmanager
def pixel_methods(impl: str, methods: str | None) -> Iterator[None]:
    """While tracing: ``impl``'s convolution and shift methods on this backend from "CONV/SHIFT" (None:
    the package's defaults). JAX's caches of traced functions are cleared on the way in and out: the
    methods are read while tracing, not part of a cache key."""
    if methods is None:
        yield
        return
    conv, shift = methods.split("/")
    backend = jax.default_backend()
    tables = [
        (importlib.import_module(f"{impl}.blocks.convolution").DEFAULT_CONV_METHOD, conv),
        (importlib.import_module(f"{impl}.blocks.images").DEFAULT_SHIFT_METHOD, shift),
    ]
    saved = [dict(table) for table, _ in tables]
    jax.clear_caches()
    try:
        for table, method in tables:
            table[backend] = method
        yield
    finally:
        for (table, _), before in zip(tables, saved, strict=True):
            table.clear()
            table.update(before)
        jax.clear_caches()


def build(
    size: int,
    obs_dim: int,
    action_dim: int,
    impl: str = "sb3_worldmodels",
    pixels: bool = False,
    compute_dtype: str | None = None,
    methods: str | None = None,
    options: dict | None = None,
) -> dict:
    """Compiled plan and update of one model size on random inputs; ``pixels``: 64 x 64 images of
    three stacked RGB frames (uint8, 9 channels) instead of the vector, the encoder's ``num_channels``
    = latent_dim / 16 (size 1: 8; size 5: 32, the reference's default); ``compute_dtype``: the
    config's (None: its default, the only choice of packages without the setting); ``options``: XLA
    compiler options (default: the package's for this backend, ``blocks.jit.backend_compiler_options``,
    or ``COMPILER_OPTIONS`` in a package without it)."""
    core = importlib.import_module(f"{impl}.tdmpc2.agent")
    preset = importlib.import_module(f"{impl}.tdmpc2.config").preset
    if options is None:
        jit_module = importlib.import_module(f"{impl}.blocks.jit")
        backend_options = getattr(jit_module, "backend_compiler_options", None)
        options = jit_module.COMPILER_OPTIONS if backend_options is None else backend_options()
    flag = "deterministic" if "deterministic" in inspect.signature(core.act).parameters else "eval_mode"
    act_jit = jax.jit(core.act, static_argnames=("config", flag), compiler_options=options)
    train_many_jit = jax.jit(core.train_many, static_argnames=("config",), compiler_options=options)
    dtype = {} if compute_dtype is None else {"compute_dtype": compute_dtype}
    config = preset(size, obs_dim=obs_dim, action_dim=action_dim, discount=0.975, **dtype)
    if pixels:
        config = config.replace(obs_dim=0, image_shape=PIXEL_SHAPE, num_channels=config.latent_dim // 16)
    state = core.init_state(config, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    h, b = config.horizon, config.batch_size

    def observations(*shape: int) -> jax.Array:
        if pixels:
            return jnp.asarray(rng.integers(0, 256, size=(*shape, *PIXEL_SHAPE)), jnp.uint8)
        return jnp.asarray(rng.normal(size=(*shape, obs_dim)), jnp.float32)

    batch = {
        "obs": observations(1, h + 1, b),
        "action": jnp.asarray(rng.uniform(-1, 1, size=(1, h, b, action_dim)), jnp.float32),
        "reward": jnp.asarray(rng.normal(size=(1, h, b)), jnp.float32),
        "terminated": jnp.zeros((1, h, b), jnp.float32),
    }
    obs = observations(1)
    prev = jnp.zeros((1, h, action_dim), jnp.float32)
    first = jnp.zeros((1,), bool)
    key = jax.random.PRNGKey(1)
    with pixel_methods(impl, methods):
        t = time.perf_counter()
        plan = act_jit.lower(config, state.params, obs, prev, first, key).compile()
        plan_compile = time.perf_counter() - t
        t = time.perf_counter()
        update = train_many_jit.lower(config, state, batch).compile()
        update_compile = time.perf_counter() - t
    jax.block_until_ready(plan(state.params, obs, prev, first, key))
    state2 = jax.block_until_ready(update(state, batch))[0]
    row = {
        "impl": impl,
        "size": size,
        "observation": "pixels 64x64x9" if pixels else f"vector {obs_dim}",
        "compute_dtype": getattr(config, "compute_dtype", "float32"),
        **({"pixel_methods": methods} if methods else {}),
        # the replay's fields (TDMPC2._replay_fields): obs, float32 action, reward and terminated
        "replay_bytes_per_row": int(obs[0].nbytes + 4 * (action_dim + 2)),
        "plan_compile_s": round(plan_compile, 2),
        "update_compile_s": round(update_compile, 2),
        "plan_times": [],
        "update_times": [],
    }
    current = state2

    def time_plan() -> float:
        t = time.perf_counter()
        jax.block_until_ready(plan(current.params, obs, prev, first, key))
        return time.perf_counter() - t

    def time_update() -> float:
        nonlocal current
        t = time.perf_counter()
        current = jax.block_until_ready(update(current, batch)[0])
        return time.perf_counter() - t

    params = int(sum(x.size for x in jax.tree_util.tree_leaves(state2.params)))
    row.update(time_plan=time_plan, time_update=time_update, params=lambda: params)
    # The matmuls' arithmetic (2 FLOPs per multiply-add, from the traced programs): the floor of a step
    # on a chip is this over its matmul rate (six bfloat16 passes per float32 matmul on a TPU).
    with pixel_methods(impl, methods):
        plan_jaxpr = jax.make_jaxpr(lambda *a: core.act(config, *a))(state.params, obs, prev, first, key)
        update_jaxpr = jax.make_jaxpr(lambda *a: core.train_many(config, *a))(state, batch)
    row["plan_gflop"] = round(matmul_flops(plan_jaxpr.jaxpr) / 1e9, 2)
    row["update_gflop"] = round(matmul_flops(update_jaxpr.jaxpr) / 1e9, 2)
    return row


def build_reference(size: int, obs_dim: int, action_dim: int, src: str, python: str) -> dict:
    """The reference PyTorch agent in a worker process (``reference_tdmpc2_worker.py``)."""
    worker = Path(__file__).with_name("reference_tdmpc2_worker.py")
    command = [
        python,
        str(worker),
        "--src",
        src,
        "--size",
        str(size),
        "--obs-dim",
        str(obs_dim),
        "--action-dim",
        str(action_dim),
    ]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    ready = {}
    for line in proc.stdout:
        if line.startswith("{"):
            ready = json.loads(line)
            break
    if not ready.get("ready"):
        raise RuntimeError(f"the reference worker did not start: {' '.join(command)}")

    def ask(what: str) -> float:
        proc.stdin.write(what + "\n")
        return float(json.loads(proc.stdout.readline())[what])

    return {
        "impl": f"reference (torch {ready['torch']}, {ready['threads']} threads)",
        "size": size,
        "plan_compile_s": None,
        "update_compile_s": None,
        "plan_times": [],
        "update_times": [],
        "time_plan": lambda: ask("plan"),
        "time_update": lambda: ask("update"),
        "params": lambda: ready["params"],
        "peak_rss_mb": lambda: ask("peak_rss_mb"),
    }


def own_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, action="append")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--obs-dim", type=int, default=3)
    parser.add_argument("--action-dim", type=int, default=1)
    parser.add_argument("--impl", action="append", help="package to time (default sb3_worldmodels)")
    parser.add_argument(
        "--observation",
        choices=["vector", "pixels"],
        action="append",
        help="vector (--obs-dim values, the default) and/or pixels (64x64x9 uint8); both: side by side",
    )
    parser.add_argument(
        "--compute-dtype",
        choices=["auto", "float32", "bfloat16"],
        action="append",
        help="the configs' compute_dtype (default: the config's, float32); both: side by side",
    )
    parser.add_argument(
        "--pixel-methods",
        action="append",
        help="CONV/SHIFT: conv2d's and shift_images' methods for the pixel programs (default: the backend's)",
    )
    parser.add_argument("--reference-src", help="the reference's tdmpc2/ source folder (b67b21c)")
    parser.add_argument("--reference-python", default=sys.executable, help="Python for the reference")
    parser.add_argument("--out", type=Path, default=None, help="append the rows to this .jsonl file")
    args = parser.parse_args()
    os.environ.setdefault("SB3WM_COMPILATION_CACHE", "off")  # compile times of compiles, not of cache loads
    for methods in args.pixel_methods or []:
        if methods.count("/") != 1:
            parser.error(f"--pixel-methods takes CONV/SHIFT (e.g. lax/slice), got {methods!r}")
    builds = [
        build(size, args.obs_dim, args.action_dim, impl, observation == "pixels", dtype, methods)
        for size in args.size or [1, 5]
        for observation in args.observation or ["vector"]
        for impl in args.impl or ["sb3_worldmodels"]
        for dtype in args.compute_dtype or [None]
        for methods in ((args.pixel_methods or [None]) if observation == "pixels" else [None])
    ]
    if args.reference_src:
        builds += [
            build_reference(size, args.obs_dim, args.action_dim, args.reference_src, args.reference_python)
            for size in args.size or [1, 5]
        ]
    load_before = os.getloadavg()[0]
    for _ in range(args.repeats):
        for b in builds:
            b["plan_times"].append(b["time_plan"]())
            b["update_times"].append(b["time_update"]())
    ours: dict[int, dict] = {}  # per size, the first of ours: the reference's row gets the ratio to it
    for b in builds:
        if not b["impl"].startswith("reference"):
            ours.setdefault(b["size"], b)
    for b in builds:
        plan_ms = float(np.median(b["plan_times"]) * 1e3)
        update_ms = float(np.median(b["update_times"]) * 1e3)
        b["steps_per_s"] = 1e3 / (plan_ms + update_ms)
        row = {
            "impl": b["impl"],
            "size": b["size"],
            "observation": b.get("observation", f"vector {args.obs_dim}"),
            "compute_dtype": b.get("compute_dtype", "float32"),
            **({"pixel_methods": b["pixel_methods"]} if "pixel_methods" in b else {}),
            "replay_bytes_per_row": b.get("replay_bytes_per_row"),
            "params": b["params"](),
            "plan_ms": round(plan_ms, 1),
            "update_ms": round(update_ms, 1),
            "agent_steps_per_s": round(b["steps_per_s"], 2),
            "plan_compile_s": b["plan_compile_s"],
            "update_compile_s": b["update_compile_s"],
            **{key: b[key] for key in ("plan_gflop", "update_gflop") if key in b},
            "peak_rss_mb": round(b.get("peak_rss_mb", own_peak_rss_mb)()),
            "repeats": args.repeats,
            "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],  # 1 min, before/after
            "machine": f"{platform.machine()} {jax.devices()[0].platform}",
            **cpu_info().as_dict(),
            "cpu_options": cpu_options_name(),
            "jax": jax.__version__,
            "scan_unroll": scan_unroll(),  # SB3WM_SCAN_UNROLL
            "date": time.strftime("%Y-%m-%d"),
        }
        if b["impl"].startswith("reference"):
            # OpenMP's settings change how PyTorch's threads wait for each other on shared cores
            row["omp_env"] = {k: v for k, v in os.environ.items() if k.startswith("OMP_")}
            if b["size"] in ours:
                row["ours_over_reference"] = round(ours[b["size"]]["steps_per_s"] / b["steps_per_s"], 2)
        print(json.dumps(row), flush=True)
        if args.out:
            with args.out.open("a") as handle:
                handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

"""DreamerV3 speed benchmark: rows/s with and without compilation, updates/s, compile time, memory.

    python benchmarks/dreamerv3_speed.py --config seeds      # CartPole-v1, 4 envs, 8,000 rows, "1m",
                                                             # batch 8x16, train ratio 8
    python benchmarks/dreamerv3_speed.py --config paper      # CartPole-v1, "1m", 16 envs, 16x64, ratio 512
                                                             # (the learning checks' settings)
    python benchmarks/dreamerv3_speed.py --config default    # Pendulum-v1, "12m", 16 envs, 16x64, ratio 512
    python benchmarks/dreamerv3_speed.py --config update-1m  # one "1m" update at 16x64
    python benchmarks/dreamerv3_speed.py --config update-1m-pixels  # the same from 64x64x3 images
                                                             # (also update-12m, update-12m-pixels)
    python benchmarks/dreamerv3_speed.py --config update-1m --compute-dtype bfloat16
                                                             # any of them in bfloat16 (default "auto":
                                                             # float32 on a CPU, bfloat16 elsewhere)
    python benchmarks/dreamerv3_speed.py --config update-1m-pixels --conv-method blocks
                                                             # conv2d's method (default: the backend's)

The learning runs also report where the timed (post-compilation) seconds went: the env steps, the
policy step with its transfers, the replay writes, the replay sampling, the updates (the jitted
training calls with their transfers and latent write-backs) and the rest of SB3's loop.

``--reference-src`` (a checkout of danijar/dreamerv3 at 2411f7d + fix 29eb964, holding ``dreamerv3/`` and
``embodied/``) and ``--reference-python`` (a Python with its dependencies: jax 0.4.26, optax, chex,
tensorflow-probability 0.24, ...) add the reference's jitted training step to an ``update-1m`` or
``update-1m-pixels`` run: built in a worker process (``reference_dreamerv3_worker.py``) with the same sizes,
batch and spaces, its calls and ours timed round robin (``--repeats`` rounds), so that a busy neighbour on the
CPU slows both alike:

    python benchmarks/dreamerv3_speed.py --config update-1m --repeats 15 \
        --reference-src /path/to/dreamerv3 --reference-python /path/to/venv/bin/python \
        --out benchmarks/results/official_speed.jsonl

Compile times are of compiles: the package's persistent compilation cache is off
(``SB3WM_COMPILATION_CACHE=off`` unless set). Prints one JSON line per run (``--out`` appends it to a
.jsonl file too), with the CPU's model and vector extensions; copy the results into
docs/performance.md with the date.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from sb3_worldmodels import DreamerV3
from sb3_worldmodels.blocks.backend import scan_unroll
from sb3_worldmodels.blocks.convolution import CONV_METHODS, DEFAULT_CONV_METHOD
from sb3_worldmodels.blocks.cpu import cpu_info
from sb3_worldmodels.blocks.jit import cpu_options_name
from sb3_worldmodels.blocks.precision import COMPUTE_DTYPES, resolve_compute_dtype
from sb3_worldmodels.dreamerv3 import agent as core
from sb3_worldmodels.dreamerv3.config import ACCELERATOR_DTYPE, preset

CONFIGS = {
    "seeds": dict(
        env="CartPole-v1",
        n_envs=4,
        rows=8_000,
        kwargs=dict(model_size="1m", batch_size=8, batch_length=16, train_ratio=8),
    ),
    "paper": dict(
        env="CartPole-v1",
        n_envs=16,
        rows=3_000,  # about 1,000 updates after the first (training starts near 1,040 rows)
        kwargs=dict(model_size="1m", batch_size=16, batch_length=64, train_ratio=512),
    ),
    "default": dict(
        env="Pendulum-v1",
        n_envs=16,
        rows=1_300,  # about 120 "12m" updates after the first (each about 4 s on 2 cores)
        kwargs=dict(model_size="12m", batch_size=16, batch_length=64, train_ratio=512),
    ),
}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Stopwatch:
    """Seconds spent in chosen methods of live objects (each wrapped on the instance, so only this
    model's calls count)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)

    def wrap(self, owner: object, method: str, label: str) -> None:
        inner = getattr(owner, method)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start

        setattr(owner, method, timed)


def time_breakdown(model: DreamerV3) -> Stopwatch:
    """Time the parts of the training loop: the env, the policy step (with its transfers), the
    replay writes, the replay sampling and the training calls (jitted updates, their transfers and
    the latent write-back, the sampling excluded below)."""
    watch = Stopwatch()
    watch.wrap(model.env, "step", "env_step")
    watch.wrap(model, "_collect_act", "policy_step")
    watch.wrap(model, "_collect_observe", "replay_add")
    watch.wrap(model.replay_buffer, "sample", "replay_sample")
    watch.wrap(model, "train", "train_calls")
    return watch


def run_learning(name: str, seed: int, rows: int | None = None, compute_dtype: str = "auto") -> dict:
    spec = CONFIGS[name]
    rows = rows or spec["rows"]
    model = DreamerV3(
        spec["env"], n_envs=spec["n_envs"], seed=seed, compute_dtype=compute_dtype, **spec["kwargs"]
    )
    t0 = time.perf_counter()
    model.learn(model.n_envs)  # compiles the acting step
    while model._n_updates == 0:  # up to and including the first update (compiles it)
        model.learn(model.n_envs, reset_num_timesteps=False)
    t1 = time.perf_counter()
    warm_rows = model.num_timesteps
    updates0 = model._n_updates
    watch = time_breakdown(model)
    model.learn(rows - model.num_timesteps, reset_num_timesteps=False)
    t2 = time.perf_counter()
    rows = model.num_timesteps
    timed_updates = model._n_updates - updates0
    parts = dict(watch.seconds)
    parts["update"] = parts.pop("train_calls", 0.0) - parts.get("replay_sample", 0.0)
    parts["other"] = (t2 - t1) - sum(parts.values())
    return {
        "config": name,
        "env": spec["env"],
        "n_envs": spec["n_envs"],
        **spec["kwargs"],
        "compute_dtype": model._config.compute_dtype,
        "rows": rows,
        "updates": model._n_updates,
        "seconds_total": round(t2 - t0, 2),
        "rows_per_s_with_compile": round(rows / (t2 - t0), 1),
        "rows_per_s_after_compile": round((rows - warm_rows) / (t2 - t1), 1),
        "updates_per_s_after_compile": round(timed_updates / (t2 - t1), 2),
        "ms_per_row_after_compile": round(1000 * (t2 - t1) / (rows - warm_rows), 2),
        "warmup_rows": warm_rows,
        "warmup_seconds": round(t1 - t0, 2),
        "replay_bytes": model.replay_bytes_per_seed,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "share_of_timed_seconds": {k: round(v / (t2 - t1), 3) for k, v in parts.items()},
        "ms_per_update_in_loop": round(1000 * parts["update"] / max(timed_updates, 1), 1),
    }


def build_update(
    model_size: str,
    batch_size: int,
    batch_length: int,
    pixels: bool = False,
    compute_dtype: str = "auto",
) -> dict:
    """Our compiled update on a synthetic batch (CartPole's spaces, or 64 x 64 x 3 images and the
    same actions with ``pixels``): a row of settings, ``time_update()`` (seconds of one update, the
    state carried on) and what :func:`finish_update` needs."""
    image = dict(obs_dim=0, image_shape=(64, 64, 3)) if pixels else dict(obs_dim=4)
    cfg = preset(
        model_size,
        **image,
        action_dim=2,
        discrete=True,
        batch_size=batch_size,
        batch_length=batch_length,
        compute_dtype=compute_dtype,
    )
    state = core.init_state(cfg, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    shape = (1, batch_size, batch_length + 1)
    observation = (
        {"image": rng.integers(0, 256, size=(*shape, *cfg.image_shape), dtype=np.uint8)}
        if pixels
        else {"obs": rng.normal(size=(*shape, cfg.obs_dim)).astype(np.float32)}
    )
    batch = {
        **observation,
        "action": np.eye(2, dtype=np.float32)[rng.integers(0, 2, size=shape)],
        "reward": rng.normal(size=shape).astype(np.float32),
        "is_first": np.zeros(shape, bool),
        "is_last": np.zeros(shape, bool),
        "is_terminal": np.zeros(shape, bool),
        "deter": np.zeros((*shape, cfg.deter), np.float32),
        "stoch": np.zeros((*shape, cfg.stoch), np.int32),
    }
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    t0 = time.perf_counter()
    compiled = core.train_many_jit.lower(cfg, state, batch).compile()
    compile_s = time.perf_counter() - t0
    out = jax.block_until_ready(compiled(state, batch))
    current = out[0]

    def time_update() -> float:
        nonlocal current
        t = time.perf_counter()
        current = jax.block_until_ready(compiled(current, batch))[0]
        return time.perf_counter() - t

    row_bytes = sum(v[0, 0, 0].nbytes for v in batch.values())  # the replay's fields, one row
    return {
        "config": f"update-{model_size}" + ("-pixels" if pixels else ""),
        "batch": f"{batch_size}x{batch_length}",
        "compute_dtype": cfg.compute_dtype,
        "params": int(sum(x.size for x in jax.tree_util.tree_leaves(state.params))),
        "compile_seconds": round(compile_s, 1),
        "replay_bytes_per_row": int(row_bytes),
        "time_update": time_update,
        "state": lambda: current,
        "cfg": cfg,
        "observation": {k: v[0, :, 0] for k, v in observation.items()},
    }


def finish_update(built: dict, times: list[float], repeats: int) -> dict:
    """The row of one update build after its timed calls, with the acting step timed last."""
    row = {k: v for k, v in built.items() if k not in ("time_update", "state", "cfg", "observation")}
    row.update(
        ms_per_update_median=round(1000 * float(np.median(times)), 1),
        ms_per_update_min=round(1000 * float(np.min(times)), 1),
        **time_acting(built["cfg"], built["state"](), built["observation"], repeats),
        peak_rss_mb=round(peak_rss_mb(), 1),
    )
    return row


def run_update(
    model_size: str,
    batch_size: int,
    batch_length: int,
    repeats: int,
    pixels: bool = False,
    compute_dtype: str = "auto",
) -> dict:
    """One update (and one acting step for ``batch_size`` envs), median of ``repeats`` calls."""
    built = build_update(model_size, batch_size, batch_length, pixels, compute_dtype)
    return finish_update(built, [built["time_update"]() for _ in range(repeats)], repeats)


def start_reference(
    src: str, python: str, batch_size: int, batch_length: int, compute_dtype: str, pixels: bool = False
) -> subprocess.Popen:
    """The reference's worker process (``reference_dreamerv3_worker.py``), compiling in the background."""
    worker = Path(__file__).with_name("reference_dreamerv3_worker.py")
    command = [python, str(worker), "--src", src, "--batch-size", str(batch_size)]
    command += ["--batch-length", str(batch_length), "--compute-dtype", compute_dtype]
    command += ["--pixels"] if pixels else []
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)


def reference_ready(proc: subprocess.Popen) -> dict:
    """The worker's ready line (it compiles the reference's train step first: minutes)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{"):
            ready = json.loads(line)
            if ready.get("ready"):
                return ready
    raise RuntimeError(f"the reference worker did not start: {proc.args}")


def ask(proc: subprocess.Popen, what: str) -> float:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(what + "\n")
    return float(json.loads(proc.stdout.readline())[what])


def run_side_by_side(
    batch_size: int,
    batch_length: int,
    repeats: int,
    compute_dtype: str,
    src: str,
    python: str,
    pixels: bool = False,
) -> list[dict]:
    """Ours and the reference's "1m" update (``pixels``: from 64 x 64 x 3 images), timed round robin:
    two rows and their ratio."""
    dtype = resolve_compute_dtype(compute_dtype, ACCELERATOR_DTYPE)  # the reference at the same dtype
    proc = start_reference(src, python, batch_size, batch_length, dtype, pixels)
    try:
        built = build_update("1m", batch_size, batch_length, pixels, compute_dtype)
        ready = reference_ready(proc)
        ours, theirs = [], []
        load_before = os.getloadavg()[0]
        for _ in range(repeats):
            ours.append(built["time_update"]())
            theirs.append(ask(proc, "update"))
        reference_rss = ask(proc, "peak_rss_mb")
        load = [round(load_before, 1), round(os.getloadavg()[0], 1)]  # 1 min, before/after
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=60)
    row = finish_update(built, ours, repeats)
    reference = {
        "config": row["config"],
        "impl": f"reference (danijar/dreamerv3 2411f7d+29eb964, jax {ready['jax']})",
        "batch": row["batch"],
        "compute_dtype": ready["compute_dtype"],
        "params": ready["params"],
        "compile_seconds": ready["build_s"],
        "ms_per_update_median": round(1000 * float(np.median(theirs)), 1),
        "ms_per_update_min": round(1000 * float(np.min(theirs)), 1),
        "peak_rss_mb": round(reference_rss, 1),
    }
    ratio = round(reference["ms_per_update_median"] / row["ms_per_update_median"], 2)
    for r in (row, reference):
        r.update(repeats=repeats, round_robin=True, speedup_over_reference=ratio, load_average=load)
    row["impl"] = "sb3_worldmodels"
    return [row, reference]


def time_acting(cfg, state, observation: dict, repeats: int) -> dict:
    """ms per acting step of ``policy_step`` for the batch's B envs (one jitted call, no env)."""
    obs = (
        {"image": jnp.asarray(observation["image"])}
        if "image" in observation
        else jnp.asarray(observation["obs"])
    )
    n = (obs["image"] if isinstance(obs, dict) else obs).shape[0]
    params, carry = core.policy_params(state), core.init_carry(cfg, n)
    first, key = jnp.zeros(n, bool), jax.random.PRNGKey(0)
    t0 = time.perf_counter()
    step = core.policy_step_jit.lower(cfg, params, carry, obs, first, key).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(step(params, carry, obs, first, key))
    times = []
    for _ in range(repeats * 10):
        t = time.perf_counter()
        action, carry, _, _ = step(params, carry, obs, first, key)
        jax.block_until_ready(action)
        times.append(time.perf_counter() - t)
    return {
        "acting_envs": n,
        "acting_compile_seconds": round(compile_s, 1),
        "ms_per_acting_step_median": round(1000 * float(np.median(times)), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    sizes = ("update-1m", "update-12m")
    parser.add_argument(
        "--config", default="seeds", choices=[*CONFIGS, *sizes, *(f"{s}-pixels" for s in sizes)]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rows", type=int, default=None, help="total rows (default: the config's)")
    parser.add_argument("--compute-dtype", default="auto", choices=COMPUTE_DTYPES)
    parser.add_argument(
        "--conv-method",
        choices=CONV_METHODS,
        help="blocks.convolution.conv2d's method on this backend (default: the backend's)",
    )
    parser.add_argument("--reference-src", help="danijar/dreamerv3 checkout (2411f7d + 29eb964)")
    parser.add_argument("--reference-python", default=sys.executable, help="Python for the reference")
    parser.add_argument("--out", type=Path, default=None, help="append the rows to this .jsonl file")
    args = parser.parse_args()
    os.environ.setdefault("SB3WM_COMPILATION_CACHE", "off")  # compile times of compiles, not of cache loads
    if args.conv_method:  # before the first program is traced
        DEFAULT_CONV_METHOD[jax.default_backend()] = args.conv_method
    if args.reference_src:
        if args.config not in ("update-1m", "update-1m-pixels"):
            parser.error("--reference-src times the update-1m and update-1m-pixels configurations")
        results = run_side_by_side(
            16,
            64,
            args.repeats,
            args.compute_dtype,
            args.reference_src,
            args.reference_python,
            pixels=args.config.endswith("-pixels"),
        )
    elif args.config.startswith("update-"):
        size = args.config.split("-")[1]
        pixels = args.config.endswith("-pixels")
        results = [run_update(size, 16, 64, args.repeats, pixels=pixels, compute_dtype=args.compute_dtype)]
    else:
        results = [run_learning(args.config, args.seed, args.rows, args.compute_dtype)]
    for result in results:
        result.update(
            machine=f"{platform.machine()} {jax.devices()[0].platform} x{jax.local_device_count()}",
            **cpu_info().as_dict(),
            cpu_options=cpu_options_name(),
            jax=jax.__version__,
            scan_unroll=scan_unroll(),  # SB3WM_SCAN_UNROLL
            conv_method=DEFAULT_CONV_METHOD.get(jax.default_backend(), "lax"),
            date=time.strftime("%Y-%m-%d"),
        )
        print(json.dumps(result), flush=True)
        if args.out:
            with args.out.open("a") as handle:
                handle.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()

"""Where an update or a plan spends its time: an XLA trace grouped by the JAX operation that
produced each op (forward or backward), plus the slowest single ops with their shapes.

    python tools/profile_ops.py --agent tdmpc2 --what update --size 1
    python tools/profile_ops.py --agent tdmpc2 --what plan --size 1 --top 30
    python tools/profile_ops.py --agent dreamerv3 --what update        # "1m", 16x64
    python tools/profile_ops.py --agent tdmpc2 --what plan --seeds 8 --save /tmp/plan8.json

TD-MPC2 on Pendulum-v1 shapes (obs 3, action 1); DreamerV3 on CartPole-like shapes (obs 4,
Discrete 2) with the replay windows of ``profile_update.py``. The programs are the agents' own
(``for_config`` / ``over_seeds``: the config's ``matmul_precision`` pinned, the package's compiler
options). The trace is written with ``jax.profiler`` (Perfetto JSON) under ``--trace-dir`` and summed
over ``--calls`` calls; times are per call. Op names are XLA's (``dot.12``, ``*_fusion.3``); a fusion
is charged to the JAX operation of its root, so elementwise work fused into a transpose shows up as
"transpose". The ops are also summed by the loop whose body holds them (a scan's forward or backward
pass) or outside the loops.

``--pixels`` profiles the same from 64 x 64 images: TD-MPC2 three stacked RGB frames (64 x 64 x 9 uint8,
``num_channels`` = latent_dim / 16, as ``benchmarks/tdmpc2_speed.py --observation pixels``), DreamerV3
one RGB frame (64 x 64 x 3, ``dreamerv3_speed.py --config update-1m-pixels``).

``--seeds N`` profiles the program of a seed group of N instead (the agent function's
``over_seeds``; the update as a group's training call, ``blocks.seeds.counted_updates``), with each
seed's own parameters and inputs. On an accelerator the device's own op events are summed (the
trace's ``/device:...`` process), on a CPU the host's. ``--save`` writes the per-op times, their JAX
operations, shapes and loops and the compiled HLO text to a JSON file, to compare two profiles later.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parent))  # profile_update

from sb3_worldmodels.blocks.seeds import counted_updates, stack_trees  # noqa: E402
from sb3_worldmodels.tdmpc2 import agent as core  # noqa: E402
from sb3_worldmodels.tdmpc2.config import preset  # noqa: E402

RUNTIME_EVENTS = (
    "Execute",
    "Pjit",
    "ParseArguments",
    "CreateOutputs",
    "Allocate",
    "Handle inputs",
    "ThreadPool",
)


PIXEL_FRAMES = (64, 64, 9)
"""TD-MPC2's images: three stacked 64 x 64 RGB frames."""


def make_dreamerv3_update(seeds: int = 0, pixels: bool = False):
    from profile_update import make_batches

    from sb3_worldmodels.dreamerv3 import agent as dreamer
    from sb3_worldmodels.dreamerv3.config import preset as dreamer_preset

    spaces = dict(obs_dim=0, image_shape=(64, 64, 3)) if pixels else dict(obs_dim=4)
    config = dreamer_preset("1m", **spaces, action_dim=2, discrete=True, batch_size=16, batch_length=64)
    if seeds:
        state = stack_trees([dreamer.init_state(config, jax.random.PRNGKey(s)) for s in range(seeds)])
        batches = stack_trees([make_batches(config, 1, seed=s) for s in range(seeds)])
        count = jnp.ones(seeds, jnp.int32)
        program = counted_updates(dreamer.train_step).over_seeds(config)
        compiled = program.lower(state, batches, count).compile()
        return compiled, lambda: compiled(state, batches, count)[0].params
    state = dreamer.init_state(config, jax.random.PRNGKey(0))
    batches = make_batches(config, 1)
    compiled = dreamer.train_many_jit.for_config(config).lower(state, batches).compile()
    return compiled, lambda: compiled(state, batches)[0].params


def make_call(what: str, size: int, seeds: int = 0, pixels: bool = False):
    config = preset(size, obs_dim=3, action_dim=1, discount=0.975)
    if pixels:
        config = config.replace(obs_dim=0, image_shape=PIXEL_FRAMES, num_channels=config.latent_dim // 16)
    h, b = config.horizon, config.batch_size

    def observations(rng: np.random.Generator, *shape: int) -> np.ndarray:
        if pixels:
            return rng.integers(0, 256, size=(*shape, *PIXEL_FRAMES), dtype=np.uint8)
        return rng.normal(size=(*shape, 3)).astype(np.float32)

    def inputs(seed: int) -> tuple:
        rng = np.random.default_rng(seed)
        state = core.init_state(config, jax.random.PRNGKey(seed))
        batch = {
            "obs": observations(rng, 1, h + 1, b),
            "action": rng.uniform(-1, 1, size=(1, h, b, 1)).astype(np.float32),
            "reward": rng.normal(size=(1, h, b)).astype(np.float32),
        }
        plan = (
            observations(rng, 1),
            np.zeros((1, h, 1), np.float32),
            np.zeros((1,), bool),
            np.asarray(jax.random.PRNGKey(1 + seed)),
        )
        return state, batch, plan

    stacked = stack_trees([inputs(s) for s in range(seeds)]) if seeds else inputs(0)
    state, batch, plan = jax.device_put(stacked)
    if what == "update":
        if seeds:
            count = jnp.ones(seeds, jnp.int32)
            fn = counted_updates(core.train_step).over_seeds(config)
            compiled = fn.lower(state, batch, count).compile()
            return compiled, lambda: compiled(state, batch, count)[0].params
        compiled = core.train_many_jit.for_config(config).lower(state, batch).compile()
        return compiled, lambda: compiled(state, batch)[0].params
    if seeds:
        compiled = core.act_jit.over_seeds(config).lower(state.params, *plan).compile()
        return compiled, lambda: compiled(state.params, *plan)
    compiled = core.act_jit.for_config(config).lower(state.params, *plan).compile()
    return compiled, lambda: compiled(state.params, *plan)


def op_metadata(hlo: str) -> tuple[dict[str, str], dict[str, str]]:
    """HLO instruction name -> JAX op_name metadata, and -> result shape."""
    names, shapes = {}, {}
    for m in re.finditer(r"\n\s*%?([\w.\-]+) = (\S+) [^\n]*", hlo):
        shapes[m.group(1)] = m.group(2)
        op = re.search(r'op_name="([^"]*)"', m.group(0))
        if op:
            names[m.group(1)] = op.group(1)
    return names, shapes


def loop_of_ops(hlo: str) -> dict[str, str]:
    """HLO instruction name -> the loop whose body holds it ("outside the loops" for the entry
    computation): a while loop named by its JAX op_name (``jvp()/while``: a forward scan,
    ``transpose(jvp())/while``: a scan's backward pass) and its body's computation."""
    bodies: dict[str, str] = {}
    for m in re.finditer(r"\n\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*while\([^\n]*body=%?([\w.\-]+)[^\n]*", hlo):
        op = re.search(r'op_name="([^"]*)"', m.group(0))
        bodies[m.group(2)] = f"{op.group(1) if op else 'while'} ({m.group(2)})"
    where: dict[str, str] = {}
    current = ""
    for line in hlo.splitlines():
        head = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head:
            current = "outside the loops" if head.group(1) else bodies.get(head.group(2), head.group(2))
            continue
        inst = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line)
        if inst:
            where[inst.group(1)] = current
    return where


def device_ops_thread(events: list[dict]) -> tuple[object, object] | None:
    """(pid, tid) of an accelerator's op events in a trace ("XLA Ops" of a ``/device:`` process, not
    the host's ``/host:CPU``), or None on a CPU-only trace."""
    devices = {
        e["pid"]
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "process_name"
        and "/device:" in str(e.get("args", {}).get("name", ""))
        and "CPU" not in str(e.get("args", {}).get("name", ""))
    }
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") in devices:
            if e.get("args", {}).get("name") == "XLA Ops":
                return e["pid"], e["tid"]
    return None


def ops_per_call(events: list[dict], calls: int) -> collections.Counter:
    """Milliseconds per call of each op: the device's op events on an accelerator, else the host's
    (the runtime's own events left out)."""
    device = device_ops_thread(events)
    per_op: collections.Counter = collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") != "X" or "dur" not in e or name.startswith("$"):
            continue
        if device is not None and (e.get("pid"), e.get("tid")) != device:
            continue
        if device is None and any(r in name for r in RUNTIME_EVENTS):
            continue
        per_op[name] += e["dur"] / 1e3 / calls
    return per_op


def device_spans(events: list[dict], calls: int) -> list[float] | None:
    """Milliseconds from each call's first device op to its last (the ops split into ``calls`` runs at
    their largest gaps); None on a CPU-only trace. Against the ops' own time, the span says how long the
    device waited between its ops; against the call's time, how long the host took around them."""
    device = device_ops_thread(events)
    if device is None:
        return None
    ops = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X" and "dur" in e and (e.get("pid"), e.get("tid")) == device
    )
    if not ops:
        return None
    gaps = sorted(range(1, len(ops)), key=lambda i: ops[i][0] - ops[i - 1][1])[len(ops) - calls :]
    cuts = [0, *sorted(gaps), len(ops)]
    return [
        (max(end for _, end in ops[a:b]) - ops[a][0]) / 1e3
        for a, b in zip(cuts[:-1], cuts[1:], strict=True)
        if b > a
    ]


def host_events(events: list[dict], calls: int) -> collections.Counter:
    """Milliseconds per call of each event off the device's op thread (the host's runtime: argument
    handling, execution, output creation), on an accelerator; empty on a CPU-only trace."""
    device = device_ops_thread(events)
    if device is None:
        return collections.Counter()
    device_pids = {device[0]}
    per_event: collections.Counter = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and "dur" in e and e.get("pid") not in device_pids:
            per_event[e.get("name", "")] += e["dur"] / 1e3 / calls
    return per_event


def group(op_name: str) -> str:
    parts = op_name.split("/")
    direction = "backward" if any(p.startswith("transpose(") for p in parts) else "forward"
    return f"{direction:8s} {parts[-1]}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", choices=["tdmpc2", "dreamerv3"], default="tdmpc2")
    parser.add_argument("--what", choices=["update", "plan"], default="update")
    parser.add_argument("--size", type=int, default=1)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--seeds", type=int, default=0, help="a seed group's program over this many seeds")
    parser.add_argument("--pixels", action="store_true", help="from 64 x 64 images instead of a vector")
    parser.add_argument("--save", type=Path, help="write the per-op times and the HLO to this JSON file")
    parser.add_argument("--trace-dir", type=Path, default=Path("/tmp/sb3wm_profile"))
    args = parser.parse_args()
    os.environ.setdefault("SB3WM_COMPILATION_CACHE", "off")  # compile times of compiles, not of cache loads
    if args.agent == "dreamerv3" and args.what != "update":
        parser.error("--agent dreamerv3 profiles the update only")
    start = time.perf_counter()
    if args.agent == "dreamerv3":
        compiled, call = make_dreamerv3_update(args.seeds, args.pixels)
    else:
        compiled, call = make_call(args.what, args.size, args.seeds, args.pixels)
    compile_s = time.perf_counter() - start
    for _ in range(2):
        jax.block_until_ready(call())
    times = []
    for _ in range(5):
        start = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - start)
    label = f"{args.agent} {args.what} size {args.size}" + (f", {args.seeds} seeds" if args.seeds else "")
    label += ", pixels" if args.pixels else ""
    print(
        f"{label} on {jax.default_backend()}: median {np.median(times) * 1e3:.1f} ms over 5 calls "
        f"(untraced), compiled in {compile_s:.1f} s"
    )

    shutil.rmtree(args.trace_dir, ignore_errors=True)
    with jax.profiler.trace(str(args.trace_dir), create_perfetto_trace=True):
        for _ in range(args.calls):
            jax.block_until_ready(call())
    path = next(args.trace_dir.rglob("*.trace.json.gz"))
    events = json.load(gzip.open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    per_op = ops_per_call(events, args.calls)
    spans = device_spans(events, args.calls)
    host = host_events(events, args.calls)
    hlo = getattr(compiled, "jitted", compiled).as_text()  # a program over seeds wraps its Compiled
    names, shapes = op_metadata(hlo)
    loops = loop_of_ops(hlo)
    kinds: collections.Counter = collections.Counter()
    groups: collections.Counter = collections.Counter()
    regions: collections.Counter = collections.Counter()
    for op, ms in per_op.items():
        base = op.removeprefix("end: ")
        kinds["dot" if base.startswith("dot") else "fusion" if "fusion" in base else base.split(".")[0]] += ms
        groups[group(names.get(base, base))] += ms
        regions[loops.get(base, "runtime")] += ms
    if args.save:
        record = {
            "label": label,
            "backend": jax.default_backend(),
            "median_ms": float(np.median(times) * 1e3),
            "compile_s": compile_s,
            "ops": {
                op.removeprefix("end: "): {
                    "ms": ms,
                    "jax_op": names.get(op.removeprefix("end: "), ""),
                    "shape": shapes.get(op.removeprefix("end: "), ""),
                    "loop": loops.get(op.removeprefix("end: "), "runtime"),
                }
                for op, ms in per_op.items()
            },
            "device_span_ms": spans,
            "host_events_ms": dict(host.most_common(40)),
            "hlo": hlo,
        }
        args.save.write_text(json.dumps(record))
    print(f"\ntraced ops: {sum(per_op.values()):.1f} ms per call")
    if spans:
        print(f"device span per call (first op to last): {', '.join(f'{x:.2f}' for x in spans)} ms")
        print("host events per call (accelerator runtime, Python):")
        for k, ms in host.most_common(12):
            print(f"  {ms:8.2f} ms  {k[:90]}")
    print("\nby kind:")
    for k, ms in kinds.most_common(8):
        print(f"  {ms:8.2f} ms  {k}")
    print("\nby loop (ops of a loop's body, each step summed):")
    for k, ms in regions.most_common(6):
        print(f"  {ms:8.2f} ms  {k[-90:]}")
    print("\nby JAX operation:")
    for k, ms in groups.most_common(args.top):
        print(f"  {ms:8.2f} ms  {k}")
    print("\nslowest ops:")
    for op, ms in per_op.most_common(args.top):
        base = op.removeprefix("end: ")
        print(f"  {ms:7.2f} ms  {base[:28]:28s} {shapes.get(base, '')[:32]:32s} {names.get(base, '')[-70:]}")


if __name__ == "__main__":
    main()

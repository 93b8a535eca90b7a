"""Where an update or a plan spends its time: an XLA trace grouped by the JAX operation that
produced each op (forward or backward), plus the slowest single ops with their shapes.

    python tools/profile_ops.py --agent tdmpc2 --what update --size 1
    python tools/profile_ops.py --agent tdmpc2 --what plan --size 1 --top 30
    python tools/profile_ops.py --agent dreamerv3 --what update        # "1m", 16x64

TD-MPC2 on Pendulum-v1 shapes (obs 3, action 1); DreamerV3 on CartPole-like shapes (obs 4,
Discrete 2) with the replay windows of ``profile_update.py``. The trace is written with
``jax.profiler`` (Perfetto JSON) under ``--trace-dir`` and summed over ``--calls`` calls; times are
per call. Op names are XLA's (``dot.12``, ``*_fusion.3``); a fusion is charged to the JAX operation
of its root, so elementwise work fused into a transpose shows up as "transpose". The ops are also
summed by the loop whose body holds them (a scan's forward or backward pass) or outside the loops.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
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

from sb3_worldmodels.blocks.jit import COMPILER_OPTIONS  # noqa: E402
from sb3_worldmodels.tdmpc2 import agent as core  # noqa: E402
from sb3_worldmodels.tdmpc2.config import preset  # noqa: E402

RUNTIME_EVENTS = ("Execute", "Pjit", "ParseArguments", "CreateOutputs", "Allocate", "Handle inputs")


def make_dreamerv3_update():
    from profile_update import make_batches

    from sb3_worldmodels.dreamerv3 import agent as dreamer
    from sb3_worldmodels.dreamerv3.config import preset as dreamer_preset

    config = dreamer_preset("1m", obs_dim=4, action_dim=2, discrete=True, batch_size=16, batch_length=64)
    state = dreamer.init_state(config, jax.random.PRNGKey(0))
    batches = make_batches(config, 1)
    fn = jax.jit(dreamer.train_many, static_argnames=("config",), compiler_options=COMPILER_OPTIONS)
    compiled = fn.lower(config, state, batches).compile()
    return compiled, lambda: compiled(state, batches)[0].params


def make_call(what: str, size: int):
    config = preset(size, obs_dim=3, action_dim=1, discount=0.975)
    state = core.init_state(config, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    h, b = config.horizon, config.batch_size
    if what == "update":
        batch = {
            "obs": jnp.asarray(rng.normal(size=(1, h + 1, b, 3)), jnp.float32),
            "action": jnp.asarray(rng.uniform(-1, 1, size=(1, h, b, 1)), jnp.float32),
            "reward": jnp.asarray(rng.normal(size=(1, h, b)), jnp.float32),
        }
        fn = jax.jit(core.train_many, static_argnames=("config",), compiler_options=COMPILER_OPTIONS)
        compiled = fn.lower(config, state, batch).compile()
        return compiled, lambda: compiled(state, batch)[0].params
    args = (
        state.params,
        jnp.zeros((1, 3), jnp.float32),
        jnp.zeros((1, h, 1), jnp.float32),
        jnp.zeros((1,), bool),
        jax.random.PRNGKey(1),
    )
    fn = jax.jit(core.act, static_argnames=("config", "deterministic"), compiler_options=COMPILER_OPTIONS)
    compiled = fn.lower(config, *args).compile()
    return compiled, lambda: compiled(*args)


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
    parser.add_argument("--trace-dir", type=Path, default=Path("/tmp/sb3wm_profile"))
    args = parser.parse_args()
    if args.agent == "dreamerv3" and args.what != "update":
        parser.error("--agent dreamerv3 profiles the update only")
    compiled, call = make_dreamerv3_update() if args.agent == "dreamerv3" else make_call(args.what, args.size)
    for _ in range(2):
        jax.block_until_ready(call())
    times = []
    for _ in range(5):
        start = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - start)
    print(
        f"{args.agent} {args.what} size {args.size}: "
        f"median {np.median(times) * 1e3:.1f} ms over 5 calls (untraced)"
    )

    shutil.rmtree(args.trace_dir, ignore_errors=True)
    with jax.profiler.trace(str(args.trace_dir), create_perfetto_trace=True):
        for _ in range(args.calls):
            jax.block_until_ready(call())
    path = next(args.trace_dir.rglob("*.trace.json.gz"))
    events = json.load(gzip.open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    per_op: collections.Counter = collections.Counter()
    for e in events:
        name = e.get("name", "")
        if (
            e.get("ph") == "X"
            and "dur" in e
            and not name.startswith("$")
            and not any(r in name for r in RUNTIME_EVENTS)
        ):
            per_op[name] += e["dur"] / 1e3 / args.calls
    hlo = compiled.as_text()
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
    print(f"\ntraced ops: {sum(per_op.values()):.1f} ms per call")
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

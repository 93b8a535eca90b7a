"""The agents' CPU programs under each set of XLA compiler options, timed side by side in one process.

    python benchmarks/cpu_options.py                      # DreamerV3 "1m" update, TD-MPC2 size 1
    python benchmarks/cpu_options.py --repeats 30 --out benchmarks/results/cpu_options.jsonl
    python benchmarks/cpu_options.py --agents matmul      # the CPU's float32 matmul rate, GFLOP/s

XLA's CPU options change the speed of the same program differently on different CPUs (an option that
helps a CPU without AVX-512 can cost another with it), so the package's choice
(:func:`sb3_worldmodels.blocks.jit.cpu_compiler_options`) rests on this benchmark run on each CPU type.
Every (program, option set) pair is compiled, then timed round-robin (one call of each per round), so
a busy neighbour affects every row alike; each row's median is reported with its ratio to the first
option set's (by default the package's choice for this CPU). Programs: DreamerV3 "1m" at 16x64 (one
update, CartPole shapes) and TD-MPC2 size 1 (one plan and one update, Pendulum shapes: agent steps
per second). ``matmul``: the rate of one large jitted float32 matmul (2048 x 2048 x 2048) and of
TD-MPC2 size 1's hidden layer (eight 512 x 384 x 384 matmuls in one program), in GFLOP/s: with an
agent's matmul FLOPs (``tools/profile_update.py --flops``) it gives the least time a step can take on
this CPU. Prints one JSON line per row with the CPU's model and vector extensions, and appends
them to ``--out`` if given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tdmpc2_speed import build as build_tdmpc2  # noqa: E402

from sb3_worldmodels.blocks import jit as J  # noqa: E402
from sb3_worldmodels.blocks.cpu import cpu_info  # noqa: E402
from sb3_worldmodels.dreamerv3 import agent as dreamer  # noqa: E402
from sb3_worldmodels.dreamerv3.config import preset as dreamer_preset  # noqa: E402
from sb3_worldmodels.dreamerv3.synthetic import random_batches  # noqa: E402


def build_dreamerv3(options: dict) -> tuple[float, Callable[[], float]]:
    """DreamerV3 "1m" 16x64 update (CartPole shapes) compiled under ``options``: (compile seconds,
    a function timing one update)."""
    config = dreamer_preset("1m", obs_dim=4, action_dim=2, discrete=True, batch_size=16, batch_length=64)
    state = dreamer.init_state(config, jax.random.PRNGKey(0))
    batch = jax.device_put(random_batches(config, 1, np.random.default_rng(0)))
    update = jax.jit(dreamer.train_many, static_argnames=("config",), compiler_options=options)
    start = time.perf_counter()
    compiled = update.lower(config, state, batch).compile()
    compile_s = time.perf_counter() - start
    current = jax.block_until_ready(compiled(state, batch))[0]

    def time_update() -> float:
        nonlocal current
        t = time.perf_counter()
        current = jax.block_until_ready(compiled(current, batch))[0]
        return time.perf_counter() - t

    return compile_s, time_update


PROGRAMS = {
    "dreamerv3": 'DreamerV3 "1m" update 16x64',
    "tdmpc2": "TD-MPC2 size 1 plan + update",
    "matmul": "float32 matmul rate",
}
MATMUL_SHAPES = {"2048 x 2048 x 2048": (2048, 2048, 2048, 1), "8 x (512 x 384 x 384)": (512, 384, 384, 8)}
"""name: (rows, inner, columns, matmuls in one program)."""


def build_matmul(options: dict, shape: tuple[int, int, int, int]) -> tuple[float, Callable[[], float], float]:
    """``count`` independent float32 matmuls of ``rows x inner`` by ``inner x columns`` in one program
    compiled under ``options``: (compile seconds, a function timing one call, FLOPs per call)."""
    rows, inner, columns, count = shape
    rng = np.random.default_rng(0)
    a = jax.device_put(rng.standard_normal((count, rows, inner), dtype=np.float32))
    b = jax.device_put(rng.standard_normal((count, inner, columns), dtype=np.float32))
    matmul = jax.jit(lambda x, y: [x[i] @ y[i] for i in range(count)], compiler_options=options)
    start = time.perf_counter()
    compiled = matmul.lower(a, b).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(a, b))

    def time_call() -> float:
        t = time.perf_counter()
        jax.block_until_ready(compiled(a, b))
        return time.perf_counter() - t

    return compile_s, time_call, 2.0 * rows * inner * columns * count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="rounds of timed calls")
    parser.add_argument(
        "--sets",
        nargs="+",
        default=None,
        choices=list(J.CPU_OPTION_SETS),
        help="default: all, this CPU's choice first",
    )
    parser.add_argument(
        "--agents", nargs="+", default=["dreamerv3", "tdmpc2"], choices=["dreamerv3", "tdmpc2", "matmul"]
    )
    parser.add_argument("--out", type=Path, default=None, help="append the rows to this .jsonl file")
    args = parser.parse_args()
    if args.sets is None:
        chosen = J.cpu_compiler_options()
        first = next(name for name, options in J.CPU_OPTION_SETS.items() if options == chosen)
        args.sets = [first, *(name for name in J.CPU_OPTION_SETS if name != first)]

    timers: dict[tuple[str, str, str], Callable[[], float]] = {}
    compile_s: dict[tuple[str, str], dict[str, float]] = {}
    flops: dict[str, float] = {}
    for name in args.sets:
        options = J.CPU_OPTION_SETS[name]
        if "dreamerv3" in args.agents:
            seconds, timer = build_dreamerv3(options)
            timers["dreamerv3", name, "update"] = timer
            compile_s["dreamerv3", name] = {"update": round(seconds, 1)}
        if "tdmpc2" in args.agents:
            row = build_tdmpc2(1, 3, 1, options=options)
            timers["tdmpc2", name, "plan"] = row["time_plan"]
            timers["tdmpc2", name, "update"] = row["time_update"]
            compile_s["tdmpc2", name] = {"plan": row["plan_compile_s"], "update": row["update_compile_s"]}
        if "matmul" in args.agents:
            compile_s["matmul", name] = {}
            for shape_name, shape in MATMUL_SHAPES.items():
                seconds, timer, flops[shape_name] = build_matmul(options, shape)
                timers["matmul", name, shape_name] = timer
                compile_s["matmul", name][shape_name] = round(seconds, 1)
    times: dict[tuple[str, str, str], list[float]] = {key: [] for key in timers}
    for _ in range(args.repeats):
        for key, timer in timers.items():
            times[key].append(timer())

    def ms(agent: str, name: str) -> float:
        return sum(1000 * float(np.median(t)) for (a, n, _), t in times.items() if (a, n) == (agent, name))

    cpu = cpu_info()
    rows = []
    for agent in args.agents:
        first_ms = ms(agent, args.sets[0])
        for name in args.sets:
            total = ms(agent, name)
            parts = {
                f"{part}_ms": round(1000 * float(np.median(t)), 1)
                for (a, n, part), t in times.items()
                if (a, n) == (agent, name)
            }
            if agent == "matmul":
                parts = {
                    f"{part} GFLOP/s": round(flops[part] / float(np.median(t)) / 1e9, 1)
                    for (a, n, part), t in times.items()
                    if (a, n) == (agent, name)
                }
            rows.append(
                {
                    "agent": agent,
                    "program": PROGRAMS[agent],
                    "options": name,
                    "compiler_options": J.CPU_OPTION_SETS[name],
                    **parts,
                    "ms_per_step" if agent != "matmul" else "ms_all_shapes": round(total, 1),
                    "time_ratio_to_first": round(total / first_ms, 3),
                    "compile_s": compile_s[agent, name],
                    "package_choice": J.CPU_OPTION_SETS[name] == J.cpu_compiler_options(cpu),
                    "repeats": args.repeats,
                    **cpu.as_dict(),
                    "jax": jax.__version__,
                    "date": time.strftime("%Y-%m-%d"),
                }
            )
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.out is not None:
        with args.out.open("a") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main()

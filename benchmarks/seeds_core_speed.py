"""Seeds in one program, the cores alone: milliseconds per call and per seed of the jitted functions
over a leading seed axis (``AgentFunction.over_seeds``) at 1, 2, 4 and 8 seeds, beside the
single-seed program.

    python benchmarks/seeds_core_speed.py                       # both agents, 1 2 4 8 seeds
    python benchmarks/seeds_core_speed.py --agent tdmpc2 --seeds 1 --seeds 16 --repeats 20
    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu \
        python benchmarks/seeds_core_speed.py --seeds 4 --seeds 8 --sharded    # 4 CPU devices
    python benchmarks/seeds_core_speed.py --gather-free on --gather-free off   # both forms, side by side
    python benchmarks/seeds_core_speed.py --agent tdmpc2 --seeds 8 --numerics default --numerics tf32

DreamerV3: one "1m" update at 16 x 64 (CartPole shapes: obs 4, two discrete actions), the group's
training call of ``blocks.seeds.counted_updates`` with every update counted. TD-MPC2: one size-1
agent step (Pendulum shapes: obs 3, action 1), a plan for one env per seed and one update.

``--sharded`` times each seed count also with its seed axis sharded over the host's devices
(``blocks.devices.seed_placement``, as a seed group places it), beside the same program on one.

``--numerics`` (repeatable) builds the configs with other numerics (:data:`NUMERICS`: the matmul
precision or the compute dtype), each row naming its own; e.g. whether TD-MPC2's 8-seed plan is bound
by float32's matmul passes on a TPU (``--numerics default --numerics tf32``).

``--gather-free`` (repeatable) builds the programs in the given forms of ``blocks.backend``: "auto"
(the default: gather-free on every backend but the CPU), "on" or "off"; each row records the form
it ran (``gather_free``).

``--budget-s S`` compiles no further program once the next could end past S seconds (for hosts that
limit a command's time): the programs compiled by then are timed and printed, the others named on
stderr.

Each timing is a median over ``--repeats`` calls after compilation; the seed counts of an agent are
timed round-robin in one process, so a busy neighbour on the CPU affects every row alike. Prints one
JSON line per row with the CPU model and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from sb3_worldmodels.blocks.backend import GATHER_FREE_MODES, gather_free, gather_free_forms, scan_unroll  # noqa: E402
from sb3_worldmodels.blocks.cpu import cpu_info  # noqa: E402
from sb3_worldmodels.blocks.devices import seed_placement  # noqa: E402
from sb3_worldmodels.blocks.seeds import counted_updates, stack_trees  # noqa: E402

NUMERICS: dict[str, dict[str, str]] = {
    "default": {},
    "tf32": {"matmul_precision": "tensorfloat32"},
    "bf16-matmul": {"matmul_precision": "bfloat16"},
    "bf16": {"compute_dtype": "bfloat16"},
    "f32": {"compute_dtype": "float32"},
}
"""``--numerics`` names -> config overrides ("default": the config as a user gets it)."""


def placed(tree: Any, seeds: int, sharded: bool) -> Any:
    """A pytree of leaves (seeds, ...) on the device, or sharded along the seeds over the devices."""
    placement = seed_placement(seeds) if sharded else None
    return jax.device_put(tree) if placement is None else placement.put(tree)


def timed_compile(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    compiled = fn.lower(*args, **kwargs).compile()
    return compiled, time.perf_counter() - start


def dreamerv3(
    seeds: int, sharded: bool = False, overrides: dict | None = None
) -> tuple[Callable[[], dict[str, float]], float]:
    """One training call of ``seeds`` "1m" agents (16 x 64 each); seeds == 0: the single-seed
    ``train_many_jit``. Returns (a call that runs it once and returns its seconds, compile seconds)."""
    from sb3_worldmodels.dreamerv3 import agent as core
    from sb3_worldmodels.dreamerv3.config import preset
    from sb3_worldmodels.dreamerv3.synthetic import random_batches

    config = preset(
        "1m", obs_dim=4, action_dim=2, discrete=True, batch_size=16, batch_length=64, **(overrides or {})
    )
    rng = np.random.default_rng(0)

    def batches() -> dict:
        return random_batches(config, 1, rng, first_rate=0.02)

    if seeds == 0:
        state, batch = core.init_state(config, jax.random.PRNGKey(0)), jax.device_put(batches())
        update, compile_s = timed_compile(core.train_many_jit.for_config(config), state, batch)
        args: list = [state, batch]
    else:
        states = stack_trees([core.init_state(config, jax.random.PRNGKey(s)) for s in range(seeds)])
        group = stack_trees([batches() for _ in range(seeds)])
        states, group, active = placed((states, group, np.ones(seeds, np.int32)), seeds, sharded)
        program = counted_updates(core.train_step).over_seeds(config)
        update, compile_s = timed_compile(program, states, group, active)
        args = [states, group, active]

    def call() -> dict[str, float]:
        start = time.perf_counter()
        args[0] = jax.block_until_ready(update(*args))[0]  # the next call trains the new state
        return {"update": time.perf_counter() - start}

    call()
    return call, compile_s


def tdmpc2(
    seeds: int, sharded: bool = False, overrides: dict | None = None
) -> tuple[Callable[[], dict[str, float]], float]:
    """One agent step of ``seeds`` size-1 agents (a plan for one env each, then one update); seeds ==
    0: the single-seed ``act_jit`` and ``train_many_jit``."""
    from sb3_worldmodels.tdmpc2 import agent as core
    from sb3_worldmodels.tdmpc2.config import preset

    config = preset(1, obs_dim=3, action_dim=1, discount=0.975, **(overrides or {}))
    rng = np.random.default_rng(0)
    h, b = config.horizon, config.batch_size

    def inputs(seed: int) -> tuple[Any, dict, tuple]:
        state = core.init_state(config, jax.random.PRNGKey(seed))
        batch = {
            "obs": rng.normal(size=(1, h + 1, b, 3)).astype(np.float32),
            "action": rng.uniform(-1, 1, (1, h, b, 1)).astype(np.float32),
            "reward": rng.normal(size=(1, h, b)).astype(np.float32),
        }
        plan = (
            rng.normal(size=(1, 3)).astype(np.float32),
            np.zeros((1, h, 1), np.float32),
            np.zeros(1, bool),
            np.asarray(jax.random.PRNGKey(100 + seed)),
        )
        return state, batch, plan

    if seeds == 0:
        state, batch, plan_args = jax.device_put(inputs(0))
        act, act_compile = timed_compile(core.act_jit.for_config(config), state.params, *plan_args)
        train, train_compile = timed_compile(core.train_many_jit.for_config(config), state, batch)
        active: tuple = ()
    else:
        stacked = (stack_trees([inputs(s) for s in range(seeds)]), np.ones(seeds, np.int32))
        (state, batch, plan_args), ones = placed(stacked, seeds, sharded)
        act, act_compile = timed_compile(core.act_jit.over_seeds(config), state.params, *plan_args)
        active = (ones,)
        program = counted_updates(core.train_step).over_seeds(config)
        train, train_compile = timed_compile(program, state, batch, *active)
    current = [state]

    def call() -> dict[str, float]:
        start = time.perf_counter()
        jax.block_until_ready(act(current[0].params, *plan_args))
        planned = time.perf_counter()
        current[0] = jax.block_until_ready(train(current[0], batch, *active))[0]
        return {"plan": planned - start, "update": time.perf_counter() - planned}

    call()
    return call, act_compile + train_compile


AGENTS = {
    "dreamerv3": (dreamerv3, 'one "1m" update at 16x64 per seed'),
    "tdmpc2": (tdmpc2, "one size-1 agent step per seed (plan for 1 env + update)"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--agent", choices=sorted(AGENTS), action="append", help="default: both")
    parser.add_argument("--seeds", type=int, action="append", help="seed counts (default 1 2 4 8)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--sharded", action="store_true", help="each seed count also sharded over the host's devices"
    )
    parser.add_argument(
        "--gather-free",
        choices=GATHER_FREE_MODES,
        action="append",
        help="the programs' form (blocks.backend), repeatable: every count timed in each (default auto)",
    )
    parser.add_argument(
        "--numerics",
        choices=sorted(NUMERICS),
        action="append",
        help="config overrides of the matmul precision or compute dtype, repeatable (default: default)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="compile no further program once the next one could end past this many seconds from the\n"
        "start (the longest compile so far as its estimate); the compiled ones are timed",
    )
    args = parser.parse_args()
    os.environ.setdefault("SB3WM_COMPILATION_CACHE", "off")  # compile times of compiles, not of cache loads
    started = time.perf_counter()
    common = {
        "cpu": cpu_info().describe(),
        "cpu_cores": os.cpu_count(),
        "backend": jax.default_backend(),
        "devices": jax.local_device_count(),
        "jax": jax.__version__,
        "scan_unroll": scan_unroll(),  # SB3WM_SCAN_UNROLL
        "date": datetime.date.today().isoformat(),
    }
    modes = args.gather_free or ["auto"]
    numerics = args.numerics or ["default"]
    for agent in args.agent or sorted(AGENTS):
        build, what = AGENTS[agent]
        seed_counts = args.seeds or [1, 2, 4, 8]
        # (form, seeds, sharded); seeds 0: the single-seed program
        counts = [(0, False), *((n, False) for n in seed_counts)]
        counts += [(n, True) for n in seed_counts if args.sharded and n > 1]
        keys = [(mode, num, n, sharded) for mode in modes for num in numerics for n, sharded in counts]
        calls, compiles, forms = {}, {}, {}
        for key in list(keys):
            mode, num, n, sharded = key
            longest = max(compiles.values(), default=0.0)
            if args.budget_s is not None and time.perf_counter() - started + longest > args.budget_s:
                print(f"budget: {agent} {key} not compiled", file=sys.stderr, flush=True)
                keys.remove(key)
                continue
            with gather_free_forms(mode):  # the programs are built (and compiled) in this form
                calls[key], compiles[key] = build(n, sharded, NUMERICS[num])
                forms[key] = gather_free()
            print(f"compiled {agent} {key}: {compiles[key]:.1f} s", file=sys.stderr, flush=True)
        times: dict[tuple[str, str, int, bool], list[dict[str, float]]] = {key: [] for key in keys}
        for _ in range(args.repeats):
            for key in keys:
                times[key].append(calls[key]())
        for key in keys:
            mode, num, n, sharded = key
            ms = float(np.median([sum(parts.values()) for parts in times[key]]) * 1e3)
            parts = {
                f"{part}_ms": round(float(np.median([t[part] for t in times[key]]) * 1e3), 1)
                for part in times[key][0]
            }
            placement = seed_placement(n) if sharded else None
            program = "single seed" if n == 0 else "over seeds"
            row = {
                "agent": agent,
                "call": what,
                "program": program if placement is None else f"{program}, sharded",
                "gather_free": forms[key],
                "gather_free_mode": mode,
                "numerics": num,
                **NUMERICS[num],
                "on_devices": 1 if placement is None else len(placement.devices),
                "seeds": max(n, 1),
                "ms_per_call": round(ms, 1),
                "ms_per_seed": round(ms / max(n, 1), 1),
                **parts,
                "compile_s": round(compiles[key], 1),
                "repeats": args.repeats,
                **common,
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

"""TD-MPC2 speed on Pendulum-v1-shaped inputs (obs 3, action 1): plan and update milliseconds, compile
seconds and agent steps per second (one plan and one update per agent step, as after the seed phase).

    python benchmarks/tdmpc2_speed.py --size 1 --size 5 --repeats 20
    PYTHONPATH=/tmp/base python benchmarks/tdmpc2_speed.py --size 1 --impl sb3wm_base --impl sb3_worldmodels

Each timing is a median over ``--repeats`` calls after compilation; plans and updates of every
(size, implementation) pair are timed round-robin in one process, so a busy neighbour on the CPU
affects every row alike. ``--impl`` names a package with the layout of ``sb3_worldmodels`` (e.g. an
older commit's copy, renamed, on PYTHONPATH) to compare side by side. Prints one JSON line per row.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import resource
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install


def build(size: int, obs_dim: int, action_dim: int, impl: str = "sb3_worldmodels") -> dict:
    core = importlib.import_module(f"{impl}.tdmpc2.agent")
    preset = importlib.import_module(f"{impl}.tdmpc2.config").preset
    options = importlib.import_module(f"{impl}.common.xla").COMPILER_OPTIONS
    act_jit = jax.jit(core.act, static_argnames=("config", "eval_mode"), compiler_options=options)
    train_many_jit = jax.jit(core.train_many, static_argnames=("config",), compiler_options=options)
    config = preset(size, obs_dim=obs_dim, action_dim=action_dim, discount=0.975)
    state = core.init_state(config, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    h, b = config.horizon, config.batch_size
    batch = {
        "obs": jnp.asarray(rng.normal(size=(1, h + 1, b, obs_dim)), jnp.float32),
        "action": jnp.asarray(rng.uniform(-1, 1, size=(1, h, b, action_dim)), jnp.float32),
        "reward": jnp.asarray(rng.normal(size=(1, h, b)), jnp.float32),
        "terminated": jnp.zeros((1, h, b), jnp.float32),
    }
    obs = jnp.asarray(rng.normal(size=(1, obs_dim)), jnp.float32)
    prev = jnp.zeros((1, h, action_dim), jnp.float32)
    first = jnp.zeros((1,), bool)
    key = jax.random.PRNGKey(1)
    t = time.perf_counter()
    plan = act_jit.lower(config, state.params, obs, prev, first, key).compile()
    plan_compile = time.perf_counter() - t
    t = time.perf_counter()
    update = train_many_jit.lower(config, state, batch).compile()
    update_compile = time.perf_counter() - t
    jax.block_until_ready(plan(state.params, obs, prev, first, key))
    state2 = jax.block_until_ready(update(state, batch))[0]
    return {
        "impl": impl,
        "size": size,
        "config": config,
        "state": state2,
        "batch": batch,
        "plan": lambda s: plan(s.params, obs, prev, first, key),
        "update": lambda s: update(s, batch)[0],
        "plan_compile_s": round(plan_compile, 2),
        "update_compile_s": round(update_compile, 2),
        "plan_times": [],
        "update_times": [],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, action="append")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--obs-dim", type=int, default=3)
    parser.add_argument("--action-dim", type=int, default=1)
    parser.add_argument("--impl", action="append", help="package to time (default sb3_worldmodels)")
    args = parser.parse_args()
    builds = [
        build(size, args.obs_dim, args.action_dim, impl)
        for size in args.size or [1, 5]
        for impl in args.impl or ["sb3_worldmodels"]
    ]
    for _ in range(args.repeats):
        for b in builds:
            t = time.perf_counter()
            jax.block_until_ready(b["plan"](b["state"]))
            b["plan_times"].append(time.perf_counter() - t)
            t = time.perf_counter()
            b["state"] = jax.block_until_ready(b["update"](b["state"]))
            b["update_times"].append(time.perf_counter() - t)
    for b in builds:
        plan_ms = float(np.median(b["plan_times"]) * 1e3)
        update_ms = float(np.median(b["update_times"]) * 1e3)
        print(
            json.dumps(
                {
                    "impl": b["impl"],
                    "size": b["size"],
                    "params": int(sum(x.size for x in jax.tree_util.tree_leaves(b["state"].params))),
                    "plan_ms": round(plan_ms, 1),
                    "update_ms": round(update_ms, 1),
                    "agent_steps_per_s": round(1e3 / (plan_ms + update_ms), 2),
                    "plan_compile_s": b["plan_compile_s"],
                    "update_compile_s": b["update_compile_s"],
                    "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                    "machine": f"{platform.machine()} {jax.devices()[0].platform}",
                    "jax": jax.__version__,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()

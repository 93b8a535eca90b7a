"""Profile the DreamerV3 update on this machine: init, trace/lower, compile and step time, plus a breakdown.

    python tools/profile_update.py                          # "1m", 16x64, CartPole-like
    python tools/profile_update.py --size tiny --batch 2 --length 4
    python tools/profile_update.py --breakdown              # time jitted pieces of one update
    python tools/profile_update.py --hlo                    # HLO sizes of train_many / policy_step
    python tools/profile_update.py --flops                  # matmul FLOPs of one update
    python tools/profile_update.py --init-only              # init_state alone, in a fresh process
    PYTHONPATH=/path/to/copy python tools/profile_update.py --impl other_pkg.dreamerv3.agent --impl \
        sb3_worldmodels.dreamerv3.agent                          # side-by-side, step timings interleaved

Every timing is a median over ``--repeats`` runs. With several ``--impl`` modules, each one is built
in this process (init, lower, compile one after the other; the first init of a process also pays
for starting JAX, so take init times from ``--init-only`` runs), then the compiled updates are timed
round-robin, so a busy neighbour on the CPU affects every implementation alike. An ``--impl`` is any
importable copy of the package's ``dreamerv3.agent`` module (e.g. an older version renamed).

Prints one JSON line per implementation (and one for the breakdown).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from sb3_worldmodels.dreamerv3.synthetic import random_batches  # noqa: E402

SIZES = {
    "1m": {},
    "tiny": dict(units=16, deter=32, hidden=16, classes=4, stoch=4, blocks=4, imag_horizon=3),
}


def make_config(args: argparse.Namespace, preset: Callable[..., Any]) -> Any:
    return preset(
        "1m",
        obs_dim=4,
        action_dim=2,
        discrete=not args.continuous,
        batch_size=args.batch,
        batch_length=args.length,
        **SIZES[args.size],
    )


def make_batches(config: Any, k: int, seed: int = 0) -> dict[str, jax.Array]:
    """(K, B, T+1) random replay windows with some episode boundaries."""
    batch = random_batches(config, k, np.random.default_rng(seed), first_rate=0.02)
    return {key: jnp.asarray(value) for key, value in batch.items()}


def block(tree: Any) -> Any:
    return jax.block_until_ready(tree)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = block(fn())
    return time.perf_counter() - t, out


def median_ms(times: list[float]) -> float:
    return round(1000 * float(np.median(times)), 1)


def hlo_size(text: str) -> int:
    """Instruction count of an HLO / StableHLO text (lines with an assignment)."""
    return sum(1 for line in text.splitlines() if " = " in line)


def matmul_flops(jaxpr: Any, mult: int = 1) -> int:
    """FLOPs (2 per multiply-add) of every dot in a jaxpr, inner jaxprs included; a scan's body counts
    once per iteration. Elementwise work is left out: it is memory-bound, not arithmetic-bound."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs, out = eqn.invars[0].aval, eqn.outvars[0].aval
            total += 2 * int(np.prod(out.shape)) * int(np.prod([lhs.shape[i] for i in contract])) * mult
        inner_mult = mult * eqn.params["length"] if eqn.primitive.name == "scan" else mult
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else [value]:
                sub = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
                if hasattr(sub, "eqns"):
                    total += matmul_flops(sub, inner_mult)
    return total


def build(module_name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Init, lower and compile one implementation; returns its timings and the compiled update."""
    agent = importlib.import_module(module_name)
    config_module = importlib.import_module(module_name.rsplit(".", 1)[0] + ".config")
    config = make_config(args, config_module.preset)
    batches = make_batches(config, args.k)
    key = jax.random.PRNGKey(0)
    init_s, state = timed(lambda: agent.init_state(config, key))
    init2_s, _ = timed(lambda: agent.init_state(config, jax.random.PRNGKey(1)))
    t = time.perf_counter()
    traced = agent.train_many_jit.trace(config, state, batches)
    trace_s = time.perf_counter() - t
    t = time.perf_counter()
    lowered = traced.lower()
    lower_s = time.perf_counter() - t
    t = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t
    # policy_step: the other function every config compiles.
    n = 4
    carry = agent.init_carry(config, n)
    obs = jnp.zeros((n, config.obs_dim), jnp.float32)
    first = jnp.ones((n,), bool)
    t = time.perf_counter()
    p_lowered = agent.policy_step_jit.lower(config, agent.policy_params(state), carry, obs, first, key)
    p_lower_s = time.perf_counter() - t
    t = time.perf_counter()
    p_lowered.compile()
    p_compile_s = time.perf_counter() - t
    result = {
        "impl": module_name,
        "init_s_first": round(init_s, 2),
        "init_s_again": round(init2_s, 3),
        "train_many_trace_s": round(trace_s, 2),
        "train_many_lower_s": round(lower_s, 2),
        "train_many_compile_s": round(compile_s, 2),
        "policy_step_lower_s": round(p_lower_s, 2),
        "policy_step_compile_s": round(p_compile_s, 2),
    }
    if args.flops:
        jaxpr = jax.make_jaxpr(lambda s, x: agent.train_many(config, s, x))(state, batches)
        result["gflop_per_update"] = round(matmul_flops(jaxpr.jaxpr) / args.k / 1e9, 2)
    if args.hlo:
        result["train_many_stablehlo_ops"] = hlo_size(lowered.as_text())
        result["train_many_hlo_ops_optimized"] = hlo_size(compiled.as_text())
        result["policy_step_stablehlo_ops"] = hlo_size(p_lowered.as_text())
    _, out = timed(lambda: compiled(state, batches))  # warm-up
    return {"result": result, "compiled": compiled, "state": out[0], "batches": batches, "agent": agent}


def time_init(module_name: str, args: argparse.Namespace) -> dict[str, Any]:
    """init_state in this (fresh) process: the first call includes every compilation it needs."""
    t = time.perf_counter()
    agent = importlib.import_module(module_name)
    config_module = importlib.import_module(module_name.rsplit(".", 1)[0] + ".config")
    import_s = time.perf_counter() - t
    config = make_config(args, config_module.preset)
    first, _ = timed(lambda: agent.init_state(config, jax.random.PRNGKey(0)))
    again = [timed(lambda i=i: agent.init_state(config, jax.random.PRNGKey(i)))[0] for i in range(1, 6)]
    return {
        "impl": module_name,
        "size": args.size,
        "import_s": round(import_s, 2),
        "init_s_first": round(first, 2),
        "init_s_again_median": round(float(np.median(again)), 3),
    }


def time_round_robin(builds: list[dict[str, Any]], repeats: int) -> None:
    times: list[list[float]] = [[] for _ in builds]
    for _ in range(repeats):
        for i, b in enumerate(builds):
            dt, out = timed(lambda b=b: b["compiled"](b["state"], b["batches"]))
            b["state"] = out[0]
            times[i].append(dt)
    for b, ts in zip(builds, times, strict=True):
        k = b["batches"]["reward"].shape[0]
        b["result"]["ms_per_update_median"] = round(median_ms(ts) / k, 1)
        b["result"]["ms_per_update_min"] = round(1000 * min(ts) / k, 1)


# ------------------------------------------------------------------------------------------------
# Breakdown: jitted pieces of one update, each timed on its own
# ------------------------------------------------------------------------------------------------


def breakdown(b: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Compile and median run time of jitted pieces of one update (each piece on its own)."""
    agent = b["agent"]
    nets = importlib.import_module(agent.__name__.rsplit(".", 1)[0] + ".networks")
    config_module = importlib.import_module(agent.__name__.rsplit(".", 1)[0] + ".config")
    config = make_config(args, config_module.preset)
    state = b["state"]
    batch = {key: value[0] for key, value in b["batches"].items()}
    noise = agent.sample_update_noise(config, jax.random.PRNGKey(1), config.batch_size, config.batch_length)
    params, slow, retnorm = state.params, state.slow_critic, state.retnorm
    n = config.batch_size * config.batch_length
    h = config.imag_horizon
    rng = np.random.default_rng(0)
    deter = jnp.asarray(rng.normal(size=(n, config.deter)).astype(np.float32))
    stoch = jax.nn.one_hot(rng.integers(0, config.classes, (n, config.stoch)), config.classes)
    img_feat = jnp.asarray(rng.normal(size=(h, n, config.feat_dim)).astype(np.float32))

    def loss_total(p: dict) -> jax.Array:
        return agent.loss_fn(config, p, slow, retnorm, batch, noise)[0]

    def observe_grad(p: dict) -> Any:
        def total(p: dict) -> jax.Array:
            embed = nets.encode(config, p["enc"], batch["obs"][:, 1:])
            start = agent.Carry(
                batch["deter"][:, 0],
                jax.nn.one_hot(batch["stoch"][:, 0], config.classes),
                batch["action"][:, 0],
            )
            out = agent.observe(
                config, p["dyn"], start, batch["action"][:, :-1], embed, batch["is_first"][:, 1:], noise.post
            )
            return sum(jnp.sum(jnp.square(o)) for o in out)

        return jax.grad(total)(p)

    def imagine(p: dict, d: jax.Array, s: jax.Array) -> Any:
        return agent.imagine(config, {"dyn": p["dyn"], "actor": p["actor"]}, d, s, noise)

    def heads(p: dict, feat: jax.Array) -> Any:
        """Imagined-state heads: actor and critic with gradient, slow critic, reward and continue without."""

        def total(p: dict) -> jax.Array:
            steps = nets.heads(config, {"actor": p["actor"], "critic": p["critic"]}, feat)
            out = steps["actor"][0].sum() + steps["critic"].sum()
            nog = jax.lax.stop_gradient({"slow": slow, "rew": p["rew"], "con": p["con"]})
            frozen = nets.heads(config, {k: nog[k] for k in ("slow", "rew", "con")}, feat)
            return out + sum(x.sum() for x in frozen.values())

        return jax.grad(total)(p)

    opt = agent.make_optimizer(config)
    pieces: dict[str, tuple[Callable[..., Any], tuple]] = {
        "sample_update_noise": (
            jax.jit(lambda k: agent.sample_update_noise(config, k, config.batch_size, config.batch_length)),
            (jax.random.PRNGKey(2),),
        ),
        "observe_fwd_bwd": (jax.jit(observe_grad), (params,)),
        "imagine": (jax.jit(imagine), (params, deter, stoch)),
        "imagined_heads_fwd_bwd": (jax.jit(heads), (params, img_feat)),
        "loss_forward": (jax.jit(loss_total), (params,)),
        "loss_value_and_grad": (jax.jit(jax.value_and_grad(loss_total)), (params,)),
        "optimizer": (jax.jit(lambda g, s, p: opt.update(g, s, p)), (params, state.opt_state, params)),
        "update_with_noise": (
            jax.jit(lambda s: agent.update_with_noise(config, s, batch, noise)[:3]),
            (state,),
        ),
    }
    result: dict[str, Any] = {"impl": agent.__name__, "breakdown_ms_median": {}, "compile_s": {}}
    for name, (fn, fn_args) in pieces.items():
        t = time.perf_counter()
        compiled = fn.lower(*fn_args).compile()
        result["compile_s"][name] = round(time.perf_counter() - t, 2)
        block(compiled(*fn_args))
        times = [timed(lambda c=compiled, a=fn_args: c(*a))[0] for _ in range(args.repeats)]
        result["breakdown_ms_median"][name] = median_ms(times)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--impl", action="append", help="agent module(s); default the package's own")
    parser.add_argument("--size", default="1m", choices=sorted(SIZES))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--k", type=int, default=1, help="updates per train_many call")
    parser.add_argument("--continuous", action="store_true", help="Box(2) actions instead of Discrete(2)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--hlo", action="store_true", help="report HLO instruction counts")
    parser.add_argument("--flops", action="store_true", help="count the matmul FLOPs of one update")
    parser.add_argument(
        "--init-only",
        action="store_true",
        help="time init_state of the first --impl only (use a fresh process)",
    )
    args = parser.parse_args()
    os.environ.setdefault("SB3WM_COMPILATION_CACHE", "off")  # compile times of compiles, not of cache loads
    impls = args.impl or ["sb3_worldmodels.dreamerv3.agent"]
    if args.init_only:
        print(json.dumps(time_init(impls[0], args)), flush=True)
        return
    builds = [build(name, args) for name in impls]
    time_round_robin(builds, args.repeats)
    common = dict(
        size=args.size,
        batch=f"{args.batch}x{args.length}",
        k=args.k,
        discrete=not args.continuous,
        machine=f"{platform.machine()} {jax.devices()[0].platform} x{jax.local_device_count()}",
        jax=jax.__version__,
    )
    for b in builds:
        print(json.dumps({**b["result"], **common}), flush=True)
    if args.breakdown:
        for b in builds:
            print(json.dumps({**breakdown(b, args), **common}), flush=True)


if __name__ == "__main__":
    main()

"""The optimiser step with its moments kept per parameter or as one vector of every parameter.

    python benchmarks/optimizer_layout_speed.py                       # both agents' optimisers
    python benchmarks/optimizer_layout_speed.py --agent dreamerv3 --model-size 12m
    python benchmarks/optimizer_layout_speed.py --seeds 8                # vmapped over 8 seeds

The agents' optimisers keep each moment as one (P,) vector (``blocks.optim.over_flat_parameters``):
a jitted update takes and returns fewer arrays, which an accelerator's runtime charges per array,
at the price of raveling the gradients and splitting the step back into the parameters' shapes
inside the program. This times one optimiser step on the agents' real parameters (TD-MPC2's world
model Adam at ``--size``, DreamerV3's LaProp with AGC and warmup at ``--model-size``), the same step
with the stages over the tree and over the vector, in one jitted call that takes the parameters, the
optimiser state and gradients and returns the new parameters and state (both donated), as the
training call does. The two layouts alternate over ``--rounds`` rounds of ``--repeats`` calls each
(medians of all calls); their parameters after the timed steps are checked equal. One JSON line per
(agent, layout): milliseconds per step, the state's arrays, the ratio per-parameter / vector.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from evaluation import run_record  # noqa: E402

from sb3_worldmodels.blocks import optim  # noqa: E402
from sb3_worldmodels.blocks.cpu import cpu_info  # noqa: E402


def tdmpc2_case(size: int) -> tuple[dict, dict[str, optax.GradientTransformation]]:
    """TD-MPC2's world-model parameters and its Adam, the moments per parameter or as one vector."""
    from sb3_worldmodels.tdmpc2 import agent as core
    from sb3_worldmodels.tdmpc2.config import preset

    config = preset(size, obs_dim=3, action_dim=1)
    params = core._wm_params(core.init_state(config, jax.random.PRNGKey(0)).params)
    betas, scales = (config.beta1, config.beta2), {"encoder": config.enc_lr_scale}
    per_parameter = optim.optimizer(
        [optax.scale_by_adam(*betas, eps=config.eps)], config.learning_rate, lr_scales=scales
    )
    return params, {"per_parameter": per_parameter, "vector": core.make_optimizers(config).world_model}


def dreamerv3_case(model_size: str) -> tuple[dict, dict[str, optax.GradientTransformation]]:
    """DreamerV3's parameters and its LaProp chain, the moments per parameter or as one vector."""
    from sb3_worldmodels.dreamerv3 import agent as core
    from sb3_worldmodels.dreamerv3.config import preset

    config = preset(model_size, obs_dim=4, action_dim=2, discrete=True)
    params = core.init_state(config, jax.random.PRNGKey(0)).params
    direction = [
        optim.scale_by_agc(config.agc, config.agc_pmin),
        optim.scale_by_rms_corrected(config.beta2, config.eps),
        optim.scale_by_momentum_corrected(config.beta1),
    ]
    after = [optim.scale_by_warmup(0)]
    per_parameter = optim.optimizer(direction, config.learning_rate, after=after)
    vector = optim.laprop(
        config.learning_rate, config.beta1, config.beta2, config.eps, config.agc, config.agc_pmin, warmup=0
    )
    return params, {"per_parameter": per_parameter, "vector": vector}


def step_fn(tx: optax.GradientTransformation, seeds: int) -> Any:
    """The jitted step; with ``seeds``, vmapped over a leading seed axis (a seed group's form)."""

    def step(params: dict, opt_state: Any, grads: dict) -> tuple[dict, Any]:
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return jax.jit(jax.vmap(step) if seeds else step, donate_argnums=(0, 1))


def over_seeds(tree: Any, seeds: int) -> Any:
    """``tree`` with a leading seed axis of ``seeds`` copies (``tree`` itself when 0)."""
    return jax.tree_util.tree_map(lambda x: jnp.stack([x] * seeds), tree) if seeds else tree


def copy(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), tree)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agent", choices=["tdmpc2", "dreamerv3", "both"], default="both")
    parser.add_argument("--size", type=int, default=1, help="TD-MPC2's model size")
    parser.add_argument("--model-size", default="1m", help="DreamerV3's model size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=0, help="a seed group's step over this many seeds")
    args = parser.parse_args()
    cases = []
    if args.agent in ("tdmpc2", "both"):
        cases.append((f"tdmpc2 size {args.size} world model Adam", *tdmpc2_case(args.size)))
    if args.agent in ("dreamerv3", "both"):
        cases.append((f'dreamerv3 "{args.model_size}" LaProp', *dreamerv3_case(args.model_size)))
    machine = {**run_record(), **cpu_info().as_dict()}
    for name, params, layouts in cases:
        rng = np.random.default_rng(0)
        grads = jax.tree_util.tree_map(lambda p, r=rng: jnp.asarray(r.normal(size=p.shape), p.dtype), params)
        runs = {}
        grads = over_seeds(grads, args.seeds)
        for layout, tx in layouts.items():
            state = over_seeds((copy(params), tx.init(params)), args.seeds)
            runs[layout] = {"fn": step_fn(tx, args.seeds), "state": state, "ms": []}
            runs[layout]["state"] = runs[layout]["fn"](*runs[layout]["state"], grads)  # compile
            jax.block_until_ready(runs[layout]["state"])
        for _ in range(args.rounds):
            for run in runs.values():
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    run["state"] = run["fn"](*run["state"], grads)
                    jax.block_until_ready(run["state"])
                    run["ms"].append(1e3 * (time.perf_counter() - start))
        ours, theirs = (runs[k]["state"][0] for k in ("vector", "per_parameter"))
        same = all(
            np.allclose(a, b, rtol=1e-5, atol=1e-7)
            for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs), strict=True)
        )
        medians = {k: statistics.median(run["ms"]) for k, run in runs.items()}
        for layout, run in runs.items():
            row = {
                "optimiser": name,
                "seeds": args.seeds,
                "layout": layout,
                "state_arrays": len(jax.tree_util.tree_leaves(run["state"])),
                "ms_median": round(medians[layout], 3),
                "ms_min": round(min(run["ms"]), 3),
                "per_parameter_over_vector": round(medians["per_parameter"] / medians["vector"], 3),
                "same_parameters": same,
                "calls": len(run["ms"]),
                "jax": jax.__version__,
                **machine,
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

"""The gathers, scatters, sorts, searches and top-k of the agents' programs, counted per use with the
line of the package that emits each, in either form of ``blocks.backend`` (gather-free or not).

    python tools/gather_census.py                                 # every program, both forms
    python tools/gather_census.py --gather-free on --agent tdmpc2 --seeds

On a TPU these operations run as gathers, loops and sorts whose time grows with the seed axis
(``sb3_worldmodels.blocks.backend``); the gather-free form should leave only ``top_k`` and the
listed exceptions. Counted in the traced program (jaxpr, every nested jaxpr included), so an operation
used in several places counts once per place; a lowered program's text names a shared private
function once. Tiny configurations (the code paths of any size): DreamerV3 "1m" with the smoke
settings on CartPole shapes (vector) and 8x8 images; TD-MPC2 size 1 with the smoke settings on
Pendulum-like shapes, 64x64 images, and two tasks. ``--seeds``: the programs over a seed axis of 2
(``counted_updates(...).over_seeds``, ``act.over_seeds``) instead of the single-seed ones. Prints one
JSON line per program.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from sb3_worldmodels.blocks.backend import GATHER_FREE_MODES, gather_free, gather_free_forms  # noqa: E402
from sb3_worldmodels.blocks.seeds import counted_updates, stack_trees  # noqa: E402

LOOKUPS = ("gather", "scatter", "scatter-add", "sort", "top_k", "argsort", "searchsorted")
"""Primitives counted (any whose name contains "gather" or "scatter" too)."""

Program = tuple[Any, tuple, dict]
"""(a function with ``trace`` and ``lower``: an agent function's jit, its arguments, its keyword
arguments)."""


def _where(eqn: Any) -> str:
    """The innermost lines of the package in the equation's traceback, innermost first."""
    traceback = eqn.source_info.traceback
    frames = [f for f in (traceback.frames if traceback else ()) if "sb3_worldmodels/" in f.file_name]
    return " <- ".join(f"{f.file_name.split('sb3_worldmodels/')[-1]}:{f.line_num}" for f in frames[:3])


def lookups(jaxpr: Any, within: str = "") -> collections.Counter:
    """{(primitive, where): uses} of :data:`LOOKUPS` in ``jaxpr`` and every jaxpr nested in it; an
    operation inside a library function (``jnp.percentile``) is placed at the package line that
    called it, with the function's name."""
    found: collections.Counter = collections.Counter()
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        here = _where(eqn) or within
        if name in LOOKUPS or "gather" in name or "scatter" in name:
            found[name, here] += 1
        inner = f"{eqn.params.get('name', name)} @ {here}" if name in ("pjit", "jit") else here
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                if isinstance(sub, jex.ClosedJaxpr):
                    found.update(lookups(sub.jaxpr, inner))
                elif isinstance(sub, jex.Jaxpr):
                    found.update(lookups(sub, inner))
    return found


def program_lookups(program: Program) -> collections.Counter:
    """:func:`lookups` of a program (traced with its arguments)."""
    fn, args, kwargs = program
    return lookups(fn.trace(*args, **kwargs).jaxpr.jaxpr)


# ------------------------------------------------------------------------------------------------
# The programs (built under the form in force: the agents' jits keep one program per form)
# ------------------------------------------------------------------------------------------------


def dreamerv3_programs(seeds: int = 0, pixels: bool = False) -> dict[str, Program]:
    """DreamerV3's update and acting step; ``seeds`` > 0: over that many seeds."""
    from sb3_worldmodels.dreamerv3 import agent as core
    from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS, preset
    from sb3_worldmodels.dreamerv3.synthetic import random_batches

    small = {k: v for k, v in SMOKE_SETTINGS.items() if k != "model_size"}
    small.update(batch_size=2, batch_length=3)
    space = (
        dict(obs_dim=0, image_shape=(8, 8, 3), cnn_depth=4, cnn_mults=(1, 2)) if pixels else dict(obs_dim=4)
    )
    config = preset("1m", action_dim=2, discrete=True, **space, **small)
    rng = np.random.default_rng(0)
    batch = random_batches(config, 1, rng)
    n = 3
    if pixels:
        obs: Any = {"image": rng.integers(0, 256, (n, *config.image_shape)).astype(np.uint8)}
    else:
        obs = rng.normal(size=(n, config.obs_dim)).astype(np.float32)
    name = "dreamerv3-pixels" if pixels else "dreamerv3"
    state = core.init_state(config, jax.random.PRNGKey(0))
    carry = core.Carry(
        deter=rng.normal(size=(n, config.deter)).astype(np.float32),
        stoch=np.eye(config.classes, dtype=np.float32)[rng.integers(0, config.classes, (n, config.stoch))],
        action=np.eye(2, dtype=np.float32)[rng.integers(0, 2, n)],
    )
    acting = (core.policy_params(state), carry, obs, np.asarray([True, False, False]), jax.random.PRNGKey(1))
    if not seeds:
        return {
            f"{name}.train": (core.train_many_jit.for_config(config), (state, batch), {}),
            f"{name}.act": (core.policy_step_jit.for_config(config), acting, {}),
        }
    train = counted_updates(core.train_step).over_seeds(config)
    return {
        f"{name}.train_over_seeds": (train, stack_trees([(state, batch, np.int32(1))] * seeds), {}),
        f"{name}.act_over_seeds": (
            core.policy_step_jit.over_seeds(config),
            stack_trees([acting] * seeds),
            {},
        ),
    }


def tdmpc2_programs(seeds: int = 0, pixels: bool = False, tasks: int = 0) -> dict[str, Program]:
    """TD-MPC2's update and acting step (plan for 2 envs); ``tasks`` > 0: a multi-task model."""
    from sb3_worldmodels.tdmpc2 import agent as core
    from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS, preset

    small = {k: v for k, v in SMOKE_SETTINGS.items() if k != "model_size"}
    space: dict = dict(obs_dim=0, image_shape=(64, 64, 3), latent_dim=64, num_channels=4) if pixels else {}
    if tasks:
        space = dict(task_dim=8, action_dims=(1, 2)[:tasks], episode_lengths=(500, 100)[:tasks])
    config = preset(1, **{"obs_dim": 3, "action_dim": 2, **small, **space})
    rng = np.random.default_rng(0)
    h, b, n = config.horizon, config.batch_size, 2
    obs_shape = config.image_shape if pixels else (config.obs_dim,)

    def observations(*lead: int) -> np.ndarray:
        if pixels:
            return rng.integers(0, 256, (*lead, *obs_shape)).astype(np.uint8)
        return rng.normal(size=(*lead, *obs_shape)).astype(np.float32)

    batch = {
        "obs": observations(1, h + 1, b),
        "action": rng.uniform(-1, 1, (1, h, b, 2)).astype(np.float32),
        "reward": rng.normal(size=(1, h, b)).astype(np.float32),
    }
    state = core.init_state(config, jax.random.PRNGKey(0))
    acting = (state.params, observations(n), np.zeros((n, h, 2), np.float32), np.asarray([True, False]))
    acting += (jax.random.PRNGKey(1),)
    task: dict = {}
    if tasks:
        batch["task"] = rng.integers(0, tasks, (1, b)).astype(np.int32)
        task = {"task": np.arange(n, dtype=np.int32) % tasks}
    name = "tdmpc2-multitask" if tasks else "tdmpc2-pixels" if pixels else "tdmpc2"
    if not seeds:
        return {
            f"{name}.train": (core.train_many_jit.for_config(config), (state, batch), {}),
            f"{name}.act": (core.act_jit.for_config(config), acting, task),
        }
    train = counted_updates(core.train_step).over_seeds(config)
    stacked_task = {k: np.stack([v] * seeds) for k, v in task.items()}
    return {
        f"{name}.train_over_seeds": (train, stack_trees([(state, batch, np.int32(1))] * seeds), {}),
        f"{name}.act_over_seeds": (
            core.act_jit.over_seeds(config),
            stack_trees([acting] * seeds),
            stacked_task,
        ),
    }


PROGRAMS: dict[str, Callable[[int], dict[str, Program]]] = {
    "dreamerv3": dreamerv3_programs,
    "dreamerv3-pixels": lambda seeds: dreamerv3_programs(seeds, pixels=True),
    "tdmpc2": tdmpc2_programs,
    "tdmpc2-pixels": lambda seeds: tdmpc2_programs(seeds, pixels=True),
    "tdmpc2-multitask": lambda seeds: tdmpc2_programs(seeds, tasks=2),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--agent", choices=sorted(PROGRAMS), action="append", help="default: every one")
    parser.add_argument(
        "--gather-free", choices=GATHER_FREE_MODES, action="append", help="default: off and on"
    )
    parser.add_argument("--seeds", action="store_true", help="the programs over a seed axis of 2")
    args = parser.parse_args()
    for agent in args.agent or PROGRAMS:
        for mode in args.gather_free or ["off", "on"]:
            with gather_free_forms(mode):
                programs = PROGRAMS[agent](2 if args.seeds else 0)
                for name, program in programs.items():
                    found = program_lookups(program)
                    totals: collections.Counter = collections.Counter()
                    for (primitive, _), uses in found.items():
                        totals[primitive] += uses
                    row = {
                        "program": name,
                        "gather_free": gather_free(),
                        "mode": mode,
                        "uses": dict(sorted(totals.items())),
                        "where": [
                            f"{uses} {primitive} {where}"
                            for (primitive, where), uses in sorted(found.items())
                        ],
                        "backend": jax.default_backend(),
                    }
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

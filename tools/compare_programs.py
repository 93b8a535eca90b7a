"""Whether two copies of the package build the same programs: each agent's update and acting step,
lowered (StableHLO without source locations) and compiled (number of optimised HLO instructions).

    PYTHONPATH=/tmp/base python tools/compare_programs.py --impl sb3wm_base --impl sb3_worldmodels
    python tools/compare_programs.py --impl sb3wm_base --impl sb3_worldmodels --agent tdmpc2

An ``--impl`` is an importable copy of the package (e.g. an older commit's ``sb3_worldmodels``
renamed, on PYTHONPATH). A refactor whose lowered programs are identical compiles to the same
executables, so it keeps the speed by construction; when they differ, time both side by side
(``benchmarks/tdmpc2_speed.py``, ``tools/profile_update.py``). Prints one JSON line per program.
Configurations: TD-MPC2 size 1 on Pendulum shapes (obs 3, action 1); DreamerV3 "tiny" with CartPole
shapes (discrete actions) and with continuous actions (``tools/profile_update.py``).

``compiled_ops_identical``: the optimised programs hold the same operations on the same shapes (a
multiset of (result shape, opcode), loop-carried tuples left out), e.g. when only the order of
independent operations differs in the lowered text.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

import profile_update  # noqa: E402

Lowered = Any


def tdmpc2_programs(impl: str) -> dict[str, Lowered]:
    core = importlib.import_module(f"{impl}.tdmpc2.agent")
    config = importlib.import_module(f"{impl}.tdmpc2.config").preset(1, obs_dim=3, action_dim=1)
    state = core.init_state(config, jax.random.PRNGKey(0))
    h, b = config.horizon, config.batch_size
    rng = np.random.default_rng(0)
    batch = {
        "obs": jnp.asarray(rng.normal(size=(1, h + 1, b, 3)), jnp.float32),
        "action": jnp.asarray(rng.uniform(-1, 1, size=(1, h, b, 1)), jnp.float32),
        "reward": jnp.asarray(rng.normal(size=(1, h, b)), jnp.float32),
        "terminated": jnp.zeros((1, h, b), jnp.float32),
    }
    act_args = (state.params, jnp.zeros((1, 3)), jnp.zeros((1, h, 1)), jnp.zeros((1,), bool))
    # the flag's name in the copy compared (older copies call it eval_mode)
    flag = "deterministic" if "deterministic" in inspect.signature(core.act).parameters else "eval_mode"
    return {
        "tdmpc2.train_many": core.train_many_jit.lower(config, state, batch),
        "tdmpc2.act": core.act_jit.lower(config, *act_args, jax.random.PRNGKey(1), **{flag: False}),
    }


def dreamerv3_programs(impl: str, continuous: bool = False) -> dict[str, Lowered]:
    core = importlib.import_module(f"{impl}.dreamerv3.agent")
    preset = importlib.import_module(f"{impl}.dreamerv3.config").preset
    args = argparse.Namespace(continuous=continuous, batch=4, length=8, size="tiny")
    config = profile_update.make_config(args, preset)
    state = core.init_state(config, jax.random.PRNGKey(0))
    batches = profile_update.make_batches(config, 1)
    n = 2
    policy_args = (core.policy_params(state), core.init_carry(config, n), jnp.zeros((n, config.obs_dim)))
    return {
        "dreamerv3.train_many": core.train_many_jit.lower(config, state, batches),
        "dreamerv3.policy_step": core.policy_step_jit.lower(
            config, *policy_args, jnp.ones((n,), bool), jax.random.PRNGKey(1)
        ),
    }


AGENTS: dict[str, Callable[[str], dict[str, Lowered]]] = {
    "tdmpc2": tdmpc2_programs,
    "dreamerv3": dreamerv3_programs,
    "dreamerv3-continuous": lambda impl: dreamerv3_programs(impl, continuous=True),
}


def program_text(lowered: Lowered) -> str:
    text = re.sub(r"loc\([^)]*\)|#loc\d*", "", lowered.as_text(debug_info=False))
    return re.sub(r"^module @\S+", "module", text)  # the jitted function's name


def compiled_instructions(compiled_text: str) -> list[str]:
    """The instruction lines of an optimised HLO module."""
    return [line for line in compiled_text.splitlines() if re.match(r"\s+(ROOT )?%?[\w.\-]+ = ", line)]


def compiled_ops(instructions: list[str]) -> Counter:
    """(result shape, opcode) of each instruction whose result is not a tuple."""
    ops = (re.match(r"\s+(?:ROOT )?%?[\w.\-]+ = (\S+) ([\w\-]+)", line) for line in instructions)
    return Counter(m.groups() for m in ops if m and not m.group(1).startswith("("))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--impl", action="append", required=True, help="two package names")
    parser.add_argument("--agent", action="append", choices=sorted(AGENTS), help="default: both")
    args = parser.parse_args()
    if len(args.impl) != 2:
        parser.error("give exactly two --impl")
    for agent in args.agent or sorted(AGENTS):
        built = [AGENTS[agent](impl) for impl in args.impl]
        for name in built[0]:
            first, second = built[0][name], built[1][name]
            compiled = [compiled_instructions(x.compile().as_text()) for x in (first, second)]
            row = {
                "program": name,
                "impls": args.impl,
                "lowered_identical": program_text(first) == program_text(second),
                "compiled_ops_identical": compiled_ops(compiled[0]) == compiled_ops(compiled[1]),
                "compiled_instructions": [len(x) for x in compiled],
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

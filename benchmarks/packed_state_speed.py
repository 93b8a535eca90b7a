"""The agents' own training and acting programs with their state passed as it is (one array per leaf)
or packed (one flat array per dtype, unpacked and packed again inside the program): what the number
of arrays a call takes and returns costs on this backend.

    python benchmarks/packed_state_speed.py                          # TD-MPC2 sizes 1 and 5, DreamerV3 "1m"
    python benchmarks/packed_state_speed.py --agent tdmpc2 --size 5 --repeats 50

TD-MPC2's state is 170 arrays (parameters, target Q-functions, both optimisers' moments, scale, key,
count); its acting call takes the 50 parameter arrays. Each program is the config's own
(``for_config``: its matmul precision and the package's compiler options) around the core function;
the packed form wraps the same function as ``fn(packed, ...)`` with ``unpack`` at its start and
``pack`` at its end, so the two compute the same numbers (checked). Both run alternately
``--repeats`` times, each call waited for; one JSON line per (agent, program): medians in ms, the
arrays each form passes, and the ratio.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # profile_update

from evaluation import run_record  # noqa: E402

from sb3_worldmodels.blocks.cpu import cpu_info  # noqa: E402
from sb3_worldmodels.blocks.jit import agent_jit  # noqa: E402


def pack_spec(tree: Any) -> tuple[Any, list[tuple[str, int, tuple[int, ...], int]]]:
    """(treedef, [(dtype, offset, shape, size) per leaf]): where each leaf lives in its dtype's buffer."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    offsets: dict[str, int] = {}
    spec = []
    for leaf in leaves:
        dtype = str(leaf.dtype)
        size = int(np.prod(leaf.shape))
        spec.append((dtype, offsets.get(dtype, 0), tuple(leaf.shape), size))
        offsets[dtype] = offsets.get(dtype, 0) + size
    return treedef, spec


def pack(tree: Any) -> dict[str, jax.Array]:
    """One flat array per dtype, the leaves raveled in tree order."""
    groups: dict[str, list[jax.Array]] = {}
    for leaf in jax.tree_util.tree_leaves(tree):
        groups.setdefault(str(leaf.dtype), []).append(jnp.ravel(leaf))
    return {dtype: jnp.concatenate(parts) for dtype, parts in groups.items()}


def unpack(packed: dict[str, jax.Array], treedef: Any, spec: list) -> Any:
    leaves = [
        jax.lax.slice(packed[dtype], (offset,), (offset + size,)).reshape(shape)
        for dtype, offset, shape, size in spec
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def timed_pair(plain, packed, plain_args, packed_args, repeats: int) -> tuple[float, float]:  # noqa: ANN001
    """Median ms of each, called alternately, each call waited for."""
    jax.block_until_ready(plain(*plain_args))
    jax.block_until_ready(packed(*packed_args))
    a, b = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(plain(*plain_args))
        a.append(time.perf_counter() - start)
        start = time.perf_counter()
        jax.block_until_ready(packed(*packed_args))
        b.append(time.perf_counter() - start)
    return 1e3 * statistics.median(a), 1e3 * statistics.median(b)


def compare(label: str, fn, config: Any, state: Any, args: tuple, repeats: int, returns_state: bool) -> dict:  # noqa: ANN001
    """``fn(config, state, *args)`` as the package runs it, against the packed form."""
    treedef, spec = pack_spec(state)

    def packed_fn(config: Any, packed: dict, *args: Any) -> Any:
        out = fn(config, unpack(packed, treedef, spec), *args)
        if returns_state:
            return (pack(out[0]), *out[1:])
        return out

    packed_fn.__name__ = packed_fn.__qualname__ = f"packed_{getattr(fn, '__name__', 'fn')}"
    plain = agent_jit(fn).for_config(config)
    packed = agent_jit(packed_fn).for_config(config)
    packed_state = jax.block_until_ready(pack(state))
    out_plain = plain(state, *args)
    out_packed = packed(packed_state, *args)
    first_plain = jax.tree_util.tree_leaves(out_plain[0])
    first_packed = jax.tree_util.tree_leaves(
        unpack(out_packed[0], treedef, spec) if returns_state else out_packed[0]
    )
    same = all(
        np.allclose(np.asarray(x), np.asarray(y), atol=1e-6)
        for x, y in zip(first_plain, first_packed, strict=True)
    )
    plain_ms, packed_ms = timed_pair(plain, packed, (state, *args), (packed_state, *args), repeats)
    return {
        "program": label,
        "arrays_plain": len(jax.tree_util.tree_leaves(state)),
        "arrays_packed": len(packed_state),
        "ms_plain": round(plain_ms, 3),
        "ms_packed": round(packed_ms, 3),
        "plain_over_packed": round(plain_ms / packed_ms, 3),
        "same_result": bool(same),
    }


def tdmpc2_rows(size: int, repeats: int) -> list[dict]:
    from sb3_worldmodels.tdmpc2 import agent as core
    from sb3_worldmodels.tdmpc2.config import preset

    config = preset(size, obs_dim=3, action_dim=1, discount=0.975)
    h, b = config.horizon, config.batch_size
    rng = np.random.default_rng(0)
    state = core.init_state(config, jax.random.PRNGKey(0))
    batch = jax.device_put(
        {
            "obs": rng.normal(size=(1, h + 1, b, 3)).astype(np.float32),
            "action": rng.uniform(-1, 1, size=(1, h, b, 1)).astype(np.float32),
            "reward": rng.normal(size=(1, h, b)).astype(np.float32),
        }
    )
    plan = jax.device_put(
        (
            np.zeros((1, 3), np.float32),
            np.zeros((1, h, 1), np.float32),
            np.zeros((1,), bool),
            np.asarray(jax.random.PRNGKey(1)),
        )
    )
    rows = [
        compare(f"tdmpc2 size {size} update", core.train_many, config, state, (batch,), repeats, True),
        compare(f"tdmpc2 size {size} plan", core.act, config, state.params, plan, repeats, False),
    ]
    return rows


def dreamerv3_rows(repeats: int) -> list[dict]:
    from profile_update import make_batches

    from sb3_worldmodels.dreamerv3 import agent as dreamer
    from sb3_worldmodels.dreamerv3.config import preset

    config = preset("1m", obs_dim=4, action_dim=2, discrete=True, batch_size=16, batch_length=64)
    state = dreamer.init_state(config, jax.random.PRNGKey(0))
    batches = make_batches(config, 1)
    return [compare('dreamerv3 "1m" update', dreamer.train_many, config, state, (batches,), repeats, True)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", choices=["tdmpc2", "dreamerv3", "both"], default="both")
    parser.add_argument("--size", type=int, nargs="+", default=[1, 5], help="TD-MPC2 sizes")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    rows = []
    if args.agent in ("tdmpc2", "both"):
        for size in args.size:
            rows += tdmpc2_rows(size, args.repeats)
    if args.agent in ("dreamerv3", "both"):
        rows += dreamerv3_rows(args.repeats)
    machine = {**run_record(), **cpu_info().as_dict()}
    for row in rows:
        row.update(jax=jax.__version__, **machine)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

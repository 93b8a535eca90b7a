"""Seed groups through ``learn``: throughput and memory at 1, 2, 4, ... seeds in one model.

    python benchmarks/seeds_speed.py --agent dreamerv3 --seeds 1 2 4 8      # "1m", 16 envs per seed,
                                                                           # 16x64, train ratio 512
    python benchmarks/seeds_speed.py --agent tdmpc2 --seeds 1 2 4 8         # size 1, Pendulum-v1
    python benchmarks/seeds_speed.py --agent tdmpc2 --seeds 1 2 --smoke     # tiny settings (a check)

Each seed count builds its model (``seed=0`` for one seed: the ordinary single-seed program; a list
``[0, ..., S-1]`` otherwise), runs ``learn`` until the training calls are compiled, then times a
further ``learn``: DreamerV3's milliseconds per update (the wall time over the updates each seed ran)
and TD-MPC2's agent steps per second (each seed plans and updates once per agent step after its seed
steps). The per-seed cost and the ratio to one seed are what a group buys. Memory: the state's and the
replay's megabytes per seed, the accelerator's bytes in use after the run (where the backend reports
it) and the process's peak RSS. Prints one JSON
line per seed count, with the machine, the JAX backend and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from sb3_worldmodels import TDMPC2, DreamerV3  # noqa: E402
from sb3_worldmodels.blocks.cpu import cpu_info  # noqa: E402
from sb3_worldmodels.blocks.jit import compilations, timed_calls  # noqa: E402
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE  # noqa: E402
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE  # noqa: E402

DREAMER = dict(model_size="1m", batch_size=16, batch_length=64, train_ratio=512)
TDMPC2_SETTINGS = dict(model_size=1, seed_steps=250)


def device_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats()
    return None if not stats else int(stats.get("bytes_in_use", 0))


def memory_per_seed(model, n: int) -> dict:
    """The agent state's bytes per seed (parameters, optimiser moments, normalisers, keys: the group's
    stacked state over its seeds) and the replay's, as ``replay_bytes_per_seed`` counts it."""
    leaves = jax.tree_util.tree_leaves(model.policy.state)
    return {
        "state_mb_per_seed": round(sum(leaf.nbytes for leaf in leaves) / n / 2**20, 2),
        "replay_mb_per_seed": round(model.replay_bytes_per_seed / 2**20, 2),
    }


def seed_argument(n: int) -> int | list[int]:
    return 0 if n == 1 else list(range(n))


def lanes(model) -> list:
    return model._lanes if model._lanes is not None else [model]


def timed_learn(model, steps: int) -> tuple[float, dict]:
    """``model.learn(steps)`` continuing the run: its seconds, and the row's fields of it (the seconds,
    the share in the agents' jitted calls, the host's milliseconds per vector step, the vector steps
    and the programs compiled meanwhile)."""
    env, stepped = model.get_env(), [0]
    step_wait = env.step_wait

    def counted() -> tuple:
        stepped[0] += 1
        return step_wait()

    env.step_wait = counted
    try:
        with compilations() as compiled, timed_calls() as calls:
            start = time.perf_counter()
            model.learn(steps, reset_num_timesteps=False)
            seconds = time.perf_counter() - start
    finally:
        del env.step_wait  # the VecEnv's own method again
    if compiled:
        print(f"warning: the timed learn compiled {compiled}", file=sys.stderr)
    return seconds, {
        "timed_s": round(seconds, 2),
        "jitted_fraction": round(calls.seconds / seconds, 3),
        "host_ms_per_step": round(1000 * (seconds - calls.seconds) / max(stepped[0], 1), 2),
        "vector_steps": stepped[0],
        "compiles_timed": len(compiled),
    }


def run_dreamerv3(n: int, smoke: bool, rows: int) -> dict:
    settings = {**DREAMER_SMOKE} if smoke else dict(DREAMER)
    model = DreamerV3("CartPole-v1", n_envs=16 if not smoke else 2, seed=seed_argument(n), **settings)
    start = time.perf_counter()
    model.learn(model.n_envs // n)
    while model._n_updates == 0:  # through the first training call (compiles it)
        model.learn(model.n_envs // n, reset_num_timesteps=False)
    compiled = time.perf_counter() - start
    updates = [lane._n_updates for lane in lanes(model)]
    seconds, timed = timed_learn(model, rows)
    per_seed = min(lane._n_updates - u for lane, u in zip(lanes(model), updates, strict=True))
    return {
        "agent": "dreamerv3",
        "settings": "smoke" if smoke else "1m 16x64 ratio 512, 16 envs per seed",
        "seeds": n,
        "first_learn_s": round(compiled, 1),
        **timed,
        "updates_per_seed": per_seed,
        "ms_per_update": round(1000 * seconds / max(per_seed, 1), 2),
        "updates_per_s_all_seeds": round(n * per_seed / seconds, 2),
        **memory_per_seed(model, n),
    }


def run_tdmpc2(n: int, smoke: bool, steps: int) -> dict:
    settings = {**TDMPC2_SMOKE, "seed_steps": 30} if smoke else dict(TDMPC2_SETTINGS)
    model = TDMPC2("Pendulum-v1", seed=seed_argument(n), **settings)
    start = time.perf_counter()
    model.learn(settings["seed_steps"] + 200 + 2)  # an episode has ended: updates and plans compiled
    compiled = time.perf_counter() - start
    before = model.num_timesteps
    seconds, timed = timed_learn(model, steps)
    done = model.num_timesteps - before
    return {
        "agent": "tdmpc2",
        "settings": "smoke" if smoke else "size 1, Pendulum-v1, 1 env per seed",
        "seeds": n,
        "first_learn_s": round(compiled, 1),
        **timed,
        "agent_steps_per_seed": done,
        "agent_steps_per_s_per_seed": round(done / seconds, 2),
        "agent_steps_per_s_all_seeds": round(n * done / seconds, 2),
        **memory_per_seed(model, n),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agent", choices=("dreamerv3", "tdmpc2"), required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--smoke", action="store_true", help="tiny settings: checks the script runs")
    parser.add_argument("--rows", type=int, default=1024, help="DreamerV3: timed rows per seed")
    parser.add_argument("--steps", type=int, default=100, help="TD-MPC2: timed agent steps per seed")
    args = parser.parse_args()
    first = None
    for n in args.seeds:
        if args.agent == "dreamerv3":
            row = run_dreamerv3(n, args.smoke, args.rows)
            cost = row["ms_per_update"]
        else:
            row = run_tdmpc2(n, args.smoke, args.steps)
            cost = 1.0 / row["agent_steps_per_s_per_seed"]
        first = cost if first is None else first
        row.update(
            time_ratio_to_first=round(cost / first, 3),
            device_bytes_in_use=device_bytes(),
            peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            backend=jax.default_backend(),
            device=str(jax.devices()[0].device_kind),
            cpu=cpu_info().describe(),
            date=datetime.date.today().isoformat(),
        )
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

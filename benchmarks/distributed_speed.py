"""Updates per second of one data-parallel model trained by several processes (``jax.distributed``)
against the same model in one process, with the same global batch.

    python benchmarks/distributed_speed.py                          # both agents, 1 and 2 processes
    python benchmarks/distributed_speed.py --agent tdmpc2 --processes 4 --rounds 3

Every run is launched fresh, on this host's CPU: one process (``data_parallel=True`` on its one device:
the plain program), then ``--processes`` processes on this host, each with one CPU device, joined on the
loopback interface (gloo collectives); the rounds alternate the two, so that a change of the machine's
load reaches both.
Each process fills its replay (no updates), compiles the training call, then times ``--updates``
training calls (one update each, the batch sampled from its replay and sent, the metrics and any
written-back outputs read): ``updates_per_s``; ``parameter_arrays`` counts the arrays of the
parameters, whose gradients the processes add up. It also times the all-gather that a run over several
processes makes after every vector step (``agree_ms``, the mean of 200). The rows (one per run, from
process 0) go to ``benchmarks/results/distributed_speed_<backend>.jsonl`` (appended), with the CPU's
model and vector extensions, the load average, the checkout's commit and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

CONFIGS = {
    "tdmpc2": "TD-MPC2 size 1 on Pendulum-v1 (episodes of 20 steps), batch 256, one env per process",
    "dreamerv3": "DreamerV3 '1m' on CartPole-v1, batch 16 x 64, one env per process",
}
SMOKE = {
    "tdmpc2": "TD-MPC2 smoke settings (batch 16) on Pendulum-v1, one env per process",
    "dreamerv3": "DreamerV3 smoke settings (batch 4 x 8) on CartPole-v1, one env per process",
}
FILL = {"tdmpc2": 100, "dreamerv3": 200}
"""Replay rows each process collects (random actions, no update) before the timed calls."""


def build(agent: str, smoke: bool):  # noqa: ANN201 - the model, of either class
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_worldmodels import TDMPC2, DreamerV3
    from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
    from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE

    if agent == "tdmpc2":
        env = make_vec_env(lambda: gym.make("Pendulum-v1", max_episode_steps=20), n_envs=1)
        settings = {**(TDMPC2_SMOKE if smoke else {"model_size": 1}), "seed_steps": FILL[agent]}
        return TDMPC2(env, seed=0, data_parallel=True, **settings)
    settings = {**DREAMER_SMOKE, "batch_size": 4} if smoke else {"model_size": "1m", "batch_size": 16}
    return DreamerV3(
        "CartPole-v1", n_envs=1, seed=0, data_parallel=True, learning_starts=FILL[agent], **settings
    )


def worker(agent: str, updates: int, smoke: bool) -> None:
    """One process of a run: its replay filled, the training call compiled, ``updates`` calls timed;
    prints one JSON line."""
    import numpy as np

    from sb3_worldmodels.blocks import distributed

    if int(os.environ.get(distributed.COUNT_VARIABLE, "1")) > 1:
        distributed.initialize()
    import jax

    model = build(agent, smoke)
    model.learn(FILL[agent])  # random actions, no update
    assert model._n_updates == 0
    agent_state = model._with_learning_rates(
        model.policy.state["agent"], np.float32(model.current_learning_rate)
    )
    if model._spans_processes:
        agent_state = model._batch_placement.replicate(agent_state)
    size = model._updates_per_call

    def calls(count: int) -> float:
        nonlocal agent_state
        start = time.perf_counter()
        for _ in range(count):
            agent_state, results = model._train_chunk(agent_state, size)
            _, outputs = results.fetch(model.training_batch_axis)  # the metrics read: the call ended
            results.commit(*outputs)
        return time.perf_counter() - start

    compile_s = calls(1)
    calls(2)
    distributed.agree([0])  # every process starts the timed calls together
    seconds = calls(updates)
    start = time.perf_counter()
    for _ in range(200):
        distributed.agree([1, 1, 1])
    agree_ms = (time.perf_counter() - start) / 200 * 1000
    placement = model._batch_placement
    row = {
        "processes": jax.process_count(),
        "devices": 1 if placement is None else len(placement.devices),
        "global_batch": int(model._config.batch_size),
        "batch_per_process": int(model._local_batch_size),
        "parameter_arrays": len(jax.tree_util.tree_leaves(agent_state.params)),
        "updates": updates * size,
        "seconds": round(seconds, 3),
        "updates_per_s": round(updates * size / seconds, 3),
        "ms_per_update": round(seconds / (updates * size) * 1000, 2),
        "first_call_s": round(compile_s, 2),
        "agree_ms": round(agree_ms, 3) if jax.process_count() > 1 else None,
    }
    print(json.dumps(row), flush=True)


def collectives_worker(arrays: int = 50, calls: int = 30) -> None:
    """One process of the collectives' check: the sum over the processes of ``arrays`` arrays of 100
    floats, as ``arrays`` outputs of one program (one all-reduce of that many operands, as a gradient's
    arrays) and as one array of ``arrays`` x 100; milliseconds per program."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from sb3_worldmodels.blocks import distributed

    distributed.initialize()
    mesh = Mesh(np.array(jax.devices()), ("batch",))
    rows = jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("batch")), np.ones((4, arrays, 100), np.float32)
    )
    whole = NamedSharding(mesh, P())
    programs = {
        f"allreduce_{arrays}_arrays_ms": jax.jit(
            lambda a: [a[:, i].sum(0) for i in range(arrays)], out_shardings=whole
        ),
        "allreduce_1_array_ms": jax.jit(lambda a: a.sum(0), out_shardings=whole),
    }
    row: dict[str, object] = {"processes": jax.process_count(), "floats": arrays * 100}
    for name, program in programs.items():
        jax.block_until_ready(program(rows))
        distributed.agree([0])
        start = time.perf_counter()
        for _ in range(calls):
            jax.block_until_ready(program(rows))
        row[name] = round((time.perf_counter() - start) / calls * 1000, 3)
    print(json.dumps(row), flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run(agent: str | None, processes: int, updates: int, smoke: bool) -> dict:
    """One run of ``processes`` processes (fresh); process 0's row. No ``agent``: the collectives' check."""
    from sb3_worldmodels.blocks import distributed

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    command = [sys.executable, __file__, "--worker", "--updates", str(updates)]
    command += ["--agent", agent] if agent else ["--collectives"]
    command += ["--smoke"] if smoke else []
    port = free_port()
    children = []
    for index in range(processes):
        own = dict(env)
        if processes > 1:
            own[distributed.COORDINATOR_VARIABLE] = f"127.0.0.1:{port}"
            own[distributed.COUNT_VARIABLE] = str(processes)
            own[distributed.INDEX_VARIABLE] = str(index)
        children.append(
            subprocess.Popen(command, env=own, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    rows = []
    for child in children:
        stdout, stderr = child.communicate(timeout=3600)
        if child.returncode:
            raise SystemExit(f"a worker failed:\n{stderr[-4000:]}")
        rows.append(json.loads(stdout.strip().splitlines()[-1]))
    return rows[0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agent", choices=sorted(CONFIGS), action="append")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--updates", type=int, default=30, help="timed training calls per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each process count, alternated")
    parser.add_argument("--smoke", action="store_true", help="the smoke settings (a quick check)")
    parser.add_argument(
        "--collectives",
        action="store_true",
        help="only the collectives' check: 50 arrays added up over the processes, as 50 and as one",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    agents = args.agent or ["tdmpc2", "dreamerv3"]
    if args.worker:
        if args.collectives:
            collectives_worker()
        else:
            worker(agents[0], args.updates, args.smoke)
        return
    os.environ["JAX_PLATFORMS"] = "cpu"  # every process on this host's CPU, one device each
    import jax

    from sb3_worldmodels.blocks.cpu import cpu_info

    backend = "cpu"
    out = args.out or RESULTS / f"distributed_speed_{backend}.jsonl"
    date = datetime.date.today().isoformat()

    def git(*words: str) -> str:
        return subprocess.run(["git", *words], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    changed = git("status", "--porcelain", "--", ".", ":!benchmarks/results")  # not the rows written
    commit = (git("rev-parse", "--short", "HEAD") + ("-dirty" if changed else "")) or None
    runs = (
        [(None, args.processes)] * args.rounds
        if args.collectives
        else [
            (agent, processes)
            for agent in agents
            for _ in range(args.rounds)
            for processes in (1, args.processes)
        ]
    )
    for agent, processes in runs:
        row = run(agent, processes, args.updates, args.smoke)
        row = {
            "date": date,
            "agent": agent,
            "config": "collectives" if agent is None else (SMOKE if args.smoke else CONFIGS)[agent],
            **row,
            "backend": backend,
            **cpu_info().as_dict(),
            "load_average": round(os.getloadavg()[0], 2),
            "jax": jax.__version__,
            "commit": commit,
            "command": " ".join(["python", "benchmarks/distributed_speed.py", *sys.argv[1:]]),
        }
        print(json.dumps(row), flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a") as handle:
            handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

"""A first and a second process of the same configuration, one after the other, sharing the persistent
compilation cache (``SB3WM_COMPILATION_CACHE``): seconds from the process's launch to the model built,
to its first action and to the end of its first training call.

    python benchmarks/compile_cache.py                        # DreamerV3 "1m" and TD-MPC2 size 1
    python benchmarks/compile_cache.py --agent tdmpc2 --out /tmp/rows.jsonl

Each configuration starts from an empty cache folder (a new temporary folder, removed afterwards, or
``--cache-dir``): the first process compiles and writes, the second loads. A process that imports the
package runs once before them, so that both find the package's files in the OS's page cache. Each
process (``--child``) measures from its launch (the parent's clock, passed in ``SB3WM_BENCH_LAUNCH``):

- ``model_s``: the model built (its parameters initialised: ``init_params``);
- ``first_action_s``: its first ``predict`` returned (the deterministic acting program);
- ``first_training_call_s``: the end of the first ``train`` call that ran updates, inside ``learn``
  (the stochastic acting program and the training program).

The rows (one per process) go to ``benchmarks/results/compile_cache_<backend>.jsonl`` (appended), with
the CPU's model and vector extensions (``lscpu``), the backend and the device. Runs on any backend
unchanged: JAX picks the accelerator when there is one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

CONFIGS = {
    "dreamerv3": "DreamerV3 on CartPole-v1, 4 envs, model_size '1m', batch 8 x 16, train_ratio 8",
    "tdmpc2": "TD-MPC2 size 1 on Pendulum-v1 (episodes of 20 steps), seed_steps 20: 20 updates in one call",
}


def build(agent: str):  # noqa: ANN201 - the model, of either class
    import gymnasium as gym

    from sb3_worldmodels import TDMPC2, DreamerV3

    if agent == "dreamerv3":
        return DreamerV3(
            "CartPole-v1", n_envs=4, seed=0, model_size="1m", batch_size=8, batch_length=16, train_ratio=8
        )
    return TDMPC2(gym.make("Pendulum-v1", max_episode_steps=20), seed=0, model_size=1, seed_steps=20)


def child(agent: str) -> None:
    """One process: the marks, the compile seconds and the cache's answers, as one JSON line."""
    launch = float(os.environ["SB3WM_BENCH_LAUNCH"])
    import jax

    import sb3_worldmodels  # noqa: F401
    from sb3_worldmodels.blocks.compile_cache import compilation_cache_dir
    from sb3_worldmodels.blocks.jit import COMPILE_EVENT, cache_events

    marks = {"import_s": time.time() - launch}
    compile_seconds = [0.0]

    def compiled(event: str, duration_secs: float, **kwargs: str | int) -> None:
        if event == COMPILE_EVENT:
            compile_seconds[0] += duration_secs

    jax.monitoring.register_event_duration_secs_listener(compiled)
    with cache_events() as events:
        model = build(agent)
        marks["model_s"] = time.time() - launch
        model.predict(model.env.reset(), deterministic=True)
        marks["first_action_s"] = time.time() - launch
        train, first_call = model.train, []

        def timed_train(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            updates = model._n_updates
            train(*args, **kwargs)
            if not first_call and model._n_updates > updates:
                first_call.append(time.time() - launch)

        model.train = timed_train
        while not first_call:
            model.learn(model.n_envs, reset_num_timesteps=False)
        marks["first_training_call_s"] = first_call[0]
    row = {key: round(value, 2) for key, value in marks.items()}
    row.update(
        compile_s=round(compile_seconds[0], 2),
        updates_in_first_call=int(model._n_updates),
        hits=events.hits,
        written=events.written,
        misses_not_written=dict(Counter(name for name in events.misses if name not in events.written)),
        cache_dir=compilation_cache_dir(),
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        backend=jax.default_backend(),
        device=str(jax.devices()[0].device_kind),
        jax=jax.__version__,
    )
    print(json.dumps(row), flush=True)


def run_process(agent: str, cache_dir: Path) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))
    }
    env.update(
        SB3WM_COMPILATION_CACHE=str(cache_dir),
        SB3WM_BENCH_LAUNCH=repr(time.time()),
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    result = subprocess.run(
        [sys.executable, __file__, "--child", agent], env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"{agent} process failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*-cache"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agent", action="append", choices=list(CONFIGS), help="default: both")
    parser.add_argument(
        "--cache-dir", type=Path, help="an empty folder for the cache (default: a temporary one)"
    )
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/compile_cache_<backend>.jsonl")
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    subprocess.run([sys.executable, "-c", "import sb3_worldmodels"], cwd=ROOT, check=True)  # page cache
    from sb3_worldmodels.blocks.cpu import cpu_info

    machine = cpu_info().as_dict()
    command = "python benchmarks/compile_cache.py " + " ".join(sys.argv[1:])
    for agent in args.agent or list(CONFIGS):
        folder = args.cache_dir / agent if args.cache_dir else Path(tempfile.mkdtemp(prefix="sb3wm-cache-"))
        try:
            for process in ("first", "second"):
                row = {"agent": agent, "config": CONFIGS[agent], "process": process}
                row["load_average_before"] = round(os.getloadavg()[0], 2)  # other jobs on the machine
                row.update(run_process(agent, folder))
                row.update(cache_bytes=folder_bytes(folder), **machine)
                row.update(date=datetime.date.today().isoformat(), command=command.strip())
                print(json.dumps(row), flush=True)
                out = args.out or RESULTS / f"compile_cache_{row['backend']}.jsonl"
                with open(out, "a") as handle:
                    handle.write(json.dumps(row) + "\n")
        finally:
            if not args.cache_dir:
                shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

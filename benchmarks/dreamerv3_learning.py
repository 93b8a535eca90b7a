"""DreamerV3 learning checks on Gymnasium's classic control tasks.

    python benchmarks/dreamerv3_learning.py --task pendulum --seed 0   # 20,000 rows, "1m", 16 envs, ratio 512
    python benchmarks/dreamerv3_learning.py --task cartpole --seed 0   # 24,000 rows, same settings
    python benchmarks/dreamerv3_learning.py --task cartpole --seeds 0 1 2 3 4   # five seeds in one model
    python benchmarks/dreamerv3_learning.py --task pendulum --seeds 0 1 --smoke  # tiny settings, < 1 min

Acceptance (written before any run): Pendulum-v1, final evaluation (10 episodes) >= -300;
CartPole-v1, mean evaluation of the sampling policy (10 episodes every 2,000 rows) over rows
12,000-24,000 >= 250.

``--seeds`` trains every seed in one seed group (``DreamerV3(env, seed=[...])``) and evaluates each
seed's model (``seed_model(i)``) with the same protocol as a single-seed run; the result reports each
seed's score and verdict, their mean, interquartile mean and the number of seeds that pass.

The run is checkpointed every ``--chunk`` rows (default: at every evaluation) with its model,
replay, curves and, between episodes, its envs, in
benchmarks/results/checkpoints/dreamerv3_<task>_seed<seed>/ (``..._seeds0-4/`` for a group); the same
command resumes from there, so a check can span several processes: ``--stop-after-hours`` ends a
process cleanly after a segment that passes it, ``--budget-s`` before a segment that would end past
that many seconds from the process's start. The train/* statistics go to progress.csv files in that
folder (one per process). Writes the result to benchmarks/results/dreamerv3_<task>_seed<seed>.json
(``..._seeds0-4.json``), with ``"done": false`` until the last row.

``--eval-envs N`` runs an evaluation's 10 episodes on N envs at once (one ``predict`` per step for
all of them; ``evaluation.evaluate_fresh``): the same protocol with other initial states and draws,
for accelerator hosts where the 10 x 500 one-by-one steps of a CartPole-v1 evaluation cost more than
the training between two evaluations. The result's ``command`` records it; the default is 1.

``--smoke``: the smallest DreamerV3 (``SMOKE_SETTINGS``), 1 env per seed, two Pendulum-v1 episodes
(402 rows, a checkpoint after each: 201 rows) and 1 evaluation episode; the result and checkpoints
go to benchmarks/results/checkpoints/smoke/ unless ``--results``/``--checkpoint`` say otherwise.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from evaluation import (
    brief,
    check_result,
    evaluate_fresh,
    group_name,
    learn_in_segments,
    run_record,
    script_command,
)
from stable_baselines3.common.logger import configure
from stable_baselines3.common.monitor import Monitor

from sb3_worldmodels import DreamerV3
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS

TASKS = {
    "pendulum": dict(env="Pendulum-v1", rows=20_000, threshold=-300.0, deterministic=False),
    "cartpole": dict(env="CartPole-v1", rows=24_000, threshold=250.0, deterministic=False),
}
PAPER_ERA = dict(model_size="1m", n_envs=16, train_ratio=512, batch_size=16, batch_length=64)
EVAL_EVERY = 2_000
EVAL_EPISODES = 10
SMOKE = dict(settings={**SMOKE_SETTINGS, "n_envs": 1}, rows=402, eval_every=201, episodes=1)
"""The smoke run: two Pendulum-v1 episodes of one env (200 steps and the last row: 201 rows each)."""
RESULTS = Path(__file__).parent / "results"


def score_of(task: str, curve: list[dict], smoke: bool) -> float:
    """Pendulum: the last evaluation; CartPole: the mean of the evaluations from half the check's rows
    on (12,000-24,000 rows)."""
    if task == "pendulum":
        return curve[-1]["eval_mean"] if curve else float("nan")
    half = (SMOKE["rows"] if smoke else TASKS[task]["rows"]) // 2
    return float(np.mean([p["eval_mean"] for p in curve if p["rows"] >= half] or [np.nan]))


def main(argv: list[str] | None = None) -> dict:
    started = time.time()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=TASKS, default="pendulum")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--seed", type=int, default=0)
    which.add_argument("--seeds", type=int, nargs="+", help="several seeds, trained as one seed group")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument(
        "--chunk", type=int, default=None, help="rows between checkpoints (default: the evaluation interval)"
    )
    parser.add_argument(
        "--checkpoint", type=Path, default=None, help="checkpoint folder (default: see above)"
    )
    parser.add_argument("--results", type=Path, default=None, help="folder of the result file")
    parser.add_argument("--stop-after-hours", type=float, default=None)
    parser.add_argument(
        "--budget-s", type=float, default=None, help="stop before a segment would end past this (seconds)"
    )
    parser.add_argument(
        "--eval-envs", type=int, default=1, help="envs an evaluation's episodes run on at once (see above)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny settings (see above)")
    args = parser.parse_args(argv)
    if not 1 <= args.eval_envs <= EVAL_EPISODES:
        parser.error(f"--eval-envs must be between 1 and the {EVAL_EPISODES} episodes of an evaluation")
    task = TASKS[args.task]
    settings = SMOKE["settings"] if args.smoke else PAPER_ERA
    rows = args.rows or (SMOKE["rows"] if args.smoke else task["rows"])
    eval_every = SMOKE["eval_every"] if args.smoke else EVAL_EVERY
    episodes = SMOKE["episodes"] if args.smoke else EVAL_EPISODES
    seed: int | list[int] = args.seed if args.seeds is None else args.seeds
    name = f"dreamerv3_{args.task}_" + (f"seed{args.seed}" if args.seeds is None else group_name(args.seeds))
    results = args.results or (RESULTS / "checkpoints" / "smoke" if args.smoke else RESULTS)
    checkpoint = args.checkpoint or RESULTS / "checkpoints" / ("smoke" if args.smoke else "") / name

    def make_model() -> DreamerV3:
        return DreamerV3(task["env"], seed=seed, **settings)

    def make_eval_env(seed: int) -> gym.Env:
        env = Monitor(gym.make(task["env"]))
        env.reset(seed=seed)
        return env

    stop = None if args.stop_after_hours is None else 3600 * args.stop_after_hours
    model, record = learn_in_segments(
        make_model,
        rows,
        evaluate_fresh(make_eval_env, None, episodes, task["deterministic"], min(args.eval_envs, episodes)),
        eval_every=eval_every,
        checkpoint_every=args.chunk or eval_every,
        checkpoint=checkpoint,
        x_key="rows",
        stop_after_seconds=stop,
        logger=lambda start: configure(str(checkpoint / f"log_from_{start}"), ["csv"]),
        budget_seconds=args.budget_s,
        started=started,
    )
    where = run_record(script_command(__file__, argv))
    result = check_result(
        args.task,
        args.seed,
        args.seeds,
        model,
        record,
        lambda curve: score_of(args.task, curve, args.smoke),
        task["threshold"],
        "rows",
        settings,
        where,
    )
    out = results / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(brief(result)))
    return result


if __name__ == "__main__":
    main()

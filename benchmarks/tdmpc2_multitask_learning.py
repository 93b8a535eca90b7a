"""TD-MPC2 multi-task learning check: one model trained offline on a pool of our own runs.

    python benchmarks/tdmpc2_multitask_learning.py single --task cartpole-balance   # 8,000 agent steps
    python benchmarks/tdmpc2_multitask_learning.py single --task reacher-easy       # 8,000 agent steps
    python benchmarks/tdmpc2_multitask_learning.py multi                            # 10,000 updates
    python benchmarks/tdmpc2_multitask_learning.py multi --seeds 0 1 2   # three seeds in one model

``single``: a size-1 TDMPC2 learns the dm_control task online (action repeat 2, seed 0; checkpointed
and resumable as benchmarks/tdmpc2_learning.py), then its whole replay is exported
(``export_episodes``) and the agent and a uniform random policy are evaluated (10 episodes each;
the agent deterministic). ``multi``: the exports are pooled (``pool_tasks``; cartpole-balance has 5
observations and 1 action, reacher-easy 6 and 2, so padding and action masks are exercised) and a
size-1 ``TDMPC2MultiTask`` trains on the pool offline for 10,000 gradient updates (batch 256, the
reference's default), evaluated on every task (2 deterministic episodes, ``MultiTaskEvalCallback``)
every 2,500 updates and with 10 at the end.

Acceptance (written before any run): for each task, the multi-task model's final evaluation is at
least ``random + 0.5 * (single - random)``, half of the single-task agent's margin over the random
policy, where ``single`` is the agent whose replay is in the pool. A task whose single-task agent is
not at least 100 above random carries no evidence and is reported as such, not counted as a pass.
Results: benchmarks/results/tdmpc2_multitask_<task>.json (single) and tdmpc2_multitask.json (multi).

``multi --seeds 0 1 2`` trains the multi-task model as a seed group (``TDMPC2MultiTask(pool,
seed=[0, 1, 2])``, one program; every seed samples its own windows from the same pool) and evaluates
each seed as above; the pool and the bars are those of the single-seed check. The result,
tdmpc2_multitask_seeds0-2.json, holds per task each seed's score and verdict, their mean and
interquartile mean and the seeds that pass; a seed passes the check when it passes on every task.

``multi --tasks reacher-easy --seeds 0 1 2`` is the offline control of a task: the same offline
training (``TDMPC2MultiTask``, the same updates, evaluations and bar) on that task's export alone, so a
task that fails the check can be told apart as lost to sharing the model with the other task or to
learning offline from the pool's data; result tdmpc2_offline_<tasks>_seeds0-2.json.

``--smoke`` (both phases): the smallest TD-MPC2 (``SMOKE_SETTINGS``), one episode per task (50 random
steps), 20 updates at batch 16 and one evaluation episode, in benchmarks/results/checkpoints/smoke/.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import numpy as np
from evaluation import evaluate_fresh, group_name, learn_in_segments, run_record, script_command, seeds_result
from gymnasium.wrappers import FlattenObservation
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure

from sb3_worldmodels import (
    TDMPC2,
    ActionRepeat,
    MultiTaskEvalCallback,
    TDMPC2MultiTask,
    export_episodes,
    pool_tasks,
)
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS

TASKS = ("cartpole-balance", "reacher-easy")
ACTION_REPEAT = 2
SINGLE_STEPS = 8_000
UPDATES = 10_000
EVAL_EVERY_UPDATES = 2_500
EVAL_EPISODES, FINAL_EPISODES = 2, 10
SEED = 0
RESULTS = Path(__file__).parent / "results"
DATA = RESULTS / "checkpoints" / "tdmpc2_multitask"
FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures"
SMOKE = dict(
    settings=SMOKE_SETTINGS,  # batches of 16
    seed_steps=50,
    single_steps=500,
    updates=20,
    eval_every=10,
    episodes=1,
)
"""The smoke run: one episode per task online (500 agent steps), 20 offline updates."""


def make_env(task: str, seed: int = 0):
    """One seeded dm_control env of the task (a gymnasium env), with the action repeat."""
    import gymnasium as gym
    import shimmy  # noqa: F401  (registers dm_control ids)

    env = ActionRepeat(gym.make(f"dm_control/{task}-v0"), repeat=ACTION_REPEAT)
    env.reset(seed=seed)
    return env


def make_vec(task: str, seed: int = 0):
    import shimmy  # noqa: F401

    wrapper = {"wrapper_class": ActionRepeat, "wrapper_kwargs": {"repeat": ACTION_REPEAT}}
    return make_vec_env(f"dm_control/{task}-v0", n_envs=1, seed=seed, **wrapper)


def random_returns(task: str, episodes: int, seed: int) -> list[float]:
    env = make_env(task, seed)
    env.action_space.seed(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns


def single(task: str, smoke: bool = False, argv: list[str] | None = None) -> None:
    data, results = where(smoke)
    checkpoint = data / f"single_{task}"
    settings = {**SMOKE["settings"], "seed_steps": SMOKE["seed_steps"]} if smoke else {"model_size": 1}

    def make_model() -> TDMPC2:
        return TDMPC2("MlpPolicy", make_vec(task, SEED), **settings, action_repeat=ACTION_REPEAT, seed=SEED)

    episodes = SMOKE["episodes"] if smoke else 10
    evaluate = evaluate_fresh(functools.partial(make_vec, task), SEED, episodes, deterministic=True)
    model, record = learn_in_segments(
        make_model,
        SMOKE["single_steps"] if smoke else SINGLE_STEPS,
        evaluate,
        eval_every=0,
        checkpoint_every=1_000,
        checkpoint=checkpoint,
        action_repeat=ACTION_REPEAT,
        logger=lambda start: configure(str(checkpoint / f"log_from_{start}"), ["csv"]),
    )
    if not record["done"]:
        return
    export = export_episodes(model, data / f"{task}.npz")
    rand = random_returns(task, episodes, 20_000)
    result = {
        "task": task,
        "steps": model.num_timesteps,
        "updates": model._n_updates,
        "wall_seconds": record["seconds"],
        "single": record["curve"][-1]["eval_mean"],
        "single_returns": record["curve"][-1]["eval_returns"],
        "random": float(np.mean(rand)),
        "random_returns": rand,
        "export": str(export.resolve().relative_to(RESULTS.resolve().parent.parent)),
        **run_record(script_command(__file__, argv)),
        "train_curve": record["train_curve"],
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / f"tdmpc2_multitask_{task}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "train_curve"}))


def where(smoke: bool) -> tuple[Path, Path]:
    """The folders of the run's data (exports, pool, logs) and of its result files."""
    if smoke:
        return DATA.parent / "smoke" / "tdmpc2_multitask", RESULTS / "checkpoints" / "smoke"
    return DATA, RESULTS


def task_verdict(score: float, single: float, rand: float) -> dict:
    """One task's verdict: the bar (half the single-task agent's margin over random) and the pass."""
    bar = rand + 0.5 * (single - rand)
    evidence = single - rand >= 100.0
    return {
        "multitask": score,
        "single": single,
        "random": rand,
        "bar": bar,
        "normalised": (score - rand) / (single - rand) if single != rand else None,
        "evidence": evidence,
        "passed": bool(evidence and score >= bar),
    }


def multi(
    seeds: list[int] | None = None,
    smoke: bool = False,
    argv: list[str] | None = None,
    tasks: tuple[str, ...] = TASKS,
) -> dict:
    """The offline model on the pool of ``tasks``' exports (all: the multi-task check; fewer: the
    offline control of those tasks), its evaluations and verdicts; writes and returns the result."""
    data, results = where(smoke)
    singles = {task: json.loads((results / f"tdmpc2_multitask_{task}.json").read_text()) for task in tasks}
    name = "multitask" if tasks == TASKS else "offline_" + "+".join(tasks)
    pool = pool_tasks({task: data / f"{task}.npz" for task in tasks}, data / f"pool_{name}", overwrite=True)
    settings = SMOKE["settings"] if smoke else {"model_size": 1}
    model = TDMPC2MultiTask(pool, **settings, seed=SEED if seeds is None else seeds)
    group = "" if seeds is None else f"_{group_name(seeds)}"
    model.set_logger(configure(str(data / f"{name}{group}_log"), ["csv"]))
    envs = {task: FlattenObservation(make_env(task, SEED)) for task in tasks}
    episodes, final_episodes = (SMOKE["episodes"],) * 2 if smoke else (EVAL_EPISODES, FINAL_EPISODES)
    every = SMOKE["eval_every"] if smoke else EVAL_EVERY_UPDATES
    callback = MultiTaskEvalCallback(envs, eval_freq=every, n_eval_episodes=episodes, verbose=1)
    start = time.time()
    model.learn(SMOKE["updates"] if smoke else UPDATES, callback=callback, log_interval=1_000)
    if seeds is None:
        finals = [model.evaluate(envs, n_eval_episodes=final_episodes)]
    else:
        finals = [model.evaluate(envs, final_episodes, seed_index=i) for i in range(len(seeds))]
    seconds = time.time() - start
    model.save(data / f"{name}{group}.npz")
    verdicts = [
        {task: task_verdict(final[task], singles[task]["single"], singles[task]["random"]) for task in tasks}
        for final in finals
    ]
    result = {
        "updates": model.num_timesteps,
        "wall_seconds": round(seconds, 1),
        "pool": {
            "entries": pool.num_entries,
            "episodes": pool.num_episodes,
            "obs_dim": pool.obs_dim,
            "action_dim": pool.action_dim,
            "tasks": list(pool.tasks),
        },
    }
    if seeds is None:
        tasks = verdicts[0]
        result.update(tasks=tasks, passed=all(t["passed"] for t in tasks.values()))
    else:
        passed = [all(t["passed"] for t in v.values()) for v in verdicts]
        result["seeds"] = seeds
        result["tasks"] = {
            task: {
                **{k: verdicts[0][task][k] for k in ("single", "random", "bar", "evidence")},
                **seeds_result(
                    [v[task]["multitask"] for v in verdicts], [v[task]["passed"] for v in verdicts]
                ),
                "per_seed": [
                    {"seed": seed, "score": v[task]["multitask"], "passed": v[task]["passed"]}
                    for seed, v in zip(seeds, verdicts, strict=True)
                ],
            }
            for task in tasks
        }
        result.update(n_passed=sum(passed), n_seeds=len(seeds), per_seed_passed=passed)
    result.update(settings=settings, **run_record(script_command(__file__, argv)), curve=callback.evaluations)
    (results / f"tdmpc2_{name}{group}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}))
    return result


def plot() -> None:
    """One SVG per task in docs/figures/: the multi-task model's evaluations over updates, its final
    score, and the single-task agent's and the random policy's scores, with the bar dashed."""
    from plot_curves import reference_levels, svg_chart

    result = json.loads((RESULTS / "tdmpc2_multitask.json").read_text())
    figures = FIGURES
    for task, scores in result["tasks"].items():
        series = [
            *reference_levels(scores["single"], scores["random"], result["updates"]),
            {
                "x": [p["updates"] for p in result["curve"]],
                "y": [p[task] for p in result["curve"]],
                "color": "#9bbcd6",
                "width": 1,
                "dots": True,
                "label": f"multi-task, every {EVAL_EVERY_UPDATES:,} updates ({EVAL_EPISODES} episodes)",
            },
            {
                "x": [result["updates"]],
                "y": [scores["multitask"]],
                "color": "#c0392b",
                "width": 2,
                "dots": True,
                "label": f"multi-task, final ({FINAL_EPISODES} episodes)",
            },
        ]
        title = f"{task}: multi-task {scores['multitask']:.1f} ({'pass' if scores['passed'] else 'fail'})"
        target = figures / f"tdmpc2_multitask_{task}.svg"
        target.write_text(svg_chart(series, scores["bar"], title, "updates"))
        print(target)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("phase", choices=["single", "multi", "plot"])
    parser.add_argument("--task", choices=TASKS, default=TASKS[0])
    parser.add_argument(
        "--seeds", type=int, nargs="+", help="multi: several seeds, trained as one seed group"
    )
    parser.add_argument(
        "--tasks", choices=TASKS, nargs="+", help="multi: these tasks' exports only (an offline control)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny settings (see above)")
    args = parser.parse_args(argv)
    if args.seeds is not None and args.phase != "multi":
        parser.error("--seeds is for the multi phase (the pool is the single-task agents' of seed 0)")
    if args.tasks is not None and args.phase != "multi":
        parser.error("--tasks is for the multi phase (single takes --task)")
    if args.phase == "single":
        single(args.task, args.smoke, argv)
    elif args.phase == "multi":
        multi(args.seeds, args.smoke, argv, TASKS if args.tasks is None else tuple(args.tasks))
    else:
        plot()


if __name__ == "__main__":
    main()

"""TD-MPC2 multi-task learning check (CPU): one model trained offline on a pool of our own runs.

    python benchmarks/tdmpc2_multitask_learning.py single --task cartpole-balance   # 8,000 agent steps
    python benchmarks/tdmpc2_multitask_learning.py single --task reacher-easy       # 8,000 agent steps
    python benchmarks/tdmpc2_multitask_learning.py multi                            # 10,000 updates

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
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import numpy as np
from evaluation import evaluate_fresh, learn_in_segments, run_record
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


def single(task: str) -> None:
    checkpoint = DATA / f"single_{task}"

    def make_model() -> TDMPC2:
        return TDMPC2("MlpPolicy", make_vec(task, SEED), model_size=1, action_repeat=ACTION_REPEAT, seed=SEED)

    evaluate = evaluate_fresh(functools.partial(make_vec, task), SEED, 10, deterministic=True)
    model, record = learn_in_segments(
        make_model,
        SINGLE_STEPS,
        evaluate,
        eval_every=0,
        checkpoint_every=1_000,
        checkpoint=checkpoint,
        action_repeat=ACTION_REPEAT,
        logger=lambda start: configure(str(checkpoint / f"log_from_{start}"), ["csv"]),
    )
    if not record["done"]:
        return
    export = export_episodes(model, DATA / f"{task}.npz")
    rand = random_returns(task, 10, 20_000)
    result = {
        "task": task,
        "steps": model.num_timesteps,
        "updates": model._n_updates,
        "wall_seconds": record["seconds"],
        "single": record["curve"][-1]["eval_mean"],
        "single_returns": record["curve"][-1]["eval_returns"],
        "random": float(np.mean(rand)),
        "random_returns": rand,
        "export": str(export.relative_to(RESULTS.parent.parent)),
        **run_record(),
        "train_curve": record["train_curve"],
    }
    (RESULTS / f"tdmpc2_multitask_{task}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "train_curve"}))


def multi() -> None:
    singles = {task: json.loads((RESULTS / f"tdmpc2_multitask_{task}.json").read_text()) for task in TASKS}
    pool = pool_tasks({task: DATA / f"{task}.npz" for task in TASKS}, DATA / "pool", overwrite=True)
    model = TDMPC2MultiTask(pool, model_size=1, seed=SEED)
    model.set_logger(configure(str(DATA / "multi_log"), ["csv"]))
    envs = {task: FlattenObservation(make_env(task, SEED)) for task in TASKS}
    callback = MultiTaskEvalCallback(
        envs, eval_freq=EVAL_EVERY_UPDATES, n_eval_episodes=EVAL_EPISODES, verbose=1
    )
    start = time.time()
    model.learn(UPDATES, callback=callback, log_interval=1_000)
    final = model.evaluate(envs, n_eval_episodes=FINAL_EPISODES)
    seconds = time.time() - start
    model.save(DATA / "multitask.npz")
    tasks = {}
    for task in TASKS:
        single, rand = singles[task]["single"], singles[task]["random"]
        bar = rand + 0.5 * (single - rand)
        evidence = single - rand >= 100.0
        tasks[task] = {
            "multitask": final[task],
            "single": single,
            "random": rand,
            "bar": bar,
            "normalised": (final[task] - rand) / (single - rand) if single != rand else None,
            "evidence": evidence,
            "passed": bool(evidence and final[task] >= bar),
        }
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
        "tasks": tasks,
        "passed": all(t["passed"] for t in tasks.values()),
        **run_record(),
        "curve": callback.evaluations,
    }
    (RESULTS / "tdmpc2_multitask.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}))


def plot() -> None:
    """One SVG per task in docs/figures/: the multi-task model's evaluations over updates, its final
    score, and the single-task agent's and the random policy's scores, with the bar dashed."""
    from plot_curves import svg_chart

    result = json.loads((RESULTS / "tdmpc2_multitask.json").read_text())
    figures = FIGURES
    ends = [0, result["updates"]]
    for task, scores in result["tasks"].items():
        series = [
            {
                "x": ends,
                "y": [scores["single"]] * 2,
                "color": "#27ae60",
                "width": 1,
                "label": "single-task agent",
            },
            {
                "x": ends,
                "y": [scores["random"]] * 2,
                "color": "#7f8c8d",
                "width": 1,
                "label": "random policy",
            },
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["single", "multi", "plot"])
    parser.add_argument("--task", choices=TASKS, default=TASKS[0])
    args = parser.parse_args()
    if args.phase == "single":
        single(args.task)
    elif args.phase == "multi":
        multi()
    else:
        plot()


if __name__ == "__main__":
    main()

"""TD-MPC2 learning checks.

    python benchmarks/tdmpc2_learning.py --task pendulum --seed 0      # Pendulum-v1, size 1, 6,000 steps
    python benchmarks/tdmpc2_learning.py --task cartpole-balance --seed 0
        # dm_control cartpole-balance, size 1, action repeat 2, 10,000 agent steps
    python benchmarks/tdmpc2_learning.py --task cartpole-balance-pixels --seed 0 --eval-every 0
        # the same from pixels: 64x64 RGB, camera 0, 3 stacked frames, pixel encoder with 8 channels
    python benchmarks/tdmpc2_learning.py --task pendulum --seeds 0 1 2 3 4   # five seeds in one model
    python benchmarks/tdmpc2_learning.py --task pendulum --seeds 0 1 --smoke  # tiny settings, < 1 min

Acceptance (written before any run): Pendulum-v1, final evaluation (10 episodes, deterministic) >= -300
(seed library: -143 and -124); cartpole-balance, final evaluation >= 800 (seed library: 810 and 854).
cartpole-balance from pixels (written 2026-12-03, before its first run), final evaluation >= 510: halfway
from a random policy (293.0 over 10 episodes, benchmarks/results/tdmpc2_multitask.json) to the weakest
of the three state-based seeds at the same 10,000 steps (727.0, seed 2).
An evaluation of 10 deterministic episodes runs every ``--eval-every`` agent steps (default 1,000; each
costs as many plans as its episodes have steps) and at the end; the returns of the training episodes
are recorded too. ``--eval-envs N`` runs an evaluation's episodes on N envs at once (one ``predict``
per step for all of them; ``evaluation.evaluate_fresh``): the same protocol with other initial states
than one env's, recorded in the result's command; ``--eval-processes`` steps each of them in a
process of its own, for the pixel task on a host with cores to spare (its frames render in parallel).
``--env-processes`` does the same for the training envs (one per seed): the same run, except that a
checkpoint keeps no envs, so a resumed run starts new episodes from the envs' seeds.

``--seeds`` trains every seed in one seed group (``TDMPC2(env, seed=[...])``, one env per seed) and
evaluates each seed's model (``seed_model(i)``) with the same protocol as a single-seed run; the
result reports each seed's score and verdict, their mean, interquartile mean and the number of seeds
that pass.

The run is checkpointed every ``--chunk`` agent steps (default 1,000: two cartpole-balance episodes,
five of Pendulum-v1) with its model, replay, curves and, between episodes, its envs, in
benchmarks/results/checkpoints/tdmpc2_<task>_seed<seed>/ (``..._seeds0-4/`` for a group), and the same
command resumes from there: ``--stop-after-hours`` ends a process cleanly after a segment that passes
it, ``--budget-s`` before a segment that would end past that many seconds from the process's start.
train/* statistics go to progress.csv files in that folder. Writes the result to
benchmarks/results/tdmpc2_<task>_seed<seed>.json (``..._seeds0-4.json``), ``"done": false`` until
the last step.

``--smoke``: the smallest TD-MPC2 (``SMOKE_SETTINGS``), 50 random steps, two episodes (a checkpoint
and an evaluation of 1 episode after each); the result and checkpoints go to
benchmarks/results/checkpoints/smoke/ unless ``--results``/``--checkpoint`` say otherwise.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

from evaluation import (
    brief,
    check_result,
    evaluate_fresh,
    group_name,
    learn_in_segments,
    run_record,
    script_command,
    subprocess_envs,
)
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure

from sb3_worldmodels import TDMPC2, ActionRepeat, make_dmc_env
from sb3_worldmodels.common.seed_group import group_vec_env
from sb3_worldmodels.envs.dmc import use_headless_rendering
from sb3_worldmodels.tdmpc2.config import MODEL_SIZES, SMOKE_SETTINGS

PIXEL_THRESHOLD = 293.0 + 0.5 * (727.0 - 293.0)
"""The pixel check's bar (see the module docstring): 510."""

TASKS = {
    "pendulum": dict(env="Pendulum-v1", steps=6_000, threshold=-300.0, action_repeat=1, episode_length=None),
    "cartpole-balance": dict(
        env="dm_control/cartpole-balance-v0",
        steps=10_000,
        threshold=800.0,
        action_repeat=2,
        episode_length=1000,
    ),
}
TASKS["cartpole-balance-pixels"] = {**TASKS["cartpole-balance"], "threshold": PIXEL_THRESHOLD, "pixels": True}
CHECKPOINT_EVERY = 1_000
EVAL_EPISODES = 10
SMOKE = dict(settings={**SMOKE_SETTINGS, "seed_steps": 50}, episodes=2, eval_episodes=1)
"""The smoke run: two episodes of the task, a checkpoint and an evaluation after each."""
RESULTS = Path(__file__).parent / "results"


def make_task_env(task_name: str, seed: int = 0):
    """One seeded env of the task (a VecEnv), with its action repeat."""
    task = TASKS[task_name]
    if task.get("pixels"):
        use_headless_rendering()  # before dm_control's first import
    if task["env"].startswith("dm_control/"):
        import shimmy  # noqa: F401  (registers dm_control ids)
    repeat = task["action_repeat"]
    if task.get("pixels"):  # make_dmc_env repeats the action itself and renders after the last step
        env_id = task["env"]
        return make_vec_env(
            lambda: make_dmc_env(env_id, action_repeat=repeat, pixels=True, frame_stack=3),
            n_envs=1,
            seed=seed,
        )
    wrapper = {"wrapper_class": ActionRepeat, "wrapper_kwargs": {"repeat": repeat}} if repeat > 1 else {}
    return make_vec_env(task["env"], n_envs=1, seed=seed, **wrapper)


def make_gym_env(task_name: str, seed: int):
    """One env of the task as :func:`make_task_env` wraps it, a gym.Env seeded by its first reset: for
    the VecEnvs built here (an evaluation on several envs, envs in processes of their own)."""
    env = make_task_env(task_name, seed).envs[0]
    env.reset(seed=seed)
    return env


def episode_steps(task_name: str) -> int:
    """Agent steps per episode of the task (Pendulum-v1: 200; dm_control: 1,000 / action repeat)."""
    task = TASKS[task_name]
    return (task["episode_length"] or 200) // task["action_repeat"]


def evaluate(task_name: str, episodes: int, envs: int, processes: bool):
    """The check's evaluation: ``episodes`` deterministic episodes on one env (:func:`make_task_env`), or
    on ``envs`` at once (:func:`make_gym_env`; in processes of their own with ``processes``)."""
    envs = min(envs, episodes)
    if envs == 1:
        return evaluate_fresh(functools.partial(make_task_env, task_name), None, episodes, deterministic=True)
    make = functools.partial(make_gym_env, task_name)
    return evaluate_fresh(make, None, episodes, deterministic=True, envs=envs, processes=processes)


def main(argv: list[str] | None = None) -> dict:
    started = time.time()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=TASKS, default="pendulum")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--seed", type=int, default=0)
    which.add_argument("--seeds", type=int, nargs="+", help="several seeds, trained as one seed group")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--model-size", type=int, default=1)
    parser.add_argument(
        "--eval-every", type=int, default=None, help="agent steps between evaluations (0: only at the end)"
    )
    parser.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="agent steps between checkpoints (default 1,000)",
    )
    parser.add_argument(
        "--checkpoint", type=Path, default=None, help="checkpoint folder (default: see above)"
    )
    parser.add_argument("--results", type=Path, default=None, help="folder of the result file")
    parser.add_argument("--stop-after-hours", type=float, default=None)
    parser.add_argument(
        "--eval-envs", type=int, default=1, help="envs an evaluation's episodes run on at once (see above)"
    )
    parser.add_argument(
        "--eval-processes", action="store_true", help="with --eval-envs: each env in a process of its own"
    )
    parser.add_argument(
        "--env-processes", action="store_true", help="each seed's training env in a process of its own"
    )
    parser.add_argument(
        "--budget-s", type=float, default=None, help="stop before a segment would end past this (seconds)"
    )
    parser.add_argument("--dropout-masks", choices=["hash", "threefry"], default="hash")
    parser.add_argument("--smoke", action="store_true", help="tiny settings (see above)")
    args = parser.parse_args(argv)
    if not 1 <= args.eval_envs <= EVAL_EPISODES:
        parser.error(f"--eval-envs must be between 1 and the {EVAL_EPISODES} episodes of an evaluation")
    task = TASKS[args.task]
    smoke_steps = SMOKE["episodes"] * episode_steps(args.task)
    steps = args.steps or (smoke_steps if args.smoke else task["steps"])
    eval_every = args.eval_every
    if eval_every is None:
        eval_every = episode_steps(args.task) if args.smoke else 1_000
    chunk = args.chunk or (episode_steps(args.task) if args.smoke else CHECKPOINT_EVERY)
    episodes = SMOKE["eval_episodes"] if args.smoke else EVAL_EPISODES
    repeat = task["action_repeat"]
    suffix = "" if args.dropout_masks == "hash" else f"_{args.dropout_masks}"
    seeds = f"seed{args.seed}" if args.seeds is None else group_name(args.seeds)
    name = f"tdmpc2_{args.task}_{seeds}{suffix}"
    results = args.results or (RESULTS / "checkpoints" / "smoke" if args.smoke else RESULTS)
    checkpoint = args.checkpoint or RESULTS / "checkpoints" / ("smoke" if args.smoke else "") / name
    settings = SMOKE["settings"] if args.smoke else {"model_size": args.model_size}

    make_env = functools.partial(make_task_env, args.task)

    def make_model() -> TDMPC2:
        # the pixel encoder's flattened 4 x 4 map is the latent: num_channels x 16 = latent_dim
        latent_dim = settings.get("latent_dim", MODEL_SIZES[settings["model_size"]][2])
        pixel_encoder = {"num_channels": latent_dim // 16} if task.get("pixels") else {}
        if args.env_processes:  # seeded by the model (seed_i + env index) at its first reset
            env_seeds = [args.seed] if args.seeds is None else args.seeds
            env = subprocess_envs([functools.partial(make_gym_env, args.task, s) for s in env_seeds])
        else:
            env = make_env(args.seed) if args.seeds is None else group_vec_env(make_env, tuple(args.seeds))
        return TDMPC2(
            "CnnPolicy" if task.get("pixels") else "MlpPolicy",
            env,
            **{**settings, **pixel_encoder},
            action_repeat=repeat,
            episode_length=task["episode_length"],
            dropout_masks=args.dropout_masks,
            seed=args.seed if args.seeds is None else args.seeds,
        )

    stop = None if args.stop_after_hours is None else 3600 * args.stop_after_hours
    model, record = learn_in_segments(
        make_model,
        steps,
        evaluate(args.task, episodes, args.eval_envs, args.eval_processes),
        eval_every=eval_every,
        checkpoint_every=chunk,
        checkpoint=checkpoint,
        action_repeat=repeat,
        stop_after_seconds=stop,
        logger=lambda start: configure(str(checkpoint / f"log_from_{start}"), ["csv"]),
        budget_seconds=args.budget_s,
        started=started,
    )
    where = run_record(script_command(__file__, argv))
    run_settings = {
        "model_size": settings["model_size"],
        "action_repeat": repeat,
        "seed_steps": model.seed_steps,
        "dropout_masks": args.dropout_masks,
        **({"smoke": SMOKE["settings"]} if args.smoke else {}),
    }
    result = check_result(
        args.task,
        args.seed,
        args.seeds,
        model,
        record,
        lambda curve: curve[-1]["eval_mean"] if curve else float("nan"),
        task["threshold"],
        "steps",
        run_settings,
        where,
    )
    out = results / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(brief(result)))
    model.get_env().close()  # ends the env processes of --env-processes
    return result


if __name__ == "__main__":
    main()

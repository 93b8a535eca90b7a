"""TD-MPC2 learning checks (CPU).

    python benchmarks/tdmpc2_learning.py --task pendulum --seed 0      # Pendulum-v1, size 1, 6,000 steps
    python benchmarks/tdmpc2_learning.py --task cartpole-balance --seed 0
        # dm_control cartpole-balance, size 1, action repeat 2, 10,000 agent steps
    python benchmarks/tdmpc2_learning.py --task cartpole-balance-pixels --seed 0 --eval-every 0
        # the same from pixels: 64x64 RGB, camera 0, 3 stacked frames, pixel encoder with 8 channels

Acceptance (written before any run): Pendulum-v1, final evaluation (10 episodes, deterministic) >= -300
(seed library: -143 and -124); cartpole-balance, final evaluation >= 800 (seed library: 810 and 854).
cartpole-balance from pixels (written 2026-12-03, before its first run), final evaluation >= 510: halfway
from a random policy (293.0 over 10 episodes, benchmarks/results/tdmpc2_multitask.json) to the weakest
of the three state-based seeds at the same 10,000 steps (727.0, seed 2).
An evaluation of 10 deterministic episodes runs every ``--eval-every`` agent steps (default 1,000; each
costs as many plans as its episodes have steps) and at the end; the returns of the training episodes
are recorded too. The run is checkpointed every 1,000 agent steps (model, replay, curves) in
benchmarks/results/checkpoints/tdmpc2_<task>_seed<seed>/ and the same command resumes from there
(``--stop-after-hours`` ends a process cleanly); train/* statistics go to progress.csv files in that
folder. Writes the curve to benchmarks/results/tdmpc2_<task>_seed<seed>.json (``"done": false``
until the last step).
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from evaluation import evaluate_fresh, learn_in_segments, run_record
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure

from sb3_worldmodels import TDMPC2, ActionRepeat, make_dmc_env
from sb3_worldmodels.envs.dmc import use_headless_rendering
from sb3_worldmodels.tdmpc2.config import MODEL_SIZES

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", choices=TASKS, default="pendulum")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--model-size", type=int, default=1)
    parser.add_argument(
        "--eval-every", type=int, default=1_000, help="agent steps between evaluations (0: only at the end)"
    )
    parser.add_argument(
        "--checkpoint", type=Path, default=None, help="checkpoint folder (default: see above)"
    )
    parser.add_argument("--stop-after-hours", type=float, default=None)
    parser.add_argument("--dropout-masks", choices=["hash", "threefry"], default="hash")
    args = parser.parse_args()
    task = TASKS[args.task]
    steps = args.steps or task["steps"]
    repeat = task["action_repeat"]
    suffix = "" if args.dropout_masks == "hash" else f"_{args.dropout_masks}"
    name = f"tdmpc2_{args.task}_seed{args.seed}{suffix}"
    checkpoint = args.checkpoint or RESULTS / "checkpoints" / name

    make_env = functools.partial(make_task_env, args.task)

    def make_model() -> TDMPC2:
        # the pixel encoder's flattened 4 x 4 map is the latent: num_channels x 16 = latent_dim
        latent_dim = MODEL_SIZES[args.model_size][2]
        pixel_encoder = {"num_channels": latent_dim // 16} if task.get("pixels") else {}
        return TDMPC2(
            "CnnPolicy" if task.get("pixels") else "MlpPolicy",
            make_env(args.seed),
            model_size=args.model_size,
            **pixel_encoder,
            action_repeat=repeat,
            episode_length=task["episode_length"],
            dropout_masks=args.dropout_masks,
            seed=args.seed,
        )

    stop = None if args.stop_after_hours is None else 3600 * args.stop_after_hours
    model, record = learn_in_segments(
        make_model,
        steps,
        evaluate_fresh(make_env, args.seed, 10, deterministic=True),
        eval_every=args.eval_every,
        checkpoint_every=CHECKPOINT_EVERY,
        checkpoint=checkpoint,
        action_repeat=repeat,
        stop_after_seconds=stop,
        logger=lambda start: configure(str(checkpoint / f"log_from_{start}"), ["csv"]),
    )
    score = record["curve"][-1]["eval_mean"]
    result = {
        "task": args.task,
        "seed": args.seed,
        "steps": model.num_timesteps,
        "done": record["done"],
        "updates": model._n_updates,
        "wall_seconds": record["seconds"],
        "resumed_at": record["resumed_at"],
        "score": score,
        "threshold": task["threshold"],
        "passed": bool(record["done"] and score >= task["threshold"]),
        "settings": {
            "model_size": args.model_size,
            "action_repeat": repeat,
            "seed_steps": model.seed_steps,
            "dropout_masks": args.dropout_masks,
        },
        **run_record(),
        "curve": record["curve"],
        "train_curve": record["train_curve"],
    }
    out = RESULTS / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("curve", "train_curve")}))


if __name__ == "__main__":
    main()

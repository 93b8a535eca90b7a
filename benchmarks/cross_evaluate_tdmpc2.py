"""Evaluate a reference TD-MPC2 checkpoint (nicklashansen/tdmpc2, ``models/stepN.pt``) with our planner.

    python benchmarks/cross_evaluate_tdmpc2.py REF.pt --task cartpole-balance --episodes 4 [--model OURS.zip]

Separates planning from learning: if the reference's weights score in our planner what they score in
the reference's evaluation, our planner is not the gap between the two codes' learning results. The
agent is built as ``tdmpc2_learning.py`` builds it (or loaded from ``--model``), its weights replaced by
the checkpoint's, and evaluated deterministically (the reference's eval mode) on fresh seeded episodes.
``--own`` evaluates the model of ``--model`` itself on the same episodes, for a side-by-side figure.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from stable_baselines3.common.evaluation import evaluate_policy
from tdmpc2_learning import TASKS, make_task_env

from sb3_worldmodels import TDMPC2
from sb3_worldmodels.tdmpc2.reference_weights import params_from_state_dict


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("reference", type=Path, help="the reference's checkpoint (models/stepN.pt)")
    parser.add_argument("--task", choices=TASKS, default="cartpole-balance")
    parser.add_argument("--model", type=Path, default=None, help="our model .zip (default: a fresh size-1)")
    parser.add_argument("--own", action="store_true", help="evaluate --model's own weights too")
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="env seed of the evaluation episodes")
    args = parser.parse_args()
    import torch  # the reference's checkpoints are torch pickles

    task = TASKS[args.task]
    env = make_task_env(args.task, args.seed)
    if args.model is not None:
        model = TDMPC2.load(args.model, env=env)
    else:
        model = TDMPC2(
            "MlpPolicy",
            env,
            model_size=1,
            action_repeat=task["action_repeat"],
            episode_length=task["episode_length"],
        )
    state_dict = torch.load(args.reference, map_location="cpu", weights_only=True)["model"]
    params, target = params_from_state_dict(state_dict, episodic=model.episodic)
    rows = {}
    candidates = [("reference weights", (params, target))]
    if args.own:
        own = model.policy.state["agent"]
        candidates.append(("own weights", (own.params, own.target_qs)))
    for label, (p, t) in candidates:
        state = model.policy.state
        model.policy.state = {**state, "agent": state["agent"]._replace(params=p, target_qs=t)}
        env = make_task_env(args.task, args.seed)  # the same episodes for every candidate
        start = time.time()
        rewards, _ = evaluate_policy(
            model, env, n_eval_episodes=args.episodes, deterministic=True, return_episode_rewards=True
        )
        rows[label] = {
            "episodes": [round(float(r), 1) for r in rewards],
            "mean": round(float(np.mean(rewards)), 1),
            "seconds": round(time.time() - start, 1),
        }
        print(label, json.dumps(rows[label]), flush=True)


if __name__ == "__main__":
    main()

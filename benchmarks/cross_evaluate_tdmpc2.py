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
from pathlib import Path

from evaluation import evaluate_agent_states
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
    agent = model.policy.state["agent"]
    candidates = [("reference weights", agent._replace(params=params, target_qs=target))]
    if args.own:
        candidates.append(("own weights", agent))
    evaluate_agent_states(
        model, candidates, lambda: make_task_env(args.task, args.seed), args.episodes, deterministic=True
    )


if __name__ == "__main__":
    main()

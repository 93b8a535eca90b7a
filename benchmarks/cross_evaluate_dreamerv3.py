"""Evaluate a reference DreamerV3 checkpoint (danijar/dreamerv3, ``<logdir>/checkpoint.ckpt``) with our agent.

    python benchmarks/cross_evaluate_dreamerv3.py REF_LOGDIR/checkpoint.ckpt --task cartpole --episodes 10
        [--model OURS.zip --own]

Separates acting from learning: the reference's weights, loaded into our parameter tree
(:mod:`sb3_worldmodels.dreamerv3.reference_weights`), act through our policy step (encoder,
posterior, actor, the carried recurrent state) on fresh seeded episodes, with the sampling policy as
the learning check evaluates it. If they score what the reference's own episodes scored at that
point, our acting path is not what separates the two codes' learning results. ``--own`` evaluates
the ``--model`` weights on the same episodes. The agent is built with ``dreamerv3_learning.py``'s
paper-era settings; the reference must have been run with the matching sizes.
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from dreamerv3_learning import PAPER_ERA, TASKS
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor

from sb3_worldmodels import DreamerV3
from sb3_worldmodels.dreamerv3.reference_weights import params_from_reference


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("reference", type=Path, help="the reference's checkpoint.ckpt")
    parser.add_argument("--task", choices=TASKS, default="cartpole")
    parser.add_argument("--model", type=Path, default=None, help="our model .zip (default: a fresh one)")
    parser.add_argument("--own", action="store_true", help="evaluate --model's own weights too")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="seed of the first evaluation episode")
    parser.add_argument("--deterministic", action="store_true", help="the mode action (default: sampled)")
    args = parser.parse_args()
    task = TASKS[args.task]
    if args.model is not None:
        model = DreamerV3.load(args.model)
    else:
        model = DreamerV3(task["env"], seed=0, **PAPER_ERA)
    with open(args.reference, "rb") as f:
        checkpoint = pickle.load(f)  # the reference's own file: a dict of numpy arrays
    params, slow = params_from_reference(checkpoint["agent"], model.config)
    print(f"reference checkpoint at {checkpoint.get('step')} rows", flush=True)
    candidates = [("reference weights", params, slow)]
    if args.own:
        own = model.policy.state["agent"]
        candidates.append(("own weights", own.params, own.slow_critic))
    for label, p, s in candidates:
        state = model.policy.state
        model.policy.state = {**state, "agent": state["agent"]._replace(params=p, slow_critic=s)}
        env = Monitor(gym.make(task["env"]))
        env.reset(seed=args.seed)  # the same episodes for every candidate
        start = time.time()
        rewards, _ = evaluate_policy(
            model,
            env,
            n_eval_episodes=args.episodes,
            deterministic=args.deterministic,
            return_episode_rewards=True,
        )
        row = {
            "episodes": [round(float(r), 1) for r in rewards],
            "mean": round(float(np.mean(rewards)), 1),
            "seconds": round(time.time() - start, 1),
        }
        print(label, json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

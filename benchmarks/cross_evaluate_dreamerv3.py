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
import pickle
from pathlib import Path

import gymnasium as gym
from dreamerv3_learning import PAPER_ERA, TASKS
from evaluation import evaluate_agent_states
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
    agent = model.policy.state["agent"]
    candidates = [("reference weights", agent._replace(params=params, slow_critic=slow))]
    if args.own:
        candidates.append(("own weights", agent))

    def make_env() -> Monitor:
        env = Monitor(gym.make(task["env"]))
        env.reset(seed=args.seed)  # the same episodes for every candidate
        return env

    evaluate_agent_states(model, candidates, make_env, args.episodes, args.deterministic)


if __name__ == "__main__":
    main()

"""A DeepMind Control task under the papers' protocol: action repeat 2, 1,000 simulator steps per
episode, dict observations as they come from shimmy (no import, no wrapper needed).

    python examples/dmc_paper_protocol.py --agent tdmpc2 --task walker-walk --frames 1000000  # a GPU
    python examples/dmc_paper_protocol.py --agent tdmpc2 --task cartpole-balance --tiny        # CI

``num_timesteps`` counts agent steps; the logger's ``rollout/env_frames`` counts simulator steps.
benchmarks/dmc_protocol.py runs the full protocols and compares the curves with the papers'.
"""

from __future__ import annotations

import argparse

from stable_baselines3.common.evaluation import evaluate_policy

from sb3_worldmodels import TDMPC2, DreamerV3, make_dmc_env
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMERV3_SMOKE
from sb3_worldmodels.envs.dmc import dmc_env_id
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", choices=["tdmpc2", "dreamerv3"], default="tdmpc2")
    parser.add_argument("--task", default="cartpole-balance")
    parser.add_argument("--frames", type=int, default=20_000, help="simulator steps (2 per agent step)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model, one episode (CI)")
    args = parser.parse_args(argv)
    frames = 1000 if args.tiny else args.frames
    env_id = dmc_env_id(args.task)  # "walker-walk" -> "dm_control/walker-walk-v0"

    if args.agent == "tdmpc2":
        kwargs = dict(model_size=1)  # the paper uses 5
        if args.tiny:
            kwargs.update(**TDMPC2_SMOKE, seed_steps=20)
        model = TDMPC2(env_id, action_repeat=2, seed=0, verbose=1, **kwargs)
    else:
        kwargs = dict(model_size="1m", n_envs=4)  # the paper uses "12m" and 16 envs
        if args.tiny:
            kwargs.update(**DREAMERV3_SMOKE, n_envs=2)  # fmt: skip
        model = DreamerV3(env_id, action_repeat=2, seed=0, verbose=1, **kwargs)
    model.learn(frames // 2)

    eval_env = make_dmc_env(args.task, action_repeat=2, flatten=False, seed=1)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=1, deterministic=True)
    print(f"{args.agent} on {env_id}: {model.num_timesteps * 2} frames, evaluation return {mean:.1f}")
    return mean


if __name__ == "__main__":
    main()

"""An ordinary SB3 training script, with SAC swapped for TDMPC2 and nothing else changed.

    python examples/swap_sac_for_tdmpc2.py --algo sac       # the original
    python examples/swap_sac_for_tdmpc2.py --algo tdmpc2    # the world model, same pipeline
    python examples/swap_sac_for_tdmpc2.py --algo tdmpc2 --tiny   # seconds (CI)

Callbacks (EvalCallback, CheckpointCallback with the replay buffer), evaluate_policy, save/load and
resuming with the replay buffer work as for SAC. The only TD-MPC2-specific line is the constructor's
keyword arguments (the model size).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from stable_baselines3 import SAC
from stable_baselines3.common.callbacks import CheckpointCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_worldmodels import TDMPC2
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE

TINY = dict(
    **TDMPC2_SMOKE, seed_steps=50,
)  # fmt: skip


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algo", choices=["sac", "tdmpc2"], default="tdmpc2")
    parser.add_argument("--steps", type=int, default=6_000)
    parser.add_argument("--tiny", action="store_true", help="a tiny model and 300 steps")
    parser.add_argument("--logdir", type=Path, default=None)
    args = parser.parse_args(argv)
    steps = 300 if args.tiny else args.steps
    logdir = args.logdir or Path(tempfile.mkdtemp(prefix="swap_"))
    env_kwargs = {"max_episode_steps": 100} if args.tiny else {}

    env = make_vec_env("Pendulum-v1", n_envs=1, seed=0, env_kwargs=env_kwargs)
    eval_env = make_vec_env("Pendulum-v1", n_envs=1, seed=1, env_kwargs=env_kwargs)

    # --- the one line that changes -------------------------------------------------------------
    if args.algo == "sac":
        model = SAC("MlpPolicy", env, seed=0, verbose=1)
    else:
        model = TDMPC2("MlpPolicy", env, seed=0, verbose=1, **(TINY if args.tiny else {"model_size": 1}))
    algo = type(model)
    # ---------------------------------------------------------------------------------------------

    callbacks = [
        EvalCallback(eval_env, eval_freq=steps // 2, n_eval_episodes=2, best_model_save_path=str(logdir)),
        CheckpointCallback(save_freq=steps // 2, save_path=str(logdir / "ckpt"), save_replay_buffer=True),
    ]
    model.learn(steps // 2, callback=callbacks, progress_bar=False)
    model.save(logdir / "half")
    model.save_replay_buffer(logdir / "half_replay.pkl")

    # Resume in a "new process": load the weights and the replay buffer, keep the step counter.
    model = algo.load(logdir / "half", env=env)
    model.load_replay_buffer(logdir / "half_replay.pkl")
    model.learn(steps - steps // 2, callback=callbacks, reset_num_timesteps=False)

    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=2, deterministic=True)
    print(f"{algo.__name__}: {model.num_timesteps} steps, evaluation {mean:.1f} +/- {std:.1f} ({logdir})")
    return mean


if __name__ == "__main__":
    main()

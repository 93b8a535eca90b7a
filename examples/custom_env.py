"""A custom Gymnasium env, trained with either world-model agent.

    python examples/custom_env.py --agent tdmpc2
    python examples/custom_env.py --agent dreamerv3 --tiny

`Reach1D`: a point on a line must move to a target given in its observation; reward = minus the
distance; 100 steps per episode. Any env with a flat Box observation (or a Dict of them) works;
DreamerV3 also takes Discrete actions.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.env_checker import check_env
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMERV3_SMOKE
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE


class Reach1D(gym.Env):
    """Observation (position, target, time left); action: a velocity in [-1, 1]."""

    observation_space = spaces.Box(-2.0, 2.0, (3,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.target, self.t = 0.0, float(self.np_random.uniform(-1, 1)), 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.position, self.target, 1.0 - self.t / 100], np.float32)

    def step(self, action):
        self.position = float(np.clip(self.position + 0.1 * float(action[0]), -2, 2))
        self.t += 1
        reward = -abs(self.position - self.target)
        return self._obs(), reward, False, self.t >= 100, {}


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", choices=["tdmpc2", "dreamerv3"], default="tdmpc2")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and a short run (CI)")
    args = parser.parse_args(argv)
    check_env(Reach1D())

    if args.agent == "tdmpc2":
        # An env without a registered spec: give the episode length (agent steps), from which TD-MPC2
        # derives its discount (and its seed steps).
        size = dict(model_size=1, episode_length=100)
        if args.tiny:
            size.update(**TDMPC2_SMOKE, seed_steps=50)
        model = TDMPC2("MlpPolicy", Monitor(Reach1D()), seed=0, **size)
        steps = 150 if args.tiny else 3_000
    else:
        size = dict(model_size="1m", n_envs=4, train_ratio=64, batch_size=8, batch_length=32)
        if args.tiny:
            size.update(**DREAMERV3_SMOKE, n_envs=2)  # fmt: skip
        env = make_vec_env(Reach1D, n_envs=size.pop("n_envs"), seed=0)
        model = DreamerV3("MlpPolicy", env, seed=0, **size)
        steps = 200 if args.tiny else 10_000
    model.learn(steps)
    mean, _ = evaluate_policy(model, Monitor(Reach1D()), n_eval_episodes=3, deterministic=True)
    print(f"{type(model).__name__} on Reach1D after {model.num_timesteps} steps: {mean:.1f} per episode")
    return mean


if __name__ == "__main__":
    main()

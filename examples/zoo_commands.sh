#!/usr/bin/env bash
# The rl_zoo3 commands, after `pip install "sb3_worldmodels[zoo]"` (tests/test_zoo.py runs them on
# tiny settings). Our hyperparameter files are used unless you pass -conf; -params overrides a key.
set -euo pipefail
rl_zoo3 train --algo tdmpc2 --env Pendulum-v1 -n 3000
rl_zoo3 train --algo dreamerv3 --env CartPole-v1 --eval-freq 2000 --save-replay-buffer
rl_zoo3 enjoy --algo tdmpc2 --env Pendulum-v1 -f logs/ -n 300 --no-render
rl_zoo3 train --algo tdmpc2 --env Pendulum-v1 -i logs/tdmpc2/Pendulum-v1_1/Pendulum-v1.zip
rl_zoo3 train --algo tdmpc2 --env Pendulum-v1 -optimize --n-trials 2 --n-timesteps 1500
rl_zoo3 train --algo tdmpc2 --env dm_control/walker-walk-v0 --gym-packages shimmy
# Without the interpreter-start hook (SB3_WORLDMODELS_ZOO_HOOK=0), the same through our entry point:
sb3wm-zoo train --algo tdmpc2 --env Pendulum-v1 -n 3000

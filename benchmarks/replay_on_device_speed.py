"""TD-MPC2's training calls from pixels with the batches sent by the host against the batches read from
the replay's copy in device memory (``replay_on_device``), side by side in one process.

    python benchmarks/replay_on_device_speed.py                   # 3 seeds in one group, size 1
    python benchmarks/replay_on_device_speed.py --seeds 1 --rounds 5 --updates 50

Two models alike but for ``replay_on_device`` (False: the host gathers each update's 1,024 frames of
64 x 64 x 9 uint8, 38 MB per seed, and sends them; True: the batch carries their slots) each fill
their replay with ``--episodes`` episodes of random frames in the seed phase (random actions, no
update). Each round then has every seed owe ``--updates`` updates and runs them through ``train`` as
``learn`` does after its seed phase (one update per call, each call's batches drawn from the replay),
waiting for the state at the end; the rounds alternate the two models after one warm-up round each
(compiling). Prints one JSON line: the median milliseconds per update (all seeds together) each way,
their ratio, the machine and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import jax
import numpy as np
from gymnasium import spaces

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

from sb3_worldmodels import TDMPC2  # noqa: E402
from sb3_worldmodels.blocks.cpu import cpu_info  # noqa: E402

FRAME = (64, 64, 9)


class NoiseFrames(gym.Env):
    """Random 64 x 64 x 9 uint8 frames (three stacked RGB frames' shape), reward 0."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0, 255, FRAME, np.uint8)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, FRAME, dtype=np.uint8)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return self._frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        return self._frame(), 0.0, False, False, {}


def filled_model(on: bool, args: argparse.Namespace) -> TDMPC2:
    length = args.episode_length
    envs = DummyVecEnv([lambda: gym.wrappers.TimeLimit(NoiseFrames(), length)] * args.seeds)
    seed: Any = list(range(args.seeds)) if args.seeds > 1 else 0
    steps = args.episodes * length
    model = TDMPC2(
        "CnnPolicy",
        envs,
        seed=seed,
        model_size=args.size,
        num_channels={1: 8, 5: 32}[args.size],
        seed_steps=steps,
        episode_length=length,
        replay_on_device=on,
    )
    model.learn(steps)  # the seed phase only: its burst of updates comes with the next step
    return model


def timed_updates(model: TDMPC2, n: int) -> float:
    """Seconds for n owed updates per seed through ``train``, the state waited for."""
    for lane in model._lanes or [model]:
        lane._owed_updates = n
    start = time.perf_counter()
    model.train(0)
    model._settle_training()
    jax.block_until_ready(model.policy.state)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--size", type=int, default=1, choices=(1, 5))
    parser.add_argument("--episodes", type=int, default=10, help="stored episodes per seed")
    parser.add_argument("--episode-length", type=int, default=100)
    parser.add_argument("--updates", type=int, default=50, help="updates per seed in a round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    models = {on: filled_model(on, args) for on in (False, True)}
    for model in models.values():
        timed_updates(model, 2)  # compiles
    fields = {on: model._decided_device_fields for on, model in models.items()}
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for on, model in models.items():
            times[on].append(1e3 * timed_updates(model, args.updates) / args.updates)
    host, device = (statistics.median(times[on]) for on in (False, True))
    print(
        json.dumps(
            {
                "agent": "tdmpc2",
                "settings": f"size {args.size}, {args.seeds} seed(s), 64x64x9 uint8 frames",
                "ms_per_update_host_batches": round(host, 2),
                "ms_per_update_device_rows": round(device, 2),
                "speedup": round(host / device, 2),
                "device_fields": list(fields[True]),
                "rounds_ms": {
                    "host": [round(t, 2) for t in times[False]],
                    "device": [round(t, 2) for t in times[True]],
                },
                "updates_per_round": args.updates,
                "backend": jax.default_backend(),
                "device": jax.devices()[0].device_kind,
                **cpu_info().as_dict(),
                "date": datetime.date.today().isoformat(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()

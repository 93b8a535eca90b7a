"""A tiny TD-MPC2 trained for a few steps in a fresh process, for tests/test_compile_cache.py: prints one
JSON line of what JAX's persistent compilation cache did for every program the process compiled.

    python tests/compile_cache_run.py

The cache is the package's default (``SB3WM_COMPILATION_CACHE`` and ``XDG_CACHE_HOME`` of the caller).
"""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym

from sb3_worldmodels import TDMPC2
from sb3_worldmodels.blocks.compile_cache import compilation_cache_dir
from sb3_worldmodels.blocks.jit import cache_events
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS


def main() -> None:
    with cache_events() as events:
        model = TDMPC2(gym.make("Pendulum-v1", max_episode_steps=20), seed=0, seed_steps=20, **SMOKE_SETTINGS)
        model.learn(21)  # the first episode ends at step 20: its 20 owed updates run at step 21
        model.predict(model.env.reset(), deterministic=True)
    facts = dataclasses.asdict(events)
    facts.update(cache_dir=compilation_cache_dir(), n_updates=int(model._n_updates))
    print(json.dumps(facts))


if __name__ == "__main__":
    main()

"""Short runs on a host of N forced CPU devices, for tests/test_devices.py (in a fresh process: the
device count is fixed when JAX starts).

    python tests/device_runs.py SCENARIO N_DEVICES OUT.npz

writes the model's state leaves after the run (``leaf_<i>``, in tree order; a scenario may add arrays
of its own, ``replay_<field>``) and prints one JSON line of facts about where they lived. Scenarios:
``tdmpc2_group`` (4 seeds), ``tdmpc2_pixel_group`` (4 seeds from images, their replays' images in
device memory), ``dreamerv3_group`` (2 seeds), ``data_parallel`` (one TD-MPC2 model with
``data_parallel=True``), ``dreamerv3_data_parallel`` (one DreamerV3 model with ``data_parallel=True``),
``multitask_group`` (a ``TDMPC2MultiTask`` of 4 seeds trained on a small pool written next to
``OUT.npz``).
"""

from __future__ import annotations

import json
import os
import sys
import warnings


def main(scenario: str, n_devices: int, out: str) -> None:
    flag = f"--xla_force_host_platform_device_count={n_devices}"
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import gymnasium as gym
    import jax
    import numpy as np
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_worldmodels import TDMPC2, DreamerV3
    from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS as DREAMER_SMOKE
    from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE

    assert jax.device_count() == n_devices, jax.devices()

    def pendulum(n_envs: int):
        return make_vec_env(lambda: gym.make("Pendulum-v1", max_episode_steps=20), n_envs=n_envs)

    facts: dict = {}
    extra: dict = {}  # arrays written beside the state's leaves
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if scenario == "tdmpc2_group":
            model = TDMPC2(pendulum(4), seed=[0, 1, 2, 3], **{**TDMPC2_SMOKE, "seed_steps": 25})
            model.learn(30)
            # Steady state: no array moves between devices (nothing gathered to one device per step).
            with jax.transfer_guard_device_to_device("disallow_explicit"):
                model.learn(6, reset_num_timesteps=False)
            # Each lane carries its piece of the last plan; the next call takes the group's plan back,
            # sharded along the seeds as the call left it (never gathered to one device).
            placement = model._placement
            pieces = [lane._rollout.prev_mean for lane in model._lanes]
            plan = model._stacked_arguments([(piece,) for piece in pieces])[0]
            facts["plan_on_seed_device"] = model._hand_outs.stacked(pieces) is plan and (
                placement is None or plan.sharding.is_equivalent_to(placement.sharding, plan.ndim)
            )
        elif scenario == "tdmpc2_pixel_group":
            from stable_baselines3.common.vec_env import DummyVecEnv

            from tests.test_tdmpc2_pixels_sb3 import TINY, dot_env

            env = DummyVecEnv([dot_env] * 4)
            model = TDMPC2(
                "CnnPolicy", env, replay_on_device=True, **{**TINY, "seed": [0, 1, 2, 3], "seed_steps": 20}
            )
            model.learn(24)  # an episode stored, its 20 pretraining updates, 3 more
            facts["replay_copy"] = _describe(
                model._replay_mirror.stores([lane.replay_buffer for lane in model._lanes])[
                    "obs"
                ].store.sharding
            )
        elif scenario == "dreamerv3_group":
            model = DreamerV3("CartPole-v1", n_envs=2, seed=[3, 7], **DREAMER_SMOKE)
            model.learn(40)
        elif scenario == "multitask_group":
            from pathlib import Path

            from sb3_worldmodels import TDMPC2MultiTask
            from tests.test_tdmpc2_multitask import two_task_pool

            folder = Path(out).with_suffix("")
            folder.mkdir()
            settings = {k: v for k, v in TDMPC2_SMOKE.items() if k not in ("model_size", "batch_size")}
            model = TDMPC2MultiTask(two_task_pool(folder), 1, 16, task_dim=8, seed=[0, 1, 2, 3], **settings)
            model.learn(3)
            # Steady state: each update's batches go to the seeds' devices, nothing moves between them.
            with jax.transfer_guard_device_to_device("disallow_explicit"):
                model.learn(2, reset_num_timesteps=False)
        elif scenario == "data_parallel":
            model = TDMPC2(pendulum(1), seed=0, data_parallel=True, **{**TDMPC2_SMOKE, "seed_steps": 25})
            model.learn(27)
        elif scenario == "dreamerv3_data_parallel":
            settings = {**DREAMER_SMOKE, "batch_size": 4}  # 4 rows: one on each of 4 devices
            model = DreamerV3("CartPole-v1", n_envs=1, seed=0, data_parallel=True, **settings)
            model.learn(40)
            # The replay too: its rows hold the latents each update wrote back (sharded outputs).
            rows = np.arange(int(model.replay_buffer.rows_added_per_env[0]))
            extra = {f"replay_{name}": v for name, v in model.replay_buffer.read_rows(0, rows).items()}
        else:
            raise SystemExit(f"unknown scenario {scenario!r}")
    leaves = jax.tree_util.tree_leaves(model.policy.state)
    facts["warnings"] = [str(w.message) for w in caught if "devices" in str(w.message)]
    facts["n_updates"] = int(model._n_updates)
    facts["shardings"] = sorted({_describe(leaf.sharding) for leaf in leaves})
    np.savez(out, **{f"leaf_{i}": np.asarray(leaf) for i, leaf in enumerate(leaves)}, **extra)
    print(json.dumps(facts))


def _describe(sharding) -> str:
    """'P(...) over N' for a sharding."""
    spec = getattr(sharding, "spec", "single")
    return f"{spec} over {len(sharding.device_set)}"


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])

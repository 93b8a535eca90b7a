"""Every device of the host: a seed group's seed axis sharded over the devices, and one model's
training batch split over them (``data_parallel=True``). Each run sharded over 4 forced CPU devices
equals the same run on one device, to float tolerance (in fresh processes: the device count is fixed
when JAX starts; tests/device_runs.py runs them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import TDMPC2
from sb3_worldmodels.blocks.devices import data_parallel_placement, devices_for_seeds
from sb3_worldmodels.tdmpc2.config import SMOKE_SETTINGS as TDMPC2_SMOKE

ROOT = Path(__file__).resolve().parents[1]


def fresh_process(args: list[str], n_devices: int) -> subprocess.Popen:
    """``python args...`` with this checkout first on the path and no device count of its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n_devices}"
    env["JAX_PLATFORMS"] = "cpu"
    return subprocess.Popen(
        [sys.executable, *args], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finished(process: subprocess.Popen, timeout: int = 900) -> str:
    stdout, stderr = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-5000:]}"
    return stdout


def run_on_4_and_1_devices(scenario: str, tmp_path: Path) -> tuple[dict, dict, dict, dict]:
    """The scenario on 4 devices and on 1 (side by side): (facts, leaves) of each."""
    script = str(ROOT / "tests" / "device_runs.py")
    runs = {n: fresh_process([script, scenario, str(n), str(tmp_path / f"{n}.npz")], n) for n in (4, 1)}
    facts = {n: json.loads(finished(p).strip().splitlines()[-1]) for n, p in runs.items()}
    leaves = {n: dict(np.load(tmp_path / f"{n}.npz")) for n in (4, 1)}
    return facts[4], leaves[4], facts[1], leaves[1]


def assert_leaves_close(sharded: dict, single: dict) -> None:
    assert sharded.keys() == single.keys()
    for key in single:
        np.testing.assert_allclose(sharded[key], single[key], rtol=1e-4, atol=2e-5, err_msg=key)


def test_a_tdmpc2_group_sharded_over_4_devices_equals_it_on_one(tmp_path):
    """4 seeds, one on each device; in steady state no array moves between devices (the run is
    guarded), each seed's plan stays on its device, and the state ends sharded along the seeds."""
    sharded, sharded_leaves, single, single_leaves = run_on_4_and_1_devices("tdmpc2_group", tmp_path)
    assert sharded["shardings"] == ["P('seeds',) over 4"]
    assert single["shardings"] == ["single over 1"]
    assert sharded["plan_on_seed_device"]
    assert sharded["n_updates"] == single["n_updates"] > 0
    assert_leaves_close(sharded_leaves, single_leaves)


def test_a_pixel_group_with_its_replays_in_device_memory_sharded_over_4_devices_equals_it_on_one(tmp_path):
    """The copy of the seeds' replay images lies along the seeds too, each seed's on its device."""
    sharded, sharded_leaves, single, single_leaves = run_on_4_and_1_devices("tdmpc2_pixel_group", tmp_path)
    assert sharded["replay_copy"] == "P('seeds',) over 4"
    assert single["replay_copy"] == "single over 1"
    assert sharded["n_updates"] == single["n_updates"] > 0
    assert_leaves_close(sharded_leaves, single_leaves)


def test_a_dreamerv3_group_of_2_seeds_on_a_host_of_4_devices_equals_it_on_one(tmp_path):
    """2 seeds on 4 devices run on 2 (the largest count that divides the seeds), with a warning."""
    sharded, sharded_leaves, single, single_leaves = run_on_4_and_1_devices("dreamerv3_group", tmp_path)
    assert sharded["shardings"] == ["P('seeds',) over 2"]
    assert sharded["warnings"] == [
        "A group of 2 seeds runs on 2 of the host's 4 devices (the seeds are split evenly over the "
        "devices): give a multiple of 4 seeds to use them all."
    ]
    assert single["warnings"] == []
    assert sharded["n_updates"] == single["n_updates"] > 0
    assert_leaves_close(sharded_leaves, single_leaves)


def test_a_multitask_group_sharded_over_4_devices_equals_it_on_one(tmp_path):
    """TDMPC2MultiTask with 4 seeds, one on each device: its updates (each seed's windows sent to its
    device) end as on one device, the state sharded along the seeds."""
    sharded, sharded_leaves, single, single_leaves = run_on_4_and_1_devices("multitask_group", tmp_path)
    assert sharded["shardings"] == ["P('seeds',) over 4"]
    assert single["shardings"] == ["single over 1"]
    assert sharded["warnings"] == single["warnings"] == []
    assert sharded["n_updates"] == single["n_updates"] == 5
    assert_leaves_close(sharded_leaves, single_leaves)


def test_data_parallel_updates_equal_the_one_device_updates(tmp_path):
    """One TD-MPC2 model, its batch of 16 split over 4 devices (4 rows each), its state replicated."""
    sharded, sharded_leaves, single, single_leaves = run_on_4_and_1_devices("data_parallel", tmp_path)
    assert "P() over 4" in sharded["shardings"]
    assert single["shardings"] == ["single over 1"]
    assert sharded["n_updates"] == single["n_updates"] > 0
    assert_leaves_close(sharded_leaves, single_leaves)


def test_dreamerv3_data_parallel_updates_equal_the_one_device_updates(tmp_path):
    """One DreamerV3 model, its batch of 4 windows split over 4 devices (one each): its losses are means
    over the whole batch, as the reference's over its devices; the state and the latents the updates
    wrote back into the replay end as on one device."""
    runs = run_on_4_and_1_devices("dreamerv3_data_parallel", tmp_path)
    sharded, sharded_leaves, single, single_leaves = runs
    assert "P() over 4" in sharded["shardings"]
    assert single["shardings"] == ["single over 1"]
    assert sharded["n_updates"] == single["n_updates"] > 0
    assert any(key.startswith("replay_") for key in single_leaves)
    assert_leaves_close(sharded_leaves, single_leaves)


PLACEMENT_CHECK = """
import jax, numpy as np
from sb3_worldmodels.blocks.devices import seed_placement
assert jax.device_count() == 4
for seeds, devices in ((4, 4), (8, 4), (6, 3)):
    placement = seed_placement(seeds)
    assert len(placement.devices) == devices and placement.per_device == seeds // devices
    trees = [{"host": np.full((2, 3), i, np.float32), "device": jax.numpy.full(5, i)} for i in range(seeds)]
    stacked = placement.stack(trees)
    for leaf in jax.tree_util.tree_leaves(stacked):
        assert leaf.sharding == placement.sharding, leaf.sharding
    parts = placement.unstack(stacked)
    for i, part in enumerate(parts):
        assert part["device"].devices() == {placement.device_of(i)}
        np.testing.assert_array_equal(np.asarray(part["host"]), trees[i]["host"])
    assert placement.slice(stacked, seeds - 1)["device"].devices() == {placement.device_of(seeds - 1)}
    with jax.transfer_guard_device_to_device("disallow_explicit"):
        again = placement.stack(parts)
    np.testing.assert_array_equal(np.asarray(again["device"])[:, 0], np.arange(seeds))
print("ok")
"""


def test_the_seed_axis_is_placed_and_read_back_without_moving_between_devices():
    """Stacked leaves are sharded along the seeds; a seed's slice is read on its device, and stacking
    the slices again copies nothing between devices."""
    assert finished(fresh_process(["-W", "ignore", "-c", PLACEMENT_CHECK], 4)).strip() == "ok"


@pytest.mark.parametrize(
    ("seeds", "devices", "used"), [(4, 4, 4), (8, 4, 4), (6, 4, 3), (5, 4, 1), (2, 8, 2)]
)
def test_a_group_uses_the_largest_device_count_that_divides_its_seeds(seeds, devices, used):
    assert devices_for_seeds(seeds, devices) == used


def pendulum(n_envs: int):
    return make_vec_env(lambda: gym.make("Pendulum-v1", max_episode_steps=20), n_envs=n_envs)


def test_data_parallel_refusals():
    with pytest.raises(ValueError, match="already shards its seeds"):
        TDMPC2(pendulum(2), seed=[0, 1], data_parallel=True, **TDMPC2_SMOKE)
    with pytest.raises(TypeError, match="data_parallel must be True or False"):
        TDMPC2(pendulum(1), data_parallel="yes", **TDMPC2_SMOKE)
    with pytest.raises(ValueError, match="batch_size=6 is not a multiple of 4"):
        data_parallel_placement(6, devices=["cpu:0", "cpu:1", "cpu:2", "cpu:3"])
    assert data_parallel_placement(6, devices=["cpu:0"]) is None  # one device: nothing to split


def test_on_one_device_data_parallel_changes_nothing():
    model = TDMPC2(pendulum(1), seed=0, data_parallel=True, **TDMPC2_SMOKE)
    assert model._batch_placement is None and model.data_parallel

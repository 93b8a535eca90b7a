"""The DMC paper-protocol scripts: a smoke run of each agent, and the comparison's arithmetic."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import compare_dmc  # noqa: E402
import dmc_protocol  # noqa: E402

PUBLISHED = json.loads(compare_dmc.PUBLISHED.read_text())


@pytest.mark.parametrize("agent", ["tdmpc2", "dreamerv3"])
def test_protocol_smoke_run_records_a_comparable_curve(agent, tmp_path):
    path = dmc_protocol.main(
        ["--agent", agent, "--task", "cartpole-balance", "--smoke", "--frames", "200", "--out", str(tmp_path)]
    )
    result = json.loads(path.read_text())
    assert result["smoke"] and result["env_id"] == "dm_control/cartpole-balance-v0"
    assert result["frames"] == 2 * result["steps"] >= 200 and result["updates"] > 0
    assert result["curve"] and result["curve"][-1]["frames"] == result["frames"]
    assert all(p["return"] >= 0 for p in result["train_curve"])  # dm_control rewards are in [0, 1]
    (verdict,) = compare_dmc.main([str(path)])
    assert verdict["passed"] is None and "budget" in verdict["note"]


def full_run(agent: str, task: str, score: float) -> dict:
    frames = PUBLISHED[agent]["protocol"]["frames"]
    env_id = PUBLISHED[agent]["tasks"][task]["env_id"]
    return {
        "agent": agent,
        "task": task,
        "env_id": env_id,
        "seed": 0,
        "smoke": False,
        "frames": frames,
        "curve": [{"frames": frames // 2, "eval_mean": 0.0}, {"frames": frames, "eval_mean": score}],
        "train_curve": [{"frames": frames // 2, "return": 0.0}, {"frames": frames - 1000, "return": score}],
    }


def test_tdmpc2_band_is_the_published_mean_at_the_budget_less_15_percent():
    # walker-walk at 1M frames: 980 published -> bound 980 - 147 = 833.
    assert compare_dmc.compare(full_run("tdmpc2", "walker-walk", 834.0), PUBLISHED)["passed"] is True
    verdict = compare_dmc.compare(full_run("tdmpc2", "walker-walk", 832.0), PUBLISHED)
    assert verdict["passed"] is False and verdict["lower_bound"] == pytest.approx(833.0)
    # The band is never narrower than 50 points.
    low = json.loads(json.dumps(PUBLISHED))
    low["tdmpc2"]["tasks"]["hopper-hop"]["mean"] = [100.0] * 5
    assert compare_dmc.compare(full_run("tdmpc2", "hopper-hop", 0.0), low)["lower_bound"] == 50.0


def test_dreamerv3_band_uses_the_seed_spread():
    # walker_walk: 881.0 +- 77.9 -> bound 881 - 155.8.
    verdict = compare_dmc.compare(full_run("dreamerv3", "walker_walk", 726.0), PUBLISHED)
    assert verdict["lower_bound"] == pytest.approx(725.2) and verdict["passed"] is True


def test_interpolation_between_published_points():
    assert compare_dmc._interpolate([100, 500], [10.0, 50.0], 300) == pytest.approx(30.0)
    assert compare_dmc._interpolate([100, 500], [10.0, 50.0], 50) == 10.0
    assert compare_dmc._interpolate([100, 500], [10.0, 50.0], 900) == 50.0


def test_dreamerv3_pixel_protocol_smoke_run(tmp_path):
    """The DMC-vision protocol end to end: rendered 64 x 64 images, DreamerV3's CnnPolicy, no verdict
    (no published DreamerV3 visual-control numbers in the reference's score files)."""
    args = ["--agent", "dreamerv3", "--task", "cartpole-balance", "--smoke", "--pixels", "--frames", "200"]
    path = dmc_protocol.main([*args, "--out", str(tmp_path)])
    assert path.name == "dmc_pixels_dreamerv3_cartpole-balance_seed0_smoke.json"
    result = json.loads(path.read_text())
    assert result["pixels"] and result["updates"] > 0 and result["curve"]
    (verdict,) = compare_dmc.main([str(path)])
    assert verdict["passed"] is None and "no published numbers" in verdict["note"]


def test_pixel_runs_are_compared_with_the_published_pixel_runs():
    run = {**full_run("tdmpc2", "walker-walk", 0.0), "pixels": True}
    table = PUBLISHED["tdmpc2_pixels"]["tasks"]["walker-walk"]
    expected = compare_dmc._interpolate(table["frames"], table["mean"], run["frames"])
    verdict = compare_dmc.compare(run, PUBLISHED)
    assert (
        verdict["reference"] == pytest.approx(expected)
        and verdict["reference"]
        != compare_dmc.compare(full_run("tdmpc2", "walker-walk", 0.0), PUBLISHED)["reference"]
    )
    assert verdict["passed"] is False

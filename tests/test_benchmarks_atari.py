"""The Atari 100k protocol script: a smoke run, and the comparison's arithmetic."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("ale_py")

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import atari_protocol  # noqa: E402
import compare_atari  # noqa: E402

PUBLISHED = json.loads(compare_atari.PUBLISHED.read_text())


@pytest.mark.slow  # a benchmark script end to end (minutes of compiling); run with -m slow
def test_protocol_smoke_run_records_a_comparable_result(tmp_path):
    path = atari_protocol.main(["--game", "Pong", "--smoke", "--out", str(tmp_path)])
    assert path.name == "atari100k_dreamerv3_pong_seed0_smoke.json"
    result = json.loads(path.read_text())
    assert result["smoke"] and result["game"] == "pong" and result["updates"] > 0
    assert result["frames"] == 4 * result["steps"] == 400
    smoke_env = {"length": atari_protocol.SMOKE_LENGTH, "size": atari_protocol.SMOKE_SIZE}
    assert result["env"] == {**atari_protocol.PROTOCOL["env"], **smoke_env}
    # 100-frame episodes: 25 steps and the reset row each, so 3 end within the 100 rows.
    assert [p["frames"] for p in result["train_curve"]] == [104, 208, 312]
    (verdict,) = compare_atari.main([str(path)])
    assert verdict["reference"] == -4.7 and verdict["score"] is not None
    assert verdict["passed"] is None and "budget" in verdict["note"]


def full_run(game: str, returns: list[float]) -> dict:
    """A made-up full-budget run whose training episodes end evenly up to 400K frames."""
    frames = PUBLISHED["dreamerv3"]["protocol"]["frames"]
    step = frames // len(returns)
    curve = [{"frames": step * (i + 1), "return": r} for i, r in enumerate(returns)]
    return {
        "agent": "dreamerv3",
        "game": game,
        "seed": 0,
        "smoke": False,
        "frames": frames,
        "train_curve": curve,
    }


def test_band_is_the_seed_mean_less_twice_the_seed_spread_or_ten_percent():
    # Pong: 5-seed mean of the last-5-episode scores -4.7, spread 2.9 -> bound -4.7 - 5.8 = -10.5.
    returns = [-21.0] * 10 + [-10.0, -11.0, -10.0, -10.0, -11.0]
    verdict = compare_atari.compare(full_run("Pong", returns), PUBLISHED)
    assert verdict["score"] == pytest.approx(-10.4)  # the last 5 episodes only
    assert verdict["lower_bound"] == pytest.approx(-10.5) and verdict["passed"] is True
    verdict = compare_atari.compare(full_run("pong", [-10.0, -11.0, -10.0, -11.0, -11.0]), PUBLISHED)
    assert verdict["score"] == pytest.approx(-10.6) and verdict["passed"] is False
    # Hero: 13376.6 +- 67.7, where 10% of the reference (1337.66) is the wider margin: 12038.94.
    verdict = compare_atari.compare(full_run("Hero", [12039.0] * 5), PUBLISHED)
    assert verdict["lower_bound"] == pytest.approx(12038.94) and verdict["passed"] is True
    # A short run gets no verdict, an unknown game no reference.
    short = {**full_run("Pong", [21.0] * 5), "frames": 200_000}
    assert compare_atari.compare(short, PUBLISHED)["passed"] is None
    assert compare_atari.compare(full_run("Tennis", [0.0]), PUBLISHED)["note"].startswith("no published")


def test_published_table_covers_the_26_games_with_the_reference_settings():
    table = PUBLISHED["dreamerv3"]
    assert len(table["games"]) == 26 and all(g["seeds"] == 5 for g in table["games"].values())
    assert table["games"]["ms_pacman"]["final"] == 1390.8 and table["games"]["freeway"]["final"] == 0.0
    protocol = table["protocol"]
    assert (protocol["model_size"], protocol["n_envs"], protocol["train_ratio"]) == ("200m", 1, 256)
    assert protocol["env"] == atari_protocol.PROTOCOL["env"] and protocol["frames"] == 400_000
    assert atari_protocol.PROTOCOL["kwargs"] == {"model_size": "200m", "train_ratio": 256}


def test_score_window_and_transcription():
    # The last 5 episodes ending by point + 100 frames, as the reference's print.py.
    xs, ys = [100, 200, 300, 400, 500, 600, 700], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert compare_atari.run_score(xs, ys, 600) == 5.0  # 3..7: 700 is within the 100 frames
    assert compare_atari.run_score(xs, ys, 600, tolerance=50) == 4.0  # 2..6
    assert compare_atari.run_score(xs, ys, 250, tolerance=50) == 2.0  # 1..3
    assert compare_atari.run_score(xs, ys, 50, tolerance=0) is None
    runs = [
        {"task": "atari_pong", "seed": 0, "xs": [90_000, 300_000, 399_000], "ys": [-21, -15, -9]},
        {"task": "atari_pong", "seed": 1, "xs": [50_000, 390_000, 420_000], "ys": [-20, -4, 21]},
    ]
    # Seed 0: (-21 - 15 - 9) / 3 = -15; seed 1: (-20 - 4) / 2 = -12 (the 420K episode is past).
    assert compare_atari.transcribe(runs) == {
        "pong": {"seeds": 2, "final": -13.5, "final_std": 1.5, "at": {"100000": -20.5, "200000": -20.5}}
    }
    assert {compare_atari.game_key(g) for g in ("MsPacman", "ms_pacman", "atari_ms_pacman")} == {"mspacman"}

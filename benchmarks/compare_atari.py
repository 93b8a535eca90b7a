"""Compare an Atari 100k run (benchmarks/atari_protocol.py) with DreamerV3's published numbers.

    python benchmarks/compare_atari.py benchmarks/results/atari100k_dreamerv3_pong_seed0.json [...]
    python benchmarks/compare_atari.py --transcribe atari100k-dreamerv3.json.gz

Published numbers: benchmarks/data/published_atari.json, transcribed from danijar/dreamerv3
scores/atari100k-dreamerv3.json.gz @2411f7d (26 games x 5 seeds; the score of every training
episode against environment frames, up to 400K).

The score of a run is the reference's own (embodied/scripts/print.py@2411f7d, whose defaults are
Atari 100k's: ``--point 4e5 --episodes 5 --tolerance 100`` over ``episode/score`` of scores.jsonl):
the mean return of the last 5 training episodes that ended by 400,000 + 100 frames. (print.py slices
``ys[stop - 5:stop]`` with ``stop`` = the episodes ending by that point + 2, which in the full logs,
run to 440K frames (``run.steps: 1.1e5``), takes 2 episodes past the point; the score file stops at
400K, so the window here is the 5 episodes before it.) The reference is the seed mean of those
per-seed scores (``final``); ``final_std`` is their seed standard deviation (ddof 0); ``at`` holds
the same mean at earlier points. print.py normalises by random and human-gamer scores read from
``~/scores/atari_baselines.json``, which is not in the repository, so no normalised score is used.

Acceptance band, fixed before any run: pass when
score >= reference - max(2 * seed std, 0.1 * |reference|).

One seed is one sample: a fail on one seed says "run more seeds", not "broken". A smoke run, or a
run shorter than the budget, is reported without a verdict.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

from compare_dmc import print_verdicts, read_score_file

PUBLISHED = Path(__file__).parent / "data" / "published_atari.json"
EPISODES = 5
TOLERANCE = 100


def game_key(game: str) -> str:
    """The lookup key of a game: "Pong", "atari_pong", "MsPacman" and "ms_pacman" all work."""
    game = game.lower()
    game = game[len("atari_") :] if game.startswith("atari_") else game
    return "".join(c for c in game if c.isalnum())


def run_score(
    xs: Sequence[float],
    ys: Sequence[float],
    point: float,
    episodes: int = EPISODES,
    tolerance: float = TOLERANCE,
) -> float | None:
    """The mean of the last ``episodes`` returns ``ys`` whose frames ``xs`` are <= point + tolerance
    (None when there is none)."""
    window = [y for x, y in sorted(zip(xs, ys, strict=True), key=lambda p: p[0]) if x <= point + tolerance]
    window = window[-episodes:]
    return sum(window) / len(window) if window else None


def transcribe(
    runs: list[dict], budget: int = 400_000, at: Sequence[int] = (100_000, 200_000)
) -> dict[str, dict]:
    """Per game of the reference's score file (a list of {task, method, seed, xs, ys}): the number of
    seeds, ``final`` and ``final_std`` at ``budget`` and ``at`` (the module docstring), rounded to 0.1."""
    games: dict[str, list[dict]] = {}
    for run in runs:
        games.setdefault(run["task"][len("atari_") :], []).append(run)
    out = {}
    for game, group in sorted(games.items()):
        finals = [run_score(r["xs"], r["ys"], budget) for r in group]
        values = [v for v in finals if v is not None]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        earlier = {}
        for point in at:
            scores = [s for s in (run_score(r["xs"], r["ys"], point) for r in group) if s is not None]
            earlier[str(point)] = round(sum(scores) / len(scores), 1)
        out[game] = {"seeds": len(values), "final": round(mean, 1), "final_std": round(std, 1), "at": earlier}
    return out


def compare(result: dict, published: dict) -> dict:
    """The verdict for one run: score, reference, lower bound, passed (None: no verdict)."""
    table = published.get(result["agent"]) or {"games": {}, "protocol": {}}
    games = {game_key(name): entry for name, entry in table["games"].items()}
    entry = games.get(game_key(result["game"]))
    frames = result["frames"]
    curve = result["train_curve"]
    score = run_score([p["frames"] for p in curve], [p["return"] for p in curve], frames)
    out = {"agent": result["agent"], "game": result["game"], "seed": result["seed"], "frames": frames}
    if entry is None:
        out.update(score=score, reference=None, lower_bound=None, passed=None)
        out["note"] = "no published numbers for this game"
        return out
    reference, budget = entry["final"], table["protocol"]["frames"]
    lower = reference - max(2.0 * entry["final_std"], 0.1 * abs(reference))
    out.update(score=score, reference=reference, lower_bound=lower)
    if result.get("smoke") or frames < budget:
        out.update(passed=None, note=f"budget {frames} frames < protocol {budget}")
    elif score is None:
        out.update(passed=None, note="no training episode ended in the run")
    else:
        out.update(passed=bool(score >= lower))
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser()
    parser.add_argument("results", nargs="*", type=Path)
    parser.add_argument("--transcribe", type=Path, help="print the numbers of the reference's score file")
    args = parser.parse_args(argv)
    if args.transcribe:
        print(json.dumps(transcribe(read_score_file(args.transcribe)), indent=1))
        return []
    return print_verdicts(args.results, json.loads(PUBLISHED.read_text()), compare)


if __name__ == "__main__":
    main()

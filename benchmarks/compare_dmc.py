"""Compare a DMC protocol run (benchmarks/dmc_protocol.py) with the published numbers.

    python benchmarks/compare_dmc.py benchmarks/results/dmc_tdmpc2_walker-walk_seed0.json [...]

Published numbers: benchmarks/data/published_dmc.json (transcribed from the reference repositories'
result files). Acceptance bands, fixed before any run:

- TD-MPC2: the score is the mean of the evaluations (10 deterministic episodes each) made in the
  last 10% of the frame budget; the reference is the published 3-seed mean at that budget (linear
  between the published points). Pass when score >= reference - max(0.15 * reference, 50).
- DreamerV3: the score is the mean return of the training episodes that ended in the last 20K frames
  (the reference's metric: training episodes, 10K-frame bins); the reference is the published 5-seed
  mean of the last bin (490K frames) and its seed spread. Pass when
  score >= reference - max(2 * seed std, 0.1 * reference).

- From pixels (``--pixels`` runs): TD-MPC2 against its published pixel runs (``tdmpc2_pixels``, 3 seeds,
  the same band as from states). DreamerV3's visual-control scores are not in the reference's score
  files, so its pixel runs are reported without a verdict.

One seed is one sample: a fail on one seed says "run more seeds", not "broken".
A smoke run, or a run shorter than the protocol's budget, is reported without a verdict.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PUBLISHED = Path(__file__).parent / "data" / "published_dmc.json"


def _lookup(tasks: dict, task: str, env_id: str) -> dict | None:
    for name, entry in tasks.items():
        if entry["env_id"] == env_id or name == task:
            return entry
    return None


def _interpolate(xs: list[float], ys: list[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[-1]


def compare(result: dict, published: dict) -> dict:
    """The verdict for one run: score, reference, lower bound, passed (None: no verdict)."""
    agent = result["agent"]
    table = published.get(agent + ("_pixels" if result.get("pixels") else ""))
    entry = _lookup(table["tasks"], result["task"], result["env_id"]) if table else None
    frames = result["frames"]
    out = {"agent": agent, "task": result["task"], "seed": result["seed"], "frames": frames}
    if agent == "tdmpc2":
        window = [p["eval_mean"] for p in result["curve"] if p["frames"] >= 0.9 * frames]
        score = sum(window) / len(window) if window else None
        reference = _interpolate(entry["frames"], entry["mean"], frames) if entry else None
        lower = reference - max(0.15 * reference, 50.0) if reference is not None else None
    else:
        window = [p["return"] for p in result["train_curve"] if p["frames"] >= frames - 20_000]
        score = sum(window) / len(window) if window else None
        reference = entry["final_490k"] if entry else None
        lower = reference - max(2.0 * entry["final_std"], 0.1 * reference) if reference is not None else None
    out.update(score=score, reference=reference, lower_bound=lower)
    if entry is None:
        out.update(passed=None, note="no published numbers for this task")
    elif result.get("smoke") or frames < table["protocol"]["frames"]:  # type: ignore[index]
        out.update(passed=None, note=f"budget {frames} frames < protocol {table['protocol']['frames']}")
    elif score is None:
        out.update(passed=None, note="no evaluation in the scoring window")
    else:
        out.update(passed=bool(score >= lower))
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser()
    parser.add_argument("results", nargs="+", type=Path)
    args = parser.parse_args(argv)
    published = json.loads(PUBLISHED.read_text())
    verdicts = [compare(json.loads(p.read_text()), published) for p in args.results]
    for verdict in verdicts:
        print(json.dumps(verdict))
    return verdicts


if __name__ == "__main__":
    main()

"""Compare a DMC protocol run (benchmarks/dmc_protocol.py) with the published numbers.

    python benchmarks/compare_dmc.py benchmarks/results/dmc_tdmpc2_walker-walk_seed0.json [...]
    python benchmarks/compare_dmc.py --transcribe dmc_vision-dreamerv3.json.gz --budget 1000000

Published numbers: benchmarks/data/published_dmc.json (transcribed from the reference repositories'
result files). Acceptance bands, fixed before any run:

- TD-MPC2: the score is the mean of the evaluations (10 deterministic episodes each) made in the
  last 10% of the frame budget; the reference is the published 3-seed mean at that budget (linear
  between the published points). Pass when score >= reference - max(0.15 * reference, 50).
- DreamerV3: the score is the mean return of the training episodes that ended in the last 20K frames
  (the reference's metric: training episodes, 10K-frame bins); the reference is the published
  seed mean of the last bin before the budget (``final``: the 490K bin of 500K frames, 5 seeds) and
  its seed spread (``final_std``). Pass when score >= reference - max(2 * seed std, 0.1 * reference).

- From pixels (``--pixels`` runs): TD-MPC2 against its published pixel runs (``tdmpc2_pixels``, 3 seeds,
  the same band as from states); DreamerV3 against its published visual-control runs
  (``dreamerv3_pixels``: 20 tasks, 10 seeds (9 for finger_turn_hard, 8 for reacher_hard), the 990K
  bin of 1M frames), with the same score, field names and band as from states.

One seed is one sample: a fail on one seed says "run more seeds", not "broken".
A smoke run, or a run shorter than the protocol's budget, is reported without a verdict.

DreamerV3's numbers (``transcribe``): the reference's score files list, per task and seed, the
training-episode scores against environment frames. Each seed's run is binned into 10K-frame bins
with the reference's own binning (``binning`` of scores/plot.py@423291a: the bin (start, stop] is
labelled ``stop``, its value the mean of the episodes in it, an empty bin repeats the one before)
over the borders 0, 10K, ..., budget - 10K; ``final`` is the seed mean of the last bin,
``final_std`` its seed standard deviation (ddof 0, ``np.nanstd`` as plot.py), ``last5`` the mean of
the last five bins over seeds and ``at`` the seed mean of the bins at those frames. The proprio file
(dmc_proprio-dreamerv3.json.gz@2411f7d) is already binned so (bins 10K ... 490K): ``transcribe``
reproduces every number of the ``dreamerv3`` entry from it. The vision file
(dmc_vision-dreamerv3.json.gz@2411f7d) lists every episode (ending in groups of 8, one per env, every
8,016 frames: 8 envs x 501 replay rows x action repeat 2), so every 10K bin holds episodes.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

PUBLISHED = Path(__file__).parent / "data" / "published_dmc.json"
BIN_FRAMES = 10_000
"""Width of the bins of DreamerV3's published DMC curves (frames)."""


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


def binning(xs: Sequence[float], ys: Sequence[float], borders: Sequence[float]) -> list[float]:
    """The reference's binning (scores/plot.py@423291a, ``fill='last'``): for each bin (start, stop]
    of ``borders``, the mean of the ``ys`` whose ``xs`` fall in it; an empty bin repeats the previous
    value (NaN before the first non-empty one)."""
    points = sorted(zip(xs, ys, strict=True), key=lambda p: p[0])
    xs_sorted = [x for x, _ in points]
    binned: list[float] = []
    for start, stop in zip(borders[:-1], borders[1:], strict=False):
        left, right = bisect.bisect_right(xs_sorted, start), bisect.bisect_right(xs_sorted, stop)
        value = _mean(y for _, y in points[left:right])
        binned.append(binned[-1] if math.isnan(value) and binned else value)
    return binned


def _mean(values: Iterable[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _std(values: Iterable[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    mean = _mean(finite)
    return math.sqrt(sum((v - mean) ** 2 for v in finite) / len(finite)) if finite else math.nan


def transcribe(
    runs: list[dict], budget: int, at: Sequence[int] = (100_000, 250_000), width: int = BIN_FRAMES
) -> dict[str, dict]:
    """Per task of a reference score file (a list of {task, method, seed, xs, ys}): the number of
    seeds, ``final`` and ``final_std`` (the last bin before ``budget``), ``last5`` and ``at`` (see the
    module docstring), rounded to 0.1 as published_dmc.json keeps them. ``env_id`` is left out."""
    borders = list(range(0, budget, width))
    tasks: dict[str, list[list[float]]] = {}
    for run in runs:
        tasks.setdefault(run["task"], []).append(binning(run["xs"], run["ys"], borders))
    out = {}
    for task, curves in tasks.items():
        finals = [curve[-1] for curve in curves]
        out[task] = {
            "seeds": len(curves),
            "final": round(_mean(finals), 1),
            "final_std": round(_std(finals), 1),
            "last5": round(_mean(v for curve in curves for v in curve[-5:]), 1),
            "at": {str(x): round(_mean(curve[borders.index(x) - 1] for curve in curves), 1) for x in at},
        }
    return out


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
        reference = entry["final"] if entry else None
        lower = reference - max(2.0 * entry["final_std"], 0.1 * reference) if reference is not None else None
    out.update(score=score, reference=reference, lower_bound=lower)
    if entry is None:
        out.update(passed=None, note="no published numbers for this task")
    elif result.get("smoke") or frames < table["protocol"]["frames"]:  # type: ignore[index]
        out.update(passed=None, note=f"budget {frames} frames < protocol {table['protocol']['frames']}")
    elif score is None:
        what = "evaluation" if agent == "tdmpc2" else "training episode"
        out.update(passed=None, note=f"no {what} in the scoring window")
    else:
        out.update(passed=bool(score >= lower))
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser()
    parser.add_argument("results", nargs="*", type=Path)
    parser.add_argument("--transcribe", type=Path, help="print the numbers of a reference score file")
    parser.add_argument("--budget", type=int, default=500_000, help="frames, with --transcribe")
    parser.add_argument("--at", type=int, nargs="*", default=[100_000, 250_000], help="with --transcribe")
    args = parser.parse_args(argv)
    if args.transcribe:
        print(json.dumps(transcribe(read_score_file(args.transcribe), args.budget, args.at), indent=1))
        return []
    return print_verdicts(args.results, json.loads(PUBLISHED.read_text()), compare)


def read_score_file(path: Path) -> list[dict]:
    """The runs of a reference score file (``scores/*.json.gz``, or plain JSON)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as file:
        return json.load(file)


def print_verdicts(results: Sequence[Path], published: dict, judge) -> list[dict]:
    """``judge(result, published)`` for each result file, printed one JSON line each and returned."""
    verdicts = [judge(json.loads(p.read_text()), published) for p in results]
    for verdict in verdicts:
        print(json.dumps(verdict))
    return verdicts


if __name__ == "__main__":
    main()

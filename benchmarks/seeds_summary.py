"""Every seed of every learning check: one table, and one figure per check with all seeds.

    python benchmarks/seeds_summary.py              # prints the tables, writes docs/figures/seeds_*.svg

Reads benchmarks/results/<agent>_<task>_seed<k>.json (written by tdmpc2_learning.py and
dreamerv3_learning.py) and, where the reference code was run on the same task,
benchmarks/data/reference_runs.json. The checks run as seed groups (``--seeds``, one model for every
seed: <agent>_<task>_seeds<...>.json) get a table of their own, one row per group with each seed's
score, the mean, the interquartile mean and the seeds that pass, and one figure per group
(docs/figures/group_<agent>_<task>_seeds<...>.svg).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from plot_curves import reference_levels, svg_chart

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
FIGURES = HERE.parent / "docs" / "figures"
PAGE = HERE.parent / "docs" / "performance.md"
MARKERS = ("<!-- seeds-summary-table:start -->", "<!-- seeds-summary-table:end -->")
GROUP_MARKERS = ("<!-- seed-groups-table:start -->", "<!-- seed-groups-table:end -->")

CHECKS = {
    ("tdmpc2", "pendulum"): "TD-MPC2 Pendulum-v1, size 1, 6,000 steps (final evaluation)",
    ("tdmpc2", "cartpole-balance"): "TD-MPC2 cartpole-balance, size 1, 10,000 steps (final evaluation)",
    ("tdmpc2", "cartpole-balance-pixels"): (
        "TD-MPC2 cartpole-balance from 64 x 64 pixels, size 1, 10,000 steps (final evaluation)"
    ),
    ("dreamerv3", "pendulum"): 'DreamerV3 Pendulum-v1, "1m", 20,000 rows (final evaluation)',
    ("dreamerv3", "cartpole"): 'DreamerV3 CartPole-v1, "1m", 24,000 rows (mean of evaluations 12K-24K)',
}
MULTITASK = ("tdmpc2", "multitask")
MULTITASK_CHECK = "TD-MPC2 multi-task, offline, size 1, 10,000 updates"
"""The multi-task check's groups (tdmpc2_multitask_seeds<...>.json): one row per task."""
SUPERSEDED: dict[tuple[str, str, int], str] = {}  # (agent, task, seed) -> why a result no longer counts
COLORS = ["#c0392b", "#2471a3", "#229954", "#7d3c98", "#d68910"]


def load_results() -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {key: [] for key in CHECKS}
    for path in sorted(RESULTS.glob("*_seed*.json")):
        match = re.fullmatch(r"(tdmpc2|dreamerv3)_(.+)_seed(\d+)", path.stem)
        if not match or (match[1], match[2]) not in CHECKS:
            continue
        result = json.loads(path.read_text())
        result["_seed"] = int(match[3])
        out[match[1], match[2]].append(result)
    return out


def load_groups() -> dict[str, dict]:
    """The seed groups' results: {file stem: result} of <agent>_<task>_seeds<...>.json, for the checks."""
    out = {}
    for path in sorted(RESULTS.glob("*_seeds*.json")):
        match = re.fullmatch(r"(tdmpc2|dreamerv3)_(.+)_(seeds[0-9_-]+)", path.stem)
        if match and ((match[1], match[2]) in CHECKS or (match[1], match[2]) == MULTITASK):
            out[path.stem] = {**json.loads(path.read_text()), "_key": (match[1], match[2])}
    return out


def group_rows(r: dict) -> list[tuple[str, dict, float]]:
    """(check, {per_seed, mean, iqm, n_passed, n_seeds}, bar) per row: one for a check's group, one per
    task for a multi-task group (a seed passes a task when it scores at least that task's bar)."""
    if r["_key"] == MULTITASK:
        return [(f"{MULTITASK_CHECK}: {task}", t, t["bar"]) for task, t in r["tasks"].items()]
    return [(CHECKS[r["_key"]].split(" (")[0], r, r["threshold"])]


def group_table(groups: dict[str, dict]) -> str:
    """One row per seed group: each seed's score, the mean, the IQM, the seeds that pass the bar."""
    lines = [
        "| check | seeds | scores | mean | IQM | bar | passing | wall-clock | device | date | commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = [*CHECKS, MULTITASK]
    for stem in sorted(groups, key=lambda stem: order.index(groups[stem]["_key"])):
        r = groups[stem]
        device = r.get("device_kind", "")
        if r.get("backend") == "cpu":  # a CPU's wall-clock names the CPU and its cores
            device = f"{r.get('cpu_model', 'CPU')}, {r.get('machine', '').split(' ', 1)[-1]}"
        if r.get("settings", {}).get("compute_dtype", "float32") != "float32":
            device += f", {r['settings']['compute_dtype']}"
        for check, row, bar in group_rows(r):
            seeds = ", ".join(str(s["seed"]) for s in row["per_seed"])
            scores = ", ".join(f"{s['score']:.1f}" for s in row["per_seed"])
            passing = f"{row['n_passed']} of {row['n_seeds']}" if r.get("done", True) else "running"
            bar_text = f"{bar:.1f}" if bar % 1 else f"{bar:g}"
            cells = [check, seeds, scores, f"{row['mean']:.1f}", f"{row['iqm']:.1f}", bar_text, passing]
            cells += [f"{r['wall_seconds'] / 60:.0f} min", device, r.get("date", "")]
            cells += [r.get("commit", "") or "-"]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def table(results: dict[tuple[str, str], list[dict]]) -> str:
    lines = [
        "| check | seed | score | bar | result | updates | wall-clock | date | commit | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, title in CHECKS.items():
        for r in sorted(results[key], key=lambda r: r["_seed"]):
            done = r.get("done", True)
            verdict = "pass" if r["passed"] else ("fail" if done else "running")
            note = SUPERSEDED.get((*key, r["_seed"]), "")
            cells = [title.split(" (")[0], r["_seed"], f"{r['score']:.1f}", f"{r['threshold']:g}", verdict]
            cells += [f"{r['updates']:,}", f"{r['wall_seconds'] / 60:.0f} min", r.get("date", "")]
            cells += [r.get("commit", "") or "-", note]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def figure(
    key: tuple[str, str], runs: list[dict], references: list[dict], name: str | None = None
) -> Path | None:
    if not runs:
        return None
    step_key = "steps" if key[0] == "tdmpc2" else "rows"
    series = []
    current = [r for r in runs if (*key, r["_seed"]) not in SUPERSEDED]
    for i, r in enumerate(sorted(current, key=lambda r: r["_seed"])):
        color = COLORS[i % len(COLORS)]
        train = r.get("train_curve") or []
        if train:
            series.append(
                {
                    "x": [p[step_key] for p in train],
                    "y": [p["return"] for p in train],
                    "color": color,
                    "width": 1,
                    "label": f"seed {r['_seed']}: training episodes",
                }
            )
        series.append(
            {
                "x": [p[step_key] for p in r["curve"]],
                "y": [p["eval_mean"] for p in r["curve"]],
                "color": color,
                "width": 2,
                "dots": True,
                "label": f"seed {r['_seed']}: evaluation, score {r['score']:.0f}",
            }
        )
    for ref in references:
        series.append({"x": ref["x"], "y": ref["y"], "color": "#555555", "width": 2, "label": ref["label"]})
    threshold = runs[0].get("threshold")
    svg = svg_chart(series, threshold, CHECKS[key], step_key)
    target = FIGURES / f"{name or f'seeds_{key[0]}_{key[1]}'}.svg"
    target.write_text(svg)
    return target


def multitask_figures(stem: str, r: dict) -> list[Path]:
    """One figure per task of a multi-task group: each seed's evaluations over updates (2 episodes),
    its final score (10), the single-task agent's and the random policy's scores; the bar dashed."""
    paths = []
    for task, t in r["tasks"].items():
        series = reference_levels(t["single"], t["random"], r["updates"])
        for i, seed in enumerate(t["per_seed"]):
            color = COLORS[i % len(COLORS)]
            key = f"seed_{seed['seed']}/{task}"
            points = [p for p in r["curve"] if key in p]
            series.append(
                {
                    "x": [p["updates"] for p in points] + [r["updates"]],
                    "y": [p[key] for p in points] + [seed["score"]],
                    "color": color,
                    "width": 2,
                    "dots": True,
                    "label": f"seed {seed['seed']}: evaluations, final {seed['score']:.0f}",
                }
            )
        title = f"{MULTITASK_CHECK}: {task}"
        target = FIGURES / f"group_{stem}_{task}.svg"
        target.write_text(svg_chart(series, t["bar"], title, "updates"))
        paths.append(target)
    return paths


def main() -> None:
    results = load_results()
    reference = json.loads((HERE / "data" / "reference_runs.json").read_text())
    FIGURES.mkdir(parents=True, exist_ok=True)
    for key, runs in results.items():
        path = figure(key, runs, reference.get(f"{key[0]}_{key[1]}", []))
        if path:
            print(path)
    text = table(results)
    print(text)
    write_table(PAGE, text)
    groups = load_groups()
    for stem, r in groups.items():
        if r["_key"] == MULTITASK:
            for path in multitask_figures(stem, r):
                print(path)
            continue
        runs = [{**s, "_seed": s["seed"], "threshold": r["threshold"]} for s in r["per_seed"]]
        path = figure(r["_key"], runs, [], name=f"group_{stem}")
        if path:
            print(path)
    if groups:
        text = group_table(groups)
        print(text)
        write_table(PAGE, text, GROUP_MARKERS)


def write_table(page: Path, text: str, markers: tuple[str, str] = MARKERS) -> None:
    """Replace the table between the page's markers (the page is left alone without them)."""
    content = page.read_text()
    start, end = markers
    if start not in content or end not in content:
        return
    head, rest = content.split(start, 1)
    _, tail = rest.split(end, 1)
    page.write_text(f"{head}{start}\n{text}\n{end}{tail}")


if __name__ == "__main__":
    main()

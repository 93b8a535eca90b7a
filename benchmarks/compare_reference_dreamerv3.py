"""Our DreamerV3 learning check against the reference code's own run of the same task, row for row.

    python benchmarks/compare_reference_dreamerv3.py --stats \
        benchmarks/results/checkpoints/dreamerv3_cartpole_seed1 /path/to/reference_logdir \
        --svg docs/figures/dreamerv3_cartpole_reference.svg

The reference (danijar/dreamerv3 at 2411f7d + 29eb964) writes the return of every finished training
episode to ``scores.jsonl`` (``step`` = rows collected) and its training statistics to
``metrics.jsonl``; our checkpointed learning scripts keep the same returns in ``progress.json``
(``train_curve``) and the statistics in ``log_from_*/progress.csv``. Printed per window of rows:
the number and mean return of the training episodes that ended in it (the sampling policy, as in
the check), and the continue head's loss on terminal rows where both logged it; with ``--stats``,
the training statistics both log (losses, returns, values, advantages, entropies), side by side.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
from plot_curves import svg_chart


def ours(folder: Path) -> tuple[list[tuple[int, float]], list[tuple[int, dict]]]:
    """(rows, return) of finished training episodes; (rows, statistics) of the logged updates."""
    progress = json.loads((folder / "progress.json").read_text())
    episodes = [(e["rows"], e["return"]) for e in progress["train_curve"]]
    stats = []
    for log in sorted(folder.glob("log_from_*/progress.csv")):
        with log.open() as f:
            for row in csv.DictReader(f):
                if row.get("time/total_timesteps"):
                    stats.append((int(float(row["time/total_timesteps"])), row))
    return episodes, stats


def reference(logdir: Path) -> tuple[list[tuple[int, float]], list[tuple[int, dict]]]:
    episodes = []
    for line in (logdir / "scores.jsonl").read_text().splitlines():
        entry = json.loads(line)
        episodes.append((int(entry["step"]), float(entry["episode/score"])))
    stats = []
    for line in (logdir / "metrics.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if "train/dyn_loss" in entry:
            # The reference does not log its normaliser's scale; ret_normed = (ret - offset) / scale.
            if entry.get("train/ret_normed/std"):
                entry["train/ret_scale"] = entry["train/ret/std"] / entry["train/ret_normed/std"]
            stats.append((int(entry["step"]), entry))
    return sorted(set(episodes)), stats


# Our training statistic -> the reference's name for the same quantity (batch means of one update).
PAIRED_STATS = {
    "train/dyn_loss": "train/dyn_loss",
    "train/rep_loss": "train/rep_loss",
    "train/rew_loss": "train/reward_loss",
    "train/con_loss": "train/cont_loss",
    "train/actor_loss": "train/actor_loss",
    "train/critic_loss": "train/critic_loss",
    "train/repval_loss": "train/replay_critic_loss",
    "train/return_mean": "train/ret/mean",
    "train/return_std": "train/ret/std",
    "train/return_min": "train/ret/min",
    "train/return_max": "train/ret/max",
    "train/retnorm_scale": "train/ret_scale",
    "train/value_mean": "train/val/mean",
    "train/value_std": "train/val/std",
    "train/adv_mean": "train/adv/mean",
    "train/weight_mean": "train/weight/mean",
    "train/imag_reward_mean": "train/rew/mean",
    "train/imag_reward_std": "train/rew/std",
    "train/actor_entropy": "train/ent/action/mean",
    "train/post_entropy": "train/post_ent/mean",
    "train/prior_entropy": "train/prior_ent/mean",
    "train/grad_norm": "train/opt_grad_norm",
}


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def window_mean(episodes: list[tuple[int, float]], lo: int, hi: int) -> tuple[int, float | None]:
    values = [r for s, r in episodes if lo <= s < hi]
    return len(values), (float(np.mean(values)) if values else None)


def stat_near(stats: list[tuple[int, dict]], lo: int, hi: int, key: str) -> float | None:
    values = [float(v[key]) for s, v in stats if lo <= s < hi and v.get(key) not in (None, "", "nan")]
    values = [v for v in values if np.isfinite(v)]
    return float(np.mean(values)) if values else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ours", type=Path, help="our checkpoint folder (progress.json, log_from_*)")
    parser.add_argument("reference", type=Path, help="the reference's logdir (scores.jsonl, metrics.jsonl)")
    parser.add_argument("--window", type=int, default=2_000)
    parser.add_argument("--svg", type=Path, default=None)
    parser.add_argument("--stats", action="store_true", help="also the paired training statistics")
    args = parser.parse_args()
    our_eps, our_stats = ours(args.ours)
    ref_eps, ref_stats = reference(args.reference)
    end = max([s for s, _ in our_eps + ref_eps], default=0) + 1
    print(
        "rows | ours: episodes, mean return | reference: episodes, mean return | terminal-row loss ours / ref"
    )
    for lo in range(0, end, args.window):
        hi = lo + args.window
        n_o, m_o = window_mean(our_eps, lo, hi)
        n_r, m_r = window_mean(ref_eps, lo, hi)
        neg_o = stat_near(our_stats, lo, hi, "train/constats/neg_loss")
        neg_r = stat_near(ref_stats, lo, hi, "train/constats/neg_loss")

        print(f"{lo}-{hi} | {n_o}, {fmt(m_o)} | {n_r}, {fmt(m_r)} | {fmt(neg_o)} / {fmt(neg_r)}")
    if args.stats:
        print("\nstatistic (ours / reference), mean over the updates logged in each window")
        print("rows | " + " | ".join(k.removeprefix("train/") for k in PAIRED_STATS))
        for lo in range(0, end, args.window):
            hi = lo + args.window
            cells = []
            for mine, theirs in PAIRED_STATS.items():
                o, r = stat_near(our_stats, lo, hi, mine), stat_near(ref_stats, lo, hi, theirs)
                cells.append(f"{fmt(o)} / {fmt(r)}")
            print(f"{lo}-{hi} | " + " | ".join(cells))
    if args.svg is not None:
        series = [
            {
                "x": [s for s, _ in ref_eps],
                "y": [r for _, r in ref_eps],
                "color": "#7f8c8d",
                "width": 1,
                "label": "reference code: training episodes",
            },
            {
                "x": [s for s, _ in our_eps],
                "y": [r for _, r in our_eps],
                "color": "#c0392b",
                "width": 1,
                "label": "ours: training episodes",
            },
        ]
        args.svg.write_text(
            svg_chart(series, None, "DreamerV3 on CartPole-v1: ours and the reference code", "rows")
        )
        print(args.svg)


if __name__ == "__main__":
    main()

"""Plot learning-check results (benchmarks/results/*.json) as SVG line charts in docs/figures/.

    python benchmarks/plot_curves.py benchmarks/results/tdmpc2_pendulum_seed0.json

No plotting library needed: each figure is a small hand-written SVG with the evaluation curve
(points), the training-episode returns (thin line, when recorded) and the acceptance threshold
(dashed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

WIDTH, HEIGHT, PAD = 640, 360, 56


def reference_levels(single: float, random: float, updates: float) -> list[dict]:
    """The multi-task checks' two flat reference lines over 0..updates: the single-task agent's score
    and the random policy's."""
    ends = [0, updates]
    return [
        {"x": ends, "y": [single] * 2, "color": "#27ae60", "width": 1, "label": "single-task agent"},
        {"x": ends, "y": [random] * 2, "color": "#7f8c8d", "width": 1, "label": "random policy"},
    ]


def _scale(values: list[float], lo: float, hi: float, a: float, b: float) -> list[float]:
    span = (hi - lo) or 1.0
    return [a + (v - lo) / span * (b - a) for v in values]


def svg_chart(series: list[dict], threshold: float | None, title: str, xlabel: str) -> str:
    xs = [x for s in series for x in s["x"]]
    ys = [y for s in series for y in s["y"]] + ([threshold] if threshold is not None else [])
    x0, x1 = 0.0, max(xs) if xs else 1.0
    y0, y1 = min(ys), max(ys)
    margin = 0.05 * ((y1 - y0) or 1.0)
    y0, y1 = y0 - margin, y1 + margin
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="black"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="black"/>',
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 16}" text-anchor="middle">{xlabel}</text>',
    ]
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        (yp,) = _scale([yv], y0, y1, HEIGHT - PAD, PAD)
        out.append(f'<text x="{PAD - 6}" y="{yp + 4:.1f}" text-anchor="end">{yv:.0f}</text>')
        xv = x0 + (x1 - x0) * i / 4
        (xp,) = _scale([xv], x0, x1, PAD, WIDTH - PAD)
        out.append(f'<text x="{xp:.1f}" y="{HEIGHT - PAD + 16}" text-anchor="middle">{xv:.0f}</text>')
    if threshold is not None:
        (tp,) = _scale([threshold], y0, y1, HEIGHT - PAD, PAD)
        out.append(
            f'<line x1="{PAD}" y1="{tp:.1f}" x2="{WIDTH - PAD}" y2="{tp:.1f}" stroke="gray" '
            'stroke-dasharray="6,4"/>'
        )
        out.append(
            f'<text x="{WIDTH - PAD}" y="{tp - 4:.1f}" text-anchor="end" fill="gray">'
            f"threshold {threshold:g}</text>"
        )
    for k, s in enumerate(series):
        px = _scale(s["x"], x0, x1, PAD, WIDTH - PAD)
        py = _scale(s["y"], y0, y1, HEIGHT - PAD, PAD)
        points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px, py, strict=True))
        out.append(
            f'<polyline points="{points}" fill="none" stroke="{s["color"]}" stroke-width="{s["width"]}"/>'
        )
        if s.get("dots"):
            out += [
                f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{s["color"]}"/>'
                for a, b in zip(px, py, strict=True)
            ]
        out.append(f'<text x="{PAD + 8}" y="{PAD + 14 * k}" fill="{s["color"]}">{s["label"]}</text>')
    out.append("</svg>")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results", nargs="+")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "figures"))
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in map(Path, args.results):
        result = json.loads(path.read_text())
        step_key = "steps" if result["curve"] and "steps" in result["curve"][0] else "rows"
        series = []
        train = result.get("train_curve") or []
        if train:
            series.append(
                {
                    "x": [p[step_key] for p in train],
                    "y": [p["return"] for p in train],
                    "color": "#9bbcd6",
                    "width": 1,
                    "label": "training episodes",
                }
            )
        series.append(
            {
                "x": [p[step_key] for p in result["curve"]],
                "y": [p["eval_mean"] for p in result["curve"]],
                "color": "#c0392b",
                "width": 2,
                "dots": True,
                "label": "evaluation (10 episodes)",
            }
        )
        title = f"{path.stem}: score {result['score']:.1f} ({'pass' if result['passed'] else 'fail'})"
        svg = svg_chart(series, result.get("threshold"), title, step_key)
        target = out_dir / f"{path.stem}.svg"
        target.write_text(svg)
        print(target)


if __name__ == "__main__":
    main()

"""Plot the caller-latency distributions of a merged report as survival curves.

Usage: ``python benchmarks/plot.py [--report results/latest.json] [--out results/latency.png]``

Each curve is one row of ``bench_latency.py``'s caller table (left panel: async_tee's
conditions and its floor, inline and janus baselines) or of its baselines table (right
panel: what users would pick instead, beside the tee, the floor and the inline tee of the
same run, so those three curves appear in both panels): the share of calls slower
than x, on log-log axes, from the ``CURVE_POINTS`` quantiles each row keeps (pooled over
its blocks). Far left and low is good; a curve's knee is its typical cost and its tail
to the right the rare stalls. Paced (trainer-pace) rows are dashed. The empty-timer row is
left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from _common import RESULTS

DEFAULT_REPORT = RESULTS / "latest.json"
DEFAULT_OUT = RESULTS / "latency.png"
PANELS = (
    ("caller", "conditions", "async_tee per condition (bench_latency: caller)"),
    ("baselines", "variants", "what users pick instead, back to back (bench_latency: baselines)"),
)


def _rows(report: dict[str, Any], part: str, key: str) -> dict[str, dict[str, Any]]:
    rows = report.get(part, {}).get(key, {})
    return {k: row for k, row in rows.items() if row["kind"] != "timer" and "curve" in row}


# Fixed colours for the reference rows; the others take the palette in order, and a paced
# row takes its back-to-back twin's colour (dashed).
ANCHORS = {"floor": "#000000", "healthy_b2b": "#ff7f0e", "inline": "#800000"}
TWINS = {"healthy_paced": "healthy_b2b", "floor_paced": "floor", "off_paced": "off"}
PALETTE = (
    "#1f77b4",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#000080",
    "#008080",
    "#ff00ff",
    "#b8860b",
    "#7fff00",
)


def _colours(panels: list[tuple[dict[str, dict[str, Any]], str]]) -> dict[str, Any]:
    """One colour per row key, the same in both panels (floor, tee, inline appear twice)."""
    keys = dict.fromkeys(TWINS.get(key, key) for rows, _ in panels for key in rows)
    own = [key for key in keys if key not in ANCHORS]
    colours = {**ANCHORS, **{key: PALETTE[i % len(PALETTE)] for i, key in enumerate(own)}}
    return {**colours, **{paced: colours[twin] for paced, twin in TWINS.items() if twin in colours}}


def _draw(axis: Any, rows: dict[str, dict[str, Any]], title: str, colours: dict[str, Any]) -> None:
    for key, row in rows.items():
        curve = row["curve"]
        survival = [max(1 - q, 1e-6) for q in curve["q"]]
        axis.step(
            curve["us"],
            survival,
            where="post",
            color=colours[key],
            linestyle="--" if row.get("paced") else "-",
            linewidth=1.4,
            label=f"{row['label']} (p50 {row['median_block_p50_us']:.3g} µs)",
        )
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_ylim(1e-5, 1.05)
    axis.set_xlabel("caller latency per call (µs, log scale)")
    axis.set_ylabel("share of calls slower than x")
    axis.set_title(title, fontsize=11)
    axis.grid(True, which="major", alpha=0.4)
    axis.grid(True, which="minor", alpha=0.12)
    axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)


def plot(report: dict[str, Any], out: Path) -> Path:
    """Write the PNG and return its path."""
    # matplotlib is typed, but only the bench-full extra installs it (CI has the bench one).
    import matplotlib  # type: ignore[import-not-found, unused-ignore]

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]

    panels = [(rows, title) for part, key, title in PANELS if (rows := _rows(report, part, key))]
    if not panels:
        raise SystemExit("no latency curves in the report")
    colours = _colours(panels)
    figure, axes = plt.subplots(1, len(panels), figsize=(8 * len(panels), 8.5), squeeze=False)
    for axis, (rows, title) in zip(axes[0], panels, strict=True):
        _draw(axis, rows, title, colours)
    machine = report.get("machine", {})
    figure.suptitle(
        "tee_rl_metrics_to_otel and alternatives: 68-key dict, one call per sample "
        f"(Python {machine.get('python', '?')}, {machine.get('cpu_count', '?')} CPUs)",
        fontsize=12,
    )
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    print(f"wrote {plot(json.loads(args.report.read_text()), args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

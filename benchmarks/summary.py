"""The README's benchmark summary: one compact table, generated from ``results/latest.json``.

Usage: ``python benchmarks/summary.py [--results PATH] [--readme PATH]`` rewrites the README
between the markers ``<!-- bench-summary:start -->`` and ``<!-- bench-summary:end -->``, and its
first screen's line between ``<!-- bench-headline:start -->`` and ``<!-- bench-headline:end -->``.
``run_all.py`` calls :func:`main` after a full run has written ``results/latest.json``
(never after ``--quick``), and ``tests/test_docs.py`` checks that the README's table is
:func:`render` of that file, so no figure in the README is copied by hand. Every table of
the run is in ``results/latest.md``.

Standard library only: the test imports this file without the benchmarks' dependencies.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS_JSON = HERE / "results" / "latest.json"
README = HERE.parent / "README.md"
START = "<!-- bench-summary:start -->"
END = "<!-- bench-summary:end -->"
HEADLINE_START = "<!-- bench-headline:start -->"
HEADLINE_END = "<!-- bench-headline:end -->"
CAPACITY_START = "<!-- bench-capacity:start -->"
CAPACITY_END = "<!-- bench-capacity:end -->"
CAPACITY_JSON = {  # bench_fleet.py's full run of each stack, as published
    "remote-write": HERE / "results" / "capacity-remote-write.json",
    "fleet": HERE / "results" / "capacity-fleet.json",
}
_STACK_NAMES = {
    "remote-write": "one Collector -> Prometheus 3",
    "fleet": "node agents -> Thanos (3 receivers, replication 2)",
}

Row = tuple[str, str, str]


def _g(value: float) -> str:
    """A figure to three significant digits, never in exponent form."""
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:#.3g}".rstrip(".")


def _part(results: dict[str, Any], name: str) -> dict[str, Any]:
    """One part of the run, or ``{}`` where it is absent or failed (its rows are left out)."""
    part = results.get(name)
    return part if isinstance(part, dict) and "failed" not in part else {}


def _run_row(results: dict[str, Any]) -> Iterator[Row]:
    machine = results["machine"]
    versions = machine.get("versions", {})
    commit = (machine.get("source", {}).get("commit") or "unknown")[:7]
    yield (
        "the run",
        f"commit {commit}",
        f"Python {machine['python']}, {machine['cpu_count']} CPUs ({machine['cpu_model']}), "
        f"opentelemetry-sdk {versions.get('opentelemetry-sdk', '?')}",
    )


def _latency(row: dict[str, Any]) -> str:
    """``p50 / p99 / p99.9`` in µs; the p50 is the median of the interleaved blocks' p50s."""
    us = row["us"]
    return f"{_g(row['median_block_p50_us'])} / {_g(us['p99'])} / {_g(us['p99.9'])} µs"


def _caller_rows(results: dict[str, Any]) -> Iterator[Row]:
    caller = _part(results, "caller").get("conditions", {})
    if not caller:
        return
    floor, floor_paced = caller["floor"], caller["floor_paced"]
    paced = caller["healthy_paced"]
    yield (
        "tee call, healthy receiver, trainer pace (a call every 2 ms): p50 / p99 / p99.9",
        _latency(paced),
        f"x{paced['x_floor']:.2f} the floor `deque.append(dict(d))` at the same pace "
        f"({_g(floor_paced['median_block_p50_us'])} µs p50)",
    )
    b2b = caller["healthy_b2b"]
    yield (
        "tee call, healthy receiver, back to back (the microbenchmark)",
        _latency(b2b),
        f"x{b2b['x_floor']:.2f} the floor back to back ({_g(floor['median_block_p50_us'])} µs p50)",
    )
    stalled = caller["stalled"]
    yield (
        "tee call, stalled receiver, back to back",
        _latency(stalled),
        f"x{stalled['x_floor']:.2f} the floor",
    )
    full = caller.get("stalled_full")
    if full:
        backlog = full["pipeline"]["backlog_max"]
        yield (
            "tee call, stalled receiver, export backlog at its bound, back to back",
            _latency(full),
            f"x{full['x_floor']:.2f} the floor; {backlog['queued']:,} requests "
            f"({backlog['queued_bytes'] / 2**20:.0f} MiB) queued",
        )
    off, off_paced = caller["off"], caller["off_paced"]
    yield (
        "tee call, telemetry off: p50 back to back / at trainer pace",
        f"{_g(off['median_block_p50_us'])} / {_g(off_paced['median_block_p50_us'])} µs",
        "a global read and a return",
    )
    inline, seed = caller["inline"], caller.get("inline_sdk")
    yield (
        "the worker's recorder called inline on the training thread, p50",
        f"{_g(inline['median_block_p50_us'])} µs",
        f"the seed's shape (SDK synchronous instruments): {_g(seed['median_block_p50_us'])} µs"
        if seed
        else "",
    )
    janus = caller.get("janus")
    if janus:
        yield (
            "janus drop-oldest hand-off, back to back (the baseline)",
            _latency(janus),
            f"x{janus['x_floor']:.2f} the floor",
        )


def _stolen_rows(results: dict[str, Any]) -> Iterator[Row]:
    stolen = _part(results, "stolen")
    if not stolen:
        return
    lost = {(c["rate"], c["variant"]): c["lost_pct"] for c in stolen["cells"]}
    attributable = {
        (c["rate"], c["variant"]): c["attributable_longest_ms"] for c in stolen["comparisons"]
    }
    for rate in stolen["config"]["rates"]:
        if (rate, "off") not in lost:
            continue
        on = ", ".join(
            f"{lost[rate, variant]:.2f} % {variant}"
            for variant in ("healthy", "stalled")
            if (rate, variant) in lost
        )
        gap = attributable.get((rate, "healthy"))
        yield (
            f"training thread's time lost, {rate} step{'s' if rate != 1 else ''}/s: off, on",
            f"{lost[rate, 'off']:.2f} % off, {on}",
            f"longest gap attributable to telemetry {gap:.2f} ms (healthy)" if gap else "",
        )


def _scale_rows(results: dict[str, Any]) -> Iterator[Row]:
    rows = {
        (r["series"], r["categories"], r["variant"]): r
        for r in _part(results, "scale").get("rows", [])
    }
    # "tables" in runs from before issue 42, when the SDK's collection was a variant too
    on = rows.get((3_000, 10, "on")) or rows.get((3_000, 10, "tables"))
    if on:
        yield (
            "3,000 extra series at 1 step/s: time lost on minus off, longest gap",
            f"{on['lost_pct_diff']:+.2f} %, {on['longest_ms']:.1f} ms",
            f"telemetry off: longest gap {on['off_longest_ms']:.1f} ms; targets <= 1 %, <= 2 ms",
        )


def _gc_rows(results: dict[str, Any]) -> Iterator[Row]:
    gc = _part(results, "gc")
    cells = gc.get("cells")
    if cells:
        tables, sdk = cells["tables"]["collections"], cells["sdk"]["collections"]
        yield (
            "garbage collections while one export's request is built, "
            f"{gc['series']:,} declared series (young threshold {gc['young_threshold']}): "
            "p50 / max",
            f"{tables['p50']:.0f} / {tables['max']:.0f}",
            "the OTel SDK's own collection and encoder (its OTLP exporters' way), same series: "
            f"{sdk['p50']:.0f} / {sdk['max']:.0f}",
        )


def _alerts_rows(results: dict[str, Any]) -> Iterator[Row]:
    rows = _part(results, "alerts").get("rows", [])
    fired = [r for r in rows if r["firing_s"]]
    if fired:
        yield (
            "alert from the event to firing, real Prometheus (1 s scrape and evaluation), median s",
            ", ".join(f"`{r['rule']}` {r['firing_s']['median']:.1f}" for r in fired),
            "the rules' own threshold + `for:`: "
            + ", ".join(f"{r['own_s']:.1f}" for r in fired)
            + " (short test thresholds)",
        )


def _export_rows(results: dict[str, Any]) -> Iterator[Row]:
    cells = _part(results, "export").get("cells", [])
    by_step: dict[float, dict[str, float]] = {}
    for cell in cells:
        by_step.setdefault(cell["step_s"], {})[cell["mode"]] = cell["totals"][
            "process_cpu_per_step_us"
        ]
    for step_s, modes in sorted(by_step.items()):
        if "http" not in modes:
            continue
        http = modes["http"]
        against = [
            f"the OTel SDK alone, same series, over {name}: {_g(modes[mode] / 1000)} ms "
            f"({http / modes[mode]:.2f}x)"
            for mode, name in (("sdk-alone", "gRPC"), ("sdk-alone-http", "HTTP"))
            if modes.get(mode)
        ]
        against += (
            [f"async_tee over gRPC: {_g(modes['step'] / 1000)} ms"] if "step" in modes else []
        )
        yield (
            f"Process CPU per {step_s:g} s step (training's tee calls and every thread), "
            "step-aligned export over OTLP/HTTP, the default",
            f"{_g(http / 1000)} ms",
            "; ".join(against),
        )


def _memory_rows(results: dict[str, Any]) -> Iterator[Row]:
    phases = _part(results, "memory").get("memory", {}).get("phases", [])
    if not phases:
        return
    yield (
        "RSS growth once the queue is full, receiver stalled ("
        + " / ".join(p["phase"] for p in phases)
        + ")",
        " / ".join(f"+{p['growth_once_full_mib']:.2f}" for p in phases) + " MiB",
        "all within (queue + batch) x item"
        if all(p["within_bound"] and p["no_growth_once_full"] for p in phases)
        else "**not** within (queue + batch) x item",
    )


def render(results: dict[str, Any]) -> str:
    """The summary table of one run (``latest.json`` loaded), as markdown lines."""
    rows = [
        *_run_row(results),
        *_caller_rows(results),
        *_stolen_rows(results),
        *_scale_rows(results),
        *_gc_rows(results),
        *_export_rows(results),
        *_memory_rows(results),
        *_alerts_rows(results),
    ]
    lines = ["| measure | this run | against |", "|---|---|---|"]
    lines += [f"| {what} | {figure} | {against} |" for what, figure, against in rows]
    return "\n".join(lines) + "\n"


def headline(results: dict[str, Any]) -> str:
    """The first screen's line: the call's cost at trainer pace and back to back, each
    against the floor measured beside it (empty without the caller part)."""
    caller = _part(results, "caller").get("conditions", {})
    if not caller:
        return ""
    paced, b2b = caller["healthy_paced"], caller["healthy_b2b"]
    machine = results["machine"]
    commit = (machine.get("source", {}).get("commit") or "unknown")[:7]
    return (
        f"Measured (commit {commit}, {machine['cpu_count']} CPUs): a tee call costs the "
        "training thread "
        f"{_g(paced['median_block_p50_us'])} µs p50 at trainer pace, x{paced['x_floor']:.2f} "
        f"the floor `deque.append(dict(d))` at that pace ("
        f"{_g(caller['floor_paced']['median_block_p50_us'])} µs, caches as cold), and "
        f"{_g(b2b['median_block_p50_us'])} µs back to back, x{b2b['x_floor']:.2f} its floor ("
        f"{_g(caller['floor']['median_block_p50_us'])} µs).\n"
    )


def _n(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def render_capacity(reports: dict[str, dict[str, Any]]) -> str:
    """The README's capacity table: per stack and tier, the CPU a point costs and the ranks a
    core takes at each cadence, and the cores 1,000 and 10,000 ranks at 10 s steps need; then
    each stack's knees and largest run, counted in its store."""
    lines = [
        "| stack | tier | CPU-µs a point | ranks a core at 1 s / 10 s / 60 s steps "
        "| cores for 1,000 / 10,000 ranks at 10 s |",
        "|---|---|---|---|---|",
    ]
    notes = []
    for name, report in reports.items():
        for tier in ("agent", "store"):
            cells = report["capacity"].get(tier)
            if not cells:
                continue
            at10 = cells["10s"]
            per_core = " / ".join(_n(cells[f"{s}s"]["ranks_per_core"]) for s in (1, 10, 60))
            cores = at10["cores_per_ranks"]
            lines.append(
                f"| {_STACK_NAMES.get(name, name)} | {tier} | {at10['cpu_us_per_point']:.1f} | "
                f"{per_core} | {cores['1000']:.2g} / {cores['10000']:.2g} |"
            )
        largest = max(report["runs"], key=lambda run: run["ranks"] * run["steps"])
        store = largest["store"]
        knees = "; ".join(
            f"{step} steps: {knee['text'].rstrip('.')}" for step, knee in report["knees"].items()
        )
        notes.append(
            f"- {_STACK_NAMES.get(name, name)} ({report['points_per_request']} points a rank "
            f"step): {knees}. Largest run: {largest['ranks']:,} ranks x {largest['steps']} steps "
            f"of {largest['step_s']:g} s, {store['present']:,} of "
            f"{largest['ranks'] * largest['steps']:,} (rank, step) in the store, "
            f"{store['missing']} missing."
        )
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def block(readme: str, start_marker: str = START, end_marker: str = END) -> str:
    """The text between the markers (the generated table), or ValueError without them."""
    start, end = readme.find(start_marker), readme.find(end_marker)
    if start < 0 or end < start:
        raise ValueError(f"the README has no {start_marker} ... {end_marker} block")
    return readme[start + len(start_marker) : end].lstrip("\n")


def replace(readme: str, table: str, start_marker: str = START, end_marker: str = END) -> str:
    """``readme`` with its marked block replaced by ``table``."""
    block(readme, start_marker, end_marker)  # the markers exist, in order
    start, end = readme.find(start_marker), readme.find(end_marker)
    return readme[: start + len(start_marker)] + "\n" + table + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS_JSON)
    parser.add_argument("--readme", type=Path, default=README)
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    if results.get("config", {}).get("quick"):
        print(f"{args.results} is a --quick run: the README is left as it is", file=sys.stderr)
        return 1
    text = replace(args.readme.read_text(), render(results))
    text = replace(text, headline(results), HEADLINE_START, HEADLINE_END)
    capacity = {k: json.loads(p.read_text()) for k, p in CAPACITY_JSON.items() if p.exists()}
    if capacity:
        text = replace(text, render_capacity(capacity), CAPACITY_START, CAPACITY_END)
    args.readme.write_text(text)
    print(f"rewrote the benchmark summary in {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The whole benchmark suite in one command; merges the parts into one report and a plot.

Usage: ``python benchmarks/run_all.py [--quick] [--out PATH]``
(install the baselines first: ``pip install '.[bench-full]'``; any that is missing is
skipped with the reason printed).

Runs, each in its own process (so one's threads, allocator state and GIL history never touch
the next): ``bench_latency.py`` (caller latency in 9 conditions against the floor, the
inline tee and janus, and MLflow, tensorboardX, OTel's batch log processor and statsd
against the tee: two tables from one run, the ``caller`` and ``baselines`` parts),
``bench_overhead.py`` (step time of a simulated training loop with and without the tee),
``bench_integrations.py`` (a real trainer's step time with its integration on and off, and the
time in the integration's hooks: TRL's GRPOTrainer, a transformers Trainer, Lightning, verl's
``Tracking.log``; skipped, saying why, without the trainers' packages of ``.ci/trainers.txt``),
``bench_export.py`` (the exporting thread's and the worker's CPU per step-aligned export,
against periodic export, and the process CPU per step against the OTel SDK alone),
``bench_memory.py`` (RSS through 10^6 calls against a stalled receiver), ``bench_sizes.py``
(caller latency and queue memory of the tee's key filter, shipped at every size, against a
whole copy, for dicts of 68, 2,000 and 100,000 keys), ``bench_ranks.py`` (series, points and
bytes per export of a teeing and an idle rank, with and without gzip, and what 1,000 ranks
send) and ``bench_stolen.py`` (the gaps the telemetry threads make in a pure-Python training
thread through the GIL, off against on, at 1, 10 and 100 teed steps a second, with a healthy
and a stalled receiver), ``bench_scale.py`` (the same gaps and the threads' CPU with 30 to
3,000 series and 10 or 500 efficiency categories), ``bench_gc.py`` (the garbage collections
an export's request costs at 1,000 series, built from async_tee's tables and the OTel SDK's
way), ``bench_alerts.py`` (seconds from an event to its alert firing in a real Prometheus)
and ``bench_handover.py`` (how long the threads' GIL hand-over sleep must be for a busy
training thread to take the GIL). Their JSON goes to a temp dir, deleted afterwards; this
script merges every part into ``--out`` (``results/latest.json``: machine info, versions,
every figure), writes ``latest.md`` (every table, with ratios against the floor and the
inline tee beside absolute times, and the issue's targets with whether each holds) and
``latency.png`` (``plot.py``). A full run into ``results/latest.json`` then regenerates the
README's summary table (``summary.py``).

Full: about 25 minutes on a 2-core VM. ``--quick``: a smoke run of each part (about a
minute), written to a temp dir unless ``--out`` is given; no figure to rely on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_alerts
import bench_export
import bench_gc
import bench_handover
import bench_integrations
import bench_latency
import bench_memory
import bench_overhead
import bench_ranks
import bench_scale
import bench_sizes
import bench_stolen
import summary
from _common import HERE, RESULTS, fmt_opt, machine_info, machine_line, md_table, progress

Section = tuple[str, Callable[[dict[str, Any]], list[str]]]

# The parts of the merged report, in page order, each with its title and section writer.
SECTIONS: dict[str, Section] = {
    **bench_latency.SECTIONS,  # "caller" and "baselines"
    "overhead": ("Training-loop overhead (bench_overhead.py)", bench_overhead.section),
    "integrations": (
        "The trainers' integrations: step time on and off (bench_integrations.py)",
        bench_integrations.section,
    ),
    "export": ("Step-aligned export CPU (bench_export.py)", bench_export.section),
    "memory": ("Bounded memory under overload (bench_memory.py)", bench_memory.section),
    "sizes": ("Large dicts: key filter against whole copy (bench_sizes.py)", bench_sizes.section),
    "ranks": ("Per-rank export cost, and 1,000 ranks (bench_ranks.py)", bench_ranks.section),
    "stolen": ("Stolen time: the GIL (bench_stolen.py)", bench_stolen.section),
    "scale": ("Scale: series and categories (bench_scale.py)", bench_scale.section),
    "gc": ("Garbage collections per export, tables and the SDK (bench_gc.py)", bench_gc.section),
    "handover": ("GIL hand-over sleep (bench_handover.py)", bench_handover.section),
    "alerts": ("Alerts: from the event to firing (bench_alerts.py)", bench_alerts.section),
}
PARTS = tuple(SECTIONS)
# The scripts, and the parts each one's report holds: bench_latency.py measures both
# latency tables in one run and reports each under its part's key; the others' whole
# report is their part.
SCRIPTS: dict[str, tuple[str, ...]] = {
    "latency": tuple(bench_latency.SECTIONS),
    "overhead": ("overhead",),
    "integrations": ("integrations",),
    "export": ("export",),
    "memory": ("memory",),
    "sizes": ("sizes",),
    "ranks": ("ranks",),
    "stolen": ("stolen",),
    "scale": ("scale",),
    "gc": ("gc",),
    "handover": ("handover",),
    "alerts": ("alerts",),
}
COMMAND = "pip install '.[bench-full]' && python benchmarks/run_all.py"


def run_script(name: str, out_dir: Path, quick: bool) -> dict[str, dict[str, Any]]:
    """Run ``bench_<name>.py`` in a child process; returns its parts (or the failure)."""
    out = out_dir / f"{name}.json"
    command = [sys.executable, str(HERE / f"bench_{name}.py"), "--out", str(out)]
    command += ["--quick"] if quick else []
    progress(f"\n== {' '.join(command[1:])}")
    started = time.perf_counter()
    done = subprocess.run(command, check=False)
    seconds = time.perf_counter() - started
    parts = SCRIPTS[name]
    if done.returncode != 0 or not out.exists():
        failure = {"failed": f"exit status {done.returncode}", "wall_s": seconds}
        return {part: failure for part in parts}
    report = json.loads(out.read_text())
    report.pop("machine", None)  # the merged report carries one
    if parts == (name,):
        return {name: {**report, "wall_s": seconds}}
    return {part: {**report[part], "wall_s": seconds} for part in parts}


# ------------------------------------------------------------------ targets


def _by_target(
    checks: list[dict[str, Any]], figure: Callable[[dict[str, Any]], str], sep: str = "; "
) -> list[tuple[str, str, str]]:
    """Checks grouped by target: (target, where it holds, where it misses)."""
    by_target: dict[str, dict[str, list[str]]] = {}
    for check in checks:
        verdicts = by_target.setdefault(check["target"], {"holds": [], "missed": []})
        verdicts["holds" if check["holds"] else "missed"].append(figure(check))
    return [
        (target, sep.join(v["holds"]) or "-", sep.join(v["missed"]) or "-")
        for target, v in by_target.items()
    ]


def caller_targets(caller: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The caller targets, each with the conditions where it holds and where it misses."""
    return _by_target(
        caller.get("targets", []), lambda c: f"{c['condition']} {c['value']:.3g}", sep=", "
    )


def _opt(value: float | None, spec: str) -> str:
    """A figure, or ``n/a`` where the part could not measure it."""
    return fmt_opt(value, spec, missing="n/a")


def overhead_targets(overhead: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The worker's CPU per GRPO step (reported, no limit) and the step-time overhead."""
    rows = []
    for cell in overhead.get("cells", []):
        if cell["variant"] == "bare":
            continue
        rows.append(
            (
                f"worker CPU per step, {cell['step_ms']} ms steps, {cell['variant']}",
                f"{_opt(cell['worker_cpu_per_step_us'], '.0f')} µs/step "
                f"({_opt(cell['threads_cpu_pct_of_step'], '.3f')} % of the step with the "
                f"exporter); step time {_opt(cell['overhead_pct_mean'], '+.1f')} % (mean)",
                "reported",
            )
        )
    return rows


def integrations_targets(integrations: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Each trainer's step time on over off, and its hooks' time per step (reported)."""
    rows = []
    for trainer in integrations.get("trainers", {}).values():
        if "skipped" in trainer:
            continue
        hooks, tee = trainer["hook_us_per_step"] or {}, trainer["tee_us_per_step"] or {}
        rows.append(
            (
                f"step time with the integration, {trainer['label']} (toy steps)",
                f"on/off sum x{_opt(trainer['ratio']['sum'], '.3f')}, p50 "
                f"x{_opt(trainer['ratio']['p50'], '.3f')}; hooks {_opt(hooks.get('p50'), '.1f')} "
                f"µs/step p50, {_opt(hooks.get('p99'), '.1f')} p99 (the tee "
                f"{_opt(tee.get('p50'), '.1f')} µs p50)",
                "reported",
            )
        )
    return rows


def export_targets(export: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Whether every step got its own export, the process CPU per step against the SDK
    alone (issue 42: <= 0.5x, over the same protocol), the CPU per export (reported)."""
    cells = export.get("cells", [])
    rows = []
    for cell in cells:
        if cell["mode"] not in bench_export.STEP_MODES:
            continue
        steps = cell["after_shutdown"]["steps"]
        figures = (
            f"{cell['step_s']:g} s steps, {cell['mode']}: {steps['exported']}/"
            f"{steps['completed']} exported, {steps['coalesced']} coalesced"
        )
        holds = not cell["warnings"]
        rows.append(
            ("every step exported on its own", figures if holds else "-", "-" if holds else figures)
        )
    same_protocol = {"http": bench_export.SDK_ALONE_HTTP, "step": bench_export.SDK_ALONE}
    for against in export.get("against_sdk", []):
        if same_protocol.get(against["mode"]) != against["against"]:
            continue
        figures = (
            f"{against['step_s']:g} s steps, {against['mode']}: x{_opt(against['total'], '.2f')} "
            f"(per-step p50 x{_opt(against['p50'], '.2f')}, p99 x{_opt(against['p99'], '.2f')})"
        )
        holds = against["total"] is not None and against["total"] <= 0.5
        rows.append(
            (
                "process CPU per step <= 0.5x the OTel SDK alone's, same protocol",
                figures if holds else "-",
                "-" if holds else figures,
            )
        )
    for ratio in export.get("ratios", []):
        by_mode = {c["mode"]: c for c in cells if c["step_s"] == ratio["step_s"]}
        p50s = {
            mode: (cell.get("exporter_cpu_per_export_us") or {}).get("p50")
            for mode, cell in by_mode.items()
        }
        rows.append(
            (
                f"exporting thread CPU per export, {ratio['step_s']:g} s steps",
                f"p50 {_opt(p50s.get('step'), '.0f')} µs step-aligned, "
                f"{_opt(p50s.get('periodic'), '.0f')} µs periodic "
                f"(x{_opt(ratio['exporter_cpu_per_export_p50'], '.2f')}); all threads per "
                f"step x{_opt(ratio['threads_cpu_per_step_total'], '.2f')}",
                "reported",
            )
        )
    return rows


def memory_targets(memory: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Whether RSS growth stayed within the queue bound in each phase."""
    rows = []
    for p in memory.get("memory", {}).get("phases", []):
        figures = f"{p['phase']}: +{p['growth_mib']:.2f} MiB (bound {p['bound_mib']:.2f})"
        holds = p["within_bound"] and p["no_growth_once_full"]
        rows.append(
            (
                "RSS growth within the queue bound",
                figures if holds else "-",
                "-" if holds else figures,
            )
        )
    return rows


def sizes_targets(sizes: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The key filter (shipped at every size) against a whole copy, per size (reported)."""
    latency = sizes.get("latency")
    if not latency:
        return []
    memory = sizes.get("memory", {}).get("sizes", {})
    rows = []
    for size, entry in latency.get("sizes", {}).items():
        x = entry["whole_over_filtered"]
        figures = f"whole/filtered p50 x{x['p50']:.2f}, p99 x{x['p99']:.2f}"
        if size in memory:
            figures += (
                f"; full queue {memory[size]['filtered']['traced_queue_mib']:.2f} MiB filtered "
                f"against {memory[size]['whole']['traced_queue_mib']:.2f} MiB whole"
            )
        rows.append((f"key filter against whole copy, {int(size):,} keys", figures, "reported"))
    return rows


def stolen_targets(stolen: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Issues 12's and 22's targets (time lost, attributable gaps, thread CPU) per cell."""
    return _by_target(stolen.get("targets", []), lambda c: f"{c['condition']}: {c['text']}")


def scale_targets(scale: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Issue 22's scale targets, per cell and variant."""
    return _by_target(scale.get("targets", []), lambda c: f"{c['condition']}: {c['value']:.3g}")


def targets(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Every target of the issue as (target, where it holds, where it misses)."""
    return (
        caller_targets(report.get("caller", {}))
        + overhead_targets(report.get("overhead", {}))
        + integrations_targets(report.get("integrations", {}))
        + export_targets(report.get("export", {}))
        + memory_targets(report.get("memory", {}))
        + sizes_targets(report.get("sizes", {}))
        + stolen_targets(report.get("stolen", {}))
        + scale_targets(report.get("scale", {}))
    )


# ------------------------------------------------------------------ markdown


def markdown(report: dict[str, Any], png: Path | None) -> str:
    """Every part's tables, the targets and the plot, as one markdown page."""
    lines = [
        "# async_tee benchmarks",
        "",
        machine_line(report["machine"]),
        "",
        f"Reproduce: `{COMMAND}` ({report['duration_s'] / 60:.1f} min for this run"
        f"{', --quick: a smoke run, no figure to rely on' if report['config']['quick'] else ''}"
        "). Absolute times drift by up to ±40 % between runs on this machine; ratios "
        "within one run, and medians of interleaved blocks, are what count.",
    ]
    for name in PARTS:
        title, section = SECTIONS[name]
        part = report.get(name, {})
        lines += ["", f"## {title}", ""]
        lines += [f"Failed: {part['failed']}."] if "failed" in part else section(part)
    lines += ["", "## Targets (printed, not asserted)", ""]
    lines += md_table(("target", "holds (value)", "missed (value)"), targets(report))
    if png is not None:
        lines += ["", "## Caller-latency distributions", "", f"![caller latency]({png.name})"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of every part")
    parser.add_argument("--out", type=Path, default=None, help="merged JSON output path")
    args = parser.parse_args(argv)
    if args.out is None:
        quick_dir = Path(tempfile.mkdtemp(prefix="async-tee-bench-"))
        args.out = (quick_dir if args.quick else RESULTS) / "latest.json"
    return args


def write_plot(report: dict[str, Any], out: Path) -> Path | None:
    """The latency PNG beside ``out``, or None (with the reason) without matplotlib."""
    try:
        import plot
    except ImportError as error:  # pragma: no cover - only without matplotlib
        progress(f"no plot: {error}")
        return None
    try:
        return plot.plot(report, out.with_name("latency.png"))
    except ImportError as error:
        progress(f"no plot: {error} (pip install '.[bench-full]')")
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    report: dict[str, Any] = {
        "machine": machine_info(),
        "config": {"quick": args.quick, "command": COMMAND},
    }
    with tempfile.TemporaryDirectory(prefix="async-tee-bench-parts-") as parts_dir:
        for name in SCRIPTS:
            report.update(run_script(name, Path(parts_dir), args.quick))
    report["duration_s"] = time.perf_counter() - started
    report["targets"] = [{"target": t, "holds": h, "missed": m} for t, h, m in targets(report)]
    png = write_plot(report, args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report, png))
    failed = [name for name in PARTS if "failed" in report[name]]
    # The README's summary table is generated from results/latest.json: rewritten only by a
    # full run that wrote that very file (never by --quick, nor by a run sent elsewhere).
    if not args.quick and args.out.resolve() == summary.RESULTS_JSON.resolve():
        summary.main(["--results", str(args.out)])
    print(f"\nwrote {args.out}, {args.out.with_suffix('.md')}" + (f" and {png}" if png else ""))
    print(f"run_all took {report['duration_s']:.0f} s" + (f"; FAILED: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

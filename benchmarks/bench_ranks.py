"""Per-rank cost of exporting: series, points and bytes per export, teeing and idle rank.

Usage: ``python benchmarks/bench_ranks.py [--quick] [--out PATH]``

What one rank of a large job sends, for the README's 1,000-rank arithmetic. An ``OtlpSink``
in this process receives OTLP/HTTP; each configuration runs in a child process (this script
with ``--child``) whose ``os.environ`` is set as torchrun sets it (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE=1000``, ``LOCAL_WORLD_SIZE=8``, ``GROUP_RANK``,
``TORCHELASTIC_RUN_ID``) plus ``OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf``,
``OTEL_EXPORTER_OTLP_ENDPOINT`` = the sink, ``OTEL_METRIC_EXPORT_INTERVAL`` = 1 h (no
periodic export gets in), ``ASYNC_TEE_MIN_EXPORT_INTERVAL=0`` and, for the gzip cells,
``OTEL_EXPORTER_OTLP_COMPRESSION=gzip`` (async_tee reads it into its settings and hands it
to the exporter; the ``Content-Encoding`` the sink records shows whether it reached the
wire, and a cell where it did not is a WARNING).

- ``teeing`` (rank 0): ``start_telemetry()``, the fixture's setup call
  (``tests/fixtures/grpo_step.json``) at step 0, then per step the fixture's calls through
  ``async_tee.Logger()`` (``step_finished`` on ``timing/train``), ``async_tee.flush()`` and
  a wait until that step's own export was sent (step-aligned export, the default), then
  ``shutdown_telemetry`` (one more export).
- ``idle`` (rank 1): ``start_telemetry()``, no tee call; ``Pipeline.flush_and_export``
  a few times (what its interval timer would send: it has no steps), then
  ``shutdown_telemetry``.

Per export (one HTTP request), from the sink: distinct series (metric name + attribute
set; ``rl.*`` and ``async_tee.*`` apart), data points, and the body's bytes as received
(compressed when gzip; HTTP headers and TCP/IP framing not counted), each as p50
(nearest rank) and max over the cell's exports. The points of one export are those with
the same resource and collection time; their groups must match the requests one to one.

The arithmetic for 1,000 ranks assumes one export per exporting rank per second (step
export sends one per completed step; an idle rank sends one per
``OTEL_METRIC_EXPORT_INTERVAL``, 60 s by default, so its figures here are an upper bound):
series = teeing ranks x teeing series + idle ranks x idle series (max per export), and
bytes/s likewise from the p50 (and max) bytes per export; and once more with the idle
ranks at one export per 60 s. "rank 0 only" and "local rank 0" are what
``ASYNC_TEE_EXPORT_RANKS=0`` and ``local0`` leave exporting.

Full: 10 steps, 5 idle exports per cell (about 5 s). ``--quick``: 2 steps, 1 idle export
(about 3 s).
Output: a table on stdout, JSON at ``--out`` (a temp dir by default) and markdown beside it;
``run_all.py`` keeps it as the ``ranks`` part.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import (
    bench_parser,
    fmt_opt,
    machine_info,
    md_table,
    parse_bench_args,
    progress,
    publish,
    quiet_logging,
    text_table,
)
from bench_export import fixture_calls, log_step

import async_tee
from async_tee.sink import OtlpSink, ReceivedPoint

ROLES = {"teeing": 0, "idle": 1}  # role -> RANK
WORLD = 1000
PER_NODE = 8
RUN_ID = "grpo-bench-ranks"
FULL = {"steps": 10, "idle_exports": 5}
QUICK = {"steps": 2, "idle_exports": 1}
CHILD_TIMEOUT_S = 120
WAIT_S = 10.0
IDLE_INTERVAL_S = 60  # OTEL_METRIC_EXPORT_INTERVAL's default: how often an idle rank exports
LAUNCHER_PREFIXES = ("OTEL_", "ASYNC_TEE_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_")
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")

# ------------------------------------------------------------------ the child: one rank


def _step_exports() -> int:
    return sum(async_tee.stats()["exports_by_trigger"]["step"].values())


def _wait_step_exports(count: int) -> None:
    """Until ``count`` step exports were sent (the step completes 0.1 s after its last dict)."""
    deadline = time.monotonic() + WAIT_S
    while _step_exports() < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"step export {count} not sent within {WAIT_S} s")
        time.sleep(0.002)


def run_child(role: str, steps: int, idle_exports: int) -> int:
    """One rank, configured by ``os.environ``; prints its stats as one JSON line."""
    handle = async_tee.start_telemetry()
    if not handle.is_exporting:
        raise SystemExit("start_telemetry did not start exporting")
    if role == "teeing":
        setup, calls = fixture_calls()
        logger = async_tee.Logger()
        log_step(logger, [setup], 0)
        for step in range(1, steps + 1):
            log_step(logger, calls, step)
            async_tee.flush()
            _wait_step_exports(step + 1)  # steps 0 (the setup call) to this one, each its own
    else:
        for _ in range(idle_exports):
            handle.flush_and_export(5.0)
    shutdown_ok = async_tee.shutdown_telemetry(10)
    stats = async_tee.stats()
    print(
        json.dumps(
            {
                "shutdown_ok": shutdown_ok,
                "exports_by_trigger": stats["exports_by_trigger"],
                "steps": stats["steps"],
                "dropped": stats["dropped"],
            }
        )
    )
    return 0


# ------------------------------------------------------------------ the parent: cells


def child_environ(role: str, gzip: bool, endpoint: str) -> dict[str, str]:
    """This environment without OTel/launcher settings, plus a launcher's for ``role``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(LAUNCHER_PREFIXES) and k not in LAUNCHER_VARS
    }
    rank = ROLES[role]
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank % PER_NODE),
        WORLD_SIZE=str(WORLD),
        LOCAL_WORLD_SIZE=str(PER_NODE),
        GROUP_RANK=str(rank // PER_NODE),
        TORCHELASTIC_RUN_ID=RUN_ID,
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_METRIC_EXPORT_INTERVAL="3600000",
        ASYNC_TEE_MIN_EXPORT_INTERVAL="0",
    )
    if gzip:
        env["OTEL_EXPORTER_OTLP_COMPRESSION"] = "gzip"
    return env


def nearest_rank(values: Sequence[int], q: float) -> int | None:
    """The nearest-rank ``q`` quantile of ``values``, or None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def spread(values: Sequence[int]) -> dict[str, int | None]:
    """p50 and max of per-export figures."""
    return {"p50": nearest_rank(values, 0.5), "max": max(values, default=None)}


def exports_of(points: list[ReceivedPoint]) -> list[list[ReceivedPoint]]:
    """The points grouped by export (same resource, same collection time), in arrival order."""
    groups: dict[tuple[str, int], list[ReceivedPoint]] = {}
    for point in points:
        key = (json.dumps(point.as_dict()["resource"], sort_keys=True), point.time_unix_nano)
        groups.setdefault(key, []).append(point)
    return list(groups.values())


def _series(points: list[ReceivedPoint], prefix: str = "") -> int:
    return len(
        {
            (p.name, json.dumps(p.as_dict()["attributes"], sort_keys=True))
            for p in points
            if p.name.startswith(prefix)
        }
    )


def run_cell(sink: OtlpSink, role: str, gzip: bool, plan: dict[str, int]) -> dict[str, Any]:
    """One rank in a child process; what the sink received from it."""
    sink.clear()
    command = [sys.executable, str(Path(__file__).resolve()), "--child", role]
    command += ["--steps", str(plan["steps"]), "--idle-exports", str(plan["idle_exports"])]
    done = subprocess.run(
        command,
        env=child_environ(role, gzip, sink.http_endpoint),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{role} child failed ({done.returncode}):\n{done.stderr}")
    child = json.loads(done.stdout.strip().splitlines()[-1])
    sizes = sink.request_sizes()
    points = sink.points()
    exports = exports_of(points)
    warnings = []
    if len(exports) != len(sizes):
        warnings.append(f"{len(exports)} groups of points for {len(sizes)} requests")
    encodings = sorted({encoding for _, _, encoding in sizes})
    if encodings != ["gzip" if gzip else "identity"]:
        warnings.append(f"gzip={gzip}: Content-Encoding on the wire {encodings}")
    if not child["shutdown_ok"] or sink.dropped_points:
        warnings.append(f"shutdown ok={child['shutdown_ok']}, dropped {sink.dropped_points}")
    if child["steps"]["coalesced"]:
        warnings.append(f"{child['steps']['coalesced']} steps coalesced")
    return {
        "role": role,
        "rank": ROLES[role],
        "gzip": gzip,
        "exports": len(sizes),
        "encodings": encodings,
        "series": spread([_series(e) for e in exports]),
        "rl_series": spread([_series(e, "rl.") for e in exports]),
        "self_series": spread([_series(e, "async_tee.") for e in exports]),
        "points": spread([len(e) for e in exports]),
        "bytes": spread([size for _, size, _ in sizes]),
        "per_export": {
            "bytes": [size for _, size, _ in sizes],
            "series": [_series(e) for e in exports],
            "points": [len(e) for e in exports],
        },
        "resource": points[0].resource if points else None,
        "child": child,
        "warnings": warnings,
    }


# ------------------------------------------------------------------ 1,000 ranks


SCENARIOS = (
    # (name, exporting ranks, of which teeing)
    ("all 1,000 ranks export, rank 0 tees", WORLD, 1),
    ("rank 0 only", 1, 1),
    (f"local rank 0 of {WORLD // PER_NODE} nodes of {PER_NODE}, rank 0 tees", WORLD // PER_NODE, 1),
    ("all 1,000 ranks export and tee (upper bound)", WORLD, WORLD),
)


def arithmetic(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Series and bytes/s of each scenario at one export per exporting rank per second."""
    cell = {(c["role"], c["gzip"]): c for c in cells}

    def total(ranks: tuple[int, int], figure: str, stat: str, gzip: bool, idle_rate=1.0) -> int:
        teeing, idle = ranks
        per_idle = idle_rate * cell[("idle", gzip)][figure][stat]
        return round(teeing * cell[("teeing", gzip)][figure][stat] + idle * per_idle)

    rows = []
    for name, exporting, teeing in SCENARIOS:
        ranks = (teeing, exporting - teeing)
        rows.append(
            {
                "scenario": name,
                "exporting_ranks": exporting,
                "teeing_ranks": teeing,
                "series": total(ranks, "series", "max", False),
                "bytes_per_s": {
                    "identity": {s: total(ranks, "bytes", s, False) for s in ("p50", "max")},
                    "gzip": {s: total(ranks, "bytes", s, True) for s in ("p50", "max")},
                },
                "bytes_per_s_idle_at_default_interval": {
                    "identity": total(ranks, "bytes", "p50", False, 1 / IDLE_INTERVAL_S),
                    "gzip": total(ranks, "bytes", "p50", True, 1 / IDLE_INTERVAL_S),
                },
            }
        )
    return rows


# ------------------------------------------------------------------ tables

HEADER = (
    "rank",
    "gzip",
    "exports",
    "series p50",
    "max",
    "(rl/self max)",
    "points p50",
    "max",
    "bytes p50",
    "max",
    "on the wire",
)
ARITHMETIC_HEADER = (
    "1,000 ranks, 1 export/s each",
    "exporting",
    "series",
    "kB/s p50",
    "max",
    "gzip kB/s p50",
    "max",
    f"idle at {IDLE_INTERVAL_S} s: kB/s p50",
    "gzip",
)


def table_rows(cells: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [
        (
            f"{c['role']} (rank {c['rank']})",
            "gzip" if c["gzip"] else "none",
            str(c["exports"]),
            fmt_opt(c["series"]["p50"]),
            fmt_opt(c["series"]["max"]),
            f"{fmt_opt(c['rl_series']['max'])}/{fmt_opt(c['self_series']['max'])}",
            fmt_opt(c["points"]["p50"]),
            fmt_opt(c["points"]["max"]),
            fmt_opt(c["bytes"]["p50"]),
            fmt_opt(c["bytes"]["max"]),
            ",".join(c["encodings"]),
        )
        for c in cells
    ]


def arithmetic_rows(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    def kb(value: int) -> str:
        return f"{value / 1000:,.1f}"

    return [
        (
            r["scenario"],
            f"{r['exporting_ranks']:,}",
            f"{r['series']:,}",
            kb(r["bytes_per_s"]["identity"]["p50"]),
            kb(r["bytes_per_s"]["identity"]["max"]),
            kb(r["bytes_per_s"]["gzip"]["p50"]),
            kb(r["bytes_per_s"]["gzip"]["max"]),
            kb(r["bytes_per_s_idle_at_default_interval"]["identity"]),
            kb(r["bytes_per_s_idle_at_default_interval"]["gzip"]),
        )
        for r in rows
    ]


def gzip_line(report: dict[str, Any]) -> str:
    gzip_cells = [c for c in report["cells"] if c["gzip"]]
    reached = all(c["encodings"] == ["gzip"] for c in gzip_cells)
    return (
        "OTEL_EXPORTER_OTLP_COMPRESSION=gzip reached the wire (Content-Encoding: gzip on every "
        "request)."
        if reached
        else "OTEL_EXPORTER_OTLP_COMPRESSION=gzip did NOT reach the wire: "
        + "; ".join(f"{c['role']}: {c['encodings']}" for c in gzip_cells)
    )


def section(report: dict[str, Any]) -> list[str]:
    """The tables as markdown lines (no title)."""
    cfg = report["config"]
    lines = [
        "One rank per child process, torchrun's variables set (`WORLD_SIZE=1000`), exporting "
        "OTLP/HTTP to an `OtlpSink`; `teeing`: rank 0, the fixture's calls for "
        f"{cfg['steps']} steps with step-aligned export (plus the setup step and the "
        f"shutdown export); `idle`: rank 1, no tee call, {cfg['idle_exports']} "
        "`flush_and_export` and the shutdown export. Per export (one request): distinct "
        "series (name + attribute set), points, and body bytes as received (compressed with "
        "gzip; headers not counted); p50 is nearest rank over the cell's exports.",
        "",
        *md_table(HEADER, table_rows(report["cells"])),
        "",
        "1,000 ranks at one export per exporting rank per second (idle ranks export once per "
        f"`OTEL_METRIC_EXPORT_INTERVAL`, {IDLE_INTERVAL_S} s by default: their share is an "
        "upper bound, and the last two columns put them at that default); series from the max "
        "per export, bytes from the p50 and max per export:",
        "",
        *md_table(ARITHMETIC_HEADER, arithmetic_rows(report["arithmetic"])),
        "",
        gzip_line(report),
    ]
    warnings = [f"WARNING: {c['role']}: {w}" for c in report["cells"] for w in c["warnings"]]
    return lines + (["", *warnings] if warnings else [])


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(__doc__)
    parser.add_argument("--child", choices=tuple(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=FULL["steps"], help=argparse.SUPPRESS)
    parser.add_argument(
        "--idle-exports", type=int, default=FULL["idle_exports"], help=argparse.SUPPRESS
    )
    return parse_bench_args(parser, "ranks", argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_logging()
    if args.child:
        return run_child(args.child, args.steps, args.idle_exports)
    started = time.perf_counter()
    plan = QUICK if args.quick else FULL
    cells = []
    with OtlpSink() as sink:
        for role in ROLES:
            for gzip in (False, True):
                progress(f"{role} rank, gzip={gzip}: {plan}")
                cells.append(run_cell(sink, role, gzip, plan))
    report: dict[str, Any] = {
        "machine": machine_info(),
        "config": {
            "quick": args.quick,
            **plan,
            "world_size": WORLD,
            "ranks_per_node": PER_NODE,
            "environ": {
                k: v
                for k, v in child_environ("teeing", True, "<sink>").items()
                if k.startswith(("OTEL_", "ASYNC_TEE_", "TORCHELASTIC_")) or k in LAUNCHER_VARS
            },
        },
        "method": (
            "children configured by os.environ export OTLP/HTTP to an in-process OtlpSink; "
            "request_sizes() gives each body's bytes as received and its Content-Encoding; "
            "points grouped per export by (resource, time_unix_nano)"
        ),
        "cells": cells,
    }
    report["arithmetic"] = arithmetic(cells)
    report["duration_s"] = time.perf_counter() - started
    console = [
        "Per-rank export cost (per export: series, points, body bytes on the wire)",
        *text_table(HEADER, table_rows(cells)),
        "",
        "1,000 ranks at one export per exporting rank per second",
        *text_table(ARITHMETIC_HEADER, arithmetic_rows(report["arithmetic"])),
        "",
        gzip_line(report),
        *(f"WARNING: {c['role']}: {w}" for c in cells for w in c["warnings"]),
    ]
    publish(args.out, report, "Per-rank export cost", section(report), console)
    return 0


if __name__ == "__main__":
    sys.exit(main())

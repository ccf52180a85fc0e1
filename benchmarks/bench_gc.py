"""Garbage collections an export's request costs: async_tee's tables against the OTel SDK's.

Usage: ``python benchmarks/bench_gc.py [--exports N] [--series N] [--quick] [--out PATH]``

One session on an SDK ``MeterProvider`` records ``--series`` teed gauges (1,000 by default)
and a step of the fixture's calls per export; each export's OTLP request (its bytes) is then
built twice, interleaved: by async_tee's ``TableEncoder`` from its tables (the kept request,
updated in place: what async_tee's exporting stage sends) and the OTel SDK's way, as the
SDK's own OTLP exporters do on a provider's reader (the reader's collection, the SDK's
``encode_metrics``, then ``SerializeToString``), of the same series. Around
each build the collector's young-generation threshold is 100 (Python's default is 700, so a
build that keeps a few objects per series until its end runs it many times) and a
``gc.callbacks`` hook counts the collections of every generation that start inside it. Per
way: collections per build as p50 / p99 / p99.9 / max (from the exact counts), the build's
wall time the same way (a 1 µs histogram), and the ratio tables / SDK of each p50, all in
one run.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections import Counter
from typing import Any

from _common import (
    bench_parser,
    fixture_calls,
    machine_info,
    md_table,
    parse_bench_args,
    percentiles,
    progress,
    publish,
)

import async_tee
from async_tee import testing

WAYS = ("tables", "sdk")
YOUNG_THRESHOLD = 100


def _counts_pcts(counts: list[int]) -> dict[str, float]:
    """Nearest-rank percentiles of exact counts (``percentiles`` reads ns and gives µs)."""
    return percentiles(Counter(c * 1000 for c in counts))


def run(series: int, exports: int) -> dict[str, Any]:
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource

    from async_tee._declare.groups import RL_METRIC_GROUP
    from async_tee._declare.series import SELF_METRIC_GROUP
    from async_tee._export.encode import TableEncoder

    testing.reset()
    async_tee.register_teed_metrics(
        async_tee.TeedMetric(f"scale/k{i}", f"rl.scale.k{i}", prefix="train") for i in range(series)
    )
    reader = InMemoryMetricReader()
    resource = Resource.create({"rl.run.id": "bench-gc"})
    provider = MeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False)
    session = async_tee.start_telemetry(provider)
    assert isinstance(session, async_tee.Pipeline)
    encoder = TableEncoder(
        session.instruments, (SELF_METRIC_GROUP, RL_METRIC_GROUP), resource, "async_tee", "bench"
    )
    calls = [(prefix, metrics) for prefix, metrics in fixture_calls() if prefix in ("train", "")]

    def sdk_request() -> bytes:
        data = reader.get_metrics_data()
        assert data is not None
        return encode_metrics(data).SerializeToString()

    builds: dict[str, Any] = {"tables": encoder.request, "sdk": sdk_request}
    collections: dict[str, list[int]] = {way: [] for way in WAYS}
    wall_ns: dict[str, Counter[int]] = {way: Counter() for way in WAYS}
    started: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    threshold = gc.get_threshold()
    try:
        for step in range(1, exports + 2):
            train = {f"scale/k{i}": float(step + i) for i in range(series)}
            async_tee.tee_rl_metrics_to_otel(train, "train", step)
            for prefix, metrics in calls:
                async_tee.tee_rl_metrics_to_otel(metrics, prefix, step)
            async_tee.tee_rl_metrics_to_otel({}, "timing/train", step, step_finished=True)
            assert async_tee.flush(10)
            for way in WAYS if step % 2 else WAYS[::-1]:
                session.exports.counts.collections += 1  # a new collection, as a reader starts
                gc.collect()
                gc.set_threshold(YOUNG_THRESHOLD, *threshold[1:])
                started.clear()
                gc.callbacks.append(count)
                t0 = time.perf_counter_ns()
                builds[way]()
                wall = time.perf_counter_ns() - t0
                gc.callbacks.remove(count)
                gc.set_threshold(*threshold)
                if step > 1:  # the first build of each way makes what later ones keep
                    collections[way].append(len(started))
                    wall_ns[way][wall // 1000 * 1000] += 1
    finally:
        gc.set_threshold(*threshold)
        async_tee.shutdown_telemetry(5)
        provider.shutdown()
    cells = {
        way: {"collections": _counts_pcts(collections[way]), "build_us": percentiles(wall_ns[way])}
        for way in WAYS
    }
    return {
        "series": series,
        "exports": exports,
        "young_threshold": YOUNG_THRESHOLD,
        "cells": cells,
        "ratio_collections_p50": _ratio(cells, "collections"),
        "ratio_build_p50": _ratio(cells, "build_us"),
    }


def _ratio(cells: dict[str, Any], figure: str) -> float | None:
    sdk = cells["sdk"][figure]["p50"]
    return None if not sdk else cells["tables"][figure]["p50"] / sdk


HEADER = (
    "way",
    "collections p50",
    "p99",
    "p99.9",
    "max",
    "build µs p50",
    "p99",
    "p99.9",
    "max",
)


def rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    out = []
    for way in WAYS:
        cell = report["cells"][way]
        c, b = cell["collections"], cell["build_us"]
        out.append(
            (
                way,
                *(f"{c[p]:.0f}" for p in ("p50", "p99", "p99.9", "max")),
                *(f"{b[p]:.0f}" for p in ("p50", "p99", "p99.9", "max")),
            )
        )
    return out


def section(report: dict[str, Any]) -> list[str]:
    """The markdown section ``run_all.py`` merges."""
    ratio_c, ratio_b = report["ratio_collections_p50"], report["ratio_build_p50"]
    return [
        f"{report['series']} teed series plus the fixture's step, {report['exports']} exports; "
        "each export's request (its bytes) built from async_tee's tables and the OTel SDK's "
        "way (its reader's collection, `encode_metrics`, serialized), interleaved, with the "
        f"young-generation threshold at {report['young_threshold']}. Collections: every "
        "generation's that started during the build. Tables / SDK at p50: collections "
        f"{'n/a' if ratio_c is None else f'{ratio_c:.2f}'}, build time "
        f"{'n/a' if ratio_b is None else f'{ratio_b:.2f}'}.",
        "",
        *md_table(HEADER, rows(report)),
    ]


def console(report: dict[str, Any]) -> list[str]:
    return section(report)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--exports", type=int, default=None, help="exports measured per way")
    parser.add_argument("--series", type=int, default=1000, help="teed series")
    return parse_bench_args(parser, "gc", argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    exports = args.exports or (10 if args.quick else 200)
    progress(f"bench_gc: {args.series} series, {exports} exports per way")
    report = {"machine": machine_info(), **run(args.series, exports)}
    report["duration_s"] = time.monotonic() - started
    publish(args.out, report, "Garbage collections per export", section(report), console(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

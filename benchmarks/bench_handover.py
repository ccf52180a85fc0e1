"""GIL hand-over: how long async_tee's threads must sleep between slices for training to run.

Usage: ``python benchmarks/bench_handover.py [--bursts N] [--rounds N] [--quick] [--out PATH]``
(``run_all.py`` runs it as the ``handover`` part of ``results/latest.json``).

async_tee's worker and exporting thread cut their Python work into slices
(``async_tee._gil``: ``SLICE_S``) and sleep ``HANDOVER_S`` between two, so that a training
thread waiting for the GIL takes it. Whether it does depends on the sleep: the waiter is
woken on a condition variable and must be scheduled before the sleeper wakes and re-takes
the free GIL; if it is not, the slices chain into one long hold. This script measures it.

**The probe.** A training thread repeats ``bench_overhead.busy`` (about 35 µs, calibrated)
and records every iteration's length (preallocated ``array``). A *gap* is an iteration's
length minus the calibrated p50; over 0.2 ms it is *stolen*.

**The worker** (the main thread) runs ``--bursts`` bursts: it sleeps 20 ms (a timer wake:
it then waits for the GIL, up to the 5 ms switch interval), then runs ``slices`` slices of
``slice`` ms of pure-Python CPU (bounded by its own CPU clock), sleeping ``H`` between two
(``H`` = 0 is ``time.sleep(0)``). Its work is known exactly: bursts x slices x slice.

**Variants**: ``H`` of 0, 50, 100, 200 and 500 µs with 0.4 ms slices (async_tee's), and
200 µs with 0.2 and 0.8 ms slices; interleaved over ``--rounds`` rounds (rotated), each
variant in every round. **Reported** per variant, pooled: stolen gaps (count, and how many
over 1 ms), the gap p50/p99/p99.9/max over the stolen gaps from a 1 µs histogram, time lost
(sum of stolen gaps) over the worker's work (the overhead factor: 1.0 would be a perfect
hand-over), and the worker's CPU per hand-over sleep (its CPU clock around the sleep: what
waking and re-taking the GIL costs the sleeping thread). Printed, not asserted.
"""

from __future__ import annotations

import argparse
import threading
import time
from array import array
from collections import Counter
from typing import Any

from _common import (
    bench_parser,
    machine_info,
    md_table,
    parse_bench_args,
    percentiles,
    progress,
    publish,
    rotated,
    text_table,
)
from bench_overhead import busy, calibrate

UNIT_US = 35.0
STOLEN_NS = 200_000
LONG_NS = 1_000_000
BURST_GAP_S = 0.02
VARIANTS: tuple[tuple[float, float], ...] = (  # (hand-over sleep µs, slice ms)
    (0.0, 0.4),
    (50.0, 0.4),
    (100.0, 0.4),
    (200.0, 0.4),
    (500.0, 0.4),
    (200.0, 0.2),
    (200.0, 0.8),
)
BURST_WORK_MS = 3.2  # each burst: this much work, cut into slices


def spin_cpu(ns: int) -> None:
    """Pure-Python work for ``ns`` of this thread's CPU time."""
    end = time.thread_time_ns() + ns
    x = 0
    while time.thread_time_ns() < end:
        for i in range(30):
            x += i


def run_variant(
    handover_us: float, slice_ms: float, bursts: int, iterations: int
) -> dict[str, Any]:
    """One variant: the probe thread against ``bursts`` bursts of sliced work."""
    slices = max(1, round(BURST_WORK_MS / slice_ms))
    expected_s = bursts * (BURST_GAP_S + slices * 0.006) + 1.0
    samples = array("q", bytes(8 * int(expected_s * 1e6 / UNIT_US * 2)))
    count = [0]
    stop = threading.Event()

    def training() -> None:
        pc = time.perf_counter_ns
        prev = pc()
        i, capacity = 0, len(samples)
        while not stop.is_set() and i < capacity:
            busy(iterations)
            now = pc()
            samples[i] = now - prev
            prev = now
            i += 1
        count[0] = i

    probe = threading.Thread(target=training, name="probe")
    probe.start()
    time.sleep(0.05)
    sleep_cpu_ns = 0
    sleeps = 0
    for _ in range(bursts):
        time.sleep(BURST_GAP_S)
        for k in range(slices):
            spin_cpu(int(slice_ms * 1e6))
            if k < slices - 1:
                before = time.thread_time_ns()
                time.sleep(handover_us / 1e6)
                sleep_cpu_ns += time.thread_time_ns() - before
                sleeps += 1
    stop.set()
    probe.join()
    n = count[0]
    ordered = sorted(samples[:n])
    p50 = ordered[n // 2]
    stolen = [ns - p50 for ns in samples[:n] if ns - p50 > STOLEN_NS]
    return {
        "handover_us": handover_us,
        "slice_ms": slice_ms,
        "bursts": bursts,
        "slices": slices,
        "work_ms": bursts * slices * slice_ms,
        "iterations": n,
        "stolen_hist_us": dict(Counter(ns // 1000 for ns in stolen)),
        "sleeps": sleeps,
        "sleep_cpu_ns": sleep_cpu_ns,
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool one variant's rounds."""
    hist: Counter[int] = Counter()
    for run in runs:
        hist.update({int(k): v for k, v in run["stolen_hist_us"].items()})
    gaps = sum(hist.values())
    lost_ms = sum(us * c for us, c in hist.items()) / 1000
    work_ms = sum(run["work_ms"] for run in runs)
    sleeps = sum(run["sleeps"] for run in runs)
    # percentiles() reads a histogram of ns (and answers in µs); these are µs buckets
    pcts = percentiles(Counter({us * 1000: c for us, c in hist.items()})) if gaps else {}
    return {
        "handover_us": runs[0]["handover_us"],
        "slice_ms": runs[0]["slice_ms"],
        "slices_per_burst": runs[0]["slices"],
        "bursts": sum(run["bursts"] for run in runs),
        "work_ms": work_ms,
        "stolen_gaps": gaps,
        "gaps_over_1ms": sum(c for us, c in hist.items() if us * 1000 >= LONG_NS),
        "gap_us": pcts,
        "max_gap_us": max(hist) if hist else 0,
        "lost_ms": lost_ms,
        "lost_over_work": lost_ms / work_ms if work_ms else None,
        "sleep_cpu_us_each": sum(r["sleep_cpu_ns"] for r in runs) / sleeps / 1000
        if sleeps
        else None,
    }


def _label(cell: dict[str, Any]) -> tuple[str, str]:
    h = cell["handover_us"]
    return ("sleep(0)" if h == 0 else f"{h:.0f} µs", f"{cell['slice_ms']:.1f} ms")


def rows(cells: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for c in cells:
        g = c["gap_us"]
        out.append(
            (
                *_label(c),
                str(c["bursts"]),
                f"{c['work_ms']:.0f}",
                str(c["stolen_gaps"]),
                str(c["gaps_over_1ms"]),
                f"{g.get('p50', 0):.0f}",
                f"{g.get('p99', 0):.0f}",
                f"{g.get('p99.9', 0):.0f}",
                str(c["max_gap_us"]),
                f"{c['lost_ms']:.0f}",
                f"{c['lost_over_work']:.2f}",
                f"{c['sleep_cpu_us_each']:.0f}" if c["sleep_cpu_us_each"] is not None else "",
            )
        )
    return out


HEADER = (
    "hand-over",
    "slice",
    "bursts",
    "work ms",
    "stolen gaps",
    "gaps >1ms",
    "gap p50 µs",
    "p99",
    "p99.9",
    "max",
    "lost ms",
    "lost / work",
    "worker CPU µs per sleep",
)


def section(report: dict[str, Any]) -> list[str]:
    """The markdown section ``run_all.py`` merges."""
    lines = [
        f"{report['rounds']} interleaved rounds; per variant and round {report['bursts']} bursts "
        f"of {BURST_WORK_MS} ms of pure-Python work cut into slices, each burst after a "
        f"{BURST_GAP_S * 1000:.0f} ms sleep, against a training thread repeating a "
        f"{report['unit_us']:.0f} µs unit. A gap over 0.2 ms of the training thread is stolen; "
        "`lost / work`: the stolen time over the worker's work (1.0: every slice handed "
        "over at once); gap percentiles over the stolen gaps (1 µs histogram).",
        "",
        *md_table(HEADER, rows(report["cells"])),
    ]
    return lines


def console(report: dict[str, Any]) -> list[str]:
    return ["GIL hand-over", *text_table(HEADER, rows(report["cells"]))]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--bursts", type=int, default=None, help="bursts per variant and round")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    return parse_bench_args(parser, "handover", argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    rounds = args.rounds or (1 if args.quick else 3)
    bursts = args.bursts or (10 if args.quick else 40)
    iterations = max(1, round(calibrate() * UNIT_US / 1000))
    by_variant: dict[tuple[float, float], list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for variant in rotated(VARIANTS, r, rounds):
            run = run_variant(*variant, bursts, iterations)
            by_variant[variant].append(run)
            progress(f"[{r + 1}/{rounds}] hand-over {variant[0]:.0f} µs, slice {variant[1]} ms")
    report = {
        "machine": machine_info(),
        "rounds": rounds,
        "bursts": bursts,
        "unit_us": UNIT_US,
        "cells": [summarise(by_variant[v]) for v in VARIANTS],
        "duration_s": time.monotonic() - started,
    }
    publish(args.out, report, "GIL hand-over", section(report), console(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Bounded memory: RSS through a long overload with the receiver stalled.

Usage: ``python benchmarks/bench_memory.py [--calls N] [--quick] [--out PATH]``

The pipeline exports over OTLP/HTTP to an ``OtlpSink`` in another process that stalls
every export, with async_tee's default queue size. After a warm-up (2,000 calls, a flush,
``gc.collect()``) the resident set size (``VmRSS`` in ``/proc/self/status``) is read,
then ``--calls`` tee calls (10^6 by default) with the 68-key fixture dict are made back to
back, far faster than the worker records, so the queue stays full and drops the oldest.
RSS is read every tenth of the run, after the run, and again after ``flush`` and
``gc.collect()``.

The bound: the queue holds at most ``queue_size`` items, each ``((snapshot, prefix, step,
enqueue_ns), sequence)`` around a shallow copy of the dict, as ``tee_rl_metrics_to_otel``
builds it; its size is ``sys.getsizeof`` of the copy, both tuples and the three ints (the
prefix is shared). The worker also holds the batch it popped (up to ``async_tee._worker.BATCH_SIZE``
items) while it records them, so the bound is ``(queue_size + BATCH_SIZE) x item``; the
queue-only figure is reported beside it. Growth within the bound plus 2 MiB (allocator
slack) holds; so must the growth from the first RSS sample after ``5 x (queue_size + BATCH_SIZE)``
calls to the end (no leak once full).

A trainer makes new value objects every step, which a queued snapshot keeps alive: a
second phase (a tenth of the calls) tees, each call, a dict whose floats, lists and nested
dicts are new objects made in the loop (the ints inside the lists are shared, to keep the
producer fast enough to overload the worker), against the bound counting those objects.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from collections.abc import Callable
from typing import Any

from _common import (
    SHUTDOWN_S,
    bench_parser,
    load_train_dict,
    machine_info,
    md_table,
    parse_bench_args,
    pipeline,
    progress,
    publish,
    quiet_logging,
    rss_bytes,
    start_receiver,
)

import async_tee
from async_tee._worker.loop import BATCH_SIZE

MIB = 1024 * 1024
ALLOWANCE = 2 * MIB
WARMUP_CALLS = 2_000
SAMPLES = 10


def fresh_copy(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` with new float, list and dict objects, as a trainer's next step would log."""
    return {
        k: v * 1.0 if type(v) is float else v.copy() if isinstance(v, (list, dict)) else v
        for k, v in d.items()
    }


def item_size(d: dict[str, Any], fresh: bool = False) -> int:
    """Bytes one queued item holds, built the way ``tee_rl_metrics_to_otel`` builds it.

    With ``fresh``, the values ``fresh_copy`` makes new count too.
    """
    copy = fresh_copy(d) if fresh else dict(d)
    snapshot = (copy, "train", 10**6, time.monotonic_ns())
    item = (snapshot, 10**6)
    containers = sys.getsizeof(item) + sys.getsizeof(snapshot) + sys.getsizeof(copy)
    ints = sys.getsizeof(snapshot[2]) + sys.getsizeof(snapshot[3]) + sys.getsizeof(item[1])
    values = sum(sys.getsizeof(v) for v in copy.values() if type(v) is not int) if fresh else 0
    return containers + ints + values


def settle() -> int:
    """Flush the pipeline, collect garbage, and read RSS."""
    async_tee.flush(SHUTDOWN_S)
    gc.collect()
    return rss_bytes()


def overload(calls: int, make: Callable[[int], dict[str, Any]]) -> list[tuple[int, int]]:
    """``calls`` tee calls back to back; returns (calls so far, RSS) every tenth."""
    tee = async_tee.tee_rl_metrics_to_otel
    every = max(1, calls // SAMPLES)
    samples = []
    for i in range(1, calls + 1):
        tee(make(i), "train", i)
        if i % every == 0:
            samples.append((i, rss_bytes()))
    return samples


def phase(
    name: str, calls: int, make: Callable[[int], dict[str, Any]], item: int
) -> dict[str, Any]:
    """One overload: RSS before, through, after, and after a flush and gc; the verdicts."""
    queue_size = async_tee.stats()["capacity"]
    bound = (queue_size + BATCH_SIZE) * item
    before = settle()
    stats_before = async_tee.stats()
    started = time.perf_counter()
    samples = overload(calls, make)
    seconds = time.perf_counter() - started
    after = rss_bytes()
    stats = async_tee.stats()
    settled = settle()
    growth = after - before
    full_from = 5 * (queue_size + BATCH_SIZE)  # the queue has surely been full by then
    reference = next((s for s in samples if s[0] >= full_from), samples[len(samples) // 2])
    leak = after - reference[1]
    result = {
        "phase": name,
        "calls": calls,
        "seconds": seconds,
        "rss_before_mib": before / MIB,
        "rss_after_mib": after / MIB,
        "rss_after_flush_gc_mib": settled / MIB,
        "growth_mib": growth / MIB,
        "growth_after_flush_gc_mib": (settled - before) / MIB,
        "growth_once_full_mib": leak / MIB,
        "once_full_from_call": reference[0],
        "item_bytes": item,
        "queue_only_bound_mib": queue_size * item / MIB,
        "within_queue_only_bound": growth <= queue_size * item + ALLOWANCE,
        "bound_mib": bound / MIB,
        "allowance_mib": ALLOWANCE / MIB,
        "within_bound": growth <= bound + ALLOWANCE,
        "no_growth_once_full": leak <= ALLOWANCE,
        "rss_samples_mib": [(n, rss / MIB) for n, rss in samples],
        "dropped": stats["dropped"] - stats_before["dropped"],
        "recorded": stats["recorded"] - stats_before["recorded"],
        "exports_failed": stats["exports"].get("failure", 0),
    }
    progress(
        f"{name}: {calls} calls in {seconds:.1f} s, RSS {before / MIB:.1f} -> {after / MIB:.1f}"
        f" MiB (bound {bound / MIB:.2f} MiB + {ALLOWANCE / MIB:.0f} MiB slack)"
    )
    return result


def run(calls: int, fresh_calls: int, port: int) -> dict[str, Any]:
    """Both phases in one pipeline with the default queue size."""
    d = load_train_dict()
    with pipeline(port) as running:
        queue_size = running.handle.settings.queue_size
        overload(WARMUP_CALLS, lambda _: d)
        shallow = item_size(d)
        fresh = item_size(d, fresh=True)
        phases = [
            phase("shared values", calls, lambda _: d, shallow),
            phase("fresh values", fresh_calls, lambda _: fresh_copy(d), fresh),
        ]
    return {
        "queue_size": queue_size,
        "worker_batch": BATCH_SIZE,
        "item_bytes": shallow,
        "item_bytes_with_values": fresh,
        "phases": phases,
        "shutdown": running.info,
    }


# ------------------------------------------------------------------ output

TITLE = "Memory under overload, receiver stalled"
TABLE_HEADER = (
    "phase",
    "calls",
    "s",
    "RSS before MiB",
    "after",
    "after flush+gc",
    "growth",
    "growth once full",
    "queue x item",
    "(queue + batch) x item",
    "within",
    "dropped",
)


def table_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per phase."""
    return [
        (
            p["phase"],
            str(p["calls"]),
            f"{p['seconds']:.1f}",
            f"{p['rss_before_mib']:.1f}",
            f"{p['rss_after_mib']:.1f}",
            f"{p['rss_after_flush_gc_mib']:.1f}",
            f"{p['growth_mib']:+.2f}",
            f"{p['growth_once_full_mib']:+.2f}",
            f"{p['queue_only_bound_mib']:.2f}",
            f"{p['bound_mib']:.2f}",
            "yes" if p["within_bound"] and p["no_growth_once_full"] else "**no**",
            str(p["dropped"]),
        )
        for p in report["memory"]["phases"]
    ]


def section(report: dict[str, Any]) -> list[str]:
    """The memory table as markdown lines (no title)."""
    memory = report["memory"]
    return [
        f"Receiver stalled, default queue ({memory['queue_size']} items). One queued item "
        f"holds {memory['item_bytes']} bytes (dict copy, tuples, ints), "
        f"{memory['item_bytes_with_values']} with the values a fresh dict brings. "
        f"The worker also holds the batch it popped (up to {memory['worker_batch']} items) "
        f"while recording it. Bound: (queue + batch) x item, plus {ALLOWANCE // MIB} MiB "
        "allocator slack; `within` also needs no growth once full; "
        "`growth once full`: from the first RSS sample after "
        f"5 x (queue + batch) calls to the end (a leak would show there).",
        "",
        *md_table(TABLE_HEADER, table_rows(report)),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(__doc__)
    parser.add_argument("--calls", type=int, default=None, help="calls in the overload")
    return parse_bench_args(parser, "memory", argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    calls = args.calls or (50_000 if args.quick else 1_000_000)
    fresh_calls = max(10_000, calls // 10)
    quiet_logging()
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        memory = run(calls, fresh_calls, start_receiver(stack, stall=True).port)
    report = {
        "machine": machine_info(),
        "config": {"quick": args.quick, "calls": calls, "fresh_calls": fresh_calls},
        "memory": memory,
        "duration_s": time.perf_counter() - started,
    }
    publish(args.out, report, TITLE, section(report), section(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Caller-side cost of one ``tee_rl_metrics_to_otel`` call, with the real pipeline running.

Usage: ``python benchmarks/bench_caller.py [--calls N] [--blocks N] [--quick] [--out PATH]``
(``run_all.py`` runs it as part of the whole suite; its JSON and markdown go to
``results/parts/caller.*`` by default, to a temp dir with ``--quick``).

What is timed: one call with the fixture's 68-key ``train`` dict
(``tests/fixtures/grpo_step.json``), bracketed by two ``perf_counter_ns()`` reads. The
statement is compiled into its own loop (as ``timeit`` does), so no wrapper call is
timed; the cost of an empty timer pair is measured the same way and reported. Every
sample is kept (``array('q')``, folded into an exact histogram per block), and p50, p90,
p99, p99.9 and max are reported, never means.

The pipeline is the real one: ``start_telemetry`` builds the SDK provider, the worker
drains on its own timer, and a ``PeriodicExportingMetricReader`` exports every 1,000 ms
over OTLP/gRPC to an ``OtlpSink`` in another process (``_receiver.py``), so the
receiver's work never shares this process's GIL. Blocks of a pipeline condition last at
least 2.2 export intervals, so every block overlaps an export, and against a stalled or
black-holed receiver at least one export times out (1 s) inside the measured window.

Conditions: healthy receiver at trainer pace (one call per 2 ms, sleeping in between:
the GIL is released as a trainer waiting on its GPU would) and back to back; a stalled
receiver; a black-hole endpoint; a 64-slot queue saturated back to back; a second
Python thread spinning (GIL contention); calls from a coroutine inside ``asyncio.run``
(which awaits ``asyncio.sleep(0)`` after every 1,000 calls);
and telemetry off (never started). Baselines, with the same dict and timer: the floor
``deque(maxlen=1024).append(dict(d))`` (back to back and at trainer pace: cold caches
change it), the synchronous ``_tee_rl_metrics_to_otel`` on the caller (inline), and a
janus 2.0 queue with a drop-oldest wrapper drained by an asyncio consumer thread (which
does no work per item: the queue mechanism alone). Back to back, the caller produces far
faster than the worker records, so the queue overflows in every back-to-back pipeline row,
not only the saturated one; the ``dropped`` column counts it.

Sizes: ``--calls`` (100,000 by default) per back-to-back row, ``--calls // 5`` per
trainer-pace row (20,000, i.e. 40 s each); pipeline rows run longer when a block needs it
to span the export intervals, so they hold more samples. ``--quick``: 3,000 calls, 3
blocks, no minimum block length: a smoke test (about 15 s), no figure to rely on.
The timed loops, blocks and interleaving live in ``_blocks.py``, shared with
``bench_baselines.py``.

The machine drifts, so conditions run interleaved: each of ``--blocks`` rounds runs every
condition once, in a rotated order, each in a fresh pipeline (``shutdown_telemetry(2)``
then ``testing.reset()`` after it). Reported: pooled percentiles over all blocks and the
median of the per-block p50s. The pipeline's CPU per dict is the process CPU time of a
trainer-pace block with telemetry on, minus the same loop with telemetry off, per call;
the worker thread's own CPU time (``pthread_getcpuclockid``) is reported beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from _blocks import (
    BASELINE_QUEUE,
    FLOOR,
    HEALTHY_B2B,
    INLINE,
    INLINE_SDK,
    LATENCY_HEADER,
    PACE_NS,
    TIMER,
    WARMUP_CALLS,
    Condition,
    Env,
    Plan,
    Target,
    add_ratios,
    floor,
    healthy,
    latency_rows,
    pipeline_setup,
    run_rounds,
    runnable,
    summarise,
)
from _common import (
    EXPORT_INTERVAL_MS,
    OTLP_TIMEOUT_S,
    bench_parser,
    load_train_dict,
    machine_info,
    md_table,
    parse_bench_args,
    publish,
    quiet_logging,
    start_receiver,
    text_table,
)

import async_tee
from async_tee import metrics as tee_metrics
from async_tee.sink import black_hole

SATURATED_QUEUE = 64

# ------------------------------------------------------------------ conditions


stalled = pipeline_setup("stalled")
into_black_hole = pipeline_setup("black_hole")
saturated = pipeline_setup("healthy", queue_size=SATURATED_QUEUE)


@contextlib.contextmanager
def spinning_thread() -> Iterator[None]:
    """A second Python thread doing pure-Python CPU work until the block ends."""
    stop = threading.Event()

    def spin() -> None:
        total = 0
        while not stop.is_set():
            for i in range(10_000):
                total += i

    thread = threading.Thread(target=spin, name="bench-spinner", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def gil_contention(env: Env) -> Iterator[Target]:
    with healthy(env) as target, spinning_thread():
        yield target


@contextlib.contextmanager
def telemetry_off(env: Env) -> Iterator[Target]:
    if tee_metrics._QUEUE is not None:
        raise RuntimeError("telemetry is still running")
    yield Target(async_tee.tee_rl_metrics_to_otel)


_STOP = object()


def drop_oldest_put(sync_q: Any) -> Callable[[Any], None]:
    """``put_nowait`` on a janus sync queue, dropping the oldest item when it is full."""
    import janus

    put_nowait, get_nowait = sync_q.put_nowait, sync_q.get_nowait

    def put(item: Any) -> None:
        try:
            put_nowait(item)
        except janus.SyncQueueFull:
            with contextlib.suppress(janus.SyncQueueEmpty):
                get_nowait()
            put_nowait(item)

    return put


@contextlib.contextmanager
def janus_queue() -> Iterator[Any]:
    """A ``janus.Queue`` drained by an asyncio consumer on its own thread."""
    import janus

    ready = threading.Event()
    box: dict[str, Any] = {}

    async def consume() -> None:
        queue: janus.Queue[Any] = janus.Queue(maxsize=BASELINE_QUEUE)
        box["queue"] = queue
        ready.set()
        while await queue.async_q.get() is not _STOP:
            pass
        queue.close()
        await queue.wait_closed()

    thread = threading.Thread(
        target=asyncio.run, args=(consume(),), name="bench-janus-consumer", daemon=True
    )
    thread.start()
    if not ready.wait(5):
        raise RuntimeError("janus consumer did not start")
    try:
        yield box["queue"]
    finally:
        box["queue"].sync_q.put(_STOP, timeout=5)
        thread.join(5)


@contextlib.contextmanager
def janus_baseline(env: Env) -> Iterator[Target]:
    with janus_queue() as queue:
        yield Target(drop_oldest_put(queue.sync_q), dict)


CONDITIONS = (
    Condition("healthy_paced", "1 healthy, trainer pace", healthy, paced=True),
    HEALTHY_B2B,
    Condition("stalled", "3 stalled receiver", stalled),
    Condition("black_hole", "4 black hole", into_black_hole),
    Condition("saturated", "5 saturated (queue 64)", saturated),
    Condition("gil", "6 GIL contention", gil_contention),
    Condition("asyncio", "7 inside asyncio.run", healthy, in_asyncio=True),
    Condition("off", "8 telemetry off", telemetry_off),
    Condition("off_paced", "8' telemetry off, trainer pace", telemetry_off, paced=True),
    FLOOR,
    Condition(
        "floor_paced", "a' floor, trainer pace", floor, "copy_put", paced=True, kind="baseline"
    ),
    INLINE,
    INLINE_SDK,
    Condition(
        "janus",
        "c janus 2.0 drop-oldest",
        janus_baseline,
        "copy_put",
        kind="baseline",
        requires="janus",
    ),
    TIMER,
)

# ------------------------------------------------------------------ summaries


def worker_cpu(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Pipeline CPU per dict at trainer pace: (process CPU on - off) per call, and threads."""
    on, off = results["healthy_paced"], results["off_paced"]
    cpu_on = on["pipeline"]["cpu_ns"] / on["n"]
    cpu_off = off["pipeline"]["cpu_ns"] / off["n"]
    threads = on["pipeline"].get("thread_cpu_ns", {})
    recorded = on["pipeline"].get("recorded", 0) or 1
    wall_s = on["pipeline"]["wall_ns"] / 1e9
    per_dict_us = (cpu_on - cpu_off) / 1000
    return {
        "process_cpu_per_call_on_us": cpu_on / 1000,
        "process_cpu_per_call_off_us": cpu_off / 1000,
        "pipeline_cpu_per_dict_us": per_dict_us,
        "share_of_2ms_step_pct": 100 * per_dict_us * 1000 / PACE_NS,
        "worker_thread_cpu_per_dict_us": threads.get("async-tee-worker", 0) / recorded / 1000,
        "exporter_thread_cpu_per_s_ms": (
            threads.get("OtelPeriodicExportingMetricReader", 0) / wall_s / 1e6 if wall_s else 0.0
        ),
        "dicts": on["n"],
    }


def check_targets(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target per pipeline condition, as figures and a verdict (nothing asserted)."""
    checks: list[dict[str, Any]] = []

    def check(key: str, target: str, value: float, limit: float) -> None:
        checks.append(
            {
                "condition": key,
                "target": target,
                "value": round(value, 4),
                "limit": round(limit, 4),
                "holds": value <= limit,
            }
        )

    for key, row in results.items():
        if row["kind"] != "condition" or key.startswith("off"):
            continue
        floor_p50 = results[row["floor_used"]]["median_block_p50_us"]
        p50 = row["median_block_p50_us"]
        check(key, "p50 <= 1 us", p50, 1.0)
        check(key, "p50 <= 3x floor", p50, 3 * floor_p50)
        check(key, "p99 <= 5 us", row["us"]["p99"], 5.0)
        if key != "gil":
            check(key, "p99.9 <= 30 us", row["us"]["p99.9"], 30.0)
        check(key, "p50 >= 50x below inline", p50, results["inline"]["median_block_p50_us"] / 50)
        check(
            key,
            "p50 >= 50x below the seed's inline (SDK instruments)",
            p50,
            results["inline_sdk"]["median_block_p50_us"] / 50,
        )
    for key in ("off", "off_paced"):
        check(key, "telemetry off p50 <= 0.2 us", results[key]["median_block_p50_us"], 0.2)
    return checks


# ------------------------------------------------------------------ output


def _dropped(row: dict[str, Any]) -> str:
    dropped = row["pipeline"].get("overflow")
    return "" if dropped is None else str(dropped)


TITLE = "Caller cost of `tee_rl_metrics_to_otel` (68-key train dict)"
TABLE_HEADER = (*LATENCY_HEADER, "dropped")


def table_rows(results: dict[str, dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per condition, with the dicts the full queue dropped."""
    return latency_rows(results, _dropped)


def cpu_lines(report: dict[str, Any]) -> list[str]:
    """The worker-CPU figures, one ``name: value`` line each."""
    return [
        f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}"
        for key, value in report["worker_cpu"].items()
    ]


def target_line(check: dict[str, Any]) -> str:
    verdict = "holds" if check["holds"] else "MISSED"
    return (
        f"{verdict:<6} {check['condition']:<14} {check['target']:<28} "
        f"{check['value']} (limit {check['limit']})"
    )


def console(report: dict[str, Any]) -> list[str]:
    """The table, the targets and the CPU figures, for stdout."""
    return [
        "Caller cost per tee call, µs (timer included; see the timer row)",
        *text_table(TABLE_HEADER, table_rows(report["conditions"])),
        "",
        "Targets (p50: median of block p50s; tails: pooled):",
        *("  " + target_line(check) for check in report["targets"]),
        "",
        "Pipeline CPU at trainer pace:",
        *("  " + line for line in cpu_lines(report)),
    ]


def section(report: dict[str, Any]) -> list[str]:
    """The caller table, targets and CPU figures as markdown lines (no title)."""
    timer_p50 = report["conditions"]["timer"]["median_block_p50_us"]
    lines = [
        f"{report['config']['blocks']} interleaved blocks per row. Times in µs, timer "
        f"included (empty pair p50 {timer_p50:.3f} µs). `p50 med` is the median of the "
        "per-block p50s; the ratios use it. Paced rows compare with the paced floor. "
        "`dropped`: dicts the full queue dropped during the measured windows.",
        "",
        *md_table(TABLE_HEADER, table_rows(report["conditions"])),
        "",
        "### Caller targets",
        "",
        *md_table(
            ("condition", "target", "value", "limit", "holds"),
            (
                (
                    c["condition"],
                    c["target"],
                    str(c["value"]),
                    str(c["limit"]),
                    "yes" if c["holds"] else "**no**",
                )
                for c in report["targets"]
            ),
        ),
        "",
        "### Pipeline CPU at trainer pace",
        "",
    ]
    return lines + [f"- {line}" for line in cpu_lines(report)]


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(__doc__)
    parser.add_argument("--calls", type=int, default=None, help="back-to-back calls per row")
    parser.add_argument("--blocks", type=int, default=None, help="interleaved rounds")
    return parse_bench_args(parser, "caller", argv)


def make_plan(args: argparse.Namespace) -> Plan:
    """Full: 100,000 calls a row (20,000 at trainer pace: 40 s), 5 blocks spanning exports.

    Quick: 3,000 calls (600 at trainer pace), 3 blocks, no minimum block length.
    """
    calls = args.calls or (3_000 if args.quick else 100_000)
    blocks = args.blocks or (3 if args.quick else 5)
    min_block_s = 0.0 if args.quick else 2.2 * EXPORT_INTERVAL_MS / 1000
    return Plan(blocks, calls, max(blocks, calls // 5), min_block_s)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args)
    quiet_logging()
    started = time.perf_counter()
    conditions = runnable(CONDITIONS)
    with contextlib.ExitStack() as stack:
        hole, hole_port = black_hole()
        stack.callback(hole.close)
        ports = {
            "healthy": start_receiver(stack).port,
            "stalled": start_receiver(stack, stall=True).port,
            "black_hole": hole_port,
        }
        env = Env(load_train_dict(), ports)
        blocks = run_rounds(conditions, env, plan)
    results = {c.key: summarise(c, blocks[c.key]) for c in conditions}
    add_ratios(results)
    report = {
        "machine": machine_info(),
        "config": {
            "quick": args.quick,
            "blocks": plan.blocks,
            "calls_per_row": plan.calls,
            "calls_per_paced_row": plan.paced_calls,
            "min_block_s_with_pipeline": plan.min_block_s,
            "pace_ms": PACE_NS / 1e6,
            "export_interval_ms": EXPORT_INTERVAL_MS,
            "otlp_timeout_s": OTLP_TIMEOUT_S,
            "warmup_calls": WARMUP_CALLS,
            "dict_keys": len(env.d),
        },
        "conditions": results,
        "targets": check_targets(results),
        "worker_cpu": worker_cpu(results),
        "duration_s": time.perf_counter() - started,
    }
    publish(args.out, report, TITLE, section(report), console(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

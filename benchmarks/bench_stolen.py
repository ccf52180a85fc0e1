"""Stolen time: what the telemetry threads take from a pure-Python training thread (GIL).

Usage: ``python benchmarks/bench_stolen.py [--seconds S] [--rounds N] [--rates 1,10,100]
[--warmup-s S] [--quick] [--out PATH]`` (``run_all.py`` runs it as the ``stolen`` part of
``results/latest.json``; run alone, it writes its JSON and markdown to a temp dir unless
``--out`` is given).

The tee's caller cost is a few µs, but the worker thread and the exporting thread run
Python too, and every bytecode they run is one the training thread cannot: they share
its GIL. When one of them holds the GIL and the training thread wants it, the training
thread waits, up to the interpreter's switch interval (``sys.getswitchinterval()``, 5 ms)
if the holder never releases it. This benchmark measures that wait from the training
thread's side.

**The probe.** A training-thread loop repeats a fixed unit of pure-Python work
(``bench_overhead.busy``: arithmetic and a small dict; about 35 µs, the iteration count
and the unit's cost calibrated once, in this process, at the start: the unit's cost is
the p50 iteration of the probe loop itself, so the loop's own bookkeeping is in it) and
reads ``time.perf_counter_ns()`` at the end of each iteration. An iteration's *gap* is the
time between two consecutive iterations' ends minus the unit's calibrated cost; a gap over
0.2 ms is *stolen*: the training thread was not running its own work. Every iteration's
gap is kept (an ``array('q')`` preallocated before the window, so the bookkeeping
allocates nothing per iteration) and folded into an exact histogram at 1 µs resolution,
plus the exact list of stolen gaps.

**Teeing.** ``rate`` times a second (1, 10, 100 steps a second; the schedule is absolute),
an iteration also tees the fixture's per-step calls (``tests/fixtures/grpo_step.json``):
the 68-key ``train`` dict, then the ``""`` efficiency dict with ``step_finished=True``
(as ``Logger`` marks a step's last call), so every step is complete at once and
step-aligned export runs as in a trainer. Those calls' own cost (a few µs) is inside that
iteration, well under the threshold.

**Variants**, each run in its own child process (fresh interpreter, allocator and GIL
history; the same modules imported in every variant, so garbage collections scan the same
objects): ``off`` (``start_telemetry`` never called: the tee is a no-op), ``healthy``
(``async_tee.start_telemetry()`` exporting over OTLP/HTTP to an ``OtlpSink`` in another
process, ``_receiver.py``, so decoding never takes this process's GIL;
``OTEL_METRIC_EXPORT_INTERVAL`` 1 s, ``ASYNC_TEE_MIN_EXPORT_INTERVAL`` at its 1 s default,
exporter timeout 1 s: ``_common.otlp_environ``) and ``stalled`` (the same, the receiver
stalling every export, ``OtlpSink.stall()``: each send times out after 1 s, and the requests
wait in the export backlog, sent again with backoff). A child
runs the probe for ``--warmup-s`` (the connection opens, the first exports go),
then measures for ``--seconds``, then shuts down (bounded, 2 s). The receivers live in
this process's children for the whole run. Each of ``--rounds`` rounds runs every rate
(rotated) and, per rate, the three variants back to back (rotated): off and on alternate
seconds apart, so the machine's drift hits both.

**Reported per cell** (a rate and a variant, pooled over rounds): stolen gaps (count,
and how many over 1 ms), time lost in them (sum of the gaps, ms and % of the measured
wall time), the longest gap, and p50/p99/p99.9 of all iterations' gaps from the
histogram (not means); the iteration p50 in the cell (against the calibration: drift).
Per ``on`` cell, against ``off`` at the same rate: the differences and ratios, and the
*longest gap attributable to telemetry*: the longest gap length L at which the on runs
have significantly more gaps of at least L than the off runs (counts scaled to the same
wall time; excess over 2 sigma of the two Poisson counts,
``n_on - n_off > 2 sqrt(n_on + n_off)``); none when there is no such L. The worker's
(``async-tee-worker``) and the exporting thread's (``async-tee-export``) CPU time per
second over the window, from their CPU clocks (``_common.thread_cpu_ns``,
``pthread_getcpuclockid``, read from the training thread: nanoseconds, unlike
``/proc/self/task/<tid>/stat``'s 10 ms ticks), and per teed step; ``other``: the process's
CPU minus those two and the training thread's (none over OTLP/HTTP; gRPC's C-core
threads, which run without the GIL, when it is chosen). Garbage collections in the window
(any thread) are timed with ``gc.callbacks``.

**Targets** (issues 12 and 22; printed, never asserted): time lost at 100 steps/s <= 0.5 %
of the run (the on cells' own figure); on minus off, <= 0.1 % at 1 step/s and <= 0.5 % at
100 steps/s; longest gap attributable to
telemetry <= 1 ms (every on cell); at 1 step/s indistinguishable from off (no gap length
at which the on runs have significantly more gaps); worker + exporting thread CPU per
1 s step <= 0.5 ms.

Full: 2 rounds of 7 s runs at 1, 10 and 100 steps/s (24 children, about 4 minutes).
``--quick``: one round at 100 steps/s, 1 s cells: a smoke run, no figure to rely on.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import gc
import importlib
import json
import math
import subprocess
import sys
import time
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from statistics import median
from time import perf_counter_ns
from typing import Any

from _common import (
    EXPORT_INTERVAL_MS,
    OTLP_TIMEOUT_S,
    Session,
    bench_parser,
    find_call,
    fmt_opt,
    load_train_dict,
    machine_info,
    md_table,
    parse_bench_args,
    percentiles,
    pipeline,
    progress,
    publish,
    quiet_logging,
    rotated,
    start_receiver,
    text_table,
    thread_cpu_ns,
)
from bench_overhead import busy, calibrate

import async_tee

RATES = (1, 10, 100)
QUICK_RATES = (100,)
VARIANTS = ("off", "healthy", "stalled")
ON_VARIANTS = ("healthy", "stalled")
UNIT_US = 35.0  # the probe's unit of work
STOLEN_NS = 200_000  # a gap over 0.2 ms is stolen
LONG_NS = 1_000_000
CALIBRATION_S = 1.0
CHILD_SLACK_S = 60.0  # a child's start, warm-up and shutdown, beyond its window
WORKER = "async-tee-worker"
EXPORTER = "async-tee-export"
# What start_telemetry imports for OTLP: imported in every variant, so that garbage
# collections scan the same modules' objects with telemetry off as on.
PRELOAD = (
    "asyncio",
    "http.client",
    "opentelemetry.sdk.metrics",
    "opentelemetry.sdk.resources",
    "opentelemetry.proto.collector.metrics.v1.metrics_service_pb2",
    "async_tee._export.encode",
    "async_tee._export.http_transport",
    "async_tee._export.sender",
    "async_tee._worker.consumer",
    "async_tee._worker.loop",
)
DEFAULT_MIN_EXPORT_INTERVAL_S = 1.0  # ASYNC_TEE_MIN_EXPORT_INTERVAL, left unset

# ------------------------------------------------------------------ the probe


@dataclass(frozen=True)
class Unit:
    """The calibrated unit of work: ``busy(iterations)``, and its cost in the probe loop."""

    iterations: int
    ns: int  # p50 iteration of the probe loop (no tee): the cost subtracted from each gap
    min_ns: int
    iterations_per_ms: float


Calls = list[tuple[dict[str, Any], str, bool]]


def step_calls() -> Calls:
    """One step's tee calls: the 68-key ``train`` dict, then ``""`` ending the step."""
    return [(load_train_dict(), "train", False), (find_call(""), "", True)]


def probe(
    iterations: int, seconds: float, rate: float, calls: Calls, samples: array[int], step: int
) -> tuple[int, int, int]:
    """Repeat the unit for ``seconds``, teeing ``calls`` ``rate`` times a second (0: never).

    Writes each iteration's length (ns, end to end) into ``samples``, preallocated, and
    stops early if it is full.

    Returns:
        The iterations measured, the next step and the measured wall time (ns).
    """
    tee = async_tee.tee_rl_metrics_to_otel
    pc = perf_counter_ns
    period = round(1e9 / rate) if rate else 0
    capacity = len(samples)
    start = prev = pc()
    end = start + round(seconds * 1e9)
    next_tee = start if period else end + 1
    i = 0
    while i < capacity:
        busy(iterations)
        if prev >= next_tee:
            for metrics, prefix, finished in calls:
                tee(metrics, prefix, step, finished)
            step += 1
            next_tee += period
        now = pc()
        samples[i] = now - prev
        prev = now
        i += 1
        if now >= end:
            break
    return i, step, prev - start


def preallocated(seconds: float, unit_ns: int) -> array[int]:
    """Room for the window's iterations at up to twice the calibrated speed."""
    return array("q", bytes(8 * (int(seconds * 2e9 / max(1, unit_ns)) + 1000)))


def calibrate_unit(target_us: float = UNIT_US) -> Unit:
    """The iteration count for ``target_us`` of work, and its p50 cost in the probe loop.

    ``busy``'s rate (its fastest probe) gives a first count; one probe-loop window
    rescales it to the target; a second window measures the cost kept.
    """
    per_ms = calibrate()
    iterations = max(1, round(per_ms * target_us / 1000))
    samples = preallocated(CALIBRATION_S, round(target_us * 500))
    probe(iterations, 0.2, 0, [], samples, 0)  # warm-up
    n, _, _ = probe(iterations, CALIBRATION_S / 2, 0, [], samples, 0)
    iterations = max(1, round(iterations * target_us * 1000 / sorted(samples[:n])[n // 2]))
    n, _, _ = probe(iterations, CALIBRATION_S, 0, [], samples, 0)
    ordered = sorted(samples[:n])
    return Unit(iterations, ordered[n // 2], ordered[0], per_ms)


# ------------------------------------------------------------------ one child: one run


class GcClock:
    """Times every garbage collection (in whichever thread runs it) via ``gc.callbacks``."""

    def __init__(self) -> None:
        self.started = 0
        self.total_ns = 0
        self.longest_ns = 0
        self.by_generation = [0, 0, 0]

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = perf_counter_ns()
            return
        took = perf_counter_ns() - self.started
        self.total_ns += took
        self.longest_ns = max(self.longest_ns, took)
        self.by_generation[info["generation"]] += 1

    @contextlib.contextmanager
    def installed(self) -> Iterator[GcClock]:
        gc.callbacks.append(self)
        try:
            yield self
        finally:
            gc.callbacks.remove(self)


@contextlib.contextmanager
def variant_session(variant: str, port: int | None) -> Iterator[Session | None]:
    """Nothing for ``off``; the real pipeline exporting to ``port`` otherwise."""
    if variant == "off":
        yield None
        return
    assert port is not None
    with pipeline(port) as running:
        yield running


def _thread_cpu(running: Session | None, name: str) -> int | None:
    thread = running.thread(name) if running else None
    return thread_cpu_ns(thread) if thread else None


def cpu_snapshot(running: Session | None) -> dict[str, int | None]:
    """The process's, the training thread's and the telemetry threads' CPU clocks, now."""
    return {
        "process": time.process_time_ns(),
        "training": time.thread_time_ns(),
        "worker": _thread_cpu(running, WORKER),
        "exporter": _thread_cpu(running, EXPORTER),
    }


def pipeline_counts() -> dict[str, int]:
    """The session's counts that say what the window did: dicts, drops, exports, steps."""
    stats = async_tee.stats()
    return {
        "enqueued": stats["enqueued"],
        "recorded": stats["recorded"],
        "dropped_overflow": stats["dropped_by_reason"]["overflow"],
        "exports_ok": stats["exports"].get("success", 0),
        "exports_failed": stats["exports"].get("failure", 0),
        "steps_completed": stats["steps"]["completed"],
        "steps_exported": stats["steps"]["exported"],
        "steps_coalesced": stats["steps"]["coalesced"],
    }


def _delta(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def run_child(spec: dict[str, Any], calls: Calls | None = None) -> dict[str, Any]:
    """One run of one variant at one rate: warm up, measure, report the raw figures.

    ``calls``: one step's tee calls (default :func:`step_calls`).
    """
    quiet_logging()
    for module in PRELOAD:
        importlib.import_module(module)
    calls = step_calls() if calls is None else calls
    unit_ns = spec["unit_ns"]
    samples = preallocated(max(spec["seconds"], spec["warmup_s"]), unit_ns)
    with variant_session(spec["variant"], spec["port"]) as running:
        _, step, _ = probe(spec["iterations"], spec["warmup_s"], spec["rate"], calls, samples, 1)
        counts = pipeline_counts() if running else {}
        clock = GcClock()
        cpu = cpu_snapshot(running)
        with clock.installed():
            n, next_step, wall_ns = probe(
                spec["iterations"], spec["seconds"], spec["rate"], calls, samples, step
            )
        cpu_after = cpu_snapshot(running)
        counts_after = pipeline_counts() if running else {}
    gaps = Counter((max(0, ns - unit_ns) // 1000) * 1000 for ns in samples[:n])
    cpu_ns = {key: _delta(cpu_after[key], cpu[key]) for key in cpu}
    return {
        "variant": spec["variant"],
        "rate": spec["rate"],
        "iterations": n,
        "wall_ns": wall_ns,
        "steps_teed": next_step - step,
        "iteration_p50_ns": sorted(samples[:n])[n // 2],
        "gap_hist_us": {str(ns // 1000): count for ns, count in sorted(gaps.items())},
        "stolen_ns": sorted(ns - unit_ns for ns in samples[:n] if ns - unit_ns > STOLEN_NS),
        "cpu_ns": cpu_ns,
        "gc": {
            "total_ns": clock.total_ns,
            "longest_ns": clock.longest_ns,
            "by_generation": clock.by_generation,
        },
        "pipeline": {key: counts_after[key] - counts[key] for key in counts_after},
        "shutdown_ok": running.info.get("shutdown_ok") if running else None,
        "threads_left": running.info.get("threads_left", []) if running else [],
    }


# ------------------------------------------------------------------ the parent: the rounds


@dataclass(frozen=True)
class Config:
    """The run's sizes and the calibrated unit."""

    quick: bool
    rates: tuple[int, ...]
    rounds: int
    seconds: float
    warmup_s: float
    unit: Unit


def spawn(spec: dict[str, Any], script: str = __file__) -> dict[str, Any]:
    """Run one child (``script`` with ``--child``); its last stdout line is its JSON."""
    command = [sys.executable, script, "--child", json.dumps(spec)]
    timeout = spec["warmup_s"] + spec["seconds"] + CHILD_SLACK_S
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"child {spec['variant']} at {spec['rate']}/s: exit {done.returncode}")
    return json.loads(lines[-1])


def run_rounds(cfg: Config, ports: dict[str, int]) -> list[dict[str, Any]]:
    """Per round every rate (rotated) and, back to back, every variant (rotated)."""
    runs = []
    for round_ in range(cfg.rounds):
        for rate in rotated(cfg.rates, round_, cfg.rounds):
            for variant in rotated(VARIANTS, round_, cfg.rounds):
                spec = {
                    "variant": variant,
                    "rate": rate,
                    "port": ports.get(variant),
                    "seconds": cfg.seconds,
                    "warmup_s": cfg.warmup_s,
                    "iterations": cfg.unit.iterations,
                    "unit_ns": cfg.unit.ns,
                }
                started = time.perf_counter()
                run = {**spawn(spec), "round": round_}
                runs.append(run)
                lost_ms = sum(run["stolen_ns"]) / 1e6
                progress(
                    f"[{round_ + 1}/{cfg.rounds}] {rate:>3}/s {variant:<8} "
                    f"stolen={len(run['stolen_ns']):>4} lost={lost_ms:7.1f} ms "
                    f"longest={max(run['stolen_ns'], default=0) / 1e6:5.2f} ms "
                    f"({time.perf_counter() - started:4.1f} s)"
                )
    return runs


# ------------------------------------------------------------------ summaries


def _sum_opt(values: Sequence[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def summarise_cell(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One rate and variant, pooled over its runs (one per round)."""
    wall_ns = sum(r["wall_ns"] for r in runs)
    stolen = sorted(ns for r in runs for ns in r["stolen_ns"])
    hist: Counter[int] = Counter()
    for r in runs:
        hist.update({int(us) * 1000: count for us, count in r["gap_hist_us"].items()})
    lost_ns = sum(stolen)
    cpu = {
        key: _sum_opt([r["cpu_ns"][key] for r in runs])
        for key in ("process", "training", "worker", "exporter")
    }
    telemetry = _sum_opt([cpu["worker"], cpu["exporter"]])
    other = (
        None
        if telemetry is None or cpu["process"] is None or cpu["training"] is None
        else cpu["process"] - cpu["training"] - telemetry
    )
    steps = sum(r["steps_teed"] for r in runs)
    wall_s = wall_ns / 1e9

    def per_s_ms(ns: int | None) -> float | None:
        return None if ns is None else ns / wall_s / 1e6

    pipeline_totals: dict[str, int] = {}
    for r in runs:
        for key, value in r["pipeline"].items():
            pipeline_totals[key] = pipeline_totals.get(key, 0) + value
    return {
        "variant": runs[0]["variant"],
        "rate": runs[0]["rate"],
        "runs": len(runs),
        "wall_s": wall_s,
        "iterations": sum(r["iterations"] for r in runs),
        "iteration_p50_us": median(r["iteration_p50_ns"] for r in runs) / 1000,
        "steps_teed": steps,
        "stolen": len(stolen),
        "stolen_over_1ms": sum(1 for ns in stolen if ns > LONG_NS),
        "lost_ms": lost_ns / 1e6,
        "lost_pct": 100 * lost_ns / wall_ns,
        "longest_ms": (stolen[-1] if stolen else 0) / 1e6,
        "gap_us": percentiles(hist),
        "stolen_ns": stolen,
        "by_round": [
            {
                "round": r["round"],
                "stolen": len(r["stolen_ns"]),
                "lost_pct": 100 * sum(r["stolen_ns"]) / r["wall_ns"],
                "longest_ms": max(r["stolen_ns"], default=0) / 1e6,
            }
            for r in runs
        ],
        "cpu_ms_per_s": {
            "worker": per_s_ms(cpu["worker"]),
            "exporter": per_s_ms(cpu["exporter"]),
            "other_threads": per_s_ms(other),
            "training": per_s_ms(cpu["training"]),
        },
        "telemetry_cpu_per_step_ms": None if telemetry is None else telemetry / max(1, steps) / 1e6,
        "gc": {
            "ms": sum(r["gc"]["total_ns"] for r in runs) / 1e6,
            "longest_ms": max(r["gc"]["longest_ns"] for r in runs) / 1e6,
            "gen2": sum(r["gc"]["by_generation"][2] for r in runs),
        },
        "pipeline": pipeline_totals,
        "shutdown_ok": [r["shutdown_ok"] for r in runs if r["shutdown_ok"] is not None],
        "threads_left": sorted({name for r in runs for name in r["threads_left"]}),
    }


def attributable_longest_ms(on: dict[str, Any], off: dict[str, Any]) -> float | None:
    """The longest gap length at which ``on`` has significantly more gaps than ``off``.

    For each of ``on``'s gap lengths L, longest first: ``n_on`` gaps of at least L against
    ``n_off`` (scaled to ``on``'s wall time); the first L where ``n_on - n_off`` exceeds
    twice the standard deviation of the difference of two Poisson counts,
    ``2 sqrt(n_on + n_off)``. None when there is none: telemetry adds no gap length.
    """
    on_gaps, off_gaps = on["stolen_ns"], off["stolen_ns"]
    scale = on["wall_s"] / off["wall_s"] if off["wall_s"] else 1.0
    for index in range(len(on_gaps) - 1, -1, -1):
        length = on_gaps[index]
        if index + 1 < len(on_gaps) and on_gaps[index + 1] == length:
            continue  # count each length once, at its first (lowest) index
        n_on = len(on_gaps) - bisect.bisect_left(on_gaps, length)
        n_off = scale * (len(off_gaps) - bisect.bisect_left(off_gaps, length))
        if n_on - n_off > 2 * math.sqrt(n_on + n_off):
            return length / 1e6
    return None


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def compare(on: dict[str, Any], off: dict[str, Any]) -> dict[str, Any]:
    """An ``on`` cell against ``off`` at the same rate: differences, ratios, attribution."""
    scale = on["wall_s"] / off["wall_s"] if off["wall_s"] else 1.0
    return {
        "rate": on["rate"],
        "variant": on["variant"],
        "stolen_diff": on["stolen"] - scale * off["stolen"],
        "stolen_ratio": _ratio(on["stolen"], scale * off["stolen"]),
        "lost_ms_diff": on["lost_ms"] - scale * off["lost_ms"],
        "lost_pct_diff": on["lost_pct"] - off["lost_pct"],
        "lost_ratio": _ratio(on["lost_pct"], off["lost_pct"]),
        "longest_ms_on": on["longest_ms"],
        "longest_ms_off": off["longest_ms"],
        "p99_9_us_diff": on["gap_us"]["p99.9"] - off["gap_us"]["p99.9"],
        "attributable_longest_ms": attributable_longest_ms(on, off),
        "worker_ms_per_s": on["cpu_ms_per_s"]["worker"],
        "exporter_ms_per_s": on["cpu_ms_per_s"]["exporter"],
        "other_threads_ms_per_s": on["cpu_ms_per_s"]["other_threads"],
        "telemetry_cpu_per_step_ms": on["telemetry_cpu_per_step_ms"],
        "exports_ok": on["pipeline"].get("exports_ok", 0),
        "exports_failed": on["pipeline"].get("exports_failed", 0),
        "dropped": on["pipeline"].get("dropped_overflow", 0),
    }


def check_targets(
    cells: dict[tuple[int, str], dict[str, Any]], comparisons: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Issues 12's and 22's targets against the figures: target, condition, verdict."""
    checks: list[dict[str, Any]] = []

    def check(target: str, condition: str, value: float | None, limit: float, text: str) -> None:
        holds = value is not None and value <= limit
        checks.append(
            {
                "target": target,
                "condition": condition,
                "value": value,
                "limit": limit,
                "holds": holds,
                "text": text,
            }
        )

    for c in comparisons:
        name = f"{c['rate']}/s {c['variant']}"
        on, off = cells[(c["rate"], c["variant"])], cells[(c["rate"], "off")]
        if c["rate"] == 100:
            check(
                "time lost at 100 steps/s <= 0.5 % of the run",
                name,
                on["lost_pct"],
                0.5,
                f"{on['lost_pct']:.2f} % on ({on['lost_ms']:.1f} ms), {off['lost_pct']:.2f} % off",
            )
        limit = {1: 0.1, 100: 0.5}.get(c["rate"])
        if limit is not None:  # issue 22's, on minus off
            check(
                f"time lost on minus off <= {limit} % at {c['rate']} steps/s",
                name,
                c["lost_pct_diff"],
                limit,
                f"{c['lost_pct_diff']:+.3f} % ({on['lost_pct']:.3f} % on, "
                f"{off['lost_pct']:.3f} % off)",
            )
        attributable = c["attributable_longest_ms"]
        check(
            "longest gap attributable to telemetry <= 1 ms",
            name,
            attributable or 0.0,
            1.0,
            f"{fmt_opt(attributable, '.2f', 'none')} ms (longest {on['longest_ms']:.2f} ms on, "
            f"{off['longest_ms']:.2f} ms off)",
        )
        if c["rate"] == 1:
            check(
                "at 1 step/s indistinguishable from off",
                name,
                attributable or 0.0,
                0.0,
                f"gaps {on['stolen']} on / {off['stolen']} off, lost {on['lost_ms']:.1f} / "
                f"{off['lost_ms']:.1f} ms; significantly more gaps up to "
                f"{fmt_opt(attributable, '.2f', 'none')} ms",
            )
            per_step = c["telemetry_cpu_per_step_ms"]
            check(
                "worker + exporter CPU per 1 s step <= 0.5 ms",
                name,
                per_step,
                0.5,
                f"{fmt_opt(per_step, '.2f', 'n/a')} ms (worker "
                f"{fmt_opt(c['worker_ms_per_s'], '.2f', 'n/a')}, exporter "
                f"{fmt_opt(c['exporter_ms_per_s'], '.2f', 'n/a')} ms/s)",
            )
    return checks


# ------------------------------------------------------------------ output

TITLE = "Stolen time: the training thread's gaps with telemetry off and on"
GAPS_HEADER = (
    "rate",
    "variant",
    "runs x s",
    "iter p50 µs",
    "gaps >0.2ms",
    "gaps >1ms",
    "lost ms",
    "lost %",
    "longest ms",
    "gap p50 µs",
    "gap p99 µs",
    "gap p99.9 µs",
    "GC ms (gen2)",
)
ON_HEADER = (
    "rate",
    "receiver",
    "gaps on-off",
    "gaps x off",
    "lost ms on-off",
    "lost % on-off",
    "lost x off",
    "longest on / off ms",
    "attributable ms",
    "worker ms/s",
    "exporter ms/s",
    "other threads ms/s",
    "telemetry CPU ms/step",
    "exports ok/failed",
    "dropped",
)


def gaps_rows(cells: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per rate and variant."""
    return [
        (
            f"{c['rate']}/s",
            c["variant"],
            f"{c['runs']} x {c['wall_s'] / c['runs']:.1f}",
            f"{c['iteration_p50_us']:.1f}",
            str(c["stolen"]),
            str(c["stolen_over_1ms"]),
            f"{c['lost_ms']:.1f}",
            f"{c['lost_pct']:.3f}",
            f"{c['longest_ms']:.2f}",
            f"{c['gap_us']['p50']:.0f}",
            f"{c['gap_us']['p99']:.0f}",
            f"{c['gap_us']['p99.9']:.0f}",
            f"{c['gc']['ms']:.1f} ({c['gc']['gen2']})",
        )
        for c in cells
    ]


def on_rows(comparisons: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per on cell, against off at the same rate."""
    return [
        (
            f"{c['rate']}/s",
            c["variant"],
            f"{c['stolen_diff']:+.0f}",
            fmt_opt(c["stolen_ratio"], ".1f", "-"),
            f"{c['lost_ms_diff']:+.1f}",
            f"{c['lost_pct_diff']:+.3f}",
            fmt_opt(c["lost_ratio"], ".1f", "-"),
            f"{c['longest_ms_on']:.2f} / {c['longest_ms_off']:.2f}",
            fmt_opt(c["attributable_longest_ms"], ".2f", "none"),
            fmt_opt(c["worker_ms_per_s"], ".2f", "n/a"),
            fmt_opt(c["exporter_ms_per_s"], ".2f", "n/a"),
            fmt_opt(c["other_threads_ms_per_s"], ".2f", "n/a"),
            fmt_opt(c["telemetry_cpu_per_step_ms"], ".3f", "n/a"),
            f"{c['exports_ok']}/{c['exports_failed']}",
            str(c["dropped"]),
        )
        for c in comparisons
    ]


def target_rows(checks: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per target and condition."""
    return [
        (c["target"], c["condition"], "holds" if c["holds"] else "MISSED", c["text"])
        for c in checks
    ]


def _method(report: dict[str, Any]) -> str:
    cfg = report["config"]
    unit = cfg["unit"]
    return (
        f"{cfg['rounds']} interleaved round{'s' if cfg['rounds'] != 1 else ''}; per round "
        "and rate, off, healthy and stalled (rotated), each a child process measuring "
        f"{cfg['seconds']:g} s after "
        f"{cfg['warmup_s']:g} s of warm-up. The training thread repeats a unit of "
        f"pure-Python work ({unit['iterations']} iterations of `busy`, calibrated: p50 "
        f"{unit['ns'] / 1000:.1f} µs, fastest {unit['min_ns'] / 1000:.1f} µs) and tees the "
        'fixture\'s `train` (68 keys) and `""` dicts `rate` times a second. A gap: one '
        "iteration's end-to-end time minus the unit's p50; over 0.2 ms it is stolen. "
        "`lost`: the stolen gaps summed, over the measured wall time; gap percentiles over "
        "all iterations (1 µs histogram). On against off at the same rate (counts scaled to "
        "the same wall time); `attributable`: the longest gap length at which the on runs "
        "have more gaps of at least that length than off by over 2 sigma (Poisson). CPU: "
        "the threads' CPU clocks over the window; `other threads`: process minus training, "
        "worker and exporter. Switch interval "
        f"{cfg['switch_interval_s'] * 1000:g} ms."
    )


def section(report: dict[str, Any]) -> list[str]:
    """The gaps table, the on-against-off table and the targets, as markdown lines."""
    return [
        _method(report),
        "",
        *md_table(GAPS_HEADER, gaps_rows(report["cells"])),
        "",
        "Telemetry on against off at the same rate:",
        "",
        *md_table(ON_HEADER, on_rows(report["comparisons"])),
        "",
        "Targets (issues 12 and 22; printed, not asserted):",
        "",
        *md_table(("target", "condition", "verdict", "figures"), target_rows(report["targets"])),
    ]


def console(report: dict[str, Any]) -> list[str]:
    """The three tables for stdout."""
    unit = report["config"]["unit"]
    return [
        f"Training-thread gaps (unit {unit['iterations']} iterations, p50 "
        f"{unit['ns'] / 1000:.1f} µs; stolen: gap > 0.2 ms)",
        *text_table(GAPS_HEADER, gaps_rows(report["cells"])),
        "",
        "Telemetry on against off at the same rate",
        *text_table(ON_HEADER, on_rows(report["comparisons"])),
        "",
        "Targets (issues 12 and 22; printed, not asserted)",
        *text_table(("target", "condition", "verdict", "figures"), target_rows(report["targets"])),
    ]


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--seconds", type=float, default=None, help="measured seconds a run")
    parser.add_argument("--warmup-s", type=float, default=None, help="warm-up seconds a run")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    parser.add_argument("--rates", default=None, help="teed steps a second, comma-separated")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:  # a child writes nothing: it prints its run's JSON
        return args
    return parse_bench_args(parser, "stolen", argv)


def make_config(args: argparse.Namespace) -> Config:
    """Full: 2 rounds of 7 s runs at 1, 10, 100 steps/s; quick: 1 round of 1 s at 100."""
    if args.rates:
        rates = tuple(int(r) for r in args.rates.split(","))
    else:
        rates = QUICK_RATES if args.quick else RATES
    return Config(
        quick=args.quick,
        rates=rates,
        rounds=args.rounds or (1 if args.quick else 2),
        seconds=args.seconds or (1.0 if args.quick else 7.0),
        warmup_s=args.warmup_s or (0.3 if args.quick else 1.0),
        unit=calibrate_unit(),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(run_child(json.loads(args.child))), flush=True)
        return 0
    quiet_logging()
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        ports = {
            "healthy": start_receiver(stack).port,
            "stalled": start_receiver(stack, stall=True).port,
        }
        cfg = make_config(args)  # calibrated once the receivers have started
        progress(f"unit: {cfg.unit.iterations} iterations, p50 {cfg.unit.ns / 1000:.1f} µs")
        runs = run_rounds(cfg, ports)
    by_cell: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for run in runs:
        by_cell.setdefault((run["rate"], run["variant"]), []).append(run)
    cells = {
        (rate, variant): summarise_cell(by_cell[(rate, variant)])
        for rate in cfg.rates
        for variant in VARIANTS
    }
    comparisons = [
        compare(cells[(rate, variant)], cells[(rate, "off")])
        for rate in cfg.rates
        for variant in ON_VARIANTS
    ]
    report: dict[str, Any] = {
        "machine": machine_info(),
        "config": {
            "quick": cfg.quick,
            "rates": list(cfg.rates),
            "rounds": cfg.rounds,
            "seconds": cfg.seconds,
            "warmup_s": cfg.warmup_s,
            "variants": list(VARIANTS),
            "unit": asdict(cfg.unit),
            "stolen_threshold_ms": STOLEN_NS / 1e6,
            "export_interval_ms": EXPORT_INTERVAL_MS,
            "min_export_interval_s": DEFAULT_MIN_EXPORT_INTERVAL_S,
            "otlp_timeout_s": OTLP_TIMEOUT_S,
            "switch_interval_s": sys.getswitchinterval(),  # run_all drops "machine"
            "calls_per_step": [
                [prefix, len(metrics), finished] for metrics, prefix, finished in step_calls()
            ],
        },
        "cells": list(cells.values()),
        "comparisons": comparisons,
        "targets": check_targets(cells, comparisons),
    }
    report["duration_s"] = time.perf_counter() - started
    publish(args.out, report, TITLE, section(report), console(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Training-loop overhead: step time with and without async_tee, healthy and stalled exporter.

Usage: ``python benchmarks/bench_overhead.py [--rounds N] [--quick] [--out PATH]``

A simulated step loop: each step does pure-Python CPU work of a nominal length (1 ms,
10 ms, 100 ms, 1 s; the iteration count is calibrated once, at the start, and is the same
for every variant), then makes the realistic calls of one step (SEMANTICS section 1):
sync GRPO's ``train`` (the 22 rollout keys), ``train`` (the full 68-key dict),
``performance``, the async runs' efficiency dict (prefix ``""``), then ``timing/train``,
all from ``tests/fixtures/grpo_step.json``. A step's time is one ``perf_counter_ns`` pair
around the work and the calls.

Variants: ``bare`` (the same loop without the tee calls), ``healthy`` (the real pipeline
exporting every second over OTLP/HTTP to an ``OtlpSink`` in another process) and
``stalled`` (the same, the receiver stalling every export; the exporter times out after
1 s). Each round takes every step length in turn (rotated per round) and runs the three
variants back to back (also rotated), one block each of about ``--block-s`` seconds of
steps (at least 2 steps; 2 s by default, so a block spans an export), each with a fresh
pipeline. Blocks compared with each other are seconds apart, so the machine's drift
(±40 % here) mostly cancels in the per-round ratios.

Overhead: per round and step length, a variant's mean step time over ``bare``'s mean in
the same round; the figure reported is the median of those per-round ratios (mean step
time, because the worker's cost lands on a few steps, which is what total training time
pays; the same from block p50s is reported beside it). The worker's CPU per step is the
``async-tee-worker`` thread's own CPU time (``pthread_getcpuclockid``) over the block,
after a flush, divided by the block's steps; the exporter thread's is reported per second.
At 1 s steps a round holds two steps: its overhead is below what this machine's drift
lets a few seconds of steps resolve, and is reported as measured.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from statistics import mean, median
from time import perf_counter_ns
from typing import Any

from _common import (
    SHUTDOWN_S,
    Session,
    bench_parser,
    find_call,
    fmt_opt,
    machine_info,
    md_table,
    parse_bench_args,
    pipeline,
    progress,
    publish,
    quiet_logging,
    rotated,
    start_receiver,
    text_table,
    thread_cpu_ns,
)

import async_tee

STEP_LENGTHS_MS = (1, 10, 100, 1000)
QUICK_STEP_LENGTHS_MS = (1, 10, 100)
VARIANTS = ("bare", "healthy", "stalled")
WORKER = "async-tee-worker"
EXPORTER = "async-tee-export"

# ------------------------------------------------------------------ the simulated step


def busy(iterations: int) -> int:
    """Pure-Python CPU work: arithmetic and a small dict, as a trainer's Python would do."""
    acc = 0
    table: dict[int, int] = {}
    for i in range(iterations):
        acc += i * i % 7
        if not i & 63:
            table[i & 1023] = acc
    return acc + len(table)


def calibrate(probe: int = 200_000, tries: int = 7) -> float:
    """Iterations of ``busy`` per millisecond, from the fastest of ``tries`` probes."""
    best = min(_time_ns(busy, probe) for _ in range(tries))
    return probe / (best / 1e6)


def _time_ns(fn: Any, arg: Any) -> int:
    t0 = perf_counter_ns()
    fn(arg)
    return perf_counter_ns() - t0


def step_calls() -> list[tuple[str, dict[str, Any]]]:
    """One step's tee calls, in the order a sync-GRPO trainer (plus efficiency) makes them."""
    return [
        ("train", find_call("train", 22)),
        ("train", find_call("train", 68)),
        ("performance", find_call("performance")),
        ("", find_call("")),
        ("timing/train", find_call("timing/train")),
    ]


def run_steps(
    iterations: int, steps: int, calls: list[tuple[str, dict[str, Any]]], first: int
) -> list[int]:
    """Time ``steps`` steps of work plus the calls; returns each step's nanoseconds."""
    tee = async_tee.tee_rl_metrics_to_otel
    pc = perf_counter_ns
    out = []
    for step in range(first, first + steps):
        t0 = pc()
        busy(iterations)
        for prefix, metrics in calls:
            tee(metrics, prefix, step)
        out.append(pc() - t0)
    return out


# ------------------------------------------------------------------ blocks


@dataclass
class Config:
    """The run's sizes and the calibrated work rate."""

    lengths_ms: tuple[int, ...]
    rounds: int
    block_s: float
    per_ms: float
    calls: list[tuple[str, dict[str, Any]]]
    next_step: int = 1  # steps never repeat: counter deltas count once per step


@dataclass
class Block:
    """One variant's block at one step length."""

    variant: str
    length_ms: int
    round_: int
    step_ns: list[int]
    cpu_ns: int
    worker_cpu_ns: int | None
    exporter_cpu_ns: int | None
    wall_ns: int
    stats: dict[str, int] = field(default_factory=dict)


@contextlib.contextmanager
def variant_context(variant: str, ports: dict[str, int]) -> Iterator[Session | None]:
    """No telemetry for ``bare``; a fresh pipeline to the named receiver otherwise."""
    if variant == "bare":
        yield None
        return
    with pipeline(ports[variant]) as running:
        yield running


def _cpu(running: Session | None, name: str) -> int | None:
    thread = running.thread(name) if running else None
    return thread_cpu_ns(thread) if thread else None


def _delta(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def _counts() -> dict[str, int]:
    stats = async_tee.stats()
    return {
        "enqueued": stats["enqueued"],
        "recorded": stats["recorded"],
        "overflow": stats["dropped_by_reason"]["overflow"],
    }


def run_block(
    variant: str,
    running: Session | None,
    length_ms: int,
    round_: int,
    cfg: Config,
) -> Block:
    """Warm up, time one block of steps, flush, and take the CPU and pipeline figures."""
    calls = [] if running is None else cfg.calls
    iterations = round(cfg.per_ms * length_ms)
    steps = max(2, round(cfg.block_s * 1000 / length_ms))
    run_steps(iterations, 1, calls, cfg.next_step)
    cfg.next_step += 1
    async_tee.flush(SHUTDOWN_S)
    counts = _counts() if running else {}
    cpu, worker, exporter = time.process_time_ns(), _cpu(running, WORKER), _cpu(running, EXPORTER)
    wall = perf_counter_ns()
    step_ns = run_steps(iterations, steps, calls, cfg.next_step)
    cfg.next_step += steps
    async_tee.flush(SHUTDOWN_S)
    after = _counts() if running else {}
    return Block(
        variant,
        length_ms,
        round_,
        step_ns,
        time.process_time_ns() - cpu,
        _delta(_cpu(running, WORKER), worker),
        _delta(_cpu(running, EXPORTER), exporter),
        perf_counter_ns() - wall,
        {key: after[key] - counts[key] for key in after},
    )


def run_all(cfg: Config, ports: dict[str, int]) -> list[Block]:
    """Per round, every step length (rotated) and, back to back, every variant (rotated)."""
    blocks = []
    for round_ in range(cfg.rounds):
        for length_ms in rotated(cfg.lengths_ms, round_, cfg.rounds):
            for variant in rotated(VARIANTS, round_, cfg.rounds):
                with variant_context(variant, ports) as running:
                    block = run_block(variant, running, length_ms, round_, cfg)
                blocks.append(block)
                progress(
                    f"[{round_ + 1}/{cfg.rounds}] {length_ms:>5} ms steps, {variant:<8}: "
                    f"n={len(block.step_ns):>5} mean={mean(block.step_ns) / 1e6:9.3f} ms"
                )
    return blocks


# ------------------------------------------------------------------ summaries


def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))] / 1e6


def _ratio_overhead(
    blocks: list[Block], base: list[Block], stat: Any
) -> tuple[float | None, list[float]]:
    """Median over rounds of stat(variant block) / stat(bare block) - 1, in percent."""
    by_round = {b.round_: stat(b.step_ns) for b in base}
    pcts = [
        100 * (stat(b.step_ns) / by_round[b.round_] - 1) for b in blocks if b.round_ in by_round
    ]
    return (median(pcts) if pcts else None), pcts


def _per_step_us(total_ns: int | None, steps: int) -> float | None:
    return None if total_ns is None else total_ns / steps / 1000


def summarise(blocks: list[Block], variant: str, length_ms: int) -> dict[str, Any]:
    """Step-time percentiles, overheads against ``bare`` and CPU per step, for one cell."""
    mine = [b for b in blocks if b.variant == variant and b.length_ms == length_ms]
    base = [b for b in blocks if b.variant == "bare" and b.length_ms == length_ms]
    steps = [ns for b in mine for ns in b.step_ns]
    n = len(steps)
    over_mean, per_round = _ratio_overhead(mine, base, mean)
    over_p50, _ = _ratio_overhead(mine, base, median)
    bare_cpu = sum(b.cpu_ns for b in base) / max(1, sum(len(b.step_ns) for b in base))
    workers = [b.worker_cpu_ns for b in mine]
    exporters = [b.exporter_cpu_ns for b in mine]
    wall_s = sum(b.wall_ns for b in mine) / 1e9
    threads_ns = None if None in workers or None in exporters else sum(workers + exporters)  # type: ignore[arg-type]
    bare_mean_ns = mean(ns for b in base for ns in b.step_ns) if base else None
    return {
        "variant": variant,
        "step_ms": length_ms,
        "steps": n,
        "p50_ms": _pct(steps, 0.5),
        "p99_ms": _pct(steps, 0.99),
        "max_ms": max(steps) / 1e6,
        "mean_ms": mean(steps) / 1e6,
        "overhead_pct_mean": over_mean,
        "overhead_pct_p50": over_p50,
        "overhead_pct_by_round": per_round,
        "process_cpu_per_step_us": sum(b.cpu_ns for b in mine) / n / 1000,
        "pipeline_cpu_per_step_us": (sum(b.cpu_ns for b in mine) / n - bare_cpu) / 1000,
        "worker_cpu_per_step_us": _per_step_us(
            None if None in workers else sum(w for w in workers if w is not None), n
        ),
        "exporter_cpu_ms_per_s": (
            None
            if None in exporters or not wall_s
            else sum(e for e in exporters if e is not None) / wall_s / 1e6
        ),
        "threads_cpu_pct_of_step": (
            None if threads_ns is None or not bare_mean_ns else 100 * threads_ns / n / bare_mean_ns
        ),
        "dicts_teed_per_step": sum(b.stats.get("enqueued", 0) for b in mine) / n,
        "dropped": sum(b.stats.get("overflow", 0) for b in mine),
    }


def summarise_all(blocks: list[Block], cfg: Config) -> list[dict[str, Any]]:
    """One cell per step length and variant, in that order."""
    return [summarise(blocks, v, length) for length in cfg.lengths_ms for v in VARIANTS]


TITLE = "Training-loop overhead of async_tee"
TABLE_HEADER = (
    "step",
    "variant",
    "steps",
    "p50 ms",
    "p99 ms",
    "mean ms",
    "overhead % (mean)",
    "overhead % (p50)",
    "worker CPU µs/step",
    "exporter CPU ms/s",
    "threads CPU % of step",
    "dropped",
)


def table_rows(cells: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per cell; overheads are medians over rounds of ratios to ``bare``."""
    return [
        (
            f"{c['step_ms']} ms",
            c["variant"],
            str(c["steps"]),
            f"{c['p50_ms']:.3f}",
            f"{c['p99_ms']:.3f}",
            f"{c['mean_ms']:.3f}",
            "" if c["variant"] == "bare" else fmt_opt(c["overhead_pct_mean"], "+.2f"),
            "" if c["variant"] == "bare" else fmt_opt(c["overhead_pct_p50"], "+.2f"),
            fmt_opt(c["worker_cpu_per_step_us"], ".1f"),
            fmt_opt(c["exporter_cpu_ms_per_s"], ".2f"),
            fmt_opt(c["threads_cpu_pct_of_step"], ".3f"),
            "" if c["variant"] == "bare" else str(c["dropped"]),
        )
        for c in cells
    ]


def section(report: dict[str, Any]) -> list[str]:
    """The overhead table as markdown lines (no title)."""
    cfg = report["config"]
    return [
        f"{cfg['rounds']} interleaved rounds; per round and step length one block of about "
        f"{cfg['block_s']} s of steps per variant (at least 2 steps). Each step: pure-Python "
        f"work ({cfg['iterations_per_ms']:.0f} iterations/ms, calibrated), then "
        f'{cfg["calls_per_step"]} tee calls (two `train`, `performance`, `""`, '
        "`timing/train`; three are teed). Overhead: median over rounds of the variant's "
        "block mean (or p50) over `bare`'s in the same round. Worker CPU: the "
        "`async-tee-worker` thread's CPU time per step; exporter CPU: the `async-tee-export` "
        "thread's per second; threads CPU: both per step over `bare`'s mean step, the "
        "share of the step they take (drift-proof, unlike the wall-clock overhead).",
        "",
        *md_table(TABLE_HEADER, table_rows(report["cells"])),
    ]


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    parser.add_argument("--block-s", type=float, default=None, help="seconds of steps a block")
    return parse_bench_args(parser, "overhead", argv)


def make_config(args: argparse.Namespace) -> Config:
    """Full: 4 rounds of 2 s blocks at 1 ms-1 s; quick: 2 rounds of 0.2 s at 1-100 ms."""
    lengths = QUICK_STEP_LENGTHS_MS if args.quick else STEP_LENGTHS_MS
    rounds = args.rounds or (2 if args.quick else 4)
    block_s = args.block_s or (0.2 if args.quick else 2.0)
    return Config(lengths, rounds, block_s, calibrate(), step_calls())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_logging()
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        ports = {
            "healthy": start_receiver(stack).port,
            "stalled": start_receiver(stack, stall=True).port,
        }
        cfg = make_config(args)  # calibrated once the receivers have started
        blocks = run_all(cfg, ports)
    cells = summarise_all(blocks, cfg)
    report = {
        "machine": machine_info(),
        "config": {
            "quick": args.quick,
            "rounds": cfg.rounds,
            "block_s": cfg.block_s,
            "step_lengths_ms": list(cfg.lengths_ms),
            "iterations_per_ms": cfg.per_ms,
            "calls_per_step": len(cfg.calls),
            "call_prefixes": [prefix for prefix, _ in cfg.calls],
            "call_keys": [len(metrics) for _, metrics in cfg.calls],
        },
        "cells": cells,
        "duration_s": time.perf_counter() - started,
    }
    console = ["Step time with and without async_tee", *text_table(TABLE_HEADER, table_rows(cells))]
    publish(args.out, report, TITLE, section(report), console)
    return 0


if __name__ == "__main__":
    sys.exit(main())

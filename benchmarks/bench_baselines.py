"""What a user's logging call costs the caller instead: async_tee against the alternatives.

Usage: ``python benchmarks/bench_baselines.py [--calls N] [--blocks N] [--quick] [--out PATH]``

Same dict (the fixture's 68-key ``train`` dict), same timer, same compiled loop as
``bench_caller.py`` (``_blocks.py``): one call between two ``perf_counter_ns()`` reads,
back to back, every sample kept. Variants, each set up afresh per block and interleaved
in rotated rounds with the others:

- ``floor``: ``deque(maxlen=1024).append(dict(d))``, the least any snapshot-and-queue costs;
- ``tee``: ``async_tee.tee_rl_metrics_to_otel`` with the real pipeline exporting over
  OTLP/gRPC to a healthy receiver in another process (blocks last at least 2.2 export
  intervals, as in ``bench_caller.py``);
- ``inline``: the synchronous tee (the seed's shape: map and record on the caller);
- ``otel_logs``: OTel's own BatchProcessor-style emit, driven directly:
  ``Logger.emit(body=dict(d))`` on an SDK ``LoggerProvider`` with a
  ``BatchLogRecordProcessor`` (default settings: 2,048-record drop-oldest queue, 512-record
  batches) in front of a no-op exporter, so no serialisation cost lands anywhere; one log
  record per dict, copied like the tee's snapshot;
- ``statsd``: a DogStatsD-style gauge per numeric key, ``"key:value|g"`` sent with one
  ``send`` on a connected UDP socket to a loopback port nobody reads (datadogpy's default,
  unbuffered client sends one datagram per metric);
- ``tensorboardX``: ``SummaryWriter.add_scalar(key, value, step)`` for every numeric key
  (a user logs every scalar); a fresh writer per block, closed after the block;
- ``mlflow``: ``mlflow.log_metrics(numeric, step=i, synchronous=False)`` into a local file
  store in a temp dir (``file://``; MLflow 3 needs ``MLFLOW_ALLOW_FILE_STORE=true`` for it);
  a fresh run per block, ended after the block.

MLflow rejects lists and dicts and tensorboardX and statsd take only scalars, so those
three keep the 64 numeric keys (``int``/``float``, not ``bool``) **inside** the timed call,
as a user would have to. tensorboardX, statsd and MLflow are much slower than the others,
so they get 2 %, 10 % and 1 % of the calls (``--calls`` 100,000: 2,000, 10,000 and 1,000).
What happens after a block is timed too and reported as ``drain_s`` (closing the writer,
ending the MLflow run: both wait for their background threads to write what the caller
queued). Nothing is tuned for any variant. A variant whose package is missing is skipped
with the reason printed; ``pip install '.[bench-full]'`` installs them all.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from _blocks import (
    FLOOR,
    HEALTHY_B2B,
    INLINE,
    LATENCY_HEADER,
    TIMER,
    WARMUP_CALLS,
    Condition,
    Env,
    Plan,
    Target,
    add_ratios,
    latency_rows,
    missing_requirement,
    run_rounds,
    runnable,
    summarise,
)
from _common import (
    EXPORT_INTERVAL_MS,
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


def numeric(d: dict[str, Any]) -> dict[str, Any]:
    """The scalar keys MLflow, tensorboardX and statsd accept (a user filters like this)."""
    return {k: v for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@contextlib.contextmanager
def timed_teardown(target: Target) -> Iterator[None]:
    """Record how long the block's teardown (a drain, a close) took, as ``drain_s``."""
    started = time.perf_counter()
    try:
        yield
    finally:
        target.info["drain_s"] = time.perf_counter() - started


# ------------------------------------------------------------------ OTel logs


def _noop_log_exporter() -> Any:
    """An SDK log exporter that accepts every batch and does nothing with it."""
    from opentelemetry.sdk._logs import export

    base = getattr(export, "LogRecordExporter", None) or export.LogExporter
    result = getattr(export, "LogRecordExportResult", None) or export.LogExportResult

    class NoopExporter(base):  # type: ignore[misc, valid-type]
        def export(self, batch: Any) -> Any:
            return result.SUCCESS

        def shutdown(self) -> None:
            return None

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return True

    return NoopExporter()


@contextlib.contextmanager
def otel_logs(env: Env) -> Iterator[Target]:
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

    provider = LoggerProvider(shutdown_on_exit=False)
    provider.add_log_record_processor(BatchLogRecordProcessor(_noop_log_exporter()))
    target = Target(provider.get_logger("bench").emit, dict)
    try:
        yield target
    finally:
        with timed_teardown(target):
            provider.shutdown()


# ------------------------------------------------------------------ statsd


@contextlib.contextmanager
def statsd(env: Env) -> Iterator[Target]:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    sender.connect(receiver.getsockname())
    send = sender.send

    def gauges(d: dict[str, Any]) -> None:
        for key, value in numeric(d).items():
            send(f"{key}:{value}|g".encode())

    try:
        yield Target(gauges, dict)
    finally:
        sender.close()
        receiver.close()


# ------------------------------------------------------------------ tensorboardX


@contextlib.contextmanager
def tensorboardx(env: Env) -> Iterator[Target]:
    from tensorboardX import SummaryWriter

    with tempfile.TemporaryDirectory(prefix="bench-tbx-") as logdir:
        writer = SummaryWriter(logdir=logdir)
        add_scalar = writer.add_scalar

        def add_all(d: dict[str, Any], step: int) -> None:
            for key, value in numeric(d).items():
                add_scalar(key, value, step)

        target = Target(add_all)
        try:
            yield target
        finally:
            with timed_teardown(target):
                writer.close()


# ------------------------------------------------------------------ MLflow


def _quiet_mlflow() -> None:
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 refuses file stores otherwise
    for category in (FutureWarning, DeprecationWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category, module="mlflow")


@contextlib.contextmanager
def mlflow_run(env: Env) -> Iterator[Target]:
    _quiet_mlflow()
    import mlflow

    with tempfile.TemporaryDirectory(prefix="bench-mlflow-") as root:
        mlflow.set_tracking_uri(Path(root, "mlruns").as_uri())
        mlflow.start_run()
        log_metrics = mlflow.log_metrics

        def log(d: dict[str, Any], step: int) -> None:
            log_metrics(numeric(d), step=step, synchronous=False)

        target = Target(log)
        try:
            yield target
        finally:
            with timed_teardown(target):
                mlflow.end_run()


# ------------------------------------------------------------------ variants

VARIANTS: tuple[Condition, ...] = (
    FLOOR,
    replace(HEALTHY_B2B, label="async_tee tee, healthy receiver"),
    INLINE,
    Condition(
        "otel_logs",
        "OTel logs: Logger.emit, BatchLogRecordProcessor",
        otel_logs,
        "emit_body",
        kind="baseline",
        requires="opentelemetry.sdk._logs",
        note="no-op exporter",
    ),
    Condition(
        "statsd",
        "statsd: UDP send per numeric key",
        statsd,
        "copy_put",
        kind="baseline",
        calls_share=0.1,
        note="64 datagrams/dict",
    ),
    Condition(
        "tensorboardx",
        "tensorboardX: add_scalar per numeric key",
        tensorboardx,
        "with_step",
        kind="baseline",
        calls_share=0.02,
        requires="tensorboardX",
        note="64 scalars/dict",
    ),
    Condition(
        "mlflow",
        "MLflow: log_metrics(synchronous=False)",
        mlflow_run,
        "with_step",
        kind="baseline",
        calls_share=0.01,
        requires="mlflow",
        note="file store",
    ),
    TIMER,
)

# ------------------------------------------------------------------ output

TITLE = "Caller cost per dict: async_tee and the alternatives"
TABLE_HEADER = (*LATENCY_HEADER, "drain s/block", "note")


def _extra(row: dict[str, Any]) -> str:
    drain = row["pipeline"].get("drain_s")
    return "" if drain is None else f"{drain / row['blocks']:.3f}"


def table_rows(results: dict[str, dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per variant, with its teardown (drain) time per block and a note."""
    return [
        (*cells, row["note"])
        for cells, row in zip(latency_rows(results, _extra), results.values(), strict=True)
    ]


def section(report: dict[str, Any]) -> list[str]:
    """The baselines table as markdown lines (no title)."""
    skipped = report["skipped"]
    lines = [
        f"Back to back, {report['config']['blocks']} interleaved blocks per variant, same "
        "68-key dict and timer. Times in µs per dict; `x floor` and `x inline` use the "
        "median of block p50s and this run's floor and inline rows. MLflow, tensorboardX "
        "and statsd filter the 64 numeric keys inside the timed call and get fewer calls "
        "(`n`). `drain s/block`: the teardown after a block (ending the MLflow run, "
        "closing the writer) waiting for what the caller queued.",
        "",
        *md_table(TABLE_HEADER, table_rows(report["variants"])),
    ]
    if skipped:
        lines += ["", "Skipped: " + "; ".join(f"{k} ({v})" for k, v in skipped.items()) + "."]
    return lines


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(__doc__)
    parser.add_argument("--calls", type=int, default=None, help="calls per fast variant")
    parser.add_argument("--blocks", type=int, default=None, help="interleaved rounds")
    return parse_bench_args(parser, "baselines", argv)


def make_plan(args: argparse.Namespace) -> Plan:
    """Full: 100,000 calls per fast variant, 5 blocks; quick: 3,000 calls, 3 blocks."""
    calls = args.calls or (3_000 if args.quick else 100_000)
    blocks = args.blocks or (3 if args.quick else 5)
    min_block_s = 0.0 if args.quick else 2.2 * EXPORT_INTERVAL_MS / 1000
    return Plan(blocks, calls, calls, min_block_s)


def skipped_reasons(variants: tuple[Condition, ...]) -> dict[str, str]:
    """The variants ``runnable`` left out, with why."""
    return {c.key: missing_requirement(c) or "" for c in VARIANTS if c not in variants}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args)
    quiet_logging()
    started = time.perf_counter()
    variants = runnable(VARIANTS)
    with contextlib.ExitStack() as stack:
        env = Env(load_train_dict(), {"healthy": start_receiver(stack).port})
        blocks = run_rounds(variants, env, plan)
    results = {c.key: summarise(c, blocks[c.key]) for c in variants}
    add_ratios(results)
    report: dict[str, Any] = {
        "machine": machine_info(),
        "config": {
            "quick": args.quick,
            "blocks": plan.blocks,
            "calls_per_fast_variant": plan.calls,
            "calls": {c.key: plan.block_calls(c) * plan.blocks for c in variants},
            "warmup_calls": WARMUP_CALLS,
            "min_block_s_with_pipeline": plan.min_block_s,
            "numeric_keys": len(numeric(env.d)),
            "dict_keys": len(env.d),
        },
        "variants": results,
        "skipped": skipped_reasons(variants),
        "duration_s": time.perf_counter() - started,
    }
    table = text_table(TABLE_HEADER, table_rows(results))
    console = ["Caller cost per dict, µs (back to back)", *table]
    publish(args.out, report, TITLE, section(report), console)
    return 0


if __name__ == "__main__":
    sys.exit(main())

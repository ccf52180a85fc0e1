"""Caller latency per dict: the tee in 9 conditions, and what users pick instead, in one run.

Usage: ``python benchmarks/bench_latency.py [--calls N] [--blocks N] [--quick] [--out PATH]``
(``run_all.py`` runs it as part of the whole suite and keeps its two reports as the
``caller`` and ``baselines`` parts of ``results/latest.json``; run alone, it writes its JSON
and markdown to a temp dir unless ``--out`` is given).

What is timed: one call with the fixture's 68-key ``train`` dict
(``tests/fixtures/grpo_step.json``), bracketed by two ``perf_counter_ns()`` reads. The
statement is compiled into its own loop (as ``timeit`` does), so no wrapper call is
timed; the cost of an empty timer pair is measured the same way and reported. Every
sample is kept (``array('q')``, folded into an exact histogram per block), and p50, p90,
p99, p99.9 and max are reported, never means. The timed loops, blocks and interleaving
live in ``_blocks.py``.

The pipeline is the real one: ``start_telemetry`` builds the session, the worker drains on
its own timer, and async_tee's exporting thread sends OTLP/HTTP to an ``OtlpSink`` in
another process (``_receiver.py``), so the receiver's work never shares this process's GIL.
Every call carries a new step, so step-aligned export is exercised at its bound: the worker
builds a step's request and queues it at most once per ``ASYNC_TEE_MIN_EXPORT_INTERVAL``
(1 s), the rest folded, beside the 1,000 ms period. Blocks of a pipeline condition last at
least 2.2 export intervals, so every block overlaps an export, and against a stalled or
black-holed receiver at least one send times out (1 s) inside the measured window, its
request kept in the export backlog and sent again with backoff.

**The caller table.** Conditions: healthy receiver at trainer pace (one call per 2 ms,
sleeping in between: the GIL is released as a trainer waiting on its GPU would) and back
to back; a stalled receiver (back to back and at trainer pace); a stalled receiver with the
export backlog at its bound (``ASYNC_TEE_EXPORT_BACKLOG_BYTES``' default, 64 MiB: filled with
the session's own requests before the block, ``Pipeline.flush_and_export(0)`` until the
oldest start to go, so every request queued in the block drops one); a black-hole endpoint; a
64-slot queue saturated back to back; a second Python thread spinning (GIL contention);
calls from a coroutine inside ``asyncio.run`` (which awaits ``asyncio.sleep(0)`` after
every 1,000 calls); and telemetry off (never started). Baselines, with the same dict and
timer: the floor ``deque(maxlen=1024).append(dict(d))`` (back to back and at trainer pace:
cold caches change it), the worker's own ``RLRecorder.tee`` called on the caller (inline:
map and record synchronously), the seed's shape of it (map, then one SDK synchronous
instrument call per value), and a janus 2.0 queue with a drop-oldest wrapper drained by an
asyncio consumer thread (which does no work per item: the queue mechanism alone). Back to
back, the caller produces far faster than the worker records, so the queue overflows in
every back-to-back pipeline row, not only the saturated one; the ``dropped`` column counts
it; the ``backlog`` column gives the export backlog at the blocks' ends (the largest: requests
and MiB). The pipeline's CPU per dict is the process CPU time of a trainer-pace block with
telemetry on, minus the same loop with telemetry off, per call; the worker thread's own
CPU time (``pthread_getcpuclockid``) is reported beside it.

**The baselines table**: what a user's logging call costs the caller instead, back to
back, beside the floor, the tee on a healthy pipeline and the inline tee (the same rows
as in the caller table):

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
  a fresh run per block, ended after the block;
- ``wandb``: ``run.log(d, step=i)`` on a W&B run in offline mode (``WANDB_MODE=offline``,
  ``WANDB_SILENT=true``, ``WANDB_DIR`` and its config, cache and data dirs in a temp dir:
  nothing leaves the machine), the whole dict (W&B takes lists and nested dicts), as a
  trainer's ``wandb.log(metrics, step=step)``; a fresh run per block, ``run.finish()``
  after it, then ``wandb.teardown()`` (untimed) stops the ``wandb-core`` service process
  that ``wandb.init`` starts, so it does not run beside the other rows.

MLflow rejects lists and dicts and tensorboardX and statsd take only scalars, so those
three keep the 64 numeric keys (``int``/``float``, not ``bool``) **inside** the timed call,
as a user would have to. tensorboardX, statsd and MLflow are much slower than the others,
so they get 2 %, 10 % and 1 % of the calls (``--calls`` 100,000: 2,000, 10,000 and 1,000),
W&B 2 % (2,000). What happens after a block is timed too and reported as ``drain_s``
(closing the writer, ending the MLflow or W&B run: they wait for their background threads,
or W&B's service process, to write what the caller queued). Nothing is tuned for any
variant. A row whose package is missing is skipped with the reason printed;
``pip install '.[bench-full]'`` installs them all, and they are imported before the first
round, so every round runs with the same modules loaded.

Sizes: ``--calls`` (100,000 by default) per back-to-back row, ``--calls // 5`` per
trainer-pace row (20,000, i.e. 40 s each); pipeline rows run longer when a block needs it
to span the export intervals, so they hold more samples. ``--quick``: 3,000 calls, 3
blocks, no minimum block length: a smoke test, no figure to rely on.

The machine drifts, so every row of both tables runs interleaved with the others: each of
``--blocks`` rounds runs every row once, in a rotated order, each in a fresh setup (a
pipeline row: ``shutdown_telemetry(2)`` then ``testing.reset()`` after it). Reported:
pooled percentiles over all blocks and the median of the per-block p50s; ratios use this
run's floor and inline rows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
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
    missing_requirement,
    pipeline_setup,
    preload,
    run_rounds,
    runnable,
    summarise,
    tee_target,
)
from _common import (
    EXPORT_INTERVAL_MS,
    OTLP_TIMEOUT_S,
    bench_parser,
    load_train_dict,
    machine_info,
    md_table,
    package_versions,
    parse_bench_args,
    pipeline,
    publish,
    quiet_logging,
    start_receiver,
    text_table,
)

import async_tee
from async_tee._handoff import caller as _caller
from async_tee.sink import black_hole

SATURATED_QUEUE = 64

# ------------------------------------------------------------------ the tee's conditions


stalled = pipeline_setup("stalled")
BACKLOG_FILL_MAX = 100_000  # requests: the bound is reached long before (about 7,000)
into_black_hole = pipeline_setup("black_hole")
saturated = pipeline_setup("healthy", queue_size=SATURATED_QUEUE)


@contextlib.contextmanager
def stalled_full_backlog(env: Env) -> Iterator[Target]:
    """A stalled receiver, the export backlog filled to its bound before the block.

    Each ``flush_and_export(0)`` queues one export's request (built from the tables, as a
    step's is) and returns at once; past the bound the oldest requests go, counted.
    """
    with pipeline(env.ports["stalled"]) as running:
        handle = running.handle
        async_tee.tee_rl_metrics_to_otel(env.d, "train", 0)
        for made in range(BACKLOG_FILL_MAX):
            handle.flush_and_export(0.0)
            if made % 100 == 0 and async_tee.stats()["delivery"]["dropped"]["overflow"]:
                break
        else:
            raise RuntimeError(f"{BACKLOG_FILL_MAX} requests did not reach the backlog's bound")
        yield tee_target(running)


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
    if _caller.attached() is not None:
        raise RuntimeError("telemetry is still running")
    yield Target(async_tee.tee_rl_metrics_to_otel)


# ------------------------------------------------------------------ janus

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


# ------------------------------------------------------------------ what users pick instead


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


def _noop_log_exporter() -> Any:
    """An SDK log exporter that accepts every batch and does nothing with it."""
    from opentelemetry.sdk._logs import export

    # The exporter's names changed across SDK releases; take whichever this one has.
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


@contextlib.contextmanager
def tensorboardx(env: Env) -> Iterator[Target]:
    # tensorboardX ships no type information, and CI installs no bench-full extra.
    from tensorboardX import SummaryWriter  # type: ignore[import-untyped, import-not-found, unused-ignore]

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


def quiet_mlflow() -> None:
    """Let MLflow 3 use a file store, and keep its warnings off stderr."""
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 refuses file stores otherwise
    for category in (FutureWarning, DeprecationWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category, module="mlflow")


@contextlib.contextmanager
def mlflow_run(env: Env) -> Iterator[Target]:
    # mlflow is typed, but only the bench-full extra installs it (CI has the bench one).
    import mlflow  # type: ignore[import-not-found, unused-ignore]

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


WANDB_ENVIRON = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def quiet_wandb() -> None:
    """W&B offline and silent: no network, no login prompt, nothing on stdout."""
    os.environ.update(WANDB_ENVIRON)


@contextlib.contextmanager
def wandb_run(env: Env) -> Iterator[Target]:
    # wandb is typed, but only the bench-full extra installs it (CI has the bench one).
    import wandb  # type: ignore[import-not-found, unused-ignore]

    with tempfile.TemporaryDirectory(prefix="bench-wandb-") as root:
        dirs = ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")
        os.environ.update({**WANDB_ENVIRON, **dict.fromkeys(dirs, root)})
        run = wandb.init(project="async-tee-bench", dir=root, mode="offline")
        run_log = run.log

        def log(d: dict[str, Any], step: int) -> None:
            run_log(d, step=step)

        target = Target(log)
        try:
            yield target
        finally:
            try:
                with timed_teardown(target):
                    run.finish()
            finally:
                wandb.teardown()  # stop the wandb-core service before the next row


# ------------------------------------------------------------------ rows

CALLER_ROWS: tuple[Condition, ...] = (
    Condition("healthy_paced", "1 healthy, trainer pace", healthy, paced=True),
    HEALTHY_B2B,
    Condition("stalled", "3 stalled receiver", stalled),
    Condition("stalled_paced", "3' stalled receiver, trainer pace", stalled, paced=True),
    Condition("stalled_full", "3'' stalled, backlog at its bound", stalled_full_backlog),
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
ALTERNATIVES: tuple[Condition, ...] = (
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
    Condition(
        "wandb",
        "W&B: run.log (offline mode)",
        wandb_run,
        "with_step",
        kind="baseline",
        calls_share=0.02,
        requires="wandb",
        note="whole dict; wandb-core process",
    ),
)
ROWS = (*CALLER_ROWS, *ALTERNATIVES)
# The baselines table: the alternatives between the caller table's floor, tee and inline
# rows (measured once, in the same rounds) and its timer; the tee's row, relabelled.
BASELINE_KEYS = ("floor", "healthy_b2b", "inline", *(c.key for c in ALTERNATIVES), "timer")
BASELINE_LABELS = {"healthy_b2b": "async_tee tee, healthy receiver"}

# ------------------------------------------------------------------ caller summaries


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
            threads.get("async-tee-export", 0) / wall_s / 1e6 if wall_s else 0.0
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

CALLER_HEADER = (*LATENCY_HEADER, "dropped", "backlog")
BASELINES_HEADER = (*LATENCY_HEADER, "drain s/block", "note")


def _dropped(row: dict[str, Any]) -> str:
    dropped = row["pipeline"].get("overflow")
    return "" if dropped is None else str(dropped)


def _backlog(row: dict[str, Any]) -> str:
    backlog = row["pipeline"].get("backlog_max")
    if backlog is None:
        return ""
    return f"{backlog['queued']} ({backlog['queued_bytes'] / 2**20:.1f} MiB)"


def caller_rows(results: dict[str, dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per condition, with the dicts the full queue dropped and the export backlog."""
    return [
        (*cells, _backlog(row))
        for cells, row in zip(latency_rows(results, _dropped), results.values(), strict=True)
    ]


def _drain(row: dict[str, Any]) -> str:
    drain = row["pipeline"].get("drain_s")
    return "" if drain is None else f"{drain / row['blocks']:.3f}"


def baselines_rows(results: dict[str, dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per variant, with its teardown (drain) time per block and a note."""
    return [
        (*cells, row["note"])
        for cells, row in zip(latency_rows(results, _drain), results.values(), strict=True)
    ]


def cpu_lines(caller: dict[str, Any]) -> list[str]:
    """The worker-CPU figures, one ``name: value`` line each."""
    return [
        f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}"
        for key, value in caller["worker_cpu"].items()
    ]


def target_line(check: dict[str, Any]) -> str:
    verdict = "holds" if check["holds"] else "MISSED"
    return (
        f"{verdict:<6} {check['condition']:<14} {check['target']:<28} "
        f"{check['value']} (limit {check['limit']})"
    )


def caller_section(caller: dict[str, Any]) -> list[str]:
    """The caller table, targets and CPU figures as markdown lines (no title)."""
    timer_p50 = caller["conditions"]["timer"]["median_block_p50_us"]
    lines = [
        f"{caller['config']['blocks']} interleaved blocks per row. Times in µs, timer "
        f"included (empty pair p50 {timer_p50:.3f} µs). `p50 med` is the median of the "
        "per-block p50s; the ratios use it. Paced rows compare with the paced floor. "
        "`dropped`: dicts the full queue dropped during the measured windows; `backlog`: "
        "the export backlog at the blocks' ends (the largest), requests (MiB).",
        "",
        *md_table(CALLER_HEADER, caller_rows(caller["conditions"])),
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
                for c in caller["targets"]
            ),
        ),
        "",
        "### Pipeline CPU at trainer pace",
        "",
    ]
    return lines + [f"- {line}" for line in cpu_lines(caller)]


def baselines_section(baselines: dict[str, Any]) -> list[str]:
    """The baselines table as markdown lines (no title)."""
    skipped = baselines["skipped"]
    lines = [
        f"Back to back, {baselines['config']['blocks']} interleaved blocks per variant, same "
        "68-key dict and timer. Times in µs per dict; `x floor` and `x inline` use the "
        "median of block p50s and this run's floor and inline rows. MLflow, tensorboardX "
        "and statsd filter the 64 numeric keys inside the timed call and get fewer calls "
        "(`n`); W&B logs the whole dict (offline mode, its `wandb-core` service process "
        "beside). `drain s/block`: the teardown after a block (ending the MLflow or W&B "
        "run, closing the writer) waiting for what the caller queued.",
        "",
        *md_table(BASELINES_HEADER, baselines_rows(baselines["variants"])),
    ]
    if skipped:
        lines += ["", "Skipped: " + "; ".join(f"{k} ({v})" for k, v in skipped.items()) + "."]
    return lines


# The two reports this script makes, in page order, each with its section's title and
# writer: ``run_all.py`` keeps them as these keys of ``latest.json``.
SECTIONS: dict[str, tuple[str, Callable[[dict[str, Any]], list[str]]]] = {
    "caller": ("Caller latency of the tee (bench_latency.py)", caller_section),
    "baselines": ("Against what users pick instead (bench_latency.py)", baselines_section),
}
TITLE = "Caller cost of `tee_rl_metrics_to_otel` (68-key train dict), and of the alternatives"


def page(report: dict[str, Any]) -> list[str]:
    """Both sections, titled, as markdown lines."""
    lines: list[str] = []
    for key, (title, section) in SECTIONS.items():
        lines += [*([""] if lines else []), f"## {title}", "", *section(report[key])]
    return lines


def console(report: dict[str, Any]) -> list[str]:
    """Both tables, the targets and the CPU figures, for stdout."""
    caller, baselines = report["caller"], report["baselines"]
    return [
        "Caller cost per tee call, µs (timer included; see the timer row)",
        *text_table(CALLER_HEADER, caller_rows(caller["conditions"])),
        "",
        "Targets (p50: median of block p50s; tails: pooled):",
        *("  " + target_line(check) for check in caller["targets"]),
        "",
        "Pipeline CPU at trainer pace:",
        *("  " + line for line in cpu_lines(caller)),
        "",
        "Caller cost per dict, µs (back to back)",
        *text_table(BASELINES_HEADER, baselines_rows(baselines["variants"])),
    ]


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--calls", type=int, default=None, help="back-to-back calls per row")
    parser.add_argument("--blocks", type=int, default=None, help="interleaved rounds")
    return parse_bench_args(parser, "latency", argv)


def make_plan(args: argparse.Namespace) -> Plan:
    """Full: 100,000 calls a row (20,000 at trainer pace: 40 s), 5 blocks spanning exports.

    Quick: 3,000 calls (600 at trainer pace), 3 blocks, no minimum block length.
    """
    calls = args.calls or (3_000 if args.quick else 100_000)
    blocks = args.blocks or (3 if args.quick else 5)
    min_block_s = 0.0 if args.quick else 2.2 * EXPORT_INTERVAL_MS / 1000
    return Plan(blocks, calls, max(blocks, calls // 5), min_block_s)


def pick(
    results: dict[str, dict[str, Any]], keys: Sequence[str], labels: dict[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    """The rows of ``keys`` that ran, in that order, relabelled where ``labels`` says."""
    labels = labels or {}
    return {
        key: {**results[key], "label": labels.get(key, results[key]["label"])}
        for key in keys
        if key in results
    }


def reports(
    args: argparse.Namespace, plan: Plan, env: Env, results: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The caller table's report and the baselines table's, from the same rounds."""
    conditions = pick(results, [c.key for c in CALLER_ROWS])
    variants = pick(results, BASELINE_KEYS, BASELINE_LABELS)
    by_key = {c.key: c for c in ROWS}
    caller = {
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
        "conditions": conditions,
        "targets": check_targets(conditions),
        "worker_cpu": worker_cpu(conditions),
    }
    baselines = {
        "config": {
            "quick": args.quick,
            "blocks": plan.blocks,
            "calls_per_fast_variant": plan.calls,
            "calls": {key: plan.block_calls(by_key[key]) * plan.blocks for key in variants},
            "warmup_calls": WARMUP_CALLS,
            "min_block_s_with_pipeline": plan.min_block_s,
            "numeric_keys": len(numeric(env.d)),
            "versions": package_versions(("wandb",)),  # the others are in machine info
            "dict_keys": len(env.d),
        },
        "variants": variants,
        "skipped": {
            key: missing_requirement(by_key[key]) or ""
            for key in BASELINE_KEYS
            if key not in results
        },
    }
    return {"caller": caller, "baselines": baselines}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args)
    quiet_logging()
    quiet_mlflow()
    quiet_wandb()
    started = time.perf_counter()
    rows = runnable(ROWS)
    preload(rows)
    with contextlib.ExitStack() as stack:
        hole, hole_port = black_hole()
        stack.callback(hole.close)
        ports = {
            "healthy": start_receiver(stack).port,
            "stalled": start_receiver(stack, stall=True).port,
            "black_hole": hole_port,
        }
        env = Env(load_train_dict(), ports)
        blocks = run_rounds(rows, env, plan)
    results = {c.key: summarise(c, blocks[c.key]) for c in rows}
    add_ratios(results)
    parts = reports(args, plan, env, results)
    duration_s = time.perf_counter() - started
    for part in parts.values():
        part["duration_s"] = duration_s
    report: dict[str, Any] = {"machine": machine_info(), **parts, "duration_s": duration_s}
    publish(args.out, report, TITLE, page(report), console(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

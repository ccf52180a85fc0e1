"""Caller-side cost of one ``tee_rl_metrics_to_otel`` call, with the real pipeline running.

Usage: ``python benchmarks/bench_caller.py [--calls N] [--quick] [--out PATH]``

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
import json
import logging
import math
import os
import platform
import subprocess
import sys
import threading
import time
from array import array
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from statistics import median
from time import perf_counter_ns
from typing import Any

import async_tee
from async_tee import metrics as tee_metrics
from async_tee import testing
from async_tee.sink import black_hole

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parent / "tests" / "fixtures" / "grpo_step.json"
RECEIVER = HERE / "_receiver.py"
DEFAULT_OUT = HERE / "results" / "latest.json"

PACE_NS = 2_000_000  # trainer pace: one call every 2 ms
EXPORT_INTERVAL_MS = 1000
SHUTDOWN_S = 2.0
SATURATED_QUEUE = 64
BASELINE_QUEUE = 1024  # floor and janus capacity (async_tee's default queue size)
WARMUP_CALLS = 300
CHUNK = 1000  # calls per timed loop between checks of the block's end
PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("p99.9", 0.999))
# Shares of calls slower than these: the tails come from rare events at a steady rate per
# second, so whether p99.9 lands on them depends on how many calls a second there are.
OVER_US = (5, 30, 1000)

# ------------------------------------------------------------------ timed loops

# One loop per timed statement, compiled like timeit's: the statement sits between the two
# timer reads with nothing else. The signature is shared so every target plugs into any loop.
_LOOP_SOURCE = """
def loop(n, step, pace_ns, record, d, fn, extra):
    pc = perf_counter_ns
    deadline = pc()
    for _ in range(n):
        if pace_ns:
            deadline = wait_until(deadline + pace_ns)
        t0 = pc()
        {stmt}
        t1 = pc()
        record(t1 - t0)
        step += 1
    return step
"""

STATEMENTS = {
    "empty": "pass",
    "tee": "fn(d, 'train', step)",
    "copy_put": "fn(extra(d))",
    "inline": "fn(d, 'train', step, extra)",
}


def wait_until(deadline_ns: int) -> int:
    """Sleep (releasing the GIL) until ``deadline_ns``; returns the deadline kept.

    Behind schedule, the schedule restarts from now instead of catching up in a burst.
    """
    now = perf_counter_ns()
    if deadline_ns <= now:
        return now
    time.sleep((deadline_ns - now) / 1e9)
    return deadline_ns


def _compile_loop(stmt: str) -> Callable[..., int]:
    namespace: dict[str, Any] = {"perf_counter_ns": perf_counter_ns, "wait_until": wait_until}
    exec(_LOOP_SOURCE.format(stmt=stmt), namespace)
    return namespace["loop"]


LOOPS = {name: _compile_loop(stmt) for name, stmt in STATEMENTS.items()}

# ------------------------------------------------------------------ statistics


def share_over(hist: Counter[int]) -> dict[str, float]:
    """Percentage of samples slower than each of ``OVER_US``."""
    total = sum(hist.values())
    return {
        f">{limit}us": 100 * sum(c for v, c in hist.items() if v > limit * 1000) / total
        for limit in OVER_US
    }


def percentiles(hist: Counter[int]) -> dict[str, float]:
    """Nearest-rank percentiles (µs) of an exact histogram of nanosecond samples."""
    total = sum(hist.values())
    ranks = {name: max(1, math.ceil(q * total)) for name, q in PERCENTILES}
    out: dict[str, float] = {}
    seen = 0
    pending = sorted(ranks.items(), key=lambda item: item[1])
    values = sorted(hist.items())
    for value, count in values:
        seen += count
        while pending and pending[0][1] <= seen:
            out[pending.pop(0)[0]] = value / 1000
    out["max"] = values[-1][0] / 1000
    return {name: out[name] for name in (*ranks, "max")}


# ------------------------------------------------------------------ fixture and endpoints


def load_train_dict() -> dict[str, Any]:
    """The fixture's ``train`` call with 68 keys."""
    calls = json.loads(FIXTURE.read_text())["calls"]
    for call in calls:
        if call["prefix"] == "train" and len(call["metrics"]) == 68:
            return dict(call["metrics"])
    raise SystemExit(f"{FIXTURE}: no 68-key 'train' call")


class Receiver:
    """An ``OtlpSink`` in a child process (``_receiver.py``); stops when its stdin closes."""

    def __init__(self, stall: bool = False) -> None:
        command = [sys.executable, str(RECEIVER), *(["--stall"] if stall else [])]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.strip().isdigit():
            self.close()
            raise RuntimeError(f"receiver did not start (printed {line!r})")
        self.port = int(line)

    def close(self) -> None:
        """Close its stdin and wait for it to exit; kill it after 5 s."""
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class Env:
    """What the conditions share: the dict and the three endpoints' ports."""

    d: dict[str, Any]
    healthy_port: int
    stalled_port: int
    black_hole_port: int


def otlp_environ(port: int) -> dict[str, str]:
    """The exporter settings, passed to ``start_telemetry(environ=...)``."""
    return {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        "OTEL_METRIC_EXPORT_INTERVAL": str(EXPORT_INTERVAL_MS),
    }


# ------------------------------------------------------------------ targets


def _nothing() -> None:
    return None


@dataclass
class Target:
    """What one block times: ``fn`` (and ``extra``) as the condition's statement uses them."""

    fn: Callable[..., Any]
    extra: Any = None
    pipeline: bool = False
    settle: Callable[[], Any] = _nothing
    threads: list[threading.Thread] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def thread_cpu_ns(thread: threading.Thread) -> int | None:
    """CPU time of a live thread, or None where the platform cannot tell."""
    try:
        return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))  # type: ignore[arg-type]
    except (AttributeError, OSError, TypeError):
        return None


@contextlib.contextmanager
def pipeline(port: int, queue_size: int | None = None) -> Iterator[Target]:
    """Start the real pipeline against ``port``; tear it down cleanly afterwards."""
    before = set(threading.enumerate())
    handle = async_tee.start_telemetry(environ=otlp_environ(port), queue_size=queue_size)
    if not handle.is_exporting:
        raise RuntimeError("start_telemetry did not start exporting")
    threads = [t for t in threading.enumerate() if t not in before]
    target = Target(
        async_tee.tee_rl_metrics_to_otel,
        handle.meter,
        pipeline=True,
        settle=lambda: async_tee.flush(SHUTDOWN_S),
        threads=threads,
    )
    try:
        yield target
    finally:
        started = time.perf_counter()
        target.info["shutdown_ok"] = async_tee.shutdown_telemetry(SHUTDOWN_S)
        target.info["shutdown_s"] = time.perf_counter() - started
        for thread in threads:  # let the exporter's thread end before the next block
            thread.join(max(0.0, started + 3 * SHUTDOWN_S - time.perf_counter()))
        target.info["threads_left"] = [t.name for t in threads if t.is_alive()]
        testing.reset(SHUTDOWN_S)


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


# ------------------------------------------------------------------ conditions


@contextlib.contextmanager
def healthy(env: Env) -> Iterator[Target]:
    with pipeline(env.healthy_port) as target:
        yield target


@contextlib.contextmanager
def stalled(env: Env) -> Iterator[Target]:
    with pipeline(env.stalled_port) as target:
        yield target


@contextlib.contextmanager
def into_black_hole(env: Env) -> Iterator[Target]:
    with pipeline(env.black_hole_port) as target:
        yield target


@contextlib.contextmanager
def saturated(env: Env) -> Iterator[Target]:
    with pipeline(env.healthy_port, queue_size=SATURATED_QUEUE) as target:
        yield target


@contextlib.contextmanager
def gil_contention(env: Env) -> Iterator[Target]:
    with pipeline(env.healthy_port) as target, spinning_thread():
        yield target


@contextlib.contextmanager
def telemetry_off(env: Env) -> Iterator[Target]:
    if tee_metrics._QUEUE is not None:
        raise RuntimeError("telemetry is still running")
    yield Target(async_tee.tee_rl_metrics_to_otel)


@contextlib.contextmanager
def floor(env: Env) -> Iterator[Target]:
    yield Target(deque(maxlen=BASELINE_QUEUE).append, dict)


@contextlib.contextmanager
def inline(env: Env) -> Iterator[Target]:
    with pipeline(env.healthy_port) as target:
        target.fn = tee_metrics._tee_rl_metrics_to_otel  # extra is already the meter
        yield target


@contextlib.contextmanager
def janus_baseline(env: Env) -> Iterator[Target]:
    with janus_queue() as queue:
        yield Target(drop_oldest_put(queue.sync_q), dict)


@contextlib.contextmanager
def timer_only(env: Env) -> Iterator[Target]:
    yield Target(_nothing)


@dataclass(frozen=True)
class Condition:
    """One row of the table: how to set it up and which statement to time."""

    key: str
    label: str
    setup: Callable[[Env], contextlib.AbstractContextManager[Target]]
    stmt: str = "tee"
    paced: bool = False
    in_asyncio: bool = False
    kind: str = "condition"  # or "baseline", "timer"


CONDITIONS = (
    Condition("healthy_paced", "1 healthy, trainer pace", healthy, paced=True),
    Condition("healthy_b2b", "2 healthy, back to back", healthy),
    Condition("stalled", "3 stalled receiver", stalled),
    Condition("black_hole", "4 black hole", into_black_hole),
    Condition("saturated", "5 saturated (queue 64)", saturated),
    Condition("gil", "6 GIL contention", gil_contention),
    Condition("asyncio", "7 inside asyncio.run", healthy, in_asyncio=True),
    Condition("off", "8 telemetry off", telemetry_off),
    Condition("off_paced", "8' telemetry off, trainer pace", telemetry_off, paced=True),
    Condition("floor", "a floor: deque.append(dict(d))", floor, "copy_put", kind="baseline"),
    Condition(
        "floor_paced", "a' floor, trainer pace", floor, "copy_put", paced=True, kind="baseline"
    ),
    Condition("inline", "b inline _tee_rl_metrics_to_otel", inline, "inline", kind="baseline"),
    Condition("janus", "c janus 2.0 drop-oldest", janus_baseline, "copy_put", kind="baseline"),
    Condition("timer", "timer: empty perf_counter_ns pair", timer_only, "empty", kind="timer"),
)

# ------------------------------------------------------------------ running blocks


@dataclass
class Plan:
    """Sizes: calls per block for back-to-back and paced rows, blocks, minimum block length."""

    blocks: int
    calls: int
    paced_calls: int
    min_block_s: float

    def block_calls(self, condition: Condition) -> int:
        total = self.paced_calls if condition.paced else self.calls
        return max(1, total // self.blocks)


def timed_chunks(
    condition: Condition, target: Target, d: dict[str, Any], n: int, min_s: float, step: int
) -> Iterator[tuple[array[int], int]]:
    """Time at least ``n`` calls (and for at least ``min_s``), yielding after each chunk."""
    loop = LOOPS[condition.stmt]
    pace = PACE_NS if condition.paced else 0
    samples: array[int] = array("q")
    record = samples.append
    started = time.monotonic()
    remaining = n
    while remaining > 0 or time.monotonic() - started < min_s:
        k = min(CHUNK, remaining) if remaining > 0 else CHUNK
        step = loop(k, step, pace, record, d, target.fn, target.extra)
        remaining -= k
        yield samples, step


def measure(
    condition: Condition, target: Target, d: dict[str, Any], n: int, min_s: float, step: int
) -> tuple[array[int], int]:
    """Run the timed loop, from a coroutine inside ``asyncio.run`` if the condition says so."""
    chunks = timed_chunks(condition, target, d, n, min_s, step)
    if not condition.in_asyncio:
        return deque(chunks, maxlen=1)[0]  # run every chunk, keep the last

    async def in_loop() -> tuple[array[int], int]:
        last = None
        for last in chunks:  # noqa: B007 - the last chunk carries the result
            await asyncio.sleep(0)
        assert last is not None
        return last

    return asyncio.run(in_loop())


def snapshot(target: Target) -> dict[str, Any]:
    """Process and pipeline-thread CPU, wall time and the pipeline's counts, now."""
    snap: dict[str, Any] = {
        "wall_ns": perf_counter_ns(),
        "cpu_ns": time.process_time_ns(),
        "threads": {t.name: thread_cpu_ns(t) for t in target.threads},
    }
    if target.pipeline:
        stats = async_tee.stats()
        snap["enqueued"] = stats["enqueued"]
        snap["recorded"] = stats["recorded"]
        snap["overflow"] = stats["dropped_by_reason"]["overflow"]
        snap["exports_ok"] = stats["exports"].get("success", 0)
        snap["exports_failed"] = stats["exports"].get("failure", 0)
    return snap


def difference(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What happened between two snapshots."""
    out = {
        key: after[key] - before[key]
        for key in after
        if key != "threads" and isinstance(after[key], int)
    }
    out["thread_cpu_ns"] = {
        name: after["threads"][name] - cpu
        for name, cpu in before["threads"].items()
        if cpu is not None and after["threads"].get(name) is not None
    }
    return out


@dataclass
class Block:
    """One block's histogram and what the pipeline did meanwhile."""

    hist: Counter[int]
    n: int
    info: dict[str, Any]


def run_block(condition: Condition, env: Env, plan: Plan, step: int) -> tuple[Block, int]:
    """Set the condition up, warm it up, time one block, tear it down."""
    with condition.setup(env) as target:
        warm = LOOPS[condition.stmt]
        step = warm(WARMUP_CALLS, step, 0, _discard, env.d, target.fn, target.extra)
        target.settle()
        min_s = plan.min_block_s if target.pipeline and not condition.paced else 0.0
        before = snapshot(target)
        samples, step = measure(condition, target, env.d, plan.block_calls(condition), min_s, step)
        target.settle()
        info = difference(before, snapshot(target))
    info.update(target.info)
    return Block(Counter(samples), len(samples), info), step


def _discard(_: int) -> None:
    return None


def run_all(env: Env, plan: Plan) -> dict[str, list[Block]]:
    """Every condition once per round, the order rotated each round."""
    blocks: dict[str, list[Block]] = {c.key: [] for c in CONDITIONS}
    step = 1
    for round_ in range(plan.blocks):
        shift = round_ * len(CONDITIONS) // plan.blocks
        order = CONDITIONS[shift:] + CONDITIONS[:shift]
        for condition in order:
            started = time.perf_counter()
            block, step = run_block(condition, env, plan, step)
            blocks[condition.key].append(block)
            p50 = percentiles(block.hist)["p50"]
            print(
                f"[{round_ + 1}/{plan.blocks}] {condition.label:<36} n={block.n:>8} "
                f"p50={p50:7.3f} µs  ({time.perf_counter() - started:5.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    return blocks


# ------------------------------------------------------------------ summaries


def summarise(condition: Condition, blocks: list[Block]) -> dict[str, Any]:
    """Pooled percentiles, per-block p50s and summed pipeline figures of one condition."""
    pooled: Counter[int] = Counter()
    for block in blocks:
        pooled.update(block.hist)
    block_p50s = [percentiles(block.hist)["p50"] for block in blocks]
    totals: dict[str, Any] = {}
    for block in blocks:
        for key, value in block.info.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                totals[key] = totals.get(key, 0) + value
            elif key == "thread_cpu_ns":
                merged = totals.setdefault("thread_cpu_ns", {})
                for name, ns in value.items():
                    merged[name] = merged.get(name, 0) + ns
    return {
        "label": condition.label,
        "kind": condition.kind,
        "paced": condition.paced,
        "n": sum(block.n for block in blocks),
        "blocks": len(blocks),
        "us": percentiles(pooled),
        "pct_calls_over": share_over(pooled),
        "block_p50_us": block_p50s,
        "median_block_p50_us": median(block_p50s),
        "pipeline": totals,
        "shutdown_ok": [b.info.get("shutdown_ok") for b in blocks if "shutdown_ok" in b.info],
        "threads_left": sorted({n for b in blocks for n in b.info.get("threads_left", [])}),
    }


def add_ratios(results: dict[str, dict[str, Any]]) -> None:
    """p50 (median of blocks) over the floor at the same pace, and over inline."""
    inline_p50 = results["inline"]["median_block_p50_us"]
    for row in results.values():
        floor_key = "floor_paced" if row["paced"] else "floor"
        p50 = row["median_block_p50_us"]
        row["x_floor"] = p50 / results[floor_key]["median_block_p50_us"]
        row["x_inline"] = p50 / inline_p50
        row["p50_net_us"] = p50 - results["timer"]["median_block_p50_us"]
        row["floor_used"] = floor_key


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
    for key in ("off", "off_paced"):
        check(key, "telemetry off p50 <= 0.2 us", results[key]["median_block_p50_us"], 0.2)
    return checks


# ------------------------------------------------------------------ output


def source_revision() -> dict[str, Any]:
    """The git commit measured, and whether ``async_tee/`` differs from it (read-only git)."""

    def git(*command: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *command], cwd=HERE.parent, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    changes = git("status", "--porcelain", "--", "async_tee")
    return {"commit": git("rev-parse", "HEAD"), "async_tee_modified": bool(changes)}


def machine_info() -> dict[str, Any]:
    """Platform, Python, CPUs, the versions that matter and the commit measured."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions = {}
    for package in (
        "async_tee",
        "opentelemetry-sdk",
        "opentelemetry-exporter-otlp-proto-grpc",
        "grpcio",
        "protobuf",
        "janus",
    ):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "switch_interval_s": sys.getswitchinterval(),
        "versions": versions,
        "source": source_revision(),
    }


def _fmt(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


TABLE_HEADER = (
    "condition",
    "n",
    "p50",
    "p50 med",
    "p90",
    "p99",
    "p99.9",
    "max",
    "x floor",
    "x inline",
    "% >30us",
    "dropped",
)


def table_rows(results: dict[str, dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per condition; times in µs, ratios from the median of block p50s."""
    rows = []
    for row in results.values():
        us = row["us"]
        dropped = row["pipeline"].get("overflow")
        rows.append(
            (
                row["label"],
                str(row["n"]),
                _fmt(us["p50"]),
                _fmt(row["median_block_p50_us"]),
                _fmt(us["p90"]),
                _fmt(us["p99"]),
                _fmt(us["p99.9"]),
                _fmt(us["max"]),
                f"{row['x_floor']:.2f}",
                f"{row['x_inline']:.3f}",
                f"{row['pct_calls_over']['>30us']:.3f}",
                "" if dropped is None else str(dropped),
            )
        )
    return rows


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


def print_report(report: dict[str, Any]) -> None:
    """The table, the targets and the CPU figures, on stdout."""
    rows = [TABLE_HEADER, *table_rows(report["conditions"])]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
    print("\nCaller cost per tee call, µs (timer included; see the timer row)")
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        print("  ".join(cells))
    print("\nTargets (p50: median of block p50s; tails: pooled):")
    for check in report["targets"]:
        print("  " + target_line(check))
    print("\nPipeline CPU at trainer pace:")
    for line in cpu_lines(report):
        print("  " + line)


def markdown(report: dict[str, Any]) -> str:
    """The same table, targets and CPU figures as markdown."""
    machine = report["machine"]
    timer_p50 = report["conditions"]["timer"]["median_block_p50_us"]
    lines = [
        "# Caller cost of `tee_rl_metrics_to_otel` (68-key train dict)",
        "",
        f"{machine['platform']}, Python {machine['python']}, {machine['cpu_count']} CPUs "
        f"({machine['cpu_model']}); "
        + ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
        + f"; commit {machine['source']['commit']}"
        + (" (async_tee/ modified)" if machine["source"]["async_tee_modified"] else "")
        + ".",
        "",
        f"{report['config']['blocks']} interleaved blocks per row. Times in µs, timer "
        f"included (empty pair p50 {timer_p50:.3f} µs). `p50 med` is the median of the "
        "per-block p50s; the ratios use it. Paced rows compare with the paced floor. "
        "`dropped`: dicts the full queue dropped during the measured windows.",
        "",
        "| " + " | ".join(TABLE_HEADER) + " |",
        "|" + "|".join("---" for _ in TABLE_HEADER) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(report["conditions"])]
    lines += ["", "## Targets", "", "| condition | target | value | limit | holds |"]
    lines += ["|---|---|---|---|---|"]
    lines += [
        f"| {c['condition']} | {c['target']} | {c['value']} | {c['limit']} | "
        f"{'yes' if c['holds'] else '**no**'} |"
        for c in report["targets"]
    ]
    lines += ["", "## Pipeline CPU at trainer pace", ""]
    lines += [f"- {line}" for line in cpu_lines(report)]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=None, help="back-to-back calls per row")
    parser.add_argument("--quick", action="store_true", help="3,000 calls: a smoke test")
    parser.add_argument("--blocks", type=int, default=None, help="interleaved rounds")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    return parser.parse_args(argv)


def make_plan(args: argparse.Namespace) -> Plan:
    """Full: 100,000 calls a row (20,000 at trainer pace: 40 s), 5 blocks spanning exports.

    Quick: 3,000 calls (600 at trainer pace), 3 blocks, no minimum block length.
    """
    calls = args.calls or (3_000 if args.quick else 100_000)
    blocks = args.blocks or (3 if args.quick else 5)
    min_block_s = 0.0 if args.quick else 2.2 * EXPORT_INTERVAL_MS / 1000
    return Plan(blocks, calls, max(blocks, calls // 5), min_block_s)


def quiet_logging() -> None:
    """Export failures are expected in the stalled and black-hole rows: keep stderr readable."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args)
    quiet_logging()
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        healthy_rx = Receiver()
        stack.callback(healthy_rx.close)
        stalled_rx = Receiver(stall=True)
        stack.callback(stalled_rx.close)
        hole, hole_port = black_hole()
        stack.callback(hole.close)
        env = Env(load_train_dict(), healthy_rx.port, stalled_rx.port, hole_port)
        blocks = run_all(env, plan)
    results = {c.key: summarise(c, blocks[c.key]) for c in CONDITIONS}
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
            "otlp_timeout_s": 1,
            "warmup_calls": WARMUP_CALLS,
            "dict_keys": len(env.d),
        },
        "conditions": results,
        "targets": check_targets(results),
        "worker_cpu": worker_cpu(results),
        "duration_s": time.perf_counter() - started,
    }
    print_report(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.md')} in {report['duration_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

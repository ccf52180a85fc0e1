"""The caller-latency engine of ``bench_latency.py``: timed loops, conditions, blocks, rows.

What is timed: one statement (a tee call, a baseline's logging call) bracketed by two
``perf_counter_ns()`` reads. Each statement is compiled into its own loop, as ``timeit``
does, so no wrapper call is timed; every target plugs into the same loop signature
``loop(n, step, pace_ns, record, d, fn, extra)``. Every sample is kept (``array('q')``) and
folded into an exact histogram per block.

A *condition* (or variant) says how to set a target up and which statement times it. A
*block* sets the condition up from scratch, warms it up, times ``Plan.block_calls`` calls
(and, for pipeline conditions, for at least ``Plan.min_block_s`` so every block overlaps an
export), then tears it down. ``run_rounds`` runs every condition once per round, in an
order rotated each round, so the machine's drift hits every condition alike; a row's p50
is the median of its per-block p50s, its tails are pooled over blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import time
from array import array
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any

from _common import (
    SHUTDOWN_S,
    Session,
    fmt,
    histogram_summary,
    percentiles,
    pipeline,
    progress,
    rotated,
    thread_cpu_ns,
)

import async_tee
from async_tee._worker.mapping import (
    efficiency_attributes,
    map_efficiency_seconds,
    map_teed_scalars,
)
from async_tee.vocabulary import efficiency_categories, teed_metrics

PACE_NS = 2_000_000  # trainer pace: one call every 2 ms
BASELINE_QUEUE = 1024  # floor (and janus) capacity: async_tee's default queue size
WARMUP_CALLS = 300
CHUNK = 1000  # calls per timed loop between checks of the block's end

# ------------------------------------------------------------------ timed loops

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
    "with_step": "fn(d, step)",
    "emit_body": "fn(body=extra(d))",
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

# ------------------------------------------------------------------ targets and conditions


def _nothing() -> None:
    return None


@dataclass
class Target:
    """What one block times: ``fn`` (and ``extra``) as the condition's statement uses them."""

    fn: Callable[..., Any]
    extra: Any = None
    pipeline: bool = False
    settle: Callable[[], Any] = _nothing
    threads: list[Any] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


# What a pipeline condition times, made from the session once per block: a function
# called as the tee is, ``fn(d, prefix, step)``.
TeeFactory = Callable[[async_tee.Pipeline], Callable[[dict[str, Any], str, int], Any]]


def tee_target(running: Session, make: TeeFactory | None = None) -> Target:
    """The tee (or what ``make`` builds from the session) on a running pipeline."""
    return Target(
        async_tee.tee_rl_metrics_to_otel if make is None else make(running.handle),
        pipeline=True,
        settle=lambda: async_tee.flush(SHUTDOWN_S),
        threads=running.threads,
        info=running.info,
    )


@dataclass
class Env:
    """What the conditions share: the dict and the receivers' ports by name."""

    d: dict[str, Any]
    ports: dict[str, int]


@dataclass(frozen=True)
class Condition:
    """One row of a table: how to set it up and which statement to time.

    ``calls_share`` scales the plan's calls for slow baselines; ``requires`` names the
    module a baseline needs (the row is skipped, with the reason printed, without it).
    """

    key: str
    label: str
    setup: Callable[[Env], contextlib.AbstractContextManager[Target]]
    stmt: str = "tee"
    paced: bool = False
    in_asyncio: bool = False
    kind: str = "condition"  # or "baseline", "timer"
    calls_share: float = 1.0
    requires: str | None = None
    note: str = ""


def missing_requirement(condition: Condition) -> str | None:
    """Why ``condition`` cannot run here, or None when it can."""
    if not condition.requires:
        return None
    try:
        found = importlib.util.find_spec(condition.requires) is not None
    except (ImportError, ValueError):  # a parent package is missing, or blocked
        found = False
    return None if found else f"{condition.requires} is not installed (pip install '.[bench-full]')"


def preload(conditions: Sequence[Condition]) -> None:
    """Import what the conditions need now, so every round runs with the same modules loaded.

    Otherwise the first round would run before a baseline's package (and its objects, which
    every later garbage collection scans) is loaded and the others after.
    """
    for condition in conditions:
        if condition.requires:
            importlib.import_module(condition.requires)


def runnable(conditions: Sequence[Condition]) -> tuple[Condition, ...]:
    """The conditions whose packages are installed; the others are skipped, with a reason."""
    kept = []
    for condition in conditions:
        reason = missing_requirement(condition)
        if reason:
            progress(f"skipped {condition.label}: {reason}")
        else:
            kept.append(condition)
    return tuple(kept)


def pipeline_setup(
    port: str, queue_size: int | None = None, make: TeeFactory | None = None
) -> Callable[[Env], contextlib.AbstractContextManager[Target]]:
    """A condition's setup: a fresh pipeline exporting to ``env.ports[port]``, timing the
    tee (or what ``make`` builds from the session)."""

    @contextlib.contextmanager
    def setup(env: Env) -> Iterator[Target]:
        with pipeline(env.ports[port], queue_size) as running:
            yield tee_target(running, make)

    return setup


def worker_recorder(handle: async_tee.Pipeline) -> Callable[[dict[str, Any], str, int], None]:
    """The inline tee: the session's own ``RLRecorder.tee``, what the worker runs per dict."""
    return handle.consumer.recorder.tee


def seed_recorder(meter: Any, prefix: str = "") -> Callable[[dict[str, Any], str, int], None]:
    """The original tee's recording on ``meter``: map, then one SDK synchronous instrument
    call per value. Instruments are created once, named ``prefix`` + the series' name;
    counters get ``add``, everything else ``set``."""
    record: dict[str, Callable[..., None]] = {}
    for row in teed_metrics():
        if row.kind == "counter":
            record[row.key] = meter.create_counter(f"{prefix}{row.name}", unit=row.unit).add
        else:
            record[row.key] = meter.create_gauge(f"{prefix}{row.name}", unit=row.unit).set
    efficiency = meter.create_gauge(f"{prefix}rl.efficiency.seconds", unit="s").set
    attributes = {
        category: dict(frozen.mapping)
        for category, frozen in efficiency_attributes(efficiency_categories()).items()
    }

    def tee(d: dict[str, Any], prefix: str, step: int) -> None:
        for key, value in map_teed_scalars(d).items():
            record[key](value)
        for category, seconds in map_efficiency_seconds(d, attributes).items():
            efficiency(seconds, attributes[category])

    return tee


def seed_shape_recorder(handle: async_tee.Pipeline) -> Callable[[dict[str, Any], str, int], None]:
    """:func:`seed_recorder` on the session's meter, under a ``seed.`` prefix so that its
    instruments cannot clash with the pipeline's own."""
    meter = handle.meter
    if meter is None:
        raise RuntimeError("the session has no meter")
    return seed_recorder(meter, "seed.")


# The rows every latency table shares: the tee on a healthy pipeline, the floor, the inline
# tee and the empty timer.

healthy = pipeline_setup("healthy")
inline = pipeline_setup("healthy", make=worker_recorder)
inline_sdk = pipeline_setup("healthy", make=seed_shape_recorder)


@contextlib.contextmanager
def floor(env: Env) -> Iterator[Target]:
    yield Target(deque(maxlen=BASELINE_QUEUE).append, dict)


@contextlib.contextmanager
def timer_only(env: Env) -> Iterator[Target]:
    yield Target(_nothing)


HEALTHY_B2B = Condition("healthy_b2b", "2 healthy, back to back", healthy)
FLOOR = Condition("floor", "a floor: deque.append(dict(d))", floor, "copy_put", kind="baseline")
INLINE = Condition("inline", "b inline: the worker's RLRecorder.tee", inline, kind="baseline")
INLINE_SDK = Condition(
    "inline_sdk", "b' inline, seed's shape (SDK sync instruments)", inline_sdk, kind="baseline"
)
TIMER = Condition("timer", "timer: empty perf_counter_ns pair", timer_only, "empty", kind="timer")

# ------------------------------------------------------------------ running blocks


@dataclass
class Plan:
    """Sizes: calls per row for back-to-back and paced rows, blocks, minimum block length."""

    blocks: int
    calls: int
    paced_calls: int
    min_block_s: float

    def block_calls(self, condition: Condition) -> int:
        total = self.paced_calls if condition.paced else self.calls
        return max(1, round(total * condition.calls_share) // self.blocks)


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
        delivery = stats["delivery"]
        snap["backlog"] = {  # levels, not counts: the export backlog now
            "queued": delivery["queued"],
            "queued_bytes": delivery["queued_bytes"],
            "dropped_overflow": delivery["dropped"]["overflow"],
        }
    return snap


def difference(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What happened between two snapshots (the export backlog: as it was at the second)."""
    out = {
        key: after[key] - before[key]
        for key in after
        if key != "threads" and isinstance(after[key], int)
    }
    if "backlog" in after:
        out["backlog"] = after["backlog"]
    out["thread_cpu_ns"] = {
        name: after["threads"][name] - cpu
        for name, cpu in before["threads"].items()
        if cpu is not None and after["threads"].get(name) is not None
    }
    return out


@dataclass
class Block:
    """One block's histogram and what happened meanwhile (and at teardown)."""

    hist: Counter[int]
    n: int
    info: dict[str, Any]


def _discard(_: int) -> None:
    return None


def run_block(condition: Condition, env: Env, plan: Plan, step: int) -> tuple[Block, int]:
    """Set the condition up, warm it up, time one block, tear it down."""
    with condition.setup(env) as target:
        warm_calls = min(WARMUP_CALLS, max(10, plan.block_calls(condition) // 5))
        loop = LOOPS[condition.stmt]
        step = loop(warm_calls, step, 0, _discard, env.d, target.fn, target.extra)
        target.settle()
        min_s = plan.min_block_s if target.pipeline and not condition.paced else 0.0
        before = snapshot(target)
        samples, step = measure(condition, target, env.d, plan.block_calls(condition), min_s, step)
        target.settle()
        info = difference(before, snapshot(target))
    info.update(target.info)  # teardown figures (shutdown, a baseline's drain time)
    return Block(Counter(samples), len(samples), info), step


def run_rounds(conditions: Sequence[Condition], env: Env, plan: Plan) -> dict[str, list[Block]]:
    """Every condition once per round, the order rotated each round."""
    return run_cells([(condition, env) for condition in conditions], plan)


def run_cells(cells: Sequence[tuple[Condition, Env]], plan: Plan) -> dict[str, list[Block]]:
    """Every (condition, its dict) once per round, the order rotated each round."""
    blocks: dict[str, list[Block]] = {condition.key: [] for condition, _ in cells}
    step = 1
    for round_ in range(plan.blocks):
        for condition, env in rotated(cells, round_, plan.blocks):
            started = time.perf_counter()
            block, step = run_block(condition, env, plan, step)
            blocks[condition.key].append(block)
            p50 = percentiles(block.hist)["p50"]
            progress(
                f"[{round_ + 1}/{plan.blocks}] {condition.label:<40} n={block.n:>8} "
                f"p50={p50:9.3f} µs  ({time.perf_counter() - started:5.1f} s)"
            )
    return blocks


# ------------------------------------------------------------------ summaries


def _sum_info(blocks: Sequence[Block]) -> dict[str, Any]:
    """Numeric block figures summed over blocks (thread CPU merged per thread; the export
    backlog at the blocks' ends: the largest)."""
    totals: dict[str, Any] = {}
    for block in blocks:
        for key, value in block.info.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                totals[key] = totals.get(key, 0) + value
            elif key == "thread_cpu_ns":
                merged = totals.setdefault("thread_cpu_ns", {})
                for name, ns in value.items():
                    merged[name] = merged.get(name, 0) + ns
            elif key == "backlog":
                largest = totals.setdefault("backlog_max", {})
                for name, level in value.items():
                    largest[name] = max(largest.get(name, 0), level)
    return totals


def summarise(condition: Condition, blocks: Sequence[Block]) -> dict[str, Any]:
    """Percentiles, latency curve, per-block p50s and summed block figures of one row."""
    return {
        "label": condition.label,
        "kind": condition.kind,
        "paced": condition.paced,
        "note": condition.note,
        **histogram_summary([block.hist for block in blocks]),
        "pipeline": _sum_info(blocks),
        "shutdown_ok": [b.info.get("shutdown_ok") for b in blocks if "shutdown_ok" in b.info],
        "threads_left": sorted({n for b in blocks for n in b.info.get("threads_left", [])}),
    }


def add_ratios(results: dict[str, dict[str, Any]]) -> None:
    """p50 (median of blocks) over the floor at the same pace, and over the inline tee."""
    inline_p50 = results["inline"]["median_block_p50_us"]
    timer = results.get("timer")
    for row in results.values():
        floor_key = "floor_paced" if row["paced"] else "floor"
        p50 = row["median_block_p50_us"]
        row["x_floor"] = p50 / results[floor_key]["median_block_p50_us"]
        row["x_inline"] = p50 / inline_p50
        if timer is not None:
            row["p50_net_us"] = p50 - timer["median_block_p50_us"]
        row["floor_used"] = floor_key


LATENCY_HEADER = (
    "variant",
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
)


def latency_rows(
    results: dict[str, dict[str, Any]], extra: Callable[[dict[str, Any]], str] | None = None
) -> list[tuple[str, ...]]:
    """One row per condition; times in µs, ratios from the median of block p50s."""
    rows: list[tuple[str, ...]] = []
    for row in results.values():
        us = row["us"]
        cells: tuple[str, ...] = (
            row["label"],
            str(row["n"]),
            fmt(us["p50"]),
            fmt(row["median_block_p50_us"]),
            fmt(us["p90"]),
            fmt(us["p99"]),
            fmt(us["p99.9"]),
            fmt(us["max"]),
            f"{row['x_floor']:.2f}",
            f"{row['x_inline']:.3f}",
            f"{row['pct_calls_over']['>30us']:.3f}",
        )
        rows.append(cells if extra is None else (*cells, extra(row)))
    return rows

"""Step-aligned export: the CPU each export costs, against periodic export of the same loop.

Usage: ``python benchmarks/bench_export.py [--quick] [--modes step,http,...] [--out PATH]``

A simulated training loop exports over OTLP to a real ``OtlpSink`` in another process
(``_receiver.py``, so decoding never takes this process's GIL). Each step logs the fixture's
calls (``tests/fixtures/grpo_step.json``, key ``calls``) through ``async_tee.Logger()`` in
the fixture's order, ``step_finished=True`` on ``timing/train`` (the ``ray`` call keeps
its own step axis), then sleeps until the step's deadline (deadlines are absolute, so
steps do not drift). The fixture's ``timing/setup`` call is logged once, at step 0.

Cells, each with a fresh session (``start_telemetry(environ=...)``, ended by
``shutdown_telemetry(10)``), the modes of one step length back to back:

- ``http``: step-aligned export over OTLP/HTTP, the defaults (``ASYNC_TEE_STEP_EXPORT=1``,
  ``OTEL_METRIC_EXPORT_INTERVAL`` at its 60 s, so every export is a step export): at the
  step boundary the worker builds the step's request from async_tee's tables and queues it
  (``OtlpSender.collect_step``); the ``async-tee-export`` thread sends it through async_tee's
  kept-alive ``http.client`` transport (no thread of its own: ``other`` is near 0).
- ``step``: the same over OTLP/gRPC (async_tee's gRPC transport: a grpc channel and a raw
  unary call; ``other`` is gRPC's C-core threads).
- ``periodic``: OTLP/gRPC, ``ASYNC_TEE_STEP_EXPORT=0`` and ``OTEL_METRIC_EXPORT_INTERVAL`` =
  the step length, so it also exports about once per step; the exporting thread builds the
  request and sends it.
- ``sdk-alone``: the baseline, no async_tee: the OTel SDK records the same series inline on
  the training thread, the seed's way (the same mapping, one synchronous instrument call per
  value: ``_blocks.seed_recorder``), and its own ``PeriodicExportingMetricReader`` with the
  SDK's ``OTLPMetricExporter`` exports them over OTLP/gRPC once a step (the Python SDK's
  ``otlp``); ``sdk-alone-http``: the same through the SDK's OTLP/HTTP exporter. Only the
  whole process's and the training thread's CPU are measured; the ratio table gives the
  process CPU per step of ``http`` (the default) and ``step`` (gRPC) over them, as totals
  over the measured steps and as the median and p99 over the per-step windows.

Full: 20 steps of 1 s and 4 steps of 10 s per mode, each after its warm-up steps (about
10 min). ``--quick``: 2 steps of 1 s per mode (about 40 s), a smoke run with no figure to
rely on.

Every cell starts with a warm-up: a flush (``force_flush``: the gRPC channel connects),
the setup call and one step, then 2 s so that the next step is at least
``ASYNC_TEE_MIN_EXPORT_INTERVAL`` (1 s) after the warm-up step's export (periodic: up to
half a period more, so that the timer's exports fall mid-step, see :func:`warmup_ns`), and
``WARMUP_STEPS`` (3) steps at the cell's step length: a trainer's steady cadence, which
the worker's timer follows (docs/semantics.md §6), is what the measured steps see. The
measured windows are the steps after them, from one step's start to the next's.

Measurement (thread CPU time, never wall time):

- Per export, inside the thread: the benchmark wraps the session sender's ``_send`` (one
  request sent, its answer settled) and ``_make`` (one request built from the tables; the
  observable callbacks) with ``time.thread_time_ns()`` (``CLOCK_THREAD_CPUTIME_ID``:
  nanosecond CPU time of the calling thread), so each export has its own sample whatever
  thread does it. The exporting thread's CPU per export is the send plus, in periodic
  mode, the build it made itself (paired by the request). The wrappers cost two clock
  reads each.
- Per step window, whole threads: the ``async-tee-export`` and ``async-tee-worker``
  threads' CPU clocks (``pthread_getcpuclockid``, read from the training thread at each
  step start; nanoseconds, unlike ``/proc/self/task/<tid>/stat``'s utime+stime, which
  counts 10 ms ticks and cannot resolve a ~1 ms export), the training thread's own, and
  the process's (``process_time_ns``). ``other`` is the process minus those three: gRPC's
  C-core threads (about nothing over OTLP/HTTP). Exporting-thread diffs are one export per
  window in the step-aligned modes (the export follows the boundary by ~0.1 s), about one
  in ``periodic`` mode (the timer drifts against the steps; windows with another count are
  reported).

Reported per cell: percentiles (nearest rank; p50/p99/p99.9/max, n small so the tail is
the max) and totals (sum over the measured windows, divided by steps or exports); the
worker's wakes per window (``Worker.wakes``: its loop's iterations, timer or woken);
``stats()["exports_by_trigger"]``, ``stats()["steps"]`` and ``stats()["delivery"]`` after
the measured steps and after shutdown. In the step-aligned modes every step must get its
own export (``steps.exported == steps.completed``, ``coalesced == 0``, one step export per
measured window); otherwise a WARNING line is printed and recorded. Ratios step/periodic:
the exporting thread's CPU per export (p50 and total/exports), and all the session's
threads' CPU per step; the process CPU per step of ``http`` and ``step`` over the SDK
alone's.

Output: a table on stdout, JSON at ``--out`` (default: a temp dir, as the other parts run
alone). ``run_all.py`` keeps it as the ``export`` part of ``results/latest.json`` and puts its
section in ``latest.md``: the one copy of the figures.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import math
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from _blocks import seed_recorder
from _common import (
    FIXTURE,
    bench_parser,
    fmt_opt,
    machine_info,
    md_table,
    percentiles,
    progress,
    quiet_logging,
    start_receiver,
    text_table,
    thread_cpu_ns,
)

import async_tee
from async_tee import testing

WORKER = "async-tee-worker"
EXPORTER = "async-tee-export"
MODES = ("http", "step", "periodic", "sdk-alone", "sdk-alone-http")
STEP_MODES = ("http", "step")  # every export a step export
HTTP_MODES = ("http", "sdk-alone-http")  # OTLP/HTTP
SDK_ALONE = "sdk-alone"  # no async_tee: the OTel SDK alone, the seed's way (OTLP/gRPC)
SDK_ALONE_HTTP = "sdk-alone-http"  # the same over the SDK's OTLP/HTTP exporter
FULL_CELLS = ((1.0, 20), (10.0, 4))  # (step length s, measured steps) per mode
QUICK_CELLS = ((1.0, 2),)
WARMUP_S = 2.0
WARMUP_STEPS = 3  # steps at the cell's step length before the measured ones
SHUTDOWN_TIMEOUT_S = 10
JOIN_S = 5.0
FLUSH_S = 5.0

# ------------------------------------------------------------------ the simulated loop


@dataclass(frozen=True)
class Call:
    """One fixture call: what ``Logger.log_metrics`` is given."""

    prefix: str
    metrics: dict[str, Any]
    step: int
    step_metric: str | None
    step_finished: bool


def fixture_calls() -> tuple[Call, list[Call]]:
    """The fixture's setup call (step 0) and one step's calls, in the fixture's order."""
    calls = [
        Call(
            c["prefix"],
            dict(c["metrics"]),
            c["step"],
            c.get("step_metric"),
            bool(c.get("step_finished", False)),
        )
        for c in json.loads(FIXTURE.read_text())["calls"]
    ]
    setup = [c for c in calls if c.prefix == "timing/setup"]
    if len(setup) != 1 or not any(c.step_finished for c in calls):
        raise SystemExit(f"{FIXTURE}: expected one timing/setup call and a step_finished call")
    return setup[0], [c for c in calls if c is not setup[0]]


def log_step(logger: async_tee.Logger, calls: Iterable[Call], step: int) -> None:
    """Log one step's calls; a call with its own step axis keeps its own step."""
    for c in calls:
        logger.log_metrics(
            c.metrics,
            c.step if c.step_metric else step,
            c.prefix,
            step_metric=c.step_metric,
            step_finished=c.step_finished,
        )


# ------------------------------------------------------------------ the in-thread probe


@dataclass
class Sent:
    """One send (the sender's ``_send``), timed on the thread that made it."""

    at_ns: int  # perf_counter_ns when it started
    trigger: str
    thread: str
    send_cpu_ns: int
    send_wall_ns: int
    make_cpu_ns: int = 0  # building its request, when the same thread built it (periodic)

    @property
    def thread_cpu_ns(self) -> int:
        """What this export cost the thread that sent it."""
        return self.send_cpu_ns + self.make_cpu_ns


@dataclass
class Made:
    """One request built (the sender's ``_make``) on its thread."""

    at_ns: int
    trigger: str
    thread: str
    cpu_ns: int


@dataclass
class Probe:
    """Wraps a session sender's ``_make`` and ``_send`` to time each on its own thread."""

    sender: Any
    sent: list[Sent] = field(default_factory=list)
    made: list[Made] = field(default_factory=list)
    _made_by: dict[int, Made] = field(default_factory=dict)  # request id -> its build

    def install(self) -> None:
        sender = self.sender
        make: Callable[..., Any] = sender._make
        send: Callable[..., Any] = sender._send
        clock = time.thread_time_ns

        def timed_make(trigger: str, *args: Any, **kwargs: Any) -> Any:
            at, cpu = perf_counter_ns(), clock()
            request = None
            try:
                request = make(trigger, *args, **kwargs)
                return request
            finally:
                record = Made(at, trigger, _thread_name(), clock() - cpu)
                self.made.append(record)
                if request is not None:
                    self._made_by[id(request)] = record

        def timed_send(request: Any, *args: Any, **kwargs: Any) -> Any:
            at, cpu = perf_counter_ns(), clock()
            try:
                return send(request, *args, **kwargs)
            finally:
                spent, wall = clock() - cpu, perf_counter_ns() - at
                thread = _thread_name()
                built = self._made_by.pop(id(request), None)
                own = built.cpu_ns if built is not None and built.thread == thread else 0
                self.sent.append(Sent(at, request.trigger, thread, spent, wall, own))

        setattr(sender, "_make", timed_make)  # noqa: B010 - an instance attribute
        setattr(sender, "_send", timed_send)  # noqa: B010


def _thread_name() -> str:
    return threading.current_thread().name


# ------------------------------------------------------------------ one cell


@dataclass(frozen=True)
class Sample:
    """CPU clocks read at one step start (ns)."""

    wall: int
    process: int
    main: int
    worker: int | None
    exporter: int | None
    wakes: int | None = None  # the worker's loop iterations so far (``Worker.wakes``)


def environ_for(mode: str, step_s: float, port: int) -> dict[str, str]:
    """The session's whole environment (``start_telemetry(environ=...)``)."""
    env = {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf" if mode in HTTP_MODES else "grpc",
    }
    if mode in STEP_MODES:
        env["ASYNC_TEE_STEP_EXPORT"] = "1"
    else:
        env["ASYNC_TEE_STEP_EXPORT"] = "0"
        env["OTEL_METRIC_EXPORT_INTERVAL"] = str(round(step_s * 1000))
    return env


def warmup_ns(mode: str, step_s: float) -> int:
    """From the warm-up flush to the first measured step.

    ``step`` (and the SDK alone): ``WARMUP_S`` and ``WARMUP_STEPS`` steps. ``periodic``:
    the interval's exports follow the flush every period, so the first measured step
    starts half a period before one of them, at least that long after the flush: each
    periodic export then falls mid-window, away from the step's own calls and from the
    window edges, whatever the timer's drift (a few ms a period).
    """
    lead = WARMUP_S + WARMUP_STEPS * step_s
    if mode in STEP_MODES or mode in (SDK_ALONE, SDK_ALONE_HTTP):
        return round(lead * 1e9)
    periods = math.ceil(lead / step_s + 0.5)
    return round((periods - 0.5) * step_s * 1e9)


def _warm_steps(log: Callable[[int], None], start: int, period: int) -> int:
    """Log ``WARMUP_STEPS`` steps (2, 3, ...) a period apart, the last one a period before
    ``start``; the number of the first measured step."""
    for ahead in range(WARMUP_STEPS, 0, -1):
        _sleep_until(start - ahead * period)
        log(2 + WARMUP_STEPS - ahead)
    return 2 + WARMUP_STEPS


def _sample(
    worker: threading.Thread | None, exporter: threading.Thread | None, loop: Any = None
) -> Sample:
    return Sample(
        perf_counter_ns(),
        time.process_time_ns(),
        time.thread_time_ns(),
        thread_cpu_ns(worker) if worker else None,
        thread_cpu_ns(exporter) if exporter else None,
        None if loop is None else loop.wakes,
    )


def _sleep_until(deadline_ns: int) -> None:
    remaining = (deadline_ns - perf_counter_ns()) / 1e9
    if remaining > 0:
        time.sleep(remaining)


def _thread(threads: list[threading.Thread], name: str) -> threading.Thread | None:
    return next((t for t in threads if t.name == name), None)


def _sender(handle: async_tee.Pipeline) -> Any:
    """The session's OTLP sender (its thread is the exporting thread)."""
    sender = handle.exports.sender
    if sender is None:
        raise RuntimeError("the session has no OTLP sender")
    return sender


def _step_stats(stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "exports_by_trigger": stats["exports_by_trigger"],
        "steps": stats["steps"],
        "delivery": stats["delivery"],
    }


def run_sdk_alone_cell(step_s: float, steps: int, port: int, mode: str) -> dict[str, Any]:
    """The baseline: no async_tee; the OTel SDK records the same series inline (the seed's
    way) and its ``PeriodicExportingMetricReader`` exports them once a step, over OTLP/gRPC
    (``sdk-alone``) or OTLP/HTTP (``sdk-alone-http``), each the SDK's own exporter."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    setup, calls = fixture_calls()
    exporter: Any
    if mode == SDK_ALONE_HTTP:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpExporter,
        )

        exporter = HttpExporter(endpoint=f"http://127.0.0.1:{port}/v1/metrics")
    else:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        exporter = OTLPMetricExporter(endpoint=f"http://127.0.0.1:{port}", insecure=True)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=step_s * 1000)
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    record = seed_recorder(provider.get_meter("seed"))

    def tee(call: Call, step: int) -> None:
        record(call.metrics, call.prefix, step)

    period = round(step_s * 1e9)
    try:
        reader.force_flush(round(FLUSH_S * 1000))  # the connection opens before any window
        warm = perf_counter_ns()
        tee(setup, 0)

        def tee_step(step: int) -> None:
            for call in calls:
                tee(call, step)

        tee_step(1)
        start = warm + warmup_ns(mode, step_s)
        first = _warm_steps(tee_step, start, period)
        samples = []
        for index in range(steps):
            _sleep_until(start + index * period)
            samples.append(_sample(None, None))
            tee_step(first + index)
        _sleep_until(start + steps * period)
        samples.append(_sample(None, None))
    finally:
        provider.shutdown()
    process, main = _diffs(samples, "process"), _diffs(samples, "main")
    assert process is not None
    assert main is not None
    threads = [p - m for p, m in zip(process, main, strict=True)]
    return {
        "mode": mode,
        "step_s": step_s,
        "steps": steps,
        "exports": steps,
        "exporter_cpu_per_export_us": None,
        "make_cpu_us": None,
        "make_threads": {},
        "exporter_thread_cpu_per_step_us": None,
        "worker_cpu_per_step_us": None,
        "worker_wakes_per_step": None,
        "main_cpu_per_step_us": _pcts(main),
        "threads_cpu_per_step_us": _pcts(threads),
        "process_cpu_per_step_us": _pcts(process),
        "totals": {
            "worker_cpu_per_step_us": None,
            "worker_wakes_per_step": None,
            "threads_cpu_per_step_us": sum(threads) / steps / 1000,
            "process_cpu_per_step_us": sum(process) / steps / 1000,
        },
        "warnings": [],
    }


def run_cell(mode: str, step_s: float, steps: int, port: int) -> dict[str, Any]:
    """Warm up, run ``steps`` measured steps, shut down; every raw figure of the cell."""
    if mode in (SDK_ALONE, SDK_ALONE_HTTP):
        return run_sdk_alone_cell(step_s, steps, port, mode)
    setup, calls = fixture_calls()
    logger = async_tee.Logger()
    environ = environ_for(mode, step_s, port)
    handle = async_tee.start_telemetry(environ=environ)
    if not isinstance(handle, async_tee.Pipeline) or not handle.is_exporting:
        raise RuntimeError("start_telemetry did not start exporting")
    threads = list(handle.threads)
    worker, exporter = _thread(threads, WORKER), _thread(threads, EXPORTER)
    sender = _sender(handle)
    probe = Probe(sender)
    probe.install()
    period = round(step_s * 1e9)
    info: dict[str, Any] = {}
    try:
        sender.force_flush(FLUSH_S)  # the connection opens before any window
        warm = perf_counter_ns()
        log_step(logger, [setup], 0)
        log_step(logger, calls, 1)
        start = warm + warmup_ns(mode, step_s)
        first = _warm_steps(lambda step: log_step(logger, calls, step), start, period)
        _sleep_until(start)
        samples = []
        for index in range(steps):
            _sleep_until(start + index * period)
            samples.append(_sample(worker, exporter, handle.worker))
            log_step(logger, calls, first + index)
        _sleep_until(start + steps * period)
        samples.append(_sample(worker, exporter, handle.worker))
        info["before_shutdown"] = _step_stats(async_tee.stats())
    finally:
        began = time.perf_counter()
        info["shutdown_ok"] = async_tee.shutdown_telemetry(SHUTDOWN_TIMEOUT_S)
        info["shutdown_s"] = time.perf_counter() - began
        for thread in threads:
            thread.join(max(0.0, began + JOIN_S - time.perf_counter()))
        info["threads_left"] = [t.name for t in threads if t.is_alive()]
        info["after_shutdown"] = _step_stats(async_tee.stats())
        testing.reset(2.0)
    settings = handle.settings
    return summarise(
        mode,
        step_s,
        steps,
        samples,
        probe,
        info,
        {
            "environ": {k: v for k, v in environ.items() if k != "OTEL_EXPORTER_OTLP_ENDPOINT"},
            "step_export": settings.step_export,
            "export_interval_ms": settings.export_interval_ms,
            "min_export_interval_s": settings.min_export_interval_s,
        },
    )


# ------------------------------------------------------------------ summaries


def _pcts(values_ns: Iterable[int]) -> dict[str, Any] | None:
    """Percentiles (µs) and n of nanosecond samples, or None without samples."""
    hist = Counter(values_ns)
    if not hist:
        return None
    return {"n": sum(hist.values()), **percentiles(hist)}


def _counts(values: Iterable[int]) -> dict[str, Any] | None:
    """Nearest-rank p50, p99 and max of plain counts (wakes per step), or None."""
    ordered = sorted(values)
    if not ordered:
        return None
    n = len(ordered)
    pick = {
        name: ordered[max(1, math.ceil(q * n)) - 1] for name, q in (("p50", 0.5), ("p99", 0.99))
    }
    return {"n": n, **pick, "max": ordered[-1]}


def _diffs(samples: list[Sample], attr: str) -> list[int] | None:
    values = [getattr(s, attr) for s in samples]
    if any(v is None for v in values):
        return None
    return [b - a for a, b in itertools.pairwise(values)]


def summarise(
    mode: str,
    step_s: float,
    steps: int,
    samples: list[Sample],
    probe: Probe,
    info: dict[str, Any],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """Percentiles and totals of one cell, plus its checks."""
    edges = [s.wall for s in samples]
    first, last = edges[0], edges[-1]
    sent = [s for s in probe.sent if first <= s.at_ns < last]
    made = [m for m in probe.made if first <= m.at_ns < last]
    on_exporter = [s for s in sent if s.thread == EXPORTER]
    per_window = Counter(bisect.bisect_right(edges, s.at_ns) - 1 for s in on_exporter)
    window_exports = [per_window.get(i, 0) for i in range(steps)]

    worker = _diffs(samples, "worker")
    wakes = _diffs(samples, "wakes")
    exporter = _diffs(samples, "exporter")
    process = _diffs(samples, "process")
    main = _diffs(samples, "main")
    assert process is not None
    assert main is not None
    other = (
        None
        if worker is None or exporter is None
        else [p - m - w - e for p, m, w, e in zip(process, main, worker, exporter, strict=True)]
    )
    threads = (
        None
        if worker is None or exporter is None or other is None
        else [w + e + o for w, e, o in zip(worker, exporter, other, strict=True)]
    )
    exports = len(on_exporter)

    def total_ms(values: list[int] | None) -> float | None:
        return None if values is None else sum(values) / 1e6

    def per(values: list[int] | None, n: int) -> float | None:
        return None if values is None or not n else sum(values) / n / 1000

    cell: dict[str, Any] = {
        "mode": mode,
        "step_s": step_s,
        "steps": steps,
        "settings": settings,
        "wall_s": (last - first) / 1e9,
        "exports": exports,
        "exports_by_trigger": dict(Counter(s.trigger for s in on_exporter)),
        "exports_per_window": window_exports,
        "windows_not_one_export": sum(1 for n in window_exports if n != 1),
        # in-thread, per export
        "exporter_cpu_per_export_us": _pcts(s.thread_cpu_ns for s in on_exporter),
        "send_cpu_per_export_us": _pcts(s.send_cpu_ns for s in on_exporter),
        "send_wall_per_export_us": _pcts(s.send_wall_ns for s in on_exporter),
        "make_cpu_us": _pcts(m.cpu_ns for m in made),
        "make_threads": dict(Counter(m.thread for m in made)),
        # whole threads, per step window
        "exporter_thread_cpu_per_step_us": _pcts(exporter or []),
        "worker_cpu_per_step_us": _pcts(worker or []),
        "worker_wakes_per_step": _counts(wakes or []),
        "main_cpu_per_step_us": _pcts(main),
        "other_cpu_per_step_us": _pcts(other or []),
        "threads_cpu_per_step_us": _pcts(threads or []),
        "process_cpu_per_step_us": _pcts(process),
        "totals": {
            "exporter_thread_cpu_ms": total_ms(exporter),
            "worker_cpu_ms": total_ms(worker),
            "main_cpu_ms": total_ms(main),
            "other_cpu_ms": total_ms(other),
            "process_cpu_ms": total_ms(process),
            "exporter_thread_cpu_per_export_us": per(exporter, exports),
            "exporter_cpu_per_export_in_thread_us": (
                sum(s.thread_cpu_ns for s in on_exporter) / exports / 1000 if exports else None
            ),
            "worker_cpu_per_step_us": per(worker, steps),
            "worker_wakes_per_step": None if wakes is None else sum(wakes) / steps,
            "threads_cpu_per_step_us": per(threads, steps),
            "process_cpu_per_step_us": per(process, steps),
        },
        **info,
    }
    cell["warnings"] = check(cell)
    return cell


def check(cell: dict[str, Any]) -> list[str]:
    """Whether every step got an export of its own (step mode), and a clean shutdown."""
    warnings = []
    label = f"{cell['step_s']:g} s steps, {cell['mode']}"
    if cell["mode"] in STEP_MODES:
        for when in ("before_shutdown", "after_shutdown"):
            steps = cell[when]["steps"]
            if steps["exported"] != steps["completed"] or steps["coalesced"] != 0:
                warnings.append(
                    f"{label}: {when}: steps exported {steps['exported']} != completed "
                    f"{steps['completed']} or coalesced {steps['coalesced']} != 0"
                )
        step_exports = cell["exports_by_trigger"].get("step", 0)
        if step_exports != cell["steps"] or cell["windows_not_one_export"]:
            warnings.append(
                f"{label}: {step_exports} step exports in {cell['steps']} measured steps "
                f"(per window: {cell['exports_per_window']})"
            )
        failures = sum(t["failure"] for t in cell["after_shutdown"]["exports_by_trigger"].values())
        if failures:
            warnings.append(f"{label}: {failures} failed exports")
    elif cell["windows_not_one_export"]:
        warnings.append(
            f"{label}: {cell['windows_not_one_export']} windows without exactly one export "
            f"(per window: {cell['exports_per_window']}); per-step exporter diffs are mixed"
        )
    if not cell["shutdown_ok"] or cell["threads_left"]:
        warnings.append(f"{label}: shutdown ok={cell['shutdown_ok']}, left {cell['threads_left']}")
    return warnings


def _get(cell: dict[str, Any], key: str, stat: str) -> float | None:
    value = cell.get(key)
    return None if value is None else value[stat]


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not b else a / b


def _over(
    by_mode: dict[str, dict[str, Any]], top: str, bottom: str, key: str, stat: str | None = None
) -> float | None:
    """``top``'s figure over ``bottom``'s: a total, or the percentile ``stat``; None if either
    mode was not run."""
    if top not in by_mode or bottom not in by_mode:
        return None
    a, b = by_mode[top], by_mode[bottom]
    if stat is not None:
        return _ratio(_get(a, key, stat), _get(b, key, stat))
    return _ratio(a["totals"][key], b["totals"][key])


def ratios(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Step-aligned (gRPC) over periodic (gRPC), per step length (a ratio of a mode not run,
    ``--modes``, is None); the process CPU over the SDK alone: :func:`against_sdk`."""
    out = []
    for step_s in sorted({c["step_s"] for c in cells}):
        m = {c["mode"]: c for c in cells if c["step_s"] == step_s}
        out.append(
            {
                "step_s": step_s,
                "exporter_cpu_per_export_p50": _over(
                    m, "step", "periodic", "exporter_cpu_per_export_us", "p50"
                ),
                "exporter_thread_cpu_per_export_total": _over(
                    m, "step", "periodic", "exporter_thread_cpu_per_export_us"
                ),
                "worker_cpu_per_step_total": _over(m, "step", "periodic", "worker_cpu_per_step_us"),
                "threads_cpu_per_step_total": _over(
                    m, "step", "periodic", "threads_cpu_per_step_us"
                ),
            }
        )
    return out


def against_sdk(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The whole process's CPU per step (the training thread's tee or inline recording
    included) of ``http`` and ``step`` over the SDK alone exporting the same series: the
    totals' ratio, and the ratios of the per-step windows' median and p99."""
    out = []
    for step_s in sorted({c["step_s"] for c in cells}):
        by_mode = {c["mode"]: c for c in cells if c["step_s"] == step_s}
        for mode in STEP_MODES:
            for alone in (SDK_ALONE, SDK_ALONE_HTTP):
                if mode not in by_mode or alone not in by_mode:
                    continue
                ours, theirs = by_mode[mode], by_mode[alone]
                out.append(
                    {
                        "step_s": step_s,
                        "mode": mode,
                        "against": alone,
                        "process_cpu_per_step_us": ours["totals"]["process_cpu_per_step_us"],
                        "against_process_cpu_per_step_us": theirs["totals"][
                            "process_cpu_per_step_us"
                        ],
                        "total": _ratio(
                            ours["totals"]["process_cpu_per_step_us"],
                            theirs["totals"]["process_cpu_per_step_us"],
                        ),
                        **{
                            stat: _ratio(
                                _get(ours, "process_cpu_per_step_us", stat),
                                _get(theirs, "process_cpu_per_step_us", stat),
                            )
                            for stat in ("p50", "p99")
                        },
                    }
                )
    return out


# ------------------------------------------------------------------ tables


TITLE = (
    "Step-aligned export: CPU per export and per step, against periodic export and the SDK alone"
)
HEADER = (
    "step",
    "mode",
    "steps",
    "exports",
    "export thr µs/export p50",
    "p99",
    "max",
    "build µs p50 (thread)",
    "export thr µs/step p50",
    "worker µs/step p50",
    "p99",
    "max",
    "worker µs/step total",
    "worker wakes/step p50",
    "max",
    "threads µs/step total",
    "process µs/step total",
)


def table_rows(cells: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per cell; µs of thread CPU time."""
    rows: list[tuple[str, ...]] = []
    for c in cells:
        make_threads = ", ".join(sorted(c.get("make_threads", {}))).replace("async-tee-", "")
        rows.append(
            (
                f"{c['step_s']:g} s",
                c["mode"],
                str(c["steps"]),
                str(c["exports"]),
                fmt_opt(_get(c, "exporter_cpu_per_export_us", "p50")),
                fmt_opt(_get(c, "exporter_cpu_per_export_us", "p99")),
                fmt_opt(_get(c, "exporter_cpu_per_export_us", "max")),
                f"{fmt_opt(_get(c, 'make_cpu_us', 'p50'))} ({make_threads})",
                fmt_opt(_get(c, "exporter_thread_cpu_per_step_us", "p50")),
                fmt_opt(_get(c, "worker_cpu_per_step_us", "p50")),
                fmt_opt(_get(c, "worker_cpu_per_step_us", "p99")),
                fmt_opt(_get(c, "worker_cpu_per_step_us", "max")),
                fmt_opt(c["totals"]["worker_cpu_per_step_us"]),
                fmt_opt(_get(c, "worker_wakes_per_step", "p50"), "d"),
                fmt_opt(_get(c, "worker_wakes_per_step", "max"), "d"),
                fmt_opt(c["totals"]["threads_cpu_per_step_us"]),
                fmt_opt(c["totals"]["process_cpu_per_step_us"]),
            )
        )
    return rows


RATIO_HEADER = (
    "step",
    "export thr CPU/export p50",
    "export thr CPU/export total",
    "worker CPU/step total",
    "all threads CPU/step total",
)


def ratio_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """Step-aligned over periodic, per step length."""
    return [
        (
            f"{r['step_s']:g} s",
            fmt_opt(r["exporter_cpu_per_export_p50"], ".2f"),
            fmt_opt(r["exporter_thread_cpu_per_export_total"], ".2f"),
            fmt_opt(r["worker_cpu_per_step_total"], ".2f"),
            fmt_opt(r["threads_cpu_per_step_total"], ".2f"),
        )
        for r in report["ratios"]
    ]


SDK_HEADER = (
    "step",
    "async_tee",
    "against the SDK alone",
    "async_tee µs/step total",
    "SDK alone µs/step total",
    "ratio: totals",
    "per-step p50",
    "per-step p99",
)
PROTOCOLS = {"http": "HTTP (default)", "step": "gRPC", SDK_ALONE: "gRPC", SDK_ALONE_HTTP: "HTTP"}


def sdk_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """Process CPU per step against the SDK alone, per step length."""
    return [
        (
            f"{r['step_s']:g} s",
            PROTOCOLS[r["mode"]],
            PROTOCOLS[r["against"]],
            fmt_opt(r["process_cpu_per_step_us"], ".0f"),
            fmt_opt(r["against_process_cpu_per_step_us"], ".0f"),
            fmt_opt(r["total"], ".2f"),
            fmt_opt(r["p50"], ".2f"),
            fmt_opt(r["p99"], ".2f"),
        )
        for r in report["against_sdk"]
    ]


def section(report: dict[str, Any]) -> list[str]:
    """The export tables as markdown lines (no title)."""
    cfg = report["config"]
    cells = report["cells"]
    lines = [
        "Simulated loop: per step the fixture's calls through `async_tee.Logger()` "
        "(`step_finished` on `timing/train`), then sleep to the step's deadline; OTLP "
        "to an `OtlpSink` in another process. `http`: step-aligned export over OTLP/HTTP, "
        "the default (the worker builds the step's request from the tables and queues it, "
        "`async-tee-export` sends it); `step`: the same over gRPC; `periodic`: gRPC, "
        "`ASYNC_TEE_STEP_EXPORT=0`, `OTEL_METRIC_EXPORT_INTERVAL` = step length (the "
        "exporting thread builds and sends); `sdk-alone` / `sdk-alone-http`: no async_tee, "
        "the OTel SDK records the same series inline (the seed's way) and its own "
        "`PeriodicExportingMetricReader` and OTLP exporter (gRPC / HTTP) export once a "
        f"step. Cells (step s, measured steps): {cfg['cells']}, each after a "
        f"{cfg['warmup_s']:g} s warm-up and {cfg.get('warmup_steps', 0)} steps at the cell's "
        "step length (periodic: until the timer's exports fall mid-step). "
        "Thread CPU time in µs: per export from "
        "`time.thread_time_ns` around the sender's `_send` and `_make` on the thread that "
        "runs them (the exporting thread's cost per export: the send, plus the build in "
        "periodic mode); per step from the threads' CPU clocks (`pthread_getcpuclockid`) "
        "read at each step start; totals are sums over the measured steps divided by steps. "
        "`threads` = worker + exporting thread + gRPC's own threads (process minus the "
        "training thread).",
        "",
        *md_table(HEADER, table_rows(cells)),
        "",
        "Step-aligned over periodic (gRPC):",
        "",
        *md_table(RATIO_HEADER, ratio_rows(report)),
        "",
        "Process CPU per step (the training thread's calls and every thread) against the "
        "OTel SDK alone exporting the same series: the totals' ratio, and the ratios of the "
        "per-step windows' p50 and p99 (nearest rank: with few windows, the p99 is the max):",
        "",
        *md_table(SDK_HEADER, sdk_rows(report)),
    ]
    warnings = [w for c in cells for w in c["warnings"]]
    lines += ["", *(f"WARNING: {w}" for w in warnings)] if warnings else []
    checks = [
        f"{c['step_s']:g} s: steps completed {c['after_shutdown']['steps']['completed']}, "
        f"exported {c['after_shutdown']['steps']['exported']}, coalesced "
        f"{c['after_shutdown']['steps']['coalesced']}"
        for c in cells
        if c["mode"] in STEP_MODES
    ]
    lines += ["", "Every step exported (step mode, whole session): " + "; ".join(checks) + "."]
    return lines


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(__doc__)
    parser.add_argument(
        "--modes",
        type=lambda text: tuple(text.split(",")),
        default=MODES,
        help=f"the modes to run, comma-separated (default: all, {','.join(MODES)})",
    )
    args = parser.parse_args(argv)
    if unknown := set(args.modes) - set(MODES):
        parser.error(f"unknown modes: {sorted(unknown)}")
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="async-tee-bench-")) / "export.json"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_logging()
    started = time.perf_counter()
    plan = QUICK_CELLS if args.quick else FULL_CELLS
    cells = []
    with contextlib.ExitStack() as stack:
        receiver = start_receiver(stack)
        for step_s, steps in plan:
            for mode in args.modes:
                warmup_s = warmup_ns(mode, step_s) / 1e9
                progress(f"{step_s:g} s steps, {mode}: {steps} steps after {warmup_s:g} s warm-up")
                port = receiver.http_port if mode in HTTP_MODES else receiver.grpc_port
                cell = run_cell(mode, step_s, steps, port)
                cells.append(cell)
                for warning in cell["warnings"]:
                    print(f"WARNING: {warning}", flush=True)
    report: dict[str, Any] = {
        "machine": machine_info(),
        "config": {
            "quick": args.quick,
            "cells": [[step_s, steps] for step_s, steps in plan],
            "modes": list(args.modes),
            "warmup_s": WARMUP_S,
            "warmup_steps": WARMUP_STEPS,
            "fixture_prefixes": [c.prefix for c in fixture_calls()[1]],
            "shutdown_timeout_s": SHUTDOWN_TIMEOUT_S,
        },
        "method": (
            "per export: time.thread_time_ns (CLOCK_THREAD_CPUTIME_ID) inside the thread "
            "around the sender's _send and _make; per step: pthread_getcpuclockid clocks "
            "of the worker and exporting threads read at each step start"
        ),
        "cells": cells,
    }
    report["ratios"] = ratios(cells)
    report["against_sdk"] = against_sdk(cells)
    report["duration_s"] = time.perf_counter() - started
    console = [
        TITLE + " (thread CPU µs)",
        *text_table(HEADER, table_rows(cells)),
        "",
        "Step-aligned / periodic (gRPC)",
        *text_table(RATIO_HEADER, ratio_rows(report)),
        "",
        "Process CPU per step against the OTel SDK alone",
        *text_table(SDK_HEADER, sdk_rows(report)),
    ]
    console += [f"WARNING: {w}" for c in cells for w in c["warnings"]]
    print("\n" + "\n".join(console))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    print(f"bench_export took {report['duration_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

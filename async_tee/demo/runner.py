"""The demo run: a GRPO run's calls, from its threads, to a real sink (docs/semantics.md §1)."""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from async_tee._declare import series as _series
from async_tee._declare import shipped as _default_rows
from async_tee._session import lifecycle as _telemetry
from async_tee.demo.simulation import GrpoSimulation
from async_tee.demo.timing import TimedLogger, latency_by_prefix, percentiles_us
from async_tee.logger import JsonlBackend

if TYPE_CHECKING:
    from async_tee.sink import OtlpSink

__all__ = ["DemoResult", "ReceivedSeries", "run"]

DEFAULT_STEPS = 20
DEFAULT_STEP_SECONDS = 0.5
EXPORT_INTERVAL_MS = 1000
"""``OTEL_METRIC_EXPORT_INTERVAL`` for the embedded sink: the sink sees data every second."""

_CALL_TIMEOUT_S = 30.0  # how long the loop waits for the event-loop caller; never reached
_LEADING = frozenset((_series.RL_EFFICIENCY_CATEGORY_ATTR, _series.RL_SETUP_PHASE_ATTR))
_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")


@dataclasses.dataclass(frozen=True)
class ReceivedSeries:
    """The last point the sink received for one (series, attribute set).

    Attributes:
        name: The OTel series name.
        attributes: The point's attributes.
        value: The number, or for a histogram ``count`` and ``sum`` as text.
        unit: The series unit.
        kind: ``gauge``, ``sum`` or ``histogram`` (as received on the wire).
        steps_logged: The steps the run logged this series in (None: not a logged series).
        steps_received: How many of those reached the sink in an export carrying that
            step's number (``rl.step``): with step-aligned export, all of them.
    """

    name: str
    attributes: dict[str, Any]
    value: float | int | str | None
    unit: str
    kind: str
    steps_logged: int | None = None
    steps_received: int | None = None


@dataclasses.dataclass
class DemoResult:
    """What a demo run did and measured; :meth:`as_dict` is its JSON form.

    Attributes:
        steps: Training steps simulated.
        step_seconds: Simulated work per step.
        mode: ``embedded`` (a sink started by the demo) or ``external``
            (``OTEL_EXPORTER_OTLP_ENDPOINT``).
        endpoint: Where metrics were exported.
        stalled: Whether the embedded sink was stalled (``--stall``).
        series: The last point per series and attribute set the sink received, sorted;
            None in external mode (the demo cannot see the collector).
        missing_defaults: Default series (and efficiency categories, setup phases) the
            sink did not receive; None in external mode.
        counter_checks: Per default counter, the sum of the deltas logged and the total
            received (``None`` when nothing arrived).
        latency_us: Per prefix and ``all``: ``calls`` and ``tee`` / ``log_metrics``
            percentiles (``p50``, ``p99``, ``max``) in microseconds, caller side.
        paced_floor_us: The paced floor's percentiles: the ``train`` dicts copied into a
            deque between the calls, after as much idle time (``TimedLogger.time_floor``).
        tee_cpu_us: The ``train`` tee's CPU time on the calling thread, percentiles.
        loop_seconds: Wall time of the training loop (steps only).
        log_seconds_on_training_thread: Time the training callers (the loop and the event
            loop's coroutine, not the GPU monitor) spent in log_metrics.
        stats: ``async_tee.stats()`` after shutdown.
        delivered: What ``shutdown_telemetry`` returned.
        shutdown_seconds: How long ``shutdown_telemetry`` took.
        shutdown_timeout_s: The deadline it was given.
        jsonl_path: The JSONL backend's file, or None if it was a removed temporary one.
        jsonl_lines: Lines the JSONL backend wrote.
        monitor_calls: ``ray`` dicts the GPU-monitor thread logged.
    """

    steps: int
    step_seconds: float
    mode: str
    endpoint: str
    stalled: bool
    series: list[ReceivedSeries] | None
    missing_defaults: list[str] | None
    counter_checks: dict[str, dict[str, float | None]]
    latency_us: dict[str, dict[str, Any]]
    paced_floor_us: dict[str, float]
    tee_cpu_us: dict[str, float]
    loop_seconds: float
    log_seconds_on_training_thread: float
    stats: dict[str, Any]
    delivered: bool
    shutdown_seconds: float
    shutdown_timeout_s: float
    jsonl_path: str | None
    jsonl_lines: int
    monitor_calls: int

    @property
    def ok(self) -> bool:
        """False only when the embedded, unstalled sink missed a default series."""
        return self.mode != "embedded" or self.stalled or not self.missing_defaults

    def as_dict(self) -> dict[str, Any]:
        """The result as a JSON-ready dict."""
        out = dataclasses.asdict(self)
        out["ok"] = self.ok
        return out


class _EventLoopThread:
    """An asyncio loop running on its own thread: the async trainer's caller context."""

    def __init__(self) -> None:
        import asyncio

        self._asyncio = asyncio
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._serve, name="async-tee-demo-event-loop", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        self._asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def call(self, function: Callable[[], None]) -> None:
        """Run ``function`` inside a coroutine on the loop and wait for it."""

        async def task() -> None:
            await self._asyncio.sleep(0)  # a real task: we are inside the running loop
            function()

        self._asyncio.run_coroutine_threadsafe(task(), self.loop).result(_CALL_TIMEOUT_S)

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(_CALL_TIMEOUT_S)


def _expected_defaults(setup_phases: list[str]) -> list[tuple[str, dict[str, str]]]:
    """(series, required attributes) of every default series a run must deliver."""
    expected: list[tuple[str, dict[str, str]]] = [
        (row.name, {}) for row in _default_rows.TRAINING_SCALARS + _default_rows.VLLM_DELTAS
    ]
    expected += [
        (_series.EFFICIENCY_SECONDS.name, {_series.RL_EFFICIENCY_CATEGORY_ATTR: category})
        for category in _default_rows.EFFICIENCY_CATEGORIES
    ]
    expected.append((_series.EFFICIENCY_PCT.name, {}))
    expected += [
        (_series.SETUP_DURATION.name, {_series.RL_SETUP_PHASE_ATTR: phase})
        for phase in setup_phases
    ]
    return expected


def _label(name: str, attributes: Mapping[str, str]) -> str:
    inner = ",".join(f"{key}={value}" for key, value in attributes.items())
    return f"{name}{{{inner}}}" if inner else name


def _steps_logged(name: str, steps: int) -> set[int]:
    """The steps the demo logs ``name`` in: start-up phases at step 0, the rest every step."""
    if not name.startswith("rl."):
        return set()
    return {0} if name == _series.SETUP_DURATION.name else set(range(steps))


def _received(sink: OtlpSink, steps: int) -> list[ReceivedSeries]:
    series = []
    for point in sink.latest().values():
        logged = _steps_logged(point.name, steps)
        if point.name == _series.STEP.name:  # its own values are the steps
            exported = {p.value for p in sink.points() if p.name == point.name}
        else:
            exported = {step for step, _ in sink.by_step(point.name, point.attributes)}
        received = len(logged & exported) if logged else None
        value: float | int | str | None = point.value
        if point.value_type == "histogram":
            value = f"count={point.count} sum={point.sum:.6g}" if point.sum is not None else None
        # The attribute that tells a series' points apart goes first, the rest by name.
        attributes = dict(
            sorted(point.attributes.items(), key=lambda kv: (kv[0] not in _LEADING, kv[0]))
        )
        series.append(
            ReceivedSeries(
                point.name,
                attributes,
                value,
                point.unit,
                point.kind,
                len(logged) if logged else None,
                received,
            )
        )
    series.sort(key=lambda s: (s.name, [str(v) for v in s.attributes.values()]))
    return series


def _missing(series: list[ReceivedSeries], expected: list[tuple[str, dict[str, str]]]) -> list[str]:
    missing = []
    for name, attributes in expected:
        found = any(
            s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
            for s in series
        )
        if not found:
            missing.append(_label(name, attributes))
    return missing


def _progress_line(
    step: int, steps: int, values: Mapping[str, Any], tee_ns: list[int], step_tee_ns: list[int]
) -> str:
    return (
        f"step {step + 1:>{len(str(steps))}}/{steps}  reward {values['reward']:.3f}  "
        f"loss {values['loss']:+.4f}  lr {values['lr']:.2e}  "
        f"gen tokens {values['mean_gen_tokens_per_sample']:.0f}  "
        f"tee p50 {percentiles_us(tee_ns)['p50']:.1f} µs (this step's max "
        f"{percentiles_us(step_tee_ns)['max']:.1f} µs)"
    )


def run(
    steps: int = DEFAULT_STEPS,
    step_seconds: float = DEFAULT_STEP_SECONDS,
    *,
    stall: bool = False,
    jsonl_path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    progress: TextIO | None = None,
    shutdown_timeout_s: float = 5.0,
    seed: int = 0,
) -> DemoResult:
    """Run the simulated training, export it, and measure it.

    Starts and shuts down async_tee telemetry itself, so it must not be running already.

    Args:
        steps: Training steps to simulate.
        step_seconds: Simulated work per step (the training thread sleeps, as it would
            while the GPU works).
        stall: Stall the embedded sink for the whole run: nothing arrives, and training
            keeps its pace. Ignored in external mode.
        jsonl_path: Where the ``JsonlBackend`` writes; None for a temporary file, removed
            at the end.
        environ: Variables to read instead of ``os.environ``; when one of
            ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is set
            the demo exports there instead of to an embedded sink.
        progress: Where to write one line per step (None: nowhere).
        shutdown_timeout_s: The deadline given to ``shutdown_telemetry``.
        seed: Seed of the simulated values.

    Returns:
        What was received and measured.

    Raises:
        ValueError: ``steps`` < 1, or ``step_seconds`` or ``shutdown_timeout_s`` < 0.
        RuntimeError: async_tee telemetry is already running in this process.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if not step_seconds >= 0 or not shutdown_timeout_s >= 0:
        raise ValueError("step_seconds and shutdown_timeout_s must be >= 0")
    if _telemetry.active() is not None:
        raise RuntimeError("async_tee telemetry is already running; the demo starts its own")
    base_env = dict(os.environ if environ is None else environ)
    external = any(base_env.get(name, "").strip() for name in _ENDPOINT_VARIABLES)
    with tempfile.TemporaryDirectory(prefix="async-tee-demo-") as scratch:
        path = Path(jsonl_path) if jsonl_path is not None else Path(scratch) / "metrics.jsonl"
        result = _run(
            steps,
            step_seconds,
            stall and not external,
            external,
            base_env,
            path,
            progress,
            shutdown_timeout_s,
            seed,
        )
        result.jsonl_lines = _count_lines(path)
        result.jsonl_path = None if jsonl_path is None else str(path)
    return result


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as file:
            return sum(1 for _ in file)
    except OSError:
        return 0


def _run(
    steps: int,
    step_seconds: float,
    stall: bool,
    external: bool,
    base_env: dict[str, str],
    path: Path,
    progress: TextIO | None,
    shutdown_timeout_s: float,
    seed: int,
) -> DemoResult:
    import async_tee
    from async_tee.sink import OtlpSink

    sink: OtlpSink | None = None
    if external:
        env = base_env
        endpoint = next(
            base_env[name]
            for name in reversed(_ENDPOINT_VARIABLES)
            if base_env.get(name, "").strip()
        )
    else:
        sink = OtlpSink().start()
        if stall:
            sink.stall()
        endpoint = sink.http_endpoint
        env = {
            key: value
            for key, value in base_env.items()
            if not key.startswith("OTEL_EXPORTER_OTLP_") and key != "OTEL_METRICS_EXPORTER"
        }
        env.update(
            {
                "OTEL_METRICS_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_EXPORTER_OTLP_TIMEOUT": "2",  # a stalled export gives up in 2 s
                "OTEL_METRIC_EXPORT_INTERVAL": str(EXPORT_INTERVAL_MS),
            }
        )
        # Every step its own export, at the demo's short steps too (the default is 1 s).
        env.setdefault("ASYNC_TEE_MIN_EXPORT_INTERVAL", str(min(1.0, step_seconds / 2)))
        env.setdefault("OTEL_SERVICE_NAME", "async-tee-demo")
    simulation = GrpoSimulation(steps, seed)
    backend = JsonlBackend(path)
    logger = TimedLogger([backend])
    stop_monitor = threading.Event()
    monitor_calls = [0]
    loop_thread: _EventLoopThread | None = None
    monitor: threading.Thread | None = None

    def watch_gpus() -> None:
        logger.roles[threading.get_ident()] = "monitor"
        interval = max(0.05, 4 * step_seconds)
        while True:
            logger.log_metrics(
                simulation.gpus(), monitor_calls[0], "ray", step_metric="ray/ray_step"
            )
            monitor_calls[0] += 1
            if stop_monitor.wait(interval):
                return

    delivered = False
    shutdown_seconds = loop_seconds = 0.0
    tee_ns_training: list[int] = []

    def mark_event_loop_caller() -> None:
        logger.roles[threading.get_ident()] = "event loop"

    try:
        async_tee.start_telemetry(environ=env)
        loop_thread = _EventLoopThread()
        loop_thread.call(mark_event_loop_caller)
        monitor = threading.Thread(
            target=watch_gpus, name="async-tee-demo-gpu-monitor", daemon=True
        )
        setup = simulation.setup()
        setup_total = setup["total_setup_time_s"]
        loop_start = time.perf_counter()
        logger.log_metrics(setup, 0, "timing/setup")
        monitor.start()
        rollout: dict[str, Any] = {}
        train: dict[str, Any] = {}
        for step in range(steps):
            step_start = time.perf_counter()
            first = len(logger.samples)
            # Generation, then training; halfway through each, the paced floor on the dict
            # logged after it last step, with caches as cold as the call's will be.
            time.sleep(0.3 * step_seconds)
            if rollout:
                logger.time_floor(rollout)
            time.sleep(0.3 * step_seconds)
            rollout = simulation.rollout(step)
            logger.log_metrics(rollout, step, "train")
            time.sleep(0.2 * step_seconds)
            if train:
                logger.time_floor(train)
            time.sleep(0.2 * step_seconds)
            train = simulation.train(step, rollout)
            logger.log_metrics(train, step, "train")
            logger.log_metrics(simulation.performance(step_seconds, rollout), step, "performance")
            efficiency = simulation.efficiency(step, setup_total)
            loop_thread.call(functools.partial(logger.log_metrics, efficiency, step, ""))
            logger.log_metrics(simulation.timing(), step, "timing/train", step_finished=True)
            step_tee_ns = [tee for _, tee, _, role in logger.samples[first:] if role != "monitor"]
            tee_ns_training.extend(step_tee_ns)
            if progress is not None:
                progress.write(
                    _progress_line(step, steps, train, tee_ns_training, step_tee_ns) + "\n"
                )
                progress.flush()
            # Keep the step's pace whatever the calls cost, like a GPU-bound step would.
            remaining = step_seconds - (time.perf_counter() - step_start)
            if remaining > 0:
                time.sleep(remaining)
        loop_seconds = time.perf_counter() - loop_start
    finally:
        stop_monitor.set()
        if monitor is not None and monitor.ident is not None:
            monitor.join(_CALL_TIMEOUT_S)
        if loop_thread is not None:
            loop_thread.close()
        started = time.perf_counter()
        delivered = async_tee.shutdown_telemetry(shutdown_timeout_s)
        shutdown_seconds = time.perf_counter() - started
        backend.close()
        series = _received(sink, steps) if sink is not None else None
        if sink is not None:
            sink.close()
            # shutdown_telemetry keeps to its deadline even if the SDK does not; with a
            # stalled sink its helper thread may outlive it by a moment. Closing the sink
            # released the stalled export, so it ends now: wait for it, briefly.
            for thread in threading.enumerate():
                if thread.name == "async-tee-shutdown":
                    thread.join(2.0)
    # The event-loop caller is the async trainer's own loop: its calls are training time too.
    training_calls = [total for _, _, total, role in logger.samples if role != "monitor"]
    counter_checks: dict[str, dict[str, float | None]] = {}
    for row in _default_rows.VLLM_DELTAS:
        if row.kind != "counter":
            continue
        received = None
        for s in series or ():
            if s.name == row.name and not s.attributes and isinstance(s.value, (int, float)):
                received = float(s.value)
        counter_checks[row.name] = {
            "logged": float(simulation.counter_sums.get(row.logger_key, 0)),
            "received": received,
        }
    phases = [key.removesuffix("_time_s").removesuffix("_s") for key in setup if key.endswith("_s")]
    return DemoResult(
        steps=steps,
        step_seconds=step_seconds,
        mode="external" if external else "embedded",
        endpoint=endpoint,
        stalled=stall,
        series=series,
        missing_defaults=None if series is None else _missing(series, _expected_defaults(phases)),
        counter_checks=counter_checks,
        latency_us=latency_by_prefix(logger.samples),
        paced_floor_us=percentiles_us(logger.floor_ns),
        tee_cpu_us=percentiles_us(logger.tee_cpu_ns),
        loop_seconds=loop_seconds,
        log_seconds_on_training_thread=sum(training_calls) / 1e9,
        stats=async_tee.stats(),
        delivered=delivered,
        shutdown_seconds=shutdown_seconds,
        shutdown_timeout_s=shutdown_timeout_s,
        jsonl_path=None,
        jsonl_lines=0,
        monitor_calls=monitor_calls[0],
    )

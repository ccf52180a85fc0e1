"""Owns the demo: a simulated GRPO run logged through ``Logger`` and exported over real OTLP.

The run makes the calls a real one makes, from the threads a real one makes them on: the
training loop (``timing/setup`` once, then per step ``train`` twice, ``performance``, the
efficiency dict and ``timing/train``), a GPU-monitor daemon thread (``ray``) and a coroutine
inside a running event loop on another thread (the efficiency dict). Metrics go over
OTLP/gRPC to an embedded :class:`~async_tee.sink.OtlpSink` on an ephemeral port, or to
``OTEL_EXPORTER_OTLP_ENDPOINT`` when that is set. At the end :func:`render_result` shows
what the sink received and what the calls cost the training thread.

``async-tee demo`` runs it; :func:`run` returns a :class:`DemoResult` a test can check.
OpenTelemetry, gRPC and asyncio load only when :func:`run` is called.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from async_tee import default_rows, metrics, telemetry
from async_tee.logger import JsonlBackend, Logger

if TYPE_CHECKING:
    from async_tee.sink import OtlpSink

__all__ = ["DemoResult", "ReceivedSeries", "render_result", "run"]

DEFAULT_STEPS = 20
DEFAULT_STEP_SECONDS = 0.5
EXPORT_INTERVAL_MS = 1000
"""``OTEL_METRIC_EXPORT_INTERVAL`` for the embedded sink: the sink sees data every second."""

_GPU_NODES, _GPUS_PER_NODE = 4, 8
_SAMPLES_PER_STEP = 512
_CALL_TIMEOUT_S = 30.0  # how long the loop waits for the event-loop caller; never reached
_LEADING = frozenset((metrics.RL_EFFICIENCY_CATEGORY_ATTR, metrics.RL_SETUP_PHASE_ATTR))
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
    """

    name: str
    attributes: dict[str, Any]
    value: float | int | str | None
    unit: str
    kind: str


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


class _TimedLogger(Logger):
    """``Logger`` that times each call, and the tee inside it, on the calling thread."""

    def __init__(self, backends: list[JsonlBackend]) -> None:
        super().__init__(backends)
        # (prefix, tee ns, whole call ns, calling thread's role)
        self.samples: list[tuple[str, int, int, str]] = []
        self.roles: dict[int, str] = {threading.get_ident(): "training"}
        self._tee_ns = threading.local()

    def log_metrics(
        self,
        metrics: dict[str, Any],
        step: int,
        prefix: str = "",
        step_metric: str | None = None,
        step_finished: bool = False,
    ) -> None:
        start = time.perf_counter_ns()
        super().log_metrics(metrics, step, prefix, step_metric, step_finished)
        total = time.perf_counter_ns() - start
        role = self.roles.get(threading.get_ident(), "other")
        self.samples.append((prefix, self._tee_ns.value, total, role))

    def _tee(self, metrics: Mapping[str, Any], prefix: str, step: int) -> None:
        start = time.perf_counter_ns()
        super()._tee(metrics, prefix, step)
        self._tee_ns.value = time.perf_counter_ns() - start


class _Simulation:
    """Values that evolve like a GRPO run: reward rising noisily, loss falling, lr schedule."""

    def __init__(self, steps: int, seed: int) -> None:
        self.steps = steps
        self.rng = random.Random(seed)
        self.cumulative: dict[str, float] = {}
        self.counter_sums: dict[str, float] = {}

    def _noise(self, scale: float) -> float:
        return self.rng.gauss(0.0, scale)

    def _grow(self, key: str, amount: float) -> float:
        self.cumulative[key] = self.cumulative.get(key, 0.0) + amount
        return round(self.cumulative[key], 3)

    def setup(self) -> dict[str, Any]:
        vllm, policy = 70 + self.rng.uniform(0, 5), 92 + self.rng.uniform(0, 5)
        collective = 6 + self.rng.uniform(0, 1)
        total = max(vllm, policy) + collective + 40
        return {
            "vllm_init_time_s": round(vllm, 2),
            "policy_init_time_s": round(policy, 2),
            "collective_init_time_s": round(collective, 2),
            "parallel_wall_time_s": round(max(vllm, policy) + 0.8, 2),
            "parallel_init_enabled": 1.0,
            "total_setup_time_s": round(total, 2),
            "other_setup_time_s": round(total - max(vllm, policy) - collective, 2),
        }

    def learning_rate(self, step: int) -> float:
        peak, warmup = 5e-6, max(1, self.steps // 10)
        if step < warmup:
            return peak * (step + 1) / warmup
        progress = (step - warmup) / max(1, self.steps - warmup)
        return 5e-7 + (peak - 5e-7) * 0.5 * (1 + math.cos(math.pi * progress))

    def rollout(self, step: int) -> dict[str, Any]:
        progress = (step + 1) / self.steps
        gen_mean = 240 + 40 * progress + self._noise(12)
        lengths = [max(8, int(self.rng.gauss(gen_mean, 80))) for _ in range(64)]
        prompt_mean = 96 + self._noise(4)
        failed = self.rng.choice((0, 0, 0, 1, 2))
        deltas = {
            "vllm/prompt_tokens": int(prompt_mean * _SAMPLES_PER_STEP),
            "vllm/generation_tokens": int(gen_mean * _SAMPLES_PER_STEP),
            "vllm/generations_ok": _SAMPLES_PER_STEP - failed,
            "vllm/generations_failed": failed,
        }
        for key, delta in deltas.items():
            self.counter_sums[key] = self.counter_sums.get(key, 0) + delta
        truncation = min(0.2, max(0.0, 0.04 + self._noise(0.01)))
        return {
            "total_turns": _SAMPLES_PER_STEP,
            "avg_turns_per_sample": 1.0,
            "natural_termination_rate": round(1 - truncation, 4),
            "truncation_rate": round(truncation, 4),
            "mean_total_tokens_per_sample": round(gen_mean + prompt_mean, 2),
            "mean_gen_tokens_per_sample": round(gen_mean, 2),
            "max_gen_tokens_per_sample": max(lengths),
            "histogram/gen_tokens_length": lengths,
            **deltas,
            "vllm/prompt_length_mean": round(prompt_mean, 2),
            "vllm/generation_length_mean": round(gen_mean, 2),
        }

    def train(self, step: int, rollout: Mapping[str, Any]) -> dict[str, Any]:
        progress = (step + 1) / self.steps
        reward = min(1.0, max(0.0, 0.2 + 0.6 * (1 - math.exp(-3 * progress)) + self._noise(0.03)))
        # A group whose samples all got one reward has no spread: its std is NaN, as in
        # real runs. It is not a teed key, so only the JSONL backend shows it (as null).
        advantage_std = math.nan if step % 7 == 3 else round(0.9 + self._noise(0.05), 4)
        return {
            **rollout,
            "loss": round(0.08 * math.exp(-2 * progress) + self._noise(0.004), 5),
            "reward": round(reward, 4),
            "kl_penalty": round(0.0005 + 0.004 * progress + abs(self._noise(0.0002)), 6),
            "critic/loss": round(0.25 * math.exp(-progress) + abs(self._noise(0.01)), 5),
            "approx_entropy": round(0.55 - 0.2 * progress + self._noise(0.01), 4),
            "grad_norm": round(abs(0.3 + self._noise(0.05)), 4),
            "lr": self.learning_rate(step),
            "advantages/mean": 0.0,
            "advantages/std": advantage_std,
            "probs_ratio": round(1 + self._noise(0.0005), 5),
            "num_valid_samples": float(_SAMPLES_PER_STEP),
            "generation_logger_metrics": {
                "kv_cache_usage_perc": {"0": [0.0, 0.41, 0.57, 0.31], "1": [0.0, 0.4, 0.56, 0.29]}
            },
        }

    def performance(self, step_seconds: float, rollout: Mapping[str, Any]) -> dict[str, Any]:
        tokens = rollout["vllm/prompt_tokens"] + rollout["vllm/generation_tokens"]
        seconds = 24.0 + self._noise(1.0)
        return {
            "samples_per_sec": round(_SAMPLES_PER_STEP / seconds, 3),
            "tokens_per_sec": round(tokens / seconds, 1),
            "samples_per_sec_per_gpu": round(_SAMPLES_PER_STEP / seconds / 8, 3),
            "tokens_per_sec_per_gpu": round(tokens / seconds / 8, 1),
            "generation_tokens_per_sec": round(rollout["vllm/generation_tokens"] / 11.6, 1),
            "simulated_step_seconds": step_seconds,
        }

    def efficiency(self, step: int, setup_total: float) -> dict[str, Any]:
        starvation = abs(self._noise(0.4))
        refit = 3.5 + abs(self._noise(0.5))
        validation = 6.0 if step % 5 == 4 else 0.0
        wall = 24.0 + abs(self._noise(1.0)) + validation
        failed = self._grow("failed", self.rng.choice((0.0, 0.0, 1.7)))
        backoff = self._grow("backoff", 40 + abs(self._noise(8)))
        waste = starvation + refit + validation
        productive = wall - waste
        return {
            "efficiency/init/total_s": setup_total,
            "efficiency/idle/buffer_starvation_s": round(starvation, 3),
            "efficiency/idle/refit_bubble_s": round(refit, 3),
            "efficiency/idle/validation_s": validation,
            "efficiency/idle/buffer_full_backoff_s": backoff,
            "efficiency/wasted/failed_trajectory_s": failed,
            "efficiency/idle/generation_limit_pause_s": self._grow("pause", 4 + self._noise(1)),
            "efficiency/idle/refit_event_wait_s": self._grow("refit_wait", 2 + self._noise(0.5)),
            "efficiency/idle/refit_bubble_pct": round(100 * refit / wall, 3),
            "efficiency/thread_seconds_total_s": round(backoff + failed, 3),
            "efficiency/total_waste_s": round(waste, 3),
            "efficiency/productive_time_s": round(productive, 3),
            "efficiency/total_wall_time_s": round(wall, 3),
            "efficiency/efficiency_pct": round(100 * productive / wall, 2),
            "efficiency/efficiency_pct_is_per_step": 1.0,
        }

    def timing(self) -> dict[str, Any]:
        generation = 11.6 + self._noise(0.8)
        training = 6.3 + self._noise(0.3)
        logprobs = 2.7 + self._noise(0.2)
        return {
            "total_step_time": round(generation + training + logprobs + 3.9, 3),
            "data_processing": 0.41,
            "prepare_for_generation/total": 1.92,
            "generation": round(generation, 3),
            "reward_calculation": 0.58,
            "policy_and_reference_logprobs": round(logprobs, 3),
            "advantage_calculation": 0.09,
            "policy_training": round(training, 3),
        }

    def gpus(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for node in range(_GPU_NODES):
            for gpu in range(_GPUS_PER_NODE):
                out[f"node.{node}.gpu.{gpu}.util"] = round(min(100.0, 90 + self._noise(4)), 1)
                out[f"node.{node}.gpu.{gpu}.mem_gb"] = round(71 + self._noise(0.5), 2)
            out[f"node.{node}.mem_gb"] = round(412 + self._noise(3), 1)
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


def _percentiles(samples_ns: list[int]) -> dict[str, float]:
    if not samples_ns:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0}
    ordered = sorted(samples_ns)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] / 1000.0

    return {"p50": pick(0.5), "p99": pick(0.99), "max": ordered[-1] / 1000.0}


def _latency(samples: list[tuple[str, int, int, str]]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[tuple[str, int, int, str]]] = {}
    for sample in samples:
        groups.setdefault(sample[0] or '""', []).append(sample)
    out = {}
    for prefix in [*sorted(groups), "all"]:
        group = samples if prefix == "all" else groups[prefix]
        out[prefix] = {
            "calls": len(group),
            "tee": _percentiles([tee for _, tee, _, _ in group]),
            "log_metrics": _percentiles([total for _, _, total, _ in group]),
        }
    return out


def _expected_defaults(setup_phases: list[str]) -> list[tuple[str, dict[str, str]]]:
    """(series, required attributes) of every default series a run must deliver."""
    expected: list[tuple[str, dict[str, str]]] = [
        (row.name, {}) for row in default_rows.TRAINING_SCALARS + default_rows.VLLM_DELTAS
    ]
    expected += [
        (metrics.RL_EFFICIENCY_SECONDS_METRIC, {metrics.RL_EFFICIENCY_CATEGORY_ATTR: category})
        for category in default_rows.EFFICIENCY_CATEGORIES
    ]
    expected.append((metrics.RL_EFFICIENCY_PCT_METRIC, {}))
    expected += [
        (metrics.RL_SETUP_DURATION_METRIC, {metrics.RL_SETUP_PHASE_ATTR: phase})
        for phase in setup_phases
    ]
    return expected


def _label(name: str, attributes: Mapping[str, str]) -> str:
    inner = ",".join(f"{key}={value}" for key, value in attributes.items())
    return f"{name}{{{inner}}}" if inner else name


def _received(sink: OtlpSink) -> list[ReceivedSeries]:
    series = []
    for point in sink.latest().values():
        value: float | int | str | None = point.value
        if point.value_type == "histogram":
            value = f"count={point.count} sum={point.sum:.6g}" if point.sum is not None else None
        # The attribute that tells a series' points apart goes first, the rest by name.
        attributes = dict(
            sorted(point.attributes.items(), key=lambda kv: (kv[0] not in _LEADING, kv[0]))
        )
        series.append(ReceivedSeries(point.name, attributes, value, point.unit, point.kind))
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
        f"tee p50 {_percentiles(tee_ns)['p50']:.1f} µs (this step's max "
        f"{_percentiles(step_tee_ns)['max']:.1f} µs)"
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
    if telemetry._STATE is not None:
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
        endpoint = sink.grpc_endpoint
        env = {
            key: value
            for key, value in base_env.items()
            if not key.startswith("OTEL_EXPORTER_OTLP_") and key != "OTEL_METRICS_EXPORTER"
        }
        env.update(
            {
                "OTEL_METRICS_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_EXPORTER_OTLP_TIMEOUT": "2",  # a stalled export gives up in 2 s
                "OTEL_METRIC_EXPORT_INTERVAL": str(EXPORT_INTERVAL_MS),
            }
        )
        env.setdefault("OTEL_SERVICE_NAME", "async-tee-demo")
    simulation = _Simulation(steps, seed)
    backend = JsonlBackend(path)
    logger = _TimedLogger([backend])
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
        for step in range(steps):
            step_start = time.perf_counter()
            first = len(logger.samples)
            time.sleep(0.6 * step_seconds)  # generation
            rollout = simulation.rollout(step)
            logger.log_metrics(rollout, step, "train")
            time.sleep(0.4 * step_seconds)  # training
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
        series = _received(sink) if sink is not None else None
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
    for row in default_rows.VLLM_DELTAS:
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
        latency_us=_latency(logger.samples),
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


def _format_value(value: float | int | str | None) -> str:
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))  # counter totals: 2707147, not 2.70715e+06
        return f"{value:.6g}"
    return "-" if value is None else str(value)


def _table(header: list[str], rows: list[list[str]], right: frozenset[int]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)]


def render_result(result: DemoResult) -> str:
    """The end-of-run report: series received, caller-side cost, pipeline stats, delivery."""
    out: list[str] = []
    where = (
        f"an embedded OTLP sink at {result.endpoint}"
        if result.mode == "embedded"
        else f"{result.endpoint} (OTEL_EXPORTER_OTLP_ENDPOINT)"
    )
    out.append(
        f"async_tee demo: {result.steps} simulated GRPO steps x {result.step_seconds:g} s, "
        f"exported over OTLP/gRPC to {where}"
        + (", which was stalled for the whole run (--stall)" if result.stalled else "")
    )
    out.append("")
    if result.series is None:
        out.append(
            "Series received: not visible from here (an external collector); "
            "the figures below are the caller's side only."
        )
    elif not result.series:
        out.append(
            "Series received by the sink: none"
            + (" -- it was stalled, as asked," if result.stalled else ",")
            + " so none of the default series arrived."
        )
    else:
        out.append(
            f"Series received by the sink: the last point of each series and attribute set "
            f"({len(result.series)}):"
        )
        rows = [
            [
                s.name,
                _format_value(s.value),
                s.unit,
                " ".join(f"{k}={v}" for k, v in s.attributes.items()),
            ]
            for s in result.series
        ]
        out += [
            "  " + line
            for line in _table(["series", "value", "unit", "attributes"], rows, frozenset({1}))
        ]
    if result.missing_defaults:
        if result.series:  # (with nothing received, the line above already said so)
            out.append("")
            out.append(f"Default series NOT received ({len(result.missing_defaults)}):")
            out += [f"  {name}" for name in result.missing_defaults]
    elif result.missing_defaults is not None:
        out.append("")
        out.append(
            "Every default series arrived (training scalars, vLLM counters, the 8 "
            "efficiency categories, efficiency %, start-up phases)."
        )
    checks = [
        f"  {name}: {check['logged']:.0f} logged, "
        + (
            "nothing received"
            if check["received"] is None
            else f"{check['received']:.0f} received"
            + (
                " (each step's delta counted once)"
                if check["received"] == check["logged"]
                else " (MISMATCH)"
            )
        )
        for name, check in result.counter_checks.items()
    ]
    if result.series:
        out.append("Counters (the rollout keys are logged twice a step, under 'train'):")
        out += checks
    out.append("")
    out.append("Caller-side cost per log_metrics call (perf_counter_ns on the calling thread), µs:")
    rows = []
    for prefix, figures in result.latency_us.items():
        tee, call = figures["tee"], figures["log_metrics"]
        rows.append(
            [
                prefix,
                str(figures["calls"]),
                *(f"{tee[q]:.1f}" for q in ("p50", "p99", "max")),
                *(f"{call[q]:.1f}" for q in ("p50", "p99", "max")),
            ]
        )
    header = [
        "prefix",
        "calls",
        "tee p50",
        "tee p99",
        "tee max",
        "call p50",
        "call p99",
        "call max",
    ]
    out += ["  " + line for line in _table(header, rows, frozenset(range(1, 8)))]
    out.append(
        "  (tee = async_tee's share; call = the whole Logger.log_metrics, JSONL backend "
        'included; prefixes other than train, "" and timing/setup are not teed)'
    )
    nominal = result.steps * result.step_seconds
    share = (
        100 * result.log_seconds_on_training_thread / result.loop_seconds
        if result.loop_seconds
        else 0.0
    )
    out.append(
        f"Training loop: {result.loop_seconds:.2f} s for {result.steps} x "
        f"{result.step_seconds:g} s = {nominal:.2f} s of simulated work; the training "
        f"thread spent {1000 * result.log_seconds_on_training_thread:.2f} ms in log_metrics "
        f"({share:.3f} %)."
    )
    stats = result.stats
    out.append("")
    dropped = stats["dropped_by_reason"]
    skipped = stats["values_skipped"]
    out.append(
        f"async_tee.stats(): enqueued {stats['enqueued']}, recorded {stats['recorded']}, "
        f"dropped {stats['dropped']} (overflow {dropped['overflow']}, error {dropped['error']}, "
        f"shutdown {dropped['shutdown']}), pending {stats['pending']}; values skipped: "
        f"non-finite {skipped['non_finite']}, rejected {skipped['rejected']}, "
        f"cardinality {skipped['cardinality']}; worker lag p50 {stats['lag_ms']['p50']:.1f} ms, "
        f"max {stats['lag_ms']['max']:.1f} ms."
    )
    exports = stats["exports"]
    out.append(
        f"Exports: {exports['success']} succeeded, {exports['failure']} failed. "
        f"shutdown_telemetry(timeout_s={result.shutdown_timeout_s:g}) returned "
        + (
            "True: everything delivered"
            if result.delivered
            else "False: not everything was delivered"
        )
        + f" (took {result.shutdown_seconds:.2f} s)."
    )
    where_jsonl = (
        f"to {result.jsonl_path}"
        if result.jsonl_path
        else "to a temporary file, now removed; --jsonl PATH keeps it"
    )
    out.append(f"JsonlBackend wrote {result.jsonl_lines} lines {where_jsonl}.")
    out.append(
        f"Callers: the training loop; a GPU-monitor thread ({result.monitor_calls} 'ray' "
        "dicts); a coroutine inside a running event loop (the efficiency dicts)."
    )
    if result.stalled:
        out.append("")
        out.append(
            f"The collector was stalled, yet the training loop took {result.loop_seconds:.2f} s "
            f"for {nominal:.2f} s of simulated work: exports run on the SDK's own thread and "
            "the tee only enqueues, so nothing on the training thread waits for the collector."
        )
    return "\n".join(out)

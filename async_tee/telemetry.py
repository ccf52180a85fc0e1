"""Telemetry's lifecycle: start, flush, stats, and a shutdown that keeps to its deadline.

``start_telemetry`` adopts or builds a ``MeterProvider``, registers the metric groups
(closing declarations), starts the worker and only then attaches the queue that turns the
tee on. ``shutdown_telemetry`` detaches it, drains, and shuts down the provider it built,
all within one deadline, whatever the collector does; it also runs at interpreter exit
with ``ASYNC_TEE_SHUTDOWN_TIMEOUT``. After ``os.fork()`` the child gets a fresh queue and
worker of its own, and nothing of the parent's queue.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from async_tee import metrics, registry
from async_tee.config import Settings, load_settings
from async_tee.handoff import DropOldestQueue
from async_tee.reporting import logger, warn_once
from async_tee.selfmetrics import LAG_KEY, SELF_METRIC_GROUP, self_metric_specs

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter, MeterProvider

    from async_tee.worker import Worker

_FORK_PAUSE_S = 1.0  # how long os.fork() waits for the worker to finish a batch


class TelemetryHandle:
    """What ``start_telemetry`` returns: the meter, the provider, and whether it exports."""

    def __init__(
        self,
        settings: Settings,
        meter_provider: MeterProvider | None = None,
        meter: Meter | None = None,
        owns_provider: bool = False,
    ) -> None:
        self.settings = settings
        self.meter_provider = meter_provider
        self.meter = meter
        self.owns_provider = owns_provider
        self.worker: Worker | None = None

    @property
    def is_exporting(self) -> bool:
        """Whether the tee is live: telemetry started, enabled, and not shut down."""
        return self.worker is not None and metrics._QUEUE is self.worker.queue


_STATE: TelemetryHandle | None = None
_LAST_WORKER: Worker | None = None
_LIFECYCLE = threading.RLock()  # start/shutdown/fork only; never taken by the tee or worker
_HOOKS_INSTALLED = False
_SELF_GROUP_REGISTERED = False


def _stats_of(worker: Worker | None, lag_percentiles: bool = True) -> dict[str, Any]:
    from async_tee.provider import EXPORT_RESULTS

    counts = worker.counts if worker is not None else None
    enqueued = worker.queue.enqueued() if worker is not None else 0
    dropped_by_reason = {
        "overflow": counts.overflow if counts else 0,
        "error": counts.errors if counts else 0,
        "shutdown": counts.shutdown if counts else 0,
    }
    dropped = sum(dropped_by_reason.values())
    recorded = counts.recorded if counts else 0
    # The export callbacks skip the sort: the lag is exported as a histogram already.
    lags = sorted(worker.lags_ms) if worker is not None and lag_percentiles else []

    def pick(q: float) -> float:  # nearest rank, as the demo and benchmarks report
        return lags[max(0, math.ceil(q * len(lags)) - 1)] if lags else 0.0

    rc = registry.COUNTS
    return {
        "enqueued": enqueued,
        "recorded": recorded,
        "dropped": dropped,
        "pending": enqueued - recorded - dropped,
        "capacity": worker.queue.capacity if worker is not None else 0,
        "dropped_by_reason": dropped_by_reason,
        "lag_ms": {
            "p50": pick(0.5),
            "p99": pick(0.99),
            "max": worker.max_lag_ms if worker is not None else 0.0,
            "samples": len(lags),
        },
        "values_skipped": {
            "non_finite": rc.non_finite,
            "rejected": rc.rejected,
            "cardinality": rc.cardinality,
        },
        "non_finite_by_series": dict(rc.non_finite_by_series),
        "errors": {"tee": metrics._TEE_ERRORS[0], "registry": rc.errors},
        "exports": dict(EXPORT_RESULTS),
        "exporting": _STATE is not None and _STATE.is_exporting,
    }


def stats() -> dict[str, Any]:
    """Self-telemetry of the current (or last) pipeline. Safe from any thread; never raises.

    Returns:
        ``enqueued``, ``recorded``, ``dropped`` (all reasons) and ``pending`` (integers,
        always with ``enqueued == recorded + dropped + pending``), ``capacity``,
        ``dropped_by_reason``, ``lag_ms`` (p50/p99/max of the enqueue-to-record lag),
        ``values_skipped``, ``non_finite_by_series``, ``errors``, ``exports`` and
        ``exporting``. ``pending`` includes dicts the full queue dropped that the worker
        has not yet seen; after ``flush`` they are in ``dropped``.
    """
    return _guarded_stats(lag_percentiles=True)


def _guarded_stats(lag_percentiles: bool) -> dict[str, Any]:
    try:
        return _stats_of(_LAST_WORKER, lag_percentiles)
    except Exception:  # noqa: BLE001 - observability must not break the observed
        warn_once("stats", "async_tee: computing stats failed")
        return _stats_of(None)


def _export_stats() -> dict[str, Any]:
    """What the ``async_tee.*`` callbacks read, once each per export: no lag sort."""
    return _guarded_stats(lag_percentiles=False)


def _process(meter: Meter) -> Any:
    record_group = metrics._record
    tee = metrics._tee_rl_metrics_to_otel

    def process(item: tuple[Any, Any, Any, int]) -> None:
        payload, prefix, extra, _ = item
        if prefix is None:
            record_group(meter, payload, extra)
        else:
            tee(payload, prefix, extra, meter)

    return process


def _on_lag(meter: Meter) -> Any:
    values: dict[str, float] = {}

    def on_lag(lag_ms: float) -> None:
        values[LAG_KEY] = lag_ms
        registry.record_metrics(meter, SELF_METRIC_GROUP, values)

    return on_lag


def _start_pipeline(handle: TelemetryHandle) -> None:
    """Start a worker for ``handle`` and attach its queue: from here the tee is live."""
    global _LAST_WORKER
    from async_tee.worker import Worker  # asyncio loads here, not at import async_tee

    assert handle.meter is not None
    queue: DropOldestQueue[Any] = DropOldestQueue(handle.settings.queue_size)
    worker = Worker(
        queue, _process(handle.meter), handle.settings.drain_interval_s, _on_lag(handle.meter)
    )
    queue.on_high_water = worker.wake
    if not worker.start():
        warn_once("worker:start", "async_tee: the worker did not start; the tee stays off")
        return
    handle.worker = worker
    _LAST_WORKER = worker
    metrics._METER = handle.meter
    metrics._QUEUE = queue


def _register_groups(meter: Meter) -> bool:
    global _SELF_GROUP_REGISTERED
    if not _SELF_GROUP_REGISTERED:
        registry.register_metric_group(SELF_METRIC_GROUP, self_metric_specs(_export_stats))
        _SELF_GROUP_REGISTERED = True
    registry.create_metric_instruments(meter, SELF_METRIC_GROUP)
    if not metrics.ensure_metric_group_registered():
        return False
    registry.create_metric_instruments(meter, metrics.RL_METRIC_GROUP)
    return True


def start_telemetry(
    meter_provider: MeterProvider | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    queue_size: int | None = None,
    drain_interval_s: float | None = None,
    shutdown_timeout_s: float | None = None,
) -> TelemetryHandle:
    """Start mirroring: adopt ``meter_provider`` or build one from the ``OTEL_*`` variables.

    Closes metric declarations: every module that declares rows must be imported first.
    Explicit arguments beat the environment. A second call while running returns the
    running handle. With ``ASYNC_TEE_ENABLED=0`` (or ``OTEL_SDK_DISABLED=true``) nothing
    starts and the handle's ``is_exporting`` is False. Any failure to build the provider
    is warned once and leaves the tee a no-op: this never raises into training.

    Args:
        meter_provider: A provider you own and will shut down yourself; async_tee only
            records into it. None builds one (``OTEL_METRICS_EXPORTER`` etc.), which
            ``shutdown_telemetry`` shuts down.
        environ: The variables to read instead of ``os.environ``.
        queue_size: Overrides ``ASYNC_TEE_QUEUE_SIZE``.
        drain_interval_s: Overrides ``ASYNC_TEE_DRAIN_INTERVAL``.
        shutdown_timeout_s: Overrides ``ASYNC_TEE_SHUTDOWN_TIMEOUT`` (the exit hook's).

    Raises:
        RuntimeError: Telemetry is already running with a different provider.
        ValueError: An explicit argument is out of range.
    """
    global _STATE
    overrides: dict[str, Any] = {}
    if queue_size is not None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {queue_size}")
        overrides["queue_size"] = queue_size
    if drain_interval_s is not None:
        if not 0 < drain_interval_s <= 60:
            raise ValueError(f"drain_interval_s must be in (0, 60], got {drain_interval_s}")
        overrides["drain_interval_s"] = drain_interval_s
    if shutdown_timeout_s is not None:
        if not 0 <= shutdown_timeout_s <= 600:
            raise ValueError(f"shutdown_timeout_s must be in [0, 600], got {shutdown_timeout_s}")
        overrides["shutdown_timeout_s"] = shutdown_timeout_s
    with _LIFECYCLE:
        if _STATE is not None:
            if meter_provider is not None and meter_provider is not _STATE.meter_provider:
                raise RuntimeError(
                    "async_tee telemetry is already running with another MeterProvider; "
                    "call async_tee.shutdown_telemetry() first"
                )
            return _STATE
        settings = load_settings(environ)
        if overrides:
            import dataclasses

            settings = dataclasses.replace(settings, **overrides)
        handle = TelemetryHandle(settings)
        if not settings.enabled:
            logger.info("async_tee: disabled (ASYNC_TEE_ENABLED / OTEL_SDK_DISABLED)")
            return handle
        try:
            if meter_provider is None:
                from async_tee.provider import build_meter_provider

                meter_provider = build_meter_provider(settings)
                handle.owns_provider = True
            handle.meter_provider = meter_provider
            from async_tee import __version__

            handle.meter = meter_provider.get_meter("async_tee", __version__)
            registry.set_max_attribute_sets(settings.max_attribute_sets)
            if not _register_groups(handle.meter):
                return handle
        except Exception:  # noqa: BLE001 - a bad exporter setting must not stop training
            warn_once("start", "async_tee: could not start telemetry; the tee stays a no-op")
            return handle
        _install_hooks()
        _start_pipeline(handle)
        _STATE = handle
        logger.info("async_tee: telemetry started: %s", settings.describe())
        return handle


def flush(timeout_s: float = 5.0) -> bool:
    """Wait until every dict teed before this call is recorded in the SDK (not exported).

    Safe from any thread, including the worker's. Never raises.

    Returns:
        True when everything was recorded within ``timeout_s`` (or telemetry is off).
    """
    try:
        handle = _STATE
        if handle is None or handle.worker is None:
            return True
        return handle.worker.flush(timeout_s)
    except Exception:  # noqa: BLE001 - never raise into the caller
        warn_once("flush", "async_tee: flush failed")
        return False


async def aflush(timeout_s: float = 5.0) -> bool:
    """``flush`` for code inside a running event loop: awaits instead of blocking the loop.

    Returns:
        True when every dict teed before this call was recorded within ``timeout_s``
        (or telemetry is off). Never raises.
    """
    try:
        handle = _STATE
        if handle is None or handle.worker is None:
            return True
        return await handle.worker.aflush(timeout_s)
    except Exception:  # noqa: BLE001 - never raise into the caller
        warn_once("aflush", "async_tee: aflush failed")
        return False


def _shutdown_provider(handle: TelemetryHandle, deadline: float) -> bool:
    """Shut down a provider async_tee built, bounded by ``deadline`` even if the SDK is not."""
    provider = handle.meter_provider
    if provider is None or not handle.owns_provider:
        return True
    from async_tee.provider import EXPORT_RESULTS

    successes_before, failures_before = EXPORT_RESULTS["success"], EXPORT_RESULTS["failure"]
    # Delivery needs evidence: the final export (made by provider.shutdown) succeeded. A
    # reader stuck in an earlier export never makes it, and then nothing was delivered.
    pushes = any(name in ("otlp", "console") for name in handle.settings.exporters)
    outcome: list[bool] = []

    def run() -> None:
        try:
            remaining_ms = max(0.0, deadline - time.monotonic()) * 1000
            provider.shutdown(timeout_millis=remaining_ms)  # type: ignore[attr-defined]
            outcome.append(True)
        except Exception:  # noqa: BLE001 - the SDK's shutdown can raise
            warn_once("shutdown:provider", "async_tee: shutting down the MeterProvider failed")
            outcome.append(False)

    thread = threading.Thread(target=run, name="async-tee-shutdown", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    from async_tee.provider import close_servers

    close_servers()
    exported = not pushes or EXPORT_RESULTS["success"] > successes_before
    return (
        bool(outcome and outcome[0]) and exported and EXPORT_RESULTS["failure"] == failures_before
    )


def shutdown_telemetry(timeout_s: float | None = None) -> bool:
    """Stop teeing, drain what is queued, and shut down the provider async_tee built.

    All within one deadline, whatever the collector does. Safe to call twice, from any
    thread (including the worker's), and when telemetry never started. Never raises.

    Args:
        timeout_s: The deadline in seconds; ``ASYNC_TEE_SHUTDOWN_TIMEOUT`` by default.

    Returns:
        Whether everything was delivered: every dict recorded and, for a provider
        async_tee built, the final export succeeded in time. For a provider you passed in,
        whether every dict was recorded into it (its export is yours to shut down).
    """
    global _STATE
    try:
        with _LIFECYCLE:
            handle = _STATE
            if handle is None:
                return True
            _STATE = None
            metrics._QUEUE = None
            metrics._METER = None
        budget = handle.settings.shutdown_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + max(0.0, budget)
        # Half the budget at most for draining; the rest is the final export's.
        recorded = True
        if handle.worker is not None:
            recorded = handle.worker.stop(max(0.0, (deadline - time.monotonic()) / 2))
        delivered = _shutdown_provider(handle, deadline)
        return recorded and delivered
    except Exception:  # noqa: BLE001 - shutdown runs at exit: it must not raise
        warn_once("shutdown", "async_tee: shutdown failed")
        return False


def _shutdown_at_exit() -> None:
    shutdown_telemetry()


def _before_fork() -> None:
    handle = _STATE
    if handle is not None and handle.worker is not None:
        # Let the worker finish its batch so the child inherits no lock it holds.
        handle.worker.busy.acquire(timeout=_FORK_PAUSE_S)


def _after_fork_in_parent() -> None:
    handle = _STATE
    if handle is not None and handle.worker is not None and handle.worker.busy.locked():
        with contextlib.suppress(RuntimeError):
            handle.worker.busy.release()


def _after_fork_in_child() -> None:
    global _LIFECYCLE
    _LIFECYCLE = threading.RLock()
    handle = _STATE
    metrics._QUEUE = None
    if handle is None or handle.worker is None:
        return
    try:
        _start_pipeline(handle)  # a fresh queue and worker: nothing inherited is replayed
    except Exception:  # noqa: BLE001 - a fork must never fail because of telemetry
        warn_once("fork", "async_tee: could not restart the worker after fork")


def _install_hooks() -> None:
    global _HOOKS_INSTALLED
    if _HOOKS_INSTALLED:
        return
    _HOOKS_INSTALLED = True
    atexit.register(_shutdown_at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(
            before=_before_fork,
            after_in_parent=_after_fork_in_parent,
            after_in_child=_after_fork_in_child,
        )

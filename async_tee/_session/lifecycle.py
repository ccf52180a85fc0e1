"""The session functions (start, flush, stats, shutdown) and fork hooks (docs/semantics.md §7)."""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from async_tee._declare import series as _series
from async_tee._declare.groups import register_metric_group
from async_tee._declare.rows import DECLARATIONS
from async_tee._handoff import caller as _caller
from async_tee._reporting import logger, warn_once
from async_tee._session import stats as _stats
from async_tee._session.session import Pipeline
from async_tee._settings import Settings
from async_tee._tables import registry as tables
from async_tee._tables.self_series import self_metric_specs
from async_tee.config import load_settings

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter, MeterProvider

    from async_tee._export.exporters import ExporterState


class DisabledSession:
    """A session that is off: the tee stays a no-op, every figure is zero.

    What ``start_telemetry`` returns when telemetry is disabled, when
    ``ASYNC_TEE_EXPORT_RANKS`` leaves this rank out, or when starting failed (warned once).
    It has the reading side of a :class:`Pipeline`; flushing and shutting it down succeed
    at once, with nothing to do.
    """

    is_exporting = False
    meter: Meter | None = None
    meter_provider: MeterProvider | None = None
    prometheus_address: tuple[str, int] | None = None

    def __init__(self, settings: Settings) -> None:
        """A session that is off under ``settings``."""
        self.settings = settings

    @property
    def threads(self) -> list[threading.Thread]:
        """No thread runs."""
        return []

    @property
    def exporters(self) -> list[ExporterState]:
        """No exporter was built."""
        return []

    def stats(self, lag_percentiles: bool = True) -> dict[str, Any]:
        """Every figure zero; ``ranks`` says which rank this is and whether it exports."""
        return _stats.idle_stats(self.settings)

    def flush(self, timeout_s: float) -> bool:
        """Nothing to record."""
        return True

    async def aflush(self, timeout_s: float) -> bool:
        """Nothing to record."""
        return True

    def flush_and_export(self, timeout_s: float) -> bool:
        """Nothing to export."""
        return True

    def shutdown(self, timeout_s: float) -> bool:
        """Nothing to deliver."""
        return True


NO_SESSION = DisabledSession(Settings())
"""What ``stats()`` reads before any session started."""


# The session state of the process, and why each is module-level:
_ACTIVE: Pipeline | None = None  # the running session: flush/shutdown act on it while it is open
_LAST: Pipeline | DisabledSession = NO_SESSION  # the last session started: what stats() reads
_LIFECYCLE = threading.RLock()  # start/shutdown/fork only; never taken by the tee or worker
_EXIT_HOOK_INSTALLED = False  # the bounded shutdown at exit is registered once per process


def active() -> Pipeline | None:
    """The running session, or None (also once it was shut down, by whatever path)."""
    pipeline = _ACTIVE
    return pipeline if pipeline is not None and pipeline.is_open else None


def _checked_overrides(
    queue_size: int | None, drain_interval_s: float | None, shutdown_timeout_s: float | None
) -> dict[str, Any]:
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
    return overrides


def start_telemetry(
    meter_provider: MeterProvider | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    queue_size: int | None = None,
    drain_interval_s: float | None = None,
    shutdown_timeout_s: float | None = None,
) -> Pipeline | DisabledSession:
    """Start mirroring: adopt ``meter_provider`` or build one from the ``OTEL_*`` variables.

    Closes metric declarations: every module that declares rows must be imported first.
    Explicit arguments beat the environment. A second call while running returns the
    running session; once that was shut down, by any path, a call starts a new one. With
    ``ASYNC_TEE_ENABLED=0`` (or ``OTEL_SDK_DISABLED=true``) nothing starts and the
    session's ``is_exporting`` is False. Any failure to build the provider is warned once
    and leaves the tee a no-op: this never raises into training.

    Args:
        meter_provider: A provider you own and will shut down yourself; async_tee only
            records into it. None builds one (``OTEL_METRICS_EXPORTER`` etc.), which
            ``shutdown_telemetry`` shuts down.
        environ: The variables to read instead of ``os.environ``.
        queue_size: Overrides ``ASYNC_TEE_QUEUE_SIZE``.
        drain_interval_s: Overrides ``ASYNC_TEE_DRAIN_INTERVAL``.
        shutdown_timeout_s: Overrides ``ASYNC_TEE_SHUTDOWN_TIMEOUT`` (the exit hook's).

    Returns:
        The running session (:class:`Pipeline`): ``is_exporting``, ``settings``, ``meter``,
        ``threads``, ``stats()``; or, when nothing started (disabled, a rank that does not
        export, a failed start), a :class:`DisabledSession` with the same reading side.

    Raises:
        RuntimeError: Telemetry is already running with a different provider.
        ValueError: An explicit argument is out of range.
    """
    global _ACTIVE, _LAST
    overrides = _checked_overrides(queue_size, drain_interval_s, shutdown_timeout_s)
    with _LIFECYCLE:
        running = active()
        if running is not None:
            if meter_provider is not None and meter_provider is not running.meter_provider:
                raise RuntimeError(
                    "async_tee telemetry is already running with another MeterProvider; "
                    "call async_tee.shutdown_telemetry() first"
                )
            return running
        settings = dataclasses.replace(load_settings(environ), **overrides)
        if isinstance(_LAST, Pipeline):
            _LAST.release_signals()  # if its shutdown ran off the main thread, it could not
        _ACTIVE, _LAST = None, DisabledSession(settings)
        if not settings.enabled:
            logger.info("async_tee: disabled (ASYNC_TEE_ENABLED / OTEL_SDK_DISABLED)")
            return _LAST
        if not settings.exports_from_this_rank:
            logger.info(
                "async_tee: rank %s (local rank %s) does not export (ASYNC_TEE_EXPORT_RANKS=%s)",
                settings.ranks.rank,
                settings.ranks.local_rank,
                settings.export_ranks,
            )
            return _LAST  # nothing starts: no thread, no hook, the tee stays a no-op
        _install_exit_hook()
        try:
            if _series.SELF_METRIC_GROUP not in DECLARATIONS.groups:
                # Once per process, like every group: its callbacks read the session now
                # running (or the last one), whichever meter they were created on.
                register_metric_group(_series.SELF_METRIC_GROUP, self_metric_specs())
            pipeline = Pipeline.open(settings, meter_provider)
        except Exception:  # noqa: BLE001 - a bad exporter setting must not stop training
            warn_once("start", "async_tee: could not start telemetry; the tee stays a no-op")
            return _LAST
        _ACTIVE = _LAST = pipeline
        _caller.attach(pipeline.queue, pipeline.snapshot_keys, pipeline.settings.max_attribute_sets)
        logger.info("async_tee: telemetry started: %s", settings.describe())
        return pipeline


def flush(timeout_s: float = 5.0) -> bool:
    """Wait until every dict teed before this call is recorded in the SDK (not exported).

    Safe from any thread, including the worker's. Never raises.

    Returns:
        True when everything was recorded within ``timeout_s`` (or telemetry is off).
    """
    try:
        pipeline = active()
        return True if pipeline is None else pipeline.flush(timeout_s)
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
        pipeline = active()
        return True if pipeline is None else await pipeline.aflush(timeout_s)
    except Exception:  # noqa: BLE001 - never raise into the caller
        warn_once("aflush", "async_tee: aflush failed")
        return False


def stats() -> dict[str, Any]:
    """Self-telemetry of the current (or last) session. Safe from any thread; never raises.

    Every figure is the session's own, from its start (a new session, and a forked
    child's session, start from zero); only the warn-once memory is per process.

    Returns:
        ``enqueued``, ``recorded``, ``dropped`` (all reasons) and ``pending`` (integers,
        always with ``enqueued == recorded + dropped + pending``), ``capacity``,
        ``dropped_by_reason``, ``lag_ms`` (p50/p99/max of how late a dict was recorded:
        from its tee call or the worker's planned wake, whichever is later),
        ``values_skipped``, ``non_finite_by_series``, ``errors``, ``exports``
        (``success``/``failure`` over every OTLP send of a provider async_tee built),
        ``delivery`` (the OTLP backlog: queued, delivered, retries, dropped by reason),
        ``exports_by_trigger`` (the same by ``step``, ``interval``, ``shutdown``,
        ``flush``), ``steps`` (``last`` completed, ``completed``, ``exported`` on their
        own, ``coalesced`` into a later export, ``unusable``: docs/semantics.md §9),
        ``exporting`` (the tee is live and an exporter asked for started), ``exporters``
        (per exporter: ``state`` started/failed, ``where`` it sends or serves, ``error``
        naming the fix) and ``ranks`` (the launcher's ranks, ``export_ranks`` and whether
        this rank ``exports``: §10). ``pending`` includes dicts the full queue dropped
        that the worker has not yet seen; after ``flush`` they are in ``dropped``.
        ``enqueued`` counts end-of-step markers (§9) with the dicts.
    """
    try:
        return _LAST.stats()
    except Exception:  # noqa: BLE001 - observability must not break the observed
        warn_once("stats", "async_tee: computing stats failed")
    return NO_SESSION.stats()


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
    global _ACTIVE
    try:
        with _LIFECYCLE:
            pipeline = active()
            _ACTIVE = None
            if pipeline is None:
                return True
        budget = pipeline.settings.shutdown_timeout_s if timeout_s is None else timeout_s
        return pipeline.shutdown(budget)
    except Exception:  # noqa: BLE001 - shutdown runs at exit: it must not raise
        warn_once("shutdown", "async_tee: shutdown failed")
        return False


def end_and_forget(timeout_s: float) -> None:
    """Shut the running session down and forget the last one (``stats()`` reads zeros)."""
    global _LAST
    shutdown_telemetry(timeout_s)
    if isinstance(_LAST, Pipeline):
        _LAST.release_signals()
        _LAST.instruments.stats_source = NO_SESSION.stats  # its own series read zeros too
    _LAST = NO_SESSION


def _shutdown_at_exit() -> None:
    shutdown_telemetry()


# Fork, handled here alone: docs/semantics.md §7 says what each hook does, in this order.


def _before_fork() -> None:
    pipeline = active()
    if pipeline is not None:
        pipeline._before_fork()


def _after_fork_in_parent() -> None:
    pipeline = active()
    if pipeline is not None:
        pipeline._after_fork_in_parent()


def _after_fork_in_child() -> None:
    global _LIFECYCLE
    _LIFECYCLE = threading.RLock()
    _caller.attach(None)  # the parent's queue: nobody drains it here
    tables.after_fork_in_child()
    pipeline = active()
    if pipeline is not None and pipeline._after_fork_in_child():
        _caller.attach(pipeline.queue, pipeline.snapshot_keys, pipeline.settings.max_attribute_sets)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


def _install_exit_hook() -> None:
    global _EXIT_HOOK_INSTALLED
    if not _EXIT_HOOK_INSTALLED:
        _EXIT_HOOK_INSTALLED = True
        atexit.register(_shutdown_at_exit)
        if hasattr(os, "register_at_fork"):
            # asyncio (3.12+) resets the wake-up fd in a forked child from a hook of its
            # own: the child's signal pipe is made in this one, registered after it, so
            # run after it (docs/semantics.md §7).
            import asyncio  # noqa: F401 - its hook first; the worker imports it anyway

            os.register_at_fork(after_in_child=_after_fork_in_child_after_asyncio)


def _after_fork_in_child_after_asyncio() -> None:
    pipeline = active()
    if pipeline is not None:
        pipeline._after_fork_in_child_signals()

"""One running session, opened whole from one of each stage (docs/semantics.md §7)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from async_tee._export.exporters import ExporterState
from async_tee._export.provider import Exports, build_exports
from async_tee._handoff import caller as _caller
from async_tee._reporting import RedactSecrets, redacting, stop_redacting, warn_once
from async_tee._session import stats as _stats
from async_tee._session.signals import SignalFlush
from async_tee._settings import Settings
from async_tee._tables.registry import RegistryCounts, session_tables

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider


FORK_PAUSE_S = 1.0
"""How long ``os.fork()`` waits for the worker to finish the batch in hand."""


class Pipeline:
    """A running telemetry session: ``start_telemetry`` returns it, ``shutdown_telemetry`` ends it.

    The code and the docs call it the session; ``Pipeline`` is its public name (in
    ``async_tee.__all__`` and the README), kept so callers' imports and checks still work.

    Attributes:
        settings: The effective configuration.
        exports: The provider recorded into, what async_tee started for it, and the
            health and counts of its exports.
        meter: async_tee's meter on that provider.
        instruments: The meter's instrument registry (per-session counts).
        consumer: What the worker does with each snapshot: the step clock, the recorder.
        queue: The hand-off queue the tee puts on while this session runs.
        worker: The worker draining it.
    """

    def __init__(self, settings: Settings, exports: Exports) -> None:
        """Assemble a session over a provider; only :meth:`open` calls this.

        Raises:
            RuntimeError: The ``rl`` metric group could not be registered.
            Exception: Whatever the SDK raises creating the instruments.
        """
        self.settings = settings
        self.exports = exports
        self.meter = exports.meter()
        self._export_stats = _stats.CollectionSnapshot(self._counts, self._collections)
        self.instruments = session_tables(
            self.meter, settings.max_attribute_sets, self._export_stats, settings.held_ttl_s
        )
        self._non_finite_zeros = _stats.non_finite_zeros(
            self.instruments, settings.max_attribute_sets
        )
        exports.use_tables(self.instruments)
        self._signals = SignalFlush(
            self.shutdown, self.flush_and_export, settings.shutdown_timeout_s
        )
        self._new_worker()
        self._redactor: RedactSecrets | None = None  # the filter hiding settings.secrets
        self._closed = False

    @classmethod
    def open(cls, settings: Settings, meter_provider: MeterProvider | None = None) -> Pipeline:
        """Open a running session: build or adopt the provider, start the worker, the signals.

        The tee is not pointed at it yet: ``start_telemetry`` does that.

        Args:
            settings: The effective configuration.
            meter_provider: A provider to record into (yours to shut down); None builds one
                from ``settings``, which the session shuts down.

        Raises:
            RuntimeError: The worker did not start, or the ``rl`` group is unavailable.
            Exception: Whatever the SDK raises on a bad setting. Nothing is left running.
        """
        redactor = redacting(settings.secrets)  # before the SDK can log the endpoint
        try:
            if meter_provider is None:
                exports = build_exports(settings)
            else:
                exports = Exports.adopted(meter_provider, settings)
        except BaseException:
            stop_redacting(redactor)
            raise
        try:
            session = cls(settings, exports)
            if not session.worker.start():
                raise RuntimeError("the worker did not start")
        except BaseException:
            exports.close_unopened()
            stop_redacting(redactor)
            raise
        session._redactor = redactor
        session._signals.install(settings.flush_signals)
        return session

    def _new_worker(self) -> None:
        """A fresh consumer, queue and worker, not started (a new session, a forked child)."""
        from async_tee._worker.consumer import new_worker  # asyncio loads here, not at import

        self.consumer, self.queue, self.worker = new_worker(
            self.instruments,
            self.exports.step_reader,
            self.exports.policy,
            self.settings.queue_size,
            self.settings.drain_interval_s,
            on_step=self._signals.check,
            trainer_keys=self.settings.trainer_keys,
        )

    @property
    def meter_provider(self) -> MeterProvider:
        """The provider recorded into."""
        return self.exports.provider

    @property
    def owns_provider(self) -> bool:
        """Whether async_tee built the provider (and so shuts it down)."""
        return self.exports.owned

    @property
    def snapshot_keys(self) -> Mapping[str | None, tuple[str, ...] | None]:
        """Every prefix the worker reads, with the keys the caller snapshots (``MappingPlan``)."""
        return self.consumer.recorder.plan.snapshot_keys

    @property
    def is_open(self) -> bool:
        """Whether the session has not been shut down."""
        return not self._closed

    # ------------------------------------------------------------------ lifecycle

    def shutdown(self, timeout_s: float) -> bool:
        """Stop teeing, drain, then shut down the provider async_tee built, within ``timeout_s``.

        Half the budget at most goes to draining; the rest is the final export's. The
        session is closed for good: ``start_telemetry`` then starts a new one. A second
        call returns True at once.

        Returns:
            Whether everything was delivered (see ``shutdown_telemetry``).
        """
        if self._closed:
            return True
        self._closed = True
        _caller.detach(self.queue)
        deadline = time.monotonic() + max(0.0, timeout_s)
        recorded = self.worker.stop(max(0.0, (deadline - time.monotonic()) / 2))
        if not self.worker.thread.is_alive():
            self.consumer.steps.close()  # the last step completes; the final export carries it
        delivered = self.exports.shutdown(deadline) and recorded
        stop_redacting(self._redactor)
        self._signals.restore()  # what the session changed, where it still holds
        return delivered

    def release_signals(self) -> None:
        """Restore the signal handlers where ours hold (shutdown can't off the main thread)."""
        self._signals.restore()

    # ------------------------------------------------------------------ reading it

    @property
    def is_exporting(self) -> bool:
        """Whether the tee is live and has somewhere to export.

        False after shutdown, when the worker died, when every exporter asked for failed
        to start, and while every one that started is failing (``FAILING_AFTER`` exports
        in a row failed): the tee still records then, so ``stats()`` counts on, but
        nothing leaves the process.
        """
        return _caller.attached() is self.queue and self.exports.working

    @property
    def exporters(self) -> Sequence[ExporterState]:
        """Each exporter async_tee was asked to build, and whether it started.

        Empty for a provider passed in, and for ``OTEL_METRICS_EXPORTER=none``.
        """
        return self.exports.exporters

    @property
    def prometheus_address(self) -> tuple[str, int] | None:
        """``(host, port)`` a pulled exporter (Prometheus) serves ``/metrics`` on, if it started.

        With port 0 this is the port the system chose.
        """
        return self.exports.prometheus_address

    @property
    def threads(self) -> list[threading.Thread]:
        """The threads this session started: the worker, the provider's readers, servers."""
        return [self.worker.thread, *self.exports.threads]

    def flush_and_export(self, timeout_s: float) -> bool:
        """Record everything queued, then export it now, all within ``timeout_s``.

        The push exporters of a provider async_tee built export at once (bounded); a
        provider passed in is only recorded into. The session goes on.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        recorded = self.flush(timeout_s / 2)
        return self.exports.export_now(deadline) and recorded

    def flush(self, timeout_s: float) -> bool:
        """Wait until every snapshot put before this call is recorded (see ``flush``)."""
        return self.worker.flush(timeout_s)

    async def aflush(self, timeout_s: float) -> bool:
        """``flush`` for a coroutine: awaits instead of blocking its loop."""
        return await self.worker.aflush(timeout_s)

    def stats(self, lag_percentiles: bool = True) -> dict[str, Any]:
        """This session's figures (see ``async_tee.stats``); the lag sort is optional."""
        worker = self.worker
        if lag_percentiles:
            lag_ms = worker.lag_figures()
        else:
            lag_ms = {"p50": 0.0, "p99": 0.0, "max": worker.max_lag_ms, "samples": 0}
        return {
            **self._counts(),
            "lag_ms": lag_ms,
            "exporting": self.is_exporting,
            "exporters": self.exports.states(),
            "ranks": _stats.ranks(self.settings),
        }

    def _counts(self) -> dict[str, Any]:
        """The counts of ``stats()``: what the ``async_tee.*`` series read."""
        return _stats.counts(
            self.worker.figures(),
            self.consumer.figures(),
            self.instruments.counts,
            self.exports.figures(),
            self._non_finite_zeros,
        )

    def _collections(self) -> int:
        return self.exports.counts.collections

    # ----------------------------------------------------------- fork (_session/lifecycle's hooks)

    def _before_fork(self) -> None:
        """Let the worker finish its batch, so the child inherits no lock it holds."""
        self.worker.busy.acquire(timeout=FORK_PAUSE_S)

    def _after_fork_in_parent(self) -> None:
        """Let the worker go on."""
        if self.worker.busy.locked():
            with contextlib.suppress(RuntimeError):
                self.worker.busy.release()

    def _after_fork_in_child_signals(self) -> None:
        """The child's own signal pipe and thread.

        After asyncio's at-fork hook, which resets the wake-up fd: ``_session/lifecycle``
        calls it from a hook registered after asyncio's.
        """
        if not self._closed:
            self._signals.after_fork_in_child()

    def _after_fork_in_child(self) -> bool:
        """Go on as the child's own session: a fresh queue, worker, counts and step memory.

        Nothing of the parent's queue is replayed, and the parent's last values were
        dropped with the registry's tables, so the child exports only what it records.

        Returns:
            Whether the child's worker runs (then ``_session/lifecycle`` points the tee at it).
        """
        if self._closed:
            return False
        self.instruments.counts = RegistryCounts()
        self.exports.after_fork_in_child()
        self._export_stats.forget()
        try:
            self._new_worker()
            return self.worker.start()
        except Exception:  # noqa: BLE001 - a fork must never fail because of telemetry
            warn_once("fork", "async_tee: could not restart the worker after fork")
            return False

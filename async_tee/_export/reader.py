"""The exporting thread: one push exporter, fed each step and on a timer (docs/semantics.md §9)."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricReader

from async_tee._reporting import logger, warn_once
from async_tee._worker.gil import budget
from async_tee._worker.steps import StepPolicy

if TYPE_CHECKING:
    from async_tee._export.delivery import ExportCounts

FAILING_AFTER = 3
"""Consecutive failed exports after which an exporter's state is ``failing``: it says so
once, ``is_exporting`` turns False, and the next delivered export turns it back."""

_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
)
"""Where the SDK's OTLP exporters say why an export failed (their return value does not)."""


_DEADLINE_ARTIFACT = "timeout cannot be set to a value less than or equal to 0"
"""urllib3's refusal of a zero timeout: the OTLP/HTTP exporter's retry began with no time
left (it passes ``max(deadline - now, 0)``), which says nothing of why the export failed."""


def failure_reason(previous: str, new: str) -> str:
    """Why exports fail, given the reason kept and a new one.

    The new one, unless it is the exporter's deadline artifact (``_DEADLINE_ARTIFACT``) and
    a reason is already kept.
    """
    return previous if previous and _DEADLINE_ARTIFACT in new else new


class _LastError(logging.Filter):
    """Keeps the last warning an OTLP exporter logged: why its last export failed.

    The exporter's own deadline artifact (``_DEADLINE_ARTIFACT``) does not replace the
    reason logged before it: after a TLS failure and a retry that ran out of time, the
    reason is still the TLS failure.
    """

    def __init__(self) -> None:
        super().__init__()
        self.text = ""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            with contextlib.suppress(Exception):
                self.text = failure_reason(self.text, record.getMessage()[:300])
        return True


def fix_for(error: str) -> str:
    """The variable that most likely fixes an export that failed with ``error``."""
    text = error.lower()
    if "ssl" in text or "certificate" in text or "tls" in text:
        return "OTEL_EXPORTER_OTLP_CERTIFICATE (or the endpoint's scheme, http:// or https://)"
    if any(word in text for word in ("401", "403", "unauthenticated", "permission_denied")):
        return "OTEL_EXPORTER_OTLP_HEADERS (the collector's credentials)"
    if any(word in text for word in ("timed out", "timeout", "deadline_exceeded")):
        return "OTEL_EXPORTER_OTLP_TIMEOUT, or the collector's load"
    return (
        "OTEL_EXPORTER_OTLP_ENDPOINT (is the collector up at that address, and answering "
        "within OTEL_EXPORTER_OTLP_TIMEOUT?)"
    )


CANCEL_MARGIN_S = 0.5
"""At most this much of a shutdown's budget (and at most a tenth) is kept to cancel an
export still in flight, so the exporting thread ends within the budget."""


def _suppressed_instrumentation() -> Any:
    """A context in which instrumented HTTP/gRPC clients do not trace the export itself."""
    from opentelemetry import context

    key = getattr(context, "_SUPPRESS_INSTRUMENTATION_KEY", None)
    if key is None:  # an API without the key: nothing to suppress
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def suppressed() -> Any:
        token = context.attach(context.set_value(key, True))
        try:
            yield
        finally:
            context.detach(token)

    return suppressed()


class ExportingReader(MetricReader):
    """A metric reader with its own exporting thread, driven by steps and by a period.

    Attributes:
        step_aligned: Whether the worker drives it at step boundaries (an exporter whose
            row says so, with ``ASYNC_TEE_STEP_EXPORT`` on); otherwise it only exports on
            its period.
        policy: When the periodic backstop is due.
        counts: Export attempts by trigger and result.
        replaced: Collected steps replaced by a newer one before they were sent (the
            step clock reports them as coalesced).
    """

    def __init__(
        self,
        exporter: MetricExporter,
        *,
        policy: StepPolicy,
        timeout_s: float,
        counts: ExportCounts,
        step_aligned: bool,
        name: str = "otlp",
    ) -> None:
        """Start the exporting thread (named ``async-tee-export``)."""
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self._exporter = exporter
        self.policy = policy
        self._timeout_ms = timeout_s * 1000.0
        self.counts = counts
        self.step_aligned = step_aligned
        self.replaced = 0
        self._local = threading.local()  # which trigger a collection on this thread serves
        self._last_export = time.monotonic()  # when the last export started (or the start)
        self._last_was_step = False  # that export was a step's: the period waits its grace
        self._stopped = False
        self._abandoned = False  # shutdown's deadline passed with the thread still exporting
        self.name = name
        self.failures = 0  # consecutive failed exports
        self.failing = False  # FAILING_AFTER of them in a row, and none delivered since
        self._session = getattr(exporter, "async_tee_session", None)  # OTLP/HTTP's own
        self._encoder: Any = None  # a TableEncoder once use_tables ran: no SDK collection
        self._last_error = _LastError()
        for logger_name in _EXPORTER_LOGGERS:
            logging.getLogger(logger_name).addFilter(self._last_error)
        self._init_thread()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`shutdown` was called."""
        return self._stopped

    def after_fork_in_child(self) -> None:
        """The child's own exporting thread (the parent's did not survive ``fork``)."""
        if not self._stopped:
            self._init_thread()

    def _init_thread(self) -> None:
        """A fresh hand-over queue and thread (at start, and in a child after ``fork``)."""
        self._cond = threading.Condition()
        self._queued: deque[tuple[Any, str, int]] = deque()  # (data, trigger, handed-over seq)
        self._busy = False  # an export is in flight
        self._stopping = False
        self._handed = 0  # collections handed over by other threads, numbered
        self._sent = 0  # the number of the last one exported: force_flush waits on it
        self.thread = threading.Thread(target=self._run, name="async-tee-export", daemon=True)
        self.thread.start()

    @property
    def takes_requests(self) -> bool:
        """Whether its exporter can send a request built from the tables (``use_tables``).

        It must take a ready request, and want what the tables encode: every kind
        cumulative, histograms in explicit buckets (``OTEL_EXPORTER_OTLP_METRICS_
        TEMPORALITY_PREFERENCE=delta`` or an exponential histogram leaves the SDK's way).
        """
        if not getattr(self._exporter, "async_tee_takes_requests", False):
            return False
        from opentelemetry.sdk.metrics.export import AggregationTemporality
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation

        temporality = getattr(self._exporter, "_preferred_temporality", None) or {}
        aggregation = getattr(self._exporter, "_preferred_aggregation", None) or {}
        return all(t == AggregationTemporality.CUMULATIVE for t in temporality.values()) and all(
            isinstance(a, ExplicitBucketHistogramAggregation) for a in aggregation.values()
        )

    @property
    def encodes_tables(self) -> bool:
        """Whether this reader's exports are built from the tables (``use_tables`` ran)."""
        return self._encoder is not None

    def use_tables(self, encoder: Any) -> None:
        """Build every export's request with ``encoder`` (a ``TableEncoder``), not the SDK."""
        self._encoder = encoder

    def _collect_counted(self, timeout_millis: float) -> None:
        """Collect (the SDK's collection, or the tables' request), counted first.

        Counted first: the self-series callbacks of one collection share one ``stats()``.
        """
        self.counts.collections += 1
        encoder = self._encoder
        if encoder is None:
            self.collect(timeout_millis=timeout_millis)
        else:
            self._receive_metrics(encoder.request(timeout_millis / 1000.0), timeout_millis)

    # ------------------------------------------------------------------ the worker's side

    def collect_step(self) -> bool:
        """Collect now for the step just completed and hand it to the exporting thread.

        Called on the worker thread at a clean step boundary (by the step clock). Never
        raises.

        Returns:
            Whether the collection succeeded (the export itself happens later).
        """
        self._local.trigger = "step"
        try:
            self._collect_counted(self._timeout_ms)
        except BaseException:  # a callback's failure (SystemExit too) must not reach the worker
            if sys.is_finalizing():
                raise
            self.counts.add("step", ok=False)
            warn_once("export:collect", "async_tee: collecting a step's metrics failed")
            return False
        finally:
            self._local.trigger = None
        return True

    def _receive_metrics(self, metrics_data: Any, timeout_millis: float = 10_000, **_: Any) -> None:
        trigger = getattr(self._local, "trigger", None)
        if threading.current_thread() is self.thread:
            self._send(metrics_data, trigger or "interval")
            return
        with self._cond:
            # At most one collection waits behind an export in flight; while the thread is
            # idle a second may queue behind the first it is about to take. A newer one
            # replaces the newest waiting (its step is folded into this one).
            while len(self._queued) >= (1 if self._busy else 2):
                if self._queued.pop()[1] == "step":
                    self.replaced += 1
            self._handed += 1
            self._queued.append((metrics_data, trigger or "flush", self._handed))
            self._cond.notify_all()

    # ------------------------------------------------------------------ the exporting thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping:
                    now = time.monotonic()
                    hold = self.not_before() - now  # the collector asked for quiet until then
                    if hold > 0:
                        self._cond.wait(hold)  # newer steps replace the one waiting meanwhile
                        continue
                    if self._queued:
                        break
                    wait = self.period_due() - now
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._stopping:
                    break
                queued = self._queued.popleft() if self._queued else None
                self._busy = True
            budget().start()  # the GIL was just taken back after the wait: a fresh slice
            try:
                if queued is not None:
                    self._send(*queued)
                else:
                    self._collect_here("interval")
            finally:
                with self._cond:
                    self._busy = False
        with self._cond:  # what was collected but not sent yet goes first, then the last state
            if self._abandoned:  # shutdown gave up waiting: export nothing after its deadline
                return
            queued_at_stop = list(self._queued)
            self._queued.clear()
            if self.not_before() > time.monotonic():  # asked for quiet: the last state alone
                self.replaced += sum(trigger == "step" for _, trigger, _ in queued_at_stop)
                queued_at_stop = []
        for queued in queued_at_stop:
            self._send(*queued)
        self._collect_here("shutdown")

    def not_before(self) -> float:
        """When (monotonic) the collector's last ``Retry-After`` ends; 0.0 for none."""
        session = self._session
        return 0.0 if session is None else float(session.not_before)

    @property
    def last_error(self) -> str:
        """Why the last export failed, as the exporter said it; empty when it succeeded."""
        if self.failures == 0:
            return ""
        session = self._session
        return (session.last_error if session is not None else "") or self._last_error.text

    def _note_result(self, ok: bool) -> None:
        """Count a failure in a row; say once when the exporter is failing, and when not."""
        if ok:
            self.failures = 0
            if self.failing:
                self.failing = False
                warn_once(
                    f"export:recovered:{self.name}",
                    "async_tee: %s exports are delivered again",
                    self.name,
                    traceback=False,
                )
            return
        self.failures += 1
        if self.failures >= FAILING_AFTER and not self.failing:
            self.failing = True
            error = self.last_error or "the exporter logged no reason: is its logger silenced?"
            warn_once(
                f"export:failing:{self.name}",
                "async_tee: %d %s exports in a row failed, none delivered (%s); check %s",
                self.failures,
                self.name,
                error,
                fix_for(error),
                traceback=False,
            )

    def period_due(self) -> float:
        """When (monotonic) the periodic export is due, if no other export comes first."""
        return self.policy.backstop_due(self._last_export, self._last_was_step)

    def _collect_here(self, trigger: str) -> None:
        """Collect and export on the exporting thread. Never raises."""
        self._local.trigger = trigger
        try:
            self._collect_counted(self._timeout_ms)
        except BaseException:  # a slow or raising callback (SystemExit too) must not end it
            if sys.is_finalizing():
                raise
            self.counts.add(trigger, ok=False)
            self._last_export, self._last_was_step = time.monotonic(), False
            warn_once("export:collect", "async_tee: collecting metrics for an export failed")
        finally:
            self._local.trigger = None

    def _send(self, metrics_data: Any, trigger: str, seq: int = 0) -> None:
        """Export one collection, count its result. Never raises."""
        self._last_export = time.monotonic()
        self._last_was_step = trigger == "step"
        budget().spend()  # the encoding ahead holds the GIL in one piece: start it on a fresh slice
        try:
            with _suppressed_instrumentation():
                result = self._exporter.export(metrics_data, timeout_millis=self._timeout_ms)
            ok = result is MetricExportResult.SUCCESS
        except BaseException:  # an exporter bug is a failed export, whatever it raises
            if sys.is_finalizing():
                raise
            warn_once("export:raised", "async_tee: the metric exporter raised")
            ok = False
        self.counts.add(trigger, ok)
        self._note_result(ok)
        if not ok:
            logger.debug("async_tee: a %s export failed", trigger)
        if seq:
            with self._cond:
                self._sent = seq
                self._cond.notify_all()

    # ------------------------------------------------------------------ the SDK's calls

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Collect now and wait, at most ``timeout_millis``, until that has been exported."""
        deadline = time.monotonic() + max(0.0, timeout_millis) / 1000.0
        try:
            self._collect_counted(timeout_millis)
        except Exception:  # noqa: BLE001 - never raise into the caller
            warn_once("export:flush", "async_tee: collecting metrics for a flush failed")
            return False
        with self._cond:
            target = self._handed
            while self._sent < target and self.thread.is_alive():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return self._sent >= target

    def shutdown(self, timeout_millis: float = 30_000, **_: Any) -> None:
        """Export once more, stop the thread and shut the exporter down, within the timeout.

        The exporting thread finishes the export in flight, if any, sends what is still
        waiting, then collects and exports once more (``shutdown``), all by the deadline.
        """
        if self._stopped:
            return
        self._stopped = True
        budget = max(0.0, timeout_millis) / 1000.0
        deadline = time.monotonic() + budget
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        # Keep a little of the budget to cancel an export still in flight at the deadline:
        # shutting the exporter down closes its channel, which ends the call, and the thread.
        self.thread.join(max(0.0, deadline - min(CANCEL_MARGIN_S, budget / 10) - time.monotonic()))
        with self._cond:
            self._abandoned = self.thread.is_alive()
        if self._abandoned and self._session is not None:
            self._session.abort()  # OTLP/HTTP: its blocked request ends with its socket
        remaining_ms = max(0.0, deadline - time.monotonic()) * 1000.0
        try:
            self._exporter.shutdown(timeout_millis=remaining_ms)
        except Exception:  # noqa: BLE001 - shutdown must not raise
            warn_once("export:shutdown", "async_tee: shutting down the metric exporter failed")
        self.thread.join(max(0.0, deadline - time.monotonic()))
        for logger_name in _EXPORTER_LOGGERS:
            logging.getLogger(logger_name).removeFilter(self._last_error)

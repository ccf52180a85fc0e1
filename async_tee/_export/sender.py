"""The exporting thread: each export's request queued in order, delivered (docs/semantics.md §7).

The worker builds a completed step's request from the tables (``collect_step``) and queues it;
the thread ``async-tee-export`` sends the oldest first through the transport, retries what failed
for a reason that passes (with backoff, or when the receiver's ``Retry-After`` says), drops what
the receiver refused for good, and makes the periodic export when no other came for an interval.
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from async_tee._export.delivery import Backlog, ExportCounts, Request
from async_tee._export.transport import ABORTED, Answer, Transport, fix_for
from async_tee._reporting import logger, warn_once
from async_tee._worker.gil import budget
from async_tee._worker.loop import EpisodeLog
from async_tee._worker.steps import StepPolicy

if TYPE_CHECKING:
    from async_tee._export.encode import TableEncoder

FAILING_AFTER = 3
"""Consecutive failed sends after which the exporter's state is ``failing``: it says so once,
``is_exporting`` turns False, and the next delivered request turns it back."""

BACKOFF_S = (0.5, 5.0)
"""The wait before sending a request again after a transient failure: the first, doubling up to
the longest (each with ±20 % jitter), unless the receiver said how long (``Retry-After``). The
longest bounds how late the backlog starts to drain once the receiver is back."""

CANCEL_MARGIN_S = 0.5
"""At most this much of a shutdown's budget (and at most a tenth) is kept to abort a send still
in flight, so the exporting thread ends within the budget."""


@contextlib.contextmanager
def _suppressed_instrumentation() -> Iterator[None]:
    """Instrumented HTTP or gRPC clients do not trace the export itself.

    Through OTel instrumentation's public ``suppress_instrumentation``, where it is installed.
    """
    try:
        from opentelemetry.instrumentation.utils import suppress_instrumentation
    except ImportError:  # no instrumentation installed: nothing to suppress
        yield
        return
    with suppress_instrumentation():
        yield


def backoff_s(attempts: int, retry_after_s: float | None) -> float:
    """How long to wait before the next send of a request that failed ``attempts`` times."""
    if retry_after_s is not None:
        return retry_after_s
    first, longest = BACKOFF_S
    return float(min(longest, first * 2 ** max(0, attempts - 1)) * random.uniform(0.8, 1.2))


class OtlpSender:
    """The OTLP exporter of a provider async_tee builds: the backlog and its exporting thread.

    Attributes:
        name: The exporter's name in ``OTEL_METRICS_EXPORTER`` (``otlp``).
        step_aligned: Whether the worker drives it at step boundaries.
        policy: When the periodic export is due.
        counts: Send attempts by trigger and result.
        backlog: The requests not delivered yet, and the delivery figures.
        failures: Consecutive failed sends.
        failing: ``FAILING_AFTER`` of them in a row, and nothing delivered since.
        last_error: Why the last send failed; empty once one is delivered.
    """

    def __init__(
        self,
        transport: Transport,
        make_transport: Callable[[], Transport],
        *,
        policy: StepPolicy,
        timeout_s: float,
        collect_timeout_s: float,
        counts: ExportCounts,
        max_bytes: int,
        step_aligned: bool,
        name: str = "otlp",
    ) -> None:
        """Start the exporting thread (named ``async-tee-export``).

        Args:
            transport: The endpoint's transport.
            make_transport: Makes another (a forked child's).
            policy: The step policy (the periodic export's interval).
            timeout_s: Each send's deadline (``OTEL_EXPORTER_OTLP_TIMEOUT``).
            collect_timeout_s: Each build's deadline for observable callbacks
                (``OTEL_METRIC_EXPORT_TIMEOUT``).
            counts: Where send attempts are counted.
            max_bytes: The backlog's bound (``ASYNC_TEE_EXPORT_BACKLOG_BYTES``).
            step_aligned: Whether the worker drives it at step boundaries.
            name: The exporter's name.
        """
        self._make_transport = make_transport
        self.transport = transport
        self.name = name
        self.where = self.transport.where
        self.step_aligned = step_aligned
        self.policy = policy
        self.counts = counts
        self._timeout_s = timeout_s
        self._collect_timeout_s = collect_timeout_s
        self._max_bytes = max_bytes
        self._encoder: TableEncoder | None = None
        self._stopped = False
        self._orphans: list[Transport] = []  # a forked child keeps the parent's, untouched
        self._init_thread()

    def _init_thread(self) -> None:
        """A fresh backlog, state and thread (at start, and in a child after ``fork``)."""
        self._cond = threading.Condition()
        self._build_lock = threading.Lock()
        self.backlog = Backlog(self._max_bytes)
        self.failures = 0
        self.failing = False
        self.last_error = ""
        self._retry_at = 0.0  # monotonic: the waiting requests are not sent before this
        self._last_made = time.monotonic()  # when the last request was made (or the start)
        self._last_was_step = False
        self._stopping = False
        self._deadline = float("inf")  # the shutdown's, once stopping
        self._final_made = False  # the shutdown's own export was asked for
        self._final: Request | None = None
        self._episodes = EpisodeLog()
        self.thread = threading.Thread(target=self._run, name="async-tee-export", daemon=True)
        self.thread.start()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`shutdown` was called."""
        return self._stopped

    def use_tables(self, encoder: TableEncoder) -> None:
        """Build every export's request with ``encoder`` (the session's tables)."""
        with self._cond:
            self._encoder = encoder
            self._cond.notify_all()  # the periodic export is due from now on

    # ------------------------------------------------------------------ making requests

    def _make(self, trigger: str) -> Request | None:
        """This export's request, built from the tables now; None if there is nothing to build.

        Counted first: the self-series read during one build share one ``stats()``.

        Raises:
            Exception: The build failed (an observable callback past its timeout, say).
        """
        encoder = self._encoder
        if encoder is None:
            return None
        self.counts.collections += 1
        encoded = encoder.request(self._collect_timeout_s)
        with self._cond:
            return self.backlog.new(encoded.data, encoded.points, trigger)

    def _make_and_queue(self, trigger: str, watch: bool = False) -> Request | None:
        """Make and queue this export's request. Never raises: a failure is counted.

        One at a time (the worker's step and the exporting thread's interval), so requests
        are queued in the order their points were stamped.

        Args:
            trigger: What made it.
            watch: Record whether it is delivered (``Backlog.watched``) for a flush.
        """
        with self._build_lock:
            try:
                request = self._make(trigger)
            except BaseException:  # a callback's failure (SystemExit too) must not end a thread
                if sys.is_finalizing():
                    raise
                self.counts.add(trigger, ok=False)
                with self._cond:
                    self._last_made, self._last_was_step = time.monotonic(), False
                warn_once("export:collect", "async_tee: building an export's request failed")
                return None
            if request is None:
                return None
            with self._cond:
                if watch:
                    self.backlog.watched[request.seq] = None
                self._last_made = time.monotonic()
                self._last_was_step = trigger == "step"
                self._note_overflow(self.backlog.put(request))
                self._cond.notify_all()
        return request

    def collect_step(self) -> bool:
        """Queue the request of the step just completed (on the worker, tables clean).

        Returns:
            Whether the request was built (its delivery happens on the exporting thread).
        """
        return self._make_and_queue("step") is not None

    # ------------------------------------------------------------------ the exporting thread

    def _run(self) -> None:
        while True:
            with self._cond:
                request, trigger = self._next()
            budget().start()  # the GIL was just taken back after the wait: a fresh slice
            if request is not None:
                self._send(request)
            elif trigger == "shutdown":
                self._final = self._make_and_queue(trigger)
            elif trigger:
                self._make_and_queue(trigger)
            else:
                return

    def _next(self) -> tuple[Request | None, str]:
        """Under the condition: wait for the next thing to do.

        Returns:
            A request to send, or None and the trigger of an export to make (``""``: stop).
        """
        backlog = self.backlog
        while True:
            now = time.monotonic()
            if self._stopping and now >= self._deadline:
                return None, ""
            if (
                self._stopping
                and not self._final_made
                and (not backlog.waiting or now < self._retry_at)
            ):
                # The final export, made once what was queued is sent (so its own counts
                # include those sends), or at once while the receiver is failing.
                self._final_made = True
                return None, "shutdown"
            if backlog.waiting and now >= self._retry_at:
                return backlog.take(), ""
            if self._stopping:
                if not backlog.waiting:
                    return None, ""
                self._cond.wait(min(self._retry_at, self._deadline) - now)
                continue
            due = self.period_due() if self._encoder is not None else float("inf")
            if due <= now:
                return None, "interval"
            if backlog.waiting:
                due = min(due, self._retry_at)
            self._cond.wait(due - now if due != float("inf") else None)

    def period_due(self) -> float:
        """When (monotonic) the periodic export is due, if no other export comes first."""
        return self.policy.backstop_due(self._last_made, self._last_was_step)

    def _send(self, request: Request) -> None:
        """Send the request in flight and settle it by the answer. Never raises."""
        timeout = self._timeout_s
        if self._stopping:
            timeout = min(timeout, max(0.0, self._deadline - time.monotonic()))
        try:
            with _suppressed_instrumentation():
                answer = self.transport.send(request.data, timeout)
        except BaseException as exc:  # a transport's bug is a failed send, whatever it raises
            if sys.is_finalizing():
                raise
            warn_once("export:raised", "async_tee: the OTLP transport raised")
            answer = Answer(False, reason="error", error=f"{type(exc).__name__}: {exc}")
        self.counts.add(request.trigger, answer.delivered)
        with self._cond:
            backlog = self.backlog
            if answer.delivered:
                backlog.delivered_one(request, answer.rejected_points)
                self._retry_at = 0.0
            elif answer is ABORTED:  # the shutdown's deadline: it stays, dropped and said there
                backlog.put_back(request)
                self._deadline = 0.0
            elif answer.retry:
                wait = backoff_s(request.attempts + 1, answer.retry_after_s)
                self._retry_at = time.monotonic() + wait
                self._note_overflow(backlog.again(request))
            else:
                backlog.refused(request, answer.reason)
            self._cond.notify_all()
        if answer is not ABORTED:
            self._note_answer(request, answer)

    def _note_answer(self, request: Request, answer: Answer) -> None:
        """Say what a person must know, once: failing, back, refused, partly rejected."""
        if answer.rejected_points:
            warn_once(
                f"export:rejected:{self.name}",
                "async_tee: the receiver rejected %d of %d points of an export: %s",
                answer.rejected_points,
                request.points,
                answer.rejected_message or "(it gave no reason)",
                traceback=False,
            )
        if answer.delivered:
            self.failures, self.last_error = 0, ""
            if self.failing:
                self.failing = False
                warn_once(
                    f"export:recovered:{self.name}",
                    "async_tee: %s exports are delivered again; %d requests still queued are "
                    "sent in order",
                    self.name,
                    len(self.backlog),
                    traceback=False,
                )
            return
        self.failures += 1
        self.last_error = answer.error or answer.reason
        if not answer.retry:
            warn_once(
                f"export:refused:{self.name}:{answer.reason}",
                "async_tee: the receiver at %s refused an export for good (%s): it is dropped "
                "and counted (async_tee.export.dropped{reason=refused}), the next one is sent; "
                "check %s",
                self.where,
                answer.error,
                fix_for(answer.reason, answer.error),
                traceback=False,
            )
        if self.failures >= FAILING_AFTER and not self.failing:
            self.failing = True
            warn_once(
                f"export:failing:{self.name}",
                "async_tee: %d %s sends in a row failed (%s); the requests are kept in order "
                "(ASYNC_TEE_EXPORT_BACKLOG_BYTES) and sent when the receiver answers; check %s",
                self.failures,
                self.name,
                self.last_error,
                fix_for(answer.reason, answer.error),
                traceback=False,
            )
        logger.debug("async_tee: a %s send failed: %s", request.trigger, answer.error)

    def _note_overflow(self, dropped: list[Request]) -> None:
        """Under the condition: say (at most once a minute) that the backlog's oldest went."""
        if dropped:
            self._episodes.log(
                "overflow",
                "async_tee: the export backlog reached ASYNC_TEE_EXPORT_BACKLOG_BYTES (%d bytes): "
                "its %d oldest requests (%d points) were dropped and counted "
                "(async_tee.export.dropped{reason=overflow})",
                self.backlog.max_bytes,
                len(dropped),
                sum(request.points for request in dropped),
            )

    # ------------------------------------------------------------------ flush, shutdown, fork

    def force_flush(self, timeout_s: float) -> bool:
        """Queue an export of the tables now; wait until it is delivered, at most ``timeout_s``.

        Everything queued before it is sent first. Returns whether it was delivered.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        request = self._make_and_queue("flush", watch=True)
        if request is None:
            return False
        with self._cond:
            watched = self.backlog.watched
            try:
                while watched.get(request.seq) is None and self.thread.is_alive():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                return bool(watched.get(request.seq))
            finally:
                watched.pop(request.seq, None)

    def shutdown(self, deadline: float) -> bool:
        """Deliver what is queued in order, export once more, stop, all by ``deadline``.

        The final export is made once the backlog is sent (at once while the receiver fails).
        A send still in flight near the deadline is aborted; what is left then is dropped,
        counted (``dropped{reason=shutdown}``) and said.

        Returns:
            Whether every request of the session was delivered, the final one included.
        """
        if self._stopped:
            return False
        self._stopped = True
        with self._cond:
            self._stopping = True
            self._deadline = deadline
            self._cond.notify_all()
        budget_s = max(0.0, deadline - time.monotonic())
        margin = min(CANCEL_MARGIN_S, budget_s / 10)
        self.thread.join(max(0.0, deadline - margin - time.monotonic()))
        if self.thread.is_alive():
            self.transport.abort()  # a send blocked on a silent receiver ends with its socket
            with self._cond:  # a thread waiting for a retry's time stops waiting: it is over
                self._deadline = 0.0
                self._cond.notify_all()
            self.thread.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            left = self.backlog.drop_all("shutdown")
        if left:
            warn_once(
                f"export:left:{self.name}",
                "async_tee: %d export requests (%d points, the oldest %.0f s old) were not "
                "delivered by the shutdown's deadline (ASYNC_TEE_SHUTDOWN_TIMEOUT): %s",
                len(left),
                sum(request.points for request in left),
                max(0.0, time.monotonic() - left[0].made),
                self.last_error or "the receiver did not answer in time",
                traceback=False,
            )
        self.transport.close()
        dropped = sum(self.backlog.dropped.values())
        return self._final is not None and not left and dropped == 0

    def after_fork_in_child(self) -> None:
        """The child's own transport, backlog and thread (the parent's did not survive ``fork``)."""
        if self._stopped:
            return
        self._orphans.append(self.transport)  # never closed here: its socket is the parent's
        self.transport = self._make_transport()
        self._init_thread()

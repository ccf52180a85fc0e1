"""The first hop's backlog: each export's request in order, bounded by bytes (docs/semantics.md §7).

Written by the worker (a step's request) and the exporting thread (the others), under the
exporting thread's condition; read by ``stats()`` without it (one slot per figure).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque

TRIGGERS = ("step", "interval", "shutdown", "flush")
"""What starts an export: a completed step, the periodic interval, shutdown, a force flush."""

DROP_REASONS = ("overflow", "refused", "shutdown")
"""Why a request was never delivered: the backlog past its bound (the oldest go), a permanent
refusal by the receiver (HTTP 400/401/403/404/413, gRPC INVALID_ARGUMENT, ...), or the
shutdown's deadline with the receiver still away."""


class ExportCounts:
    """Export attempts by trigger and result, written by the exporting thread (and worker).

    Each count is one integer slot written by one thread at a time and read by ``stats()``
    without a lock, like the worker's counts. A request sent three times before it was
    delivered is two failures and one success.
    """

    def __init__(self) -> None:
        self.by_trigger: dict[str, dict[str, int]] = {}
        self.collections = 0  # requests built by async_tee: a new one each
        self.reset()

    def reset(self) -> None:
        """Zero every count (a new session, or a child after fork)."""
        self.by_trigger = {trigger: {"success": 0, "failure": 0} for trigger in TRIGGERS}
        self.collections = 0

    def add(self, trigger: str, ok: bool) -> None:
        """Count one export attempt."""
        self.by_trigger[trigger]["success" if ok else "failure"] += 1

    def totals(self) -> dict[str, int]:
        """``{"success": n, "failure": n}`` over every trigger."""
        return {
            result: sum(counts[result] for counts in self.by_trigger.values())
            for result in ("success", "failure")
        }

    def snapshot(self) -> dict[str, dict[str, int]]:
        """A copy of the counts by trigger, for ``stats()``."""
        return {trigger: dict(counts) for trigger, counts in self.by_trigger.items()}


@dataclasses.dataclass(eq=False)
class Request:
    """One export's encoded ``ExportMetricsServiceRequest``, waiting for delivery.

    Attributes:
        data: Its bytes (its points carry the time it was built).
        points: Its data points.
        trigger: What made it (:data:`TRIGGERS`).
        seq: Its place in the order requests were made (from 1).
        made: When it was made (monotonic).
        attempts: Sends that failed and are worth another.
    """

    data: bytes
    points: int
    trigger: str
    seq: int
    made: float = dataclasses.field(default_factory=time.monotonic)
    attempts: int = 0


class Backlog:
    """Requests not delivered yet, oldest first, at most ``max_bytes`` of them.

    The one being sent is out of the deque (``in_flight``) but still counted in ``bytes``;
    a failed send worth another puts it back at the front. Past the bound the oldest
    waiting requests go, counted, never the one being sent.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.waiting: deque[Request] = deque()
        self.in_flight: Request | None = None
        self.bytes = 0
        self.made = 0  # requests put, numbering them
        self.delivered = 0
        self.delivered_points = 0
        self.retries = 0  # failed sends worth another
        self.rejected_points = 0  # points a receiver said it rejected (partial success)
        self.dropped = dict.fromkeys(DROP_REASONS, 0)  # requests
        self.dropped_points = dict.fromkeys(DROP_REASONS, 0)
        self.refused_by_reason: dict[str, int] = {}  # a transport's bounded labels
        self.watched: dict[int, bool | None] = {}  # seq -> delivered, for a flush waiting on it

    def new(self, data: bytes, points: int, trigger: str) -> Request:
        """Number a request made now."""
        self.made += 1
        return Request(data, points, trigger, self.made)

    def put(self, request: Request) -> list[Request]:
        """Queue ``request`` last; return the oldest waiting ones dropped to keep the bound."""
        self.waiting.append(request)
        self.bytes += len(request.data)
        return self._keep_bound()

    def take(self) -> Request:
        """The oldest waiting request, now in flight (the caller checked one waits)."""
        request = self.in_flight = self.waiting.popleft()
        return request

    def again(self, request: Request) -> list[Request]:
        """The request in flight failed and is worth another: first again (if still bounded)."""
        self.retries += 1
        request.attempts += 1
        self.put_back(request)
        return self._keep_bound()

    def put_back(self, request: Request) -> None:
        """The request in flight was not sent (the shutdown aborted it): first again, as it was."""
        self.in_flight = None
        self.waiting.appendleft(request)

    def delivered_one(self, request: Request, rejected_points: int = 0) -> None:
        """The request in flight was delivered (``rejected_points`` of it refused: partial)."""
        self.in_flight = None
        self._release(request)
        self.delivered += 1
        self.delivered_points += request.points
        self.rejected_points += rejected_points
        self._finish(request, True)

    def refused(self, request: Request, reason: str) -> None:
        """The receiver refused the request in flight for good (``reason``, a bounded label)."""
        self.in_flight = None
        self._release(request)
        self.refused_by_reason[reason] = self.refused_by_reason.get(reason, 0) + 1
        self._count_dropped(request, "refused")

    def drop_all(self, reason: str) -> list[Request]:
        """Drop every request left, in flight too (the shutdown's deadline passed)."""
        left = list(self.waiting)
        if self.in_flight is not None:
            left.insert(0, self.in_flight)
        self.waiting.clear()
        self.in_flight = None
        for request in left:
            self._release(request)
            self._count_dropped(request, reason)
        return left

    def _keep_bound(self) -> list[Request]:
        dropped = []
        while self.bytes > self.max_bytes and self.waiting:
            request = self.waiting.popleft()
            self._release(request)
            self._count_dropped(request, "overflow")
            dropped.append(request)
        return dropped

    def _release(self, request: Request) -> None:
        """``request`` leaves the backlog: its bytes are no longer held."""
        self.bytes -= len(request.data)

    def _count_dropped(self, request: Request, reason: str) -> None:
        self.dropped[reason] += 1
        self.dropped_points[reason] += request.points
        self._finish(request, False)

    def _finish(self, request: Request, delivered: bool) -> None:
        if request.seq in self.watched:
            self.watched[request.seq] = delivered

    def __len__(self) -> int:
        return len(self.waiting) + (self.in_flight is not None)

    def oldest_age_s(self) -> float:
        """How long the oldest undelivered request has waited (0.0 with none)."""
        oldest = self.in_flight or (self.waiting[0] if self.waiting else None)
        return 0.0 if oldest is None else max(0.0, time.monotonic() - oldest.made)

    def figures(self) -> dict[str, object]:
        """``stats()["delivery"]``."""
        return {
            "queued": len(self),
            "queued_bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "oldest_s": round(self.oldest_age_s(), 3),
            "delivered": self.delivered,
            "delivered_points": self.delivered_points,
            "retries": self.retries,
            "dropped": dict(self.dropped),
            "dropped_points": dict(self.dropped_points),
            "refused_by_reason": dict(self.refused_by_reason),
            "rejected_points": self.rejected_points,
        }

"""What a transport is: send one encoded request within a deadline, abort (docs/semantics.md §7).

A transport answers every send with an :class:`Answer` and never raises: delivered, a transient
failure to send again later, or a permanent refusal to drop (the OTLP specification's split).
"""

from __future__ import annotations

import dataclasses
import time
from email.utils import parsedate_to_datetime
from typing import Protocol

MAX_RETRY_AFTER_S = 600.0
"""The longest ``Retry-After`` (or gRPC ``RetryInfo``) honoured: a receiver asking for more is
asked again then."""

RETRYABLE_HTTP = frozenset((429, 502, 503, 504))
"""The HTTP statuses the OTLP specification says to retry; every other 4xx and 5xx is final."""


@dataclasses.dataclass(frozen=True)
class Answer:
    """How one send ended.

    Attributes:
        delivered: The receiver accepted the request (a partial success is delivered, with
            ``rejected_points`` counted).
        retry: Not delivered, and worth sending again (refused or reset connection, timeout,
            HTTP 429/502/503/504, gRPC UNAVAILABLE and the other transient codes).
        reason: A short, bounded label: ``http_503``, ``unavailable``, ``connection``,
            ``timeout``, ``tls``, ``aborted``; empty when delivered.
        error: What happened, for a person (the status line, the exception).
        retry_after_s: How long the receiver asked to wait (``Retry-After``), if it did.
        rejected_points: Points the receiver said it rejected (OTLP partial success).
        rejected_message: Why, as the receiver put it.
    """

    delivered: bool
    retry: bool = False
    reason: str = ""
    error: str = ""
    retry_after_s: float | None = None
    rejected_points: int = 0
    rejected_message: str = ""


DELIVERED = Answer(True)
ABORTED = Answer(False, reason="aborted", error="the transport was aborted at shutdown")


def partial(response: object) -> Answer:
    """Delivered, with the points an ``ExportMetricsServiceResponse`` says were rejected."""
    details = getattr(response, "partial_success", None)
    rejected = int(getattr(details, "rejected_data_points", 0) or 0)
    if not rejected:
        return DELIVERED
    message = str(getattr(details, "error_message", ""))[:300]
    return Answer(True, rejected_points=rejected, rejected_message=message)


class Transport(Protocol):
    """One OTLP endpoint's connection (``http_transport``, ``grpc_transport``)."""

    where: str
    """The endpoint, credentials redacted, as messages show it."""

    def send(self, data: bytes, timeout_s: float) -> Answer:
        """Send one serialized ``ExportMetricsServiceRequest``; never raises."""

    def abort(self) -> None:
        """From any thread: a send in progress ends now, every later one fails at once."""

    def close(self) -> None:
        """Release the connection (the send thread, after its last send)."""


def retry_after_s(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` value asks for (delta-seconds or an HTTP date), capped."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError):
            return None
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def fix_for(reason: str, error: str = "") -> str:
    """The variable (or receiver setting) that most likely fixes a failure."""
    text = f"{reason} {error}".lower()
    if "tls" in text or "ssl" in text or "certificate" in text:
        return "OTEL_EXPORTER_OTLP_CERTIFICATE (or the endpoint's scheme, http:// or https://)"
    if any(word in text for word in ("401", "403", "unauthenticated", "permission_denied")):
        return "OTEL_EXPORTER_OTLP_HEADERS (the receiver's credentials)"
    if any(word in text for word in ("404", "unimplemented", "405")):
        return (
            "OTEL_EXPORTER_OTLP_ENDPOINT's path (OTLP/HTTP posts to /v1/metrics) or "
            "OTEL_EXPORTER_OTLP_PROTOCOL (grpc or http/protobuf, as the receiver's port speaks)"
        )
    if "413" in text or "too large" in text:
        return "the receiver's request size limit (a Collector's max_request_body_size)"
    if any(word in text for word in ("400", "invalid_argument")):
        return "the receiver's log: it refused the request as malformed"
    if any(word in text for word in ("timeout", "deadline")):
        return "OTEL_EXPORTER_OTLP_TIMEOUT, or the receiver's load"
    return (
        "OTEL_EXPORTER_OTLP_ENDPOINT (is the receiver up at that address, and answering "
        "within OTEL_EXPORTER_OTLP_TIMEOUT?)"
    )

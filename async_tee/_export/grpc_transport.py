"""OTLP/gRPC: one channel and a raw unary call of the metrics service (docs/semantics.md §7)."""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import urlsplit

import grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from async_tee._export.transport import (
    ABORTED,
    MAX_RETRY_AFTER_S,
    Answer,
    partial,
)
from async_tee._settings import Settings, redact_url
from async_tee._version import __version__

EXPORT_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"

RETRYABLE_CODES = frozenset(
    (
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    )
)
"""The codes the OTLP specification says to retry (RESOURCE_EXHAUSTED: a receiver out of
memory or over its limit, which recovers); every other code is final."""

RECONNECT_BACKOFF_MS = (500, 5000)
"""The channel's reconnection backoff, first and longest: gRPC's default grows to 120 s, so a
receiver back after a long outage would wait that long for the channel to try again."""

_COMPRESSION = {
    "none": grpc.Compression.NoCompression,
    "gzip": grpc.Compression.Gzip,
    "deflate": grpc.Compression.Deflate,
}


def _target(endpoint: str) -> tuple[str, bool]:
    """``host:port`` and whether the scheme asks for plain text (``http://``)."""
    if "://" not in endpoint:
        return endpoint, False
    url = urlsplit(endpoint)
    return url.netloc.rpartition("@")[2], url.scheme == "http"


def _credentials(settings: Settings) -> Any:
    def read(path: str) -> bytes | None:
        if not path:
            return None
        with open(path, "rb") as file:
            return file.read()

    return grpc.ssl_channel_credentials(
        root_certificates=read(settings.otlp_certificate),
        private_key=read(settings.otlp_client_key),
        certificate_chain=read(settings.otlp_client_certificate),
    )


class GrpcTransport:
    """Calls ``MetricsService/Export`` with the request's bytes as they are."""

    def __init__(self, settings: Settings) -> None:
        """Open the channel (it connects on the first call).

        Raises:
            OSError: A certificate file cannot be read.
        """
        target, plain = _target(settings.otlp_endpoint)
        self.where = redact_url(settings.otlp_endpoint)
        insecure = plain if settings.otlp_insecure is None else settings.otlp_insecure
        first_ms, longest_ms = RECONNECT_BACKOFF_MS
        options = (
            # The channel's own subchannels, closed with it (from the process-wide pool they
            # would outlive it), each connection attempt bounded by the export timeout.
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.min_reconnect_backoff_ms", max(1, int(settings.otlp_timeout_s * 1000))),
            ("grpc.initial_reconnect_backoff_ms", first_ms),
            ("grpc.max_reconnect_backoff_ms", longest_ms),
            ("grpc.primary_user_agent", f"async_tee/{__version__}"),
        )
        compression = _COMPRESSION[settings.otlp_compression]
        if insecure:
            self._channel = grpc.insecure_channel(target, options, compression)
        else:
            self._channel = grpc.secure_channel(
                target, _credentials(settings), options, compression
            )
        # No request serializer: the request is sent as the bytes it already is.
        self._call = self._channel.unary_unary(
            EXPORT_METHOD, response_deserializer=ExportMetricsServiceResponse.FromString
        )
        self._metadata = tuple(settings.otlp_headers) or None
        self.aborted = False

    def send(self, data: bytes, timeout_s: float) -> Answer:
        """Call ``Export``; the answer as the OTLP specification classes it. Never raises."""
        if self.aborted:
            return ABORTED
        try:
            response = self._call(data, timeout=max(timeout_s, 0.001), metadata=self._metadata)
        except grpc.RpcError as exc:
            return ABORTED if self.aborted else _answer(exc)
        except Exception as exc:  # noqa: BLE001 - a closed channel, a bad metadata value
            if self.aborted:
                return ABORTED
            return Answer(False, reason="error", error=f"{type(exc).__name__}: {exc}")
        return partial(response)

    def abort(self) -> None:
        """Close the channel: a call in progress ends (CANCELLED), later ones fail at once."""
        self.aborted = True
        self.close()

    def close(self) -> None:
        """Close the channel and its connections."""
        with contextlib.suppress(Exception):  # closing twice, or during the interpreter's exit
            self._channel.close()


def _answer(exc: grpc.RpcError) -> Answer:
    code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
    details = exc.details() if callable(getattr(exc, "details", None)) else ""
    reason = code.name.lower() if isinstance(code, grpc.StatusCode) else "unknown"
    error = f"gRPC {reason.upper()}: {details}"[:300]
    if code in RETRYABLE_CODES:
        return Answer(False, retry=True, reason=reason, error=error, retry_after_s=_delay(exc))
    return Answer(False, reason=reason, error=error)


def _delay(exc: grpc.RpcError) -> float | None:
    """The ``RetryInfo`` delay a receiver attached to its status, if any, capped."""
    try:
        from google.rpc import error_details_pb2, status_pb2
    except ImportError:  # googleapis-common-protos is not installed: no RetryInfo to read
        return None
    trailers = exc.trailing_metadata() if callable(getattr(exc, "trailing_metadata", None)) else ()
    for key, value in trailers or ():
        if key != "grpc-status-details-bin":
            continue
        try:
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    seconds = info.retry_delay.seconds + info.retry_delay.nanos / 1e9
                    return float(min(max(seconds, 0.0), MAX_RETRY_AFTER_S))
        except Exception:  # noqa: BLE001 - a malformed detail says nothing
            return None
    return None

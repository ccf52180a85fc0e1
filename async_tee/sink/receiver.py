"""``OtlpSink``, a real OTLP metrics receiver (gRPC and HTTP) for tests, demos and benchmarks."""

from __future__ import annotations

import contextlib
import gzip
import http.server
import itertools
import json
import logging
import socket
import sys
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from concurrent import futures
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit

import grpc
from google.protobuf.message import DecodeError  # type: ignore[import-untyped,unused-ignore]
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from async_tee.sink.points import ReceivedPoint, received_points

__all__ = ["OtlpSink", "black_hole"]

_logger = logging.getLogger(__name__)

_THREAD_PREFIX = "async-tee-sink"
_METRICS_PATH = "/v1/metrics"
_PROTOBUF_CONTENT_TYPE = "application/x-protobuf"
_MAX_BODY_BYTES = 64 * 1024 * 1024
_MAX_STALL_S = 600.0
_HTTP_IDLE_TIMEOUT_S = 30.0
_GRPC_WORKERS = 8
_MAX_REQUEST_SIZES = 100_000  # request_sizes() keeps the newest this many
_SINK_IDS = itertools.count(1)  # numbers each sink's thread names in this process


def _hashable(value: Any) -> Any:
    """Return a hashable stand-in for a decoded attribute value (lists/dicts become tuples)."""
    if isinstance(value, list):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((key, _hashable(item)) for key, item in value.items()))
    return value


def _render(point: ReceivedPoint) -> str:
    """Render a point as one human-readable line, its sender included (``echo_format="text"``).

    E.g. ``[grpc job-7/rank-3] rl.reward.mean{} = 0.5 (gauge)``; a sender that would not
    print on one line is shown as its ``repr``.
    """
    attrs = ",".join(f"{key}={value!r}" for key, value in point.attributes.items())
    sender = point.sender
    if sender is not None and not sender.isprintable():
        sender = repr(sender)
    origin = point.protocol if sender is None else f"{point.protocol} {sender}"
    head = f"[{origin}] {point.name}{{{attrs}}}"
    unit = f" {point.unit}" if point.unit else ""
    if point.value_type == "histogram":
        return f"{head} {point.kind} count={point.count} sum={point.sum}{unit}"
    return f"{head} = {point.value!r}{unit} ({point.kind})"


def _render_json(point: ReceivedPoint) -> str:
    """Render a point as one line of strict JSON, :meth:`ReceivedPoint.as_dict` (``"json"``)."""
    return json.dumps(point.as_dict(), allow_nan=False)


_RENDERERS: dict[str, Callable[[ReceivedPoint], str]] = {"text": _render, "json": _render_json}


def _url_host(host: str) -> str:
    """Return the address a client should dial for a server bound to ``host``, URL-ready."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _bind_host(host: str) -> str:
    """Return ``host`` formatted for a ``host:port`` bind address."""
    return f"[{host}]" if ":" in host else host


class _HttpServer(http.server.ThreadingHTTPServer):
    """ThreadingHTTPServer with named, tracked handler threads that close() can unblock."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], sink: OtlpSink) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.sink = sink
        self._conn_lock = threading.Lock()
        self._connections: dict[threading.Thread, socket.socket] = {}
        self._thread_ids = itertools.count(1)
        super().__init__(address, _HttpHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve each connection in its own named daemon thread."""
        name = f"{self.sink.thread_prefix}-http-{next(self._thread_ids)}"
        thread = threading.Thread(
            target=self._serve_connection, args=(request, client_address), name=name, daemon=True
        )
        with self._conn_lock:
            self._connections[thread] = request
        thread.start()

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._conn_lock:
                self._connections.pop(threading.current_thread(), None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Log connection errors (e.g. a client that hung up) at debug level instead of stderr."""
        _logger.debug("sink http connection from %s failed: %r", client_address, sys.exc_info()[1])

    def abort_connections(self) -> list[threading.Thread]:
        """Shut down every open client connection; returns the threads still serving them."""
        with self._conn_lock:
            items = list(self._connections.items())
        for _, conn in items:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        return [thread for thread, _ in items]


class _HttpHandler(http.server.BaseHTTPRequestHandler):
    """Handles ``POST /v1/metrics`` with a protobuf ``ExportMetricsServiceRequest`` body."""

    server: _HttpServer
    protocol_version = "HTTP/1.1"
    timeout = _HTTP_IDLE_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        """Route the per-request log line to the module logger at debug level."""
        if _logger.isEnabledFor(logging.DEBUG):
            _logger.debug("sink http %s - %s", self.address_string(), format % args)

    def _reply(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        retry_after = self.server.sink._fail_retry_after
        if status >= 400 and retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.send_header("Content-Type", _PROTOBUF_CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _read_body(self) -> bytes | None:
        """Read the request body; answers the error itself and returns None when it cannot."""
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            self.close_connection = True
            self._reply(411)
            return None
        try:
            length = int(length_header)
        except ValueError:
            length = -1
        if length < 0 or length > _MAX_BODY_BYTES:
            self.close_connection = True
            self._reply(413 if length > 0 else 400)
            return None
        return self.rfile.read(length)

    def do_GET(self) -> None:
        """Answer 405 on the metrics path and 404 elsewhere."""
        self.close_connection = True
        self._reply(405 if urlsplit(self.path).path == _METRICS_PATH else 404)

    def do_POST(self) -> None:
        """Receive one OTLP/HTTP metrics export."""
        body = self._read_body()
        if body is None:
            return
        if urlsplit(self.path).path != _METRICS_PATH:
            self._reply(404)
            return
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type == "application/json":
            self._reply(415)
            return
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower() or "identity"
        wire_bytes = len(body)
        try:
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            elif encoding != "identity":
                self._reply(415)
                return
            request = ExportMetricsServiceRequest.FromString(body)
        except (OSError, EOFError, zlib.error, DecodeError):
            _logger.debug("sink http: undecodable request body", exc_info=True)
            self._reply(400)
            return
        status = self.server.sink._handle_export("http", request, wire_bytes, encoding)
        if status is None:
            self._reply(200, ExportMetricsServiceResponse().SerializeToString())
        else:
            self._reply(status)


class _MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    """gRPC ``MetricsService`` implementation that forwards to the sink."""

    def __init__(self, sink: OtlpSink) -> None:
        self._sink = sink

    def Export(
        self, request: ExportMetricsServiceRequest, context: Any
    ) -> ExportMetricsServiceResponse:
        """Receive one OTLP/gRPC metrics export.

        Its size is the serialized message's (``ByteSize()``): what gRPC handed over after
        any decompression, so gRPC-level compression is not visible here.
        """
        status = self._sink._handle_export("grpc", request, request.ByteSize(), "identity")
        if status is not None:
            code = _GRPC_CODES.get(status, grpc.StatusCode.UNAVAILABLE)
            context.abort(code, f"sink failing with HTTP status {status}")
        return ExportMetricsServiceResponse()


_GRPC_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.UNIMPLEMENTED,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
"""The gRPC status a failing sink answers for each HTTP status (the OTLP specification's pairs;
any other: UNAVAILABLE)."""


class OtlpSink:
    """An OTLP metrics receiver listening on gRPC and HTTP at once, storing what it receives.

    Received data points are flattened into :class:`ReceivedPoint` records, kept in a bounded
    buffer and queryable from any thread. The sink can also misbehave on demand: ``stall()``
    makes exports hang, ``fail()`` makes them fail.

    Attributes:
        thread_prefix: Name prefix of every thread this sink creates (starts with
            ``"async-tee-sink"``); all of them are joined by :meth:`close`.

    Example:
        >>> with OtlpSink() as sink:  # doctest: +SKIP
        ...     exporter = OTLPMetricExporter(endpoint=sink.grpc_endpoint, insecure=True)
        ...     sink.wait_for(lambda s: "loss" in s.names(), timeout_s=5)
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        grpc_port: int = 0,
        http_port: int = 0,
        *,
        max_points: int = 200_000,
        echo: Callable[[str], None] | None = None,
        echo_format: Literal["text", "json"] = "text",
    ) -> None:
        """Configure the sink; nothing is bound until :meth:`start`.

        Args:
            host: Address both servers bind to. Defaults to loopback; any address is allowed.
            grpc_port: TCP port for OTLP/gRPC; 0 picks an ephemeral port.
            http_port: TCP port for OTLP/HTTP; 0 picks an ephemeral port.
            max_points: Maximum number of points kept; older points are dropped first.
            echo: Called with a one-line rendering of every received point, if given.
            echo_format: ``"text"``: the line a person reads, sender first (``[grpc
                job-7/rank-3] rl.reward.mean{} = 0.5 (gauge)``); ``"json"``: one JSON object
                (:meth:`ReceivedPoint.as_dict`), a line of JSON Lines.

        Raises:
            ValueError: If ``max_points`` is smaller than 1 or ``echo_format`` is unknown.
        """
        if max_points < 1:
            raise ValueError(f"max_points must be >= 1, got {max_points}")
        if echo_format not in _RENDERERS:
            raise ValueError(f"echo_format must be 'text' or 'json', got {echo_format!r}")
        self._host = host
        self._grpc_port_requested = grpc_port
        self._http_port_requested = http_port
        self._echo = echo
        self._render = _RENDERERS[echo_format]
        self.thread_prefix = f"{_THREAD_PREFIX}-{next(_SINK_IDS)}"

        self._cond = threading.Condition(threading.RLock())
        self._points: deque[ReceivedPoint] = deque(maxlen=max_points)
        self._dropped = 0
        self._requests = {"grpc": 0, "http": 0}
        self._sizes: deque[tuple[str, int, str]] = deque(maxlen=_MAX_REQUEST_SIZES)
        self._release = threading.Event()
        self._release.set()
        self._fail_status: int | None = None
        self._fail_retry_after: str | None = None
        self._started = False
        self._closed = False

        self._grpc_port = 0
        self._http_port = 0
        self._grpc_server: Any = None
        self._grpc_executor: futures.ThreadPoolExecutor | None = None
        self._http_server: _HttpServer | None = None
        self._http_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> OtlpSink:
        """Bind and start both servers; calling it again on a running sink is a no-op.

        Returns:
            The sink itself, for chaining.

        Raises:
            RuntimeError: If the sink was already closed or gRPC cannot bind its port.
            OSError: If the HTTP port cannot be bound.
        """
        with self._cond:
            if self._closed:
                raise RuntimeError("OtlpSink cannot be restarted after close()")
            if self._started:
                return self
            self._started = True
        try:
            self._start_http()
            self._start_grpc()
        except BaseException:
            self.close()
            raise
        _logger.debug(
            "OTLP sink listening: grpc=%s http=%s", self.grpc_endpoint, self.http_endpoint
        )
        return self

    def _start_http(self) -> None:
        server = _HttpServer((self._host, self._http_port_requested), self)
        self._http_server = server
        self._http_port = int(server.server_address[1])
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"{self.thread_prefix}-http",
            daemon=True,
        )
        thread.start()
        self._http_thread = thread

    def _start_grpc(self) -> None:
        self._grpc_executor = futures.ThreadPoolExecutor(
            max_workers=_GRPC_WORKERS, thread_name_prefix=f"{self.thread_prefix}-grpc"
        )
        server = grpc.server(
            self._grpc_executor,
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", _MAX_BODY_BYTES),
            ],
        )
        self._grpc_server = server
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _MetricsServicer(self), server
        )
        address = f"{_bind_host(self._host)}:{self._grpc_port_requested}"
        port = int(server.add_insecure_port(address))
        if port == 0:
            raise RuntimeError(f"gRPC server could not bind {address}")
        self._grpc_port = port
        server.start()

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop both servers and their threads, releasing any stalled export first.

        Idempotent and safe to call on a sink that never started. Returns within roughly
        ``timeout_s`` even if a client keeps a connection open.

        Args:
            timeout_s: Upper bound, in seconds, for the whole shutdown.
        """
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._release.set()
            self._cond.notify_all()

        if self._grpc_server is not None:
            stopped = self._grpc_server.stop(grace=max(timeout_s, 0.0) / 4)
            if not stopped.wait(max(deadline - time.monotonic(), 0.0)):
                _logger.warning("OTLP sink: gRPC server did not stop within %.1fs", timeout_s)
        if self._grpc_executor is not None:
            self._grpc_executor.shutdown(wait=False, cancel_futures=True)

        busy: list[threading.Thread] = []
        if self._http_server is not None:
            if self._http_thread is not None:
                self._http_server.shutdown()
            self._http_server.server_close()
            busy = self._http_server.abort_connections()

        threads = [*busy, *self._own_threads()]
        for thread in threads:
            if thread is threading.current_thread():
                continue
            thread.join(max(deadline - time.monotonic(), 0.0))
        leftovers = [thread.name for thread in threads if thread.is_alive()]
        if leftovers:
            _logger.warning("OTLP sink: threads still running after close(): %s", leftovers)

    def _own_threads(self) -> list[threading.Thread]:
        prefix = f"{self.thread_prefix}-"
        return [thread for thread in threading.enumerate() if thread.name.startswith(prefix)]

    def __enter__(self) -> OtlpSink:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ addresses

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("OtlpSink is not started; call start() first")

    @property
    def grpc_port(self) -> int:
        """TCP port the gRPC server is bound to.

        Raises:
            RuntimeError: If the sink has not been started.
        """
        self._require_started()
        return self._grpc_port

    @property
    def http_port(self) -> int:
        """TCP port the HTTP server is bound to.

        Raises:
            RuntimeError: If the sink has not been started.
        """
        self._require_started()
        return self._http_port

    @property
    def grpc_endpoint(self) -> str:
        """Endpoint for the OTLP gRPC exporter, e.g. ``http://127.0.0.1:4317``."""
        return f"http://{_url_host(self._host)}:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """Base URL for OTLP/HTTP, without the ``/v1/metrics`` signal path."""
        return f"http://{_url_host(self._host)}:{self.http_port}"

    # ------------------------------------------------------------------ misbehaviour

    def stall(self) -> None:
        """Make every subsequent export (both protocols) hang until unstall() or close().

        A stalled handler gives up by itself after 600 s so nothing hangs forever.
        """
        self._release.clear()

    def unstall(self) -> None:
        """Release stalled exports and stop stalling new ones."""
        self._release.set()

    def fail(self, status: int | None, retry_after: str | None = None) -> None:
        """Make exports fail until ``fail(None)``.

        HTTP answers ``status`` (with a ``Retry-After: <retry_after>`` header if given);
        gRPC aborts with the matching code (``_GRPC_CODES``: 400 INVALID_ARGUMENT, 401
        UNAUTHENTICATED, 429 RESOURCE_EXHAUSTED, ...; UNAVAILABLE for the rest).

        Args:
            status: HTTP status code in the 4xx/5xx range, or None to answer normally again.
            retry_after: The ``Retry-After`` value HTTP answers carry, or None for none.

        Raises:
            ValueError: If ``status`` is not an HTTP error status.
        """
        if status is not None and not 400 <= status <= 599:
            raise ValueError(f"status must be a 4xx/5xx HTTP status, got {status}")
        with self._cond:
            self._fail_status = status
            self._fail_retry_after = None if status is None else retry_after

    def _handle_export(
        self, protocol: str, request: ExportMetricsServiceRequest, size: int, encoding: str
    ) -> int | None:
        """Account for, possibly stall, and store one export request.

        Args:
            protocol: ``"grpc"`` or ``"http"``.
            request: The decoded request.
            size: Its size in bytes as received (see :meth:`request_sizes`).
            encoding: The encoding of those bytes (``"identity"``, ``"gzip"``, ...).

        Returns:
            None on success, else the HTTP status to answer with.
        """
        with self._cond:
            self._requests[protocol] += 1
            self._sizes.append((protocol, size, encoding))
            self._cond.notify_all()
        if not self._release.is_set():
            self._release.wait(_MAX_STALL_S)
        with self._cond:
            if self._closed:
                return 503
            if self._fail_status is not None:
                return self._fail_status

        received = received_points(request, protocol)

        with self._cond:
            capacity = self._points.maxlen
            for point in received:
                if len(self._points) == capacity:
                    self._dropped += 1
                self._points.append(point)
            self._cond.notify_all()

        if self._echo is not None:
            for point in received:
                try:
                    self._echo(self._render(point))
                except Exception:
                    _logger.warning("OTLP sink: echo callback failed", exc_info=True)
        return None

    # ------------------------------------------------------------------ queries

    @property
    def dropped_points(self) -> int:
        """Number of points evicted because more than ``max_points`` arrived."""
        with self._cond:
            return self._dropped

    @property
    def requests(self) -> dict[str, int]:
        """Export requests received per protocol, including stalled and failed ones."""
        with self._cond:
            return dict(self._requests)

    def request_sizes(self) -> list[tuple[str, int, str]]:
        """``(protocol, bytes, encoding)`` of each export request received, oldest first.

        Every request counted in :attr:`requests` (stalled and failed ones too), the newest
        100,000 kept. HTTP: the body's length as received, before decompression, and its
        ``Content-Encoding`` (``"identity"`` when none). gRPC: the serialized message's size
        (``ByteSize()``) and ``"identity"``: gRPC decompresses before the servicer sees the
        message, so gRPC-level compression is not visible here. Neither counts headers or
        framing.
        """
        with self._cond:
            return list(self._sizes)

    def points(self) -> list[ReceivedPoint]:
        """Return a copy of the stored points, oldest first."""
        with self._cond:
            return list(self._points)

    def latest(self) -> dict[tuple[str, frozenset[tuple[str, Any]]], ReceivedPoint]:
        """Return the most recently received point per (metric name, attribute set).

        Unhashable attribute values in the key are converted: lists to tuples and dicts to
        sorted tuples of ``(key, value)`` pairs.
        """
        result: dict[tuple[str, frozenset[tuple[str, Any]]], ReceivedPoint] = {}
        for point in self.points():
            attrs = frozenset((key, _hashable(value)) for key, value in point.attributes.items())
            result[(point.name, attrs)] = point
        return result

    def by_step(
        self, name: str, attributes: Mapping[str, Any] | None = None, step_series: str = "rl.step"
    ) -> list[tuple[Any, float | int | None]]:
        """``(step, value)`` of every export that carried ``name``, in arrival order.

        The step is the ``step_series`` point of the same export (same resource, same
        collection time), or None when that export had none: what a backend that keeps
        every point stores for the series, one row per export.
        """
        wanted = dict(attributes or {})
        steps: dict[tuple[Any, int], Any] = {}
        rows: list[tuple[tuple[Any, int], float | int | None]] = []
        for point in self.points():
            export = (_hashable(point.resource), point.time_unix_nano)
            if point.name == step_series and not point.attributes:
                steps[export] = point.value
            elif point.name == name and point.attributes == wanted:
                rows.append((export, point.value))
        return [(steps.get(export), value) for export, value in rows]

    def names(self) -> set[str]:
        """Return the set of metric names among the stored points."""
        with self._cond:
            return {point.name for point in self._points}

    def clear(self) -> None:
        """Forget all stored points and request sizes; reset the dropped and request counters."""
        with self._cond:
            self._points.clear()
            self._sizes.clear()
            self._dropped = 0
            self._requests = {"grpc": 0, "http": 0}
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[OtlpSink], bool], timeout_s: float) -> bool:
        """Block until ``predicate(sink)`` holds, re-checking whenever a request arrives.

        The predicate runs with the sink's (reentrant) lock held, so it may call the query
        methods but should be quick. Returns early once the sink is closed.

        Args:
            predicate: Condition on the sink to wait for.
            timeout_s: Maximum time to wait, in seconds.

        Returns:
            Whether the predicate was true before the timeout expired.
        """
        with self._cond:
            return self._cond.wait_for(
                lambda: predicate(self) or self._closed, timeout=timeout_s
            ) and predicate(self)


def black_hole(host: str = "127.0.0.1") -> tuple[socket.socket, int]:
    """Open a listening TCP socket that never accepts, simulating an unreachable collector.

    The socket listens with a backlog of 0 and nobody ever calls ``accept()``: the kernel
    completes (or queues) the first handshakes, then requests sent to it are never read or
    answered, so an exporter pointed at it hangs until its own timeout. Everything stays on
    loopback by default.

    Args:
        host: Address to bind; loopback by default.

    Returns:
        The socket (the caller must close it) and its port.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(0)
    except BaseException:
        sock.close()
        raise
    return sock, int(sock.getsockname()[1])

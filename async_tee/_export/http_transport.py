"""OTLP/HTTP: one kept-alive ``http.client`` connection, abortable (docs/semantics.md §7)."""

from __future__ import annotations

import base64
import contextlib
import errno
import gzip
import http.client
import os
import select
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from async_tee._export.transport import (
    ABORTED,
    DELIVERED,
    RETRYABLE_HTTP,
    Answer,
    partial,
    retry_after_s,
)
from async_tee._settings import Settings, redact_url
from async_tee._version import __version__

ABORT_SLICE_S = 0.05
"""How often a connect in progress looks whether the send was aborted."""
_CONNECTING = (errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK, errno.EINTR)

_COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
}
_TLS_ERRORS = (ssl.SSLError, ssl.CertificateError)


def tls_context(settings: Settings) -> ssl.SSLContext:
    """The TLS context of an ``https`` endpoint: the certificate variables, or the system's."""
    context = ssl.create_default_context(cafile=settings.otlp_certificate or None)
    if settings.otlp_client_certificate:
        context.load_cert_chain(settings.otlp_client_certificate, settings.otlp_client_key or None)
    return context


def _basic_auth(userinfo: str) -> str:
    user, _, password = userinfo.partition(":")
    token = f"{unquote(user)}:{unquote(password)}".encode()
    return "Basic " + base64.b64encode(token).decode("ascii")


class HttpTransport:
    """Posts each request to the endpoint over one kept-alive connection.

    A proxy (``HTTP(S)_PROXY`` applying to the endpoint, ``Settings.otlp_proxy``) is reached
    as the standard library does: an ``http`` endpoint's requests go to the proxy with the
    full URL, an ``https`` one is tunnelled (``CONNECT``).
    """

    def __init__(self, settings: Settings) -> None:
        """Parse the endpoint and prepare headers and TLS once; connect on the first send.

        Raises:
            ValueError: The endpoint's URL cannot be parsed.
            OSError: A certificate file cannot be read.
            ssl.SSLError: A certificate file is not one.
        """
        url = urlsplit(settings.otlp_endpoint)
        self.where = redact_url(settings.otlp_endpoint)
        self._tls = url.scheme == "https"
        self._host, self._port = url.hostname or "", url.port
        self._path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self._context = tls_context(settings) if self._tls else None
        headers = {
            "Content-Type": "application/x-protobuf",
            "User-Agent": f"async_tee/{__version__}",
        }
        userinfo = url.netloc.rpartition("@")[0]
        if userinfo:
            headers["Authorization"] = _basic_auth(userinfo)
        headers.update(dict(settings.otlp_headers))  # the user's win, authorization too
        self._compress = _COMPRESS.get(settings.otlp_compression)
        if self._compress is not None:
            headers["Content-Encoding"] = settings.otlp_compression
        self._proxy = urlsplit(settings.otlp_proxy) if settings.otlp_proxy else None
        self._proxy_headers: dict[str, str] = {}
        if self._proxy is not None:
            proxy_userinfo = self._proxy.netloc.rpartition("@")[0]
            if proxy_userinfo:
                self._proxy_headers["Proxy-Authorization"] = _basic_auth(proxy_userinfo)
            if not self._tls:  # a plain request through the proxy names the whole URL
                netloc = url.netloc.rpartition("@")[2]
                self._path = f"{url.scheme}://{netloc}{self._path}"
                headers.update(self._proxy_headers)
        self._headers: Mapping[str, str] = headers
        self._connection: http.client.HTTPConnection | None = None
        self._opening: socket.socket | None = None  # a socket still connecting
        self._lock = threading.Lock()  # one send at a time; abort takes the socket without it
        self.aborted = False

    def _connect(self, timeout_s: float) -> http.client.HTTPConnection:
        connection = self._connection
        if connection is not None:
            if connection.sock is not None:
                connection.sock.settimeout(timeout_s)
            connection.timeout = timeout_s
            return connection
        proxy = self._proxy
        host, port = (self._host, self._port) if proxy is None else (proxy.hostname, proxy.port)
        if self._tls:
            connection = http.client.HTTPSConnection(
                host or "", port, timeout=timeout_s, context=self._context
            )
            if proxy is not None:
                connection.set_tunnel(self._host, self._port, headers=self._proxy_headers)
        else:
            connection = http.client.HTTPConnection(host or "", port, timeout=timeout_s)
        # The connection's socket is made here, where abort() can see it before it connects:
        # a connect to a receiver that never completes the handshake ends with abort().
        connection._create_connection = self._open  # type: ignore[attr-defined]
        self._connection = connection
        return connection

    def _open(
        self,
        address: tuple[str, int],
        timeout: float | None = None,
        source_address: tuple[str, int] | None = None,
    ) -> socket.socket:
        """``socket.create_connection``, with each socket visible to abort() as it connects."""
        host, port = address
        error: OSError = OSError(f"no address found for {host!r}")
        for family, kind, proto, _, where in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            self._opening = sock
            try:
                if source_address is not None:
                    sock.bind(source_address)
                self._connect_socket(sock, where, timeout)
                sock.settimeout(timeout)
            except OSError as exc:
                sock.close()
                error = exc
                if self.aborted:
                    break
                continue
            finally:
                self._opening = None
            return sock
        raise error

    def _connect_socket(self, sock: socket.socket, where: Any, timeout: float | None) -> None:
        """Connect ``sock`` within ``timeout``, looking at ``aborted`` every ``ABORT_SLICE_S``.

        A socket shut down before its ``connect()`` began would still connect (Linux ignores
        the shutdown of an unconnected socket), so abort() could miss a send that was about to
        connect: the connect is waited for in slices instead, each ending on ``aborted``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        sock.setblocking(False)
        code = sock.connect_ex(where)
        while code in _CONNECTING:
            if self.aborted:
                raise ConnectionAbortedError("the send was aborted")
            left = ABORT_SLICE_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            _, writable, failed = select.select([], [sock], [sock], min(left, ABORT_SLICE_S))
            if writable or failed:
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if self.aborted:
            raise ConnectionAbortedError("the send was aborted")
        if code:
            raise OSError(code, os.strerror(code))

    def send(self, data: bytes, timeout_s: float) -> Answer:
        """Post ``data``; the answer as the OTLP specification classes it. Never raises."""
        if self.aborted:
            return ABORTED
        if self._compress is not None:
            data = self._compress(data)
        with self._lock:
            try:
                connection = self._connect(max(timeout_s, 0.001))
                connection.request("POST", self._path, body=data, headers=dict(self._headers))
                response = connection.getresponse()
                body = response.read()
            except Exception as exc:  # noqa: BLE001 - every failure is an answer
                self._drop_connection()
                return self._failed(exc)
            if response.will_close:
                self._drop_connection()
        return _answer(response, body)

    def _failed(self, exc: Exception) -> Answer:
        error = f"{type(exc).__name__}: {exc}"
        if self.aborted:
            return ABORTED
        if isinstance(exc, _TLS_ERRORS):
            return Answer(False, reason="tls", error=error)
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return Answer(False, retry=True, reason="timeout", error=error)
        return Answer(False, retry=True, reason="connection", error=error)

    def _drop_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()

    def abort(self) -> None:
        """Shut the socket down, connecting or connected: a blocked send returns at once.

        Later sends fail at once too.
        """
        self.aborted = True
        for sock in (self._opening, getattr(self._connection, "sock", None)):
            if sock is not None:
                with contextlib.suppress(OSError):  # already closed
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the connection (after the last send)."""
        with self._lock:
            self._drop_connection()


def _answer(response: http.client.HTTPResponse, body: bytes) -> Answer:
    status = response.status
    if 200 <= status < 300:
        return _partial_success(body) if body else DELIVERED
    error = f"HTTP {status} {response.reason}"
    if status in RETRYABLE_HTTP:
        wait = retry_after_s(response.getheader("Retry-After"))
        return Answer(False, retry=True, reason=f"http_{status}", error=error, retry_after_s=wait)
    return Answer(False, reason=f"http_{status}", error=error)


def _partial_success(body: bytes) -> Answer:
    """A 2xx answer's body: an ``ExportMetricsServiceResponse``, maybe with rejected points."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceResponse,
    )

    try:
        response = ExportMetricsServiceResponse.FromString(body)
    except Exception:  # noqa: BLE001 - a body that is not one (a proxy's page) says nothing
        return DELIVERED
    return partial(response)

"""How OTLP/HTTP sends: abortable, pinned to its certificate, polite (docs/semantics.md §7)."""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import ssl
import threading
import time
import weakref
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import SplitResult, urlsplit
from urllib.request import getproxies, proxy_bypass

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from async_tee._export.reader import failure_reason
from async_tee._reporting import warn_once

MAX_RETRY_AFTER_S = 600.0
"""The longest ``Retry-After`` honoured: a collector asking for more is asked again then."""

_RETRY_STATUSES = (429, 503)


def _tracking_pools(opened: weakref.WeakSet[HTTPConnection]) -> dict[str, type]:
    """``urllib3`` pool classes whose connections record themselves in ``opened``."""

    class Tracked(HTTPConnection):
        def connect(self) -> None:
            opened.add(self)
            super().connect()

    class TrackedTLS(HTTPSConnection):
        def connect(self) -> None:
            opened.add(self)
            super().connect()

    class Pool(HTTPConnectionPool):
        ConnectionCls = Tracked

    class PoolTLS(HTTPSConnectionPool):
        ConnectionCls = TrackedTLS

    return {"http": Pool, "https": PoolTLS}


class _TrackingAdapter(HTTPAdapter):
    """An adapter whose pools record every connection they open (weakly)."""

    def __init__(self) -> None:
        self.connections: weakref.WeakSet[HTTPConnection] = weakref.WeakSet()
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _tracking_pools(self.connections)


class _Polite:
    """What both ways of sending keep: a ``Retry-After``, the last error, and abort."""

    def _start_polite(self) -> None:
        self.not_before = 0.0  # monotonic: no export before this (a Retry-After)
        self.last_error = ""  # the last failed request's status or exception, redactable
        self.aborted = False  # abort() ran: every request fails at once
        self._lock = threading.Lock()

    def _note_answer(self, status: int, reason: str | None, retry_after: str | None) -> None:
        """Remember a failed answer; a ``429``/``503`` with ``Retry-After`` sets ``not_before``."""
        if status < 400:
            self.last_error = ""
            return
        self.last_error = f"HTTP {status} {reason}"
        if status not in _RETRY_STATUSES:
            return
        wait = retry_after_s(retry_after)
        if wait is None:
            return
        with self._lock:
            self.not_before = max(self.not_before, time.monotonic() + wait)
        warn_once(
            "export:retry-after",
            "async_tee: the collector answered %d with Retry-After %.0f s: exports wait until "
            "then (the newest step goes first), and every later such answer is honoured",
            status,
            wait,
            traceback=False,
        )

    def _shut_down_sockets(self, connections: weakref.WeakSet[HTTPConnection]) -> None:
        self.aborted = True
        for connection in list(connections):
            sock = getattr(connection, "sock", None)
            if sock is None:
                continue
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)


class ExporterSession(requests.Session, _Polite):
    """The session the OTLP/HTTP exporter sends through (docs/semantics.md §7)."""

    def __init__(self) -> None:
        super().__init__()
        self._adapter = _TrackingAdapter()
        self.mount("http://", self._adapter)
        self.mount("https://", self._adapter)
        self._start_polite()
        self.hooks["response"].append(self._on_response)

    def merge_environment_settings(
        self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any
    ) -> dict[str, Any]:
        merged: dict[str, Any] = super().merge_environment_settings(
            url, proxies, stream, verify, cert
        )
        if verify is None and isinstance(self.verify, str):  # a certificate configured
            merged["verify"] = self.verify  # REQUESTS_CA_BUNDLE must not replace it
        return merged

    def request(self, method: Any, url: Any, *args: Any, **kwargs: Any) -> Any:
        if self.aborted:  # the exporter retries a connection error at once: not any more
            raise requests.exceptions.ConnectionError("the session was aborted at shutdown")
        try:
            return super().request(method, url, *args, **kwargs)
        except requests.exceptions.RequestException as exc:  # not the exporter's own misuse
            # (a retry with no time left keeps the reason before it)
            self.last_error = failure_reason(self.last_error, f"{type(exc).__name__}: {exc}")
            raise

    def _on_response(self, response: requests.Response, *_: Any, **__: Any) -> None:
        self._note_answer(
            response.status_code, response.reason, response.headers.get("Retry-After")
        )

    def abort(self) -> None:
        """Shut down every open connection's socket: a blocked request ends now. Never raises.

        Every request after it fails at once (the exporter would otherwise retry on a new
        connection, and block again).
        """
        # close() alone closes only idle connections, never the one a request holds
        self._shut_down_sockets(self._adapter.connections)
        try:
            self.close()
        except Exception:  # noqa: BLE001 - aborting must not raise at shutdown
            warn_once("export:abort", "async_tee: closing the OTLP/HTTP session failed")


def exporter_transport(endpoint: str) -> Any:
    """An :class:`ExporterTransport` for ``endpoint``, or None where a session must send.

    None when this SDK's exporter takes no transport, or a proxy variable applies to the
    endpoint (only ``requests`` reads them).
    """
    # Preferred to the session: it costs the exporting thread less CPU per export
    # (bench_export's http and http-requests cells).
    try:
        from opentelemetry.exporter.http.transport._base import (
            BaseHTTPResult,
            BaseHTTPTransport,
        )
    except ImportError:
        return None
    parts = urlsplit(endpoint)
    proxies = getproxies()
    if proxies.get(parts.scheme) and not proxy_bypass(parts.hostname or ""):
        return None
    verify, cert = _tls_from_environment()

    @dataclass(frozen=True, slots=True)
    class Result(BaseHTTPResult):
        """An answer: its body and headers (``http.client``'s, read case-insensitively)."""

        body: bytes = b""
        header_map: Any = field(default_factory=dict)

        def content(self) -> bytes:
            return self.body

        def headers(self) -> Any:
            return self.header_map

    class ExporterTransport(BaseHTTPTransport, _Polite):
        """One kept-alive ``http.client`` connection: abortable, polite (docs/semantics.md §7).

        The SDK's ``urllib3`` transport cost the exporting thread ~2.5x the CPU per request
        (a pool manager, URL parsing and a response wrapper on every export).
        """

        def __init__(self) -> None:
            self._connection: http.client.HTTPConnection | None = None
            self._context = _tls_context(verify, cert) if parts.scheme == "https" else None
            self._send_lock = threading.Lock()
            self._start_polite()

        def _connect(
            self, target: SplitResult, timeout: float | None
        ) -> http.client.HTTPConnection:
            connection = self._connection
            if connection is None:
                if target.scheme == "https":
                    connection = http.client.HTTPSConnection(
                        target.hostname or "", target.port, timeout=timeout, context=self._context
                    )
                else:
                    connection = http.client.HTTPConnection(
                        target.hostname or "", target.port, timeout=timeout
                    )
                self._connection = connection
            elif connection.sock is not None:
                connection.sock.settimeout(timeout)
            connection.timeout = timeout
            return connection

        def request(
            self,
            method: str,
            url: str,
            *,
            headers: dict[str, str] | None = None,
            timeout: float | None = None,
            data: bytes | None = None,
        ) -> Any:
            if self.aborted:  # the exporter retries a connection error at once: not any more
                return Result(error=ConnectionAbortedError("the transport was aborted"))
            if timeout is not None and timeout <= 0:  # a retry begun with no time left
                return Result(error=TimeoutError(_NO_TIME_LEFT))
            with self._send_lock:
                try:
                    target = urlsplit(url)
                    connection = self._connect(target, timeout)
                    path = target.path + (f"?{target.query}" if target.query else "")
                    connection.request(method, path or "/", body=data, headers=headers or {})
                    response = connection.getresponse()
                    body = response.read()
                except Exception as exc:  # noqa: BLE001 - reported as the SDK expects
                    self._close_connection()
                    self.last_error = failure_reason(
                        self.last_error, f"{type(exc).__name__}: {exc}"
                    )
                    return Result(error=exc)
                if response.will_close:
                    self._close_connection()
            self._note_answer(response.status, response.reason, response.getheader("Retry-After"))
            return Result(
                status_code=response.status,
                reason=response.reason,
                body=body,
                header_map=response.headers,
            )

        def _close_connection(self) -> None:
            connection, self._connection = self._connection, None
            if connection is not None:
                with contextlib.suppress(Exception):
                    connection.close()

        def is_connection_error(self, exception: Exception | None) -> bool:
            return isinstance(exception, (OSError, http.client.HTTPException)) and not (
                isinstance(exception, TimeoutError) and str(exception) == _NO_TIME_LEFT
            )

        def close(self) -> None:
            with self._send_lock:
                self._close_connection()

        def abort(self) -> None:
            """Shut the connection's socket down; every later request fails at once."""
            self.aborted = True
            connection = self._connection
            sock = getattr(connection, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):  # already closed
                    sock.shutdown(socket.SHUT_RDWR)

    return ExporterTransport()


_NO_TIME_LEFT = "the export's retry began with no time left"


def _tls_context(verify: bool | str, cert: str | tuple[str, str] | None) -> ssl.SSLContext:
    """The TLS context of an ``https`` endpoint: its certificate, or none to verify."""
    context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
    if verify is False:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if isinstance(cert, tuple):
        context.load_cert_chain(cert[0], cert[1])
    elif cert:
        context.load_cert_chain(cert)
    return context


def _tls_from_environment() -> tuple[bool | str, str | tuple[str, str] | None]:
    """The certificate and client certificate the SDK's exporter would read, in its order."""
    env = os.environ

    def first(*names: str) -> str | None:
        return next((env[name] for name in names if env.get(name)), None)

    verify = first("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE")
    key = first("OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY")
    client = first(
        "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"
    )
    cert = (client, key) if client and key else client
    return verify or True, cert


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

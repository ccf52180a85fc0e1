"""OTLP/HTTP as async_tee's transport sends it, for many senders at once: asyncio, kept alive.

One :class:`HttpClient` is one kept-alive HTTP/1.1 connection carrying one request at a time,
written as ``http.client`` writes async_tee's (``_export/http_transport``): the request line,
then Host, Accept-Encoding, Content-Length, Content-Type and User-Agent. Its answer is parsed
here (status, headers, a ``Content-Length`` body; a chunked answer is not read). A send with
no answer raises :class:`NoAnswer` with a bounded reason: ``connection`` (refused, reset, or
closed by the server, a kept-alive connection it timed out too), ``timeout`` or ``protocol``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping  # noqa: F401
from urllib.parse import urlsplit

from async_tee import __version__


class NoAnswer(Exception):
    """A send that ended without an HTTP answer: ``reason`` (connection, timeout, protocol)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class _Connection(asyncio.Protocol):
    """One kept-alive HTTP/1.1 connection carrying one request at a time; parses its answer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, dict[str, str], bytes]] | None = None
        self.closed = False
        self._head: tuple[int, dict[str, str], int, int] | None = None  # and the body's span

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        """Add to the answer; settle the waiter once it is whole."""
        self.buffer += data
        waiter = self.waiter
        if waiter is None or waiter.done():
            self.close()  # bytes no request asked for: the connection is not trusted again
            return
        try:
            answer = self._parse()
        except (ValueError, IndexError) as exc:
            self._fail(NoAnswer("protocol", str(exc)))
            return
        if answer is not None:
            waiter.set_result(answer)

    def _parse(self) -> tuple[int, dict[str, str], bytes] | None:
        if self._head is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return None
            lines = self.buffer[:end].decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if "chunked" in headers.get("transfer-encoding", ""):
                raise ValueError("a chunked answer (not parsed here)")
            length = int(headers.get("content-length", "0"))
            self._head = (status, headers, end + 4, end + 4 + length)
        status, headers, body_start, body_end = self._head
        if len(self.buffer) < body_end:
            return None
        body = bytes(self.buffer[body_start:body_end])
        del self.buffer[:body_end]
        self._head = None
        return status, headers, body

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail a request waiting on it."""
        self.closed = True
        self._fail(NoAnswer("connection", "closed by the server" if exc is None else str(exc)))

    def expire(self) -> None:
        """The answer did not come in time: fail the request, drop the connection."""
        self._fail(NoAnswer("timeout"))
        self.close()

    def _fail(self, error: NoAnswer) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def close(self) -> None:
        """Close it (an answer still awaited fails)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class HttpClient:
    """POSTs to one OTLP/HTTP endpoint over one kept-alive connection, as async_tee does.

    The request line and headers are what ``http.client`` writes for async_tee's transport
    (``_export/http_transport``): Host, Accept-Encoding, Content-Length, Content-Type,
    User-Agent.
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"an http:// endpoint is needed, not {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        path = parts.path if parts.path not in ("", "/") else "/v1/metrics"
        host = self.host if self.port == 80 else f"{self.host}:{self.port}"
        self._head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAccept-Encoding: identity\r\n"
            "Content-Length: {}\r\nContent-Type: application/x-protobuf\r\n"
            f"User-Agent: async_tee/{__version__}\r\n\r\n"
        )
        self._connection: _Connection | None = None
        self.connects = 0

    async def post(self, body: bytes, timeout_s: float) -> tuple[int, dict[str, str], bytes]:
        """Status, headers (lower-case names) and body of the answer.

        Raises:
            NoAnswer: No answer: the connection failed or closed, the time ran out, or the
                answer could not be read. The connection is dropped; the next post makes one.
        """
        loop = asyncio.get_running_loop()
        connection = self._connection
        if connection is None or connection.closed:
            connection = self._connection = await self._connect(loop, timeout_s)
        waiter = connection.waiter = loop.create_future()
        assert connection.transport is not None
        connection.transport.write(self._head.format(len(body)).encode("ascii") + body)
        timer = loop.call_later(timeout_s, connection.expire)
        try:
            answer = await waiter
        except BaseException:
            connection.close()
            self._connection = None
            raise
        finally:
            timer.cancel()
            connection.waiter = None
        if answer[1].get("connection", "").lower() == "close":
            connection.close()
            self._connection = None
        return answer

    async def _connect(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> _Connection:
        self.connects += 1
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(_Connection, self.host, self.port), timeout_s
            )
        except asyncio.TimeoutError as exc:
            raise NoAnswer("timeout", "connecting") from exc
        except OSError as exc:
            raise NoAnswer("connection", str(exc)) from exc
        return connection

    def close(self) -> None:
        """Close the connection."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

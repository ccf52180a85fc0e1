"""The OTLP transports against real receivers: each answer classed as the OTLP spec says.

Delivered, worth another send (refused or reset connection, timeout, HTTP 429/502/503/504, gRPC
UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED), or refused for good (HTTP 400/401/403/404,
gRPC INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED). The receiver is the real OTLP sink,
a TLS receiver with its own certificate, or a forwarding proxy, over sockets on 127.0.0.1.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from async_tee._export.grpc_transport import GrpcTransport
from async_tee._export.http_transport import HttpTransport
from async_tee._export.transport import MAX_RETRY_AFTER_S, Answer, Transport, retry_after_s
from async_tee._settings import Settings
from async_tee.config import load_settings
from async_tee.sink import OtlpSink, black_hole

_REQUEST = ExportMetricsServiceRequest()
_GAUGE = _REQUEST.resource_metrics.add().scope_metrics.add().metrics.add()
_GAUGE.name = "rl.step"
_POINT = _GAUGE.gauge.data_points.add()
_POINT.as_double, _POINT.time_unix_nano = 7.0, 1_700_000_000_000_000_000
DATA = _REQUEST.SerializeToString()


def _http(endpoint: str, **fields: Any) -> HttpTransport:
    return HttpTransport(dataclasses.replace(Settings(), otlp_endpoint=endpoint, **fields))


def _grpc(endpoint: str, **fields: Any) -> GrpcTransport:
    settings = Settings(otlp_protocol="grpc", otlp_endpoint=endpoint)
    return GrpcTransport(dataclasses.replace(settings, **fields))


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _transport(protocol: str, sink: OtlpSink, timeout_s: float = 2.0) -> Transport:
    if protocol == "grpc":
        return _grpc(sink.grpc_endpoint, otlp_timeout_s=timeout_s)
    return _http(f"{sink.http_endpoint}/v1/metrics", otlp_timeout_s=timeout_s)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        ("0", 0.0),
        ("-5", 0.0),
        ("1e9", MAX_RETRY_AFTER_S),
        ("soon", None),
        ("", None),
        (None, None),
        ("nan", None),
    ],
)
def test_retry_after_values(value, expected):
    assert retry_after_s(value) == expected


def test_retry_after_as_an_http_date():
    from email.utils import formatdate

    wait = retry_after_s(formatdate(time.time() + 60, usegmt=True))
    assert wait is not None
    assert 55 <= wait <= 61


def test_a_delivered_request_arrives_whole(sink, protocol):
    transport = _transport(protocol, sink)
    try:
        assert transport.send(DATA, 2.0) == Answer(True)
        assert transport.send(DATA, 2.0).delivered  # the kept-alive connection again
    finally:
        transport.close()
    points = [p for p in sink.points() if p.name == "rl.step"]
    assert [p.value for p in points] == [7.0, 7.0]
    assert sink.requests[protocol] == 2


# (status the sink answers, gRPC reason, retried?)
_FAILURES = [
    (503, "unavailable", True),
    (429, "resource_exhausted", True),
    (504, "deadline_exceeded", True),
    (502, "unavailable", True),
    (400, "invalid_argument", False),
    (401, "unauthenticated", False),
    (403, "permission_denied", False),
    (404, "unimplemented", False),
    (413, "invalid_argument", False),
]


@pytest.mark.parametrize(("status", "grpc_reason", "retried"), _FAILURES)
def test_each_failure_is_retried_or_final_as_the_otlp_spec_says(
    sink, protocol, status, grpc_reason, retried
):
    sink.fail(status)
    transport = _transport(protocol, sink)
    try:
        answer = transport.send(DATA, 2.0)
    finally:
        transport.close()
    assert not answer.delivered
    assert answer.retry is retried
    assert answer.reason == (f"http_{status}" if protocol == "http" else grpc_reason)
    assert str(status) in answer.error or grpc_reason.upper() in answer.error


def test_retry_after_comes_with_the_answer(sink):
    sink.fail(503, retry_after="7")
    transport = _http(f"{sink.http_endpoint}/v1/metrics")
    try:
        answer = transport.send(DATA, 2.0)
    finally:
        transport.close()
    assert (answer.retry, answer.retry_after_s) == (True, 7.0)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_refused_connection_is_worth_another_send(protocol):
    port = _free_port()  # nobody listens
    if protocol == "grpc":
        transport: Transport = _grpc(f"http://127.0.0.1:{port}")
    else:
        transport = _http(f"http://127.0.0.1:{port}/v1/metrics")
    try:
        answer = transport.send(DATA, 2.0)
    finally:
        transport.close()
    assert not answer.delivered
    assert answer.retry
    assert answer.reason in ("connection", "unavailable")


def test_a_receiver_that_never_answers_times_out_and_is_tried_again(protocol):
    hole, port = black_hole()
    with hole:
        endpoint = f"http://127.0.0.1:{port}"
        if protocol == "grpc":
            transport: Transport = _grpc(endpoint)
        else:
            transport = _http(f"{endpoint}/v1/metrics")
        started = time.monotonic()
        try:
            answer = transport.send(DATA, 0.3)
        finally:
            transport.close()
    assert answer.retry
    assert answer.reason in ("timeout", "deadline_exceeded", "unavailable")
    assert time.monotonic() - started < 5.0  # bounded by the timeout, not by the receiver


def test_abort_ends_a_send_blocked_on_a_stalled_receiver_and_every_later_one(sink, protocol):
    sink.stall()
    transport = _transport(protocol, sink, timeout_s=30.0)
    answers: list[Answer] = []
    sender = threading.Thread(target=lambda: answers.append(transport.send(DATA, 30.0)))
    sender.start()
    assert sink.wait_for(lambda s: s.requests[protocol] >= 1, 10)
    transport.abort()
    sender.join(5.0)
    sink.unstall()
    assert not sender.is_alive()
    assert [(a.delivered, a.retry, a.reason) for a in answers] == [(False, False, "aborted")]
    assert transport.send(DATA, 2.0).reason == "aborted"  # at once, nothing sent
    assert sink.requests[protocol] == 1


def test_abort_ends_a_send_still_connecting_to_a_receiver_that_never_takes_the_handshake():
    """A listener whose backlog is full never completes a handshake: the send is in connect,
    where a socket the transport had not kept would be out of abort()'s reach (the shutdown's
    deadline then waited for the send's own timeout)."""
    hole, port = black_hole()
    fillers = []
    with hole:
        for _ in range(8):  # fill the backlog of 0: the next handshake is never completed
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        transport = _http(f"http://127.0.0.1:{port}/v1/metrics", otlp_timeout_s=30.0)
        answers: list[Answer] = []
        sender = threading.Thread(target=lambda: answers.append(transport.send(DATA, 30.0)))
        started = time.monotonic()
        sender.start()
        try:
            deadline = time.monotonic() + 10
            while transport._opening is None and time.monotonic() < deadline:
                time.sleep(0.01)  # until the transport is inside connect()
            assert transport._opening is not None, "the send never began connecting"
            transport.abort()
            sender.join(5.0)
        finally:
            for filler in fillers:
                filler.close()
            transport.close()
    assert not sender.is_alive()
    assert time.monotonic() - started < 5.0  # not the send's 30 s
    assert [(a.delivered, a.retry, a.reason) for a in answers] == [(False, False, "aborted")]


class _Recorder(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver keeping each request's headers (and, as a proxy, forwarding)."""

    seen: list[tuple[str, dict[str, str], bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((self.path, dict(self.headers.items()), body))
        reply = ExportMetricsServiceResponse()
        reply.partial_success.rejected_data_points = 2
        reply.partial_success.error_message = "two points too old"
        data = reply.SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[int, list[tuple[str, dict[str, str], bytes]]]]:
    seen: list[tuple[str, dict[str, str], bytes]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="test-recorder", daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_http_sends_headers_credentials_compression_and_reads_partial_success(recorder):
    import gzip

    port, seen = recorder
    settings = load_settings(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://al%20ice:s3cr%3At@127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-scope-orgid=team-rl",
            "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        }
    )
    transport = HttpTransport(settings)
    try:
        answer = transport.send(DATA, 2.0)
    finally:
        transport.close()
    assert answer == Answer(True, rejected_points=2, rejected_message="two points too old")
    ((path, headers, body),) = seen
    assert path == "/v1/metrics"
    assert headers["Content-Type"] == "application/x-protobuf"
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body) == DATA
    assert headers["x-scope-orgid"] == "team-rl"
    token = headers["Authorization"].removeprefix("Basic ")
    assert base64.b64decode(token).decode() == "al ice:s3cr:t"
    assert transport.where == f"http://***@127.0.0.1:{port}/v1/metrics"


class _ForwardingProxy(http.server.BaseHTTPRequestHandler):
    """A plain HTTP forward proxy: a POST to an absolute URL is made to that URL."""

    forwarded: list[tuple[str, str | None]]

    def do_POST(self) -> None:
        from urllib.parse import urlsplit

        target = urlsplit(self.path)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.forwarded.append((self.path, self.headers.get("Proxy-Authorization")))
        upstream = http.client.HTTPConnection(target.hostname or "", target.port, timeout=5)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "proxy-authorization"}
        upstream.request("POST", target.path, body=body, headers=headers)
        response = upstream.getresponse()
        data = response.read()
        upstream.close()
        self.send_response(response.status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


def test_a_proxy_that_applies_carries_the_request(sink):
    forwarded: list[tuple[str, str | None]] = []
    handler = type("Proxy", (_ForwardingProxy,), {"forwarded": forwarded})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="test-proxy", daemon=True)
    thread.start()
    proxy = f"http://user:pw@127.0.0.1:{server.server_address[1]}"
    try:
        settings = load_settings(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint, "http_proxy": proxy}
        )
        assert settings.otlp_proxy == proxy
        assert "pw" not in settings.describe()
        transport = HttpTransport(settings)
        try:
            assert transport.send(DATA, 2.0).delivered
        finally:
            transport.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    ((url, authorization),) = forwarded
    assert url == f"{sink.http_endpoint}/v1/metrics"
    assert base64.b64decode(str(authorization).removeprefix("Basic ")) == b"user:pw"
    assert [p.value for p in sink.points() if p.name == "rl.step"] == [7.0]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, ""),
        ({"HTTP_PROXY": "proxy:3128"}, "http://proxy:3128"),
        ({"http_proxy": "http://a:1", "HTTP_PROXY": "http://b:2"}, "http://a:1"),
        ({"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "collector"}, ""),
        ({"HTTP_PROXY": "http://proxy:3128", "no_proxy": ".example.org,collector"}, ""),
        ({"HTTPS_PROXY": "http://proxy:3128"}, ""),  # an http:// endpoint: not its scheme
        ({"HTTP_PROXY": "http://proxy:3128", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, ""),
    ],
)
def test_which_proxy_applies(environ, expected):
    settings = load_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", **environ})
    assert settings.otlp_proxy == expected


@pytest.fixture
def tls_receiver(tmp_path):
    """A real OTLP/HTTP receiver behind TLS, with a certificate of its own (openssl)."""
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make the receiver's certificate")
    cert, key = tmp_path / "collector.pem", tmp_path / "collector.key"
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    command += ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
    command += ["-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(command, check=True, capture_output=True)
    seen: list[tuple[str, dict[str, str], bytes]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="tls-receiver", daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert, seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_tls_uses_the_configured_certificate_and_refuses_an_unknown_one(tls_receiver):
    endpoint, cert, seen = tls_receiver
    trusted = HttpTransport(
        load_settings(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_EXPORTER_OTLP_CERTIFICATE": str(cert),
                "REQUESTS_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt",  # not read
            }
        )
    )
    unknown = HttpTransport(load_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}))
    try:
        assert trusted.send(DATA, 2.0).delivered
        refused = unknown.send(DATA, 2.0)
    finally:
        trusted.close()
        unknown.close()
    assert (refused.delivered, refused.retry, refused.reason) == (False, False, "tls")
    assert "CERTIFICATE_VERIFY_FAILED" in refused.error
    assert len(seen) == 1

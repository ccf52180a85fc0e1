"""The OTLP/HTTP exporter's session: its certificate survives REQUESTS_CA_BUNDLE.

``requests`` itself merges the environment into every request (``Session.request`` calls
``merge_environment_settings``): these tests run that real code path.
"""

from __future__ import annotations

import pytest
import requests

from async_tee._export.http_session import (
    MAX_RETRY_AFTER_S,
    ExporterSession,
    exporter_transport,
    retry_after_s,
)


def _verify_for(session: requests.Session) -> object:
    return session.merge_environment_settings(
        "https://collector:4318/v1/metrics", {}, None, None, None
    )["verify"]


def test_a_configured_certificate_is_not_replaced_by_requests_ca_bundle(monkeypatch, tmp_path):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    plain, ours = requests.Session(), ExporterSession()
    for session in (plain, ours):
        session.verify = str(tmp_path / "collector-ca.pem")  # what the exporter sets
    assert _verify_for(plain) == "/etc/ssl/certs/ca-certificates.crt"  # requests' own rule
    assert _verify_for(ours) == str(tmp_path / "collector-ca.pem")
    ours.verify = True  # no certificate configured: the environment's bundle applies
    assert _verify_for(ours) == "/etc/ssl/certs/ca-certificates.crt"


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
    import time
    from email.utils import formatdate

    wait = retry_after_s(formatdate(time.time() + 60, usegmt=True))
    assert wait is not None
    assert 55 <= wait <= 61


@pytest.fixture
def tls_receiver(tmp_path):
    """A real OTLP/HTTP receiver behind TLS, with a certificate of its own (openssl)."""
    import http.server
    import shutil
    import ssl
    import subprocess
    import threading

    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
        ExportMetricsServiceResponse,
    )

    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make the receiver's certificate")
    cert, key = tmp_path / "collector.pem", tmp_path / "collector.key"
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    command += ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
    command += ["-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        command,
        check=True,
        capture_output=True,
    )
    received: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportMetricsServiceRequest.FromString(body)
            received.append(len(request.resource_metrics))
            reply = ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="tls-receiver", daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/v1/metrics", cert, received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_transport_sends_unless_a_proxy_applies(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    url = "http://collector:4318/v1/metrics"
    transport = exporter_transport(url)
    assert transport is not None
    assert (transport.not_before, transport.last_error, transport.aborted) == (0.0, "", False)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")  # only requests reads it
    assert exporter_transport(url) is None
    monkeypatch.setenv("NO_PROXY", "collector")
    assert exporter_transport(url) is not None


@pytest.mark.slow
@pytest.mark.parametrize("sender", ["transport", "session"])
def test_exports_use_the_configured_certificate_even_with_requests_ca_bundle_set(
    tls_receiver, monkeypatch, sender
):
    import async_tee
    from async_tee._export import http_session as _http_session

    if sender == "session":  # as where a proxy applies
        monkeypatch.setattr(_http_session, "exporter_transport", lambda _endpoint: None)
    endpoint, cert, received = tls_receiver
    # The SDK's exporter reads its certificate from the process environment.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(cert))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")  # no match
    async_tee.start_telemetry(
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
        }
    )
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1, step_finished=True)
    assert async_tee.flush(5)
    assert async_tee.shutdown_telemetry(5)  # delivered, over TLS, with its own certificate
    assert received

"""Exporters that cannot start say so, per exporter; the ports they serve on; ranks left out.

Real exporters throughout: Prometheus's HTTP server on real loopback ports (a taken port
is a real socket bound first), OTLP to the suite's real receiver.
"""

from __future__ import annotations

import logging
import re
import socket
import sys
import urllib.request
from collections.abc import Iterator

import pytest
from helpers import load_calls, own_threads

import async_tee


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another process would hold: bound and listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def async_tee_warnings(logs: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in logs.records if r.name == "async_tee" and r.levelno == logging.WARNING]


def tee_the_fixture() -> None:
    for call in load_calls():
        async_tee.tee_rl_metrics_to_otel(
            call["metrics"], call["prefix"], call["step"], call.get("step_finished", False)
        )


def scrape(address: tuple[str, int]) -> str:
    host, port = address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def served_value(page: str, name: str) -> float:
    """The value of series ``name`` on a ``/metrics`` page (one sample, any labels)."""
    (value,) = re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", page, re.MULTILINE)
    return float(value)


def async_tee_threads() -> list[str]:
    """async_tee's own threads, not the suite's receiver's."""
    return [name for name in own_threads() if not name.startswith("async-tee-sink")]


@pytest.mark.parametrize(
    ("environ", "fix"),
    [
        ({"OTEL_EXPORTER_PROMETHEUS_PORT": "{port}"}, "OTEL_EXPORTER_PROMETHEUS_PORT"),
        (
            {"ASYNC_TEE_PROMETHEUS_BASE_PORT": "{port}", "LOCAL_RANK": "0"},
            "ASYNC_TEE_PROMETHEUS_BASE_PORT",
        ),
    ],
    ids=["explicit port", "base port"],
)
def test_a_taken_port_says_it_did_not_deliver_in_one_line_naming_the_fix(
    taken_port, environ, fix, logs
):
    environ = {k: v.format(port=taken_port) for k, v in environ.items()}
    session = async_tee.start_telemetry(environ={"OTEL_METRICS_EXPORTER": "prometheus", **environ})
    tee_the_fixture()  # training goes on: the tee neither raises nor blocks
    assert async_tee.flush(5)

    assert not session.is_exporting
    stats = async_tee.stats()
    assert stats["exporting"] is False
    state = stats["exporters"]["prometheus"]
    assert state["state"] == "failed"
    assert state["where"] == f"127.0.0.1:{taken_port}"
    assert fix in state["error"]
    assert session.prometheus_address is None
    (warning,) = async_tee_warnings(logs)
    assert not warning.exc_info
    assert "\n" not in warning.getMessage()
    assert fix in warning.getMessage()
    assert "in use" in warning.getMessage()
    # The traceback is still there for whoever looks, at debug.
    assert any(r.levelno == logging.DEBUG and r.exc_info for r in logs.records)
    assert stats["recorded"] == stats["enqueued"] > 0  # the tee still records; nothing leaves
    assert async_tee.shutdown_telemetry(5) is False


def test_one_exporter_failing_leaves_the_others_working_but_not_delivered(taken_port, sink, logs):
    session = async_tee.start_telemetry(
        environ={
            "OTEL_METRICS_EXPORTER": "otlp,prometheus",
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint,
            "OTEL_EXPORTER_PROMETHEUS_PORT": str(taken_port),
        }
    )
    tee_the_fixture()
    assert session.is_exporting  # OTLP still works
    states = async_tee.stats()["exporters"]
    assert states["otlp"] == {
        "state": "started",
        "where": f"{sink.http_endpoint}/v1/metrics",
        "error": "",
    }
    assert states["prometheus"]["state"] == "failed"
    assert async_tee.shutdown_telemetry(10) is False  # Prometheus never served a thing
    assert "rl.reward.mean" in sink.names()  # but what OTLP carried arrived
    assert len(async_tee_warnings(logs)) == 1


@pytest.mark.parametrize(
    ("endpoint", "protocol"),
    [
        ("http://localhost:notaport", "grpc"),
        ("ftp://localhost:4317", "grpc"),
        ("http://[::1", "grpc"),
        ("localhost:4318", "http/protobuf"),
        ("http://:4317", "grpc"),
    ],
)
def test_a_bad_otlp_endpoint_is_reported_at_start_not_at_every_export(endpoint, protocol, logs):
    session = async_tee.start_telemetry(
        environ={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol}
    )
    tee_the_fixture()
    assert not session.is_exporting
    state = async_tee.stats()["exporters"]["otlp"]
    assert state["state"] == "failed"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in state["error"]
    (warning,) = async_tee_warnings(logs)
    assert "\n" not in warning.getMessage()
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in warning.getMessage()
    assert async_tee_threads() == ["async-tee-worker", "async-tee-signals"]  # none exporting
    assert async_tee.shutdown_telemetry(5) is False


def test_port_zero_serves_on_a_free_port_that_is_logged_and_readable(logs):
    session = async_tee.start_telemetry(
        environ={"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": "0"}
    )
    tee_the_fixture()
    assert async_tee.flush(5)
    address = session.prometheus_address
    assert address is not None
    assert address[1] != 0
    assert async_tee.stats()["exporters"]["prometheus"]["where"] == f"127.0.0.1:{address[1]}"
    served = [r.getMessage() for r in logs.records if "serving Prometheus" in r.getMessage()]
    assert served == [
        f"async_tee: serving Prometheus metrics on http://127.0.0.1:{address[1]}/metrics"
    ]
    assert served_value(scrape(address), "rl_reward_mean") == 0.5234
    assert session.is_exporting
    assert async_tee.shutdown_telemetry(5)


def test_a_local_rank_serves_on_the_base_plus_its_local_rank(taken_port):
    # The taken port is the base: local rank 0 would collide, local rank 1 must not.
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", taken_port + 1))
        except OSError:
            pytest.skip("the port after the taken one is in use on this host")
    session = async_tee.start_telemetry(
        environ={
            "OTEL_METRICS_EXPORTER": "prometheus",
            "ASYNC_TEE_PROMETHEUS_BASE_PORT": str(taken_port),
            "RANK": "1",
            "LOCAL_RANK": "1",
        }
    )
    assert session.prometheus_address == ("127.0.0.1", taken_port + 1)
    tee_the_fixture()
    assert async_tee.flush(5)
    page = scrape(session.prometheus_address)
    assert served_value(page, "rl_reward_mean") == 0.5234
    assert 'rl_rank="1"' in page  # target_info carries the rank
    assert async_tee.shutdown_telemetry(5)


def test_a_rank_left_out_by_export_ranks_starts_nothing(sink, logs):
    session = async_tee.start_telemetry(
        environ={
            "ASYNC_TEE_EXPORT_RANKS": "0",
            "RANK": "3",
            "LOCAL_RANK": "3",
            "WORLD_SIZE": "4",
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint,
        }
    )
    tee_the_fixture()
    assert async_tee_threads() == []
    assert not session.is_exporting
    stats = async_tee.stats()
    assert stats["enqueued"] == 0
    assert stats["ranks"] == {
        "launcher": "torchrun",
        "rank": 3,
        "local_rank": 3,
        "world_size": 4,
        "node_rank": None,
        "export_ranks": "0",
        "exports": False,
    }
    assert async_tee.shutdown_telemetry(5)  # nothing was asked of it: nothing undelivered
    assert sink.requests == {"grpc": 0, "http": 0}
    assert not async_tee_warnings(logs)


def test_compression_given_in_environ_reaches_the_wire(sink):
    # environ=, not os.environ: the exporter would read only the latter by itself.
    for compression in ("gzip", "none"):
        async_tee.start_telemetry(
            environ={
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint,
                "OTEL_EXPORTER_OTLP_COMPRESSION": compression,
            }
        )
        tee_the_fixture()
        assert async_tee.shutdown_telemetry(10)
        encodings = {encoding for _, _, encoding in sink.request_sizes()}
        assert encodings == {"gzip" if compression == "gzip" else "identity"}
        sink.clear()


def test_a_key_that_cannot_be_encoded_costs_its_own_point_never_the_scrape(logs):
    session = async_tee.start_telemetry(
        environ={"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": "0"}
    )
    assert session.prometheus_address is not None
    setup = {"a\udcffb_s": 1.0, "vllm_init_time_s": 2.5}  # a lone surrogate: no UTF-8 for it
    async_tee.tee_rl_metrics_to_otel(setup, "timing/setup")
    async_tee.tee_rl_metrics_to_otel({"reward": 0.5}, "train", 1, step_finished=True)
    assert async_tee.flush(5)
    page = scrape(session.prometheus_address)  # answers, as every scrape after it will
    assert 'rl_setup_phase="vllm_init"} 2.5' in page
    assert 'rl_setup_phase="a' not in page
    assert async_tee.stats()["values_skipped"]["rejected"] == 1  # counted, not silent
    (warning,) = [r for r in async_tee_warnings(logs) if "attributes" in r.getMessage()]
    assert "\\udcff" in warning.getMessage()  # named, escaped
    assert async_tee.shutdown_telemetry(5)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_endpoint_credentials_and_header_values_appear_nowhere(protocol, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, the SDK's and urllib3's included
    with socket.socket() as closed:  # a port nobody listens on: every export fails, loudly
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    session = async_tee.start_telemetry(
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://alice:PASSWORD42@127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20TOKEN42",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        }
    )
    tee_the_fixture()
    assert async_tee.flush(5)
    async_tee.shutdown_telemetry(3)
    stats = async_tee.stats()
    if protocol == "grpc":  # gRPC never sends URL credentials: refused at start, with the fix
        assert stats["exporters"]["otlp"]["state"] == "failed"
        assert "OTEL_EXPORTER_OTLP_HEADERS" in stats["exporters"]["otlp"]["error"]
    shown = [
        *(record.getMessage() for record in caplog.records),
        *(record.exc_text or "" for record in caplog.records),
        repr(stats),
        repr(session),
        repr(session.settings),
        session.settings.describe(),
    ]
    for secret in ("PASSWORD42", "TOKEN42", "alice"):
        assert not [text for text in shown if secret in text], secret
    assert any("***@127.0.0.1" in text for text in shown)  # the endpoint, redacted


def test_a_traceback_is_redacted_too():
    from async_tee._reporting import RedactSecrets

    try:
        raise ConnectionError("POST http://alice:PASSWORD42@collector:4318 refused")
    except ConnectionError:
        record = logging.LogRecord("x", logging.WARNING, __file__, 1, "failed", (), sys.exc_info())
    RedactSecrets(("alice:PASSWORD42",)).filter(record)
    assert record.exc_text is not None
    assert "PASSWORD42" not in record.exc_text
    assert "***@collector" in record.exc_text


@pytest.mark.parametrize(
    ("error", "variable"),
    [
        ("SSLError: [SSL: WRONG_VERSION_NUMBER] wrong version number", "_CERTIFICATE"),
        ("HTTP 401 Unauthorized", "_HEADERS"),
        ("Failed to export metrics, error code: StatusCode.UNAUTHENTICATED", "_HEADERS"),
        ("ReadTimeout: read timed out", "_TIMEOUT"),
        ("ConnectionError: [Errno 111] Connection refused", "_ENDPOINT"),
        ("", "_ENDPOINT"),
        ("HTTP 404 Not Found", "_ENDPOINT's path"),
        ("gRPC UNIMPLEMENTED: unknown service", "_ENDPOINT's path"),
    ],
)
def test_a_failing_export_names_the_variable_most_likely_to_fix_it(error, variable):
    from async_tee._export.transport import fix_for

    assert fix_for("", error).startswith(f"OTEL_EXPORTER_OTLP{variable}")

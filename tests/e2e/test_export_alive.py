"""The export side stays alive: slow or raising callbacks, and shutdowns that time out.

Real exporter, real receiver (stalled on purpose), real process-wide threads and fds.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

import async_tee
from async_tee import RecordedMetric, register_recorded_metrics
from async_tee.sink import OtlpSink

pytestmark = pytest.mark.slow


def _export_threads() -> list[threading.Thread]:
    return [
        t for t in threading.enumerate() if t.name in ("async-tee-export", "async-tee-shutdown")
    ]


def _environ(sink: OtlpSink, **extra: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint, **extra}


class Misbehaving:
    """An owner's observable callback: the first calls misbehave, the later ones report 1."""

    def __init__(self, sleep_s: float = 0.0, error: BaseException | None = None) -> None:
        self.calls = 0
        self.sleep_s = sleep_s
        self.error = error

    def __call__(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        self.calls += 1
        if self.calls <= 2:
            time.sleep(self.sleep_s)
            if self.error is not None:
                raise self.error
        return [Observation(1.0)]


@pytest.mark.parametrize(
    "callback",
    [Misbehaving(sleep_s=0.3), Misbehaving(error=SystemExit(1)), Misbehaving(error=KeyError())],
    ids=["slower-than-the-collection-timeout", "SystemExit", "KeyError"],
)
def test_a_misbehaving_callback_does_not_stop_later_exports(sink, callback):
    register_recorded_metrics(
        [RecordedMetric("rl.host.probe", kind="observable_gauge", callback=callback)]
    )
    async_tee.start_telemetry(
        environ=_environ(sink, OTEL_METRIC_EXPORT_INTERVAL="200", OTEL_METRIC_EXPORT_TIMEOUT="100")
    )
    # Exports go on: the probe arrives once the callback behaves, from the same thread.
    assert sink.wait_for(lambda s: "rl.host.probe" in s.names(), 15)
    assert [t.name for t in _export_threads()] == ["async-tee-export"]
    assert async_tee.stats()["export_thread_died"] == 0
    assert async_tee.shutdown_telemetry(10)
    interval = async_tee.stats()["exports_by_trigger"]["interval"]
    assert interval["success"] >= 1
    if callback.sleep_s:  # the SDK timed the slow collections out: counted, not fatal
        assert interval["failure"] >= 1


def test_a_timed_out_shutdown_leaves_no_exporting_thread_behind(sink):
    async_tee.start_telemetry(environ=_environ(sink, OTEL_EXPORTER_OTLP_TIMEOUT="30"))
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1)
    assert async_tee.flush(10)
    sink.stall()  # the final export hangs (for the exporter's 30 s, were it not cancelled)
    started = time.monotonic()
    assert async_tee.shutdown_telemetry(1.0) is False
    for thread in _export_threads():
        thread.join(max(0.0, started + 1.0 + 0.5 - time.monotonic()))
    assert _export_threads() == []  # gone within the timeout (plus a noisy machine's 0.5 s)
    sink.unstall()


def test_timed_out_shutdowns_leave_no_file_descriptors_behind(sink):
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    sink.stall()
    cycles = []
    for _ in range(8):
        # gRPC: one connection to the in-process sink; over HTTP each cycle's stalled request
        # holds the sink's own end until unstalled (that case: the test below).
        environ = _environ(
            sink, OTEL_EXPORTER_OTLP_TIMEOUT="30", OTEL_EXPORTER_OTLP_PROTOCOL="grpc"
        )
        environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.grpc_endpoint
        async_tee.start_telemetry(environ=environ)
        async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1)
        async_tee.shutdown_telemetry(0.5)
        for thread in _export_threads():
            thread.join(2.0)
        cycles.append(fds())
    sink.unstall()
    assert cycles[-1] - cycles[1] <= 2, cycles  # flat after the first cycle's lazy setup


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("collector", ["stalled", "black hole"])
def test_timed_out_shutdowns_give_back_every_thread_and_socket(sink, protocol, collector):
    import socket

    with socket.socket() as hole:  # accepts connections into its backlog, never answers
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        if collector == "stalled":
            sink.stall()
            endpoint = sink.grpc_endpoint if protocol == "grpc" else sink.http_endpoint
        else:
            endpoint = f"http://127.0.0.1:{hole.getsockname()[1]}"
        environ = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2",  # longer than the shutdown's budget
        }
        baseline = None
        for cycle in range(8):
            async_tee.start_telemetry(environ=environ)
            async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1, step_finished=True)
            assert async_tee.flush(5)
            assert async_tee.shutdown_telemetry(1.0) is False  # the export is still in flight
            for thread in _export_threads():
                thread.join(1.0)
            assert _export_threads() == [], cycle  # the exporting thread ended with it
            if cycle == 0:
                baseline = _fds()  # after the first cycle's lazy set-up
        sink.unstall()  # the receiver's side of stalled requests closes too
        assert baseline is not None
        deadline = time.monotonic() + 2.0 + 3.0  # the export timeout bounds a handshake
        while _fds() > baseline and time.monotonic() < deadline:
            time.sleep(0.1)  # polling the kernel's fd table: nothing to flush
        assert _fds() <= baseline


def _steps(session: Any, first: int, count: int) -> None:
    """Tee steps, each recorded and exported (its step export, then a flush export) in turn."""
    for step in range(first, first + count):
        async_tee.tee_rl_metrics_to_otel({"reward": float(step)}, "train", step, True)
        assert async_tee.flush(5)
        session.flush_and_export(5)


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and text in r.getMessage()
    ]


def test_a_failing_exporter_says_so_once_and_is_not_called_exporting(sink, caplog):
    port = sink.http_endpoint.split(":")[-1].split("/")[0]
    session = async_tee.start_telemetry(
        environ={  # TLS to a plain-HTTP receiver: every handshake fails, as a wrong cert does
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"https://127.0.0.1:{port}/v1/metrics",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"https://127.0.0.1:{port}/v1/metrics",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
            "ASYNC_TEE_MIN_EXPORT_INTERVAL": "0",
        }
    )
    _steps(session, 1, 2)
    stats = async_tee.stats()
    assert stats["exporters"]["otlp"]["state"] == "failing"
    assert "SSL" in stats["exporters"]["otlp"]["error"]
    assert stats["exporting"] is False
    assert not session.is_exporting
    (warning,) = _warnings(caplog, "in a row failed")
    assert "OTEL_EXPORTER_OTLP_CERTIFICATE" in warning
    assert async_tee.shutdown_telemetry(3) is False


def test_a_failing_exporter_that_recovers_says_so_once(sink, caplog):
    session = async_tee.start_telemetry(
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
            "ASYNC_TEE_MIN_EXPORT_INTERVAL": "0",
        }
    )
    sink.fail(401)  # credentials the collector refuses
    _steps(session, 1, 2)
    assert async_tee.stats()["exporters"]["otlp"]["state"] == "failing"
    assert "401" in async_tee.stats()["exporters"]["otlp"]["error"]
    (warning,) = _warnings(caplog, "in a row failed")
    assert "OTEL_EXPORTER_OTLP_HEADERS" in warning
    sink.fail(None)
    _steps(session, 3, 1)
    assert async_tee.stats()["exporters"]["otlp"]["state"] == "started"
    assert session.is_exporting
    assert len(_warnings(caplog, "delivered again")) == 1
    refused = async_tee.stats()["delivery"]["dropped"]["refused"]
    assert refused == async_tee.stats()["delivery"]["refused_by_reason"]["http_401"] >= 3
    assert async_tee.shutdown_telemetry(5) is False  # the refused requests never arrived

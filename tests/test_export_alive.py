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
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.grpc_endpoint, **extra}


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
        async_tee.start_telemetry(environ=_environ(sink, OTEL_EXPORTER_OTLP_TIMEOUT="30"))
        async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1)
        async_tee.shutdown_telemetry(0.5)
        for thread in _export_threads():
            thread.join(2.0)
        cycles.append(fds())
    sink.unstall()
    assert cycles[-1] - cycles[1] <= 2, cycles  # flat after the first cycle's lazy setup

"""The stack's Collector keeps what it accepted across its own crash (remote-write path).

The Collector and Prometheus 3 of ``async-tee stack --path remote-write``, from its configs:
steps are posted while both run, then while Prometheus is down, the Collector SIGKILLed (or
stopped) after it accepted more, started again and given more, and only then Prometheus started
again. Every
step must be a sample in Prometheus at its own timestamp, nothing refused out of order.

The sender is this test, not async_tee: one OTLP/HTTP request per step, each one gauge
``rl.step`` sample at its own timestamp, so what is measured is the Collector alone.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import time
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Gauge,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from servers import (
    local_addresses,
    metric_samples,
    otelcol_argv,
    own_counters,
    port_of,
    prometheus_argv,
    query,
    server,
    wait_for_query,
    write_stack,
)

pytestmark = [pytest.mark.slow, pytest.mark.servers]

RUN = "restart"
STEP_MS = 1000  # the steps' timestamps are 1 s apart, as a 1 s training step's would be
PHASE = 10  # steps per phase: all up; Prometheus down; Collector restarted, Prometheus down
WAIT_S = 30  # the longest either wait for Prometheus: a failure is an assertion, not a timeout


def _attribute(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _step_request(step: int, at_ms: int) -> bytes:
    """One step's OTLP request: the gauge ``rl.step`` = ``step`` at ``at_ms``."""
    point = NumberDataPoint(as_double=float(step), time_unix_nano=at_ms * 1_000_000)
    metric = Metric(name="rl.step", gauge=Gauge(data_points=[point]))
    resource = Resource(
        attributes=[
            _attribute("service.name", "restart_test"),
            _attribute("service.instance.id", "rank-0"),
            _attribute("rl.run.id", RUN),
            _attribute("rl.rank", "0"),
        ]
    )
    scope = ScopeMetrics(metrics=[metric])
    request = ExportMetricsServiceRequest(
        resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[scope])]
    )
    return request.SerializeToString()


class Steps:
    """Posts one request per step to the Collector's OTLP/HTTP receiver; keeps what it took."""

    def __init__(self, first_ms: int) -> None:
        self.first_ms = first_ms
        self.accepted: list[tuple[int, float]] = []  # (timestamp ms, step) the Collector took

    def post(self, port: int, count: int) -> None:
        """``count`` more steps; each must be accepted (HTTP 200) before the next goes."""
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            for _ in range(count):
                step = len(self.accepted) + 1
                at_ms = self.first_ms + step * STEP_MS
                connection.request(
                    "POST",
                    "/v1/metrics",
                    _step_request(step, at_ms),
                    {"Content-Type": "application/x-protobuf"},
                )
                response = connection.getresponse()
                body = response.read()
                assert response.status == 200, (step, response.status, body[:300])
                self.accepted.append((at_ms, float(step)))
        finally:
            connection.close()


def _refused_by_prometheus(web: int) -> dict[str, float]:
    """Prometheus's own counts of samples it refused, and of remote-write requests it refused
    (4xx: a 503 while it starts is retried, not a refusal)."""
    refused = {
        "prometheus_tsdb_out_of_order_samples_total": 0.0,
        "prometheus_tsdb_out_of_bound_samples_total": 0.0,
        "prometheus_tsdb_too_old_samples_total": 0.0,
        "prometheus_api_remote_write_invalid_labels_samples_total": 0.0,
        "remote-write requests refused": 0.0,
    }
    for sample in metric_samples(web):
        if sample.name in refused:
            refused[sample.name] += sample.value
        elif (
            sample.name == "prometheus_http_requests_total"
            and sample.labels.get("handler") == "/api/v1/write"
            and sample.labels.get("code", "").startswith("4")
        ):
            refused["remote-write requests refused"] += sample.value
    return refused


def _failed_in_collector(port: int) -> dict[str, float]:
    """The Collector's own counts of points it refused or failed to pass on (0 when absent)."""
    found = own_counters(port)
    names = (
        "otelcol_receiver_refused_metric_points_total",
        "otelcol_receiver_failed_metric_points_total",
        "otelcol_exporter_send_failed_metric_points_total",
        "otelcol_exporter_enqueue_failed_metric_points_total",
        "otelcol_exporter_prometheusremotewrite_wal_send_failed_batches_total",
        "otelcol_exporter_prometheusremotewrite_wal_writes_failures_total",
    )
    return {name: found.get(name, 0.0) for name in names}


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.mark.timeout(90)
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: s.name)
def test_what_the_collector_accepted_survives_its_crash_while_prometheus_is_down(stop, tmp_path):
    """SIGKILL is the crash; SIGTERM is a rolling restart's stop (its retries end, the log
    stays)."""
    started = time.monotonic()
    at = write_stack("remote-write", tmp_path, local_addresses())
    web, otlp_http = port_of(at.prometheus_listen), port_of(at.collector_otlp_http)
    own = at.collector_telemetry_port
    steps = Steps(first_ms=int(time.time() * 1000) - 5 * 60_000)  # 5 minutes ago on: in order
    collector = otelcol_argv(tmp_path)
    prometheus = prometheus_argv("remote-write", tmp_path, at)
    selector = f'rl_step{{rl_run_id="{RUN}"}}'

    def log(name: str) -> Path:
        return tmp_path / f"{name}.log"

    with contextlib.ExitStack() as first_prometheus:
        first_prometheus.enter_context(server(prometheus, web, log("prometheus-1"), "prometheus"))
        with server(collector, otlp_http, log("otelcol-1"), "otelcol") as first:
            steps.post(otlp_http, PHASE)  # both up: delivered as they come
            live = wait_for_query(
                web,
                f"count_over_time({selector}[10m])",
                lambda rows: rows and float(rows[0]["value"][1]) == PHASE,
                timeout_s=WAIT_S,
            )
            assert live, f"the first {PHASE} steps never arrived: {live}"
            refused_first = _refused_by_prometheus(web)
            first_prometheus.close()  # Prometheus down (SIGTERM, waited for)

            steps.post(otlp_http, PHASE)  # accepted by the Collector, Prometheus down
            failed_first = _failed_in_collector(own)
            held = _folder_bytes(Path(at.collector_data))
            os.kill(first, stop)
        with server(collector, otlp_http, log("otelcol-2"), "otelcol"):
            steps.post(otlp_http, PHASE)  # the Collector back, Prometheus still down
            with server(prometheus, web, log("prometheus-2"), "prometheus"):
                back = time.monotonic()
                total = len(steps.accepted)
                arrived = wait_for_query(
                    web,
                    f"count_over_time({selector}[10m])",
                    lambda rows: rows and float(rows[0]["value"][1]) >= total,
                    timeout_s=WAIT_S,
                )
                drained = time.monotonic() - back
                rows = query(web, f"{selector}[10m]")
                refused_second = _refused_by_prometheus(web)
                failed_second = _failed_in_collector(own)

    found = [(round(float(t) * 1000), float(v)) for row in rows for t, v in row["values"]]
    print(
        f"{stop.name}: {total} steps accepted ({PHASE} with all up, {PHASE} with Prometheus down "
        f"before the Collector's {stop.name}, {PHASE} after its restart), {len(found)} found in "
        "Prometheus; "
        f"{held} bytes in its log at the kill; all there {drained:.1f} s after Prometheus was "
        f"back; refused by Prometheus {refused_first} then {refused_second}; failed in the "
        f"Collector {failed_first} then {failed_second}; {time.monotonic() - started:.1f} s"
    )
    assert arrived, "no step arrived after the restarts"
    assert len(rows) == 1, rows  # one series: the restart made no second one
    assert found == steps.accepted  # every step, once, at its own timestamp, in order
    for refused in (refused_first, refused_second):
        assert set(refused.values()) == {0.0}, refused
    for failed in (failed_first, failed_second):
        assert set(failed.values()) == {0.0}, failed

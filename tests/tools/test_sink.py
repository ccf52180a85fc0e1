"""Tests for async_tee.sink: a real OTLP receiver exercised with the real OTel exporters."""

from __future__ import annotations

import gzip
import http.client
import json
import math
import socket
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from helpers import own_threads
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpExporter,
)
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Gauge,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from async_tee.sink import OtlpSink, ReceivedPoint, black_hole
from async_tee.sink import receiver as sink_receiver

PROTOCOLS = ["grpc", "http"]
# Generous upper bound for anything that is configured to give up after ~1 s.
BOUND_S = 10.0


STEP_TIME_VIEW = View(
    instrument_name="train.step_time",
    aggregation=ExplicitBucketHistogramAggregation([0.1, 1.0]),
)
"""The histogram's buckets, as every SDK release takes them (the floor, 1.30, does not apply an
instrument's advisory boundaries)."""


def make_exporter(sink: OtlpSink, protocol: str, **kwargs: Any) -> Any:
    if protocol == "grpc":
        return GrpcExporter(endpoint=sink.grpc_endpoint, insecure=True, **kwargs)
    return HttpExporter(endpoint=f"{sink.http_endpoint}/v1/metrics", **kwargs)


def record_sample(provider: MeterProvider) -> None:
    meter = provider.get_meter("async_tee.test")
    gauge = meter.create_gauge("train.loss", unit="1", description="training loss")
    gauge.set(0.5, {"step": 3, "phase": "train", "ratio": 0.25, "final": False})
    counter = meter.create_counter("train.steps", unit="{step}")
    counter.add(2, {"rank": 0})
    counter.add(3, {"rank": 0})
    histogram = meter.create_histogram("train.step_time", unit="s")  # buckets: STEP_TIME_VIEW
    for seconds in (0.05, 0.5, 2.0):
        histogram.record(seconds)


@pytest.fixture
def metrics_data() -> MetricsData:
    """MetricsData produced by the real SDK, for calling exporter.export() directly."""
    # service.instance.id set here: the SDK's floor (1.30) does not make one up
    return sample_data(Resource.create({"service.name": "t", "service.instance.id": "t-1"}))


def by_name(sink: OtlpSink) -> dict[str, ReceivedPoint]:
    latest = sink.latest()
    result = {name: point for (name, _), point in latest.items()}
    assert len(result) == len(latest), "expected one attribute set per metric"
    return result


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_real_sdk_roundtrip(sink: OtlpSink, protocol: str) -> None:
    provider = MeterProvider(
        metric_readers=[
            PeriodicExportingMetricReader(
                make_exporter(sink, protocol, timeout=5), export_interval_millis=60_000
            )
        ],
        resource=Resource.create({"service.name": "trainer", "rank": 7}),
        views=[STEP_TIME_VIEW],
        shutdown_on_exit=False,
    )
    try:
        record_sample(provider)
        assert provider.force_flush()
    finally:
        provider.shutdown()
    names = {"train.loss", "train.steps", "train.step_time"}
    assert sink.wait_for(lambda s: s.names() >= names, timeout_s=BOUND_S)
    assert sink.names() == names
    requests = sink.requests
    assert requests[protocol] >= 1
    assert sum(requests.values()) == requests[protocol]
    assert sink.dropped_points == 0

    points = by_name(sink)
    for point in points.values():
        assert point.protocol == protocol
        assert point.scope == "async_tee.test"
        assert point.resource["service.name"] == "trainer"
        assert point.resource["rank"] == 7
        assert type(point.resource["rank"]) is int
        assert point.time_unix_nano > 0

    loss = points["train.loss"]
    assert loss.kind == "gauge"
    assert (loss.unit, loss.description) == ("1", "training loss")
    assert loss.attributes == {"step": 3, "phase": "train", "ratio": 0.25, "final": False}
    assert [type(v) for v in loss.attributes.values()] == [int, str, float, bool]
    assert loss.value == 0.5
    assert type(loss.value) is float
    assert loss.value_type == "double"
    assert (loss.monotonic, loss.temporality) == (None, None)

    steps = points["train.steps"]
    assert (steps.kind, steps.unit) == ("sum", "{step}")
    assert steps.attributes == {"rank": 0}
    assert steps.value == 5
    assert type(steps.value) is int
    assert steps.value_type == "int"
    assert steps.monotonic is True
    assert steps.temporality == "cumulative"

    step_time = points["train.step_time"]
    assert (step_time.kind, step_time.unit) == ("histogram", "s")
    assert step_time.attributes == {}
    assert step_time.value is None
    assert step_time.value_type == "histogram"
    assert step_time.count == 3
    assert step_time.sum == pytest.approx(2.55)
    assert step_time.explicit_bounds == (0.1, 1.0)
    assert step_time.bucket_counts == (1, 1, 1)
    assert step_time.temporality == "cumulative"


def test_http_gzip_body_accepted(sink: OtlpSink, metrics_data: MetricsData) -> None:
    exporter = make_exporter(sink, "http", timeout=5, compression=Compression.Gzip)
    try:
        assert exporter.export(metrics_data) is MetricExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert sink.names() == {"train.loss", "train.steps", "train.step_time"}
    assert sink.requests == {"grpc": 0, "http": 1}


def _gauge_request(name: str, values: list[tuple[float, dict[str, AnyValue]]]) -> bytes:
    points = [
        NumberDataPoint(
            as_double=value,
            time_unix_nano=1,
            attributes=[KeyValue(key=k, value=v) for k, v in attrs.items()],
        )
        for value, attrs in values
    ]
    request = ExportMetricsServiceRequest(
        resource_metrics=[
            ResourceMetrics(
                scope_metrics=[
                    ScopeMetrics(metrics=[Metric(name=name, gauge=Gauge(data_points=points))])
                ]
            )
        ]
    )
    return request.SerializeToString()


def _post(
    sink: OtlpSink, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, bytes, str | None]:
    conn = http.client.HTTPConnection("127.0.0.1", sink.http_port, timeout=BOUND_S)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read(), response.getheader("Content-Type")
    finally:
        conn.close()


def test_http_raw_protocol_details(sink: OtlpSink) -> None:
    body = _gauge_request(
        "raw",
        [
            (1.0, {"tags": AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="a")]))}),
            (2.0, {"blob": AnyValue(bytes_value=b"\x00\x01")}),
        ],
    )
    proto = {"Content-Type": "application/x-protobuf"}
    assert _post(sink, "/v1/metrics", body, proto) == (200, b"", "application/x-protobuf")
    gz = {**proto, "Content-Encoding": "gzip"}
    assert _post(sink, "/v1/metrics", gzip.compress(body), gz)[0] == 200
    assert _post(sink, "/v1/traces", body, proto)[0] == 404
    assert _post(sink, "/v1/metrics", b"{}", {"Content-Type": "application/json"})[0] == 415
    assert _post(sink, "/v1/metrics", b"\xff\xff\xff", proto)[0] == 400
    assert _post(sink, "/v1/metrics", b"not gzip", gz)[0] == 400
    assert sink.requests == {"grpc": 0, "http": 2}

    values = [(p.value, p.attributes) for p in sink.points()]
    assert values == [(1.0, {"tags": ["a"]}), (2.0, {"blob": b"\x00\x01"})] * 2
    latest = sink.latest()
    assert set(latest) == {
        ("raw", frozenset({("tags", ("a",))})),
        ("raw", frozenset({("blob", b"\x00\x01")})),
    }


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_stalled_sink_times_out_exporter_and_close_is_bounded(
    protocol: str, metrics_data: MetricsData
) -> None:
    sink = OtlpSink().start()
    try:
        sink.stall()
        exporter = make_exporter(sink, protocol, timeout=1)
        try:
            started = time.monotonic()
            result = exporter.export(metrics_data)
            elapsed = time.monotonic() - started
        finally:
            exporter.shutdown()
        assert result is MetricExportResult.FAILURE
        assert 0.5 < elapsed < BOUND_S
        assert sink.wait_for(lambda s: s.requests[protocol] >= 1, timeout_s=BOUND_S)
        assert sink.points() == []
    finally:
        started = time.monotonic()
        sink.close()  # a handler is still stalled in the sink at this point
        closed_in = time.monotonic() - started
    assert closed_in < BOUND_S
    assert sink.points() == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unstall_releases_a_blocked_export(
    sink: OtlpSink, protocol: str, metrics_data: MetricsData
) -> None:
    sink.stall()
    exporter = make_exporter(sink, protocol, timeout=30)
    results: list[MetricExportResult] = []
    worker = threading.Thread(
        target=lambda: results.append(exporter.export(metrics_data)), name="test-exporter"
    )
    try:
        worker.start()
        assert sink.wait_for(lambda s: s.requests[protocol] == 1, timeout_s=BOUND_S)
        assert not sink.wait_for(lambda s: len(s.points()) > 0, timeout_s=0.2)
        assert results == []
        sink.unstall()
        worker.join(BOUND_S)
        assert results == [MetricExportResult.SUCCESS]
    finally:
        sink.unstall()
        worker.join(BOUND_S)
        exporter.shutdown()
    assert sink.names() == {"train.loss", "train.steps", "train.step_time"}


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_fail_makes_exports_fail_until_restored(
    sink: OtlpSink, protocol: str, metrics_data: MetricsData
) -> None:
    sink.fail(503)
    exporter = make_exporter(sink, protocol, timeout=1)
    try:
        started = time.monotonic()
        assert exporter.export(metrics_data) is MetricExportResult.FAILURE
        assert time.monotonic() - started < BOUND_S
        assert sink.requests[protocol] >= 1
        assert sink.points() == []
        sink.fail(None)
        assert exporter.export(metrics_data) is MetricExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert len(sink.names()) == 3


def test_fail_non_retryable_http_status_is_sent_once(
    sink: OtlpSink, metrics_data: MetricsData
) -> None:
    sink.fail(400)
    exporter = make_exporter(sink, "http", timeout=5)
    try:
        assert exporter.export(metrics_data) is MetricExportResult.FAILURE
    finally:
        exporter.shutdown()
    assert sink.requests == {"grpc": 0, "http": 1}


def test_fail_rejects_non_error_status(sink: OtlpSink) -> None:
    with pytest.raises(ValueError, match="4xx/5xx"):
        sink.fail(200)


def test_max_points_bound_counts_dropped() -> None:
    with OtlpSink(max_points=5) as sink:
        body = _gauge_request("g", [(float(i), {"i": AnyValue(int_value=i)}) for i in range(8)])
        assert _post(sink, "/v1/metrics", body)[0] == 200
        assert len(sink.points()) == 5
        assert sink.dropped_points == 3
        assert [p.attributes["i"] for p in sink.points()] == [3, 4, 5, 6, 7]
        sink.clear()
        assert (sink.points(), sink.dropped_points, sink.requests) == (
            [],
            0,
            {"grpc": 0, "http": 0},
        )


def test_max_points_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_points"):
        OtlpSink(max_points=0)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_black_hole_makes_exporter_fail_within_its_timeout(
    protocol: str, metrics_data: MetricsData
) -> None:
    sock, port = black_hole()
    try:
        if protocol == "grpc":
            exporter: Any = GrpcExporter(
                endpoint=f"http://127.0.0.1:{port}", insecure=True, timeout=1
            )
        else:
            exporter = HttpExporter(endpoint=f"http://127.0.0.1:{port}/v1/metrics", timeout=1)
        try:
            started = time.monotonic()
            result = exporter.export(metrics_data)
            elapsed = time.monotonic() - started
        finally:
            exporter.shutdown()
    finally:
        sock.close()
    assert result is MetricExportResult.FAILURE
    assert 0.5 < elapsed < BOUND_S


def test_black_hole_socket_listens_but_never_answers() -> None:
    sock, port = black_hole()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S) as client:
            client.settimeout(0.2)
            client.sendall(b"POST /v1/metrics HTTP/1.1\r\n\r\n")
            with pytest.raises(TimeoutError):
                client.recv(1)
    finally:
        sock.close()


def test_wait_for_times_out_and_wakes_on_request(sink: OtlpSink) -> None:
    started = time.monotonic()
    assert not sink.wait_for(lambda s: "late" in s.names(), timeout_s=0.2)
    assert 0.15 < time.monotonic() - started < BOUND_S

    body = _gauge_request("late", [(1.0, {})])
    poster = threading.Thread(target=_post, args=(sink, "/v1/metrics", body), name="test-post")
    poster.start()
    try:
        assert sink.wait_for(lambda s: "late" in s.names(), timeout_s=BOUND_S)
    finally:
        poster.join(BOUND_S)


def test_echo_renders_each_point_and_survives_a_failing_callback(
    metrics_data: MetricsData,
) -> None:
    lines: list[str] = []

    def echo(line: str) -> None:
        lines.append(line)
        raise RuntimeError("broken echo")

    with OtlpSink(echo=echo) as sink:
        exporter = make_exporter(sink, "grpc", timeout=5)
        try:
            assert exporter.export(metrics_data) is MetricExportResult.SUCCESS
        finally:
            exporter.shutdown()
        assert len(sink.points()) == 3
    assert len(lines) == 3
    assert all("\n" not in line and line.startswith("[grpc t-1] ") for line in lines)
    assert any("train.loss{" in line and "0.5" in line for line in lines)


def sample_data(resource: Resource) -> MetricsData:
    """What the real SDK collects from ``record_sample`` under ``resource``."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[reader], resource=resource, views=[STEP_TIME_VIEW], shutdown_on_exit=False
    )
    try:
        record_sample(provider)
        data = reader.get_metrics_data()
    finally:
        provider.shutdown()
    assert data is not None
    return data


def export_data(sink: OtlpSink, protocol: str, data: MetricsData, **kwargs: Any) -> None:
    exporter = make_exporter(sink, protocol, timeout=5, **kwargs)
    try:
        assert exporter.export(data) is MetricExportResult.SUCCESS
    finally:
        exporter.shutdown()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_echo_names_the_sender_of_each_line(protocol: str) -> None:
    # Resource(...) as given: Resource.create would add a random service.instance.id.
    senders = {
        "job-7/rank-0": Resource({"service.instance.id": "job-7/rank-0", "rl.rank": 0}),
        "job-7/rank-1": Resource({"service.instance.id": "job-7/rank-1", "rl.rank": 1}),
        "rank 3": Resource({"rl.rank": 3, "service.name": "trainer"}),
        "trainer": Resource({"service.name": "trainer"}),
    }
    lines: list[str] = []
    with OtlpSink(echo=lines.append) as sink:
        for resource in senders.values():
            export_data(sink, protocol, sample_data(resource))
    assert len(lines) == 3 * len(senders)
    for index, sender in enumerate(senders):
        mine = lines[3 * index : 3 * index + 3]
        assert all(line.startswith(f"[{protocol} {sender}] train.") for line in mine), mine
    loss = f"[{protocol} job-7/rank-1] train.loss{{step=3,phase='train',ratio=0.25,final=False}}"
    assert f"{loss} = 0.5 1 (gauge)" in lines
    assert all("\n" not in line for line in lines)


def test_echo_json_lines_are_strict_json_with_the_resource_and_value() -> None:
    lines: list[str] = []
    resource = Resource({"service.instance.id": "job-7/rank-3", "rl.rank": 3})
    with OtlpSink(echo=lines.append, echo_format="json") as sink:
        export_data(sink, "http", sample_data(resource))
        nan = _gauge_request("raw", [(math.nan, {"blob": AnyValue(bytes_value=b"\x00\xff")})])
        assert _post(sink, "/v1/metrics", nan)[0] == 200

    def no_constants(token: str) -> None:
        raise AssertionError(f"not strict JSON: {token}")

    rows = [json.loads(line, parse_constant=no_constants) for line in lines]
    assert [row["name"] for row in rows] == ["train.loss", "train.steps", "train.step_time", "raw"]
    base = {"protocol", "resource", "scope", "name", "kind", "unit", "attributes"}
    loss, steps, step_time, raw = rows
    assert set(loss) == set(steps) == set(raw) == base | {"value", "time_unix_nano"}
    assert set(step_time) == base | {"count", "sum", "time_unix_nano"}
    assert loss["resource"] == {"service.instance.id": "job-7/rank-3", "rl.rank": 3}
    assert (loss["protocol"], loss["scope"], loss["kind"]) == ("http", "async_tee.test", "gauge")
    assert loss["attributes"] == {"step": 3, "phase": "train", "ratio": 0.25, "final": False}
    assert loss["value"] == 0.5
    assert loss["time_unix_nano"] > 0
    assert (steps["kind"], steps["value"]) == ("sum", 5)
    assert (step_time["count"], step_time["sum"]) == (3, pytest.approx(2.55))
    assert raw["value"] == "NaN"
    assert raw["attributes"] == {"blob": "AP8="}  # base64, as OTLP/JSON writes bytes


def test_as_dict_makes_every_value_json_safe() -> None:
    point = ReceivedPoint(
        protocol="grpc",
        resource={"tags": ("a", b"\x01"), "nested": {"inf": math.inf}},
        scope="s",
        name="h",
        unit="",
        description="",
        kind="histogram",
        monotonic=None,
        temporality="delta",
        count=2,
        sum=-math.inf,
    )
    assert point.as_dict()["resource"] == {"tags": ["a", "AQ=="], "nested": {"inf": "Infinity"}}
    assert point.as_dict()["sum"] == "-Infinity"
    json.dumps(point.as_dict(), allow_nan=False)
    assert point.sender is None


def test_echo_format_must_be_known() -> None:
    with pytest.raises(ValueError, match="echo_format"):
        OtlpSink(echo_format="xml")  # type: ignore[arg-type]


def test_request_sizes_show_gzip_and_the_bytes_on_the_wire(
    sink: OtlpSink, metrics_data: MetricsData
) -> None:
    export_data(sink, "http", metrics_data, compression=Compression.NoCompression)
    export_data(sink, "http", metrics_data, compression=Compression.Gzip)
    export_data(sink, "grpc", metrics_data)
    (plain, gzipped, grpc_size) = sink.request_sizes()
    assert plain[0] == "http"
    assert plain[2] == "identity"
    assert gzipped[0] == "http"
    assert gzipped[2] == "gzip"
    assert 0 < gzipped[1] < plain[1]
    # the same data serialized: gRPC's message size is the uncompressed HTTP body's
    assert grpc_size == ("grpc", plain[1], "identity")
    sink.clear()
    assert sink.request_sizes() == []


def test_request_sizes_are_bounded_and_count_raw_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink_receiver, "_MAX_REQUEST_SIZES", 2)
    bodies = [_gauge_request("g" * n, [(1.0, {})]) for n in (1, 2, 3)]
    with OtlpSink() as sink:
        for body in bodies:
            assert _post(sink, "/v1/metrics", body)[0] == 200
        deflated = zlib.compress(bodies[0])
        assert _post(sink, "/v1/metrics", deflated, {"Content-Encoding": "Deflate"})[0] == 200
        assert sink.request_sizes() == [
            ("http", len(bodies[2]), "identity"),
            ("http", len(deflated), "deflate"),
        ]
        assert sink.requests["http"] == 4


def test_lifecycle_and_endpoints() -> None:
    sink = OtlpSink()
    with pytest.raises(RuntimeError, match="not started"):
        _ = sink.http_port
    assert sink.start() is sink
    assert sink.start() is sink  # idempotent while running
    try:
        assert sink.grpc_endpoint == f"http://127.0.0.1:{sink.grpc_port}"
        assert sink.http_endpoint == f"http://127.0.0.1:{sink.http_port}"
        assert sink.grpc_port > 0
        assert sink.http_port > 0
        assert sink.grpc_port != sink.http_port
        assert any(name.startswith("async-tee-sink") for name in own_threads())
    finally:
        sink.close()
    sink.close()  # idempotent
    assert own_threads() == []
    assert not sink.wait_for(lambda s: False, timeout_s=BOUND_S)  # returns at once when closed
    with pytest.raises(RuntimeError, match="restarted"):
        sink.start()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", sink.http_port), timeout=BOUND_S).close()


@pytest.mark.parametrize(
    ("make_conflict", "error"),
    [
        (lambda s: OtlpSink(http_port=s.http_port), OSError),
        (lambda s: OtlpSink(grpc_port=s.grpc_port), RuntimeError),
    ],
)
def test_port_conflict_fails_cleanly(
    sink: OtlpSink, make_conflict: Callable[[OtlpSink], OtlpSink], error: type[Exception]
) -> None:
    other = make_conflict(sink)
    with pytest.raises(error):
        other.start()
    other.close()
    assert [t for t in own_threads() if not t.startswith(sink.thread_prefix)] == []


def test_close_while_http_client_keeps_connection_open(sink: OtlpSink) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", sink.http_port, timeout=BOUND_S)
    try:
        conn.request("POST", "/v1/metrics", body=_gauge_request("k", [(1.0, {})]))
        response = conn.getresponse()
        response.read()
        assert response.status == 200
        started = time.monotonic()
        sink.close()
        assert time.monotonic() - started < BOUND_S
    finally:
        conn.close()


def _grpc_export(sink: OtlpSink, body: bytes, outcome: list[Any]) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{sink.grpc_port}") as channel:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
        try:
            stub.Export(ExportMetricsServiceRequest.FromString(body), timeout=BOUND_S * 3)
            outcome.append("ok")
        except grpc.RpcError as error:
            outcome.append(error.code())


def _http_export(sink: OtlpSink, body: bytes, outcome: list[Any]) -> None:
    try:
        outcome.append(_post(sink, "/v1/metrics", body)[0])
    except OSError as error:  # the sink may reset the connection while shutting down
        outcome.append(error)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_close_releases_in_flight_stalled_request(protocol: str) -> None:
    sink = OtlpSink().start()
    outcome: list[Any] = []
    target = _grpc_export if protocol == "grpc" else _http_export
    client = threading.Thread(
        target=target, args=(sink, _gauge_request("s", [(1.0, {})]), outcome), name="test-client"
    )
    try:
        sink.stall()
        client.start()
        assert sink.wait_for(lambda s: s.requests[protocol] == 1, timeout_s=BOUND_S)
        assert outcome == []
    finally:
        started = time.monotonic()
        sink.close()
        closed_in = time.monotonic() - started
        client.join(BOUND_S)
    assert closed_in < BOUND_S
    assert not client.is_alive()
    assert len(outcome) == 1
    assert outcome[0] != "ok"
    assert outcome[0] != 200
    assert sink.points() == []

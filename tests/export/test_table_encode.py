"""The request built from the tables equals the SDK's collection encoded, timestamps aside.

Both read the same session: the SDK through a real ``InMemoryMetricReader`` on the provider
the session records into, then ``encode_metrics``; the tables through ``TableEncoder``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from helpers import load_calls
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

import async_tee
from async_tee import __version__
from async_tee._declare.groups import RL_METRIC_GROUP
from async_tee._declare.series import SELF_METRIC_GROUP
from async_tee._export.table_encode import TableEncoder


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(repeated: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((kv.key, _value(kv.value)) for kv in repeated))


def _normal(request: Any) -> dict[str, Any]:
    """Every metric of the request by name: its kind, text, and points (times left out)."""
    out: dict[str, Any] = {}
    ((resource_metrics),) = request.resource_metrics
    out["resource"] = _attributes(resource_metrics.resource.attributes)
    for scope_metrics in resource_metrics.scope_metrics:
        scope = (scope_metrics.scope.name, scope_metrics.scope.version)
        for metric in scope_metrics.metrics:
            kind = metric.WhichOneof("data")
            data = getattr(metric, kind)
            points: list[Any] = []
            for point in data.data_points:
                fields: tuple[Any, ...]
                if kind == "histogram":
                    fields = (
                        point.count,
                        point.sum,
                        tuple(point.bucket_counts),
                        tuple(point.explicit_bounds),
                        point.min,
                        point.max,
                    )
                else:
                    fields = (point.WhichOneof("value"), getattr(point, point.WhichOneof("value")))
                points.append(
                    (_attributes(point.attributes), fields, point.start_time_unix_nano > 0)
                )
            out[metric.name] = (
                scope,
                kind,
                metric.unit,
                metric.description,
                getattr(data, "aggregation_temporality", None),
                getattr(data, "is_monotonic", None),
                sorted(points, key=repr),
            )
    return out


@pytest.fixture
def session() -> Any:
    reader = InMemoryMetricReader()
    resource = Resource.create({"rl.run.id": "job-7", "rl.rank": 3})
    provider = MeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False)
    running = async_tee.start_telemetry(provider)
    yield running, reader, resource
    async_tee.shutdown_telemetry(5)
    provider.shutdown()


def _ours(running: Any, encoder: TableEncoder) -> dict[str, Any]:
    """The encoder's request, normalized, for a new collection (as the reader starts one).

    The self-series callbacks share one ``stats()`` per collection: the SDK's read right
    after reuses this one's, so both see the same figures.
    """
    running.exports.counts.collections += 1
    return _normal(_decoded(encoder.request()))


def _decoded(request: Any) -> Any:
    return ExportMetricsServiceRequest.FromString(request.SerializeToString())


def _encoder(running: Any, resource: Resource) -> TableEncoder:
    return TableEncoder(
        running.instruments,
        (SELF_METRIC_GROUP, RL_METRIC_GROUP),
        resource,
        "async_tee",
        __version__,
    )


def test_the_fixture_run_encodes_as_the_sdk_does(session):
    running, reader, resource = session
    for step in range(1, 4):  # counters across steps, a NaN loss withdrawn at step 2
        for call in load_calls():
            metrics = dict(call["metrics"])
            if call["prefix"] == "train" and step == 2 and "loss" in metrics:
                metrics["loss"] = math.nan
            async_tee.tee_rl_metrics_to_otel(
                metrics, call["prefix"], step, call.get("step_finished", False)
            )
        assert async_tee.flush(10)
    ours = _ours(running, _encoder(running, resource))
    theirs = _normal(encode_metrics(reader.get_metrics_data()))
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert ours[name] == theirs[name], name
    assert any(name.startswith("rl.") for name in ours)
    assert "async_tee.lag" in ours  # the histogram too


def test_attribute_sets_up_to_the_cap_encode_as_the_sdk_does(session):
    running, reader, resource = session
    phases = {f"phase_{i}_time_s": float(i) for i in range(600)}  # past the 512-set cap
    async_tee.tee_rl_metrics_to_otel(phases, "timing/setup", 0)
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1, step_finished=True)
    assert async_tee.flush(10)
    ours = _ours(running, _encoder(running, resource))
    theirs = _normal(encode_metrics(reader.get_metrics_data()))
    assert ours == theirs
    assert len(ours["rl.setup.duration"][-1]) == 512


def _run_against(sink: Any, protocol: str, encoder: str) -> dict[Any, Any]:
    """Three steps of the fixture through a session of that encoder: what the receiver got."""
    sink.clear()
    running = async_tee.start_telemetry(
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.grpc_endpoint
            if protocol == "grpc"
            else sink.http_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc" if protocol == "grpc" else "http/protobuf",
            "ASYNC_TEE_ENCODER": encoder,
            "ASYNC_TEE_MIN_EXPORT_INTERVAL": "0",
            "ASYNC_TEE_RUN_ID": "job-7",
        }
    )
    assert isinstance(running, async_tee.Pipeline)
    (reader,) = running.exports.push_readers
    assert reader.encodes_tables == (encoder == "tables")  # the path under test
    for step in range(1, 4):
        for call in load_calls():
            async_tee.tee_rl_metrics_to_otel(
                call["metrics"], call["prefix"], step, call.get("step_finished", False)
            )
        assert async_tee.flush(10)
    assert async_tee.shutdown_telemetry(10)
    steps = [step for step, _ in sink.by_step("rl.reward.mean")]
    latest = {  # rl.step.time is each run's own wall time
        key: point.value
        for key, point in sink.latest().items()
        if key[0].startswith("rl.") and key[0] != "rl.step.time"
    }
    return {"steps": steps, "latest": latest}


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_receiver_gets_the_same_from_the_tables_as_from_the_sdk(sink, protocol):
    sdk = _run_against(sink, protocol, "sdk")
    tables = _run_against(sink, protocol, "tables")
    for run in (sdk, tables):  # step exports (a step may fold into the next), then the last
        assert set(run["steps"]) <= {1.0, 2.0, 3.0}
        assert run["steps"][-1] == 3.0
    assert tables["latest"] == sdk["latest"]  # every series, point and value alike
    assert len(tables["latest"]) > 40


def test_a_kept_request_updated_in_place_still_encodes_as_the_sdk_does(session):
    running, reader, resource = session
    encoder = _encoder(running, resource)
    builds = []
    for step in range(1, 7):  # a NaN at step 2 changes the sets; steps 4 to 6 repeat step 3's
        for call in load_calls():
            metrics = dict(call["metrics"])
            if call["prefix"] == "train" and step == 2 and "loss" in metrics:
                metrics["loss"] = math.nan
            if call["prefix"] == "train":
                metrics["reward"] = float(step)  # a value that changes every step
            async_tee.tee_rl_metrics_to_otel(
                metrics, call["prefix"], step, call.get("step_finished", False)
            )
        assert async_tee.flush(10)
        ours = _ours(running, encoder)
        assert ours == _normal(encode_metrics(reader.get_metrics_data())), step
        assert ours["rl.reward.mean"][-1][0][1] == ("as_double", float(step))
        builds.append(encoder.builds)
    assert builds[4] == builds[5]  # the last export updated the kept request in place


def test_an_exporter_asking_for_delta_keeps_the_sdks_way(sink, monkeypatch):
    # The SDK's exporter reads its preference from the process environment.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    running = async_tee.start_telemetry(
        environ={"OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint, "ASYNC_TEE_ENCODER": "tables"}
    )
    assert isinstance(running, async_tee.Pipeline)
    (reader,) = running.exports.push_readers
    assert not reader.encodes_tables  # the tables encode cumulative sums only
    assert async_tee.shutdown_telemetry(10)


def _starts(request: Any, name: str) -> dict[Any, int]:
    ((resource_metrics),) = request.resource_metrics
    return {
        _attributes(point.attributes): point.start_time_unix_nano
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
        if metric.name == name
        for point in getattr(metric, metric.WhichOneof("data")).data_points
    }


def test_a_cumulative_point_keeps_the_start_of_its_sets_first_export(session):
    """Cumulative: one start per attribute set, its first export's, through rebuilds."""
    running, _reader, resource = session
    encoder = _encoder(running, resource)
    tokens = {"vllm/prompt_tokens": 10}
    async_tee.tee_rl_metrics_to_otel(tokens, "train", 1, True)
    assert async_tee.flush(10)
    first = _starts(_decoded(encoder.request()), "rl.vllm.prompt_tokens")
    async_tee.tee_rl_metrics_to_otel({**tokens, "reward": 1.0}, "train", 2, True)  # a new series
    assert async_tee.flush(10)
    request = _decoded(encoder.request())  # rebuilt: the shape changed
    assert _starts(request, "rl.vllm.prompt_tokens") == first
    assert next(iter(first.values())) > 0
    exports = _starts(request, "async_tee.exports")
    later = _starts(_decoded(encoder.request()), "async_tee.exports")  # updated in place
    assert later == exports
    assert len(set(exports.values())) == 1  # every set there from the first export


def test_a_point_changing_type_is_rewritten_in_place(session):
    """One slot holds an int, a float, an int, an int past int64: its tag follows the value
    (the last is sent as a double); every point's time is the export's."""
    running, _reader, resource = session
    encoder = _encoder(running, resource)
    async_tee.tee_rl_metrics_to_otel({"reward": 0.5}, "train", 1, step_finished=True)
    assert async_tee.flush(10)
    (series,) = [
        s
        for s in (running.instruments.instruments(RL_METRIC_GROUP) or {}).values()
        if s.spec.name == "rl.reward.mean"
    ]
    builds = []
    for reward, expected in [
        (1, ("as_int", 1)),
        (2.5, ("as_double", 2.5)),
        (-3, ("as_int", -3)),
        (2**70, ("as_double", float(2**70))),
    ]:
        # The table as the worker leaves it after a step, holding this value.
        table = series.shown if series.shown is not None else series.points
        series.shown = {key: (reward, attrs) for key, (_v, attrs) in table.items()}
        request = _decoded(encoder.request())
        assert _normal(request)["rl.reward.mean"][-1][0][1] == expected
        times = {
            point.time_unix_nano
            for metric in request.resource_metrics[0].scope_metrics[0].metrics
            for point in getattr(metric, metric.WhichOneof("data")).data_points
        }
        assert len(times) == 1
        assert times.pop() > 0
        builds.append(encoder.builds)
    assert builds[0] == builds[1] == builds[2] == builds[3]  # written in place, not rebuilt


def test_an_encoded_request_over_the_http_size_limit_fails_as_the_sdk_drops_it(
    session, sink, caplog
):
    """The bytes go as they are, unless they pass ``max_request_size``: then nothing is sent,
    the export fails (counted by the reader), and it says why once."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult

    from async_tee._export.encode import sends_encoded, takes_requests

    running, _reader, resource = session
    async_tee.tee_rl_metrics_to_otel({"reward": 0.5}, "train", 1, step_finished=True)
    assert async_tee.flush(10)
    request = _encoder(running, resource).request()
    exporter_class = takes_requests(OTLPMetricExporter)
    assert exporter_class is not None
    endpoint = f"{sink.http_endpoint}/v1/metrics"
    small = exporter_class(endpoint=endpoint, max_request_size=len(request.data) - 1)
    large = exporter_class(endpoint=endpoint)
    try:
        assert sends_encoded(small)
        assert sends_encoded(large)
        with caplog.at_level("WARNING", logger="async_tee"):
            assert small.export(request) is MetricExportResult.FAILURE
        assert sink.requests.get("http", 0) == 0
        assert any("max_request_size" in r.getMessage() for r in caplog.records)
        assert large.export(request) is MetricExportResult.SUCCESS
        assert sink.request_sizes() == [("http", len(request.data), "identity")]
        assert sink.latest()[("rl.reward.mean", frozenset())].value == 0.5
    finally:
        small.shutdown()
        large.shutdown()


def _times(request: Any) -> set[int]:
    decoded = _decoded(request)
    return {
        point.time_unix_nano
        for scope in decoded.resource_metrics[0].scope_metrics
        for metric in scope.metrics
        for point in (*metric.gauge.data_points, *metric.sum.data_points)
    }


def test_requests_made_within_a_millisecond_are_a_millisecond_apart(session):
    """Two steps collected at once (a late worker catching up) stay two samples in a store
    that keeps one sample per series and millisecond (Prometheus, silently)."""
    running, _, resource = session
    encoder = _encoder(running, resource)
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1, step_finished=True)
    assert async_tee.flush(10)
    times = [_times(encoder.request()) for _ in range(5)]  # back to back: microseconds apart
    assert all(len(one) == 1 for one in times)  # one time per request, every point
    firsts = [min(one) for one in times]
    assert all(later - earlier >= 1_000_000 for earlier, later in itertools.pairwise(firsts))

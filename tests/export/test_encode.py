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
from async_tee._export.encode import TableEncoder


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
    return ExportMetricsServiceRequest.FromString(request.data)


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


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
        (
            "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
            "base2_exponential_bucket_histogram",
        ),
    ],
)
def test_a_preference_the_tables_do_not_encode_is_said_not_applied(sink, caplog, variable, value):
    """The requests are cumulative with explicit buckets, what Prometheus stores: a variable
    asking otherwise is said once at start, and the requests stay as they are."""
    async_tee.start_telemetry(
        environ={"OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint, variable: value}
    )
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1, step_finished=True)
    assert async_tee.shutdown_telemetry(10)
    (said,) = [r.getMessage() for r in caplog.records if variable in r.getMessage()]
    assert "not applied" in said
    sums = [p for p in sink.points() if p.name == "async_tee.exports"]
    assert sums
    assert all(p.temporality == "cumulative" for p in sums)


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

"""The request built from the tables equals the SDK's collection encoded, timestamps aside.

Both read the same session: the SDK through a real ``InMemoryMetricReader`` on the provider
the session records into, then ``encode_metrics``; the tables through ``TableEncoder``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from helpers import load_calls
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

import async_tee
from async_tee import __version__
from async_tee._rl_group import RL_METRIC_GROUP
from async_tee._series import SELF_METRIC_GROUP
from async_tee._table_encode import TableEncoder


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
            points = []
            for point in data.data_points:
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
    ours = _normal(_encoder(running, resource).request())
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
    ours = _normal(_encoder(running, resource).request())
    theirs = _normal(encode_metrics(reader.get_metrics_data()))
    assert ours == theirs
    assert len(ours["rl.setup.duration"][-1]) == 512

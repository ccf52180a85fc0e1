"""Sliced OTLP encoding: the request equals the SDK's own, message for message, and arrives."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

import async_tee
from async_tee._export import encode as _encode
from async_tee._export.encode import encode_in_slices, sliced
from async_tee._worker import gil as _gil


def _collected(calls, resources: int = 1, scopes: int = 1) -> MetricsData:
    """Real collected data: the fixture teed through the real SDK, on several meters."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], resource=Resource({"service.name": "t"}))
    try:
        async_tee.start_telemetry(provider)
        for call in calls:
            async_tee.tee_rl_metrics_to_otel(call["metrics"], call["prefix"], call["step"])
        assert async_tee.flush(10)
        for n in range(1, scopes):
            provider.get_meter(f"extra-{n}").create_counter(f"extra.{n}").add(n)
        data = reader.get_metrics_data()
        assert data is not None
    finally:
        async_tee.shutdown_telemetry(5)
        provider.shutdown()
    extra = [
        ResourceMetrics(
            Resource({"service.name": f"r{n}"}), data.resource_metrics[0].scope_metrics, ""
        )
        for n in range(1, resources)
    ]
    return MetricsData([*data.resource_metrics, *extra])


@pytest.mark.parametrize("per_slice", [1, 3, 8, 1000])
@pytest.mark.parametrize(("resources", "scopes"), [(1, 1), (1, 3), (2, 2)])
def test_the_sliced_request_equals_the_sdks_own(calls, per_slice, resources, scopes):
    data = _collected(calls, resources, scopes)
    metrics = sum(len(s.metrics) for r in data.resource_metrics for s in r.scope_metrics)
    assert metrics > 8  # more than one slice at the default
    assert encode_in_slices(data, per_slice) == encode_metrics(data)


def test_empty_data_and_empty_scopes_encode_as_the_sdk_does():
    empty = MetricsData([])
    assert encode_in_slices(empty) == encode_metrics(empty)
    scope = InstrumentationScope("empty")
    scope_only = MetricsData([ResourceMetrics(Resource({}), [ScopeMetrics(scope, [], "")], "")])
    assert encode_in_slices(scope_only) == encode_metrics(scope_only)


def test_slices_offer_the_gil_between_them(calls, monkeypatch):
    data = _collected(calls)
    spent = []
    monkeypatch.setattr(_gil.budget(), "spend", lambda: spent.append(1))
    encode_in_slices(data, 4)
    metrics = len(data.resource_metrics[0].scope_metrics[0].metrics)
    assert len(spent) == -(-metrics // 4)


def test_the_grpc_exporter_encodes_in_slices_and_one_without_the_hook_is_left_alone():
    exporter_class = sliced(OTLPMetricExporter)
    assert issubclass(exporter_class, OTLPMetricExporter)
    hook: object = exporter_class._translate_data
    assert hook is _encode.SlicedEncoding._translate_data

    class NoHook:
        pass

    assert sliced(NoHook) is NoHook


def test_a_step_exported_in_slices_arrives_whole(sink, calls):
    async_tee.start_telemetry(  # slices are the OTLP/gRPC exporter's
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.grpc_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        }
    )
    for call in calls:
        async_tee.tee_rl_metrics_to_otel(call["metrics"], call["prefix"], call["step"])
    assert async_tee.shutdown_telemetry(10)
    names = {p.name for p in sink.points()}
    assert {"rl.reward.mean", "rl.vllm.prompt_tokens", "rl.efficiency.seconds"} <= names
    assert len(names) > 20

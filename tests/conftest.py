"""Shared fixtures: a clean async_tee per test, real SDK readers, a real OTLP sink."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from async_tee import testing
from async_tee.sink import OtlpSink

FIXTURE = Path(__file__).parent / "fixtures" / "grpo_step.json"


def load_calls() -> list[dict[str, Any]]:
    """The fixture's log_metrics calls: step, prefix, metrics (and step_metric...)."""
    return json.loads(FIXTURE.read_text())["calls"]


def own_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("async-tee")]


@pytest.fixture(autouse=True)
def clean_async_tee() -> Iterator[None]:
    """Every test starts with shipped declarations and no telemetry, and leaks no thread."""
    testing.reset()
    yield
    testing.reset()
    leaked = own_threads()
    assert not leaked, f"leaked threads: {leaked}"


@pytest.fixture
def calls() -> list[dict[str, Any]]:
    return load_calls()


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def provider(reader: InMemoryMetricReader) -> Iterator[MeterProvider]:
    mp = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    yield mp
    testing.reset()
    mp.shutdown()


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s


Point = tuple[str, frozenset[tuple[str, Any]]]


def collect(reader: InMemoryMetricReader, prefix: str = "rl.") -> dict[Point, Any]:
    """Every data point the reader collects now, keyed by (series, attributes)."""
    out: dict[Point, Any] = {}
    data = reader.get_metrics_data()
    if data is None:
        return out
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if not metric.name.startswith(prefix):
                    continue
                for point in metric.data.data_points:
                    key = (metric.name, frozenset(dict(point.attributes or {}).items()))
                    out[key] = getattr(point, "value", point)
    return out


def units(reader: InMemoryMetricReader) -> dict[str, tuple[str, str]]:
    """{series: (unit, data type name)} of everything collected now."""
    out = {}
    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics if data else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                out[metric.name] = (metric.unit or "", type(metric.data).__name__)
    return out

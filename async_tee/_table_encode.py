"""An export's OTLP request built from async_tee's own tables, not from the SDK's collection.

The registry's tables already hold what an export carries: each gauge's published points,
each running total, the lag histogram's buckets, and the observable rows' callbacks.
:class:`TableEncoder` builds the ``ExportMetricsServiceRequest`` the SDK's collection and
``encode_metrics`` would build from the same history (the same resource, scope, metrics,
points, attributes, values, units and descriptions; timestamps are this export's), one
series at a time with an offer of the GIL between them (``_gil``), so no part of it holds
the GIL for long. Start times follow the SDK's: a cumulative point starts when its
attribute set was first exported (or, for the histogram, first recorded); a gauge point
has none. Imported only when async_tee builds an OTLP exporter.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from async_tee._gil import budget
from async_tee.registry import _Histogram, _LastValue, _Observed, _RunningTotal

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

    from async_tee.registry import InstrumentRegistry, _Series

_CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
_SUMS = {"observable_counter": True, "observable_up_down_counter": False}


class TableEncoder:
    """Builds one export's request from one registry's tables (one meter, one scope)."""

    def __init__(
        self,
        registry: InstrumentRegistry,
        groups: Sequence[str],
        resource: Resource,
        scope_name: str,
        scope_version: str,
    ) -> None:
        """Prepare; :meth:`request` builds.

        Args:
            registry: The session's instrument registry.
            groups: The groups to export, in the order their instruments were created.
            resource: The provider's resource.
            scope_name: The meter's name (the instrumentation scope).
            scope_version: The meter's version.
        """
        self._registry = registry
        self._groups = tuple(groups)
        self._resource = [_key_value(k, v) for k, v in resource.attributes.items()]
        self._resource_schema = resource.schema_url or ""
        self._scope = (scope_name, scope_version)
        self._starts: dict[tuple[str, Any], int] = {}  # (series, attribute key): first export

    def request(self) -> Any:
        """This export's request. Never raises: a series that fails is left out (counted)."""
        now = time.time_ns()
        spend = budget().spend
        request = ExportMetricsServiceRequest()
        resource_metrics = request.resource_metrics.add()
        resource_metrics.resource.attributes.extend(self._resource)
        resource_metrics.schema_url = self._resource_schema
        scope_metrics = resource_metrics.scope_metrics.add()
        scope_metrics.scope.name, scope_metrics.scope.version = self._scope
        for group in self._groups:
            instruments = self._registry.instruments(group) or {}
            for series in instruments.values():
                try:
                    self._encode(series, scope_metrics, now)
                except Exception:  # noqa: BLE001 - one series must not cost the export
                    self._registry.counts.errors += 1
                spend()
        return request

    def _encode(self, series: _Series, scope_metrics: Any, now: int) -> None:
        spec = series.spec
        if isinstance(series, _Histogram):
            self._histogram(series, scope_metrics, now)
            return
        if isinstance(series, _LastValue):
            shown = series.shown
            points = series.points.copy() if shown is None else shown
            observed: list[tuple[Any, Any]] = [
                (value, attributes.mapping) for value, attributes in points.values()
            ]
            monotonic = series.monotonic if isinstance(series, _RunningTotal) else None
        elif isinstance(series, _Observed):
            observed = [(o.value, o.attributes or {}) for o in series.callback(_OPTIONS)]
            monotonic = _SUMS.get(spec.kind)
        else:
            return  # unavailable: its creation failed and warned
        if not observed:
            return  # the SDK leaves a metric with no point out
        metric = scope_metrics.metrics.add()
        metric.name, metric.description, metric.unit = spec.name, spec.description, spec.unit
        if monotonic is None:
            data = metric.gauge
        else:
            data = metric.sum
            data.aggregation_temporality = _CUMULATIVE
            data.is_monotonic = monotonic
        for value, attributes in observed:
            point = data.data_points.add()
            point.attributes.extend(_key_value(k, v) for k, v in attributes.items())
            point.time_unix_nano = now
            if monotonic is not None:
                point.start_time_unix_nano = self._start(spec.name, attributes, now)
            if isinstance(value, int) and not isinstance(value, bool):
                point.as_int = value
            else:
                point.as_double = float(value)

    def _histogram(self, series: _Histogram, scope_metrics: Any, now: int) -> None:
        points = list(series.points.values())
        if not points:
            return
        spec = series.spec
        metric = scope_metrics.metrics.add()
        metric.name, metric.description, metric.unit = spec.name, spec.description, spec.unit
        data = metric.histogram
        data.aggregation_temporality = _CUMULATIVE
        for recorded in points:
            point = data.data_points.add()
            point.attributes.extend(
                _key_value(k, v) for k, v in recorded.attributes.mapping.items()
            )
            point.start_time_unix_nano = recorded.start_ns
            point.time_unix_nano = now
            point.count = sum(recorded.counts)
            point.sum = recorded.sum
            point.bucket_counts.extend(recorded.counts)
            point.explicit_bounds.extend(series.bounds)
            point.min, point.max = recorded.min, recorded.max

    def _start(self, name: str, attributes: Any, now: int) -> int:
        key = (name, tuple(sorted(attributes.items())))
        return self._starts.setdefault(key, now)


class _Options:
    """The ``CallbackOptions`` an observable row's callback gets (no timeout)."""

    timeout_millis = 10_000.0


_OPTIONS: Any = _Options()


def _key_value(key: str, value: Any) -> KeyValue:
    """One attribute as OTLP encodes it (str, bool, int, float, or a sequence of them)."""
    kv = KeyValue(key=key)
    _set_any(kv.value, value)
    return kv


def _set_any(any_value: Any, value: Any) -> None:
    if isinstance(value, bool):
        any_value.bool_value = value
    elif isinstance(value, int):
        any_value.int_value = value
    elif isinstance(value, float):
        any_value.double_value = value
    elif isinstance(value, str):
        any_value.string_value = value
    elif isinstance(value, Iterable):
        for item in value:
            _set_any(any_value.array_value.values.add(), item)
    else:
        any_value.string_value = str(value)

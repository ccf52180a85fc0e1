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
from collections.abc import Iterable, KeysView, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from async_tee._gil import budget
from async_tee._selfmetrics import StatsReader
from async_tee.registry import _Histogram, _LastValue, _Observed, _RunningTotal

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

    from async_tee.registry import InstrumentRegistry, _Series

_CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
SPEND_EVERY = 16
"""Points gathered or written between two offers of the GIL (``_gil``); a series with more
points is one unit, and an observable callback always is."""
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
        self._request: Any = None  # the last request built, kept for updates in place
        self._shape: tuple[tuple[int, KeysView[Any]], ...] = ()  # its series and their sets
        self._messages: dict[int, dict[Any, Any]] = {}  # its point messages: series -> set

    def request(self, timeout_s: float | None = None) -> Any:
        """This export's request, a message of its own. Never raises.

        A series that fails is left out and counted. While every series holds the same
        attribute sets as at the last export, the request kept from it only has its
        values and times written again; else it is built afresh.
        """
        now = time.time_ns()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        entries = self._gather(deadline)
        shape = tuple((index, points.keys()) for index, _, _, points in entries)  # set-like
        if self._request is None or shape != self._shape:
            self._request = self._build(entries, now)
            self._shape = shape
        self._fill(entries, now)
        copy = ExportMetricsServiceRequest()
        copy.CopyFrom(self._request)  # the exporting thread sends it while the next is made
        return copy

    def _gather(
        self, deadline: float | None = None
    ) -> list[tuple[int, _Series, bool | None, Mapping[Any, tuple[Any, Any]]]]:
        """Each series with points: (index, series, monotonic, {attribute key: (v, attrs)}).

        Raises:
            TimeoutError: The callbacks ran past ``deadline`` (monotonic), as the SDK's
                collection fails past its timeout (``OTEL_METRIC_EXPORT_TIMEOUT``).
        """
        spend = budget().spend
        entries = []
        index = -1
        unspent = 0  # points gathered since the last spend: a slice every SPEND_EVERY
        for group in self._groups:
            for series in (self._registry.instruments(group) or {}).values():
                index += 1
                try:
                    found = _points_of(series)
                except Exception:  # noqa: BLE001 - one series must not cost the export
                    self._registry.counts.errors += 1
                    found = None
                if found is not None and found[1]:
                    entries.append((index, series, found[0], found[1]))
                    unspent += len(found[1])
                if isinstance(series, _Observed):  # an owner's callback: its own unit
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError("the observable callbacks ran past the timeout")
                    unspent = SPEND_EVERY
                if unspent >= SPEND_EVERY:
                    spend()
                    unspent = 0
        return entries

    def _build(self, entries: list[Any], now: int) -> Any:
        """A request with every series' metric, every point's attributes and start, no values.

        A cumulative point starts at its attribute set's first export (kept across builds).
        """
        request = ExportMetricsServiceRequest()
        resource_metrics = request.resource_metrics.add()
        resource_metrics.resource.attributes.extend(self._resource)
        resource_metrics.schema_url = self._resource_schema
        scope_metrics = resource_metrics.scope_metrics.add()
        scope_metrics.scope.name, scope_metrics.scope.version = self._scope
        self._messages = {}
        spend = budget().spend
        for index, series, monotonic, points in entries:
            spec = series.spec
            metric = scope_metrics.metrics.add()
            metric.name, metric.description, metric.unit = spec.name, spec.description, spec.unit
            if isinstance(series, _Histogram):
                data = metric.histogram
                data.aggregation_temporality = _CUMULATIVE
            elif monotonic is None:
                data = metric.gauge
            else:
                data = metric.sum
                data.aggregation_temporality = _CUMULATIVE
                data.is_monotonic = monotonic
            starts = monotonic is not None and not isinstance(series, _Histogram)
            messages = self._messages[index] = {}
            for key, (_value, attributes) in points.items():
                point = data.data_points.add()
                mapping = getattr(attributes, "mapping", attributes)  # FrozenAttributes, or a dict
                point.attributes.extend(_key_value(k, v) for k, v in mapping.items())
                if starts:
                    point.start_time_unix_nano = self._starts.setdefault((spec.name, key), now)
                messages[key] = point
            spend()
        return request

    def _fill(self, entries: list[Any], now: int) -> None:
        """Write every point's value and time into its message of the kept request."""
        spend = budget().spend
        unspent = 0
        for index, series, _monotonic, points in entries:
            unspent += len(points)
            if unspent >= SPEND_EVERY:
                spend()
                unspent = 0
            messages = self._messages[index]
            if isinstance(series, _Histogram):
                for key, (value, _attributes) in points.items():
                    point = messages[key]
                    point.time_unix_nano = now
                    _fill_histogram(point, value, series.bounds)
                continue
            for key, (value, _attributes) in points.items():
                point = messages[key]
                point.time_unix_nano = now
                if isinstance(value, int) and not isinstance(value, bool):
                    point.as_int = value
                else:
                    point.as_double = float(value)


def _points_of(series: _Series) -> tuple[bool | None, Mapping[Any, tuple[Any, Any]]] | None:
    """A series' points now: (monotonic or None for a gauge, {key: (value, attributes)}).

    The attributes are a ``FrozenAttributes`` or a dict. A last-value series' own table is
    returned as it is: the one shown (replaced at each step, never changed) or a copy.
    """
    if isinstance(series, _LastValue):
        shown = series.shown
        monotonic = series.monotonic if isinstance(series, _RunningTotal) else None
        return monotonic, series.points.copy() if shown is None else shown
    if isinstance(series, _Histogram):
        return None, {key: (point, point.attributes) for key, point in series.points.items()}
    if isinstance(series, _Observed):
        if isinstance(series.spec.callback, StatsReader):  # async_tee's own: no Observations
            return _SUMS.get(series.spec.kind), series.spec.callback.points()
        observed: dict[Any, tuple[Any, Any]] = {}
        for observation in series.callback(_OPTIONS):
            attributes = dict(observation.attributes or {})
            observed[_hashable(attributes)] = (observation.value, attributes)
        return _SUMS.get(series.spec.kind), observed
    return None  # unavailable: its creation failed and warned


def _hashable(attributes: dict[str, Any]) -> Any:
    """An attribute set's key: its items, sorted, sequences as tuples (as the SDK keys it)."""
    if not attributes:
        return ()
    if len(attributes) == 1:  # most of async_tee's own sets: nothing to sort
        ((key, value),) = attributes.items()
        return ((key, tuple(value) if isinstance(value, (list, tuple)) else value),)
    return tuple(
        sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in attributes.items())
    )


def _fill_histogram(point: Any, recorded: Any, bounds: tuple[float, ...]) -> None:
    point.start_time_unix_nano = recorded.start_ns
    point.count = sum(recorded.counts)
    point.sum = recorded.sum
    del point.bucket_counts[:]
    point.bucket_counts.extend(recorded.counts)
    if not point.explicit_bounds:
        point.explicit_bounds.extend(bounds)
    point.min, point.max = recorded.min, recorded.max


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

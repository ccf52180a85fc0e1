"""An OTLP export request built from async_tee's tables, not the SDK's (docs/semantics.md §7)."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain
from operator import eq
from typing import TYPE_CHECKING, Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from async_tee._declare.attributes import FrozenAttributes
from async_tee._tables.registry import (
    HeldValue,
    Histogram,
    HistogramPoint,
    LastValue,
    Observed,
    RunningTotal,
)
from async_tee._worker.gil import budget

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

    from async_tee._tables.registry import Instrument, InstrumentRegistry

_Points = dict[Any, tuple[Any, Any]]
"""A series' points: {attribute key: (value, attributes)}."""
_CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
SPEND_EVERY = 64
"""Points gathered between two offers of the GIL (``_worker/gil``); a series with more points is
one unit, and an observable callback always is."""
_MILLISECOND_NS = 1_000_000
FILL_EVERY = 256
"""Points written between two offers of the GIL: a few tens of µs of C calls."""
_SUMS = {"observable_counter": True, "observable_up_down_counter": False}


class EncodedRequest:
    """An ``ExportMetricsServiceRequest`` already serialized, and how many points it holds."""

    __slots__ = ("data", "points")

    def __init__(self, data: bytes, points: int) -> None:
        self.data = data
        self.points = points


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
        self._template: _Template | None = None  # the last request's bytes, for updates in place
        self._indices: list[int] = []  # its series (their places in the groups) ...
        self._keys: list[tuple[Any, ...]] = []  # ... and their attribute sets, in order
        self.builds = 0  # how many times the request was built afresh
        self._last_now = 0  # the last request's point time (ns)

    def request(self, timeout_s: float | None = None) -> EncodedRequest:
        """This export's request, serialized. Never raises but ``TimeoutError``.

        A series that fails is left out and counted. While every series holds the same
        attribute sets as at the last export, the bytes kept from it only have their
        values and times written again; else they are built afresh.
        """
        # Each request's points at least 1 ms after the last one's: two steps collected within
        # a millisecond (a late worker catching up) would be one sample where times have
        # millisecond resolution (Prometheus keeps one per series and millisecond, silently).
        now = self._last_now = max(time.time_ns(), self._last_now + _MILLISECOND_NS)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        gathered = self._gather(deadline)
        if self._template is None or not self._same_shape(gathered):
            self._template = self._build(gathered, now)
        return EncodedRequest(self._fill(gathered, now), self._template.points)

    def _gather(self, deadline: float | None = None) -> _Gathered:
        """Each series with points, and its points now.

        Nothing is made per series that outlives this export (only lists of what the
        tables hold), so an export at thousands of series adds next to nothing to what
        the garbage collector must track.

        Raises:
            TimeoutError: The callbacks ran past ``deadline`` (monotonic), as the SDK's
                collection fails past its timeout (``OTEL_METRIC_EXPORT_TIMEOUT``).
        """
        spend = budget().spend
        gathered = _Gathered()
        indices, series_list, points_list = gathered.indices, gathered.series, gathered.points
        index = -1
        unspent = 0  # points gathered since the last spend: a slice every SPEND_EVERY
        for group in self._groups:
            for series in (self._registry.instruments(group) or {}).values():
                index += 1
                points: _Points | None
                if isinstance(series, LastValue):  # most series: their own table, as it is:
                    shown = series.shown  # the one shown (replaced each step, never changed)
                    points = series.points.copy() if shown is None else shown
                else:
                    try:
                        points = _points_of(series)
                    except Exception:  # noqa: BLE001 - one series must not cost the export
                        self._registry.counts.errors += 1
                        points = None
                    if isinstance(series, Observed):  # an owner's callback: its own unit
                        if deadline is not None and time.monotonic() > deadline:
                            raise TimeoutError("the observable callbacks ran past the timeout")
                        unspent = SPEND_EVERY
                if points:
                    indices.append(index)
                    series_list.append(series)
                    points_list.append(points)
                    unspent += len(points)
                if unspent >= SPEND_EVERY:
                    spend()
                    unspent = 0
        return gathered

    def _same_shape(self, gathered: _Gathered) -> bool:
        """Whether the kept request holds these series and sets, in this order.

        Its slots are matched by position. Compared in C; no key tuple outlives its test.
        """
        return gathered.indices == self._indices and all(
            map(eq, map(tuple, gathered.points), self._keys)
        )

    def _build(self, gathered: _Gathered, now: int) -> _Template:
        """The request's bytes (every metric, every point's attributes and start), and slots.

        The slots say where each point's time and value go: each is written with a marker
        of its own, then found in the serialized bytes. A cumulative point starts at its
        attribute set's first export (kept across builds).
        """
        request = ExportMetricsServiceRequest()
        resource_metrics = request.resource_metrics.add()
        resource_metrics.resource.attributes.extend(self._resource)
        resource_metrics.schema_url = self._resource_schema
        scope_metrics = resource_metrics.scope_metrics.add()
        scope_metrics.scope.name, scope_metrics.scope.version = self._scope
        marks = _Markers()
        slots: list[Any] = []  # per point, in order: its markers
        spend = budget().spend
        for series, points in zip(gathered.series, gathered.points, strict=True):
            monotonic = _monotonic(series)
            spec = series.spec
            metric = scope_metrics.metrics.add()
            metric.name, metric.description, metric.unit = spec.name, spec.description, spec.unit
            bounds = series.bounds if isinstance(series, Histogram) else None
            histogram = bounds is not None
            if histogram:
                data = metric.histogram
                data.aggregation_temporality = _CUMULATIVE
            elif monotonic is None:
                data = metric.gauge
            else:
                data = metric.sum
                data.aggregation_temporality = _CUMULATIVE
                data.is_monotonic = monotonic
            starts = monotonic is not None and not histogram
            for key, (value, attributes) in points.items():
                point = data.data_points.add()
                mapping: Mapping[str, Any] = (  # a FrozenAttributes, or a dict
                    attributes.mapping if isinstance(attributes, FrozenAttributes) else attributes
                )
                point.attributes.extend(_key_value(k, v) for k, v in mapping.items())
                if starts:
                    point.start_time_unix_nano = self._starts.setdefault((spec.name, key), now)
                point.time_unix_nano = time_mark = marks.new()
                if bounds is not None:
                    point.explicit_bounds.extend(bounds)
                    buckets = [marks.new() for _ in value.counts]
                    point.bucket_counts.extend(buckets)
                    point.start_time_unix_nano, point.count = marks.new(), marks.new()
                    point.sum, point.min, point.max = (marks.new_double() for _ in range(3))
                    fields = (point.start_time_unix_nano, point.count, *buckets[:1])
                    doubles = (point.sum, point.min, point.max)
                    slots.append((time_mark, (*fields, *map(_bits, doubles))))
                else:
                    point.as_int = value_mark = marks.new()
                    slots.append((time_mark, value_mark))
            spend()
        self._indices = gathered.indices
        self._keys = [tuple(points) for points in gathered.points]
        self.builds += 1
        return _Template(request.SerializeToString(), marks, slots)

    def _fill(self, gathered: _Gathered, now: int) -> bytes:
        """The kept bytes with every point's value and time written: this export's request.

        One pass over every point in order (the kept slots are in the same order), in runs
        of ``FILL_EVERY`` with an offer of the GIL between them.
        """
        template = self._template
        assert template is not None
        buffer, slots = template.buffer, template.slots
        spend = budget().spend
        write_double, write_int = _TIME_DOUBLE.pack_into, _TIME_INT.pack_into
        points: Iterator[tuple[Any, Any]] = chain.from_iterable(map(dict.values, gathered.points))
        for start in range(0, len(slots), FILL_EVERY):
            spend()
            # The slots first: zip stops on them without taking a point past the run.
            for at, (value, _attributes) in zip(
                slots[start : start + FILL_EVERY], points, strict=False
            ):
                # A number point's time, its value's tag and its value, in one write.
                if type(value) is float:  # most values: no other test
                    write_double(buffer, at, now, _AS_DOUBLE, value)
                elif type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
                    write_int(buffer, at, now, _AS_INT, value)
                elif type(value) is HistogramPoint:  # its slot: (time, the other fields)
                    _UINT64.pack_into(buffer, at[0], now)
                    _fill_histogram(buffer, at[1], value)
                elif isinstance(value, int) and not isinstance(value, bool):  # an int's subclass
                    _fill_int(buffer, at, now, value)
                else:  # a bool or another number: a double
                    write_double(buffer, at, now, _AS_DOUBLE, float(value))
        return bytes(buffer)


def _points_of(series: Instrument) -> _Points | None:
    """A histogram's or an observable series' points now, or None if it is unavailable.

    ``{key: (value, attributes)}``, the attributes a ``FrozenAttributes`` or a dict. A
    last-value series' own table ``_gather`` reads itself.
    """
    if isinstance(series, Histogram):
        return {key: (point, point.attributes) for key, point in series.points.items()}
    if isinstance(series, Observed):
        if series.reader is not None:  # async_tee's own: no Observations
            return series.reader.points()
        observed: dict[Any, tuple[Any, Any]] = {}
        for observation in series.callback(_OPTIONS):
            attributes = dict(observation.attributes or {})
            observed[_hashable(attributes)] = (observation.value, attributes)
        return observed
    return None  # unavailable: its creation failed and warned


def _monotonic(series: Instrument) -> bool | None:
    """A sum's monotonicity, or None for a gauge or the histogram."""
    if isinstance(series, RunningTotal):
        return series.monotonic
    if isinstance(series, HeldValue):  # a held counter's total: a monotonic sum
        return True if series.spec.kind == "counter" else None
    if isinstance(series, Observed):
        return _SUMS.get(series.spec.kind)
    return None


class _Gathered:
    """One export's series with points: their places in the groups, the series, their points."""

    __slots__ = ("indices", "points", "series")

    def __init__(self) -> None:
        self.indices: list[int] = []
        self.series: list[Instrument] = []
        self.points: list[_Points] = []


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


def _fill_int(buffer: bytearray, at_time: int, now: int, value: int) -> None:
    """An int (an ``int`` subclass too) as the SDK sends it, or a double past int64."""
    if _INT64_MIN <= value <= _INT64_MAX:
        _TIME_INT.pack_into(buffer, at_time, now, _AS_INT, int(value))
    else:
        _TIME_DOUBLE.pack_into(buffer, at_time, now, _AS_DOUBLE, float(value))


def _fill_histogram(buffer: bytearray, at: tuple[int, ...], recorded: Any) -> None:
    """A histogram point's start, count, buckets, sum, min and max, at their offsets."""
    counts = recorded.counts
    at_start, at_count, *at_buckets, at_sum, at_min, at_max = at
    _UINT64.pack_into(buffer, at_start, recorded.start_ns)
    _UINT64.pack_into(buffer, at_count, sum(counts))
    if at_buckets:
        struct.pack_into(f"<{len(counts)}Q", buffer, at_buckets[0], *counts)
    _DOUBLE.pack_into(buffer, at_sum, recorded.sum)
    _DOUBLE.pack_into(buffer, at_min, recorded.min)
    _DOUBLE.pack_into(buffer, at_max, recorded.max)


_TIME_DOUBLE = struct.Struct("<QBd")  # a number point's time, its value's tag, its value
_TIME_INT = struct.Struct("<QBq")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
_AS_DOUBLE = 0x21  # NumberDataPoint.as_double: field 4, 64-bit
_AS_INT = 0x31  # NumberDataPoint.as_int: field 6, 64-bit
_SIGNATURE = bytes((0xA7, 0xF5, 0x3F))
"""A marker's three high bytes (little-endian, last): as a double, about 1.353; the five
low bytes count markers. No valid UTF-8 string holds a marker (0xA7 after 0x00 is not
UTF-8), and an attribute or bound that is a marker's exact double is not expected."""


def _bits(value: float) -> int:
    return int(_UINT64.unpack(_DOUBLE.pack(value))[0])


class _Markers:
    """A distinct 64-bit marker per slot of a request being built."""

    def __init__(self) -> None:
        self.issued: dict[bytes, int] = {}  # marker's bytes -> marker

    def new(self) -> int:
        """A marker for a fixed-width integer field (its bytes: a count, then the signature)."""
        marker = int.from_bytes(len(self.issued).to_bytes(5, "little") + _SIGNATURE, "little")
        self.issued[marker.to_bytes(8, "little")] = marker
        return marker

    def new_double(self) -> float:
        """A marker for a double field: a finite double with a marker's bits."""
        return float(_DOUBLE.unpack(self.new().to_bytes(8, "little"))[0])


class _Template:
    """A request's bytes, and where each point's time and value go in them."""

    __slots__ = ("buffer", "points", "slots")

    def __init__(self, data: bytes, marks: _Markers, marked: list[Any]) -> None:
        """Find every marker once in ``data``; ``marked`` holds each point's, in order.

        A number point's markers are (time, value); a histogram point's (time, its other
        fields). Its slot is the offset of its time, or for a histogram point (the time's
        offset, the other fields' offsets).

        Raises:
            RuntimeError: A marker is missing or found twice, or a number point's value
                does not follow its time (the export fails, counted).
        """
        self.buffer = bytearray(data)
        found: dict[int, int] = {}  # marker -> offset
        issued, start = marks.issued, self.buffer.find(_SIGNATURE)
        while start >= 0:
            marker = issued.get(bytes(self.buffer[start - 5 : start + 3]))
            if marker is not None:
                if marker in found:
                    raise RuntimeError("an OTLP request's marker was found twice")
                found[marker] = start - 5
            start = self.buffer.find(_SIGNATURE, start + 1)
        if len(found) != len(issued):
            raise RuntimeError("an OTLP request's marker was not found")
        self.slots: list[Any] = []
        for time_mark, value_marks in marked:
            at_time = found[time_mark]
            if isinstance(value_marks, tuple):  # a histogram point
                self.slots.append((at_time, tuple(found[mark] for mark in value_marks)))
                continue
            # Serialized in field order, a value (field 4 or 6) follows its time (3).
            if found[value_marks] != at_time + 9 or self.buffer[at_time + 8] != _AS_INT:
                raise RuntimeError("an OTLP point's value does not follow its time")
            self.slots.append(at_time)
        self.points = len(self.slots)


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

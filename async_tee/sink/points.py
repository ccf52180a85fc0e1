"""Owns ``ReceivedPoint`` and the decoding of OTLP metrics export requests into them."""

from __future__ import annotations

import base64
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, Metric

__all__ = ["ReceivedPoint", "received_points"]

_TEMPORALITY = {
    AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA: "delta",
    AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE: "cumulative",
}

# Which resource attribute names the sender, in order of preference, and how it is shown.
_SENDER_KEYS = (("service.instance.id", "{}"), ("rl.rank", "rank {}"), ("service.name", "{}"))


@dataclass(frozen=True)
class ReceivedPoint:
    """One data point received by the sink, flattened together with its metric metadata.

    Attributes:
        protocol: Transport it arrived on, ``"grpc"`` or ``"http"``.
        resource: Resource attributes of the exporting process.
        scope: Instrumentation scope (meter) name.
        name: Metric name.
        unit: Metric unit.
        description: Metric description.
        kind: ``"gauge"``, ``"sum"``, ``"histogram"``, ``"exponential_histogram"`` or
            ``"summary"``.
        monotonic: Whether a sum is monotonic; ``None`` for other kinds.
        temporality: ``"cumulative"`` or ``"delta"`` for sums and (exponential) histograms;
            ``None`` otherwise or when unspecified.
        attributes: Point attributes decoded to Python values (``str``, ``bool``, ``int``,
            ``float``, ``bytes``, ``list`` for arrays, ``dict`` for key-value lists).
        value: ``as_double`` or ``as_int`` of a number point; ``None`` for distributions.
        value_type: ``"double"`` or ``"int"`` for number points, ``"histogram"`` otherwise.
        count: Observation count of a distribution point; ``None`` for number points.
        sum: Sum of a distribution point when present; ``None`` otherwise.
        bucket_counts: Bucket counts of a histogram (positive-range buckets of an
            exponential histogram); empty otherwise.
        explicit_bounds: Explicit bucket boundaries of a histogram; empty otherwise.
        time_unix_nano: Timestamp of the point.
    """

    protocol: str
    resource: dict[str, Any]
    scope: str
    name: str
    unit: str
    description: str
    kind: str
    monotonic: bool | None
    temporality: str | None
    attributes: dict[str, Any] = field(default_factory=dict)
    value: float | int | None = None
    value_type: str = "histogram"
    count: int | None = None
    sum: float | None = None
    bucket_counts: tuple[int, ...] = ()
    explicit_bounds: tuple[float, ...] = ()
    time_unix_nano: int = 0

    @property
    def sender(self) -> str | None:
        """A compact name for the process that sent the point, from its resource.

        The resource's ``service.instance.id`` when present (async_tee sets it to
        ``<run id>/rank-<N>``, or ``<run id>/<host>/pid-<pid>``), else ``rank <rl.rank>``,
        else ``service.name``; None when the resource has none of them.
        """
        for key, label in _SENDER_KEYS:
            value = self.resource.get(key)
            if value is not None and value != "":
                return label.format(value)
        return None

    def as_dict(self) -> dict[str, Any]:
        """The point as a JSON-ready dict: one line of ``async-tee sink --json``.

        Keys: ``protocol``, ``resource``, ``scope``, ``name``, ``kind``, ``unit``,
        ``attributes``, then ``value`` for a number point or ``count`` and ``sum`` for a
        distribution, and ``time_unix_nano``. Every value is safe for strict JSON
        (``json.dumps(..., allow_nan=False)``): ``bytes`` become base64 strings (as in
        OTLP/JSON), tuples become lists, and a non-finite float, which JSON cannot
        represent, becomes the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``.
        """
        out: dict[str, Any] = {
            "protocol": self.protocol,
            "resource": _json_safe(self.resource),
            "scope": self.scope,
            "name": self.name,
            "kind": self.kind,
            "unit": self.unit,
            "attributes": _json_safe(self.attributes),
        }
        if self.value_type == "histogram":
            out["count"] = self.count
            out["sum"] = _json_safe(self.sum)
        else:
            out["value"] = _json_safe(self.value)
        out["time_unix_nano"] = self.time_unix_nano
        return out


def _json_safe(value: Any) -> Any:
    """Return ``value`` with bytes, tuples and non-finite floats made JSON-safe (see as_dict)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    return value


def _decode_any(value: AnyValue) -> Any:
    """Convert an OTLP ``AnyValue`` to the equivalent Python value."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "bool_value":
        return value.bool_value
    if which == "int_value":
        return value.int_value
    if which == "double_value":
        return value.double_value
    if which == "bytes_value":
        return value.bytes_value
    if which == "array_value":
        return [_decode_any(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return _decode_attributes(value.kvlist_value.values)
    if which == "string_value_strindex":
        return value.string_value_strindex
    return None


def _decode_attributes(attributes: Any) -> dict[str, Any]:
    """Convert a repeated ``KeyValue`` field to a dict."""
    result: dict[str, Any] = {}
    item: KeyValue
    for item in attributes:
        result[item.key] = _decode_any(item.value)
    return result


def received_points(request: ExportMetricsServiceRequest, protocol: str) -> list[ReceivedPoint]:
    """Flatten an export request into one ``ReceivedPoint`` per data point, in request order.

    Args:
        request: The decoded ``ExportMetricsServiceRequest``.
        protocol: Transport it arrived on, ``"grpc"`` or ``"http"``.

    Returns:
        The points of every metric of every scope of every resource.
    """
    received: list[ReceivedPoint] = []
    for resource_metrics in request.resource_metrics:
        resource = _decode_attributes(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            scope = scope_metrics.scope.name
            for metric in scope_metrics.metrics:
                received.extend(_flatten_metric(metric, protocol, resource, scope))
    return received


def _flatten_metric(
    metric: Metric, protocol: str, resource: dict[str, Any], scope: str
) -> Iterator[ReceivedPoint]:
    """Yield one ``ReceivedPoint`` per data point of ``metric``."""
    kind = metric.WhichOneof("data")
    if kind is None:  # a metric without data has no points
        return

    def point(data_point: Any, **fields: Any) -> ReceivedPoint:
        # What every kind shares: the metric's metadata and the point's attributes and time.
        return ReceivedPoint(
            protocol=protocol,
            resource=resource,
            scope=scope,
            name=metric.name,
            unit=metric.unit,
            description=metric.description,
            kind=kind,
            attributes=_decode_attributes(data_point.attributes),
            time_unix_nano=data_point.time_unix_nano,
            **fields,
        )

    if kind == "gauge" or kind == "sum":
        if kind == "sum":
            monotonic: bool | None = metric.sum.is_monotonic
            temporality = _TEMPORALITY.get(metric.sum.aggregation_temporality)
            number_points = metric.sum.data_points
        else:
            monotonic, temporality = None, None
            number_points = metric.gauge.data_points
        for npoint in number_points:
            is_int = npoint.WhichOneof("value") == "as_int"
            yield point(
                npoint,
                monotonic=monotonic,
                temporality=temporality,
                value=npoint.as_int if is_int else npoint.as_double,
                value_type="int" if is_int else "double",
            )
    elif kind == "histogram":
        temporality = _TEMPORALITY.get(metric.histogram.aggregation_temporality)
        for hpoint in metric.histogram.data_points:
            yield point(
                hpoint,
                monotonic=None,
                temporality=temporality,
                count=hpoint.count,
                sum=hpoint.sum if hpoint.HasField("sum") else None,
                bucket_counts=tuple(hpoint.bucket_counts),
                explicit_bounds=tuple(hpoint.explicit_bounds),
            )
    elif kind == "exponential_histogram":
        temporality = _TEMPORALITY.get(metric.exponential_histogram.aggregation_temporality)
        for epoint in metric.exponential_histogram.data_points:
            yield point(
                epoint,
                monotonic=None,
                temporality=temporality,
                count=epoint.count,
                sum=epoint.sum if epoint.HasField("sum") else None,
                bucket_counts=tuple(epoint.positive.bucket_counts),
            )
    elif kind == "summary":
        for spoint in metric.summary.data_points:
            yield point(
                spoint, monotonic=None, temporality=None, count=spoint.count, sum=spoint.sum
            )

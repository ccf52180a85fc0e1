"""OTLP encoding a few metrics at a time, offering the GIL between them (docs/semantics.md §6)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import Metric, MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource

from async_tee._reporting import warn_once
from async_tee._worker.gil import budget

METRICS_PER_SLICE = 8
"""Metrics encoded between two offers of the GIL: a small part of one ``_worker/gil`` slice."""

_EMPTY = Resource.get_empty()


def encode_in_slices(data: MetricsData, per_slice: int = METRICS_PER_SLICE) -> Any:
    """``encode_metrics(data)``, encoded ``per_slice`` metrics at a time.

    A resource is encoded once, with its first metrics; later metrics are encoded under an
    empty resource and their scope's message is appended to it, or their metrics to that
    scope's message.
    """
    spend = budget().spend
    request = encode_metrics(MetricsData([]))
    for resource_metrics in data.resource_metrics:
        if not resource_metrics.scope_metrics:  # nothing to slice
            request.resource_metrics.extend(
                encode_metrics(MetricsData([resource_metrics])).resource_metrics
            )
            continue
        resource_message: Any = None
        for scope_metrics in resource_metrics.scope_metrics:
            scope_message: Any = None
            metrics = scope_metrics.metrics
            for start in range(0, max(1, len(metrics)), per_slice):
                chunk = metrics[start : start + per_slice]
                part = _encode_part(
                    resource_metrics, scope_metrics, chunk, resource_message is None
                )
                if resource_message is None:
                    request.resource_metrics.append(part)
                    resource_message = request.resource_metrics[-1]
                    scope_message = resource_message.scope_metrics[-1]
                elif scope_message is None:
                    resource_message.scope_metrics.extend(part.scope_metrics)
                    scope_message = resource_message.scope_metrics[-1]
                else:
                    scope_message.metrics.extend(part.scope_metrics[0].metrics)
                spend()
    return request


def _encode_part(
    resource_metrics: ResourceMetrics,
    scope_metrics: ScopeMetrics,
    metrics: Sequence[Metric],
    with_resource: bool,
) -> Any:
    """One resource's message, holding one scope with ``metrics``.

    Its resource is left empty unless ``with_resource``.
    """
    resource, schema_url = (
        (resource_metrics.resource, resource_metrics.schema_url) if with_resource else (_EMPTY, "")
    )
    scope = ScopeMetrics(scope_metrics.scope, metrics, scope_metrics.schema_url)
    part = MetricsData([ResourceMetrics(resource, [scope], schema_url)])
    return encode_metrics(part).resource_metrics[0]


class EncodedRequest:
    """An ``ExportMetricsServiceRequest`` already serialized (``table_encode.TableEncoder``).

    The exporters below send it as it is: what they call on a request message,
    ``SerializeToString``, returns its bytes.
    """

    __slots__ = ("data", "points")

    def __init__(self, data: bytes, points: int) -> None:
        self.data = data
        self.points = points  # its data points, as the exporters count them

    def SerializeToString(self) -> bytes:
        return self.data


_EXPORT_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


def _serialized(request: Any) -> bytes:
    return bytes(request.SerializeToString())


class _Stub:
    """The metrics service's stub, serializing a request message or an :class:`EncodedRequest`."""

    def __init__(self, channel: Any) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceResponse,
        )

        self.Export = channel.unary_unary(
            _EXPORT_METHOD,
            request_serializer=_serialized,
            response_deserializer=ExportMetricsServiceResponse.FromString,
        )


class SlicedEncoding:
    """Mixed into the OTLP/gRPC exporter class: its request is encoded in slices.

    An :class:`EncodedRequest` is sent as it is, through a stub that takes one.
    """

    def _initialize_channel_and_stub(self) -> None:
        super()._initialize_channel_and_stub()  # type: ignore[misc]
        self._client = _Stub(self._channel)  # type: ignore[attr-defined]

    def _translate_data(self, data: Any) -> Any:
        if isinstance(data, MetricsData):
            return encode_in_slices(data)
        return data

    def _count_data(self, data: Any) -> int:
        if isinstance(data, MetricsData):
            return int(super()._count_data(data))  # type: ignore[misc]
        return int(data.points)


def sliced(exporter_class: type[Any]) -> type[Any]:
    """``exporter_class`` with :class:`SlicedEncoding`, or itself if it has no such hook."""
    if not callable(getattr(exporter_class, "_translate_data", None)):
        return exporter_class
    return type(exporter_class.__name__, (SlicedEncoding, exporter_class), {})


def sends_encoded(exporter: Any) -> bool:
    """Whether ``exporter`` can send an :class:`EncodedRequest`.

    Built from :func:`sliced`, its client must be the stub above; from
    :func:`takes_requests`, an OTLP/HTTP client that sends bytes.
    """
    client = getattr(exporter, "_client", None)
    if isinstance(exporter, SlicedEncoding):
        return isinstance(client, _Stub)
    return isinstance(exporter, PrebuiltRequests) and callable(getattr(client, "export", None))


class PrebuiltRequests:
    """Mixed into the OTLP/HTTP exporter class: an :class:`EncodedRequest` is sent as it is."""

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        if isinstance(metrics_data, MetricsData):
            return super().export(metrics_data, timeout_millis, **kwargs)  # type: ignore[misc]
        from opentelemetry.sdk.metrics.export import MetricExportResult

        if getattr(self, "_shutdown", False):
            return MetricExportResult.FAILURE
        data = metrics_data.SerializeToString()
        limit = getattr(self, "_max_request_size", None)
        if limit and len(data) > limit:  # as the SDK drops it: a failed export
            warn_once(
                "export:too-large",
                "async_tee: an export of %d bytes exceeds the exporter's max_request_size",
                len(data),
            )
            return MetricExportResult.FAILURE
        result = self._client.export(data)  # type: ignore[attr-defined]
        return MetricExportResult.SUCCESS if result.success else MetricExportResult.FAILURE


def takes_requests(exporter_class: type[Any]) -> type[Any] | None:
    """``exporter_class`` able to send a ready request, or None if this SDK has no way."""
    if callable(getattr(exporter_class, "_translate_data", None)):
        return sliced(exporter_class)
    if callable(getattr(exporter_class, "_export_batch", None)):
        return type(exporter_class.__name__, (PrebuiltRequests, exporter_class), {})
    return None

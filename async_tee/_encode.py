"""OTLP encoding in slices, so that an export's encoding does not hold the GIL in one piece.

The SDK's OTLP/gRPC exporter turns a collection into its protobuf request with
``encode_metrics``, pure Python over every data point in one piece, which the training
thread waits through. :func:`encode_in_slices` builds the same request a few
metrics at a time and offers the GIL between them (``_gil``); the result equals
``encode_metrics(data)`` message for message. :class:`SlicedEncoding` puts it into the gRPC
exporter through the hook the exporter encodes with (``_translate_data``); an exporter
without that hook encodes as it always did. Imported only when async_tee builds an OTLP
exporter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import Metric, MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource

from async_tee._gil import budget

METRICS_PER_SLICE = 8
"""Metrics encoded between two offers of the GIL: a small part of a ``_gil.SLICE_S`` slice."""

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


class SlicedEncoding:
    """Mixed into an OTLP exporter class: its request is encoded in slices.

    A request already built (``_table_encode.TableEncoder``) is sent as it is.
    """

    def _translate_data(self, data: Any) -> Any:
        if isinstance(data, MetricsData):
            return encode_in_slices(data)
        return data

    def _count_data(self, data: Any) -> int:
        if isinstance(data, MetricsData):
            return int(super()._count_data(data))  # type: ignore[misc]
        return sum(
            len(getattr(metric, metric.WhichOneof("data")).data_points)
            for resource_metrics in data.resource_metrics
            for scope_metrics in resource_metrics.scope_metrics
            for metric in scope_metrics.metrics
        )


def sliced(exporter_class: type[Any]) -> type[Any]:
    """``exporter_class`` with :class:`SlicedEncoding`, or itself if it has no such hook."""
    if not callable(getattr(exporter_class, "_translate_data", None)):
        return exporter_class
    return type(exporter_class.__name__, (SlicedEncoding, exporter_class), {})


class PrebuiltRequests:
    """Mixed into the OTLP/HTTP exporter class: a request already built is sent as it is."""

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        if isinstance(metrics_data, MetricsData):
            return super().export(metrics_data, timeout_millis, **kwargs)  # type: ignore[misc]
        if getattr(self, "_shutdown", False):
            from opentelemetry.sdk.metrics.export import MetricExportResult

            return MetricExportResult.FAILURE
        return self._export_batch(metrics_data)  # type: ignore[attr-defined]


def takes_requests(exporter_class: type[Any]) -> type[Any] | None:
    """``exporter_class`` able to send a ready request, or None if this SDK has no way."""
    if callable(getattr(exporter_class, "_translate_data", None)):
        return sliced(exporter_class)
    if callable(getattr(exporter_class, "_export_batch", None)):
        return type(exporter_class.__name__, (PrebuiltRequests, exporter_class), {})
    return None

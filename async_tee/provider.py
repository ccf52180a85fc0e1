"""Build an OpenTelemetry ``MeterProvider`` from ``Settings`` (the standard ``OTEL_*`` variables).

Imported only by ``start_telemetry``: this is where the SDK and the exporters are loaded.
The provider is built with ``shutdown_on_exit=False``: the SDK's own exit hook can delay
exit by ~20 s against a stalled collector, so async_tee registers its own, bounded one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from async_tee.config import Settings
from async_tee.reporting import logger, warn_once

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader

EXPORT_RESULTS = {"success": 0, "failure": 0}
"""Export attempts of the providers async_tee built, by result (read by ``stats()``)."""

_SERVERS: list[Any] = []  # Prometheus HTTP servers async_tee started, closed at shutdown


def close_servers() -> None:
    """Stop the Prometheus HTTP servers async_tee started. Never raises."""
    while _SERVERS:
        server = _SERVERS.pop()
        try:
            server.shutdown()
            server.server_close()
        except Exception:  # noqa: BLE001 - shutdown must not raise
            warn_once("prometheus:close", "async_tee: closing the Prometheus server failed")


def _tracked(exporter: MetricExporter) -> MetricExporter:
    """Wrap ``exporter`` so every export's result is counted: delivery becomes observable."""
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    class DeliveryCountingExporter(MetricExporter):
        def __init__(self) -> None:
            super().__init__(
                preferred_temporality=exporter._preferred_temporality,
                preferred_aggregation=exporter._preferred_aggregation,
            )

        def export(
            self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any
        ) -> MetricExportResult:
            try:
                result = exporter.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            except Exception:  # noqa: BLE001 - an exporter bug is a failed export
                warn_once("export:raised", "async_tee: the metric exporter raised")
                result = MetricExportResult.FAILURE
            ok = result is MetricExportResult.SUCCESS
            EXPORT_RESULTS["success" if ok else "failure"] += 1
            return result

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return exporter.force_flush(timeout_millis=timeout_millis)

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            exporter.shutdown(timeout_millis=timeout_millis, **kwargs)

    return DeliveryCountingExporter()


def _otlp_exporter(settings: Settings) -> Any:
    headers = dict(settings.otlp_headers) or None
    if settings.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        insecure = settings.otlp_insecure
        if insecure is None:
            insecure = settings.otlp_endpoint.startswith("http://")
        return OTLPMetricExporter(
            endpoint=settings.otlp_endpoint,
            insecure=insecure,
            headers=headers,
            timeout=settings.otlp_timeout_s,
        )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HTTPMetricExporter,
    )

    return HTTPMetricExporter(
        endpoint=settings.otlp_endpoint, headers=headers, timeout=settings.otlp_timeout_s
    )


def _readers(settings: Settings) -> list[MetricReader]:
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )

    readers: list[MetricReader] = []
    for name in settings.exporters:
        if name == "otlp":
            exporter = _otlp_exporter(settings)
        elif name == "console":
            exporter = ConsoleMetricExporter()
        elif name == "prometheus":
            reader = _prometheus_reader(settings)
            if reader is not None:
                readers.append(reader)
            continue
        else:
            continue
        readers.append(
            PeriodicExportingMetricReader(
                _tracked(exporter),
                export_interval_millis=settings.export_interval_ms,
                export_timeout_millis=settings.export_timeout_ms,
            )
        )
    return readers


def _prometheus_reader(settings: Settings) -> MetricReader | None:
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
    except ImportError:
        warn_once(
            "prometheus:missing",
            "async_tee: OTEL_METRICS_EXPORTER=prometheus needs "
            "'pip install async_tee[prometheus]'; skipping that exporter",
        )
        return None
    reader = PrometheusMetricReader()
    try:
        # prometheus_client binds 0.0.0.0 by default: bind loopback unless told otherwise.
        served = start_http_server(settings.prometheus_port, addr=settings.prometheus_host)
        if isinstance(served, tuple):  # prometheus_client >= 0.20 returns (server, thread)
            _SERVERS.append(served[0])
    except OSError:
        warn_once(
            "prometheus:bind",
            "async_tee: cannot serve Prometheus metrics on %s:%d",
            settings.prometheus_host,
            settings.prometheus_port,
        )
    return reader


def build_meter_provider(settings: Settings) -> MeterProvider:
    """Build a provider with the readers ``settings`` name, or none for ``none``.

    Raises:
        Exception: Whatever the SDK raises on a bad setting; ``start_telemetry`` catches it.
    """
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create(dict(settings.resource_attributes))
    readers = _readers(settings)
    logger.debug("async_tee: built %d metric reader(s)", len(readers))
    return MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=False)

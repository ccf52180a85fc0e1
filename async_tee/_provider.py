"""Build an OpenTelemetry ``MeterProvider`` from ``Settings`` (the standard ``OTEL_*`` variables).

Imported only by ``start_telemetry``: this is where the SDK and the exporters are loaded.
Push exporters (OTLP, console) run on an :class:`~async_tee._export.ExportingReader`, the
OTLP one driven by completed steps as well as by its period.
The provider is built with ``shutdown_on_exit=False``: the SDK's own exit hook can delay
exit by ~20 s against a stalled collector, so async_tee registers its own, bounded one.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any, cast

from async_tee._reporting import logger, warn_once
from async_tee.config import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader

    from async_tee._delivery import ExportCounts
    from async_tee._export import ExportingReader


@dataclasses.dataclass
class BuiltProvider:
    """A provider async_tee built, with what it started: readers and HTTP servers."""

    provider: MeterProvider
    readers: list[MetricReader]
    servers: list[Any]
    server_threads: list[threading.Thread]

    @property
    def threads(self) -> list[threading.Thread]:
        """The threads the provider's readers and servers run on."""
        readers = [getattr(reader, "thread", None) for reader in self.readers]
        found = [t for t in readers if isinstance(t, threading.Thread)]
        return found + self.server_threads

    @property
    def push_readers(self) -> list[ExportingReader]:
        """The readers with an exporting thread of async_tee's (OTLP, console)."""
        return [
            cast("ExportingReader", reader)
            for reader in self.readers
            if getattr(reader, "step_aligned", None) is not None
        ]

    @property
    def step_reader(self) -> ExportingReader | None:
        """The reader the worker drives at step boundaries, if any (OTLP, step export on)."""
        return next((reader for reader in self.push_readers if reader.step_aligned), None)


def close_servers(servers: list[Any]) -> None:
    """Stop the Prometheus HTTP servers async_tee started. Never raises."""
    while servers:
        server = servers.pop()
        try:
            server.shutdown()
            server.server_close()
        except Exception:  # noqa: BLE001 - shutdown must not raise
            warn_once("prometheus:close", "async_tee: closing the Prometheus server failed")


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


def _readers(
    settings: Settings, counts: ExportCounts, servers: list[Any], threads: list[threading.Thread]
) -> list[MetricReader]:
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

    from async_tee._export import ExportingReader

    readers: list[MetricReader] = []
    for name in settings.exporters:
        if name == "otlp":
            exporter = _otlp_exporter(settings)
        elif name == "console":
            exporter = ConsoleMetricExporter()
        elif name == "prometheus":
            reader = _prometheus_reader(settings, servers, threads)
            if reader is not None:
                readers.append(reader)
            continue
        else:
            continue
        readers.append(
            ExportingReader(
                exporter,
                interval_s=settings.export_interval_ms / 1000.0,
                timeout_s=settings.export_timeout_ms / 1000.0,
                min_interval_s=settings.min_export_interval_s,
                counts=counts,
                # The OTLP exporter is driven by completed steps; the console keeps its period.
                step_aligned=name == "otlp" and settings.step_export,
            )
        )
    return readers


def _prometheus_reader(
    settings: Settings, servers: list[Any], threads: list[threading.Thread]
) -> MetricReader | None:
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
            servers.append(served[0])
            threads.append(served[1])
    except OSError:
        warn_once(
            "prometheus:bind",
            "async_tee: cannot serve Prometheus metrics on %s:%d",
            settings.prometheus_host,
            settings.prometheus_port,
        )
    return reader


def build_meter_provider(settings: Settings, counts: ExportCounts) -> BuiltProvider:
    """Build a provider with the readers ``settings`` name, or none for ``none``.

    Every push export's result is counted into ``counts``, by trigger.

    Raises:
        Exception: Whatever the SDK raises on a bad setting; ``start_telemetry`` catches it.
    """
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create(dict(settings.resource_attributes))
    servers: list[Any] = []
    threads: list[threading.Thread] = []
    readers = _readers(settings, counts, servers, threads)
    logger.debug("async_tee: built %d metric reader(s)", len(readers))
    provider = MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=False)
    return BuiltProvider(provider, readers, servers, threads)

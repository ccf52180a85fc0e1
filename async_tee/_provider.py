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
from urllib.parse import urlsplit

from async_tee._reporting import logger, warn_once
from async_tee.config import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader

    from async_tee._delivery import ExportCounts
    from async_tee._export import ExportingReader


@dataclasses.dataclass(frozen=True)
class ExporterState:
    """One exporter ``OTEL_METRICS_EXPORTER`` asked for, and whether it started.

    Attributes:
        name: ``otlp``, ``prometheus`` or ``console``.
        started: Whether it runs. One that did not start never exports in this session.
        where: Its endpoint, or the address it serves on (a port of 0 resolved).
        error: Why it did not start, with the variable that fixes it; empty if it started.
    """

    name: str
    started: bool
    where: str
    error: str = ""

    def as_dict(self) -> dict[str, str]:
        """The state as ``stats()["exporters"]`` reports it."""
        return {
            "state": "started" if self.started else "failed",
            "where": self.where,
            "error": self.error,
        }


@dataclasses.dataclass
class BuiltProvider:
    """A provider async_tee built, with what it started: readers, HTTP servers, exporters."""

    provider: MeterProvider
    readers: list[MetricReader]
    servers: list[Any]
    server_threads: list[threading.Thread]
    exporters: list[ExporterState] = dataclasses.field(default_factory=list)

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


def _failed(name: str, where: str, error: str) -> ExporterState:
    """An exporter that cannot start: one warning line naming the fix, the traceback at debug."""
    warn_once(
        f"exporter:{name}", "async_tee: %s exporter not started: %s", name, error, traceback=False
    )
    return ExporterState(name, False, where, error)


def _endpoint_problem(settings: Settings) -> str | None:
    """What is wrong with the OTLP endpoint, or None.

    The SDK's exporters accept any string, then fail every export; this says why at start.
    """
    endpoint = settings.otlp_endpoint
    has_scheme = "://" in endpoint
    try:
        parts = urlsplit(endpoint if has_scheme else f"//{endpoint}")  # gRPC takes host:port
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as exc:
        return f"it is not a valid URL ({exc})"
    if has_scheme and parts.scheme not in ("http", "https"):
        return f"its scheme {parts.scheme!r} is not http or https"
    if not has_scheme and settings.otlp_protocol != "grpc":
        return "http/protobuf needs an http:// or https:// URL"
    if not parts.hostname:
        return "it names no host"
    return None


# OTEL_EXPORTER_OTLP_COMPRESSION's values, named as gRPC's enum names them. Passed to the
# exporter explicitly, so start_telemetry(environ=...) is honoured (it reads os.environ).
_GRPC_COMPRESSION = {"none": "NoCompression", "gzip": "Gzip", "deflate": "Deflate"}


def _otlp_exporter(settings: Settings) -> Any:
    headers = dict(settings.otlp_headers) or None
    if settings.otlp_protocol == "grpc":
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        from async_tee._encode import sliced

        insecure = settings.otlp_insecure
        if insecure is None:
            insecure = settings.otlp_endpoint.startswith("http://")
        return sliced(OTLPMetricExporter)(
            endpoint=settings.otlp_endpoint,
            insecure=insecure,
            headers=headers,
            timeout=settings.otlp_timeout_s,
            compression=getattr(grpc.Compression, _GRPC_COMPRESSION[settings.otlp_compression]),
        )
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HTTPMetricExporter,
    )

    return HTTPMetricExporter(
        endpoint=settings.otlp_endpoint,
        headers=headers,
        timeout=settings.otlp_timeout_s,
        compression=Compression(settings.otlp_compression),
    )


def _push_exporter(name: str, settings: Settings) -> tuple[Any, ExporterState]:
    """The OTLP or console exporter and its state; None with a failed state if it cannot start."""
    if name == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter(), ExporterState(name, True, "stdout")
    endpoint = settings.otlp_endpoint
    problem = _endpoint_problem(settings)
    if problem is not None:
        fix = (
            f"OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT) is "
            f"{endpoint!r}: {problem}; set it to a URL such as http://localhost:4317"
        )
        return None, _failed(name, endpoint, fix)
    try:
        exporter = _otlp_exporter(settings)
    except Exception as exc:  # noqa: BLE001 - a bad setting must not stop training
        fix = f"{type(exc).__name__}: {exc}; check the OTEL_EXPORTER_OTLP_* variables"
        return None, _failed(name, endpoint, fix)
    return exporter, ExporterState(name, True, endpoint)


def _readers(
    settings: Settings,
    counts: ExportCounts,
    servers: list[Any],
    threads: list[threading.Thread],
    exporters: list[ExporterState],
) -> list[MetricReader]:
    from async_tee._export import ExportingReader

    readers: list[MetricReader] = []
    for name in settings.exporters:
        if name == "none":
            continue
        if name == "prometheus":
            reader, state = _prometheus_reader(settings, servers, threads)
        else:
            exporter, state = _push_exporter(name, settings)
            reader = None
            if exporter is not None:
                reader = ExportingReader(
                    exporter,
                    interval_s=settings.export_interval_ms / 1000.0,
                    timeout_s=settings.export_timeout_ms / 1000.0,
                    min_interval_s=settings.min_export_interval_s,
                    counts=counts,
                    # The OTLP exporter is driven by completed steps; the console keeps its
                    # period.
                    step_aligned=name == "otlp" and settings.step_export,
                )
        exporters.append(state)
        if reader is not None:
            readers.append(reader)
    return readers


def _port_fix(settings: Settings) -> str:
    """The variable to change when this process's Prometheus port is taken or out of range."""
    if settings.prometheus_base_port is None:
        return (
            "set OTEL_EXPORTER_PROMETHEUS_PORT to a free port (0: any free port), or unset it "
            "and set ASYNC_TEE_PROMETHEUS_BASE_PORT so each local rank serves on base + "
            "LOCAL_RANK"
        )
    return (
        f"set ASYNC_TEE_PROMETHEUS_BASE_PORT (now {settings.prometheus_base_port}) to a "
        "base with one free port per local rank after it (each serves on base + LOCAL_RANK), "
        "or to 0 for any free port"
    )


def _prometheus_reader(
    settings: Settings, servers: list[Any], threads: list[threading.Thread]
) -> tuple[MetricReader | None, ExporterState]:
    """Serve ``/metrics`` first, then make the reader: one that cannot serve is never made."""
    host, port = settings.prometheus_host, settings.prometheus_port
    where = f"{host}:{port}"
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
    except ImportError:
        return None, _failed("prometheus", where, "it needs 'pip install async_tee[prometheus]'")
    if port > 65535:
        return None, _failed(
            "prometheus", where, f"port {port} is past 65535; {_port_fix(settings)}"
        )
    try:
        # prometheus_client binds 0.0.0.0 by default: bind loopback unless told otherwise.
        server, thread = start_http_server(port, addr=host)  # prometheus_client >= 0.20
    except OSError as exc:
        return None, _failed(
            "prometheus",
            where,
            f"cannot serve on {where} ({exc.strerror or exc}); {_port_fix(settings)}",
        )
    servers.append(server)
    threads.append(thread)
    where = f"{host}:{server.server_address[1]}"  # port 0 resolved
    logger.info("async_tee: serving Prometheus metrics on http://%s/metrics", where)
    return PrometheusMetricReader(), ExporterState("prometheus", True, where)


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
    exporters: list[ExporterState] = []
    try:
        readers = _readers(settings, counts, servers, threads, exporters)
        logger.debug("async_tee: built %d metric reader(s)", len(readers))
        provider = MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=False)
    except BaseException:
        close_servers(servers)  # no server outlives a provider that was never built
        raise
    return BuiltProvider(provider, readers, servers, threads, exporters)

"""The exporters ``OTEL_METRICS_EXPORTER`` may name, one row each (docs/semantics.md §9, §10)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from async_tee._reporting import logger, redact, warn_once
from async_tee._settings import Settings, redact_url

if TYPE_CHECKING:
    from async_tee._export.transport import Transport


@dataclasses.dataclass(frozen=True)
class ExporterState:
    """One exporter ``OTEL_METRICS_EXPORTER`` asked for, and whether it started.

    Attributes:
        name: A row of :data:`EXPORTER_KINDS`.
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
class Started:
    """What building the exporters started that the provider's shutdown must stop."""

    servers: list[Any] = dataclasses.field(default_factory=list)
    threads: list[threading.Thread] = dataclasses.field(default_factory=list)


Build = Callable[[Settings, Started], tuple[Any, ExporterState]]
"""A row's builder: the transport and its factory (pushed rows) or the SDK's reader, or None."""


@dataclasses.dataclass(frozen=True)
class ExporterKind:
    """One row of the table.

    Attributes:
        name: Its name in ``OTEL_METRICS_EXPORTER``.
        pushed: async_tee's exporting thread sends its exports (``_export/sender``), with the
            evidence of delivery; else it is an SDK reader (the console's periodic one, or
            Prometheus's, scraped), and "delivered" needs no export of ours.
        step_export: It gets an export of each completed step (``ASYNC_TEE_STEP_EXPORT``).
        serves: It serves ``/metrics`` for a scraper.
        build: Builds it from the settings.
    """

    name: str
    pushed: bool
    step_export: bool
    build: Build
    serves: bool = False


def _failed(name: str, where: str, error: str) -> tuple[None, ExporterState]:
    """An exporter that cannot start: one warning line naming the fix, the traceback at debug."""
    warn_once(
        f"exporter:{name}", "async_tee: %s exporter not started: %s", name, error, traceback=False
    )
    return None, ExporterState(name, False, where, error)


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
    if settings.otlp_protocol == "grpc" and (parts.username or parts.password):
        return (
            "it holds credentials (user:password@), which gRPC never sends; put them in "
            "OTEL_EXPORTER_OTLP_HEADERS (e.g. authorization=Basic%20<base64>)"
        )
    return None


def transport_factory(settings: Settings) -> Callable[[], Transport]:
    """What makes the OTLP transport ``settings`` ask for (``OTEL_EXPORTER_OTLP_PROTOCOL``)."""
    if settings.otlp_protocol == "grpc":
        from async_tee._export.grpc_transport import GrpcTransport

        return lambda: GrpcTransport(settings)
    from async_tee._export.http_transport import HttpTransport

    return lambda: HttpTransport(settings)


def _build_otlp(settings: Settings, started: Started) -> tuple[Any, ExporterState]:
    endpoint = redact_url(settings.otlp_endpoint)  # as every message and figure shows it
    problem = _endpoint_problem(settings)
    if problem is not None:
        fix = (
            f"OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT) is "
            f"{endpoint!r}: {problem}; set it to a URL such as http://localhost:4317"
        )
        return _failed("otlp", endpoint, fix)
    try:
        make = transport_factory(settings)
        first = make()  # a certificate that cannot be read fails here, at start
    except Exception as exc:  # noqa: BLE001 - a bad setting must not stop training
        error = redact(str(exc), settings.secrets)
        fix = f"{type(exc).__name__}: {error}; check the OTEL_EXPORTER_OTLP_* variables"
        return _failed("otlp", endpoint, fix)
    return (first, make), ExporterState("otlp", True, endpoint)


def _build_console(settings: Settings, started: Started) -> tuple[Any, ExporterState]:
    """The SDK's console exporter on its own periodic reader (``OTEL_METRIC_EXPORT_INTERVAL``)."""
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )

    reader = PeriodicExportingMetricReader(
        ConsoleMetricExporter(),
        export_interval_millis=settings.export_interval_ms,
        export_timeout_millis=settings.export_timeout_ms,
    )
    return reader, ExporterState("console", True, "stdout")


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


def _build_prometheus(settings: Settings, started: Started) -> tuple[Any, ExporterState]:
    """Serve ``/metrics`` first, then make the reader: one that cannot serve is never made."""
    host, port = settings.prometheus_host, settings.prometheus_port
    where = f"{host}:{port}"
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
    except ImportError:
        return _failed(
            "prometheus",
            where,
            "it needs the prometheus extra: pip install '.[prometheus]' from a checkout",
        )
    if port > 65535:
        return _failed("prometheus", where, f"port {port} is past 65535; {_port_fix(settings)}")
    try:
        # prometheus_client binds 0.0.0.0 by default: bind loopback unless told otherwise.
        server, thread = start_http_server(port, addr=host)  # prometheus_client >= 0.20
    except OSError as exc:
        why = f"cannot serve on {where} ({exc.strerror or exc}); {_port_fix(settings)}"
        return _failed("prometheus", where, why)
    started.servers.append(server)
    started.threads.append(thread)
    where = f"{host}:{server.server_address[1]}"  # port 0 resolved
    logger.info("async_tee: serving Prometheus metrics on http://%s/metrics", where)
    return PrometheusMetricReader(), ExporterState("prometheus", True, where)


EXPORTER_KINDS: Mapping[str, ExporterKind] = MappingProxyType(
    {
        kind.name: kind
        for kind in (
            ExporterKind("otlp", pushed=True, step_export=True, build=_build_otlp),
            ExporterKind(
                "prometheus",
                pushed=False,
                step_export=False,
                build=_build_prometheus,
                serves=True,
            ),
            ExporterKind("console", pushed=False, step_export=False, build=_build_console),
        )
    }
)
"""Every exporter async_tee can build, by its ``OTEL_METRICS_EXPORTER`` name."""


def close_servers(servers: list[Any]) -> None:
    """Stop the HTTP servers the builders started. Never raises."""
    while servers:
        server = servers.pop()
        try:
            server.shutdown()
            server.server_close()
        except Exception:  # noqa: BLE001 - shutdown must not raise
            warn_once("prometheus:close", "async_tee: closing the Prometheus server failed")

"""The stack for one of the four paths to one Prometheus (docs/semantics.md §11)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from async_tee.alerts import AlertThresholds, render_rules
from async_tee.stack.common import (
    COLLECTOR_IMAGE,
    COLLECTOR_MEMORY_MIB,
    GRAFANA_SERVICE,
    MEMORY_LIMITER,
    PROMETHEUS_IMAGE,
    PROMOTED,
    grafana_files,
    own_telemetry,
    seconds,
    yaml_list,
)

__all__ = [
    "COLLECTOR_PATHS",
    "PATHS",
    "StackAddresses",
    "collector_config",
    "prometheus_config",
    "prometheus_flags",
    "rank_environment",
    "render_stack",
]

PATHS = ("scrape", "collector", "remote-write", "otlp")
"""(a) Prometheus scrapes each rank; (b1) ranks -> Collector's ``prometheus`` exporter <- scrape;
(b2) ranks -> Collector -> remote write -> Prometheus; (c) ranks -> Prometheus 3's OTLP receiver."""
COLLECTOR_PATHS = ("collector", "remote-write")
"""The paths with a Collector between the ranks and Prometheus."""


@dataclasses.dataclass(frozen=True)
class StackAddresses:
    """Where each part listens, keeps its data and how the others reach it: compose's by default.

    Attributes:
        prometheus: How the Collector and the ranks reach Prometheus (``host:port``).
        prometheus_listen: Where Prometheus listens.
        collector_otlp_grpc, collector_otlp_http: Where the Collector's OTLP receiver listens.
        ranks_reach: The host the ranks reach the stack at (its published ports): the
            machine running it, for ranks elsewhere.
        collector_metrics_listen: Where its ``prometheus`` exporter serves (path b1).
        collector_metrics: How Prometheus reaches that exporter.
        collector_telemetry_port: The port of the Collector's own metrics.
        collector_telemetry: How Prometheus reaches the Collector's own metrics.
        rank_targets: What Prometheus scrapes on path (a): each rank's ``/metrics``.
        scrape_interval_s: Prometheus's scrape and rule-evaluation interval.
        metric_expiration_s: How long the Collector's ``prometheus`` exporter keeps serving a
            series that stopped arriving (path b1): a dead rank is visible this long.
        collector_data: The folder where the Collector keeps what it accepted and Prometheus
            does not hold yet (its remote-write write-ahead log, path b2): a volume in compose.
    """

    prometheus: str = "prometheus:9090"
    prometheus_listen: str = "0.0.0.0:9090"
    collector_otlp_grpc: str = "0.0.0.0:4317"
    collector_otlp_http: str = "0.0.0.0:4318"
    ranks_reach: str = "localhost"
    collector_metrics_listen: str = "0.0.0.0:8889"
    collector_metrics: str = "otelcol:8889"
    collector_telemetry_port: int = 8888
    collector_telemetry: str = "otelcol:8888"
    rank_targets: tuple[str, ...] = tuple(f"host.docker.internal:{9464 + r}" for r in range(8))
    scrape_interval_s: float = 15.0
    metric_expiration_s: float = 300.0
    collector_data: str = "/var/lib/otelcol"


def _remote_write_exporter(at: StackAddresses) -> str:
    """Remote write that keeps what the Collector accepted across its crash, in order.

    The exporter has no ``sending_queue`` (so no ``file_storage``): its own write-ahead log is
    the persistent queue. With its in-memory queue off, a request is in the log (fsynced)
    before the receiver answers; one reader drains the log, one request at a time, so a
    rank's samples reach Prometheus in the order they came. A failed send is retried with
    no time limit (the log keeps it, not memory) until Prometheus takes it.
    """
    return (
        "    max_batch_request_parallelism: 1  # one request at a time: samples in order\n"
        "    remote_write_queue:\n"
        "      enabled: false  # accepted = in the log: the receiver answers once written\n"
        "    wal:\n"
        f"      directory: {at.collector_data}\n"
        "      buffer_size: 100  # at most this many requests read from the log per send\n"
        "      truncate_frequency: 200ms  # about the longest a request waits to be sent\n"
        "    retry_on_failure:\n"
        "      max_interval: 5s  # the longest wait between tries (+/- half)\n"
        "      max_elapsed_time: 0s  # never give up: the log holds the backlog on disk\n"
    )


def collector_config(
    path: str, at: StackAddresses, extra_exporters: Mapping[str, str] | None = None
) -> str:
    """The Collector's config for path ``collector`` (b1) or ``remote-write`` (b2).

    ``extra_exporters``: name -> its config block (YAML, indented 4), added to the pipeline
    (the tests add a recorder).
    """
    labels = f"    resource_constant_labels:\n      included: {yaml_list(PROMOTED)}\n"
    if path == "collector":
        name = "prometheus"
        exporter = (
            f"  {name}:\n"
            f"    endpoint: {at.collector_metrics_listen}\n"
            f"    metric_expiration: {seconds(at.metric_expiration_s)}\n" + labels
        )
    elif path == "remote-write":
        name = "prometheus_remote_write"
        exporter = (
            f"  {name}:\n"
            f"    endpoint: http://{at.prometheus}/api/v1/write\n"
            + labels
            + _remote_write_exporter(at)
        )
    else:
        raise ValueError(f"the {path!r} path has no Collector; one of 'collector', 'remote-write'")
    extra = dict(extra_exporters or {})
    exporters = [name, *extra]
    return (
        "# Generated by `async-tee stack`: every rank exports OTLP here.\n"
        "receivers:\n"
        "  otlp:\n"
        "    protocols:\n"
        "      grpc:\n"
        f"        endpoint: {at.collector_otlp_grpc}\n"
        "      http:\n"
        f"        endpoint: {at.collector_otlp_http}\n"
        + MEMORY_LIMITER
        + "exporters:\n"
        + exporter
        + "".join(f"  {key}:\n{block}" for key, block in extra.items())
        + "service:\n"
        + own_telemetry(at.collector_telemetry_port)
        + "  pipelines:\n"
        "    metrics:\n"
        "      receivers: [otlp]\n"
        "      processors: [memory_limiter]\n"
        f"      exporters: {yaml_list(exporters)}\n"
    )


def _known(path: str) -> None:
    if path not in PATHS:
        raise ValueError(f"unknown path {path!r}; one of {PATHS}")


def prometheus_config(path: str, at: StackAddresses, rules_file: str = "rules.yml") -> str:
    """Prometheus's config for ``path``, loading the alert rules from ``rules_file``."""
    _known(path)
    interval = seconds(at.scrape_interval_s)
    lines = [
        "# Generated by `async-tee stack`.",
        "global:",
        f"  scrape_interval: {interval}",
        f"  evaluation_interval: {interval}",
        "rule_files:",
        f"  - {rules_file}",
        "scrape_configs:",
    ]
    if path == "scrape":
        lines += [
            "  - job_name: rl",
            "    static_configs:",
            f"      - targets: {yaml_list(at.rank_targets)}",
        ]
    if path == "collector":
        lines += [
            "  - job_name: otelcol-exported",
            "    # The Collector's series carry each rank's own job and instance (its",
            "    # service.name and service.instance.id): keep them, or every rank gets the",
            "    # Collector's and the target_info join cannot tell ranks apart.",
            "    honor_labels: true",
            "    static_configs:",
            f"      - targets: [{json.dumps(at.collector_metrics)}]",
        ]
    if path in COLLECTOR_PATHS:
        lines += [
            "  - job_name: otelcol",
            "    static_configs:",
            f"      - targets: [{json.dumps(at.collector_telemetry)}]",
        ]
    if path == "otlp":
        lines[-1] = "scrape_configs: []"
        lines += [
            "otlp:",
            "  # Names as the Collector gives them (the default, said here once).",
            "  translation_strategy: UnderscoreEscapingWithSuffixes",
            f"  promote_resource_attributes: {yaml_list(PROMOTED)}",
        ]
    return "\n".join(lines) + "\n"


def prometheus_flags(path: str) -> tuple[str, ...]:
    """The flags Prometheus needs for ``path`` beyond its config (the receivers it opens)."""
    return {
        "remote-write": ("--web.enable-remote-write-receiver",),
        "otlp": ("--web.enable-otlp-receiver",),
    }.get(path, ())


def rank_environment(path: str, at: StackAddresses) -> dict[str, str]:
    """What each rank's environment sets to export on ``path``."""
    if path == "scrape":
        return {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_HOST": "0.0.0.0"}
    if path == "otlp":  # Prometheus takes OTLP over HTTP only, cumulative only
        port = _port(at.prometheus_listen)
        return {
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": (
                f"http://{at.ranks_reach}:{port}/api/v1/otlp/v1/metrics"
            ),
        }
    port = _port(at.collector_otlp_http)  # OTLP/HTTP, the default: the least CPU a rank spends
    return {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{at.ranks_reach}:{port}",
    }


def _port(address: str) -> str:
    return address.rsplit(":", 1)[1]


def _compose(path: str, at: StackAddresses) -> str:
    """The compose file: the official images at the pinned versions, the configs mounted."""
    flags = "".join(f"\n      - {flag}" for flag in prometheus_flags(path))
    collector = ""
    if path in COLLECTOR_PATHS:
        keeps = path == "remote-write"  # its write-ahead log outlives the container
        collector = (
            "  otelcol:\n"
            f"    image: {COLLECTOR_IMAGE}\n"
            "    command: [--config=/etc/otelcol/config.yaml]\n"
            "    restart: unless-stopped  # after a crash it comes back and sends what it kept\n"
            f"    environment: [GOMEMLIMIT={COLLECTOR_MEMORY_MIB * 4 // 5}MiB]\n"
            + (
                "    # Root: the image has no folder its own user may write, and a new volume is\n"
                "    # root's.\n"
                '    user: "0:0"\n'
                if keeps
                else ""
            )
            + "    volumes:\n"
            "      - ./otelcol.yaml:/etc/otelcol/config.yaml:ro\n"
            + (f"      - otelcol-data:{at.collector_data}\n" if keeps else "")
            + '    ports: ["4317:4317", "4318:4318"]\n'
        )
    return (
        f"# Generated by `async-tee stack --path {path}`: docker compose up, then start the ranks\n"
        "# with the variables in ranks.env.\n"
        "services:\n" + collector + "  prometheus:\n"
        f"    image: {PROMETHEUS_IMAGE}\n"
        "    command:\n"
        "      - --config.file=/etc/prometheus/prometheus.yml" + flags + "\n"
        "    volumes:\n"
        "      - ./prometheus.yml:/etc/prometheus/prometheus.yml:ro\n"
        "      - ./rules.yml:/etc/prometheus/rules.yml:ro\n"
        '    ports: ["9090:9090"]\n'
        '    extra_hosts: ["host.docker.internal:host-gateway"]\n'
        + GRAFANA_SERVICE
        + ("volumes:\n  otelcol-data: {}\n" if path == "remote-write" else "")
    )


def render_stack(
    path: str,
    addresses: StackAddresses | None = None,
    thresholds: AlertThresholds | None = None,
    dashboard: str | None = None,
) -> dict[str, str]:
    """Every file of the stack for ``path``: relative file name -> text.

    Args:
        path: One of :data:`PATHS`.
        addresses: Where each part listens; compose's service names by default.
        thresholds: The alert rules' thresholds; the defaults when omitted.
        dashboard: The Grafana dashboard's JSON (``async-tee dashboard``), or None to leave
            it out (it needs the ``dashboard`` extra).

    Raises:
        ValueError: ``path`` is not one of :data:`PATHS`.
    """
    _known(path)
    at = addresses or StackAddresses()
    files = {
        "prometheus.yml": prometheus_config(path, at),
        "rules.yml": render_rules(thresholds),
        "compose.yaml": _compose(path, at),
        "ranks.env": "".join(f"{k}={v}\n" for k, v in rank_environment(path, at).items()),
        **grafana_files("http://prometheus:9090"),
    }
    if path in COLLECTOR_PATHS:
        files["otelcol.yaml"] = collector_config(path, at)
    if dashboard is not None:
        files["dashboard.json"] = dashboard
    return files

"""What every stack shares: the images, the promoted attributes, the Collector's guards."""

from __future__ import annotations

import json
from collections.abc import Sequence

COLLECTOR_IMAGE = "otel/opentelemetry-collector-contrib:0.165.1"
PROMETHEUS_IMAGE = "prom/prometheus:v3.16.0"
GRAFANA_IMAGE = "grafana/grafana:12.1.0"
COLLECTOR_MEMORY_MIB = 512
"""The Collector's memory limit (``memory_limiter``'s hard limit; Go's ``GOMEMLIMIT`` is 80 %)."""

PROMOTED = (
    "service.name",
    "service.instance.id",
    "rl.run.id",
    "rl.rank",
    "nemo.run.id",
    "dl.rank",
)
"""The resource attributes copied onto every series behind a Collector (its exporters'
``resource_constant_labels``) and by an OTLP receiver (``promote_resource_attributes``), so a
NeMo-Lens selector (``service_name``, ``nemo_run_id``) finds them on every pushed path."""

MEMORY_LIMITER = (
    "processors:\n"
    "  # First in the pipeline: past its soft limit the receiver refuses (retryable) rather\n"
    "  # than the Collector growing until it is killed.\n"
    "  memory_limiter:\n"
    "    check_interval: 1s\n"
    f"    limit_mib: {COLLECTOR_MEMORY_MIB}\n"
    f"    spike_limit_mib: {COLLECTOR_MEMORY_MIB // 4}\n"
)
"""A Collector config's ``processors:`` section."""

GRAFANA_SERVICE = (
    "  grafana:\n"
    f"    image: {GRAFANA_IMAGE}\n"
    "    volumes:\n"
    "      - ./grafana:/etc/grafana/provisioning:ro\n"
    "      - ./dashboard.json:/var/lib/grafana/dashboards/async_tee.json:ro\n"
    '    ports: ["3000:3000"]\n'
)
"""Grafana in a compose file, provisioned by :func:`grafana_files`."""


def seconds(value: float) -> str:
    """A duration as a Collector or Prometheus config writes it."""
    return f"{value:g}s"


def yaml_list(items: Sequence[str]) -> str:
    """A flow-style YAML list of strings."""
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"


def own_telemetry(port: int) -> str:
    """A Collector's ``service.telemetry``: its own metrics, per exporter, on ``port``."""
    return (
        "  telemetry:\n"
        "    metrics:\n"
        "      level: detailed\n"
        "      readers:\n"
        "        - pull:\n"
        "            exporter:\n"
        "              prometheus:\n"
        "                host: 0.0.0.0\n"
        f"                port: {port}\n"
    )


def grafana_files(datasource_url: str) -> dict[str, str]:
    """Grafana's provisioning files: a Prometheus-API datasource, and the dashboard's folder.

    The datasource (uid ``prometheus``, as the dashboard names it) reads ``datasource_url``.
    """
    return {
        "grafana/datasources/prometheus.yaml": (
            "apiVersion: 1\n"
            "datasources:\n"
            "  - name: prometheus\n"
            "    uid: prometheus\n"
            "    type: prometheus\n"
            f"    url: {datasource_url}\n"
            "    isDefault: true\n"
        ),
        "grafana/dashboards/async_tee.yaml": (
            "apiVersion: 1\n"
            "providers:\n"
            "  - name: async_tee\n"
            "    type: file\n"
            "    options:\n"
            "      path: /var/lib/grafana/dashboards\n"
        ),
    }

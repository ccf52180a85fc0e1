"""async_tee: mirror an RL trainer's per-step metric dicts into OpenTelemetry, off the hot path.

The public surface is assembled here; each module behind it owns one step of the flow
logger dict -> snapshot -> queue -> worker -> mapping -> registry -> OTel. Importing this
package loads no OpenTelemetry code: that happens in ``start_telemetry``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from async_tee import default_rows as _default_rows  # noqa: F401 - declares the shipped rows
from async_tee.catalog import CatalogEntry, series_catalog
from async_tee.logger import Backend, JsonlBackend, Logger
from async_tee.mapping import EfficiencyCategory, efficiency_categories, set_efficiency_categories
from async_tee.metrics import (
    create_rl_metric_instruments,
    record_rl_metrics,
    tee_rl_metrics_to_otel,
)
from async_tee.prometheus_names import prometheus_name
from async_tee.registry import (
    MetricSpec,
    create_metric_instruments,
    record_metrics,
    register_metric_group,
)
from async_tee.reporting import warn_once
from async_tee.telemetry import (
    TelemetryHandle,
    aflush,
    flush,
    shutdown_telemetry,
    start_telemetry,
    stats,
)
from async_tee.vocabulary import (
    RecordedMetric,
    TeedMetric,
    as_scalar,
    recorded_metrics,
    register_recorded_metrics,
    register_teed_metrics,
    registry_key,
    teed_metrics,
)

__all__ = [
    "Backend",
    "CatalogEntry",
    "EfficiencyCategory",
    "JsonlBackend",
    "Logger",
    "MetricSpec",
    "RecordedMetric",
    "TeedMetric",
    "TelemetryHandle",
    "__version__",
    "aflush",
    "as_scalar",
    "create_metric_instruments",
    "create_rl_metric_instruments",
    "efficiency_categories",
    "flush",
    "prometheus_name",
    "record_metrics",
    "record_rl_metrics",
    "recorded_metrics",
    "register_metric_group",
    "register_recorded_metrics",
    "register_teed_metrics",
    "registry_key",
    "series_catalog",
    "set_efficiency_categories",
    "shutdown_telemetry",
    "start_telemetry",
    "stats",
    "tee_rl_metrics_to_otel",
    "teed_metrics",
    "warn_once",
]

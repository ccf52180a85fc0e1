"""async_tee: mirror an RL trainer's per-step metric dicts into OpenTelemetry, off the hot path.

Declare rows at import, start a session, tee each dict, shut down (docs/semantics.md §1, §5, §7).
"""

from __future__ import annotations

from async_tee._declare import shipped as _default_rows  # noqa: F401 - declares the shipped rows at import
from async_tee._declare.rows import EfficiencyCategory, RecordedMetric, TeedMetric
from async_tee._handoff.caller import record_rl_metrics, tee_rl_metrics_to_otel
from async_tee._session.lifecycle import (
    DisabledSession,
    aflush,
    flush,
    shutdown_telemetry,
    start_telemetry,
    stats,
)
from async_tee._session.session import Pipeline
from async_tee._version import __version__
from async_tee.catalog import CatalogEntry, series_catalog
from async_tee.logger import Backend, JsonlBackend, Logger
from async_tee.metrics import create_rl_metric_instruments
from async_tee.vocabulary import (
    register_recorded_metrics,
    register_teed_metrics,
    set_efficiency_categories,
)

__all__ = [
    "Backend",
    "CatalogEntry",
    "DisabledSession",
    "EfficiencyCategory",
    "JsonlBackend",
    "Logger",
    "Pipeline",
    "RecordedMetric",
    "TeedMetric",
    "__version__",
    "aflush",
    "create_rl_metric_instruments",
    "flush",
    "record_rl_metrics",
    "register_recorded_metrics",
    "register_teed_metrics",
    "series_catalog",
    "set_efficiency_categories",
    "shutdown_telemetry",
    "start_telemetry",
    "stats",
    "tee_rl_metrics_to_otel",
]

"""The seed's module, kept as a facade: every name it had resolves here (docs/semantics.md §1)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from async_tee import _reporting
from async_tee._declare import groups as _rl_group
from async_tee._declare.groups import RL_METRIC_GROUP, ensure_metric_group_registered
from async_tee._declare.rows import (
    COLLECTOR_WALL_CLOCK_MEASUREMENT,
    DECLARATIONS,
    THREAD_SECONDS_MEASUREMENT,
    TRAIN_PREFIXES,
    WALL_CLOCK_MEASUREMENT,
)
from async_tee._declare.series import (
    EFFICIENCY_PCT,
    EFFICIENCY_SECONDS,
    RL_BUCKET_ATTR,
    RL_EFFICIENCY_CATEGORY_ATTR,
    RL_EFFICIENCY_MEASUREMENT_ATTR,
    RL_EFFICIENCY_PCT_METRIC,
    RL_EFFICIENCY_SECONDS_METRIC,
    RL_EFFICIENCY_WINDOW_ATTR,
    RL_SETUP_DURATION_METRIC,
    RL_SETUP_PHASE_ATTR,
    SETUP_DURATION,
)
from async_tee._handoff.caller import record_rl_metrics, tee_rl_metrics_to_otel
from async_tee._reporting import warn_once
from async_tee._session import lifecycle as _telemetry
from async_tee._worker import mapping as _mapping
from async_tee._worker.mapping import (
    RUN_WINDOW,
    STEP_WINDOW,
    efficiency_window,
    map_efficiency_seconds,
    map_setup_seconds,
    map_teed_scalars,
    setup_phase,
)
from async_tee._worker.recorder import RLRecorder
from async_tee.registry import FrozenAttributes, instrument_registry, record_metrics
from async_tee.vocabulary import efficiency_measurements

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

__all__ = [
    "COLLECTOR_WALL_CLOCK_MEASUREMENT",
    "RL_BUCKET_ATTR",
    "RL_EFFICIENCY_CATEGORY_ATTR",
    "RL_EFFICIENCY_MEASUREMENT_ATTR",
    "RL_EFFICIENCY_PCT_METRIC",
    "RL_EFFICIENCY_SECONDS_METRIC",
    "RL_EFFICIENCY_WINDOW_ATTR",
    "RL_METRIC_GROUP",
    "RL_SETUP_DURATION_METRIC",
    "RL_SETUP_PHASE_ATTR",
    "RUN_WINDOW",
    "STEP_WINDOW",
    "THREAD_SECONDS_MEASUREMENT",
    "WALL_CLOCK_MEASUREMENT",
    "create_rl_metric_instruments",
    "efficiency_measurements",
    "efficiency_window",
    "ensure_metric_group_registered",
    "map_efficiency_seconds",
    "map_setup_seconds",
    "map_teed_scalars",
    "record_rl_metrics",
    "setup_phase",
    "tee_rl_metrics_to_otel",
    "warn_once",
]

logger = logging.getLogger("async_tee")

# The seed's private names, bound to where each fact now lives.
_TRAIN_PREFIXES = TRAIN_PREFIXES
_EFFICIENCY_KEY_PREFIX = _mapping.EFFICIENCY_KEY_PREFIX
_EFFICIENCY_SECONDS_SUFFIX = _mapping.EFFICIENCY_SECONDS_SUFFIX
_metric_specs = _rl_group.metric_specs
_EFFICIENCY_SECONDS_KEY = EFFICIENCY_SECONDS.key
_EFFICIENCY_PCT_KEY_REGISTRY = EFFICIENCY_PCT.key
_SETUP_DURATION_KEY = SETUP_DURATION.key
_WARNED = _reporting._WARNED


def __getattr__(name: str) -> Any:
    # The seed's module-level flags, read live from the process's declarations.
    if name == "_REGISTERED":
        return RL_METRIC_GROUP in DECLARATIONS.groups
    if name == "_REGISTRATION_FAILED":
        return DECLARATIONS.rl_group_failed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def create_rl_metric_instruments() -> None:
    """Build the ``rl`` group's instruments now. No-op unless exporting. Never raises.

    ``start_telemetry`` already does this, so observable rows declared before it are
    exported; calling it again is harmless.
    """
    pipeline = _telemetry.active()
    if pipeline is not None:
        pipeline.instruments.create(RL_METRIC_GROUP)


def _recorder(meter: Meter | None) -> RLRecorder | None:
    """The active session's recorder for its meter (or None); a fresh one for another meter.

    A fresh recorder remembers no counted step, so per-step counter de-duplication spans
    calls only on the session's own recorder.
    """
    pipeline = _telemetry.active()
    if pipeline is not None and (meter is None or meter is pipeline.meter):
        return pipeline.consumer.recorder
    if meter is None or not ensure_metric_group_registered():
        return None
    return RLRecorder(instrument_registry(meter))


def _record(
    meter: Meter,
    values: Mapping[str, float],
    attributes: Mapping[str, Any] | FrozenAttributes | None = None,
) -> None:
    """Record against the ``rl`` group. ``record_metrics`` never raises."""
    record_metrics(meter, RL_METRIC_GROUP, values, attributes)


def _tee_setup_metrics(meter: Meter, metrics: Mapping[str, Any]) -> None:
    """Emit the start-up phase durations as ``rl.setup.duration``, one point per phase."""
    recorder = _recorder(meter)
    if recorder is not None:
        recorder.tee_setup(metrics)


def _tee_scalars(meter: Meter, metrics: Mapping[str, Any], step: Any = None) -> None:
    """Emit the declared training and vLLM scalars, unlabelled (counters once per step)."""
    recorder = _recorder(meter)
    if recorder is not None:
        recorder.tee_scalars(metrics, step)


def _tee_efficiency_metrics(meter: Meter, metrics: Mapping[str, Any]) -> None:
    """Emit the ``efficiency/*`` phase durations as ``rl.efficiency.*``."""
    recorder = _recorder(meter)
    if recorder is not None:
        recorder.tee_efficiency(metrics)


def _tee_rl_metrics_to_otel(
    metrics: Mapping[str, Any], prefix: str | None, step: Any = None, meter: Meter | None = None
) -> None:
    """Map and record one dict synchronously: what the worker does for one tee.

    Also the shape of the original, synchronous tee. Never raises.
    """
    try:
        recorder = _recorder(meter)
        if recorder is not None:
            recorder.tee(metrics, prefix, step)
    except Exception:  # noqa: BLE001 - never raise into the caller
        warn_once("tee:body", "async_tee: teeing a dict failed")

"""Best-effort mirroring of a trainer's per-step metric dicts into the ``rl.*`` OTel series.

``Logger.log_metrics`` calls :func:`tee_rl_metrics_to_otel` after its normal fan-out. On
the caller's thread that call only checks the prefix, takes a shallow snapshot and appends
it to the hand-off queue; the worker thread later runs :func:`_tee_rl_metrics_to_otel`,
which maps the snapshot to the four families (efficiency phase durations, training scalars,
vLLM engine deltas, start-up phases) and records them through the metric registry.

Every series is declared rather than hard-coded: the scalar rows come from the modules that
log them (:mod:`async_tee.vocabulary`), so adding an algorithm does not mean editing this
module. Only the prefixes whose dicts can carry a teed key are looked at.

This module imports no OpenTelemetry code: the meter arrives from ``start_telemetry``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from time import monotonic_ns
from typing import TYPE_CHECKING, Any

from async_tee import registry, reporting, vocabulary
from async_tee.handoff import DropOldestQueue
from async_tee.mapping import (
    COLLECTOR_WALL_CLOCK_MEASUREMENT,
    EFFICIENCY_KEY_PREFIX,
    EFFICIENCY_SECONDS_SUFFIX,
    RUN_WINDOW,
    STEP_WINDOW,
    THREAD_SECONDS_MEASUREMENT,
    WALL_CLOCK_MEASUREMENT,
    efficiency_categories,
    efficiency_measurements,
    efficiency_window,
    map_efficiency_pct,
    map_efficiency_seconds,
    map_setup_seconds,
    map_teed_scalars,
    setup_phase,
)
from async_tee.registry import FrozenAttributes, MetricSpec
from async_tee.reporting import warn_once
from async_tee.vocabulary import registry_key

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

__all__ = [
    "COLLECTOR_WALL_CLOCK_MEASUREMENT",
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

_TRAIN_PREFIXES: tuple[str | None, ...] = ("train", "")
_SETUP_PREFIX = "timing/setup"
# None counts as "" (SEMANTICS 2); every other prefix returns before any copy is made.
_TEED_PREFIXES = frozenset((*_TRAIN_PREFIXES, None, _SETUP_PREFIX))

RL_EFFICIENCY_SECONDS_METRIC = "rl.efficiency.seconds"
RL_EFFICIENCY_PCT_METRIC = "rl.efficiency.pct"
RL_EFFICIENCY_CATEGORY_ATTR = "rl.efficiency.category"
RL_EFFICIENCY_MEASUREMENT_ATTR = "rl.efficiency.measurement"
RL_EFFICIENCY_WINDOW_ATTR = "rl.efficiency.window"
RL_BUCKET_ATTR = "rl.bucket"
RL_SETUP_DURATION_METRIC = "rl.setup.duration"
RL_SETUP_PHASE_ATTR = "rl.setup.phase"
RL_METRIC_GROUP = "rl"

_EFFICIENCY_KEY_PREFIX = EFFICIENCY_KEY_PREFIX
_EFFICIENCY_SECONDS_SUFFIX = EFFICIENCY_SECONDS_SUFFIX
_EFFICIENCY_SECONDS_KEY = registry_key(RL_EFFICIENCY_SECONDS_METRIC)
_EFFICIENCY_PCT_KEY_REGISTRY = registry_key(RL_EFFICIENCY_PCT_METRIC)
_SETUP_DURATION_KEY = registry_key(RL_SETUP_DURATION_METRIC)

_REGISTERED = False
_REGISTRATION_FAILED = False
_WARNED = reporting._WARNED

# Set by start_telemetry while exporting, None otherwise: the tee's only gate.
_QUEUE: DropOldestQueue[Any] | None = None
_METER: Meter | None = None

# Filled at registration from the frozen declarations, for the worker's hot path.
_ROWS: tuple[vocabulary.TeedMetric, ...] = ()
_COUNTER_KEYS: frozenset[str] = frozenset()
_EFFICIENCY_ATTRIBUTES: dict[str, FrozenAttributes] = {}
_PCT_ATTRIBUTES = {
    window: FrozenAttributes(
        {RL_EFFICIENCY_MEASUREMENT_ATTR: WALL_CLOCK_MEASUREMENT, RL_EFFICIENCY_WINDOW_ATTR: window}
    )
    for window in (STEP_WINDOW, RUN_WINDOW)
}
# Counter deltas count once per (step, key): sync GRPO logs the rollout keys twice a step.
_COUNTED_STEP: dict[str, Any] = {}
_TEE_ERRORS = [0]


_DERIVED_DESCRIPTIONS = {
    RL_EFFICIENCY_SECONDS_METRIC: "Seconds spent per efficiency category (async runs).",
    RL_EFFICIENCY_PCT_METRIC: "Share of wall time spent productively.",
    RL_SETUP_DURATION_METRIC: "Start-up phase durations, reported once at step 0.",
}


def _metric_specs() -> list[MetricSpec]:
    """Build the full ``MetricSpec`` list for the ``rl`` group."""
    specs = [
        MetricSpec(row.key, row.name, row.kind, row.unit, row.description)
        for row in vocabulary.teed_metrics()
    ]
    specs += [
        MetricSpec(row.key, row.name, row.kind, row.unit, row.description, row.callback)
        for row in vocabulary.recorded_metrics()
    ]
    # Name, kind and unit come from vocabulary.DERIVED_SERIES, the one place that states
    # them (the declaration-time Prometheus collision check reads it too).
    specs += [
        MetricSpec(registry_key(name), name, kind, unit, _DERIVED_DESCRIPTIONS[name])
        for name, kind, unit in vocabulary.DERIVED_SERIES
    ]
    return specs


def _efficiency_attributes() -> dict[str, FrozenAttributes]:
    """Precompute the attribute set of every known category (bounded by the category map)."""
    out = {}
    for category, spec in efficiency_categories().items():
        attributes = {
            RL_EFFICIENCY_CATEGORY_ATTR: category,
            RL_EFFICIENCY_MEASUREMENT_ATTR: spec.measurement,
            RL_EFFICIENCY_WINDOW_ATTR: efficiency_window(category, spec.measurement),
        }
        if spec.bucket:
            attributes[RL_BUCKET_ATTR] = spec.bucket
        out[category] = FrozenAttributes(attributes)
    return out


def ensure_metric_group_registered() -> bool:
    """Declare the ``rl`` metric group with the registry, once per process.

    Closes declaration (:func:`async_tee.vocabulary.freeze_metrics`). Called by
    ``start_telemetry``. Never raises.

    Returns:
        Whether the group is available to record against. False means registration failed
        for a reason retrying cannot fix (warned once), which makes every tee a no-op.
    """
    global _REGISTERED, _REGISTRATION_FAILED, _ROWS, _COUNTER_KEYS, _EFFICIENCY_ATTRIBUTES
    if _REGISTERED or _REGISTRATION_FAILED:
        return _REGISTERED
    try:
        vocabulary.freeze_metrics()
        rows = vocabulary.teed_metrics()
        registry.register_metric_group(RL_METRIC_GROUP, _metric_specs())
        _ROWS = rows
        _COUNTER_KEYS = frozenset(row.key for row in rows if row.kind == "counter")
        _EFFICIENCY_ATTRIBUTES = _efficiency_attributes()
        _REGISTERED = True
    except Exception:  # noqa: BLE001 - telemetry must not stop training from starting
        _REGISTRATION_FAILED = True
        warn_once(
            "register:rl",
            "async_tee: could not register the rl metric group; the tee is a no-op",
        )
    return _REGISTERED


def _record(
    meter: Meter,
    values: Mapping[str, float],
    attributes: Mapping[str, Any] | FrozenAttributes | None = None,
) -> None:
    """Record against the ``rl`` group. ``record_metrics`` never raises."""
    registry.record_metrics(meter, RL_METRIC_GROUP, values, attributes)


def record_rl_metrics(
    values: Mapping[str, float],
    attributes: Mapping[str, str] | None = None,
) -> None:
    """Record declared series by registry key. No-op unless exporting. Never raises.

    For values that never pass through ``Logger.log_metrics`` and so have no teed row;
    declare them with ``register_recorded_metrics`` first. Like the tee, this only
    snapshots and enqueues: the worker records. Safe from any thread.
    """
    queue = _QUEUE
    if queue is None:
        return
    try:
        snapshot = (dict(values), None, None if attributes is None else dict(attributes))
        queue.extend(zip(((*snapshot, monotonic_ns()),), queue.counter))  # noqa: B905
    except Exception:  # noqa: BLE001 - never raise into the caller
        _TEE_ERRORS[0] += 1
        warn_once("record_rl_metrics", "async_tee: record_rl_metrics failed; values dropped")


def create_rl_metric_instruments() -> None:
    """Build the ``rl`` group's instruments now. No-op unless exporting. Never raises.

    ``start_telemetry`` already does this, so observable rows declared before it are
    exported; calling it again is harmless.
    """
    meter = _METER
    if meter is not None and ensure_metric_group_registered():
        registry.create_metric_instruments(meter, RL_METRIC_GROUP)


def _tee_setup_metrics(meter: Meter, metrics: Mapping[str, Any]) -> None:
    """Emit the start-up phase durations as ``rl.setup.duration``, one point per phase."""
    try:
        for phase, seconds in map_setup_seconds(metrics).items():
            _record(meter, {_SETUP_DURATION_KEY: seconds}, {RL_SETUP_PHASE_ATTR: phase})
    except Exception:  # noqa: BLE001 - one family's failure must not stop the others
        warn_once("tee:setup", "async_tee: teeing the setup phases failed")


def _tee_scalars(meter: Meter, metrics: Mapping[str, Any], step: Any = None) -> None:
    """Emit the declared training and vLLM scalars, unlabelled.

    A counter's delta is added the first time its ``(step, key)`` is seen; later copies in
    the same step are ignored. Without a step every call counts.
    """
    try:
        values = map_teed_scalars(metrics, _ROWS)
        if step is not None and _COUNTER_KEYS:
            for key in _COUNTER_KEYS.intersection(values):
                if key in _COUNTED_STEP and _COUNTED_STEP[key] == step:
                    del values[key]
                else:
                    _COUNTED_STEP[key] = step
        if values:
            _record(meter, values)
    except Exception:  # noqa: BLE001 - one family's failure must not stop the others
        warn_once("tee:scalars", "async_tee: teeing the training scalars failed")


def _tee_efficiency_metrics(meter: Meter, metrics: Mapping[str, Any]) -> None:
    """Emit the ``efficiency/*`` phase durations as ``rl.efficiency.*``."""
    try:
        attributes = _EFFICIENCY_ATTRIBUTES
        for category, seconds in map_efficiency_seconds(metrics, attributes).items():
            _record(meter, {_EFFICIENCY_SECONDS_KEY: seconds}, attributes[category])
        pct = map_efficiency_pct(metrics)
        if pct is not None:
            _record(meter, {_EFFICIENCY_PCT_KEY_REGISTRY: pct[0]}, _PCT_ATTRIBUTES[pct[1]])
    except Exception:  # noqa: BLE001 - one family's failure must not stop the others
        warn_once("tee:efficiency", "async_tee: teeing the efficiency metrics failed")


def tee_rl_metrics_to_otel(
    metrics: Mapping[str, Any], prefix: str | None, step: Any = None
) -> None:
    """Mirror one logged dict into OTel, later, on the worker. No-op unless exporting.

    On the caller's thread this only checks the prefix, copies the dict (callers mutate
    dicts after logging them) and appends the copy with a monotonic timestamp to the
    bounded drop-oldest queue: no mapping, no OTel call, no lock shared with the worker,
    no wake-up unless a burst is about to overflow the queue. Safe from any thread and from
    inside a running event loop.

    Args:
        metrics: The dict handed to ``Logger.log_metrics``.
        prefix: Its prefix; only ``train``, ``""`` (or None) and ``timing/setup`` are teed.
        step: The step the Logger passes; counter deltas count once per step and key.

    Never raises: ``Logger.log_metrics`` calls it unguarded on every step.
    """
    queue = _QUEUE
    if queue is None:
        return
    try:
        if prefix not in _TEED_PREFIXES:
            return
        snapshot = (dict(metrics), prefix or "", step, monotonic_ns())
        # One C call appends the snapshot with its sequence number (see handoff.py). No
        # strict= keyword: it sends zip through its slow keyword-argument parser.
        queue.extend(zip((snapshot,), queue.counter))  # noqa: B905
        if len(queue.items) >= queue.high_water:
            queue.on_high_water()
    except Exception:  # noqa: BLE001 - never raise into training
        _TEE_ERRORS[0] += 1
        warn_once("tee", "async_tee: tee_rl_metrics_to_otel failed; dict dropped")


def _tee_rl_metrics_to_otel(
    metrics: Mapping[str, Any], prefix: str | None, step: Any = None, meter: Meter | None = None
) -> None:
    """Map and record one dict synchronously: the worker's body for one tee.

    Also the shape of the original, synchronous tee (the benchmarks' inline baseline).
    Never raises.
    """
    try:
        meter = meter or _METER
        if meter is None or not ensure_metric_group_registered():
            return
        if prefix == _SETUP_PREFIX:
            _tee_setup_metrics(meter, metrics)
        elif prefix in _TRAIN_PREFIXES or prefix is None:
            _tee_scalars(meter, metrics, step)
            if not prefix:
                _tee_efficiency_metrics(meter, metrics)
    except Exception:  # noqa: BLE001 - never raise into the worker
        warn_once("tee:body", "async_tee: teeing a dict failed")

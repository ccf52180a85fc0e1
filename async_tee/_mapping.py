"""Pure mappers from a raw ``Logger`` metrics dict to the values of the ``rl.*`` series.

Nothing here touches OpenTelemetry or keeps state beyond the declared efficiency
categories: each mapper takes a dict and returns a new one, so it is table-testable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from async_tee._declarations import (
    COLLECTOR_WALL_CLOCK_MEASUREMENT,
    DECLARATIONS,
    MEASUREMENT_KINDS,
    THREAD_SECONDS_MEASUREMENT,
    WALL_CLOCK_MEASUREMENT,
    EfficiencyCategory,
    TeedMetric,
)
from async_tee.vocabulary import RUN_WINDOW_WALL_CLOCK_CATEGORIES, as_scalar, teed_metrics

__all__ = [
    "COLLECTOR_WALL_CLOCK_MEASUREMENT",
    "EFFICIENCY_KEY_PREFIX",
    "EFFICIENCY_PCT_IS_PER_STEP_KEY",
    "EFFICIENCY_PCT_KEY",
    "EFFICIENCY_SECONDS_SUFFIX",
    "MEASUREMENT_KINDS",
    "RUN_WINDOW",
    "STEP_WINDOW",
    "THREAD_SECONDS_MEASUREMENT",
    "WALL_CLOCK_MEASUREMENT",
    "EfficiencyCategory",
    "efficiency_categories",
    "efficiency_measurements",
    "efficiency_seconds_key",
    "efficiency_window",
    "map_efficiency_pct",
    "map_efficiency_seconds",
    "map_setup_seconds",
    "map_teed_scalars",
    "set_efficiency_categories",
    "setup_phase",
]

STEP_WINDOW = "step"
"""The value covers the current step (the driver resets its timer every step)."""

RUN_WINDOW = "run"
"""The value is cumulative over the run so far."""

EFFICIENCY_KEY_PREFIX = "efficiency/"
EFFICIENCY_SECONDS_SUFFIX = "_s"
EFFICIENCY_PCT_KEY = "efficiency/efficiency_pct"
EFFICIENCY_PCT_IS_PER_STEP_KEY = "efficiency/efficiency_pct_is_per_step"

_SETUP_SUFFIXES = ("_time_s", "_s")


def set_efficiency_categories(categories: Mapping[str, EfficiencyCategory | str]) -> None:
    """Replace the known efficiency categories (only before telemetry starts).

    Args:
        categories: ``{category: EfficiencyCategory}``, or ``{category: measurement}``
            for categories without a bucket.

    Raises:
        ValueError: A category is empty or a measurement kind is unknown.
        RuntimeError: Telemetry has started and declarations are closed.
    """
    parsed: dict[str, EfficiencyCategory] = {}
    for category, spec in categories.items():
        if isinstance(spec, str):
            spec = EfficiencyCategory(spec)
        if not isinstance(category, str) or not category:
            raise ValueError(f"efficiency category must be a non-empty string: {category!r}")
        if not isinstance(spec, EfficiencyCategory) or spec.measurement not in MEASUREMENT_KINDS:
            raise ValueError(
                f"efficiency category {category!r}: measurement must be one of "
                f"{MEASUREMENT_KINDS}, got {spec!r}"
            )
        parsed[category] = spec
    DECLARATIONS.check_not_frozen("rl.efficiency.seconds")
    DECLARATIONS.categories.clear()
    DECLARATIONS.categories.update(parsed)


def efficiency_categories() -> dict[str, EfficiencyCategory]:
    """Every known efficiency category with its measurement and bucket."""
    return dict(DECLARATIONS.categories)


def efficiency_measurements() -> dict[str, str]:
    """Map each known efficiency category to its measurement kind."""
    return {category: spec.measurement for category, spec in DECLARATIONS.categories.items()}


def efficiency_window(category: str, measurement: str) -> str:
    """Return the period one efficiency value covers.

    Wall-clock timers are reset every step except the run-window categories
    (``init/total``, measured once and republished); every other measurement kind is a
    cumulative timer that is never reset.
    """
    if measurement == WALL_CLOCK_MEASUREMENT:
        return RUN_WINDOW if category in RUN_WINDOW_WALL_CLOCK_CATEGORIES else STEP_WINDOW
    return RUN_WINDOW


def map_efficiency_seconds(
    metrics: Mapping[str, Any], measurement_by_category: Mapping[str, object]
) -> dict[str, float]:
    """Extract ``{category: seconds}`` from a raw ``Logger`` metrics dict.

    Looks up only the categories in ``measurement_by_category``, which keeps the aggregate
    ``efficiency/*`` keys (``total_waste_s``, ``productive_time_s``, ``total_wall_time_s``,
    ``thread_seconds_total_s``) out of the per-category series even though they share the
    prefix and suffix. Values that are not scalars are left out.
    """
    out: dict[str, float] = {}
    for category in measurement_by_category:
        raw = metrics.get(efficiency_seconds_key(category))
        if raw is None:
            continue
        value = as_scalar(raw)
        if value is not None:
            out[category] = value
    return out


def efficiency_seconds_key(category: str) -> str:
    """The ``Logger`` key of a category's seconds: ``efficiency/<category>_s``."""
    return f"{EFFICIENCY_KEY_PREFIX}{category}{EFFICIENCY_SECONDS_SUFFIX}"


def map_efficiency_pct(metrics: Mapping[str, Any]) -> tuple[float, str] | None:
    """Extract ``(pct, window)`` from a raw dict, or None when it carries no usable pct.

    The window is ``step`` only when ``efficiency/efficiency_pct_is_per_step`` is truthy;
    absent or falsy means ``run``, because a run-to-date ratio labelled per-step is the
    harmful mistake.
    """
    raw = metrics.get(EFFICIENCY_PCT_KEY)
    value = None if raw is None else as_scalar(raw)
    if value is None:
        return None
    flag = metrics.get(EFFICIENCY_PCT_IS_PER_STEP_KEY)
    try:
        per_step = bool(flag) and flag == flag  # NaN is truthy but means "unknown"
    except Exception:  # noqa: BLE001 - an array-like flag has no truth value
        per_step = False
    return value, STEP_WINDOW if per_step else RUN_WINDOW


def setup_phase(key: Any) -> str | None:
    """Return the start-up phase a ``timing/setup`` key names, or None.

    ``vllm_init_time_s`` -> ``vllm_init``; ``foo_s`` -> ``foo``; ``_s``, ``_time_s`` and
    keys without either suffix (flags such as ``parallel_init_enabled``) name no phase.
    """
    if not isinstance(key, str):
        return None
    for suffix in _SETUP_SUFFIXES:
        if key.endswith(suffix):
            phase = key[: -len(suffix)]
            return phase or None
    return None


def map_setup_seconds(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Extract ``{phase: seconds}`` from a ``timing/setup`` dict; non-numbers are left out."""
    out: dict[str, float] = {}
    for key, raw in metrics.items():
        phase = setup_phase(key)
        if phase is None:
            continue
        value = as_scalar(raw)
        if value is not None:
            out[phase] = value
    return out


def read_keys(rows: Iterable[TeedMetric], categories: Iterable[str]) -> tuple[str, ...]:
    """Every key the mapping reads from a ``train`` or ``""`` dict, and no other.

    The declared rows' logger keys, each known efficiency category's seconds key and the
    efficiency-percent pair: the caller snapshots a very large dict to these (§6).
    """
    keys = [row.logger_key for row in rows]
    keys += [efficiency_seconds_key(c) for c in categories]
    keys += [EFFICIENCY_PCT_KEY, EFFICIENCY_PCT_IS_PER_STEP_KEY]
    return tuple(dict.fromkeys(keys))


def map_teed_scalars(
    metrics: Mapping[str, Any], rows: Iterable[TeedMetric] | None = None
) -> dict[str, float]:
    """Extract ``{registry key: value}`` for every declared row present in ``metrics``.

    Args:
        metrics: A raw ``Logger`` metrics dict.
        rows: The rows to look up; every declared teed row by default.

    Returns:
        Counters included, e.g. ``{"reward_mean": 0.75, "vllm_prompt_tokens": 400.0}``.
        An absent key or a value that is not a scalar is left out: absent means no data,
        never zero.
    """
    out: dict[str, float] = {}
    for row in teed_metrics() if rows is None else rows:
        raw = metrics.get(row.logger_key)
        if raw is None:
            continue
        value = as_scalar(raw)
        if value is not None:
            out[row.key] = value
    return out

"""The mapping from a raw ``Logger`` metrics dict to the ``rl.*`` series, in one place.

Which prefixes are teed, which keys are read, and how each value becomes a series value
(docs/semantics.md §2, §3). :func:`compile_plan` turns the closed declarations (rows and
efficiency categories) into a :class:`MappingPlan`; the worker's recorder binds it to its
tables and runs it with :func:`scalar_values` and :func:`efficiency_values`, and the pure
mappers of the seed's API (:func:`map_teed_scalars`, :func:`map_efficiency_seconds`) are
the same functions over the same plans with no tables, so the two cannot disagree. Nothing
here writes a declaration or touches OpenTelemetry.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from async_tee import _series
from async_tee._declarations import WALL_CLOCK_MEASUREMENT, EfficiencyCategory, TeedMetric
from async_tee.registry import NO_ATTRIBUTES, FrozenAttributes
from async_tee.vocabulary import RUN_WINDOW_WALL_CLOCK_CATEGORIES, as_scalar, teed_metrics

TRAIN_PREFIXES: tuple[str | None, ...] = ("train", "")
"""Prefixes of the per-step dicts (the training scalars and the efficiency dict)."""

SETUP_PREFIX = "timing/setup"
"""Prefix of the start-up phases dict, logged once at step 0."""

TEED_PREFIXES = frozenset((*TRAIN_PREFIXES, None, SETUP_PREFIX))
"""Every prefix the tee takes; None counts as ``""``."""

STEP_WINDOW = "step"
"""The value covers the current step (the driver resets its timer every step)."""

RUN_WINDOW = "run"
"""The value is cumulative over the run so far."""

EFFICIENCY_KEY_PREFIX = "efficiency/"
EFFICIENCY_SECONDS_SUFFIX = "_s"
EFFICIENCY_PCT_KEY = "efficiency/efficiency_pct"
EFFICIENCY_PCT_IS_PER_STEP_KEY = "efficiency/efficiency_pct_is_per_step"

_SETUP_SUFFIXES = ("_time_s", "_s")


class Store(Protocol):
    """A registry table's one-store fast path (``registry._LastValue.store``)."""

    def store(self, raw: Any, attributes: FrozenAttributes) -> bool:
        """Record ``raw`` at once if it is a finite float for a held set; else False."""


ScalarPlan = tuple[tuple[str, str, bool, "Store | None"], ...]
"""Per declared row: its ``Logger`` key, its registry key, whether it is a counter (fed
per-step deltas), and its table (None: every value takes the registry's checks)."""

EfficiencyPlan = tuple[tuple[str, str], ...]
"""Per known category: its ``Logger`` seconds key and the category."""


@dataclasses.dataclass(frozen=True)
class MappingPlan:
    """What the mapping reads from a ``train`` or ``""`` dict, compiled once a session.

    Attributes:
        scalars: The declared rows, in declaration order.
        efficiency: The known efficiency categories.
        efficiency_attributes: Each category's attribute set on ``rl.efficiency.seconds``.
        read_keys: Every key read, and no other (the caller snapshots a very large dict to
            these, §6).
    """

    scalars: ScalarPlan
    efficiency: EfficiencyPlan
    efficiency_attributes: Mapping[str, FrozenAttributes]
    read_keys: tuple[str, ...]

    def bind(self, tables: Mapping[str, Store]) -> MappingPlan:
        """The same plan with each row's table (a session's registry), for the fast path."""
        scalars = tuple((lk, key, counted, tables.get(key)) for lk, key, counted, _ in self.scalars)
        return dataclasses.replace(self, scalars=scalars)


def efficiency_window(category: str, measurement: str) -> str:
    """Return the period one efficiency value covers.

    Wall-clock timers are reset every step except the run-window categories
    (``init/total``, measured once and republished); every other measurement kind is a
    cumulative timer that is never reset.
    """
    if measurement == WALL_CLOCK_MEASUREMENT:
        return RUN_WINDOW if category in RUN_WINDOW_WALL_CLOCK_CATEGORIES else STEP_WINDOW
    return RUN_WINDOW


def efficiency_seconds_key(category: str) -> str:
    """The ``Logger`` key of a category's seconds: ``efficiency/<category>_s``."""
    return f"{EFFICIENCY_KEY_PREFIX}{category}{EFFICIENCY_SECONDS_SUFFIX}"


def efficiency_attributes(
    categories: Mapping[str, EfficiencyCategory],
) -> dict[str, FrozenAttributes]:
    """The attribute set of every known category (bounded by the category map)."""
    out = {}
    for category, spec in categories.items():
        attributes = {
            _series.RL_EFFICIENCY_CATEGORY_ATTR: category,
            _series.RL_EFFICIENCY_MEASUREMENT_ATTR: spec.measurement,
            _series.RL_EFFICIENCY_WINDOW_ATTR: efficiency_window(category, spec.measurement),
        }
        if spec.bucket:
            attributes[_series.RL_BUCKET_ATTR] = spec.bucket
        out[category] = FrozenAttributes(attributes)
    return out


PCT_ATTRIBUTES = {
    window: FrozenAttributes(
        {
            _series.RL_EFFICIENCY_MEASUREMENT_ATTR: WALL_CLOCK_MEASUREMENT,
            _series.RL_EFFICIENCY_WINDOW_ATTR: window,
        }
    )
    for window in (STEP_WINDOW, RUN_WINDOW)
}
"""``rl.efficiency.pct``'s attribute set for each window."""


def _scalar_plan(rows: Iterable[TeedMetric]) -> ScalarPlan:
    return tuple((row.logger_key, row.key, row.kind == "counter", None) for row in rows)


def _efficiency_plan(categories: Iterable[str]) -> EfficiencyPlan:
    return tuple((efficiency_seconds_key(category), category) for category in categories)


def compile_plan(
    rows: Iterable[TeedMetric], categories: Mapping[str, EfficiencyCategory]
) -> MappingPlan:
    """The plan for these rows and categories (the closed declarations, at session start)."""
    scalars = _scalar_plan(rows)
    efficiency = _efficiency_plan(categories)
    keys = [logger_key for logger_key, *_ in scalars]
    keys += [seconds_key for seconds_key, _ in efficiency]
    keys += [EFFICIENCY_PCT_KEY, EFFICIENCY_PCT_IS_PER_STEP_KEY]
    return MappingPlan(
        scalars, efficiency, efficiency_attributes(categories), tuple(dict.fromkeys(keys))
    )


def scalar_values(
    plan: ScalarPlan,
    metrics: Mapping[str, Any],
    step: Any = None,
    first_time: Callable[[Any, str], bool] | None = None,
) -> dict[str, float]:
    """Map the declared rows of one dict: ``{registry key: value}`` left to record.

    A value a row's table stores in one step (a finite float) is recorded there and left
    out; a counter's value counts only the first time its ``(step, key)`` is seen
    (``first_time``; without a step, or without ``first_time``, every value counts). An
    absent key or a value that is not a scalar is left out: absent means no data, never
    zero.
    """
    get = metrics.get
    values: dict[str, float] = {}
    for logger_key, key, counted, table in plan:
        raw = get(logger_key)
        if raw is None:
            continue
        if not counted and table is not None and table.store(raw, NO_ATTRIBUTES):
            continue
        value = as_scalar(raw)
        if value is None:
            continue
        if counted:  # a step's delta counts once: check before adding it
            if step is not None and first_time is not None and not first_time(step, key):
                continue
            if table is not None and table.store(raw, NO_ATTRIBUTES):
                continue
        values[key] = value
    return values


def efficiency_values(
    plan: EfficiencyPlan,
    metrics: Mapping[str, Any],
    table: Store | None = None,
    attributes: Mapping[str, FrozenAttributes] | None = None,
) -> Iterator[tuple[str, float]]:
    """Map the known categories' seconds of one dict: ``(category, seconds)`` left to record.

    Only the known categories' keys are read, so the aggregate ``efficiency/*_s`` keys
    (``total_waste_s``, ``productive_time_s``, ...) stay out of the per-category series.
    With a ``table`` (and the categories' ``attributes``), a finite float is stored at once
    and left out. Values that are not scalars are left out.
    """
    get = metrics.get
    for seconds_key, category in plan:
        raw = get(seconds_key)
        if raw is None:
            continue
        if table is not None and attributes is not None and table.store(raw, attributes[category]):
            continue
        value = as_scalar(raw)
        if value is not None:
            yield category, value


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


# The seed's pure mappers: views of the plans above, compiled once per set of rows.

_cached_scalar_plan = functools.lru_cache(maxsize=8)(_scalar_plan)
_cached_efficiency_plan = functools.lru_cache(maxsize=8)(_efficiency_plan)


def map_teed_scalars(
    metrics: Mapping[str, Any], rows: Iterable[TeedMetric] | None = None
) -> dict[str, float]:
    """Extract ``{registry key: value}`` for every declared row present in ``metrics``.

    Args:
        metrics: A raw ``Logger`` metrics dict.
        rows: The rows to look up; every declared teed row by default.

    Returns:
        Counters included, e.g. ``{"reward_mean": 0.75, "vllm_prompt_tokens": 400.0}``.
        An absent key or a value that is not a scalar is left out.
    """
    plan = _cached_scalar_plan(teed_metrics() if rows is None else tuple(rows))
    return scalar_values(plan, metrics)


def map_efficiency_seconds(
    metrics: Mapping[str, Any], measurement_by_category: Mapping[str, object]
) -> dict[str, float]:
    """Extract ``{category: seconds}`` for the categories in ``measurement_by_category``.

    Only those categories' keys are read (:func:`efficiency_values`).
    """
    plan = _cached_efficiency_plan(tuple(measurement_by_category))
    return dict(efficiency_values(plan, metrics))

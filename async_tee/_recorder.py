"""The worker's side of the tee: map one snapshot to the ``rl.*`` series and record it.

One :class:`RLRecorder` per session, built when the session starts from the declarations
it closed: the rows, the counter keys, the efficiency attribute sets, and the memory of
which counter deltas were already added (docs/semantics.md §3). Runs only on the worker
thread (or inline, in the benchmarks' baseline); never raises.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

from async_tee import _series
from async_tee._caller import SETUP_PREFIX, TRAIN_PREFIXES
from async_tee._declarations import EfficiencyCategory, TeedMetric
from async_tee._mapping import (
    RUN_WINDOW,
    STEP_WINDOW,
    WALL_CLOCK_MEASUREMENT,
    efficiency_categories,
    efficiency_seconds_key,
    efficiency_window,
    map_efficiency_pct,
    map_setup_seconds,
    read_keys,
)
from async_tee._reporting import warn_once
from async_tee._rl_group import RL_METRIC_GROUP
from async_tee.registry import (
    NO_ATTRIBUTES,
    FrozenAttributes,
    InstrumentRegistry,
    instrument_registry,
)
from async_tee.vocabulary import as_scalar, teed_metrics

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

    from async_tee.registry import _LastValue

_EFFICIENCY_SECONDS_KEY = _series.EFFICIENCY_SECONDS.key
_EFFICIENCY_PCT_KEY = _series.EFFICIENCY_PCT.key
_SETUP_DURATION_KEY = _series.SETUP_DURATION.key
_STEP_KEY = _series.STEP.key
_STEP_TIME_KEY = _series.STEP_TIME.key

ScalarPlan = tuple[tuple[str, str, "_LastValue | None"], ...]
"""Per declared row: its ``Logger`` key, its registry key, its table (or None)."""

EfficiencyPlan = tuple[tuple[str, FrozenAttributes, "_LastValue | None"], ...]
"""Per known category: its seconds key, its attribute set, the seconds gauge (or None)."""

COUNTED_STEPS = 64
"""Distinct steps whose counted keys are remembered; an older step counts again."""

_PCT_ATTRIBUTES = {
    window: FrozenAttributes(
        {
            _series.RL_EFFICIENCY_MEASUREMENT_ATTR: WALL_CLOCK_MEASUREMENT,
            _series.RL_EFFICIENCY_WINDOW_ATTR: window,
        }
    )
    for window in (STEP_WINDOW, RUN_WINDOW)
}


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


class CountedSteps:
    """Which counter keys had their delta added, for each of the most recent steps.

    A counter is fed per-step deltas, and a step may log the same key more than once (sync
    GRPO logs the rollout keys twice a step), possibly interleaved with another step's
    dicts. Remembering the keys per step, for the last :data:`COUNTED_STEPS` distinct
    steps, adds each ``(step, key)`` once with bounded memory.
    """

    __slots__ = ("_by_step", "capacity")

    def __init__(self, capacity: int = COUNTED_STEPS) -> None:
        self.capacity = capacity
        self._by_step: OrderedDict[Hashable, set[str]] = OrderedDict()

    def first_time(self, step: Any, key: str) -> bool:
        """Whether ``key``'s delta for ``step`` has not been added yet (and note it now).

        A step that cannot be hashed or compared is no step: every delta counts.
        """
        by_step = self._by_step
        try:
            keys = by_step.get(step)
        except Exception:  # noqa: BLE001 - an unhashable or uncomparable step
            return True
        if keys is None:
            keys = by_step[step] = set()
            if len(by_step) > self.capacity:
                by_step.popitem(last=False)
        else:
            by_step.move_to_end(step)
        if key in keys:
            return False
        keys.add(key)
        return True

    def __len__(self) -> int:
        return len(self._by_step)


class RLRecorder:
    """Maps and records one session's snapshots into the ``rl`` group of its meter."""

    def __init__(
        self,
        instruments: InstrumentRegistry,
        rows: tuple[TeedMetric, ...],
        categories: Mapping[str, EfficiencyCategory],
    ) -> None:
        """Bind the recorder to a meter's instruments and the closed declarations."""
        self.instruments = instruments
        self.rows = rows
        self.counter_keys = frozenset(row.key for row in rows if row.kind == "counter")
        self.efficiency_attributes = efficiency_attributes(categories)
        self.counted = CountedSteps()
        self.read_keys = read_keys(rows, categories)  # all it reads from train/"" dicts
        self._plans: tuple[ScalarPlan, EfficiencyPlan] | None = None
        self._tables: dict[str, _LastValue] | None = None

    @classmethod
    def for_meter(cls, meter: Meter) -> RLRecorder:
        """A recorder for ``meter`` over the current declarations (the group must exist)."""
        return cls(instrument_registry(meter), teed_metrics(), efficiency_categories())

    def record(
        self,
        values: Mapping[str, Any],
        attributes: Mapping[str, Any] | FrozenAttributes | None = None,
    ) -> None:
        """Record ``{registry key: value}`` against the ``rl`` group. Never raises."""
        self.instruments.record(RL_METRIC_GROUP, values, attributes)

    def tee(self, metrics: Mapping[str, Any], prefix: str | None, step: Any = None) -> None:
        """Map and record one teed dict. Never raises."""
        try:
            if prefix == SETUP_PREFIX:
                self.tee_setup(metrics)
            elif prefix in TRAIN_PREFIXES or prefix is None:
                self.tee_scalars(metrics, step)
                if not prefix:
                    self.tee_efficiency(metrics)
        except Exception:  # noqa: BLE001 - never raise into the worker
            warn_once("tee:body", "async_tee: teeing a dict failed")

    def tee_setup(self, metrics: Mapping[str, Any]) -> None:
        """Emit the start-up phase durations as ``rl.setup.duration``, one point per phase."""
        try:
            for phase, seconds in map_setup_seconds(metrics).items():
                self.record({_SETUP_DURATION_KEY: seconds}, {_series.RL_SETUP_PHASE_ATTR: phase})
        except Exception:  # noqa: BLE001 - one family's failure must not stop the others
            warn_once("tee:setup", "async_tee: teeing the setup phases failed")

    def tables(self) -> dict[str, _LastValue]:
        """The ``rl`` group's gauges and running totals by key, looked up once per session."""
        if self._tables is None:
            self._tables = self.instruments.tables(RL_METRIC_GROUP)
        return self._tables

    def record_step(self, step: float, completed_at: float) -> None:
        """Record ``rl.step`` and ``rl.step.time`` for a completed step. Never raises."""
        try:
            tables = self.tables()
            values = {}
            for key, value in ((_STEP_KEY, step), (_STEP_TIME_KEY, completed_at)):
                gauge = tables.get(key)
                if gauge is None or not gauge.store(value, NO_ATTRIBUTES):
                    values[key] = value
            if values:
                self.record(values)
        except Exception:  # noqa: BLE001 - never raise into the worker
            warn_once("tee:step", "async_tee: recording rl.step failed")

    def plans(self) -> tuple[ScalarPlan, EfficiencyPlan]:
        """What ``tee_scalars`` and ``tee_efficiency`` look up, resolved once per session.

        Each entry pairs a ``Logger`` key with what records its value, and the table
        (gauge or running total) whose ``store`` takes a finite float in one step (None:
        the checked path).
        """
        if self._plans is None:
            tables = self.tables()
            seconds = tables.get(_EFFICIENCY_SECONDS_KEY)
            self._plans = (
                tuple((row.logger_key, row.key, tables.get(row.key)) for row in self.rows),
                tuple(
                    (efficiency_seconds_key(category), attributes, seconds)
                    for category, attributes in self.efficiency_attributes.items()
                ),
            )
        return self._plans

    def tee_scalars(self, metrics: Mapping[str, Any], step: Any = None) -> None:
        """Emit the declared training and vLLM scalars, unlabelled.

        A counter's delta is added the first time its ``(step, key)`` is seen; later
        copies in the same step are ignored. Without a step every call counts. A value
        that is not a scalar is left out (``map_teed_scalars``); a finite float is stored
        at once (``_LastValue.store``), the rest goes through the registry's checks.
        """
        try:
            get = metrics.get
            counter_keys = self.counter_keys
            first_time = self.counted.first_time
            values: dict[str, float] = {}
            for logger_key, key, table in self.plans()[0]:
                raw = get(logger_key)
                if raw is None:
                    continue
                counted = key in counter_keys
                if not counted and table is not None and table.store(raw, NO_ATTRIBUTES):
                    continue
                value = as_scalar(raw)
                if value is None:
                    continue
                if counted:  # a step's delta counts once: check before adding it
                    if step is not None and not first_time(step, key):
                        continue
                    if table is not None and table.store(raw, NO_ATTRIBUTES):
                        continue
                values[key] = value
            if values:
                self.record(values)
        except Exception:  # noqa: BLE001 - one family's failure must not stop the others
            warn_once("tee:scalars", "async_tee: teeing the training scalars failed")

    def tee_efficiency(self, metrics: Mapping[str, Any]) -> None:
        """Emit the ``efficiency/*`` phase durations as ``rl.efficiency.*``.

        Only the known categories' keys are read (``map_efficiency_seconds``), so the
        aggregate ``efficiency/*_s`` keys stay out of the per-category series.
        """
        try:
            get = metrics.get
            for seconds_key, attributes, gauge in self.plans()[1]:
                raw = get(seconds_key)
                if raw is None or (gauge is not None and gauge.store(raw, attributes)):
                    continue
                value = as_scalar(raw)
                if value is not None:
                    self.record({_EFFICIENCY_SECONDS_KEY: value}, attributes)
            pct = map_efficiency_pct(metrics)
            if pct is not None:
                self.record({_EFFICIENCY_PCT_KEY: pct[0]}, _PCT_ATTRIBUTES[pct[1]])
        except Exception:  # noqa: BLE001 - one family's failure must not stop the others
            warn_once("tee:efficiency", "async_tee: teeing the efficiency metrics failed")

"""The worker's side of the tee: run the mapping plan over one snapshot and record it.

One :class:`RLRecorder` per session, built when the session starts over the plan
``_mapping`` compiled from the declarations it closed, bound to the session's tables, and
the memory of which counter deltas were already added (docs/semantics.md §3). Runs only
on the worker thread (or inline, in the benchmarks' baseline); never raises.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

from async_tee import _series
from async_tee._declarations import EfficiencyCategory, TeedMetric
from async_tee._mapping import (
    PCT_ATTRIBUTES,
    SETUP_PREFIX,
    TRAIN_PREFIXES,
    MappingPlan,
    compile_plan,
    efficiency_values,
    map_efficiency_pct,
    map_setup_seconds,
    scalar_values,
)
from async_tee._reporting import warn_once
from async_tee._rl_group import RL_METRIC_GROUP
from async_tee.registry import (
    NO_ATTRIBUTES,
    FrozenAttributes,
    InstrumentRegistry,
    instrument_registry,
)
from async_tee.vocabulary import efficiency_categories, teed_metrics

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

    from async_tee.registry import _LastValue

_EFFICIENCY_SECONDS_KEY = _series.EFFICIENCY_SECONDS.key
_EFFICIENCY_PCT_KEY = _series.EFFICIENCY_PCT.key
_SETUP_DURATION_KEY = _series.SETUP_DURATION.key
_STEP_KEY = _series.STEP.key
_STEP_TIME_KEY = _series.STEP_TIME.key

COUNTED_STEPS = 64
"""Distinct steps whose counted keys are remembered; an older step counts again."""


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
        self.plan = compile_plan(rows, categories)
        self.efficiency_attributes = self.plan.efficiency_attributes
        self.counted = CountedSteps()
        self.read_keys = self.plan.read_keys  # all it reads from train/"" dicts
        self._bound: MappingPlan | None = None
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

    def bound(self) -> MappingPlan:
        """The plan bound to this session's tables, once per session (the fast path)."""
        if self._bound is None:
            self._bound = self.plan.bind(self.tables())
        return self._bound

    def tee_scalars(self, metrics: Mapping[str, Any], step: Any = None) -> None:
        """Emit the declared training and vLLM scalars, unlabelled.

        A counter's delta is added the first time its ``(step, key)`` is seen; later
        copies in the same step are ignored. Without a step every call counts
        (``_mapping.scalar_values``). What a table did not store at once goes through the
        registry's checks.
        """
        try:
            values = scalar_values(self.bound().scalars, metrics, step, self.counted.first_time)
            if values:
                self.record(values)
        except Exception:  # noqa: BLE001 - one family's failure must not stop the others
            warn_once("tee:scalars", "async_tee: teeing the training scalars failed")

    def tee_efficiency(self, metrics: Mapping[str, Any]) -> None:
        """Emit the ``efficiency/*`` phase durations as ``rl.efficiency.*``.

        Only the known categories' keys are read (``_mapping.efficiency_values``), so the
        aggregate ``efficiency/*_s`` keys stay out of the per-category series.
        """
        try:
            attributes = self.efficiency_attributes
            seconds = self.tables().get(_EFFICIENCY_SECONDS_KEY)
            plan = self.bound().efficiency
            for category, value in efficiency_values(plan, metrics, seconds, attributes):
                self.record({_EFFICIENCY_SECONDS_KEY: value}, attributes[category])
            pct = map_efficiency_pct(metrics)
            if pct is not None:
                self.record({_EFFICIENCY_PCT_KEY: pct[0]}, PCT_ATTRIBUTES[pct[1]])
        except Exception:  # noqa: BLE001 - one family's failure must not stop the others
            warn_once("tee:efficiency", "async_tee: teeing the efficiency metrics failed")

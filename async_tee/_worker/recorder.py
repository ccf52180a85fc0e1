"""The worker's side of the tee: map one snapshot and record it (docs/semantics.md §3)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any, Protocol

from async_tee._declare import series as _series
from async_tee._declare.attributes import NO_ATTRIBUTES, FrozenAttributes
from async_tee._declare.groups import RL_METRIC_GROUP
from async_tee._declare.rows import (
    SETUP_PREFIX,
    STEP_TIMING_PREFIX,
    EfficiencyCategory,
    TeedMetric,
)
from async_tee._reporting import warn_once
from async_tee._settings import DEFAULT_TRAINER_KEYS
from async_tee._worker.gil import budget
from async_tee._worker.mapping import (
    KEY_LIMIT,
    PCT_ATTRIBUTES,
    STALE_STEP,
    UNKNOWN_CATEGORY,
    MappingPlan,
    Skipped,
    Store,
    compile_plan,
    count_skipped,
    efficiency_values,
    fleet_values,
    held_values,
    logged_values,
    map_efficiency_pct,
    map_setup_seconds,
    scalar_values,
    step_phase_values,
    unknown_categories,
)
from async_tee.vocabulary import efficiency_categories, recorded_metrics, teed_metrics

_EFFICIENCY_SECONDS_KEY = _series.EFFICIENCY_SECONDS.key
_EFFICIENCY_PCT_KEY = _series.EFFICIENCY_PCT.key
_SETUP_DURATION_KEY = _series.SETUP_DURATION.key
_STEP_PHASE_KEY = _series.STEP_PHASE_DURATION.key
_LOGGED_KEY = _series.LOGGED_VALUE.key
_STEP_KEY = _series.STEP.key
_STEP_TIME_KEY = _series.STEP_TIME.key

_PHASES_CACHED = 1024
"""Step phases whose attribute set is kept built; past it each is built per record."""

CATEGORIES_PER_OFFER = 64
"""Efficiency categories (or a trainer's keys) recorded between two offers of the GIL
(``_worker/gil``)."""

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

    def first_time(self, step: Any, key: str, _value: float = 0.0) -> bool:
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


class Table(Store, Protocol):
    """A series' table of last values or running totals (``_tables``): store, publish."""

    @property
    def points(self) -> Mapping[Any, Any]:
        """What is recorded for the step now open."""

    @property
    def shown(self) -> Mapping[Any, Any] | None:
        """What exports show since the last publish (None before the first)."""

    def publish(self) -> None:
        """A step completed: exports show the table as it is now."""


class Tables(Protocol):
    """What the recorder records into: one meter's instruments (``_tables``)."""

    def record(
        self,
        group: str,
        values: Mapping[str, Any],
        attributes: Mapping[str, Any] | FrozenAttributes | None = None,
    ) -> None:
        """Record ``{key: value}`` against a group's series, through every check."""

    def tables(self, group: str) -> Mapping[str, Table]:
        """The group's gauges and running totals by key."""


class RLRecorder:
    """Maps and records one session's snapshots into the ``rl`` group of its meter."""

    def __init__(
        self,
        instruments: Tables,
        rows: tuple[TeedMetric, ...] | None = None,
        categories: Mapping[str, EfficiencyCategory] | None = None,
        trainer_keys: int = DEFAULT_TRAINER_KEYS,
    ) -> None:
        """Bind the recorder to a meter's instruments and the declarations (the current ones).

        ``trainer_keys``: distinct keys each trainer's prefix passes through (§13).
        """
        rows = teed_metrics() if rows is None else rows
        categories = efficiency_categories() if categories is None else categories
        self.instruments = instruments
        self.plan = compile_plan(rows, categories)
        self.efficiency_attributes = self.plan.efficiency_attributes
        self.counted = CountedSteps()
        self.skipped: Skipped = {}  # values not taken at mapping, by reason
        # Held for the run, not per step: the start-up phases (logged once) and the
        # directly recorded rows (no step); every other table is published per step.
        self._held = frozenset((_SETUP_DURATION_KEY, *(row.key for row in recorded_metrics())))
        self._bound: MappingPlan | None = None
        self._tables: Mapping[str, Table] | None = None
        self._per_step: tuple[Table, ...] | None = None
        self._phases: dict[str, FrozenAttributes] = {}
        self._state_attributes: dict[str, FrozenAttributes] = {}
        self._logged: dict[str, dict[str, FrozenAttributes]] = {}  # per trainer, bounded
        self.trainer_keys = trainer_keys
        # While the first step the session numbers itself is open, a counter key logged a
        # third time in it shows the loop ends no step with a step-ending dict: the copies
        # held back are added after all, and ``unmarked`` tells the step clock to stop
        # numbering (docs/semantics.md §9).
        self.probing = False
        self.unmarked = False
        self._held_back: dict[str, list[float]] = {}

    def record(
        self,
        values: Mapping[str, Any],
        attributes: Mapping[str, Any] | FrozenAttributes | None = None,
    ) -> None:
        """Record ``{registry key: value}`` against the ``rl`` group. Never raises."""
        self.instruments.record(RL_METRIC_GROUP, values, attributes)

    def tee(
        self,
        metrics: Mapping[str, Any],
        prefix: str | None,
        step: Any = None,
        stale: bool = False,
    ) -> None:
        """Map and record one teed dict. Never raises.

        ``stale``: the dict belongs to a step that already completed (or is older than the
        open one), so its gauges' values are counted as skipped, not recorded: the tables
        hold a newer step (docs/semantics.md §9). Its counters' deltas still count.
        """
        try:
            if prefix == SETUP_PREFIX:
                self.tee_setup(metrics)
                return
            prefix = prefix or ""
            plan = self.bound()
            if plan.scalars.get(prefix):
                self.tee_scalars(metrics, step, prefix, stale)
            held = plan.held.get(prefix)
            if held:  # the state now, whatever the step: stale or not
                values = held_values(held, metrics, self.skipped)
                if values:
                    self.record(values)
            if prefix == "":
                self.tee_efficiency(metrics, stale)
                self.tee_fleet(metrics)
            elif prefix == STEP_TIMING_PREFIX:
                self.tee_step_phases(metrics, stale)
            elif prefix in plan.trainers:
                self.tee_logged(metrics, prefix, stale)
        except Exception:  # noqa: BLE001 - never raise into the worker
            warn_once("tee:body", "async_tee: teeing a dict failed")

    def tee_fleet(self, metrics: Mapping[str, Any]) -> None:
        """Record NeMo-RL's shard counts per state (held: whatever the dict's step)."""
        try:
            for state, count in fleet_values(metrics, self.skipped):
                attributes = self._state_attributes.get(state)
                if attributes is None:  # one per known state: bounded
                    attributes = self._state_attributes[state] = FrozenAttributes(
                        {_series.RL_SHARD_STATE_ATTR: state}
                    )
                self.record({_series.GEN_FLEET_SHARDS.key: count}, attributes)
        except Exception:  # noqa: BLE001 - one family's failure must not stop the others
            warn_once("tee:fleet", "async_tee: teeing the generation fleet's states failed")

    def _phase_attributes(self, phase: str) -> FrozenAttributes | dict[str, str]:
        """A phase's attribute set, built once per phase (a bounded number of them)."""
        found = self._phases.get(phase)
        if found is not None:
            return found
        attributes = {_series.RL_STEP_PHASE_ATTR: phase}
        if len(self._phases) >= _PHASES_CACHED:
            return attributes  # the registry bounds the sets; the cache stops growing
        try:
            frozen = self._phases[phase] = FrozenAttributes(attributes)
        except Exception:  # noqa: BLE001 - the registry's own checks count and warn
            return attributes
        return frozen

    def _first_time(self, step: Any, key: str, value: float) -> bool:
        """``CountedSteps.first_time`` while probing the first numbered step (see above)."""
        if self.counted.first_time(step, key) or self.unmarked:
            return True
        held = self._held_back.setdefault(key, [])
        held.append(value)
        if len(held) < 2:  # a second copy: the sync loop's rollout keys, logged twice a step
            return False
        self.unmarked = True
        held.pop()  # this copy counts now; the ones held back are added below
        totals = {held_key: math.fsum(values) for held_key, values in self._held_back.items()}
        self._held_back.clear()
        self.record(totals)
        return True

    def skip(self, reason: str, count: int = 1) -> None:
        """Count values not taken at mapping (``async_tee.values.skipped{reason}``)."""
        count_skipped(self.skipped, reason, count)

    def tee_setup(self, metrics: Mapping[str, Any]) -> None:
        """Emit the start-up phase durations as ``rl.setup.duration``, one point per phase."""
        try:
            for phase, seconds in map_setup_seconds(metrics).items():
                self.record({_SETUP_DURATION_KEY: seconds}, {_series.RL_SETUP_PHASE_ATTR: phase})
        except Exception:  # noqa: BLE001 - one family's failure must not stop the others
            warn_once("tee:setup", "async_tee: teeing the setup phases failed")

    def tables(self) -> Mapping[str, Table]:
        """The ``rl`` group's gauges and running totals by key, looked up once per session."""
        if self._tables is None:
            self._tables = self.instruments.tables(RL_METRIC_GROUP)
        return self._tables

    def record_step(self, step: float, completed_at: float) -> None:
        """Record ``rl.step`` and ``rl.step.time`` for a completed step, then publish it.

        From now on every export shows this step: each per-step table's points as they are
        now, and the next step's values are recorded apart (the table's ``publish``).
        Never raises.
        """
        try:
            tables = self.tables()
            values = {}
            for key, value in ((_STEP_KEY, step), (_STEP_TIME_KEY, completed_at)):
                gauge = tables.get(key)
                if gauge is None or not gauge.store(value, NO_ATTRIBUTES):
                    values[key] = value
            if values:
                self.record(values)
            for table in self.per_step_tables():
                # Publishing a table empty now and shown empty changes nothing: skipped.
                # (``shown`` first: a held table's is always None, and its points are
                # computed on each read.)
                if table.shown is None or table.points or table.shown:
                    table.publish()
        except Exception:  # noqa: BLE001 - never raise into the worker
            warn_once("tee:step", "async_tee: recording rl.step failed")

    def per_step_tables(self) -> tuple[Table, ...]:
        """The tables published at each completed step: every one but the held ones."""
        if self._per_step is None:
            held = self._held
            self._per_step = tuple(t for k, t in self.tables().items() if k not in held)
        return self._per_step

    def bound(self) -> MappingPlan:
        """The plan bound to this session's tables, once per session (the fast path)."""
        if self._bound is None:
            self._bound = self.plan.bind(self.tables())
        return self._bound

    def tee_scalars(
        self,
        metrics: Mapping[str, Any],
        step: Any = None,
        prefix: str = "train",
        stale: bool = False,
    ) -> None:
        """Emit the declared rows that read ``prefix``'s dicts, unlabelled.

        A counter's delta is added the first time its ``(step, key)`` is seen; later
        copies in the same step are ignored. Without a step every call counts
        (``_worker/mapping.scalar_values``). What a table did not store at once goes through the
        registry's checks.
        """
        try:
            plan = self.bound().scalars.get(prefix, ())
            first_time = self._first_time if self.probing else self.counted.first_time
            spend = budget().spend
            values = scalar_values(plan, metrics, step, first_time, self.skipped, stale, spend)
            if values:
                self.record(values)
        except Exception:  # noqa: BLE001 - one family's failure must not stop the others
            warn_once("tee:scalars", "async_tee: teeing the training scalars failed")

    def tee_efficiency(self, metrics: Mapping[str, Any], stale: bool = False) -> None:
        """Emit the ``efficiency/*`` phase durations as ``rl.efficiency.*``.

        Only the known categories' keys are read (``_worker/mapping.efficiency_values``), so the
        aggregate ``efficiency/*_s`` keys stay out of the per-category series; a category
        the map does not know is counted (``unknown_category``) and named once.
        """
        try:
            plan = self.bound()
            unknown = unknown_categories(metrics, plan.efficiency_keys)
            if unknown:
                self.skip(UNKNOWN_CATEGORY, len(unknown))
                warn_once(
                    "tee:efficiency:unknown",
                    "async_tee: efficiency keys of categories not in the map are not teed "
                    "(values.skipped{reason=unknown_category}): %s; declare them with "
                    "set_efficiency_categories",
                    ", ".join(repr(key) for key in unknown[:8]),
                )
            attributes = self.efficiency_attributes
            seconds = None if stale else self.tables().get(_EFFICIENCY_SECONDS_KEY)
            spend = budget().spend
            for done, (category, value) in enumerate(
                efficiency_values(plan.efficiency, metrics, seconds, attributes, self.skipped), 1
            ):
                if done % CATEGORIES_PER_OFFER == 0:  # hundreds of categories: not one hold
                    spend()
                if stale:
                    self.skip(STALE_STEP)
                else:
                    self.record({_EFFICIENCY_SECONDS_KEY: value}, attributes[category])
            pct = map_efficiency_pct(metrics)
            if pct is not None:
                if stale:
                    self.skip(STALE_STEP)
                else:
                    self.record({_EFFICIENCY_PCT_KEY: pct[0]}, PCT_ATTRIBUTES[pct[1]])
        except Exception:  # noqa: BLE001 - one family's failure must not stop the others
            warn_once("tee:efficiency", "async_tee: teeing the efficiency metrics failed")

    def tee_step_phases(self, metrics: Mapping[str, Any], stale: bool = False) -> None:
        """Emit a ``timing/train`` dict's phases as ``rl.step.phase.duration{rl.step.phase}``.

        Every key no row reads is a phase (``_worker/mapping.step_phase_values``). A finite float
        for a phase seen before is one store into the table; the rest goes through the
        registry's checks.
        """
        try:
            rows = self.bound().phase_rows
            table = None if stale else self.tables().get(_STEP_PHASE_KEY)
            for phase, seconds in step_phase_values(metrics, rows, self.skipped):
                if stale:
                    self.skip(STALE_STEP)
                else:
                    self._store(table, _STEP_PHASE_KEY, seconds, self._phase_attributes(phase))
        except Exception:  # noqa: BLE001 - one family's failure must not stop the others
            warn_once("tee:phases", "async_tee: teeing the step phases failed")

    def _store(
        self,
        table: Table | None,
        key: str,
        value: float,
        attributes: FrozenAttributes | dict[str, str],
    ) -> None:
        """Record one value: a store into its table when it takes it, else every check."""
        if (
            table is None
            or not isinstance(attributes, FrozenAttributes)
            or not table.store(value, attributes)
        ):
            self.record({key: value}, attributes)

    def tee_logged(self, metrics: Mapping[str, Any], prefix: str, stale: bool = False) -> None:
        """Emit a trainer's keys no alias reads: its phases, and the rest as logged.

        A key under the trainer's phase prefix goes to ``rl.step.phase.duration``; every
        other key to ``rl.logged.value{rl.trainer=prefix, rl.key=key}``, for the first
        ``trainer_keys`` distinct keys of the session; a key past them is counted
        (``key_limit``) and named once (docs/semantics.md §13).
        """
        try:
            plan = self.bound().trainers[prefix]
            tables = self.tables()
            phases = None if stale else tables.get(_STEP_PHASE_KEY)
            logged = None if stale else tables.get(_LOGGED_KEY)
            spend = budget().spend
            for done, (is_phase, name, value) in enumerate(
                logged_values(metrics, plan, self.skipped), 1
            ):
                if done % CATEGORIES_PER_OFFER == 0:  # hundreds of keys: not one hold
                    spend()
                if stale:
                    self.skip(STALE_STEP)
                elif is_phase:
                    self._store(phases, _STEP_PHASE_KEY, value, self._phase_attributes(name))
                else:
                    attributes = self._logged_attributes(prefix, name)
                    if attributes is not None:
                        self._store(logged, _LOGGED_KEY, value, attributes)
        except Exception:  # noqa: BLE001 - one family's failure must not stop the others
            warn_once("tee:logged", "async_tee: teeing a trainer's logged keys failed")

    def _logged_attributes(self, prefix: str, key: str) -> FrozenAttributes | None:
        """A passed-through key's attribute set, or None past the trainer's bound (counted)."""
        known = self._logged.setdefault(prefix, {})
        found = known.get(key)
        if found is not None:
            return found
        if len(known) >= self.trainer_keys:
            self.skip(KEY_LIMIT)
            warn_once(
                f"tee:key_limit:{prefix}",
                "async_tee: %s logged more than %d distinct keys; %r and later new keys are "
                "not teed (values.skipped{reason=key_limit}; ASYNC_TEE_TRAINER_KEYS)",
                prefix,
                self.trainer_keys,
                key,
            )
            return None
        try:
            attributes = FrozenAttributes(
                {_series.RL_TRAINER_ATTR: prefix, _series.RL_KEY_ATTR: key}
            )
        except ValueError:  # a key with no UTF-8 form (a lone surrogate): no label can hold it
            self.skip("rejected")
            warn_once("tee:logged:key", "async_tee: a logged key with no UTF-8 form is not teed")
            return None
        known[key] = attributes
        return attributes

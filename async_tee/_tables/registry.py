"""The metric registry: each meter's instruments and their tables (docs/semantics.md §4)."""

from __future__ import annotations

import bisect
import dataclasses
import math
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from async_tee._declare.attributes import NO_ATTRIBUTES, AttributeValue, FrozenAttributes
from async_tee._declare.groups import (
    RL_METRIC_GROUP,
    ensure_metric_group_registered,
)
from async_tee._declare.rows import DECLARATIONS, OBSERVABLE_KINDS, MetricSpec
from async_tee._declare.series import SELF_METRIC_GROUP
from async_tee._reporting import logger, warn_once
from async_tee._settings import DEFAULT_HELD_TTL_S
from async_tee._tables.self_series import StatsReader, StatsSource, no_session
from async_tee._worker.gil import budget
from async_tee.vocabulary import as_scalar

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation

DEFAULT_MAX_ATTRIBUTE_SETS = 512
"""Attribute sets kept per series; later sets are dropped and counted, not exported.

Below the SDK's own limit of 2,000, past which points silently merge into one
``otel.metric.overflow`` series.
"""


@dataclasses.dataclass
class RegistryCounts:
    """What a registry refused to record, by reason; read by self-telemetry."""

    non_finite: int = 0
    rejected: int = 0
    cardinality: int = 0
    errors: int = 0
    held_expired: int = 0  # a held set withdrawn, not logged again within the TTL
    non_finite_by_series: dict[str, int] = dataclasses.field(default_factory=dict)


class Instrument:
    """One instrument of a group, and how a value is recorded to it."""

    __slots__ = ("owner", "spec")

    def __init__(self, spec: MetricSpec, owner: InstrumentRegistry) -> None:
        self.spec = spec
        self.owner = owner

    def record(self, value: float, attributes: FrozenAttributes) -> None:
        raise NotImplementedError

    def refuse_attribute_set(self, limit: int) -> None:
        """Count and report (once per series) an attribute set past the series' bound."""
        self.owner.counts.cardinality += 1
        warn_once(
            f"cardinality:{self.spec.name}",
            "async_tee: series %s reached %d attribute sets; new sets are dropped",
            self.spec.name,
            limit,
        )

    def refuse_negative(self, value: float, what: str) -> None:
        """Count and report (once per series) a negative ``what`` (delta, total) of a counter."""
        self.owner.counts.rejected += 1
        warn_once(
            f"negative:{self.spec.name}",
            "async_tee: counter %s got a negative %s %r; dropped",
            self.spec.name,
            what,
            value,
        )


class LastValue(Instrument):
    """A gauge: the latest value per attribute set, reported by an observable gauge.

    ``points`` is what is being recorded now. Once :meth:`publish` has run (a step of a
    per-step series completed), an export reports ``shown``, the points as they were at
    the last publication, and ``points`` starts empty for the next step: a set not
    recorded in a step is absent from that step's export (docs/semantics.md §9).
    """

    __slots__ = ("_observation", "limit", "points", "sets", "shown")

    def __init__(
        self, spec: MetricSpec, owner: InstrumentRegistry, observation: type[Observation]
    ) -> None:
        super().__init__(spec, owner)
        self._observation = observation
        self.limit = owner.max_attribute_sets
        self.points: dict[tuple[tuple[str, AttributeValue], ...], tuple[float, FrozenAttributes]]
        self.points = {}
        self.shown: (
            dict[tuple[tuple[str, AttributeValue], ...], tuple[float, FrozenAttributes]] | None
        ) = None
        self.sets: set[tuple[tuple[str, AttributeValue], ...]] = set()  # admitted, bounded

    def _admit(self, attributes: FrozenAttributes) -> bool:
        sets = self.sets
        if attributes.key in sets:
            return True
        if len(sets) < self.limit:
            sets.add(attributes.key)
            return True
        self.refuse_attribute_set(self.limit)
        return False

    def record(self, value: float, attributes: FrozenAttributes) -> None:
        if self._admit(attributes):
            self.points[attributes.key] = (value, attributes)

    def clear(self, attributes: FrozenAttributes) -> None:
        self.points.pop(attributes.key, None)

    def store(self, raw: Any, attributes: FrozenAttributes) -> bool:
        """Record ``raw`` if it is a finite ``float`` for a set this gauge already admitted.

        The worker's fast path: such a value passes every check ``record`` would make
        (scalar, finite, admitted), so recording it is one store. Returns False for
        anything else, which the caller then records through :meth:`InstrumentRegistry.record`.
        """
        if type(raw) is float and raw - raw == 0.0 and attributes.key in self.sets:
            self.points[attributes.key] = (raw, attributes)
            return True
        return False

    def publish(self) -> None:
        """A step completed: exports report its points from now on; the next step starts empty."""
        self.shown, self.points = self.points, {}

    def forget(self) -> None:
        """Drop every value and admitted set (a forked child exports only its own)."""
        self.points = {}
        self.shown = None
        self.sets = set()

    def observe(self, _options: CallbackOptions) -> list[Observation]:
        budget().spend()  # a collection is a run of callbacks: slice it between them
        shown = self.shown
        # dict.copy() is atomic under the GIL: the exporter's thread reads a consistent
        # snapshot while the worker keeps writing (a published dict is no longer written).
        points = self.points.copy() if shown is None else shown
        return [
            self._observation(value, attributes.mapping) for value, attributes in points.values()
        ]


class RunningTotal(LastValue):
    """A counter or up-down counter: a running total per attribute set, fed deltas.

    Publishing keeps the totals running and shows a copy of them as they were.
    """

    __slots__ = ("monotonic",)

    def __init__(
        self, spec: MetricSpec, owner: InstrumentRegistry, observation: type[Observation]
    ) -> None:
        super().__init__(spec, owner, observation)
        self.monotonic = spec.kind == "counter"

    def record(self, value: float, attributes: FrozenAttributes) -> None:
        if self.monotonic and value < 0:
            self.refuse_negative(value, "delta")
            return
        with self.owner.lock:
            if self._admit(attributes):
                previous = self.points.get(attributes.key)
                total = value if previous is None else previous[0] + value
                self.points[attributes.key] = (total, attributes)

    def clear(self, attributes: FrozenAttributes) -> None:
        """A total has no stale value to withdraw: a non-finite delta is only skipped."""

    def publish(self) -> None:
        """A step completed: exports report the totals as they were at its end."""
        with self.owner.lock:
            self.shown = self.points.copy()

    def store(self, raw: Any, attributes: FrozenAttributes) -> bool:
        """Add ``raw`` if it is a finite ``float`` delta for a set this total already holds.

        Not negative, for a counter. False otherwise (see :meth:`LastValue.store`).
        """
        if type(raw) is not float or raw - raw != 0.0 or (self.monotonic and raw < 0):
            return False
        key = attributes.key
        with self.owner.lock:
            previous = self.points.get(key)
            if previous is None:
                return False
            self.points[key] = (previous[0] + raw, attributes)
        return True


class HeldValue(LastValue):
    """A held series: the last value logged per attribute set, in every export while fresh.

    A step's completion publishes nothing (``shown`` stays None: every export reads
    ``points``). Reading ``points`` judges them: a set not logged within the owner's
    ``held_ttl_s`` (0: never) is withdrawn there and then, counted once, until it is logged
    again; so every reader (the SDK's callback, the table encoder) exports only fresh
    values without knowing why (docs/semantics.md §3g). For a
    counter the value is the logged running total, reported as the counter's total.
    """

    __slots__ = ("_points", "_when")

    def __init__(
        self, spec: MetricSpec, owner: InstrumentRegistry, observation: type[Observation]
    ) -> None:
        self._points: dict[
            tuple[tuple[str, AttributeValue], ...], tuple[float, FrozenAttributes]
        ] = {}
        self._when: dict[tuple[tuple[str, AttributeValue], ...], float] = {}  # on owner.clock
        super().__init__(spec, owner, observation)

    @property
    def points(
        self,
    ) -> dict[tuple[tuple[str, AttributeValue], ...], tuple[float, FrozenAttributes]]:
        """The sets logged within the TTL (a reader copies it); staler ones withdrawn now."""
        ttl = self.owner.held_ttl_s
        when = self._when
        if ttl > 0 and when:
            cutoff = self.owner.clock() - ttl
            if min(when.values()) < cutoff:  # in C, under the GIL: the worker may be logging
                self._withdraw(cutoff)
        return self._points

    @points.setter
    def points(
        self, points: dict[tuple[tuple[str, AttributeValue], ...], tuple[float, FrozenAttributes]]
    ) -> None:
        """Replace every set's value, as logged now (``LastValue`` starts and forgets so)."""
        self._points = dict(points)
        self._when = dict.fromkeys(points, self.owner.clock())

    def _withdraw(self, cutoff: float) -> None:
        """Drop the sets last logged before ``cutoff``; count each once, say it at debug."""
        with self.owner.lock:  # not a set the worker is logging again right now
            stale = [key for key, at in self._when.items() if at < cutoff]
            for key in stale:
                del self._when[key]
                self._points.pop(key, None)
            self.owner.counts.held_expired += len(stale)
        if stale:
            logger.debug(
                "async_tee: %s: %d attribute set(s) not logged for %g s; withdrawn until logged",
                self.spec.name,
                len(stale),
                self.owner.held_ttl_s,
            )

    def _log(self, value: float, attributes: FrozenAttributes) -> None:
        key = attributes.key
        with self.owner.lock:
            self._when[key] = self.owner.clock()
            self._points[key] = (value, attributes)

    def record(self, value: float, attributes: FrozenAttributes) -> None:
        if self.spec.kind == "counter" and value < 0:
            self.refuse_negative(value, "total")
            return
        if self._admit(attributes):
            self._log(value, attributes)

    def store(self, raw: Any, attributes: FrozenAttributes) -> bool:
        """Log ``raw`` if it is a finite ``float`` for an admitted set, else False.

        Not negative, for a counter (see :meth:`LastValue.store`).
        """
        if type(raw) is not float or raw - raw != 0.0 or attributes.key not in self.sets:
            return False
        if self.spec.kind == "counter" and raw < 0:
            return False
        self._log(raw, attributes)
        return True

    def clear(self, attributes: FrozenAttributes) -> None:
        with self.owner.lock:
            self._points.pop(attributes.key, None)
            self._when.pop(attributes.key, None)

    def publish(self) -> None:
        """Held for the run: a completed step changes nothing."""


_SDK_DEFAULT_BUCKETS = (0, 5, 10, 25, 50, 75, 100, 250, 500, 750, 1000, 2500, 5000, 7500, 10000)
"""The SDK's explicit bucket boundaries for a histogram that names none."""


class HistogramPoint:
    """One attribute set's explicit-bucket histogram, as the SDK's cumulative aggregation."""

    __slots__ = ("attributes", "counts", "max", "min", "start_ns", "sum")

    def __init__(self, attributes: FrozenAttributes, buckets: int) -> None:
        self.attributes = attributes
        self.counts = [0] * (buckets + 1)
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.start_ns = time.time_ns()


class Histogram(Instrument):
    """A histogram recorded into the SDK's instrument and into a table of its own.

    The table (``points``, bucketed by ``bounds``) is what an export built from the tables
    reads (``_export/encode``); the SDK's instrument serves every other reader.
    """

    __slots__ = ("_instrument", "_seen", "bounds", "limit", "points")

    def __init__(self, spec: MetricSpec, owner: InstrumentRegistry, meter: Meter) -> None:
        super().__init__(spec, owner)
        self._instrument = meter.create_histogram(
            spec.name,
            unit=spec.unit,
            description=spec.description,
            explicit_bucket_boundaries_advisory=list(spec.buckets) if spec.buckets else None,
        )
        self._seen: set[tuple[tuple[str, AttributeValue], ...]] = set()
        self.limit = owner.max_attribute_sets
        self.bounds: tuple[float, ...] = tuple(spec.buckets or _SDK_DEFAULT_BUCKETS)
        self.points: dict[tuple[tuple[str, AttributeValue], ...], HistogramPoint] = {}

    def record(self, value: float, attributes: FrozenAttributes) -> None:
        if attributes.key not in self._seen:
            if len(self._seen) >= self.limit:
                self.refuse_attribute_set(self.limit)
                return
            self._seen.add(attributes.key)
        self._instrument.record(value, attributes.mapping)
        point = self.points.get(attributes.key)
        if point is None:
            point = self.points[attributes.key] = HistogramPoint(attributes, len(self.bounds))
        point.counts[bisect.bisect_left(self.bounds, value)] += 1
        point.sum += value
        point.min = min(point.min, value)
        point.max = max(point.max, value)


class Observed(Instrument):
    """An observable row whose owner supplies the callback; recording to it is an error."""

    __slots__ = ("callback", "reader")

    def __init__(
        self,
        spec: MetricSpec,
        owner: InstrumentRegistry,
        callback: Callable[[CallbackOptions], Iterable[Observation]],
        reader: StatsReader | None = None,
    ) -> None:
        super().__init__(spec, owner)
        self.callback = callback  # the guarded callback the SDK's instrument calls too
        self.reader = reader  # async_tee's own series: its reader of the registry's stats

    def record(self, value: float, attributes: FrozenAttributes) -> None:
        self.owner.counts.rejected += 1
        warn_once(
            f"observable:{self.spec.name}",
            "async_tee: %s is observable (its callback reports it); recorded value dropped",
            self.spec.name,
        )


class Unavailable(Instrument):
    """A series whose instrument could not be created: its values are dropped.

    Stands in for the instrument so that a value for it is not reported a second time,
    as a key unknown to the group; the creation failure already warned once.
    """

    __slots__ = ("group",)

    def __init__(self, spec: MetricSpec, owner: InstrumentRegistry, group: str) -> None:
        super().__init__(spec, owner)
        self.group = group

    def record(self, value: float, attributes: FrozenAttributes) -> None:
        self.owner.counts.rejected += 1
        warn_once(
            f"create:{self.group}:{self.spec.key}",
            "async_tee: instrument %s could not be created; value dropped",
            self.spec.name,
        )


class InstrumentRegistry:
    """Every registered group's instruments on one meter, and what recording refused.

    Get one with :func:`instrument_registry`: there is one per meter.

    Attributes:
        counts: What recording refused since the current session began.
        max_attribute_sets: The bound given to series created from now on.
        held_ttl_s: How long a held series' set is exported after it was last logged
            (``ASYNC_TEE_HELD_TTL``; 0: for good), for every held series, read at each export.
        clock: The monotonic clock, in seconds, held values are dated and judged on.
        lock: Guards running totals, held values and instrument creation; never taken by
            the tee.
    """

    def __init__(self, meter: Meter) -> None:
        self._meter = weakref.ref(meter)  # the map below is keyed by the meter: no cycle
        self._by_group: dict[str, dict[str, Instrument]] = {}
        self.counts = RegistryCounts()
        self.max_attribute_sets = DEFAULT_MAX_ATTRIBUTE_SETS
        self.held_ttl_s = DEFAULT_HELD_TTL_S
        self.clock: Callable[[], float] = time.monotonic
        self.lock = threading.Lock()
        # What async_tee's own series read: the stats of the session recording into this meter.
        self.stats_source: StatsSource = no_session

    def stats(self) -> Mapping[str, Any]:
        """The stats of the session recording into this meter (async_tee's own series read them).

        Raises:
            LookupError: No session records into this meter.
        """
        return self.stats_source()

    def begin_session(
        self,
        max_attribute_sets: int = DEFAULT_MAX_ATTRIBUTE_SETS,
        held_ttl_s: float = DEFAULT_HELD_TTL_S,
    ) -> None:
        """Start counting afresh, with these settings.

        ``max_attribute_sets`` bounds the series created from now on; ``held_ttl_s`` applies
        to every held series at once.

        Raises:
            ValueError: ``max_attribute_sets`` is below 1, or ``held_ttl_s`` is negative.
        """
        if max_attribute_sets < 1:
            raise ValueError(f"max attribute sets must be at least 1, got {max_attribute_sets}")
        if not held_ttl_s >= 0:
            raise ValueError(f"the held TTL cannot be negative, got {held_ttl_s}")
        self.counts = RegistryCounts()
        self.max_attribute_sets = max_attribute_sets
        self.held_ttl_s = held_ttl_s

    def instruments(self, group: str) -> dict[str, Instrument] | None:
        """The group's instruments, created on first use; None if the group is unknown."""
        found = self._by_group.get(group)
        if found is not None:
            return found
        specs = DECLARATIONS.groups.get(group)
        meter = self._meter()
        if specs is None or meter is None:
            warn_once(f"group:{group}", "async_tee: metric group %r is not registered", group)
            return None
        with self.lock:
            if group in self._by_group:
                return self._by_group[group]
            created: dict[str, Instrument] = {}
            for spec in specs:
                try:
                    created[spec.key] = self._create(meter, spec)
                except Exception:  # noqa: BLE001 - the SDK raises bare Exception on bad input
                    self.counts.errors += 1
                    warn_once(
                        f"create:{group}:{spec.key}",
                        "async_tee: could not create instrument %s",
                        spec.name,
                    )
                    created[spec.key] = Unavailable(spec, self, group)
            self._by_group[group] = created
            return created

    def _create(self, meter: Meter, spec: MetricSpec) -> Instrument:
        from opentelemetry.metrics import Observation

        kind = spec.kind
        common = {"unit": spec.unit, "description": spec.description}
        if kind == "histogram":
            return Histogram(spec, self, meter)
        if kind in OBSERVABLE_KINDS:
            create_observable = {
                "observable_gauge": meter.create_observable_gauge,
                "observable_counter": meter.create_observable_counter,
                "observable_up_down_counter": meter.create_observable_up_down_counter,
            }[kind]
            reader = spec.callback
            if isinstance(reader, StatsReader):  # async_tee's own: reads this registry's stats
                reader = reader.reading(self.stats)
            callback = self._guarded_callback(spec, reader)
            create_observable(spec.name, callbacks=[callback], **common)
            return Observed(
                spec, self, callback, reader if isinstance(reader, StatsReader) else None
            )
        series: LastValue
        if spec.held:
            series = HeldValue(spec, self, Observation)
            create = (
                meter.create_observable_counter
                if kind == "counter"
                else meter.create_observable_gauge
            )
            create(spec.name, callbacks=[series.observe], **common)
        elif kind == "gauge":
            series = LastValue(spec, self, Observation)
            meter.create_observable_gauge(spec.name, callbacks=[series.observe], **common)
        elif kind == "counter":
            series = RunningTotal(spec, self, Observation)
            meter.create_observable_counter(spec.name, callbacks=[series.observe], **common)
        else:
            series = RunningTotal(spec, self, Observation)
            meter.create_observable_up_down_counter(spec.name, callbacks=[series.observe], **common)
        return series

    def _guarded_callback(
        self, spec: MetricSpec, callback: Callable[[CallbackOptions], Iterable[Observation]] | None
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        """Wrap an owner's callback so a failure warns once instead of every export cycle."""
        assert callback is not None

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            budget().spend()
            try:
                return list(callback(options))
            except BaseException:  # the owner's callback must not break an export
                if sys.is_finalizing():
                    raise
                self.counts.errors += 1
                warn_once(f"callback:{spec.name}", "async_tee: callback of %s failed", spec.name)
                return []

        return observe

    def tables(self, group: str) -> dict[str, LastValue]:
        """The gauges and running totals of ``group`` by key (created now if need be).

        Their ``store`` is the worker's fast path: one step for a value that passes every
        check :meth:`record` would make, False for anything else.
        """
        instruments = self.instruments(group) or {}
        return {key: s for key, s in instruments.items() if isinstance(s, LastValue)}

    def create(self, group: str) -> None:
        """Create every instrument of ``group`` now. Idempotent; never raises."""
        try:
            self.instruments(group)
        except Exception:  # noqa: BLE001 - never raise into the caller
            self.counts.errors += 1
            warn_once(f"create:{group}", "async_tee: creating instruments of %r failed", group)

    def record(
        self,
        group: str,
        values: Mapping[str, Any],
        attributes: Mapping[str, AttributeValue] | FrozenAttributes | None = None,
    ) -> None:
        """Record ``{key: value}`` against a group's series. Never raises.

        See :func:`record_metrics` for what is skipped and counted.
        """
        try:
            instruments = self.instruments(group)
            if instruments is None:
                return
            if attributes is None:
                frozen = NO_ATTRIBUTES
            elif type(attributes) is FrozenAttributes:
                frozen = attributes
            else:
                try:
                    frozen = FrozenAttributes(attributes)  # type: ignore[arg-type]
                except (ValueError, AttributeError, TypeError):
                    self.counts.rejected += 1
                    warn_once(
                        f"attributes:{group}",
                        "async_tee: bad attributes %r for group %r; values dropped",
                        attributes,
                        group,
                    )
                    return
            for key, raw in values.items():
                if raw is None:
                    continue
                self._record_one(instruments, group, key, raw, frozen)
        except Exception:  # noqa: BLE001 - never raise into the caller
            self.counts.errors += 1
            warn_once(f"record:{group}", "async_tee: recording to group %r failed", group)

    def _record_one(
        self,
        instruments: Mapping[str, Instrument],
        group: str,
        key: str,
        raw: Any,
        attributes: FrozenAttributes,
    ) -> None:
        counts = self.counts
        series = instruments.get(key)
        if series is None:
            counts.rejected += 1
            warn_once(f"key:{group}:{key}", "async_tee: %r is not a key of group %r", key, group)
            return
        value = as_scalar(raw)
        if value is None:
            counts.rejected += 1
            warn_once(
                f"value:{group}:{key}",
                "async_tee: value %.80r for %s is not a number; dropped",
                raw,
                series.spec.name,
            )
            return
        if not math.isfinite(value):
            counts.non_finite += 1
            name = series.spec.name
            counts.non_finite_by_series[name] = counts.non_finite_by_series.get(name, 0) + 1
            if isinstance(series, LastValue):
                series.clear(attributes)
            return
        try:
            series.record(value, attributes)
        except Exception:  # noqa: BLE001 - an SDK failure must not stop the other keys
            counts.errors += 1
            warn_once(f"emit:{group}:{key}", "async_tee: recording %s failed", series.spec.name)

    def after_fork_in_child(self) -> None:
        """A fresh lock, and no value inherited from the parent.

        A child (a DataLoader worker, say) shares the parent's resource identity; if it
        kept the parent's last values it would export them again under that identity,
        stale, beside the parent's own. It exports only what it records itself.
        """
        self.lock = threading.Lock()
        for instruments in self._by_group.values():
            for series in instruments.values():
                if isinstance(series, LastValue):
                    series.forget()


# One registry per live meter, because the SDK keeps one instrument per name per meter for
# the meter's whole life; weak, so a meter nobody holds takes its registry with it.
_BY_METER: weakref.WeakKeyDictionary[Any, InstrumentRegistry] = weakref.WeakKeyDictionary()
_BY_METER_LOCK = threading.Lock()  # one registry per meter even if two threads ask at once


def instrument_registry(meter: Meter) -> InstrumentRegistry:
    """The registry of ``meter``'s instruments (created on first use)."""
    found = _BY_METER.get(meter)
    if found is None:
        with _BY_METER_LOCK:
            found = _BY_METER.get(meter)
            if found is None:
                found = _BY_METER[meter] = InstrumentRegistry(meter)
    return found


def session_tables(
    meter: Meter,
    max_attribute_sets: int,
    stats: Callable[[], Mapping[str, Any]],
    held_ttl_s: float = DEFAULT_HELD_TTL_S,
) -> InstrumentRegistry:
    """``meter``'s registry begun afresh for a session, with its groups' instruments created.

    async_tee's own series read ``stats``; the ``rl`` group is registered (declaring closes)
    and created. ``held_ttl_s``: see :attr:`InstrumentRegistry.held_ttl_s`.

    Raises:
        RuntimeError: The ``rl`` metric group could not be registered (warned once).
        Exception: Whatever the SDK raises creating the instruments.
    """
    registry = instrument_registry(meter)
    registry.begin_session(max_attribute_sets, held_ttl_s)
    registry.stats_source = stats
    registry.create(SELF_METRIC_GROUP)
    if not ensure_metric_group_registered():
        raise RuntimeError("the rl metric group could not be registered (warned above)")
    registry.create(RL_METRIC_GROUP)
    return registry


def create_metric_instruments(meter: Meter, group: str) -> None:
    """Create every instrument of ``group`` on ``meter`` now. Idempotent; never raises.

    Only observable series strictly need this: nothing ever records to them, so nothing
    else would create them.
    """
    try:
        instrument_registry(meter).create(group)
    except Exception:  # noqa: BLE001 - never raise into the caller
        warn_once(f"create:{group}", "async_tee: creating instruments of %r failed", group)


def record_metrics(
    meter: Meter,
    group: str,
    values: Mapping[str, Any],
    attributes: Mapping[str, AttributeValue] | FrozenAttributes | None = None,
) -> None:
    """Record ``{key: value}`` against a group's series. Never raises.

    ``None`` values are skipped. Non-finite values are not exported (the SDK would drop
    them with a warning on every call and leave a gauge at its last finite value, hiding
    e.g. a diverged loss): they are counted per series, and a gauge's last value for that
    attribute set is withdrawn, so a dashboard shows a gap rather than a stale number.
    An unknown group or key, a non-numeric value, bad attributes, a negative counter
    delta, a value for an observable key, and any failure inside OTel are reported once
    (warning, then debug), counted in the meter's :class:`InstrumentRegistry`, and
    skipped. Safe from any thread.
    """
    try:
        instrument_registry(meter).record(group, values, attributes)
    except Exception:  # noqa: BLE001 - never raise into the caller
        warn_once(f"record:{group}", "async_tee: recording to group %r failed", group)


def after_fork_in_child() -> None:
    """Every meter's registry in a forked child: fresh locks, no value of the parent's."""
    global _BY_METER_LOCK
    _BY_METER_LOCK = threading.Lock()  # one registry per meter even if two threads ask at once
    for registry in list(_BY_METER.values()):
        registry.after_fork_in_child()

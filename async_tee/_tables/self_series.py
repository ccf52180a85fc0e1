"""The callbacks behind the ``async_tee.*`` series, read from ``stats()`` (docs/semantics.md §6)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from async_tee._declare import series as _series
from async_tee._declare.rows import MetricSpec

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Observation

StatsSource = Callable[[], Mapping[str, Any]]

KEPT_SETS = 1024
"""Attribute sets whose key and dict a self-series keeps across exports."""


class StatsReader:
    """One self-series' callback: its field of ``stats()``, as the SDK's ``Observation`` objects.

    :meth:`points` reads the same field as the table encoder takes it, ``{attribute key:
    (value, attributes)}``, without an ``Observation`` per point. A name's key, attribute
    dict and last point are kept (at most ``KEPT_SETS``; beyond, made afresh each time):
    a count that has not changed is the same point object as at the last export, so an
    export with hundreds of sets (``non_finite{series}``) makes next to nothing new.
    """

    __slots__ = ("_kept", "_path", "_split_by", "_stats", "series")

    def __init__(self, series: _series.Series, stats: StatsSource | None = None) -> None:
        self.series = series
        self._stats = stats or no_session
        # "steps.coalesced" reads stats()["steps"]["coalesced"]
        self._path = tuple(series.stats_field.split("."))
        self._split_by = series.attributes
        self._kept: dict[tuple[Any, ...], _KeptSet] = {}

    def reading(self, stats: StatsSource) -> StatsReader:
        """This series' reader of ``stats`` (the registry's it is created on)."""
        return StatsReader(self.series, stats)

    def _field(self) -> Any:
        value: Any = self._stats()
        for part in self._path:
            value = value[part]
        return value

    def __call__(self, _options: CallbackOptions) -> list[Observation]:
        from opentelemetry.metrics import Observation

        return [Observation(value, attributes) for value, attributes in self.points().values()]

    def points(self) -> dict[Any, tuple[Any, dict[str, Any]]]:
        """``{attribute key: (value, attributes)}``, keyed as the SDK keys a set (sorted items)."""
        value, split_by = self._field(), self._split_by
        if not split_by:
            return {(): (value, {})}
        named: Iterator[tuple[tuple[Any, ...], Any]]
        if len(split_by) == 1:
            named = (((name,), count) for name, count in value.items())
        else:  # two attributes: a nested {first: {second: count}} table
            named = (
                ((outer, inner), count)
                for outer, counts in value.items()
                for inner, count in counts.items()
            )
        kept, points = self._kept, {}
        for names, count in named:
            entry = kept.get(names) or self._keep(names)
            point = entry.point
            if point is None or point[0] != count or type(point[0]) is not type(count):
                point = entry.point = (count, entry.attributes)
            points[entry.key] = point
        return points

    def _keep(self, names: tuple[Any, ...]) -> _KeptSet:
        """The attributes of ``names`` and their key, kept for the next export."""
        attributes = dict(zip(self._split_by, names, strict=True))
        entry = _KeptSet(attributes, tuple(sorted(attributes.items())))
        if len(self._kept) < KEPT_SETS:
            self._kept[names] = entry
        return entry


class _KeptSet:
    """A self-series' attribute set: its attributes, its key, its point at the last read."""

    __slots__ = ("attributes", "key", "point")

    def __init__(self, attributes: dict[str, Any], key: tuple[Any, ...]) -> None:
        self.attributes = attributes
        self.key = key
        self.point: tuple[Any, dict[str, Any]] | None = None


def no_session() -> Mapping[str, Any]:
    """The stats source of a meter no session records into: there are none."""
    raise LookupError("no session records into this meter")


def self_metric_specs() -> list[MetricSpec]:
    """The ``async_tee`` group's specs; the observable ones read their registry's ``stats()``."""
    return [
        MetricSpec(
            series.key,
            series.name,
            series.kind,
            series.unit,
            series.description,
            StatsReader(series) if series.stats_field else None,
            buckets=_series.LAG_BUCKETS_MS if series.key == _series.LAG_KEY else None,
        )
        for series in _series.SELF
    ]

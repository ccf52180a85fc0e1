"""The callbacks behind async_tee's own series (``async_tee.*``, declared in ``_series``).

Drops are counted and exported, never silent: a dashboard can alert on
``async_tee.dropped`` the same way it plots the training series. Everything but the lag
histogram is observable and read from ``stats()`` once per export cycle, so it costs the
worker nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from async_tee import _series
from async_tee._declarations import MetricSpec

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Observation

StatsSource = Callable[[], Mapping[str, Any]]

KEPT_SETS = 1024
"""Attribute sets whose key and dict a self-series keeps across exports."""


class StatsReader:
    """One self-series' callback: its field of ``stats()``, as the SDK's ``Observation`` objects.

    :meth:`points` reads the same field as the table encoder takes it, ``{attribute key:
    (value, attributes)}``, without an ``Observation`` per point; a name's key and attribute
    dict are made once and kept (at most ``KEPT_SETS``; beyond, made afresh each time).
    """

    __slots__ = ("_kept", "_path", "_split_by", "_stats")

    def __init__(self, stats: StatsSource, series: _series.Series) -> None:
        self._stats = stats
        # "steps.coalesced" reads stats()["steps"]["coalesced"]
        self._path = tuple(series.stats_field.split("."))
        self._split_by = series.attributes
        self._kept: dict[tuple[Any, ...], tuple[dict[str, Any], Any]] = {}

    def _field(self) -> Any:
        value: Any = self._stats()
        for part in self._path:
            value = value[part]
        return value

    def __call__(self, _options: CallbackOptions) -> list[Observation]:
        from opentelemetry.metrics import Observation

        return [Observation(value, attributes) for value, attributes, _key in self._read()]

    def points(self) -> dict[Any, tuple[Any, dict[str, Any]]]:
        """``{attribute key: (value, attributes)}``, keyed as the SDK keys a set (sorted items)."""
        return {key: (value, attributes) for value, attributes, key in self._read()}

    def _read(self) -> list[tuple[Any, ...]]:
        """(value, attributes, key) per point of the field."""
        value, split_by, kept = self._field(), self._split_by, self._kept
        if not split_by:
            return [(value, {}, ())]
        if len(split_by) == 1:
            return [
                (count, *(kept.get((name,)) or self._keep((name,))))
                for name, count in value.items()
            ]
        # Two attributes: a nested {first: {second: count}} table.
        return [
            (count, *(kept.get((outer, inner)) or self._keep((outer, inner))))
            for outer, counts in value.items()
            for inner, count in counts.items()
        ]

    def _keep(self, names: tuple[Any, ...]) -> tuple[dict[str, Any], Any]:
        """The attributes of ``names`` and their key, kept for the next export."""
        attributes = dict(zip(self._split_by, names, strict=True))
        found = (attributes, tuple(sorted(attributes.items())))
        if len(self._kept) < KEPT_SETS:
            self._kept[names] = found
        return found


def self_metric_specs(stats: StatsSource) -> list[MetricSpec]:
    """The ``async_tee`` group's specs; the observable ones read ``stats()``."""
    return [
        MetricSpec(
            series.key,
            series.name,
            series.kind,
            series.unit,
            series.description,
            StatsReader(stats, series) if series.stats_field else None,
            buckets=_series.LAG_BUCKETS_MS if series.key == _series.LAG_KEY else None,
        )
        for series in _series.SELF
    ]

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


def _observe(stats: StatsSource, series: _series.Series) -> Callable[..., list[Observation]]:
    from opentelemetry.metrics import Observation

    path = series.stats_field.split(".")  # "steps.coalesced" reads stats()["steps"]["coalesced"]
    split_by = series.attributes

    def callback(_options: CallbackOptions) -> list[Observation]:
        value: Any = stats()
        for part in path:
            value = value[part]
        if not split_by:
            return [Observation(value, {})]
        if len(split_by) == 1:
            return [Observation(count, {split_by[0]: name}) for name, count in value.items()]
        # Two attributes: a nested {first: {second: count}} table.
        return [
            Observation(count, {split_by[0]: outer, split_by[1]: inner})
            for outer, counts in value.items()
            for inner, count in counts.items()
        ]

    return callback


def self_metric_specs(stats: StatsSource) -> list[MetricSpec]:
    """The ``async_tee`` group's specs; the observable ones read ``stats()``."""
    return [
        MetricSpec(
            series.key,
            series.name,
            series.kind,
            series.unit,
            series.description,
            _observe(stats, series) if series.stats_field else None,
            buckets=_series.LAG_BUCKETS_MS if series.key == _series.LAG_KEY else None,
        )
        for series in _series.SELF
    ]

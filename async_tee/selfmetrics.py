"""async_tee's own series (``async_tee.*``): drops, queue depth, lag, rejected values, errors.

Drops are counted and exported, never silent: a dashboard can alert on
``async_tee.dropped`` the same way it plots the training series. Everything but the lag
histogram is observable and read from ``stats()`` once per export cycle, so it costs the
worker nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from async_tee.registry import MetricSpec

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Observation

SELF_METRIC_GROUP = "async_tee"
LAG_KEY = "lag"
LAG_BUCKETS_MS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000)
"""Enqueue-to-record lag boundaries in milliseconds (the drain timer is 50 ms by default)."""

StatsSource = Callable[[], Mapping[str, Any]]


def _observe(
    stats: StatsSource, read: Callable[[Mapping[str, Any]], Iterable[tuple[float, dict[str, str]]]]
) -> Callable[[CallbackOptions], list[Observation]]:
    def callback(_options: CallbackOptions) -> list[Observation]:
        from opentelemetry.metrics import Observation

        return [Observation(value, attributes) for value, attributes in read(stats())]

    return callback


def _by(
    attribute: str, field: str
) -> Callable[[Mapping[str, Any]], list[tuple[float, dict[str, str]]]]:
    def read(snapshot: Mapping[str, Any]) -> list[tuple[float, dict[str, str]]]:
        return [(count, {attribute: name}) for name, count in snapshot[field].items()]

    return read


def _value(field: str) -> Callable[[Mapping[str, Any]], list[tuple[float, dict[str, str]]]]:
    def read(snapshot: Mapping[str, Any]) -> list[tuple[float, dict[str, str]]]:
        return [(snapshot[field], {})]

    return read


def self_metric_specs(stats: StatsSource) -> list[MetricSpec]:
    """The ``async_tee`` group's specs; the observable ones read ``stats()``."""

    def spec(key: str, name: str, kind: str, unit: str, description: str, read: Any) -> MetricSpec:
        return MetricSpec(key, name, kind, unit, description, _observe(stats, read))

    return [
        spec(
            "enqueued",
            "async_tee.enqueued",
            "observable_counter",
            "{dict}",
            "Dicts handed to the tee on a teed prefix.",
            _value("enqueued"),
        ),
        spec(
            "recorded",
            "async_tee.recorded",
            "observable_counter",
            "{dict}",
            "Dicts mapped and recorded by the worker.",
            _value("recorded"),
        ),
        spec(
            "dropped",
            "async_tee.dropped",
            "observable_counter",
            "{dict}",
            "Dicts not recorded, by reason (overflow, error, shutdown).",
            _by("reason", "dropped_by_reason"),
        ),
        spec(
            "queue_depth",
            "async_tee.queue.depth",
            "observable_gauge",
            "{dict}",
            "Dicts waiting for the worker.",
            _value("pending"),
        ),
        spec(
            "queue_capacity",
            "async_tee.queue.capacity",
            "observable_gauge",
            "{dict}",
            "The hand-off queue's bound (ASYNC_TEE_QUEUE_SIZE).",
            _value("capacity"),
        ),
        spec(
            "values_skipped",
            "async_tee.values.skipped",
            "observable_counter",
            "{value}",
            "Values not exported, by reason (non_finite, rejected, cardinality).",
            _by("reason", "values_skipped"),
        ),
        spec(
            "non_finite",
            "async_tee.non_finite",
            "observable_counter",
            "{value}",
            "NaN or infinite values seen, by series.",
            _by("series", "non_finite_by_series"),
        ),
        spec(
            "errors",
            "async_tee.errors",
            "observable_counter",
            "{error}",
            "Failures inside async_tee, by where they happened.",
            _by("where", "errors"),
        ),
        spec(
            "exports",
            "async_tee.exports",
            "observable_counter",
            "{export}",
            "Export attempts of the providers async_tee built, by result.",
            _by("result", "exports"),
        ),
        MetricSpec(
            LAG_KEY,
            "async_tee.lag",
            "histogram",
            "ms",
            "Time from the tee call to the record in the SDK.",
            buckets=LAG_BUCKETS_MS,
        ),
    ]

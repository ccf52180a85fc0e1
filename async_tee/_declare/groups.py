"""Metric groups: declaring one, and the ``rl`` group of every row (docs/semantics.md §4, §5)."""

from __future__ import annotations

from collections.abc import Iterable

from async_tee._declare import series as _series
from async_tee._declare.prometheus_names import check_prometheus_names
from async_tee._declare.rows import DECLARATIONS, MetricSpec
from async_tee._reporting import warn_once
from async_tee.vocabulary import freeze_metrics, recorded_metrics, teed_metrics


def register_metric_group(group: str, specs: Iterable[MetricSpec]) -> None:
    """Declare a named group of series, once per process.

    The specs are read once: rows declared later are not in the group.

    Raises:
        ValueError: The group name is empty, the specs are empty, two specs share a key
            or a name, a spec is not a ``MetricSpec``, the group is already registered,
            or two series (in this group, or one here and one in a registered group)
            would share a Prometheus name, which would make Prometheus drop one of them.
    """
    if not isinstance(group, str) or not group:
        raise ValueError(f"metric group name must be a non-empty string: {group!r}")
    specs = tuple(specs)
    if not specs:
        raise ValueError(f"metric group {group!r} has no specs")
    keys: set[str] = set()
    names: set[str] = set()
    for spec in specs:
        if not isinstance(spec, MetricSpec):
            raise ValueError(f"metric group {group!r}: expected MetricSpec, got {spec!r}")
        if spec.key in keys:
            raise ValueError(f"metric group {group!r}: duplicate key {spec.key!r}")
        if spec.name in names:
            raise ValueError(f"metric group {group!r}: duplicate name {spec.name!r}")
        keys.add(spec.key)
        names.add(spec.name)
    groups = DECLARATIONS.groups
    if group in groups:
        raise ValueError(f"metric group {group!r} is already registered")
    check_prometheus_names(
        [(spec.name, spec.kind, spec.unit) for spec in specs],
        [(spec.name, spec.kind, spec.unit) for other in groups.values() for spec in other],
    )
    groups[group] = specs


def group_specs(group: str) -> tuple[MetricSpec, ...]:
    """The specs of a registered group, or an empty tuple."""
    return DECLARATIONS.groups.get(group, ())


RL_METRIC_GROUP = "rl"
"""The registry group every ``rl.*`` series belongs to."""


def metric_specs() -> list[MetricSpec]:
    """Build the full ``MetricSpec`` list for the ``rl`` group."""
    specs = [
        MetricSpec(row.key, row.name, row.kind, row.unit, row.description, held=row.held)
        for row in teed_metrics()
    ]
    specs += [
        MetricSpec(row.key, row.name, row.kind, row.unit, row.description, row.callback)
        for row in recorded_metrics()
    ]
    specs += [
        MetricSpec(
            series.key, series.name, series.kind, series.unit, series.description, held=series.held
        )
        for series in _series.DERIVED
    ]
    return specs


def ensure_metric_group_registered() -> bool:
    """Declare the ``rl`` metric group with the registry, once per process.

    Closes declaration (:func:`async_tee.vocabulary.freeze_metrics`). Called by
    ``start_telemetry``. Never raises.

    Returns:
        Whether the group is available to record against. False means registration failed
        for a reason retrying cannot fix (warned once), which makes every tee a no-op.
    """
    if RL_METRIC_GROUP in DECLARATIONS.groups:
        return True
    if DECLARATIONS.rl_group_failed:
        return False
    try:
        freeze_metrics()
        register_metric_group(RL_METRIC_GROUP, metric_specs())
    except Exception:  # noqa: BLE001 - telemetry must not stop training from starting
        DECLARATIONS.rl_group_failed = True
        warn_once(
            "register:rl",
            "async_tee: could not register the rl metric group; the tee is a no-op",
        )
        return False
    return True

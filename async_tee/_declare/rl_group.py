"""The ``rl`` metric group: every declared row and derived series, registered once.

``start_telemetry`` calls :func:`ensure_metric_group_registered`, which hands the
declarations to the registry and closes declaring (docs/semantics.md §5). Process-wide,
like the declarations it reads: a second session finds the group already registered.
"""

from __future__ import annotations

from async_tee._declare import series as _series
from async_tee._declare.rows import DECLARATIONS, MetricSpec
from async_tee._reporting import warn_once
from async_tee._tables.registry import register_metric_group
from async_tee.vocabulary import freeze_metrics, recorded_metrics, teed_metrics

RL_METRIC_GROUP = "rl"
"""The registry group every ``rl.*`` series belongs to."""


def metric_specs() -> list[MetricSpec]:
    """Build the full ``MetricSpec`` list for the ``rl`` group."""
    specs = [
        MetricSpec(row.key, row.name, row.kind, row.unit, row.description) for row in teed_metrics()
    ]
    specs += [
        MetricSpec(row.key, row.name, row.kind, row.unit, row.description, row.callback)
        for row in recorded_metrics()
    ]
    specs += [
        MetricSpec(series.key, series.name, series.kind, series.unit, series.description)
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

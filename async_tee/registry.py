"""The consumer-driven metric registry: named groups of series, recorded by key, never raising."""

from async_tee._tables.registry import (
    DEFAULT_MAX_ATTRIBUTE_SETS,
    NO_ATTRIBUTES,
    FrozenAttributes,
    InstrumentRegistry,
    MetricSpec,
    RegistryCounts,
    create_metric_instruments,
    group_specs,
    instrument_registry,
    record_metrics,
    register_metric_group,
)

__all__ = [
    "DEFAULT_MAX_ATTRIBUTE_SETS",
    "NO_ATTRIBUTES",
    "FrozenAttributes",
    "InstrumentRegistry",
    "MetricSpec",
    "RegistryCounts",
    "create_metric_instruments",
    "group_specs",
    "instrument_registry",
    "record_metrics",
    "register_metric_group",
]

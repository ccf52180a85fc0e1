"""The consumer-driven metric registry: named groups of series, recorded by key, never raising.

See docs/semantics.md §4. The groups are declarations (``_declare``); the instruments and their
tables are one meter's (``_tables``).
"""

from async_tee._declare.attributes import NO_ATTRIBUTES, FrozenAttributes
from async_tee._declare.groups import group_specs, register_metric_group
from async_tee._declare.rows import MetricSpec
from async_tee._tables.registry import (
    DEFAULT_MAX_ATTRIBUTE_SETS,
    InstrumentRegistry,
    RegistryCounts,
    create_metric_instruments,
    instrument_registry,
    record_metrics,
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

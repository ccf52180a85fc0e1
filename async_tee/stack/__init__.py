"""Runnable stacks from the ranks to Grafana: ``async-tee stack`` (docs/semantics.md §11).

One machine: one of the four :data:`PATHS` to one Prometheus 3 (``paths``). Many nodes: the
``fleet`` (``fleet``), an agent Collector per node forwarding to a store that scales out.
"""

from __future__ import annotations

from async_tee.stack.common import COLLECTOR_IMAGE, PROMETHEUS_IMAGE, PROMOTED
from async_tee.stack.paths import (
    COLLECTOR_PATHS,
    PATHS,
    StackAddresses,
    collector_config,
    prometheus_config,
    prometheus_flags,
    rank_environment,
    render_stack,
)

__all__ = [
    "COLLECTOR_IMAGE",
    "COLLECTOR_PATHS",
    "PATHS",
    "PROMETHEUS_IMAGE",
    "PROMOTED",
    "StackAddresses",
    "collector_config",
    "prometheus_config",
    "prometheus_flags",
    "rank_environment",
    "render_stack",
]

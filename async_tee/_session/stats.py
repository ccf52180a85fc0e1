"""``stats()``, assembled from each part's own figures (docs/semantics.md §6)."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Mapping
from typing import Any

from async_tee._declare.groups import RL_METRIC_GROUP
from async_tee._declare.rows import OBSERVABLE_KINDS
from async_tee._export.delivery import TRIGGERS
from async_tee._export.provider import idle_delivery
from async_tee._settings import Settings
from async_tee._tables.registry import InstrumentRegistry, RegistryCounts
from async_tee._worker.mapping import HELD_EXPIRED, SKIP_REASONS

SNAPSHOT_TTL_S = 0.02
"""How long the self-series' ``stats()`` snapshot serves a collection async_tee did not start
(a Prometheus scrape): one collection's callbacks run together; scrapes come seconds apart."""


def ranks(settings: Settings) -> dict[str, Any]:
    """``stats()["ranks"]``: the launcher's ranks, ``export_ranks``, whether this rank exports."""
    return {
        **dataclasses.asdict(settings.ranks),
        "export_ranks": settings.export_ranks,
        "exports": settings.exports_from_this_rank,
    }


def idle_stats(settings: Settings) -> dict[str, Any]:
    """``stats()`` of a session that recorded nothing: every figure zero."""
    return {
        "enqueued": 0,
        "recorded": 0,
        "dropped": 0,
        "pending": 0,
        "capacity": 0,
        "dropped_by_reason": {"overflow": 0, "error": 0, "shutdown": 0, "snapshot": 0},
        "lag_ms": {"p50": 0.0, "p99": 0.0, "max": 0.0, "samples": 0},
        "values_skipped": dict.fromkeys(SKIP_REASONS, 0),
        "non_finite_by_series": {},
        "errors": {"tee": 0, "registry": 0},
        "exports": {"success": 0, "failure": 0},
        "exports_by_trigger": {trigger: {"success": 0, "failure": 0} for trigger in TRIGGERS},
        "delivery": idle_delivery(),
        "steps": {"last": None, "completed": 0, "exported": 0, "coalesced": 0, "unusable": 0},
        "exporting": False,
        "exporters": {},
        "ranks": ranks(settings),
        "worker_died": 0,
        "export_thread_died": 0,
    }


def counts(
    handoff: Mapping[str, Any],
    mapping: Mapping[str, Any],
    registry: RegistryCounts,
    exports: Mapping[str, Any],
    non_finite_zeros: Mapping[str, int],
) -> dict[str, Any]:
    """The counts of ``stats()``, what the ``async_tee.*`` series read.

    Args:
        handoff: The worker's figures (``Worker.figures``).
        mapping: The consumer's (``SnapshotConsumer.figures``): values skipped, steps.
        registry: What the instrument registry refused.
        exports: The exports' figures (``Exports.figures``).
        non_finite_zeros: A 0 for every series values are recorded into, so each one's
            ``non_finite`` count is exported from the first export (§6).
    """
    return {
        **handoff,
        "values_skipped": {
            **dict.fromkeys(SKIP_REASONS, 0),
            **mapping["values_skipped"],
            "non_finite": registry.non_finite,
            "rejected": registry.rejected,
            "cardinality": registry.cardinality,
            HELD_EXPIRED: registry.held_expired,
        },
        "non_finite_by_series": {**non_finite_zeros, **registry.non_finite_by_series},
        "errors": {"tee": handoff["dropped_by_reason"]["snapshot"], "registry": registry.errors},
        "steps": mapping["steps"],
        **exports,
    }


def non_finite_zeros(instruments: InstrumentRegistry, bound: int) -> dict[str, int]:
    """A 0 for every series values are recorded into, up to ``bound`` of them (§6)."""
    created = instruments.instruments(RL_METRIC_GROUP) or {}
    names = (s.spec.name for s in created.values() if s.spec.kind not in OBSERVABLE_KINDS)
    return dict.fromkeys(itertools.islice(dict.fromkeys(names), bound), 0)


class CollectionSnapshot:
    """The counts one collection's self-series callbacks read: taken by the first, reused.

    A collection runs a dozen callbacks in a row; the snapshot serves them until
    async_tee's reader starts its next collection, or for ``SNAPSHOT_TTL_S`` for a
    collection it did not start.
    """

    def __init__(self, take: Callable[[], dict[str, Any]], collections: Callable[[], int]) -> None:
        self._take = take
        self._collections = collections
        self._snapshot: tuple[int, float, dict[str, Any]] | None = None

    def __call__(self) -> dict[str, Any]:
        snapshot, collection = self._snapshot, self._collections()
        now = time.monotonic()
        if (
            snapshot is not None
            and snapshot[0] == collection
            and now - snapshot[1] < SNAPSHOT_TTL_S
        ):
            return snapshot[2]
        stats = self._take()
        self._snapshot = (collection, now, stats)
        return stats

    def forget(self) -> None:
        """Take the next snapshot afresh (a forked child's counts start from zero)."""
        self._snapshot = None

"""The training thread's side of the pipeline: the only code a caller of the tee runs.

``tee_rl_metrics_to_otel`` and ``record_rl_metrics`` check their input, take a snapshot
and put it on the session's hand-off queue: no mapping, no OTel call, no lock shared with
the worker, no syscall, no wake-up unless a burst is about to overflow the queue. The
queue is the one piece of session state the caller reads: :data:`_QUEUE`, written only
when a session starts, ends or is re-made after ``fork`` (docs/semantics.md §1, §2, §6).

A snapshot is a plain tuple of one of two shapes, each slot with one meaning and the
enqueue time last: :data:`TeedDict` or :data:`RecordedValues`. (A plain tuple is the
cheapest object the caller can build; a ``NamedTuple`` costs more per call.)
"""

from __future__ import annotations

from collections.abc import Mapping
from time import monotonic_ns
from typing import Any, TypeAlias

from async_tee._handoff import DropOldestQueue
from async_tee._mapping import BUILT_IN_PREFIXES, TRAIN_PREFIXES
from async_tee._reporting import warn_once

TeedDict: TypeAlias = "tuple[dict[Any, Any] | None, str, Any, bool, int]"
"""``(metrics, prefix, step, step_finished, enqueued_ns)``: one dict handed to the tee.

``metrics`` is None for a bare end-of-step marker: a ``step_finished=True`` call on a
prefix that is not teed."""

RecordedValues: TypeAlias = "tuple[dict[Any, Any], dict[Any, Any] | None, int]"
"""``(values, attributes, enqueued_ns)``: one ``record_rl_metrics`` call."""

Snapshot: TypeAlias = "TeedDict | RecordedValues"

FILTER_ABOVE = 384
"""A ``train``/``""`` dict with more keys than this is snapshotted to the keys the worker
reads (``_READ_KEYS``) instead of copied whole (docs/semantics.md §6). A whole copy is one
C call whose cost grows with the dict; picking the read keys costs the same whatever its
size. The threshold sits above the size where the two cost the same (measured by
``benchmarks/bench_sizes.py``), so the common dict keeps its one-call copy."""

_FILTERED_PREFIXES = (*TRAIN_PREFIXES, None)
"""The prefixes whose large dicts are snapshotted to ``_READ_KEYS``."""

# The running session's queue, or None: the tee's only gate (one global read). Written
# only by the session's start, shutdown and after-fork code, never by the caller.
_QUEUE: DropOldestQueue[Snapshot] | None = None
# The keys the running session's worker reads from a train/"" dict, and the prefixes it
# takes (the built-in families' and the declared rows'): written with _QUEUE, before it.
_READ_KEYS: tuple[str, ...] = ()
_PREFIXES: frozenset[str | None] = frozenset(BUILT_IN_PREFIXES)


def attach(
    queue: DropOldestQueue[Snapshot] | None,
    read_keys: tuple[str, ...] = (),
    prefixes: frozenset[str | None] = frozenset(BUILT_IN_PREFIXES),
) -> None:
    """Point the tee at ``queue`` (None turns it off). Only the session lifecycle calls this.

    Args:
        queue: The session's hand-off queue, or None.
        read_keys: Every key the worker reads from a ``train`` or ``""`` dict.
        prefixes: Every prefix the worker reads (``MappingPlan.prefixes``).
    """
    global _QUEUE, _READ_KEYS, _PREFIXES
    _READ_KEYS = read_keys
    _PREFIXES = prefixes
    _QUEUE = queue


def attached() -> DropOldestQueue[Snapshot] | None:
    """The queue the tee puts on now, or None."""
    return _QUEUE


def tee_rl_metrics_to_otel(
    metrics: Mapping[str, Any], prefix: str | None, step: Any = None, step_finished: bool = False
) -> None:
    """Mirror one logged dict into OTel, later, on the worker. No-op unless exporting.

    On the caller's thread this only checks the prefix, copies the dict (callers mutate
    dicts after logging them; one with more than :data:`FILTER_ABOVE` keys is copied to
    the keys the worker reads, so cost and memory are bounded by what is teed) and puts
    the copy with a monotonic timestamp on the bounded drop-oldest queue: no mapping, no
    OTel call, no lock shared with the worker, no wake-up unless a burst is about to
    overflow the queue. Safe from any thread and from inside a running event loop.

    Args:
        metrics: The dict handed to ``Logger.log_metrics``.
        prefix: Its prefix; only the prefixes the session reads are teed (the built-in
            families' and the declared rows', docs/semantics.md §2).
        step: The step the Logger passes; counter deltas count once per step and key.
        step_finished: True on the Logger's last call of a step, teed prefix or not: the
            step is then complete and its values are exported promptly (a prefix that is
            not teed enqueues only a small marker). Callers that pass no step at all have
            their steps numbered by the worker, each ended by the ``timing/train`` dict
            (docs/semantics.md §9).

    Never raises: ``Logger.log_metrics`` calls it unguarded on every step.
    """
    queue = _QUEUE
    if queue is None:
        return
    try:
        if prefix not in _PREFIXES:  # None counts as "" (§2); the rest return now
            if step_finished:
                queue.put((None, "", step, True, monotonic_ns()))
            return
        if len(metrics) > FILTER_ABOVE and prefix in _FILTERED_PREFIXES:
            snapshot = {key: metrics[key] for key in _READ_KEYS if key in metrics}
        else:
            snapshot = dict(metrics)
        queue.put((snapshot, prefix or "", step, step_finished, monotonic_ns()))
    except Exception:  # noqa: BLE001 - never raise into training
        queue.caller_errors += 1
        warn_once("tee", "async_tee: tee_rl_metrics_to_otel failed; dict dropped")


def record_rl_metrics(
    values: Mapping[str, float],
    attributes: Mapping[str, str] | None = None,
) -> None:
    """Record declared series by registry key. No-op unless exporting. Never raises.

    For values that never pass through ``Logger.log_metrics`` and so have no teed row;
    declare them with ``register_recorded_metrics`` first. Like the tee, this only
    snapshots and enqueues: the worker records. Safe from any thread.
    """
    queue = _QUEUE
    if queue is None:
        return
    try:
        queue.put((dict(values), None if attributes is None else dict(attributes), monotonic_ns()))
    except Exception:  # noqa: BLE001 - never raise into the caller
        queue.caller_errors += 1
        warn_once("record_rl_metrics", "async_tee: record_rl_metrics failed; values dropped")

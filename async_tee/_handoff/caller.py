"""The training thread's side of the tee: check, snapshot, enqueue (docs/semantics.md §6)."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import islice
from operator import itemgetter
from time import monotonic_ns
from typing import Any, TypeAlias

from async_tee._declare.rows import BUILT_IN_PREFIXES
from async_tee._handoff.queue import DropOldestQueue
from async_tee._reporting import warn_once

# A snapshot is a plain tuple, each slot with one meaning and the enqueue time last: the
# cheapest object the caller can build (a NamedTuple costs more per call).
PickedValues: TypeAlias = "tuple[tuple[str, ...], tuple[Any, ...]]"
"""``(read_keys, values)``: a dict's values at the keys a row reads, :data:`ABSENT` where
the dict lacks the key. :func:`as_dict` turns it back into a dict, on the worker."""

TeedDict: TypeAlias = "tuple[dict[Any, Any] | PickedValues | None, str, Any, bool, int]"
"""``(metrics, prefix, step, step_finished, enqueued_ns)``: one dict handed to the tee.

``metrics`` is a copy of the dict, or its :data:`PickedValues`; None for a bare end-of-step
marker: a ``step_finished=True`` call on a prefix that is not teed."""

RecordedValues: TypeAlias = "tuple[dict[Any, Any], dict[Any, Any] | None, int]"
"""``(values, attributes, enqueued_ns)``: one ``record_rl_metrics`` call."""

Snapshot: TypeAlias = "TeedDict | RecordedValues"

LEFT_OUT = object()
"""A snapshot's key for how many keys the caller left out of it (an int): the keys past
the bound of a dict read whole, and keys that raised when looked up. Never a real key (no
caller has this object); the worker pops it and counts the keys (docs/semantics.md §6)."""

ABSENT = object()
"""A :data:`PickedValues` slot for a read key the dict lacks."""

_NOT_TEED: Any = object()  # what _SNAPSHOT_KEYS.get returns for a prefix the session does not read

# The running session's queue, or None: the tee's only gate (one global read). Written
# only by the session's start, shutdown and after-fork code, never by the caller.
_QUEUE: DropOldestQueue[Snapshot] | None = None
# A dict shape the caller has seen for a prefix, by the dict's length: the read keys it
# had (two or more), the read keys it lacked, and one itemgetter of the first.
Shape: TypeAlias = "tuple[tuple[str, ...], tuple[str, ...], Any]"
# For each prefix the running session reads, the keys a snapshot of its dicts keeps, as a
# tuple, as a map from each key to itself and as as many ABSENTs, and the shapes seen so far
# (None: the whole dict, up to _WHOLE_UP_TO keys): written with _QUEUE, before it.
ReadKeys: TypeAlias = "tuple[tuple[str, ...], dict[str, str], tuple[object, ...], dict[int, Shape]]"
_SNAPSHOT_KEYS: dict[str | None, ReadKeys | None] = dict.fromkeys(BUILT_IN_PREFIXES)
_WHOLE_UP_TO = 512
_SHAPES_PER_PREFIX = 8


def attach(
    queue: DropOldestQueue[Snapshot] | None,
    snapshot_keys: Mapping[str | None, tuple[str, ...] | None] | None = None,
    whole_up_to: int = 512,
) -> None:
    """Point the tee at ``queue`` (None turns it off). Only the session lifecycle calls this.

    Args:
        queue: The session's hand-off queue, or None.
        snapshot_keys: ``MappingPlan.snapshot_keys``: every prefix the worker reads, with
            the keys it reads from its dicts, or None where it reads them whole. None: the
            built-in prefixes, each read whole.
        whole_up_to: The most keys a snapshot of a dict read whole keeps (the session's
            ``max_attribute_sets``: a key past it would be refused as one set too many).
    """
    global _QUEUE, _SNAPSHOT_KEYS, _WHOLE_UP_TO
    _SNAPSHOT_KEYS = {
        prefix: None
        if keys is None
        else (keys, {key: key for key in keys}, (ABSENT,) * len(keys), {})
        for prefix, keys in (snapshot_keys or dict.fromkeys(BUILT_IN_PREFIXES)).items()
    }
    _WHOLE_UP_TO = whole_up_to
    _QUEUE = queue


def detach(queue: DropOldestQueue[Snapshot]) -> None:
    """Turn the tee off if it points at ``queue`` (it stops enqueuing at once)."""
    if _QUEUE is queue:
        attach(None)


def attached() -> DropOldestQueue[Snapshot] | None:
    """The queue the tee puts on now, or None."""
    return _QUEUE


def tee_rl_metrics_to_otel(
    metrics: Mapping[str, Any], prefix: str | None, step: Any = None, step_finished: bool = False
) -> None:
    """Mirror one logged dict into OTel, later, on the worker. No-op unless exporting.

    On the caller's thread this only checks the prefix, copies the dict (callers mutate
    dicts after logging them) to the keys the worker reads from it, or whole up to a bound
    where a family reads every key, so what a queued dict keeps alive is bounded by what
    is teed, and puts the copy with a monotonic timestamp on the bounded drop-oldest
    queue: no mapping, no OTel call, no lock shared with the worker, no wake-up unless a
    burst is about to overflow the queue. Safe from any thread and from inside a running
    event loop.

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
        keys = _SNAPSHOT_KEYS.get(prefix, _NOT_TEED)  # None counts as "" (§2)
        if keys is _NOT_TEED:
            if step_finished:
                queue.put((None, "", step, True, monotonic_ns()))
            return
        snapshot: dict[Any, Any] | PickedValues
        if keys is None:  # a family reads every key: the whole dict, up to a bound
            if len(metrics) <= _WHOLE_UP_TO:
                snapshot = dict(metrics)
            else:
                snapshot = dict(islice(metrics.items(), _WHOLE_UP_TO))
                snapshot[LEFT_OUT] = len(metrics) - _WHOLE_UP_TO
        else:  # only the keys a row reads: nothing else the dict holds stays alive
            snapshot = None  # type: ignore[assignment]
            shape = keys[3].get(len(metrics)) if type(metrics) is dict else None
            if shape is not None:
                # A shape seen before (a prefix's dicts come in a few): its read keys all
                # there and its lacked ones absent, checked without raising, then its
                # values read by one C call.
                present, lacked, get = shape
                try:
                    if metrics.keys().isdisjoint(lacked):
                        snapshot = (present, get(metrics))
                except Exception:  # noqa: BLE001 - a key gone (KeyError), or one that raises
                    pass
            if snapshot is None:
                snapshot = _picked(metrics, keys)
        # DropOldestQueue.put, inlined: one Python call less on every teed dict.
        item = (snapshot, prefix or "", step, step_finished, monotonic_ns())
        queue.extend(zip((item,), queue.counter))  # noqa: B905 - strict= is the slow path
        if len(queue.items) >= queue.high_water and not queue.wake_asked:
            queue.ask_wake()
    except Exception:  # noqa: BLE001 - never raise into training
        queue.caller_errors += 1
        warn_once("tee", "async_tee: tee_rl_metrics_to_otel failed; dict dropped")


def _picked(metrics: Mapping[Any, Any], keys: ReadKeys) -> dict[Any, Any] | PickedValues:
    """The snapshot of a dict whose shape is not known: each read key looked up.

    Walks the smaller of the dict and the read keys; learns the shape of a plain dict.

    Raises:
        Exception: A mapping that is not a dict failed to be read (a failed snapshot).
    """
    read, canonical, absent, shapes = keys
    try:
        if len(metrics) < len(read):  # walk the smaller: here the dict
            return {
                key: value
                for given, value in metrics.items()
                if (key := canonical.get(given)) is not None
            }
        values = tuple(map(metrics.get, read, absent))  # the read keys, in C: no dict built
    except Exception:
        if not isinstance(metrics, dict):
            raise
        return _careful_snapshot(metrics, read)  # a key whose __eq__ or __hash__ raises
    if type(metrics) is dict:
        _learn(shapes, len(metrics), read, values)
    return (read, values)


def _learn(
    shapes: dict[int, Shape], length: int, read: tuple[str, ...], values: tuple[Any, ...]
) -> None:
    """Keep the shape of a dict of ``length`` keys whose read keys gave ``values``."""
    present = tuple(key for key, value in zip(read, values, strict=True) if value is not ABSENT)
    if len(present) < 2:  # itemgetter of one key returns the value, not a tuple
        return
    if len(shapes) >= _SHAPES_PER_PREFIX:
        shapes.clear()  # bounded: the shapes in use are learned again
    lacked = tuple(key for key, value in zip(read, values, strict=True) if value is ABSENT)
    shapes[length] = (present, lacked, itemgetter(*present))


def as_dict(metrics: dict[Any, Any] | PickedValues) -> dict[Any, Any]:
    """A teed snapshot's metrics as a dict (a copy's self; picked values' present keys)."""
    if type(metrics) is tuple:
        read, values = metrics
        return {key: value for key, value in zip(read, values, strict=True) if value is not ABSENT}
    return metrics  # type: ignore[return-value]


def _careful_snapshot(metrics: Mapping[Any, Any], keys: tuple[str, ...]) -> dict[Any, Any]:
    """The snapshot of a dict one of whose keys raised when compared: each key alone.

    A key whose lookup raises (a ``str`` subclass with a raising ``__eq__`` or ``__hash__``)
    is left out and counted under :data:`LEFT_OUT`; every other read key is kept.
    """
    snapshot: dict[Any, Any] = {}
    left_out = 0
    for key in keys:
        try:
            if key in metrics:
                snapshot[key] = metrics[key]
        except Exception:  # noqa: BLE001 - this key alone is lost, and counted
            left_out += 1
    snapshot[LEFT_OUT] = left_out
    return snapshot


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

"""The bounded, drop-oldest, lock-free hand-off queue to the worker (docs/semantics.md §6)."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def _nothing() -> None:
    return None


class DropOldestQueue(Generic[T]):
    """A bounded FIFO whose ``put`` never blocks, never locks, and drops the oldest item.

    Any number of threads may ``put``; exactly one (the worker) may ``pop_batch``.
    """

    __slots__ = (
        "caller_errors",
        "capacity",
        "counter",
        "extend",
        "high_water",
        "items",
        "on_high_water",
        "wake_asked",
    )

    def __init__(self, capacity: int, high_water: int | None = None) -> None:
        """Create a queue holding at most ``capacity`` items.

        Args:
            capacity: The bound; the oldest item goes when a put would exceed it.
            high_water: Queue length at which ``put`` calls ``on_high_water`` (a burst is
                about to overflow); three quarters of ``capacity`` by default.

        Raises:
            ValueError: ``capacity`` is below 1.
        """
        if capacity < 1:
            raise ValueError(f"queue capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.high_water = max(1, capacity * 3 // 4) if high_water is None else high_water
        self.items: deque[tuple[T, int]] = deque(maxlen=capacity)
        self.counter = itertools.count()
        # Bound once, so a producer's hot path is attribute loads and one C call.
        self.extend: Callable[[Any], None] = self.items.extend
        self.on_high_water: Callable[[], None] = _nothing
        # Set by the put that calls on_high_water, cleared by the worker when it wakes: a
        # burst asks once, not on every put past high water (each ask is a Python call).
        self.wake_asked = False
        # Puts that failed on the caller's side (the snapshot could not be taken): counted
        # by the caller's except clause, so the hand-off accounts for every call.
        self.caller_errors = 0

    def put(self, item: T) -> None:
        """Append ``item``, dropping the oldest if full. Never blocks; safe from any thread."""
        self.extend(zip((item,), self.counter))  # noqa: B905 - strict= is the slow path
        if len(self.items) >= self.high_water and not self.wake_asked:
            self.ask_wake()

    def ask_wake(self) -> None:
        """Call ``on_high_water`` once until the worker says it woke (``wake_asked``)."""
        self.wake_asked = True
        self.on_high_water()

    def __len__(self) -> int:
        return len(self.items)

    def enqueued(self) -> int:
        """How many items were ever put (the next sequence number). Safe from any thread."""
        # repr(count) is "count(N)", N the next value: the one read of an itertools.count
        # that does not consume it. Exact, because put draws and appends atomically.
        return int(repr(self.counter)[6:-1])

    def pop_batch(self, limit: int) -> list[tuple[T, int]]:
        """Remove and return up to ``limit`` ``(item, sequence)`` pairs, oldest first.

        Only the worker calls this.
        """
        popleft = self.items.popleft
        batch: list[tuple[T, int]] = []
        for _ in range(limit):
            try:
                batch.append(popleft())
            except IndexError:
                break
        return batch

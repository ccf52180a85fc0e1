"""Give the GIL back to training every ``SLICE_S`` of async_tee's work (docs/semantics.md §6)."""

from __future__ import annotations

import threading
import time

SLICE_S = 0.0004
"""The longest async_tee's thread runs Python before it offers the GIL back."""

# benchmarks/bench_handover.py measures how long the sleep must be; the CHANGELOG has the runs
# that chose this value.
HANDOVER_S = 0.0002
"""How long it sleeps to offer it: long enough for the woken waiter to be scheduled."""


class GilBudget:
    """Per-thread slices of Python work, each followed by a hand-over of the GIL.

    One object serves every thread that calls it: each thread keeps its own slice start.
    """

    def __init__(self, slice_s: float = SLICE_S, handover_s: float = HANDOVER_S) -> None:
        self.slice_s = slice_s
        self.handover_s = handover_s
        self.handovers = 0  # how many times a slice ended in a hand-over, all threads
        self._local = threading.local()

    def start(self) -> None:
        """A new slice begins now (the thread has just taken the GIL: after a wait)."""
        self._local.since = time.perf_counter()

    def spend(self) -> None:
        """Between two units of work: hand the GIL over if this slice has run its length."""
        now = time.perf_counter()
        since = getattr(self._local, "since", None)
        if since is None:
            self._local.since = now
            return
        if now - since >= self.slice_s:
            time.sleep(self.handover_s)
            self.handovers += 1
            self._local.since = time.perf_counter()


# Per process, like the GIL it rations: each thread's slice lives in its thread-local state.
_BUDGET = GilBudget()


def budget() -> GilBudget:
    """The process's budget, shared by the worker, the exporting thread and the callbacks."""
    return _BUDGET

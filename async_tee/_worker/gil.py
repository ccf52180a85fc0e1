"""Give the GIL back to the training thread every ``SLICE_S`` (0.4 ms) of async_tee's own work.

The worker and the exporting thread share the interpreter's GIL with training. A thread
that wants the GIL waits for the holder to block, or for the switch interval (5 ms by
default) to pass and force a hand-over; so a worker that records a batch for 3 ms makes
training wait up to 3 ms, however cheap each dict is. async_tee's threads instead call
:meth:`GilBudget.spend` between units of work (a dict, a callback); once a slice has run
``SLICE_S`` they sleep ``HANDOVER_S``, which releases the GIL long enough for a waiting
thread to take it. ``time.sleep(0)`` would not: the sleeper re-takes the GIL before the
waiter, woken on a condition variable, is scheduled, and the slices chain into one long
hold (``benchmarks/bench_handover.py`` measures how long the sleep must be; the runs that
chose ``HANDOVER_S`` are in the CHANGELOG). The sleep costs wall time, not CPU; the thread
is never latency-bound (it waits the switch interval to get the GIL back anyway). See
docs/semantics.md §6. Standard library only.
"""

from __future__ import annotations

import threading
import time

SLICE_S = 0.0004
"""The longest async_tee's thread runs Python before it offers the GIL back."""

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

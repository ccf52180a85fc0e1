"""Owns the demo's caller-side timing: what each ``log_metrics`` call and its tee cost."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, TypeAlias

from async_tee.logger import JsonlBackend, Logger

__all__ = ["CallSample", "TimedLogger", "latency_by_prefix", "percentiles_us"]

CallSample: TypeAlias = tuple[str, int, int, str]
"""One timed call: (prefix, tee ns, whole call ns, the calling thread's role)."""


class TimedLogger(Logger):
    """``Logger`` that times each call, and the tee inside it, on the calling thread.

    It also keeps the paced floor, :meth:`time_floor`, which the demo calls between the
    calls, after as much idle time as a call gets (what any hand-off must at least do: the
    same kind of dict copied into a deque, ``deque.append(dict(d))``, with caches as cold);
    and, for each :data:`FLOOR_PREFIX` call, the tee's CPU time on its thread
    (``time.thread_time_ns``), the rest of its wall time being waits (the GIL another thread
    held, the scheduler).

    Attributes:
        samples: One :data:`CallSample` per call, in the order the calls ended.
        roles: The role of each calling thread by thread id (the creating thread is
            ``training``; a thread missing from it is ``other``).
        floor_ns: Each :meth:`time_floor`.
        tee_cpu_ns: The tee's CPU time on its thread per :data:`FLOOR_PREFIX` call.
    """

    FLOOR_PREFIX = "train"

    def __init__(self, backends: list[JsonlBackend]) -> None:
        super().__init__(backends)
        self.samples: list[CallSample] = []
        self.roles: dict[int, str] = {threading.get_ident(): "training"}
        self._tee_ns = threading.local()
        self.floor_ns: list[int] = []
        self.tee_cpu_ns: list[int] = []
        self._floor: deque[dict[str, Any]] = deque(maxlen=64)

    def log_metrics(
        self,
        metrics: dict[str, Any],
        step: int,
        prefix: str = "",
        step_metric: str | None = None,
        step_finished: bool = False,
    ) -> None:
        """``Logger.log_metrics``, timed: appends one sample to :attr:`samples`."""
        start = time.perf_counter_ns()
        super().log_metrics(metrics, step, prefix, step_metric, step_finished)
        total = time.perf_counter_ns() - start
        role = self.roles.get(threading.get_ident(), "other")
        self.samples.append((prefix, self._tee_ns.value, total, role))

    def _tee(self, metrics: Mapping[str, Any], prefix: str, step: int, finished: bool) -> None:
        paced = prefix == self.FLOOR_PREFIX
        cpu = time.thread_time_ns() if paced else 0
        start = time.perf_counter_ns()
        super()._tee(metrics, prefix, step, finished)
        self._tee_ns.value = time.perf_counter_ns() - start
        if paced:
            self.tee_cpu_ns.append(time.thread_time_ns() - cpu)

    def time_floor(self, metrics: Mapping[str, Any]) -> None:
        """Time the paced floor once: ``metrics`` copied into a deque (kept: at most 64)."""
        start = time.perf_counter_ns()
        self._floor.append(dict(metrics))
        self.floor_ns.append(time.perf_counter_ns() - start)


def percentiles_us(samples_ns: list[int]) -> dict[str, float]:
    """``p50``, ``p99`` (nearest rank) and ``max`` of ``samples_ns``, in µs; zeros when empty."""
    if not samples_ns:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0}
    ordered = sorted(samples_ns)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] / 1000.0

    return {"p50": pick(0.5), "p99": pick(0.99), "max": ordered[-1] / 1000.0}


def latency_by_prefix(samples: list[CallSample]) -> dict[str, dict[str, Any]]:
    """Per prefix (sorted, ``""`` shown quoted) and ``all``: calls, tee and call percentiles."""
    groups: dict[str, list[CallSample]] = {}
    for sample in samples:
        groups.setdefault(sample[0] or '""', []).append(sample)
    out = {}
    for prefix in [*sorted(groups), "all"]:
        group = samples if prefix == "all" else groups[prefix]
        out[prefix] = {
            "calls": len(group),
            "tee": percentiles_us([tee for _, tee, _, _ in group]),
            "log_metrics": percentiles_us([total for _, _, total, _ in group]),
        }
    return out

"""What the worker does with each snapshot: the step clock, then the recorder (semantics §9)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from async_tee._declare import series as _series
from async_tee._handoff import caller as _caller
from async_tee._handoff.caller import Snapshot
from async_tee._handoff.queue import DropOldestQueue
from async_tee._reporting import warn_once
from async_tee._settings import DEFAULT_TRAINER_KEYS
from async_tee._worker.loop import Consumer, Worker
from async_tee._worker.mapping import (
    LEFT_OUT_REASON,
    READ_WHOLE,
    count_skipped,
    exact_str_keys,
)
from async_tee._worker.recorder import RLRecorder, Tables
from async_tee._worker.steps import StepClock, StepPolicy, StepReader


class SnapshotConsumer(Consumer):
    """One session's consumer: each snapshot passes the step clock, then the recorder.

    Attributes:
        recorder: Maps and records the snapshots (per-session counter memory).
        steps: The step clock: completes steps, records ``rl.step``, drives step exports.
    """

    def __init__(
        self,
        recorder: RLRecorder,
        steps: StepClock,
        queue: DropOldestQueue[Snapshot],
        on_step: Callable[[], object],
    ) -> None:
        """A consumer of ``queue``'s snapshots; ``on_step`` runs at each completed step."""
        self.recorder = recorder
        self.steps = steps
        self._queue = queue
        self._on_step = on_step
        self._checked_at = 0  # the completed-step count at the last on_step
        self._lag_values: dict[str, float] = {}

    def process(self, item: Snapshot) -> None:
        """Record one snapshot; a teed one passes the step clock first."""
        if len(item) == 5:
            metrics, prefix, raw_step, finished, enqueued_ns = item
            steps = self.steps
            # A number or None, never an array to store; numbered here when no caller passes one.
            step, ends = steps.step_of(raw_step, prefix, finished)
            steps.before(step, enqueued_ns)
            if metrics is not None:  # None: a bare end-of-step marker
                metrics = _caller.as_dict(metrics)
                if _caller.LEFT_OUT in metrics:
                    count_skipped(
                        self.recorder.skipped, LEFT_OUT_REASON, metrics.pop(_caller.LEFT_OUT)
                    )
                if prefix in READ_WHOLE:  # copied whole: keys as the caller made them
                    metrics = exact_str_keys(metrics)
                recorder = self.recorder
                recorder.probing = steps.probing
                recorder.tee(metrics, prefix, step, steps.is_stale(step))
                if recorder.unmarked:  # the loop ends no step with a step-ending dict
                    steps.stop_numbering()
                    recorder.probing = recorder.unmarked = False
            if ends:
                steps.finished(step)
        else:
            self.recorder.record(item[0], item[1])

    def after_drain(self, flushing: bool) -> float | None:
        """Let the step clock settle and export; seconds until it needs the worker again.

        ``flushing``: a flush waits on this drain, which completes a finished step now.
        """
        steps = self.steps
        wait = steps.tick(settle_now=flushing)
        if steps.completed != self._checked_at:
            self._checked_at = steps.completed
            self._on_step()
        return wait

    def cadence(self) -> tuple[float, float] | None:
        """When the next step is expected, ended and settled, and the step length."""
        return self.steps.cadence()

    def on_lag(self, lag_ms: float) -> None:
        """Record one drain's lag (``async_tee.lag``)."""
        self._lag_values[_series.LAG_KEY] = lag_ms
        self.recorder.instruments.record(_series.SELF_METRIC_GROUP, self._lag_values)

    def on_death(self) -> None:
        """The worker's loop ended unstopped: stop enqueuing into a queue nobody drains."""
        _caller.detach(self._queue)
        warn_once(
            "worker:died",
            "async_tee: the worker stopped unexpectedly; the tee is off for this session "
            "(stats()['worker_died'], async_tee.worker.died)",
        )

    def figures(self) -> dict[str, Any]:
        """This consumer's part of ``stats()``: values skipped at mapping, the step counts."""
        return {"values_skipped": self.recorder.skipped, "steps": self.steps.stats()}


def new_worker(
    tables: Tables,
    step_reader: StepReader | None,
    policy: StepPolicy,
    queue_size: int,
    drain_interval_s: float,
    on_step: Callable[[], object],
    trainer_keys: int = DEFAULT_TRAINER_KEYS,
) -> tuple[SnapshotConsumer, DropOldestQueue[Snapshot], Worker]:
    """A session's queue, its consumer over ``tables`` and the worker draining it, not started.

    ``step_reader``: the reader each completed step is collected for, if steps are exported.
    """
    queue: DropOldestQueue[Snapshot] = DropOldestQueue(queue_size)
    recorder = RLRecorder(tables, trainer_keys=trainer_keys)
    steps = StepClock(recorder.record_step, step_reader, policy)
    consumer = SnapshotConsumer(recorder, steps, queue, on_step)
    worker = Worker(
        queue,
        consumer,
        drain_interval_s,
        trickle_interval_s=policy.trickle_interval_s(step_reader is not None),
    )
    queue.on_high_water = worker.wake
    return consumer, queue, worker

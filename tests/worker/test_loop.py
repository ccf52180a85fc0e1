"""The worker alone: a bare hand-off queue and a plain callable, no OpenTelemetry."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from async_tee._handoff.queue import DropOldestQueue
from async_tee._worker.loop import LONGEST_SLEEP_S, Consumer, Worker
from async_tee._worker.steps import STEP_SETTLE_S, StepClock

LONG_S = 60.0  # a drain interval the tests never wait for: only flush and stop drive it


@pytest.fixture
def seen() -> list[int]:
    return []


@pytest.fixture
def queue() -> DropOldestQueue[tuple[int, int]]:
    return DropOldestQueue(4)


@pytest.fixture
def worker(queue, seen) -> Iterator[Worker]:
    class Seen(Consumer):
        def process(self, item: tuple[int, int]) -> None:
            if item[0] < 0:
                raise ValueError("a bad item")
            seen.append(item[0])

    worker = Worker(queue, Seen(), LONG_S)
    assert worker.start()
    yield worker
    worker.stop(5)
    assert not worker.thread.is_alive()


def test_flush_processes_everything_put_before_it_in_order(queue, worker, seen):
    for value in range(3):
        queue.put((value, 0))
    assert worker.flush(5)
    assert seen == [0, 1, 2]
    assert (worker.counts.recorded, worker.pending()) == (3, 0)


def test_overflow_is_counted_exactly_and_the_newest_survive(queue, worker, seen):
    for value in range(10):  # the worker sleeps a minute: nothing drains before the flush
        # put without the high-water wake
        queue.extend(zip(((value, 0),), queue.counter, strict=False))
    assert worker.flush(5)
    assert seen == [6, 7, 8, 9]
    assert (worker.counts.recorded, worker.counts.overflow) == (4, 6)


def test_a_failing_item_is_counted_and_the_worker_goes_on(queue, worker, seen, logs):
    queue.put((-1, 0))
    queue.put((5, 0))
    assert worker.flush(5)
    assert seen == [5]
    assert (worker.counts.errors, worker.counts.recorded) == (1, 1)
    assert [r.levelname for r in logs.records if "processing" in r.getMessage()] == ["WARNING"]


def test_stop_drains_then_ends_and_is_safe_twice(queue, worker, seen):
    queue.put((1, 0))
    assert worker.stop(5)
    assert seen == [1]
    assert not worker.thread.is_alive()
    assert worker.stop(5)


def test_what_is_left_after_a_stop_is_counted_as_shutdown(queue, worker, seen):
    assert worker.stop(5)
    queue.put((1, 0))  # after the worker has ended
    assert not worker.stop(5)  # not everything put before this call was processed
    assert (worker.counts.shutdown, seen) == (1, [])


@pytest.mark.parametrize(
    ("capacity", "found", "slept", "expected"),
    [
        (1024, 0, 0.05, 0.1),  # empty: back off, doubling the last sleep
        (1024, 20, 0.1, 0.32),  # 200 dicts a second: sleep until 64 are due
        (1024, 2, 1.0, 1.0),  # 2 a second: no longer than the trickle interval
        (1024, 5000, 0.1, 0.05),  # a flood: no shorter than the drain interval
        (64, 20, 0.1, 0.08),  # a small queue: a quarter of it, so high water stays for bursts
    ],
)
def test_the_timer_sleeps_until_a_batch_worth_a_wake_is_due(capacity, found, slept, expected):
    worker = Worker(DropOldestQueue(capacity), Consumer(), 0.05, trickle_interval_s=1.0)
    assert worker.next_sleep(found, slept) == pytest.approx(expected)


def test_idle_the_timer_backs_off_to_the_longest_sleep_and_no_further():
    worker = Worker(DropOldestQueue(1024), Consumer(), 0.05, trickle_interval_s=1.0)
    assert worker.next_sleep(6, 1.0) == pytest.approx(1.0)  # the last dicts: the trickle
    sleeps = [worker.next_sleep(0, 0.0) for _ in range(40)]
    assert sleeps[:5] == pytest.approx([2.0, 4.0, 8.0, 16.0, LONGEST_SLEEP_S])
    assert max(sleeps) == LONGEST_SLEEP_S == sleeps[-1]
    # An idle hour: a wake every LONGEST_SLEEP_S, not one a second.
    hour, wakes = 0.0, 0
    while hour < 3600.0:
        hour, wakes = hour + worker.next_sleep(0, 0.0), wakes + 1
    assert wakes <= 3600 / LONGEST_SLEEP_S + 1


def test_the_timer_sleeps_until_the_consumer_expects_more_then_backs_off_finely():
    worker = Worker(DropOldestQueue(1024), Consumer(), 0.05, trickle_interval_s=1.0)
    assert worker.next_sleep(6, 10.0, (9.8, 10.0)) == pytest.approx(9.8)  # the next step
    assert worker.next_sleep(6, 100.0, (98.0, 100.0)) == LONGEST_SLEEP_S  # bounded
    assert worker.next_sleep(6, 10.0, (0.001, 10.0)) == 0.05  # never under the interval
    assert worker.next_sleep(5000, 0.1, (9.8, 10.0)) == 0.05  # a flood: high water stays
    assert worker.next_sleep(100, 1.0, (9.8, 10.0)) == pytest.approx(0.64)  # a trickle
    assert worker.next_sleep(1, 0.001, (9.8, 10.0)) == pytest.approx(9.8)  # a flush's drain
    # Late: finely, doubling, up to the step length (checked for once a step, stalled).
    late = [worker.next_sleep(0, 0.0, (-0.1 * i, 10.0)) for i in range(12)]
    assert late[:4] == pytest.approx([0.05, 0.1, 0.2, 0.4])
    assert late[-1] == 10.0 == max(late)
    assert worker.next_sleep(2, 0.1, (-2.0, 10.0)) == 0.05  # some came: finely afresh
    late = [worker.next_sleep(0, 0.0, (-1.0, 600.0)) for i in range(20)]
    assert late[-1] == LONGEST_SLEEP_S == max(late)  # a long step: the bound still holds


S = 1_000_000_000  # ns


class CountingReader:
    """Stands in for the exporting reader: records when (on the given clock) it collected."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self.clock = clock
        self.collected_at: list[int] = []
        self.replaced = 0

    def collect_step(self) -> bool:
        self.collected_at.append(self.clock())
        return True


class Stepping(Consumer):
    """Items ``(step, step_finished, enqueued_ns)`` through a real step clock, driven as the
    session's consumer drives it (its mapping and recording left out)."""

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.reader = CountingReader(clock)
        self.steps = StepClock(lambda step, at: None, self.reader, monotonic_ns=clock)
        self.processed = 0

    def process(self, item: tuple[float, bool, int]) -> None:
        step, finished, enqueued_ns = item
        self.steps.before(step, enqueued_ns)
        if finished:
            self.steps.finished(step)
        self.processed += 1

    def after_drain(self, flushing: bool) -> float | None:
        return self.steps.tick(settle_now=flushing)

    def cadence(self) -> tuple[float, float] | None:
        return self.steps.cadence()


@dataclasses.dataclass
class FakeTime:
    now: int = 1_000 * S

    def __call__(self) -> int:
        return self.now


def run_on_fake_time(
    logged: list[tuple[int, tuple[float, bool, int]]], until_ns: int, clock: FakeTime
) -> tuple[Worker, Stepping, list[int]]:
    """The worker's loop on a fake clock, no thread: each wake queues what was logged by
    then and takes the worker's turn (the loop's very code); the next wake is when the turn
    says. Returns the worker, its consumer and when it woke."""
    consumer = Stepping(clock)
    worker = Worker(DropOldestQueue(1024), consumer, 0.05, trickle_interval_s=1.0)
    pending = sorted(logged, key=lambda entry: entry[0])
    woke: list[int] = []
    last = clock.now
    while clock.now < until_ns:
        while pending and pending[0][0] <= clock.now:
            worker.queue.put(pending.pop(0)[1])
        woke.append(clock.now)
        wait = worker.turn((clock.now - last) / S)
        last = clock.now
        clock.now += max(1, round(wait * S))
    return worker, consumer, woke


def burst(end_ns: int, step: float) -> list[tuple[int, tuple[float, bool, int]]]:
    """A NeMo-RL step's end: four dicts, the fourth ``step_finished``, then the efficiency
    dict, a millisecond apart."""
    times = [end_ns - (4 - i) * S // 1000 for i in range(5)]
    return [(t, (step, i == 3, t)) for i, t in enumerate(times)]


def test_steps_at_a_steady_cadence_cost_about_one_wake_each():
    clock = FakeTime()
    start, period = clock.now, 10 * S
    jitter = random.Random(0)
    ends = [start + k * period + jitter.randint(-20, 20) * S // 1000 for k in range(1, 31)]
    logged = [entry for k, end in enumerate(ends, start=1) for entry in burst(end, float(k))]
    # NeMo-RL's stall watchdog: a held dict every 30 s, off the steps' cadence, at the last
    # completed step. It waits for the next step's drain (it changes no export before).
    watchdog = range(start + 17 * S, ends[-1], 30 * S)
    logged += [(t, (float((t - start) // period), False, t)) for t in watchdog]
    worker, consumer, woke = run_on_fake_time(logged, ends[-1] + 5 * S, clock)
    steady = [t for t in woke if t > ends[3]]  # the cadence is learned in three steps
    assert len(steady) <= len(ends) - 4 + 2, len(steady)  # about one a step, not ten
    # Every step drained and exported: each about 0.2 s after it ended (settled, with
    # a settle time's margin), not seconds later.
    assert consumer.processed == len(logged)
    exported = consumer.reader.collected_at
    assert len(exported) == len(ends)
    late = [at - end for at, end in zip(exported[4:], ends[4:], strict=False)]
    assert all(0 < ns < 2.5 * STEP_SETTLE_S * S for ns in late), late
    assert consumer.steps.stats()["coalesced"] == 0
    assert worker.counts.recorded == len(logged)


def test_idle_no_timer_wake_comes_sooner_than_the_bound_allows():
    clock = FakeTime()
    hour = 3600 * S
    _, _, woke = run_on_fake_time([], clock.now + hour, clock)
    doubling = math.ceil(math.log2(LONGEST_SLEEP_S / 0.05)) + 1
    assert len(woke) <= hour / (LONGEST_SLEEP_S * S) + doubling
    assert max(b - a for a, b in itertools.pairwise(woke)) == LONGEST_SLEEP_S * S


def test_after_the_last_step_the_worker_looks_for_the_next_once_a_step_length():
    clock = FakeTime()
    start, period = clock.now, 10 * S
    ends = [start + k * period for k in range(1, 6)]
    logged = [entry for k, end in enumerate(ends, start=1) for entry in burst(end, float(k))]
    hour = 3600 * S
    _, consumer, woke = run_on_fake_time(logged, ends[-1] + hour, clock)
    assert consumer.steps.completed == len(ends)
    # The step due 10.2 s after the last does not come: fine back-off from the drain
    # interval, doubling up to the step length, then a wake a step length, as stepping
    # would cost (and a step after a stall is drained within one, two at most a drain).
    after = [t for t in woke if t > ends[-1] + S]
    doubling = math.ceil(math.log2(period / S / 0.05)) + 1
    assert len(after) <= hour / period + doubling
    assert max(b - a for a, b in itertools.pairwise(after)) == period


def test_a_step_logged_early_or_after_a_stall_is_drained_and_exported():
    clock = FakeTime()
    start, period = clock.now, 10 * S
    ends = [start + k * period for k in range(1, 11)]
    ends[4] -= 4 * S  # step 5 comes 4 s early
    resumed = ends[-1] + 300 * S  # then a 5-minute stall (a checkpoint, an evaluation)
    ends += [resumed + k * period for k in range(4)]
    logged = [entry for k, end in enumerate(ends, start=1) for entry in burst(end, float(k))]
    _, consumer, woke = run_on_fake_time(logged, ends[-1] + 5 * S, clock)
    assert consumer.processed == len(logged)
    exported = consumer.reader.collected_at
    assert len(exported) == len(ends)
    assert consumer.steps.stats()["coalesced"] == 0
    # The early step waits for the wake the cadence planned: within one step length.
    assert 0 < exported[4] - ends[4] <= 4 * S + 2.5 * STEP_SETTLE_S * S
    # Stalled, the worker looks for the overdue step once a step length: the first step
    # after the stall is drained within one, the next ones about 0.2 s after each.
    assert 0 < exported[-4] - ends[-4] <= period
    late = [at - end for at, end in zip(exported[-3:], ends[-3:], strict=True)]
    assert all(0 < ns < 2.5 * STEP_SETTLE_S * S for ns in late), late
    during = [t for t in woke if ends[9] + S < t < resumed]
    assert len(during) <= 300 * S / period + math.ceil(math.log2(period / S / 0.05)) + 1


def test_lag_counts_from_the_planned_wake_for_a_dict_logged_while_the_worker_slept():
    worker = Worker(DropOldestQueue(8), Consumer(), 0.05)  # not started: drained here
    worker.consumer = Stepping()
    now = time.monotonic_ns()
    worker.planned_ns = now - 1 * S  # it planned to wake a second ago (it is late)
    worker.queue.put((1.0, False, now - 9 * S))  # logged while it slept, by design
    worker.queue.put((1.0, False, now - S // 2))  # logged after the planned wake
    assert worker.drain() == 2
    slept_through, after = worker.lags_ms
    assert 1000 <= slept_through < 1500  # late by a second, not by nine
    assert 500 <= after < 1000


def teach_a_cadence(worker: Worker, queue: DropOldestQueue[Any], length_s: float) -> None:
    """Three steps, ``length_s`` apart, the last ended 0.4 s ago, each drained by a flush."""
    now = time.monotonic_ns()
    for k in range(3):
        queue.put((float(k + 1), True, now - round(((2 - k) * length_s + 0.4) * S)))
        assert worker.flush(5)


def test_flush_wakes_at_once_a_worker_sleeping_until_the_next_step():
    queue: DropOldestQueue[Any] = DropOldestQueue(64)
    worker = Worker(queue, Stepping(), 0.05)
    assert worker.start()
    try:
        teach_a_cadence(worker, queue, 10.0)
        # It plans to wake when step 4 is due: 10 s after step 3 ended, 0.2 s to settle.
        planned_in = (worker.planned_ns - time.monotonic_ns()) / S
        assert 9.0 < planned_in <= 9.8
        woken = worker.wakes
        queue.put((4.0, False, time.monotonic_ns()))
        assert worker.flush(5)  # long before that: the flush woke it
        assert worker.wakes == woken + 1
    finally:
        worker.stop(5)


def test_high_water_drains_at_once_a_burst_logged_early():
    queue: DropOldestQueue[Any] = DropOldestQueue(8)  # high water: 6
    drained = threading.Event()

    class Counting(Stepping):
        def process(self, item: tuple[float, bool, int]) -> None:
            super().process(item)
            if self.processed == 3 + 6:
                drained.set()

    worker = Worker(queue, Counting(), 0.05)
    queue.on_high_water = worker.wake
    assert worker.start()
    try:
        teach_a_cadence(worker, queue, 20.0)  # the next step is ~20 s away
        assert (worker.planned_ns - time.monotonic_ns()) / S > 10.0
        for _ in range(6):
            queue.put((4.0, False, time.monotonic_ns()))
        assert drained.wait(5), "the high-water wake did not drain the early burst"
        assert worker.counts.overflow == 0
    finally:
        worker.stop(5)


def test_each_burst_wakes_the_sleeping_worker_once(seen):
    """High water wakes a worker that sleeps a minute, and again on the next burst: the
    queue's ask is cleared when the worker wakes, not left set."""
    queue: DropOldestQueue[tuple[int, int]] = DropOldestQueue(8)  # high water: 6
    drained = threading.Event()

    class Seen(Consumer):
        def process(self, item: tuple[int, int]) -> None:
            seen.append(item[0])
            if len(seen) % 6 == 0:
                drained.set()

    asks = []
    worker = Worker(queue, Seen(), LONG_S)
    assert worker.start()

    def ask() -> None:
        asks.append(len(queue))
        worker.wake()

    queue.on_high_water = ask
    try:
        for burst in range(2):
            drained.clear()
            for value in range(6):
                queue.put((burst * 6 + value, 0))
            assert drained.wait(5), f"burst {burst} did not wake the worker"
        assert seen == list(range(12))
        assert asks == [6, 6]  # one ask a burst
    finally:
        worker.stop(5)

"""The worker alone: a bare hand-off queue and a plain callable, no OpenTelemetry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from async_tee._handoff.queue import DropOldestQueue
from async_tee._worker.loop import Consumer, Worker

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
        (1024, 0, 0.05, 0.1),  # empty: back off, doubling
        (1024, 20, 0.1, 0.32),  # 200 dicts a second: sleep until 64 are due
        (1024, 2, 1.0, 1.0),  # 2 a second: no longer than the trickle interval
        (1024, 5000, 0.1, 0.05),  # a flood: no shorter than the drain interval
        (64, 20, 0.1, 0.08),  # a small queue: a quarter of it, so high water stays for bursts
    ],
)
def test_the_timer_sleeps_until_a_batch_worth_a_wake_is_due(capacity, found, slept, expected):
    worker = Worker(DropOldestQueue(capacity), Consumer(), 0.05, trickle_interval_s=1.0)
    assert worker.next_sleep(0.05, found, slept) == pytest.approx(expected)


def test_each_burst_wakes_the_sleeping_worker_once(seen):
    """High water wakes a worker that sleeps a minute, and again on the next burst: the
    queue's ask is cleared when the worker wakes, not left set."""
    import threading

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

"""The lock-free drop-oldest queue: order, bound, sequence numbers, exact enqueued count."""

from __future__ import annotations

import threading

import pytest

from async_tee._handoff.queue import DropOldestQueue


def test_fifo_with_increasing_sequence_numbers():
    queue: DropOldestQueue[str] = DropOldestQueue(8)
    for item in "abc":
        queue.put(item)
    assert queue.enqueued() == 3
    assert queue.pop_batch(10) == [("a", 0), ("b", 1), ("c", 2)]
    assert queue.pop_batch(10) == []
    assert queue.enqueued() == 3  # popping does not change what was put


def test_overflow_drops_the_oldest_and_leaves_a_sequence_gap():
    queue: DropOldestQueue[int] = DropOldestQueue(3)
    for item in range(10):
        queue.put(item)
    assert len(queue) == 3
    assert queue.pop_batch(10) == [(7, 7), (8, 8), (9, 9)]  # the newest survive
    assert queue.enqueued() == 10  # 7 dropped: the gap between 0 and the first seq seen


def test_pop_batch_respects_its_limit():
    queue: DropOldestQueue[int] = DropOldestQueue(10)
    for item in range(5):
        queue.put(item)
    assert [seq for _, seq in queue.pop_batch(2)] == [0, 1]
    assert [seq for _, seq in queue.pop_batch(10)] == [2, 3, 4]


def test_high_water_asks_for_a_wake_once_until_the_worker_wakes():
    fired = []
    queue: DropOldestQueue[int] = DropOldestQueue(8)
    assert queue.high_water == 6
    queue.on_high_water = lambda: fired.append(len(queue))
    for item in range(7):
        queue.put(item)
    assert fired == [6]  # once a burst, not on every put past high water
    queue.wake_asked = False  # the worker woke
    queue.put(7)
    assert fired == [6, 8]


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        DropOldestQueue(0)


def test_sequence_numbers_increase_along_the_deque_under_racing_producers():
    import sys

    queue: DropOldestQueue[int] = DropOldestQueue(100_000)
    barrier = threading.Barrier(8)

    def produce() -> None:
        barrier.wait()
        for item in range(5_000):
            queue.put(item)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=produce) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    seqs = [seq for _, seq in queue.pop_batch(100_000)]
    assert seqs == list(range(40_000))  # appended in exactly the order they were numbered
    assert queue.enqueued() == 40_000

"""The step clock and its policy as a table of cases, on an injected clock: no sleeping, no threads.

Each case feeds the step clock a timeline of dicts (when each was logged, of which step,
whether it said ``step_finished``) and worker ticks, and checks what was exported.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from async_tee._worker.steps import BACKSTOP_GRACE, STEP_SETTLE_S, StepClock, StepPolicy

MS = 1_000_000  # ns


class FakeReader:
    """Stands in for the exporting reader: records when the clock collected, and for what."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.collected_at: list[int] = []

    def collect_step(self) -> bool:
        self.collected_at.append(self.clock.now)
        return True


@dataclasses.dataclass
class FakeClock:
    now: int = 10_000 * MS

    def __call__(self) -> int:
        return self.now


@dataclasses.dataclass(frozen=True)
class Case:
    """A timeline: ("dict", at_ms, step, finished) and ("tick", at_ms) events, in order."""

    name: str
    events: tuple[tuple[Any, ...], ...]
    exported_at_ms: tuple[int, ...]  # when (on the trainer's timeline) each step export ran
    completed: int
    coalesced: int
    close: bool = False
    min_interval_s: float = 1.0


CASES = [
    Case(
        "complete by marker, after the settle time",
        (("dict", 0, 1, False), ("dict", 10, 1, True), ("tick", 50), ("tick", 110)),
        exported_at_ms=(110,),
        completed=1,
        coalesced=0,
    ),
    Case(
        "settle: a late dict of the same step restarts the wait",
        (("dict", 0, 1, True), ("dict", 80, 1, False), ("tick", 120), ("tick", 180)),
        exported_at_ms=(180,),
        completed=1,
        coalesced=0,
    ),
    Case(
        "complete by a later step (no marker, the seed's Logger)",
        (("dict", 0, 1, False), ("tick", 500), ("dict", 2000, 2, False)),
        exported_at_ms=(2000,),
        completed=1,
        coalesced=0,
    ),
    Case(
        "coalesce: a step under the least interval is folded by the next one",
        (
            ("dict", 0, 1, False),
            ("dict", 2000, 2, False),  # step 1 completes and is exported at 2000
            ("dict", 2300, 3, False),  # step 2 completes 0.3 s later: waits
            ("dict", 2600, 4, False),  # step 3 dirties the tables: step 2 is folded
        ),
        exported_at_ms=(2000,),
        completed=3,
        coalesced=2,
    ),
    Case(
        "a waiting step is collected when the interval allows, on the worker's tick",
        (
            ("dict", 0, 1, False),
            ("dict", 2000, 2, True),
            ("tick", 2150),  # step 2 settled but only 0.15 s after step 1's export
            ("tick", 3000),  # the interval allows: collected now
        ),
        exported_at_ms=(2000, 3000),
        completed=2,
        coalesced=0,
    ),
    Case(
        "a late drain of finished steps dates each at its settle time: none is folded",
        (
            ("dict", 0, 1, True),
            ("dict", 1000, 2, True),  # the worker drains all three at once, late
            ("dict", 2000, 3, True),
            ("tick", 2150),
        ),
        exported_at_ms=(1000, 2000, 2150),
        completed=3,
        coalesced=0,
    ),
    Case(
        "a waiting step is collected as of when the interval allowed it, not the late tick",
        (
            ("dict", 0, 1, True),
            ("tick", 100),  # step 1 exported, as of 100
            ("dict", 900, 2, True),  # settles at 1000: may go at 1100
            ("tick", 1300),  # collected now, as of 1100
            ("dict", 2000, 3, True),  # settles at 2100: one interval after 1100
            ("tick", 2200),  # (as of 1300, it would wait until 2300)
        ),
        exported_at_ms=(100, 1300, 2200),
        completed=3,
        coalesced=0,
    ),
    Case(
        "with no interval every step is its own export",
        (("dict", 0, 1, False), ("dict", 10, 2, False), ("dict", 20, 3, False)),
        exported_at_ms=(10, 20),
        completed=2,
        coalesced=0,
        min_interval_s=0.0,
    ),
    Case(
        "a dict of an older step starts nothing",
        (("dict", 0, 5, False), ("dict", 2000, 4, False), ("tick", 2500)),
        exported_at_ms=(),
        completed=0,
        coalesced=0,
    ),
    Case(
        "close completes the open step; the final export carries it",
        (("dict", 0, 1, False), ("dict", 2000, 2, False)),
        exported_at_ms=(2000,),
        completed=2,
        coalesced=0,
        close=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_step_clocks_rules(case: Case):
    clock = FakeClock()
    start = clock.now
    reader = FakeReader(clock)
    policy = StepPolicy(min_interval_s=case.min_interval_s)
    recorded: list[float] = []
    steps = StepClock(lambda step, at: recorded.append(step), reader, policy, monotonic_ns=clock)
    for event in case.events:
        clock.now = start + event[1] * MS
        if event[0] == "dict":
            _, _, step, finished = event
            steps.before(steps.usable(step), clock.now)
            if finished:
                steps.finished(step)
        else:
            steps.tick()
    if case.close:
        steps.close()
    assert [(t - start) // MS for t in reader.collected_at] == list(case.exported_at_ms)
    stats = steps.stats()
    assert stats["completed"] == case.completed == len(recorded)
    assert stats["coalesced"] == case.coalesced
    carried = 1 if case.close else 0
    assert stats["exported"] == len(case.exported_at_ms) + carried
    if case.close:
        assert stats["exported"] + stats["coalesced"] == stats["completed"]


def test_the_clock_asks_to_be_woken_when_the_waiting_step_may_be_exported():
    clock = FakeClock()
    reader = FakeReader(clock)
    steps = StepClock(
        lambda step, at: None, reader, StepPolicy(min_interval_s=1.0), monotonic_ns=clock
    )
    start = clock.now
    steps.before(1.0, start)
    steps.before(2.0, start + 2000 * MS)  # step 1 exported at 2000 ms
    steps.finished(2.0)
    clock.now = start + 2000 * MS
    due = steps.tick()
    # Settled at 2100 ms, exportable at 3000 ms: one wake, at 3000, not one at 2100.
    assert due == pytest.approx(1.0)


def test_the_policys_numbers():
    policy = StepPolicy(min_interval_s=2.0, export_interval_s=60.0)
    assert policy.settle_s == STEP_SETTLE_S
    assert policy.trickle_interval_s(steps_exported=True) == 2.0
    assert policy.trickle_interval_s(steps_exported=False) == float("inf")
    assert policy.backstop_due(100.0, last_was_step=False) == 160.0
    assert policy.backstop_due(100.0, last_was_step=True) == 100.0 + 60.0 * (1 + BACKSTOP_GRACE)
    assert policy.may_collect(3 * 10**9, 1 * 10**9)
    assert not policy.may_collect(3 * 10**9 - 1, 1 * 10**9)


class CountingReader:
    """Stands in for the exporting reader beside the step clock: counts what it is asked."""

    def __init__(self) -> None:
        self.collections = 0

    def collect_step(self) -> bool:
        self.collections += 1
        return True


def test_the_clock_wakes_to_settle_a_step_only_when_it_could_be_exported():
    reader = CountingReader()
    clock = StepClock(lambda step, at: None, reader, StepPolicy(min_interval_s=1.0))
    now = time.monotonic_ns()
    clock.before(1.0, now - 200_000_000)  # step 1 finished 0.2 s ago: settled
    clock.finished(1.0)
    assert clock.tick() is None
    assert reader.collections == 1  # exported at once
    clock.before(2.0, time.monotonic_ns())  # step 2 finishes now
    clock.finished(2.0)
    due = clock.tick()
    # It settles in 0.1 s but may be exported only 1 s after step 1: no wake before that.
    assert due is not None
    assert due > 0.5
    assert reader.collections == 1


def test_with_no_reader_to_drive_settling_asks_for_no_wake():
    clock = StepClock(lambda step, at: None)
    clock.before(1.0, time.monotonic_ns())
    clock.finished(1.0)
    assert clock.tick() is None


def _ended(clock: FakeClock, steps: StepClock, end_ms: int, step: float) -> None:
    """A step whose finishing dict was logged at ``end_ms``, ticked once it settled."""
    clock.now = end_ms * MS
    steps.before(step, clock.now)
    steps.finished(step)
    clock.now += 150 * MS
    steps.tick()


def test_the_next_step_is_expected_one_step_length_after_the_last_ended_and_settled():
    clock = FakeClock(0)
    steps = StepClock(lambda step, at: None, FakeReader(clock), monotonic_ns=clock)
    _ended(clock, steps, 10_000, 1.0)
    _ended(clock, steps, 20_000, 2.0)
    assert steps.cadence() is None  # one step length seen: no cadence yet
    _ended(clock, steps, 30_000, 3.0)
    clock.now = 30_200 * MS
    # Step 4 ends about 40 s and settles 0.1 s later; a settle time's margin after that.
    assert steps.cadence() == pytest.approx((10.0 + 2 * STEP_SETTLE_S - 0.2, 10.0))
    clock.now = 41_000 * MS
    assert steps.cadence() == pytest.approx((-0.8, 10.0))  # it is late
    _ended(clock, steps, 341_000, 4.0)  # after a 5-minute stall
    clock.now = 341_200 * MS
    # The shorter of the last two step lengths: the stall does not push the next step out.
    assert steps.cadence() == pytest.approx((10.0 + 2 * STEP_SETTLE_S - 0.2, 10.0))


def test_steps_closer_than_half_the_least_export_interval_have_no_cadence_to_wake_for():
    clock = FakeClock(0)
    policy = StepPolicy(min_interval_s=1.0)
    steps = StepClock(lambda step, at: None, FakeReader(clock), policy, monotonic_ns=clock)
    for k in range(1, 5):
        _ended(clock, steps, k * 400, float(k))  # 2.5 steps a second: the timer drains them
    assert steps.cadence() is None
    for k in range(5, 8):
        _ended(clock, steps, 1600 + (k - 4) * 600, float(k))  # 0.6 s: a drain each
    assert steps.cadence() is not None

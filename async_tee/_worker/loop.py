"""The worker thread: an asyncio loop draining the queue on its own timer (docs/semantics.md §6)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from async_tee._handoff.queue import DropOldestQueue
from async_tee._reporting import logger, warn_once
from async_tee._worker.gil import budget

BATCH_SIZE = 256
"""Items popped per slice of a drain, so a flood cannot hold the loop indefinitely."""

TRICKLE_INTERVAL_S = 1.0
"""The longest the worker sleeps after a drain that found dicts, with no cadence to go by."""

LONGEST_SLEEP_S = 30.0
"""The longest the worker ever sleeps on its own timer: idle, or until the next step is due.
A dict logged while it sleeps, off the steps' cadence, is recorded within this."""

WAKE_TARGET = 64
"""Dicts a timer wake should find. A wake costs far more CPU than a dict, whatever it finds
(the loop, the step clock, re-taking the GIL from a busy trainer), so at
a steady rate the worker sleeps until about this many have arrived (at most the trickle
interval, and at most a quarter of the queue: the high-water wake is the producer's, a
syscall in the training thread, and must stay for bursts)."""

LAG_SAMPLES = 2048
"""Recent lags (how late each dict was recorded) kept for the percentiles in ``stats()``."""


LOSS_WARNING_INTERVAL_S = 60.0
"""At most one overflow warning of each kind (start, recovery) per this many seconds, so a
queue that flaps cannot flood the log; the rest go to debug."""


class EpisodeLog:
    """Warns at most once per ``interval_s`` for each kind of episode; debug otherwise."""

    __slots__ = ("interval_s", "last")

    def __init__(self, interval_s: float = LOSS_WARNING_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.last: dict[str, float] = {}

    def log(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        last = self.last.get(kind)
        if last is None or now - last >= self.interval_s:
            self.last[kind] = now
            logger.warning(message, *args)
        else:
            logger.debug(message, *args)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Counts:
    """Immutable snapshot of what the worker has accounted for; replaced, never mutated."""

    __slots__ = ("errors", "next_expected", "overflow", "recorded", "shutdown")

    def __init__(
        self, next_expected: int, recorded: int, overflow: int, errors: int, shutdown: int
    ) -> None:
        self.next_expected = next_expected
        self.recorded = recorded
        self.overflow = overflow
        self.errors = errors
        self.shutdown = shutdown


class Consumer:
    """What a worker does with the items it drains, on its thread; all but ``process`` optional."""

    def process(self, item: Any) -> None:
        """Called with each item, oldest first; an exception is counted as a dropped item."""
        raise NotImplementedError

    def after_drain(self, flushing: bool) -> float | None:
        """Called after each drain (``flushing``: a flush waits on it).

        Returns:
            The seconds until the consumer needs the worker again (the next wake comes no
            later), or None.
        """
        return None

    def cadence(self) -> tuple[float, float] | None:
        """Called after ``after_drain``: when the consumer expects its next items, if it can.

        Returns:
            ``(due_in_s, period_s)``: the seconds until they should be there, whole (negative
            once that has passed without them), and the period they come at; or None with no
            cadence to go by (the worker's own timer, ``Worker.next_sleep``).
        """
        return None

    def on_lag(self, lag_ms: float) -> None:
        """Called once a drain with its oldest item's lag (how late it was recorded), in ms."""

    def on_death(self) -> None:
        """Called if the worker's loop ever ends before ``stop``."""


class Worker:
    """Drains one ``DropOldestQueue`` on a daemon thread named ``async-tee-worker``."""

    def __init__(
        self,
        queue: DropOldestQueue[Any],
        consumer: Consumer,
        drain_interval_s: float,
        trickle_interval_s: float = TRICKLE_INTERVAL_S,
    ) -> None:
        """Prepare a worker; ``start`` runs it.

        Args:
            queue: The hand-off queue this worker alone consumes.
            consumer: What is done with each item, on the worker thread (``lags_ms`` and
                ``max_lag_ms`` keep every item's lag; the consumer hears each drain's).
            drain_interval_s: The shortest the worker sleeps between drains.
            trickle_interval_s: The longest sleep while dicts keep arriving with no cadence
                to go by (see ``next_sleep``): no longer than steps may be exported apart,
                so each exportable step gets a drain of its own and its own export.
        """
        self.queue = queue
        self.consumer = consumer
        self._interval = drain_interval_s
        self._longest = max(drain_interval_s, LONGEST_SLEEP_S)
        trickle_cap = max(drain_interval_s, TRICKLE_INTERVAL_S)
        self._trickle_interval = min(max(drain_interval_s, trickle_interval_s), trickle_cap)
        self._sleep = drain_interval_s  # the last sleep: doubled while nothing comes
        self._late = drain_interval_s  # the next sleep while expected items are late
        self.planned_ns = 0  # when the worker plans its next timer wake (monotonic ns)
        self._wake_target = min(WAKE_TARGET, max(1, queue.capacity // 4))
        self.died = False  # the loop ended without being stopped
        self.counts = Counts(0, 0, 0, 0, 0)
        self.lags_ms: deque[float] = deque(maxlen=LAG_SAMPLES)
        self.max_lag_ms = 0.0
        self._waiters: deque[tuple[int, Callable[[], object]]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_future: asyncio.Future[None] | None = None
        self._wake_pending = False
        self._stopping = False
        self.abandoned = False  # stop() gave up on it: pending dicts count as dropped
        self._overflow_seen = 0
        self.wakes = 0  # loop iterations: timer wakes, high-water wakes, flushes
        self._loss_started_at: int | None = None
        self.episodes = EpisodeLog()
        self._ready = threading.Event()
        # Held while items are processed, so os.fork() can wait for a clean point instead
        # of leaving the child an SDK lock held by a worker that no longer exists.
        self.busy = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="async-tee-worker", daemon=True)

    @property
    def thread(self) -> threading.Thread:
        """The worker's thread."""
        return self._thread

    def start(self, timeout_s: float = 5.0) -> bool:
        """Start the thread and wait until its loop runs; returns whether it did in time."""
        self._thread.start()
        return self._ready.wait(timeout_s)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException:  # noqa: BLE001 - the thread must end quietly, never crash noisily
            warn_once("worker:crash", "async_tee: the worker loop stopped unexpectedly")
        finally:
            self.died = not self._stopping
            self._ready.set()
            self._release_waiters(force=True)
            if self.died:
                self.consumer.on_death()

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._ready.set()
        gil = budget()
        woke_at = time.monotonic()
        while True:
            self.wakes += 1
            slept, woke_at = time.monotonic() - woke_at, time.monotonic()
            wait = self.turn(slept)
            if self._stopping:
                return
            future: asyncio.Future[None] = loop.create_future()
            self._wake_future = future
            timer = loop.call_later(wait, _resolve, future)
            await future
            gil.start()  # the GIL was just taken back: a new slice of work begins
            timer.cancel()
            self._wake_pending = False
            self.queue.wake_asked = False  # the next burst may ask again

    def turn(self, slept: float) -> float:
        """One wake's work, on the worker's thread; the seconds until the next timer wake.

        Drain, let the consumer act (it may say when it needs the worker, and when it
        expects more), report overflow, plan the next wake (``planned_ns``), then release
        the flush waiters this drain satisfied. ``slept``: the seconds since the last turn.
        """
        found = self.drain()
        due, cadence = self._call_after_drain()
        self._report_loss()
        sleep = self.next_sleep(found, slept, cadence)
        wait = sleep if due is None else max(0.0, min(sleep, due))
        self.planned_ns = time.monotonic_ns() + int(wait * 1e9)
        self._release_waiters()
        return wait

    def next_sleep(
        self, found: int, slept: float, cadence: tuple[float, float] | None = None
    ) -> float:
        """How long to sleep before the next drain, given what this one found.

        Each timer wake costs CPU the training thread cannot use, whatever it finds
        (``WAKE_TARGET``), so the worker wakes when there is something worth a wake:

        - The consumer expects its next items in ``due_in_s`` (``cadence``; the step clock:
          the next step, ended and settled): sleep until then, whatever comes in between
          (unless this drain found a wake's worth: then no later than ``WAKE_TARGET`` more
          are due at the rate just seen, dicts coming faster than bursts).
        - They are late (``due_in_s`` <= 0): back off finely, from the drain interval,
          doubling, up to their period: a late step is drained about as late as it came,
          and after a stall at most a period late, so no drain holds more than two steps.
        - No cadence: after a drain that found dicts, sleep until ``WAKE_TARGET`` more are
          due at the rate just seen, at most the trickle interval (the least time between
          step exports, at most 1 s), so a step that may be exported gets a drain of its
          own; after one that found none, double the last sleep.

        Every sleep is between the drain interval and ``LONGEST_SLEEP_S``. Bursts still
        wake the worker at high water; flush and stop wake it.
        """
        batch = math.inf
        if found:
            rate = found / max(slept, 1e-3)
            batch = max(self._wake_target / rate, self._interval)
        if cadence is None:
            sleep = min(batch, self._trickle_interval) if found else self._sleep * 2
        else:
            due_in, period = cadence
            if due_in > 0:
                self._late = self._interval  # should they be late, back off finely from then
                if found < self._wake_target:  # a burst, or a flush's drain: no rate to go by
                    batch = math.inf
                sleep = min(due_in, batch)
            else:  # late: back off finely (afresh when some came), up to their period
                sleep = self._interval if found else self._late
                self._late = min(sleep * 2, max(period, self._interval))
        self._sleep = sleep = max(self._interval, min(sleep, self._longest))
        return sleep

    def _call_after_drain(self) -> tuple[float | None, tuple[float, float] | None]:
        """The consumer's after-drain step: when it needs the worker, when it expects more."""
        try:
            with self.busy:
                consumer = self.consumer
                return consumer.after_drain(bool(self._waiters)), consumer.cadence()
        except BaseException:  # the hook must not stop the loop
            if sys.is_finalizing():
                raise
            warn_once("worker:after_drain", "async_tee: the worker's after-drain step failed")
            return None, None

    def wake(self) -> None:
        """Ask the worker to drain now. Safe from any thread; never blocks; never raises."""
        if self._wake_pending:
            return
        self._wake_pending = True
        loop = self._loop
        if loop is None:
            return
        try:  # noqa: SIM105 - cheaper than contextlib.suppress on a producer's path
            loop.call_soon_threadsafe(self._on_wake)
        except RuntimeError:  # the loop is closed: nothing left to wake
            pass

    def _on_wake(self) -> None:
        future = self._wake_future
        if future is not None:
            _resolve(future)

    def drain(self) -> int:
        """Process everything queued now; return how many items. Only on the worker's thread."""
        queue = self.queue
        found = 0
        oldest_lag_ms: float | None = None
        while True:
            batch = queue.pop_batch(BATCH_SIZE)
            if not batch:
                break
            found += len(batch)
            lag_ms = self._account(batch)
            if oldest_lag_ms is None:
                oldest_lag_ms = lag_ms
        if oldest_lag_ms is not None:
            # One observation a drain (its oldest dict's lag: the drain's worst), not one a
            # dict: an SDK histogram record costs more than mapping a dict.
            self.consumer.on_lag(oldest_lag_ms)
        return found

    def _account(self, batch: list[tuple[Any, int]], discard: bool = False) -> float | None:
        """Process (or discard) one batch; return its oldest dict's lag in ms, if processed."""
        with self.busy:
            return self._account_locked(batch, discard)

    def _account_locked(self, batch: list[tuple[Any, int]], discard: bool) -> float | None:
        c = self.counts
        expected, recorded, overflow = c.next_expected, c.recorded, c.overflow
        errors, shutdown = c.errors, c.shutdown
        process = self.consumer.process
        spend = budget().spend  # every slice of recording, the GIL goes back to training
        planned = self.planned_ns
        oldest_lag_ms: float | None = None
        for item, seq in batch:
            overflow += seq - expected  # the gap: items the full queue dropped, oldest first
            expected = seq + 1
            if discard or self.abandoned:
                shutdown += 1
            else:
                try:
                    process(item)
                    recorded += 1
                except BaseException:  # a value's SystemExit must not stop the worker
                    if sys.is_finalizing():
                        raise  # the interpreter is going away: so must this thread
                    errors += 1
                    warn_once("worker:process", "async_tee: processing a logged dict failed")
                # Late by: since it was logged, or since the wake the worker planned, if
                # later (a dict logged while the worker slept by design is not late).
                now, since = time.monotonic_ns(), max(item[-1], planned)
                lag_ms = (now - since) / 1e6 if now > since else 0.0
                self._note_lag(lag_ms)
                if oldest_lag_ms is None:
                    oldest_lag_ms = lag_ms
            self.counts = Counts(expected, recorded, overflow, errors, shutdown)
            spend()
        return oldest_lag_ms

    def _note_lag(self, lag_ms: float) -> None:
        self.lags_ms.append(lag_ms)
        if lag_ms > self.max_lag_ms:
            self.max_lag_ms = lag_ms

    def _report_loss(self) -> None:
        """Warn when overflow starts and when it stops: one pair per episode, not per drop."""
        overflow = self.counts.overflow
        if overflow > self._overflow_seen:
            if self._loss_started_at is None:
                self._loss_started_at = self._overflow_seen
                self.episodes.log(
                    "start",
                    "async_tee: the hand-off queue (%d dicts) overflowed: the oldest dicts "
                    "are being dropped and counted (async_tee.dropped{reason=overflow}); "
                    "training is not slowed",
                    self.queue.capacity,
                )
            self._overflow_seen = overflow
        elif self._loss_started_at is not None:
            self.episodes.log(
                "recovery",
                "async_tee: the hand-off queue has recovered: %d dicts were dropped while "
                "it overflowed (%d since start)",
                overflow - self._loss_started_at,
                overflow,
            )
            self._loss_started_at = None

    def _release_waiters(self, force: bool = False) -> None:
        done = self.counts.next_expected
        for entry in list(self._waiters):
            if force or entry[0] <= done:
                try:
                    entry[1]()
                except Exception:  # noqa: BLE001 - a waiter's loop may be closed
                    warn_once("worker:waiter", "async_tee: could not notify a flush waiter")
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)

    def _flush_target(self) -> int | None:
        """What a flush must wait for, or None when it must not wait (done or impossible)."""
        target = self.queue.enqueued()
        if self.counts.next_expected >= target:
            return None
        if threading.current_thread() is self._thread:
            # Called from code the worker runs (a log handler): it cannot wait for itself,
            # and re-entering the drain would corrupt the batch in progress.
            return None
        if not self._thread.is_alive():
            return None
        return target

    def _await_target(
        self, target: int, notify: Callable[[], object]
    ) -> tuple[int, Callable[[], object]]:
        entry = (target, notify)
        self._waiters.append(entry)
        self._wake_pending = False  # a flush must reach the loop even mid-burst
        self.wake()
        return entry

    def _forget(self, entry: tuple[int, Callable[[], object]]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(entry)

    def _flushed(self, target: int | None) -> bool:
        if target is None:  # nothing to wait for, or no way to wait: say which
            return self.pending() == 0
        return self.counts.next_expected >= target

    def flush(self, timeout_s: float) -> bool:
        """Wait until every item put before this call is processed. Never raises.

        Returns:
            True when all were processed within ``timeout_s``; False on timeout, when the
            worker is not running, or when called from the worker's own thread.
        """
        target = self._flush_target()
        if target is not None:
            event = threading.Event()
            entry = self._await_target(target, event.set)
            if not event.wait(max(0.0, timeout_s)):
                self._forget(entry)
        return self._flushed(target)

    async def aflush(self, timeout_s: float) -> bool:
        """``flush`` for a coroutine: awaits instead of blocking its event loop.

        Safe from any running loop but the worker's own. Never raises.
        """
        target = self._flush_target()
        if target is not None:
            loop = asyncio.get_running_loop()
            done: asyncio.Future[None] = loop.create_future()
            entry = self._await_target(target, lambda: loop.call_soon_threadsafe(_resolve, done))
            try:
                await asyncio.wait_for(done, max(0.0, timeout_s))
            except asyncio.TimeoutError:
                self._forget(entry)
        return self._flushed(target)

    def stop(self, timeout_s: float) -> bool:
        """Drain, stop the loop and join the thread, all within ``timeout_s``. Never raises.

        Safe to call twice and from the worker's own thread (which cannot wait for itself:
        it returns False at once, and the loop drains and ends after the current item).
        Whatever is still queued when the worker has ended is counted as dropped for
        ``shutdown``.

        Returns:
            Whether every item put before the call was processed.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        self._stopping = True
        if threading.current_thread() is self._thread:
            return False  # the loop drains and ends once the current item is done
        if self._thread.is_alive():
            self._wake_pending = False
            self.wake()
            self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            # Stuck past the deadline: what it has not recorded is booked as dropped for
            # shutdown now (stats), and it discards the rest, should it ever come back.
            self.abandoned = True
            return False
        clean = self.pending() == 0
        self._account(self.queue.pop_batch(self.queue.capacity), discard=True)
        return clean

    def pending(self) -> int:
        """Items put but not yet accounted for (queued, in flight, or dropped unseen)."""
        return self.queue.enqueued() - self.counts.next_expected

    def figures(self) -> dict[str, Any]:
        """The hand-off's part of ``stats()``: every call is recorded, dropped or pending.

        ``enqueued == recorded + dropped + pending`` always; a call whose snapshot failed
        on the caller's side was handed over and dropped (``snapshot``).
        """
        counts, queue = self.counts, self.queue
        snapshot_failures = queue.caller_errors
        enqueued = queue.enqueued() + snapshot_failures
        dropped_by_reason = {
            "overflow": counts.overflow,
            "error": counts.errors,
            "shutdown": counts.shutdown,
            "snapshot": snapshot_failures,
        }
        if self.abandoned:  # shut down with the worker stuck: nothing pending will be recorded
            dropped_by_reason["shutdown"] += (
                enqueued - counts.recorded - sum(dropped_by_reason.values())
            )
        dropped = sum(dropped_by_reason.values())
        return {
            "enqueued": enqueued,
            "recorded": counts.recorded,
            "dropped": dropped,
            "pending": enqueued - counts.recorded - dropped,
            "capacity": queue.capacity,
            "dropped_by_reason": dropped_by_reason,
            "worker_died": int(self.died),
        }

    def lag_figures(self) -> dict[str, float | int]:
        """``stats()["lag_ms"]``: the recent lags' p50 and p99 (nearest rank), the max ever."""
        lags = sorted(self.lags_ms)

        def pick(q: float) -> float:  # nearest rank, as the demo and benchmarks report
            return lags[max(0, math.ceil(q * len(lags)) - 1)] if lags else 0.0

        return {"p50": pick(0.5), "p99": pick(0.99), "max": self.max_lag_ms, "samples": len(lags)}

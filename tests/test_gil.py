"""The worker's share of the GIL: slices with hand-overs, one stats() a collection, fewer wakes.

What the training thread gains is measured in ``benchmarks/bench_stolen.py``; these tests
check the mechanism with the real worker, SDK and receiver: a drain of many dicts and a
collection of many series are cut into slices, each followed by a hand-over, and the
self-series callbacks of one collection share one ``stats()`` without reading a stale one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from helpers import load_calls

import async_tee
from async_tee._session.session import Pipeline
from async_tee._worker.gil import GilBudget, budget
from async_tee.vocabulary import efficiency_categories, set_efficiency_categories


def test_a_slice_ends_in_a_handover_once_it_has_run_its_length():
    gil = GilBudget(slice_s=0.002, handover_s=0.0)
    gil.start()
    gil.spend()
    assert gil.handovers == 0  # a fresh slice: no hand-over yet
    deadline = time.perf_counter() + 0.003
    while time.perf_counter() < deadline:
        pass
    gil.spend()
    assert gil.handovers == 1
    gil.spend()
    assert gil.handovers == 1  # the hand-over started a new slice


def test_each_thread_has_its_own_slice():
    gil = GilBudget(slice_s=0.002, handover_s=0.0)
    gil.start()
    deadline = time.perf_counter() + 0.003
    while time.perf_counter() < deadline:
        pass

    def begin_and_spend() -> None:
        gil.start()
        gil.spend()

    other = threading.Thread(target=begin_and_spend)
    other.start()
    other.join()
    assert gil.handovers == 0  # the other thread's slice had just begun
    gil.spend()
    assert gil.handovers == 1  # this one's had run out


def _tee_steps(steps: int) -> int:
    """Tee the fixture's teed step dicts ``steps`` times; how many dicts that was."""
    calls = [c for c in load_calls() if c["prefix"] in ("train", "")]
    for step in range(1, steps + 1):
        for call in calls:
            async_tee.tee_rl_metrics_to_otel(call["metrics"], call["prefix"], step)
    return steps * len(calls)


def test_a_large_drain_is_cut_into_slices_with_handovers(sink):
    # The worker sleeps while hundreds of dicts queue up, then records them in one drain: at
    # tens of µs a dict that is several ms of work, which must not be one hold of the GIL.
    async_tee.start_telemetry(
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.grpc_endpoint,
            "ASYNC_TEE_DRAIN_INTERVAL": "60",
            "ASYNC_TEE_STEP_EXPORT": "0",
        }
    )
    before = budget().handovers
    teed = _tee_steps(200)
    assert async_tee.flush(30)
    assert async_tee.stats()["recorded"] == teed
    assert budget().handovers - before >= 2
    assert async_tee.shutdown_telemetry(10)


@pytest.fixture
def stats_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every time a session counted its figures: True for ``stats()``, False for the series."""
    calls: list[bool] = []
    inside = threading.local()
    original_stats, original_counts = Pipeline.stats, Pipeline._counts

    def stats(self: Pipeline, lag_percentiles: bool = True) -> dict[str, Any]:
        calls.append(True)
        inside.stats = True
        try:
            return original_stats(self, lag_percentiles)
        finally:
            inside.stats = False

    def counts(self: Pipeline) -> dict[str, Any]:
        if not getattr(inside, "stats", False):  # the series' read, not stats()'s own
            calls.append(False)
        return original_counts(self)

    monkeypatch.setattr(Pipeline, "stats", stats)
    monkeypatch.setattr(Pipeline, "_counts", counts)
    return calls


def test_one_collection_reads_stats_once_and_the_next_reads_it_afresh(sink, stats_calls):
    session = async_tee.start_telemetry(
        environ={"OTEL_EXPORTER_OTLP_ENDPOINT": sink.grpc_endpoint, "ASYNC_TEE_STEP_EXPORT": "0"}
    )
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1)
    assert async_tee.flush(10)
    provider = session.meter_provider
    assert provider is not None
    stats_calls.clear()
    assert provider.force_flush(10_000)  # type: ignore[attr-defined]
    assert stats_calls == [False]  # a dozen self-series, one snapshot
    # Right after (well within the snapshot's lifetime), a new collection reads anew.
    async_tee.tee_rl_metrics_to_otel({"reward": 2.0}, "train", 1)
    assert async_tee.flush(10)
    assert provider.force_flush(10_000)  # type: ignore[attr-defined]
    enqueued = [p.value for p in sink.points() if p.name == "async_tee.enqueued"]
    assert enqueued[-2:] == [1, 2]
    assert async_tee.shutdown_telemetry(10)


def test_the_lag_histogram_gets_one_observation_a_batch_and_stats_every_dict(provider, reader):
    from helpers import collect

    async_tee.start_telemetry(provider, drain_interval_s=60)
    teed = _tee_steps(30)  # queued while the worker sleeps: one batch (< 256)
    assert async_tee.flush(10)
    lag = collect(reader, prefix="async_tee.lag")[("async_tee.lag", frozenset())]
    assert lag.count == 1
    assert async_tee.stats()["lag_ms"]["samples"] == teed


class CountingReader:
    """Stands in for the exporting reader beside the step clock: counts what it is asked."""

    def __init__(self) -> None:
        self.collections = 0
        self.replaced = 0

    def collect_step(self) -> bool:
        self.collections += 1
        return True


def test_the_clock_wakes_to_settle_a_step_only_when_it_could_be_exported():
    from async_tee._worker.steps import StepClock, StepPolicy

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
    from async_tee._worker.steps import StepClock

    clock = StepClock(lambda step, at: None)
    clock.before(1.0, time.monotonic_ns())
    clock.finished(1.0)
    assert clock.tick() is None


def test_one_dict_of_thousands_of_rows_or_categories_is_mapped_in_runs(monkeypatch, provider):
    """A single dict is a unit of the worker's work, but a 1,000-key one (or 300 efficiency
    categories) is milliseconds of it: the worker offers the GIL within it."""
    async_tee.register_teed_metrics(
        async_tee.TeedMetric(f"scale/k{i}", f"rl.scale.k{i}", prefix="train") for i in range(1000)
    )
    set_efficiency_categories(
        {
            **efficiency_categories(),
            **{f"idle/extra_{i}": "wall_clock" for i in range(300)},
        }
    )
    offers: list[str] = []
    original = GilBudget.spend

    def spend(self: GilBudget) -> None:
        offers.append(threading.current_thread().name)
        original(self)

    async_tee.start_telemetry(provider)
    assert async_tee.flush(10)
    monkeypatch.setattr(GilBudget, "spend", spend)
    train = {f"scale/k{i}": float(i) for i in range(1000)}
    async_tee.tee_rl_metrics_to_otel(train, "train", 1)
    assert async_tee.flush(10)
    rows = len(offers)
    assert rows >= 1000 // 256
    categories = {f"efficiency/idle/extra_{i}_s": 1.0 for i in range(300)}
    async_tee.tee_rl_metrics_to_otel(categories, "", 1)
    assert async_tee.flush(10)
    assert len(offers) - rows >= 300 // 64
    assert threading.main_thread().name not in offers  # the worker's, not the caller's
    assert async_tee.stats()["recorded"] == 2
    assert async_tee.shutdown_telemetry(10)

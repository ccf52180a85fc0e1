"""The worker's share of the GIL: a drain of many dicts, or one dict of many rows, is cut into
slices, each followed by a hand-over (what training gains: ``benchmarks/bench_stolen.py``)."""

from __future__ import annotations

import threading
import time

from helpers import tee_fixture_steps

import async_tee
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


def test_a_large_drain_is_cut_into_slices_with_handovers(sink):
    # The worker sleeps while hundreds of dicts queue up, then records them in one drain: at
    # tens of µs a dict that is several ms of work, which must not be one hold of the GIL.
    async_tee.start_telemetry(
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint,
            "ASYNC_TEE_DRAIN_INTERVAL": "60",
            "ASYNC_TEE_STEP_EXPORT": "0",
        }
    )
    before = budget().handovers
    teed = tee_fixture_steps(200)
    assert async_tee.flush(30)
    assert async_tee.stats()["recorded"] == teed
    assert budget().handovers - before >= 2
    assert async_tee.shutdown_telemetry(10)


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

"""One session owns its state: it starts with the session and dies with it."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np
import pytest
from helpers import collect, running
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import async_tee

TOKENS: tuple[str, frozenset[tuple[str, str]]] = ("rl.vllm.prompt_tokens", frozenset())


def _session_total(step: object, copies: int = 1) -> float:
    """Start a session on a new provider, tee the counter ``copies`` times, return its total."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    try:
        async_tee.start_telemetry(provider)
        for _ in range(copies):
            async_tee.tee_rl_metrics_to_otel({"vllm/prompt_tokens": 5.0}, "train", step)
        assert async_tee.flush(5)
        total: float = collect(reader).get(TOKENS, 0.0)
        assert async_tee.shutdown_telemetry(5)
        return total
    finally:
        provider.shutdown()


def test_counter_memory_dies_with_the_session():
    # The step the first session last counted must not silence the second's first delta.
    assert _session_total(step=7, copies=2) == 5.0
    assert _session_total(step=7) == 5.0


def test_interleaved_steps_count_each_steps_delta_once(provider, reader):
    async_tee.start_telemetry(provider)
    for step in (5, 4, 5, 4, 5):
        async_tee.tee_rl_metrics_to_otel({"vllm/prompt_tokens": 100.0}, "train", step)
    assert async_tee.flush(5)
    assert collect(reader)[TOKENS] == 200.0


@pytest.mark.parametrize(
    "step", [np.array([0, 1]), [1, 2], {"s": 1}], ids=["ndarray", "list", "dict"]
)
def test_an_unhashable_step_is_no_step_and_breaks_nothing(provider, reader, step):
    async_tee.start_telemetry(provider)
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0, "vllm/prompt_tokens": 10.0}, "train", step)
    async_tee.tee_rl_metrics_to_otel({"reward": 2.0, "vllm/prompt_tokens": 10.0}, "train", step)
    for good in range(3):
        async_tee.tee_rl_metrics_to_otel({"reward": 3.0, "vllm/prompt_tokens": 1.0}, "train", good)
    assert async_tee.flush(5)
    points = collect(reader)
    # Both unusable-step deltas counted, then one per step; an export shows the last step
    # completed (1), so step 2's delta waits for its step to complete.
    assert points[TOKENS] == 22.0
    assert points[("rl.reward.mean", frozenset())] == 3.0


def _nan_session_stats() -> dict[str, Any]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    try:
        async_tee.start_telemetry(provider)
        async_tee.tee_rl_metrics_to_otel({"reward": math.nan}, "train", 1)
        assert async_tee.flush(5)
        assert async_tee.shutdown_telemetry(5)
        return async_tee.stats()
    finally:
        provider.shutdown()


def test_stats_are_the_sessions_own():
    first, second = _nan_session_stats(), _nan_session_stats()
    for stats in (first, second):
        assert stats["enqueued"] == 1
        assert stats["values_skipped"]["non_finite"] == 1  # not 2 in the second session
        counted = {name: n for name, n in stats["non_finite_by_series"].items() if n}
        assert counted == {"rl.reward.mean": 1}  # the others are at 0 from the start
        assert stats["exporting"] is False


def test_threads_are_the_sessions_and_end_with_it(sink):
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint,
        "OTEL_METRIC_EXPORT_INTERVAL": "60000",
    }
    pipeline = async_tee.start_telemetry(environ=environ)
    threads = pipeline.threads
    names = {thread.name for thread in threads}
    assert "async-tee-worker" in names
    assert len(threads) >= 2, names  # the worker and the SDK's exporting reader
    assert all(thread.is_alive() for thread in threads)
    assert not set(threads) - set(threading.enumerate())
    assert async_tee.shutdown_telemetry(5)
    for thread in threads:
        thread.join(5)
    assert not [thread.name for thread in threads if thread.is_alive()]


def test_a_disabled_session_reports_zeros_not_the_last_sessions(provider):
    async_tee.start_telemetry(provider)
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1)
    assert async_tee.flush(5)
    assert async_tee.shutdown_telemetry(5)
    assert async_tee.stats()["recorded"] == 1  # after shutdown: the last session's
    pipeline = async_tee.start_telemetry(environ={"ASYNC_TEE_ENABLED": "0"})
    assert pipeline.threads == []
    assert async_tee.stats()["recorded"] == 0


@pytest.mark.parametrize("enqueue", ["tee", "record"])
def test_both_enqueue_paths_wake_the_worker_at_high_water(provider, enqueue):
    from async_tee.vocabulary import RecordedMetric, register_recorded_metrics

    register_recorded_metrics([RecordedMetric("rl.host.memory", unit="By")])
    # The worker's own timer would not fire for 30 s: only the high-water wake drains it.
    pipeline = running(async_tee.start_telemetry(provider, queue_size=8, drain_interval_s=30.0))
    async_tee.tee_rl_metrics_to_otel({"reward": -1.0}, "train", -1)
    assert async_tee.flush(5)  # the worker has drained once and sleeps on its 30 s timer
    for step in range(6):  # the sixth put reaches three quarters of 8
        if enqueue == "tee":
            async_tee.tee_rl_metrics_to_otel({"reward": float(step)}, "train", step)
        else:
            async_tee.record_rl_metrics({"host_memory": float(step)})
    deadline = time.monotonic() + 10
    while async_tee.stats()["recorded"] < 7 and time.monotonic() < deadline:
        time.sleep(0.001)  # polling what the woken worker does; flush would wake it too
    assert async_tee.stats()["recorded"] == 7
    assert pipeline.worker is not None
    assert pipeline.worker.wakes >= 2


def test_a_session_shut_down_by_itself_is_never_handed_out_again(provider):
    p = async_tee.start_telemetry(provider)
    assert isinstance(p, async_tee.Pipeline)
    assert p.shutdown(2)
    assert not p.is_exporting
    assert async_tee.flush(1)  # no running session: nothing to wait for
    q = async_tee.start_telemetry(provider)
    assert q is not p
    assert isinstance(q, async_tee.Pipeline)
    assert q.is_exporting
    assert q.worker.thread.is_alive()
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1)
    assert async_tee.flush(5)
    assert async_tee.stats()["recorded"] == 1  # the new session's own count
    assert async_tee.shutdown_telemetry(5)
    assert p.shutdown(2)  # a second shutdown has nothing left to do


def test_no_session_reads_zeros_from_a_constant():
    from async_tee._session.lifecycle import NO_SESSION, end_and_forget

    end_and_forget(1)
    stats = async_tee.stats()
    assert stats == NO_SESSION.stats()
    assert stats["enqueued"] == stats["recorded"] == stats["dropped"] == 0
    assert stats["exporting"] is False


def test_a_disabled_session_has_the_reading_side_and_the_same_figures():
    session = async_tee.start_telemetry(environ={"ASYNC_TEE_ENABLED": "0"})
    assert not isinstance(session, async_tee.Pipeline)
    assert not session.is_exporting
    assert session.threads == []
    assert session.flush(1)
    assert session.shutdown(1)
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1)  # a no-op
    assert async_tee.stats()["enqueued"] == 0


def test_every_recorded_series_has_a_non_finite_count_from_the_first_export():
    """A Prometheus ``increase(...) > 0`` rule fires on the first NaN only if the counter
    existed before it: every recording series is exported at 0 from the first export."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    try:
        async_tee.start_telemetry(provider)
        first: Any = reader.get_metrics_data()
        async_tee.shutdown_telemetry(5)
    finally:
        provider.shutdown()
    points = {
        point.attributes["series"]: point.value
        for rm in first.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == "async_tee.non_finite"
        for point in metric.data.data_points
    }
    declared = {
        row.name
        for row in async_tee.vocabulary.teed_metrics()
        if row.kind in ("gauge", "counter", "histogram", "up_down_counter")
    }
    assert declared <= set(points)  # before any tee call
    assert set(points.values()) == {0}

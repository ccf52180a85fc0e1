"""``stats()`` assembled per session, and the snapshot one collection's self-series share."""

from __future__ import annotations

from typing import Any

from helpers import tee_fixture_steps

import async_tee
from async_tee._session import stats as session_stats


class Collections:
    """Stands in for the exports' collection count and the figures the snapshot takes."""

    def __init__(self) -> None:
        self.started = 0
        self.taken = 0

    def take(self) -> dict[str, Any]:
        self.taken += 1
        return {"taken": self.taken}


def test_one_collection_shares_one_snapshot_and_the_next_takes_its_own(monkeypatch):
    monkeypatch.setattr(session_stats, "SNAPSHOT_TTL_S", 3600.0)
    source = Collections()
    snapshot = session_stats.CollectionSnapshot(source.take, lambda: source.started)
    assert [snapshot()["taken"] for _ in range(12)] == [1] * 12  # a dozen callbacks, one read
    source.started += 1  # async_tee's reader starts its next collection
    assert snapshot()["taken"] == 2
    snapshot.forget()  # a forked child
    assert snapshot()["taken"] == 3


def test_a_collection_async_tee_did_not_start_reads_afresh_after_the_ttl(monkeypatch):
    monkeypatch.setattr(session_stats, "SNAPSHOT_TTL_S", 0.0)  # a scrape seconds later
    source = Collections()
    snapshot = session_stats.CollectionSnapshot(source.take, lambda: 0)
    assert [snapshot()["taken"] for _ in range(3)] == [1, 2, 3]


def test_each_collection_exports_the_figures_at_its_start(sink):
    session = async_tee.start_telemetry(
        environ={"OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint, "ASYNC_TEE_STEP_EXPORT": "0"}
    )
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1)
    assert async_tee.flush(10)
    assert session.flush_and_export(10)
    # Right after (well within the snapshot's lifetime), a new collection reads anew.
    async_tee.tee_rl_metrics_to_otel({"reward": 2.0}, "train", 1)
    assert session.flush_and_export(10)
    enqueued = [p.value for p in sink.points() if p.name == "async_tee.enqueued"]
    assert enqueued[-2:] == [1, 2]
    assert async_tee.shutdown_telemetry(10)


def test_the_lag_histogram_gets_one_observation_a_batch_and_stats_every_dict(provider, reader):
    from helpers import collect

    async_tee.start_telemetry(provider, drain_interval_s=60)
    teed = tee_fixture_steps(30)  # queued while the worker sleeps: one batch (< 256)
    assert async_tee.flush(10)
    lag = collect(reader, prefix="async_tee.lag")[("async_tee.lag", frozenset())]
    assert lag.count == 1
    assert async_tee.stats()["lag_ms"]["samples"] == teed

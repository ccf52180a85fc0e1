"""Step-aligned export: every logged step reaches a real OTLP receiver as its own point.

Real parts throughout: the SDK, async_tee's exporting reader and the OTLP exporters,
talking over loopback to the suite's OTLP receiver. Steps are paced in real time because
the step clock and the minimum export interval are about time; no test sleeps to wait
for the worker (shutdown drains it).
"""

from __future__ import annotations

import itertools
import threading
import time
import tracemalloc
from typing import Any

import pytest
from helpers import own_threads, running

import async_tee
from async_tee.sink import OtlpSink, black_hole

pytestmark = pytest.mark.slow

REWARD = "rl.reward.mean"


def _environ(sink: OtlpSink, **extra: str) -> dict[str, str]:
    """Only the endpoint, as a user would set it (so the 60 s periodic interval), plus extra."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint, **extra}


def _reward(step: int) -> float:
    return 100.0 + step * 1.5


def _log_step(logger: async_tee.Logger, step: int, finished: bool) -> None:
    """One step the way the Logger logs it: train dicts, then the finishing timing dict."""
    logger.log_metrics({"reward": _reward(step), "loss": 1.0 / (step + 1)}, step, "train")
    logger.log_metrics({"total_step_time": 1.0}, step, "timing/train", step_finished=finished)


def _run_steps(count: int, step_s: float, finished: bool = True) -> None:
    logger = async_tee.Logger()
    started = time.monotonic()
    for step in range(count):
        _log_step(logger, step, finished)
        time.sleep(max(0.0, started + (step + 1) * step_s - time.monotonic()))  # the pace


def _session_threads() -> list[str]:
    """async_tee's threads but the receiver's (its gRPC server adds one per stalled call)."""
    return sorted(name for name in own_threads() if not name.startswith("async-tee-sink"))


def _distinct(rows: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Rows with consecutive repeats removed (the shutdown export repeats the last step)."""
    out: list[tuple[Any, Any]] = []
    for row in rows:
        if not out or out[-1] != row:
            out.append(row)
    return out


@pytest.mark.parametrize(
    ("step_s", "extra", "finished"),
    [
        (1.2, {}, True),  # the defaults: 60 s periodic, 1 s minimum
        (1.2, {}, False),  # a caller that never says a step finished (the seed's Logger)
        (0.1, {"ASYNC_TEE_MIN_EXPORT_INTERVAL": "0.05"}, True),
    ],
    ids=["default-1.2s", "no-step-finished-1.2s", "min-0.05-0.1s"],
)
def test_every_step_reaches_the_receiver_as_its_own_point(sink, step_s, extra, finished):
    steps = 4 if step_s > 1 else 10
    async_tee.start_telemetry(environ=_environ(sink, **extra))
    _run_steps(steps, step_s, finished)
    assert async_tee.shutdown_telemetry(10)
    rows = sink.by_step(REWARD)
    stats = async_tee.stats()
    assert stats["steps"]["completed"] == steps
    coalesced = stats["steps"]["coalesced"]
    # 1.2 s steps: none folded. 0.1 s steps on a loaded box: a step that completes while the
    # last step's export is still being sent folds into the next one, counted; most do not.
    assert coalesced == 0 if step_s > 1 else coalesced <= steps // 2
    # Every step, in order, exported with its own step number and value, but those counted.
    every = [(step, _reward(step)) for step in range(steps)]
    exported = _distinct(rows)
    assert [row for row in every if row in exported] == exported
    assert len(every) - len(exported) == coalesced, (exported, stats["steps"])
    assert len(rows) <= steps + 1  # one point per step, and the final export's repeat
    by_trigger = stats["exports_by_trigger"]
    # Every step but the last had an export of its own; the last one too when it was
    # finished and settled before shutdown (else the final export carries it).
    own = steps - coalesced
    assert by_trigger["step"]["success"] in ((own - 1, own) if finished else (own - 1,))
    assert by_trigger["step"]["failure"] == 0
    assert by_trigger["interval"]["success"] == 0  # the 60 s period never came
    assert by_trigger["shutdown"] == {"success": 1, "failure": 0}
    times = sink.by_step("rl.step.time")
    assert [step for step, _ in _distinct(times)] == [step for step, _ in exported]
    assert all(stamp <= time.time() for _, stamp in times)


def test_fast_steps_are_coalesced_and_counted_and_the_rate_is_bounded(sink):
    min_interval = 0.5
    async_tee.start_telemetry(environ=_environ(sink, ASYNC_TEE_MIN_EXPORT_INTERVAL="0.5"))
    started = time.monotonic()
    steps = 120
    _run_steps(steps, 0.02)
    elapsed = time.monotonic() - started
    assert async_tee.shutdown_telemetry(10)
    stats = async_tee.stats()
    step_exports = stats["exports_by_trigger"]["step"]["success"]
    assert 1 <= step_exports <= elapsed / min_interval + 1
    assert stats["steps"]["completed"] == steps
    assert stats["steps"]["coalesced"] + stats["steps"]["exported"] == steps
    assert stats["steps"]["coalesced"] >= steps - step_exports - 1
    rows = sink.by_step(REWARD)
    # Step exports are spaced by the minimum interval on the trainer's timeline; their
    # collection times (when the worker got to them) are never bunched far below it.
    stamps = sorted({p.time_unix_nano for p in sink.points() if p.name == REWARD})
    gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(stamps)]
    assert all(gap >= min_interval / 2 for gap in gaps[:-1]), gaps  # the last: shutdown
    # Each exported point is a step's own value, and the last step always arrives.
    assert all(value == _reward(step) for step, value in rows)
    assert rows[-1] == (steps - 1, _reward(steps - 1))


@pytest.mark.parametrize("collector", ["stalled", "black_hole"])
def test_a_stuck_collector_costs_a_bounded_backlog_and_shutdown_keeps_its_deadline(sink, collector):
    hole, port = black_hole()
    try:
        _stuck_collector(sink, collector, port)
    finally:
        sink.unstall()
        hole.close()
        for thread in threading.enumerate():  # the export in flight ends by its own timeout
            if thread.name in ("async-tee-export", "async-tee-shutdown"):
                thread.join(10)


_BACKLOG_BYTES = 2**20


def _stuck_collector(sink: OtlpSink, collector: str, port: int) -> None:
    timeout_s = 4.0
    endpoint = sink.http_endpoint if collector == "stalled" else f"http://127.0.0.1:{port}"
    async_tee.start_telemetry(
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "ASYNC_TEE_MIN_EXPORT_INTERVAL": "0",  # every step tries to export
            "OTEL_EXPORTER_OTLP_TIMEOUT": str(timeout_s),
            "ASYNC_TEE_EXPORT_BACKLOG_BYTES": str(_BACKLOG_BYTES),
        }
    )
    logger = async_tee.Logger()
    if collector == "stalled":
        _log_step(logger, 0, True)
        assert sink.wait_for(lambda s: sum(s.requests.values()) >= 1, 10)
        sink.stall()  # every export from here hangs
    threads = _session_threads()
    started = time.monotonic()
    tracemalloc.start()
    try:
        for step in range(1, 1001):
            _log_step(logger, step, True)
            if step == 100:
                assert async_tee.flush(10)
                base = tracemalloc.get_traced_memory()[0]
            if step % 100 == 0:
                assert async_tee.flush(10)
                assert _session_threads() == threads  # no thread per export
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    elapsed = time.monotonic() - started
    assert grown < _BACKLOG_BYTES + 2**20, grown  # the backlog's bound, and little else
    stats = async_tee.stats()
    assert stats["dropped"] == 0
    assert stats["steps"]["completed"] >= 999
    assert stats["steps"]["coalesced"] == 0  # each step its own request: none folded
    delivery = stats["delivery"]
    assert delivery["queued_bytes"] <= _BACKLOG_BYTES + 64 * 2**10  # the one in flight over
    assert delivery["dropped"]["overflow"] > 0  # the oldest went, counted
    assert delivery["queued"] + delivery["dropped"]["overflow"] >= 999
    # One send at a time, each ending by the exporter's timeout: no send per step.
    attempts = sum(stats["exports_by_trigger"]["step"].values())
    assert attempts <= 2 + elapsed / timeout_s, (attempts, elapsed)
    started = time.monotonic()
    delivered = async_tee.shutdown_telemetry(1.0)
    assert time.monotonic() - started < 1.0 + 2.0  # the deadline, plus a noisy machine
    assert delivered is False  # the last steps never left the process: said so


def test_steps_one_interval_apart_do_not_race_the_periodic_export(sink):
    # Steps as far apart as OTEL_METRIC_EXPORT_INTERVAL: each step export restarts the
    # period, and a step that comes a little late must not find the timer fired first.
    steps = 8
    async_tee.start_telemetry(
        environ=_environ(
            sink, OTEL_METRIC_EXPORT_INTERVAL="300", ASYNC_TEE_MIN_EXPORT_INTERVAL="0.05"
        )
    )
    _run_steps(steps, 0.3)
    assert async_tee.shutdown_telemetry(10)
    by_trigger = async_tee.stats()["exports_by_trigger"]
    assert by_trigger["step"]["success"] >= steps - 1
    assert by_trigger["interval"]["success"] <= 1, by_trigger


def test_the_period_waits_a_grace_after_a_step_export_only(sink):
    from async_tee._worker.steps import BACKSTOP_GRACE

    pipeline = running(
        async_tee.start_telemetry(environ=_environ(sink, OTEL_METRIC_EXPORT_INTERVAL="60000"))
    )
    sender = pipeline.exports.sender
    assert sender is not None
    assert pipeline.flush_and_export(10)  # an export that is not a step's
    assert sender.period_due() == pytest.approx(sender._last_made + 60.0)
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1, step_finished=True)
    assert async_tee.flush(10)  # the step completes: its export is made
    assert async_tee.stats()["steps"]["exported"] == 1
    grace = 60.0 * (1 + BACKSTOP_GRACE)
    assert sender.period_due() == pytest.approx(sender._last_made + grace)
    assert async_tee.shutdown_telemetry(10)


def test_step_export_off_leaves_the_periodic_export(sink):
    async_tee.start_telemetry(environ=_environ(sink, ASYNC_TEE_STEP_EXPORT="0"))
    _run_steps(3, 0.05)
    assert async_tee.shutdown_telemetry(10)
    stats = async_tee.stats()
    assert stats["exports_by_trigger"]["step"] == {"success": 0, "failure": 0}
    assert stats["exports_by_trigger"]["shutdown"]["success"] == 1
    assert stats["steps"]["completed"] == 3  # rl.step is still kept
    assert sink.by_step(REWARD) == [(2, _reward(2))]


def test_a_provider_passed_in_is_not_driven(provider, reader):
    async_tee.start_telemetry(provider)
    _run_steps(3, 0.0, finished=False)
    assert async_tee.flush(10)
    stats = async_tee.stats()
    assert stats["steps"]["completed"] == 2  # step 2 stays open until a later one
    assert stats["steps"]["exported"] == 0
    assert sum(stats["exports"].values()) == 0


def test_a_step_waiting_for_the_interval_is_exported_when_it_allows(sink):
    async_tee.start_telemetry(environ=_environ(sink, ASYNC_TEE_MIN_EXPORT_INTERVAL="1.0"))
    logger = async_tee.Logger()
    _log_step(logger, 0, True)
    assert sink.wait_for(lambda s: s.by_step(REWARD) == [(0, _reward(0))], 10)
    _log_step(logger, 1, True)  # finished well within the interval: it waits, clean
    # No later dict comes: the worker wakes when the interval allows and exports step 1.
    assert sink.wait_for(lambda s: (1, _reward(1)) in s.by_step(REWARD), 10)
    assert async_tee.shutdown_telemetry(10)
    stats = async_tee.stats()
    assert stats["exports_by_trigger"]["step"]["success"] == 2
    assert stats["steps"]["coalesced"] == 0


def test_older_and_late_dicts_are_recorded_but_start_no_export(sink):
    async_tee.start_telemetry(environ=_environ(sink, ASYNC_TEE_MIN_EXPORT_INTERVAL="0"))
    tee = async_tee.tee_rl_metrics_to_otel
    tee({"reward": 1.0}, "train", 5)
    tee({"reward": 2.0}, "train", 6)  # completes 5
    tee({"reward": 3.0}, "train", 4)  # an older step: recorded, completes nothing
    tee({"reward": 4.0}, "train", 6)  # the open step again
    assert async_tee.shutdown_telemetry(10)  # completes 6
    stats = async_tee.stats()
    assert stats["steps"]["completed"] == 2
    assert stats["steps"]["last"] == 6
    assert stats["exports_by_trigger"]["step"]["success"] == 1
    assert _distinct(sink.by_step(REWARD)) == [(5, 1.0), (6, 4.0)]


def test_a_step_that_cannot_be_compared_is_no_step(sink):
    np = pytest.importorskip("numpy")
    async_tee.start_telemetry(environ=_environ(sink, ASYNC_TEE_MIN_EXPORT_INTERVAL="0"))
    tee = async_tee.tee_rl_metrics_to_otel
    tee({"reward": 1.0}, "train", 1)
    tee({"reward": 9.0}, "train", np.array([2, 3]))  # recorded; no step
    tee({"reward": 2.0}, "train", 2)
    assert async_tee.shutdown_telemetry(10)
    stats = async_tee.stats()
    assert stats["steps"]["unusable"] == 1
    assert stats["steps"]["completed"] == 2
    assert _distinct(sink.by_step(REWARD)) == [(1, 9.0), (2, 2.0)]


def test_failed_step_exports_are_counted_and_not_called_delivered(sink):
    async_tee.start_telemetry(
        environ=_environ(sink, ASYNC_TEE_MIN_EXPORT_INTERVAL="0", OTEL_EXPORTER_OTLP_TIMEOUT="1")
    )
    sink.fail(503)  # over gRPC: UNAVAILABLE, retried within the 1 s timeout, then failed
    logger = async_tee.Logger()
    _log_step(logger, 0, True)
    _log_step(logger, 1, True)
    assert async_tee.flush(10)
    delivered = async_tee.shutdown_telemetry(3)
    stats = async_tee.stats()
    assert delivered is False
    assert stats["exports"]["success"] == 0
    assert sink.by_step(REWARD) == []


def test_flush_and_export_waits_for_its_export_to_be_delivered(sink):
    session = running(async_tee.start_telemetry(environ=_environ(sink, ASYNC_TEE_STEP_EXPORT="0")))
    async_tee.tee_rl_metrics_to_otel({"reward": 7.0}, "train", 1)
    assert session.flush_and_export(10)
    assert sink.by_step(REWARD) == [(None, 7.0)]  # step 1 is still open: no rl.step yet
    assert async_tee.stats()["exports_by_trigger"]["flush"] == {"success": 1, "failure": 0}
    assert async_tee.shutdown_telemetry(10)

"""The first hop's delivery, on a real session and a real receiver over 127.0.0.1.

A receiver that is away, refuses, or asks for quiet: each step keeps its own request at its own
time, in order, and is delivered when the receiver answers; what is lost is exactly what is
counted (overflow past the bound, a permanent refusal, the shutdown's deadline).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import async_tee
from async_tee.sink import OtlpSink

_BASE = {
    "ASYNC_TEE_MIN_EXPORT_INTERVAL": "0",
    "ASYNC_TEE_FLUSH_SIGNALS": "",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
}


def _environ(protocol: str, port: int, **extra: str) -> dict[str, str]:
    scheme_port = f"http://127.0.0.1:{port}"
    return {
        **_BASE,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_ENDPOINT": scheme_port,
        **extra,
    }


def _step(step: int) -> None:
    """One step's dict, recorded; its request made (the worker collects at completion)."""
    async_tee.tee_rl_metrics_to_otel({"reward": float(step)}, "train", step, True)
    assert async_tee.flush(5)


def _steps_received(sink: OtlpSink) -> list[tuple[float, int]]:
    """Every ``rl.step`` point the receiver holds: (step, time), in arrival order."""
    return [(float(p.value or 0), p.time_unix_nano) for p in sink.points() if p.name == "rl.step"]


def _delivery() -> dict[str, Any]:
    figures: dict[str, Any] = async_tee.stats()["delivery"]
    return figures


def _wait_delivered(session: Any, timeout_s: float = 20.0) -> None:
    """A flush export queued behind every earlier request: delivered means all were."""
    assert session.flush_and_export(timeout_s)


@pytest.fixture(params=["http/protobuf", "grpc"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _port(sink: OtlpSink, protocol: str) -> int:
    return sink.grpc_port if protocol == "grpc" else sink.http_port


def test_steps_logged_while_the_receiver_is_down_arrive_in_order_at_their_own_times(protocol):
    """The receiver goes away (closed) and comes back on the same port: nothing is lost."""
    first = OtlpSink().start()
    port = _port(first, protocol)
    session = async_tee.start_telemetry(environ=_environ(protocol, port))
    for step in range(1, 4):
        _step(step)
    _wait_delivered(session)
    first.close()
    for step in range(4, 12):  # logged while nobody listens
        _step(step)
    assert async_tee.stats()["steps"]["coalesced"] == 0  # not folded: queued
    assert _delivery()["queued"] >= 1
    back = OtlpSink(grpc_port=port) if protocol == "grpc" else OtlpSink(http_port=port)
    with back as second:
        _wait_delivered(session)
        received = _steps_received(second)
        delivery = _delivery()
        assert async_tee.shutdown_telemetry(5)
    steps = [step for step, _ in received]
    assert steps[: steps.index(11.0) + 1] == [float(s) for s in range(4, 12)]
    times = [t for _, t in received]
    assert times == sorted(times)
    assert len(set(times[:8])) == 8  # each step its own time
    assert delivery["retries"] >= 1
    assert delivery["dropped"] == {"overflow": 0, "refused": 0, "shutdown": 0}
    assert delivery["queued"] == 0


def test_a_refused_request_is_dropped_once_counted_and_the_next_is_delivered(
    sink, protocol, caplog
):
    session = async_tee.start_telemetry(environ=_environ(protocol, _port(sink, protocol)))
    _step(1)
    _wait_delivered(session)
    sink.fail(400)
    _step(2)
    assert session.flush_and_export(5) is False  # the flush's own request is refused too
    sink.fail(None)
    _step(3)
    _wait_delivered(session)
    steps = [step for step, _ in _steps_received(sink)]
    assert 2.0 not in steps
    assert 3.0 in steps
    delivery = _delivery()
    reason = "http_400" if protocol == "http/protobuf" else "invalid_argument"
    assert delivery["dropped"]["refused"] == 2  # step 2's request and the flush's
    assert delivery["refused_by_reason"] == {reason: 2}
    refusals = [
        r.getMessage() for r in caplog.records if "refused an export for good" in r.getMessage()
    ]
    assert len(refusals) == 1  # said once
    assert "malformed" in refusals[0]
    latest = sink.latest()
    assert latest[("async_tee.export.dropped", frozenset({("reason", "refused")}))].value == 2
    assert async_tee.shutdown_telemetry(5) is False  # two requests never arrived


def test_past_the_bound_exactly_the_oldest_requests_go_counted(sink):
    session = async_tee.start_telemetry(environ=_environ("http/protobuf", sink.http_port))
    _step(1)
    _wait_delivered(session)
    size = max(s for _, s, _ in sink.request_sizes())
    async_tee.shutdown_telemetry(5)
    environ = _environ(
        "http/protobuf", sink.http_port, ASYNC_TEE_EXPORT_BACKLOG_BYTES=str(int(size * 3.5))
    )
    sink.clear()
    sink.fail(503)
    session = async_tee.start_telemetry(environ=environ)
    for step in range(1, 11):
        _step(step)
    delivery = _delivery()
    assert delivery["queued"] <= 4
    assert delivery["queued_bytes"] <= size * 3.5 + size  # the one in flight may be over
    assert delivery["dropped"]["overflow"] >= 6
    sink.fail(None)
    _wait_delivered(session)  # its flush request may push one more out
    dropped = _delivery()["dropped"]["overflow"]
    steps = sorted({step for step, _ in _steps_received(sink)})
    # The newest only, and the request in flight when the drops began (never dropped: it is
    # being sent), which on a loaded box can be an older one, sent once the receiver answers.
    in_flight = steps[:1] if len(steps) > 1 and steps[1] != steps[0] + 1 else []
    newest = steps[len(in_flight) :]
    assert newest == [float(s) for s in range(11 - len(newest), 11)]
    assert len(steps) + dropped == 10
    _wait_delivered(session)  # a request built after the last drop: its count, exported
    latest = sink.latest()
    assert (
        latest[("async_tee.export.dropped", frozenset({("reason", "overflow")}))].value == dropped
    )
    assert async_tee.shutdown_telemetry(5) is False


def test_retry_after_holds_every_request_until_it_ends_nothing_folded(sink, caplog):
    async_tee.start_telemetry(environ=_environ("http/protobuf", sink.http_port))
    sink.fail(429, retry_after="120")
    for step in range(1, 6):
        _step(step)
    assert sink.wait_for(lambda s: s.requests["http"] >= 1, 10)
    assert sink.requests["http"] == 1  # the receiver asked for 120 s of quiet: it got it
    assert async_tee.stats()["steps"]["coalesced"] == 0
    assert _delivery()["queued"] == 5
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="async_tee"):
        assert async_tee.shutdown_telemetry(1.0) is False
    assert time.monotonic() - started < 2.0
    left = [
        r.getMessage() for r in caplog.records if "not delivered by the shutdown" in r.getMessage()
    ]
    assert len(left) == 1
    assert left[0].startswith("async_tee: 6 export requests")  # five steps and the final one
    assert _delivery()["dropped"]["shutdown"] == 6


def test_a_silent_receiver_costs_shutdown_its_deadline_only(protocol):
    from async_tee.sink import black_hole

    hole, port = black_hole()
    with hole:
        environ = _environ(protocol, port, OTEL_EXPORTER_OTLP_TIMEOUT="30")
        async_tee.start_telemetry(environ=environ)
        for step in range(1, 4):
            _step(step)
        started = time.monotonic()
        assert async_tee.shutdown_telemetry(1.0) is False
        assert time.monotonic() - started < 2.0
    assert _delivery()["dropped"]["shutdown"] >= 3

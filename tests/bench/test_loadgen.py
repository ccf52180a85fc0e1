"""The load generator: its ranks send what real sessions with their resources send, every step.

A real ``OtlpSink`` receives the generator's requests (``benchmarks/_loadgen.py``); a real
session with one simulated rank's environment tees the same steps to another sink; the two
are compared point by point. The generator's answers are counted as async_tee counts them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import _loadgen as loadgen
import pytest

import async_tee
from async_tee.sink import OtlpSink, ReceivedPoint

RANKS, STEPS, PER_NODE, RUN = 12, 3, 4, "job-loadgen"
STEP_S = 0.3


@pytest.fixture(scope="module")
def requests() -> loadgen.Requests:
    """Every rank's request of every step (built by a session that is shut down again)."""
    built = loadgen.Requests.build(RANKS, STEPS, PER_NODE, RUN)
    async_tee.testing.reset()  # the module fixture runs outside the per-test reset
    return built


def _config(sink: OtlpSink, **overrides: Any) -> loadgen.LoadConfig:
    fields: dict[str, Any] = {
        "endpoints": (sink.http_endpoint,),
        "ranks": RANKS,
        "step_s": STEP_S,
        "steps": STEPS,
        "ranks_per_node": PER_NODE,
        "run_id": RUN,
        "connections": 3,
        "drain_s": 15.0,
        **overrides,
    }
    return loadgen.LoadConfig(**fields)


def _requests_of(points: list[ReceivedPoint]) -> Iterator[list[ReceivedPoint]]:
    """The points grouped by request (one sender, one time), in arrival order."""
    groups: dict[tuple[Any, int], list[ReceivedPoint]] = {}
    for point in points:
        groups.setdefault((point.sender, point.time_unix_nano), []).append(point)
    return iter(groups.values())


def _step_of(request: list[ReceivedPoint]) -> int:
    (step,) = {p.value for p in request if p.name == "rl.step"}
    assert step is not None
    return int(step)


def _has_step(step: int) -> Callable[[OtlpSink], bool]:
    """Whether a sink received a request of ``step``."""
    return lambda sink: any(p.name == "rl.step" and p.value == step for p in sink.points())


def _shape(point: ReceivedPoint) -> tuple[Any, ...]:
    """What must be equal: all but the time; the value too, but for the process's own."""
    own = point.name.startswith("async_tee.") or point.name == "rl.step.time"
    value = (
        point.value_type
        if own
        else (point.value, point.value_type, point.count, point.sum, point.bucket_counts)
    )
    return (
        point.resource,
        point.scope,
        point.name,
        point.unit,
        point.description,
        point.kind,
        point.monotonic,
        point.temporality,
        point.attributes,
        point.explicit_bounds,
        value,
    )


def test_every_rank_sends_every_step_under_its_own_resource(requests):
    with OtlpSink() as sink:
        report = loadgen.run(_config(sink), requests)
        points = sink.points()
    assert report["steps"] == {
        "expected": RANKS * STEPS,
        "delivered": RANKS * STEPS,
        "missing": 0,
        "missing_first": [],
    }
    assert report["answers"] == {"2xx": RANKS * STEPS}
    assert report["points"]["delivered"] == len(points) == RANKS * STEPS * requests.points
    seen: dict[str, list[int]] = {}
    made: dict[int, list[tuple[int, int]]] = {}  # step -> (time, rank)
    for request in _requests_of(points):
        resource = request[0].resource
        assert all(p.resource == resource for p in request)
        rank = int(resource["rl.rank"])
        expected = loadgen.rank_resource(loadgen.rank_environ(rank, RANKS, PER_NODE, RUN))
        assert resource == dict(expected.attributes)
        assert resource["service.instance.id"] == f"{RUN}/rank-{rank}"
        assert resource["host.name"] == loadgen.node_name(rank // PER_NODE)
        assert len(request) == requests.points
        seen.setdefault(resource["service.instance.id"], []).append(_step_of(request))
        made.setdefault(_step_of(request), []).append((request[0].time_unix_nano, rank))
    # Each rank's steps, once each, in order.
    assert seen == {f"{RUN}/rank-{r}": list(range(1, STEPS + 1)) for r in range(RANKS)}
    # Stamped when made: each step's requests in the order of the ranks' phases, after the
    # load started, and every one of a step before any of the next.
    config = _config(sink)
    by_phase = sorted(range(RANKS), key=config.phase_s)
    assert min(made[1])[0] >= report["started_unix"] * 1e9 - 1e6
    for step in range(1, STEPS + 1):
        assert [rank for _, rank in sorted(made[step])] == by_phase
        if step > 1:
            assert max(made[step - 1]) < min(made[step])


def test_a_rank_sends_what_a_real_session_with_its_resource_sends(requests):
    rank = 5
    with OtlpSink() as sink:
        loadgen.run(_config(sink), requests)
        generated = [r for r in _requests_of(sink.points()) if r[0].resource["rl.rank"] == rank]
    sizes = {s: len(requests.request(rank, s, 0, 0.0)) for s in range(1, STEPS + 1)}

    with OtlpSink() as sink:
        environ = loadgen.rank_environ(rank, RANKS, PER_NODE, RUN)
        async_tee.start_telemetry(
            environ={**environ, **loadgen.session_environ(sink.http_endpoint)}
        )
        for prefix, metrics, step, finished in loadgen.setup_calls():
            async_tee.tee_rl_metrics_to_otel(metrics, prefix, step, finished)
        for step in range(1, STEPS + 1):
            for prefix, metrics, at, finished in loadgen.step_calls(step):
                async_tee.tee_rl_metrics_to_otel(metrics, prefix, at, finished)
            assert async_tee.flush(10)
            assert sink.wait_for(_has_step(step), 10)
        assert async_tee.shutdown_telemetry(10)
        real = list(_requests_of(sink.points()))
        real_sizes = [size for _, size, _ in sink.request_sizes()]

    assert len(real) == len(real_sizes)
    first_of_step: dict[int, int] = {}
    for index, request in enumerate(real):
        if any(p.name == "rl.step" for p in request):
            first_of_step.setdefault(_step_of(request), index)
    assert [_step_of(r) for r in generated] == list(range(1, STEPS + 1))
    for request in generated:
        step = _step_of(request)
        twin = real[first_of_step[step]]
        assert [_shape(p) for p in request] == [_shape(p) for p in twin], f"step {step}"
        assert real_sizes[first_of_step[step]] == sizes[step]
        (sent_at,) = {p.time_unix_nano for p in request}
        (step_time,) = {p.value for p in request if p.name == "rl.step.time"}
        assert step_time is not None
        assert abs(step_time - sent_at / 1e9) < 0.05  # the rank's own, not the template's


def test_transient_refusals_are_retried_until_every_step_is_delivered(requests):
    with OtlpSink() as sink:
        sink.fail(503)
        refused_some = threading.Event()

        def outage() -> None:  # the receiver comes back once it refused a few requests
            sink.wait_for(lambda s: s.requests["http"] >= 5, 30)
            refused_some.set()
            sink.fail(None)

        thread = threading.Thread(target=outage)
        thread.start()
        try:
            report = loadgen.run(_config(sink), requests)
        finally:
            thread.join(30)
    assert refused_some.is_set()
    assert report["answers"]["503"] >= 5
    assert report["retried"] == {"503": report["answers"]["503"]}
    assert report["steps"]["missing"] == 0
    assert report["requests"]["delivered"] == report["requests"]["made"] == RANKS * STEPS
    assert report["requests"]["sent"] == RANKS * STEPS + report["answers"]["503"]


def test_a_permanent_refusal_is_dropped_and_counted_never_retried(requests):
    with OtlpSink() as sink:
        sink.fail(400)
        report = loadgen.run(_config(sink, steps=1), requests)
    assert report["answers"] == {"400": RANKS}
    assert report["refused"] == {"400": RANKS}
    assert report["retried"] == {}
    assert report["steps"]["missing"] == RANKS
    assert report["requests"]["sent"] == RANKS

"""The asynchronous pipeline: exact accounting, drop-oldest, stalls, threads, loops, fork, exit."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from helpers import collect, running

import async_tee
from async_tee.sink import black_hole
from async_tee.vocabulary import TeedMetric, register_teed_metrics

BOUND_S = 15.0  # generous: these machines are shared and noisy


def hist(reader, name):
    data = reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    (point,) = metric.data.data_points
                    return point
    raise AssertionError(f"{name} not collected")


def test_accounting_is_exact_under_16_racing_producers_and_newest_survive(provider, reader):
    register_teed_metrics(
        [
            TeedMetric("hit", "rl.test.hits", kind="counter"),
            TeedMetric("marker", "rl.test.marker", kind="histogram"),
        ]
    )
    async_tee.start_telemetry(provider, queue_size=64, drain_interval_s=5.0)
    producers, per_thread, capacity = 16, 1500, 64
    barrier = threading.Barrier(producers)
    returned = [0] * producers

    def produce(index: int) -> None:
        barrier.wait()
        for _ in range(per_thread):
            async_tee.tee_rl_metrics_to_otel({"hit": 1, "marker": 0.0}, "train")
            returned[index] += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
        for t in threads:
            t.start()
        samples = []
        while any(t.is_alive() for t in threads):
            s = async_tee.stats()
            samples.append(s)
        for t in threads:
            t.join()
        # The newest `capacity` dicts can never be pushed out: all of them must be recorded.
        for i in range(capacity):
            async_tee.tee_rl_metrics_to_otel({"hit": 1, "marker": 1000.0 + i}, "train")
    finally:
        sys.setswitchinterval(old)
    assert async_tee.flush(BOUND_S)
    stats = async_tee.stats()
    total = producers * per_thread + capacity
    assert sum(returned) == producers * per_thread
    assert stats["enqueued"] == total
    assert stats["recorded"] + stats["dropped"] == total
    assert stats["pending"] == 0
    assert stats["dropped"] == stats["dropped_by_reason"]["overflow"] > 0
    for s in samples:  # the identity holds at every moment, not only after flush
        assert s["enqueued"] == s["recorded"] + s["dropped"] + s["pending"]
        assert s["pending"] >= 0
    got = collect(reader)
    assert got[("rl.test.hits", frozenset())] == stats["recorded"]
    marker = hist(reader, "rl.test.marker")
    assert marker.count == stats["recorded"]
    assert marker.max == 1000.0 + capacity - 1
    # Every one of the final `capacity` markers (>= 1000) was recorded.
    assert marker.sum == pytest.approx(sum(1000.0 + i for i in range(capacity)))


def test_a_dict_mutated_after_the_call_is_mirrored_as_it_was(provider, reader):
    async_tee.start_telemetry(provider)
    logged = {"reward": 0.5, "loss": 1.5}
    async_tee.tee_rl_metrics_to_otel(logged, "train", 1)
    logged["reward"] = 99.0
    del logged["loss"]
    logged["grad_norm"] = 7.0
    assert async_tee.flush(BOUND_S)
    assert collect(reader) == {
        ("rl.reward.mean", frozenset()): 0.5,
        ("rl.policy.loss", frozenset()): 1.5,
    }


def test_duplicate_per_step_logging_does_not_double_a_counter(provider, reader):
    async_tee.start_telemetry(provider)
    rollout = {"vllm/prompt_tokens": 100.0}
    async_tee.tee_rl_metrics_to_otel(rollout, "train", 1)  # the rollout keys alone
    async_tee.tee_rl_metrics_to_otel({**rollout, "reward": 1.0}, "train", 1)  # merged again
    async_tee.tee_rl_metrics_to_otel({"vllm/prompt_tokens": 50.0}, "train", 2)
    async_tee.tee_rl_metrics_to_otel({"vllm/prompt_tokens": 50.0}, "train", 2)
    assert async_tee.flush(BOUND_S)
    # An export shows the last step completed: step 1, until step 2 completes.
    assert collect(reader)[("rl.vllm.prompt_tokens", frozenset())] == 100.0
    assert async_tee.shutdown_telemetry(BOUND_S)
    assert collect(reader)[("rl.vllm.prompt_tokens", frozenset())] == 150.0


def test_without_a_step_every_call_counts(provider, reader):
    async_tee.start_telemetry(provider)
    for _ in range(3):
        async_tee.tee_rl_metrics_to_otel({"vllm/generations_ok": 2}, "train")
    assert async_tee.flush(BOUND_S)
    assert collect(reader)[("rl.vllm.generations.ok", frozenset())] == 6.0


@pytest.mark.asyncio
async def test_tee_from_inside_a_running_event_loop(provider, reader):
    async_tee.start_telemetry(provider)

    async def log_efficiency() -> None:
        async_tee.tee_rl_metrics_to_otel({"efficiency/idle/refit_bubble_s": 2.5}, "", 3)

    await asyncio.gather(*(log_efficiency() for _ in range(10)))
    assert async_tee.flush(BOUND_S)
    got = collect(reader)
    assert [v for (name, _), v in got.items() if name == "rl.efficiency.seconds"] == [2.5]
    assert async_tee.stats()["recorded"] == 10


def test_tee_from_a_daemon_thread(provider, reader):
    async_tee.start_telemetry(provider)
    done = threading.Event()

    def monitor() -> None:
        async_tee.tee_rl_metrics_to_otel({"reward": 0.75}, "train", 5)
        done.set()

    threading.Thread(target=monitor, daemon=True, name="gpu-monitor").start()
    assert done.wait(BOUND_S)
    assert async_tee.flush(BOUND_S)
    assert collect(reader) == {("rl.reward.mean", frozenset()): 0.75}


def test_record_rl_metrics_goes_through_the_queue(provider, reader):
    from async_tee.vocabulary import RecordedMetric, register_recorded_metrics

    register_recorded_metrics([RecordedMetric("rl.host.memory", unit="By")])
    async_tee.start_telemetry(provider)
    attributes = {"host": "a"}
    async_tee.record_rl_metrics({"host_memory": 1024}, attributes)
    attributes["host"] = "mutated"
    assert async_tee.flush(BOUND_S)
    assert collect(reader) == {("rl.host.memory", frozenset({("host", "a")})): 1024.0}


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["stalled", "black_hole"])
def test_stalled_or_unreachable_exporter_never_blocks_training(sink, fault):
    if fault == "stalled":
        sink.stall()
        endpoint, hole = sink.http_endpoint, None
    else:
        hole, port = black_hole()
        endpoint = f"http://127.0.0.1:{port}"
    try:
        async_tee.start_telemetry(
            environ={
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_EXPORTER_OTLP_TIMEOUT": "30",
                "OTEL_METRIC_EXPORT_INTERVAL": "50",
            }
        )
        if fault == "stalled":  # an export is really stuck in the receiver meanwhile
            assert sink.wait_for(lambda s: sum(s.requests.values()) > 0, BOUND_S)
        returned = 0
        for step in range(10_000):
            async_tee.tee_rl_metrics_to_otel({"reward": float(step), "loss": 1.0}, "train", step)
            returned += 1
        assert returned == 10_000
        assert async_tee.flush(BOUND_S)  # recording does not wait on export
        stats = async_tee.stats()
        assert stats["enqueued"] == stats["recorded"] + stats["dropped"] == 10_000
        started = time.monotonic()
        delivered = async_tee.shutdown_telemetry(timeout_s=2)
        elapsed = time.monotonic() - started
        assert elapsed < 6.0, f"shutdown took {elapsed:.1f}s against a {fault} collector"
        assert delivered is False
    finally:
        sink.unstall()
        if hole is not None:
            hole.close()


def test_disabled_means_no_thread_and_no_op(provider, reader):
    handle = async_tee.start_telemetry(provider, environ={"ASYNC_TEE_ENABLED": "0"})
    assert not handle.is_exporting
    assert not [t for t in threading.enumerate() if t.name.startswith("async-tee")]
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1)
    assert async_tee.flush(1)
    assert collect(reader) == {}
    assert async_tee.stats()["enqueued"] == 0


def test_start_twice_returns_the_running_handle_and_refuses_another_provider(provider):
    from opentelemetry.sdk.metrics import MeterProvider

    first = async_tee.start_telemetry(provider)
    assert async_tee.start_telemetry() is first
    other = MeterProvider(shutdown_on_exit=False)
    with pytest.raises(RuntimeError, match="already running"):
        async_tee.start_telemetry(other)
    other.shutdown()


def test_shutdown_twice_and_without_start_is_safe(provider):
    assert async_tee.shutdown_telemetry(1) is True  # never started
    async_tee.start_telemetry(provider)
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1)
    assert async_tee.shutdown_telemetry(5) is True
    assert async_tee.shutdown_telemetry(5) is True
    async_tee.tee_rl_metrics_to_otel({"reward": 2.0}, "train", 2)  # after shutdown: no-op
    assert async_tee.stats()["enqueued"] == 1


def test_flush_and_shutdown_from_the_worker_thread_do_not_deadlock(provider, reader):
    results: list[bool] = []

    class CallsBack(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if threading.current_thread().name == "async-tee-worker" and not results:
                results.append(async_tee.flush(1))
                results.append(async_tee.shutdown_telemetry(1))

    handler = CallsBack(level=logging.WARNING)
    logging.getLogger("async_tee").addHandler(handler)
    try:
        pipeline = running(async_tee.start_telemetry(provider))
        # A negative counter delta makes the worker warn: the handler runs on the worker.
        async_tee.tee_rl_metrics_to_otel({"vllm/prompt_tokens": -5.0}, "train", 1)
        deadline = time.monotonic() + BOUND_S
        worker = pipeline.worker
        assert worker is not None
        worker.thread.join(BOUND_S)
        assert time.monotonic() < deadline
        assert not worker.thread.is_alive()
        # It cannot wait for itself: both say "not yet", and nothing hangs or is lost.
        assert results == [False, False]
        stats = async_tee.stats()
        assert stats["recorded"] == stats["enqueued"] == 1
    finally:
        logging.getLogger("async_tee").removeHandler(handler)


def run_python(code: str, timeout: float = 60.0, env: dict[str, str] | None = None):
    import os

    full_env = {**os.environ, **(env or {})}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        check=False,
    )
    return proc, time.monotonic() - started


def test_import_is_light_and_loads_no_opentelemetry():
    proc, _ = run_python(
        """
        import sys
        import async_tee
        async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1)  # off: a no-op
        heavy = sorted(m for m in sys.modules if m.startswith(("opentelemetry", "grpc", "asyncio")))
        assert not heavy, heavy
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


@pytest.mark.slow
def test_exit_with_a_dead_collector_is_bounded():
    hole, port = black_hole()
    try:
        proc, elapsed = run_python(
            f"""
            import async_tee
            async_tee.start_telemetry(environ={{
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:{port}",
                "OTEL_METRIC_EXPORT_INTERVAL": "100",
            }})
            for step in range(100):
                async_tee.tee_rl_metrics_to_otel({{"reward": 1.0}}, "train", step)
            print("exiting")
            """,
            timeout=60,
        )
    finally:
        hole.close()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "exiting"
    # Default ASYNC_TEE_SHUTDOWN_TIMEOUT is 5 s; the SDK's own hook alone takes ~20-30 s.
    assert elapsed < 12.0, f"exit took {elapsed:.1f}s"


@pytest.mark.slow
def test_fork_gives_the_child_its_own_working_pipeline():
    proc, elapsed = run_python(
        """
        import os, sys, threading
        import async_tee
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
        async_tee.start_telemetry(provider, queue_size=256)
        stop = threading.Event()

        def busy():
            step = 0
            while not stop.is_set():
                async_tee.tee_rl_metrics_to_otel({"reward": 1.0, "loss": 2.0}, "train", step)
                # Step 7's counter, again and again: always the parent's latest counted step.
                async_tee.tee_rl_metrics_to_otel({"vllm/prompt_tokens": 1.0}, "train", 7)
                step += 1

        producer = threading.Thread(target=busy, daemon=True)
        producer.start()
        while async_tee.stats()["recorded"] < 1000:
            pass
        pid = os.fork()
        if pid == 0:
            s = async_tee.stats()
            assert s["enqueued"] == 0 and s["pending"] == 0, s  # nothing inherited
            for step in range(50):
                # Step 7's delta was counted by the parent: the child's memory starts empty.
                extra = {"vllm/prompt_tokens": 5.0} if step == 7 else {}
                async_tee.tee_rl_metrics_to_otel({"reward": 3.0, **extra}, "train", step)
            ok = async_tee.flush(10)
            s = async_tee.stats()
            names = {
                (m.name, getattr(m.data.data_points[0], "value", None))
                for rm in reader.get_metrics_data().resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
                if m.name.startswith("rl.") and m.name != "rl.step.time"
            }
            # Only what the child recorded: the parent's loss is not re-exported, stale,
            # and its counter restarts from the child's own deltas. Its own step clock
            # completed step 48 when step 49 arrived.
            good = ok and s["recorded"] == 50 and s["dropped"] == 0
            child_series = {("rl.reward.mean", 3.0), ("rl.vllm.prompt_tokens", 5.0)}
            child_series.add(("rl.step", 48))
            good = good and names == child_series
            async_tee.shutdown_telemetry(2)
            os._exit(0 if good else 3)
        stop.set()
        producer.join()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert async_tee.flush(10)
        s = async_tee.stats()
        assert s["enqueued"] == s["recorded"] + s["dropped"]
        assert async_tee.shutdown_telemetry(5)
        provider.shutdown()
        print("ok")
        """,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert elapsed < 30


def test_overflow_warns_once_when_loss_starts_and_once_when_it_recovers(provider, logs):
    async_tee.start_telemetry(provider, queue_size=8, drain_interval_s=30.0)
    for step in range(200):  # far faster than the worker can take the GIL: overflow
        async_tee.tee_rl_metrics_to_otel({"reward": float(step)}, "train", step)
    assert async_tee.flush(BOUND_S)
    dropped = async_tee.stats()["dropped_by_reason"]["overflow"]
    assert dropped > 0
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 999)  # a calm cycle
    assert async_tee.flush(BOUND_S)
    warnings = [r.getMessage() for r in logs.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "overflowed" in warnings[0]
    assert "recovered" in warnings[1]
    assert f"{dropped} dicts were dropped" in warnings[1]


@pytest.mark.asyncio
async def test_aflush_awaits_without_blocking_the_callers_loop(provider, reader):
    async_tee.start_telemetry(provider, drain_interval_s=30.0)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    running = asyncio.ensure_future(ticker())
    try:
        async_tee.tee_rl_metrics_to_otel({"reward": 0.5}, "train", 1)
        assert await async_tee.aflush(BOUND_S)
    finally:
        running.cancel()
    assert collect(reader) == {("rl.reward.mean", frozenset()): 0.5}
    assert ticks > 0  # the loop kept running while aflush waited


@pytest.mark.asyncio
async def test_aflush_times_out_false_when_the_worker_cannot_finish(provider):
    worker = running(async_tee.start_telemetry(provider)).worker
    assert worker is not None
    with worker.busy:  # hold the worker inside its batch: nothing can be recorded
        async_tee.tee_rl_metrics_to_otel({"reward": 0.5}, "train", 1)
        assert await async_tee.aflush(0.2) is False
    assert await async_tee.aflush(BOUND_S) is True


@pytest.mark.slow
def test_an_idle_worker_backs_off_instead_of_waking_every_interval(provider):
    # Each timer wake costs CPU (and a GIL hand-off) even with nothing to do: idle, the
    # worker doubles its sleep (up to 30 s). At a fixed 10 ms it would wake ~100 times here.
    worker = running(async_tee.start_telemetry(provider, drain_interval_s=0.01)).worker
    assert worker is not None
    time.sleep(1.0)  # measuring idleness itself, not waiting for work to finish
    idle_wakes = worker.wakes
    assert idle_wakes <= 15, idle_wakes
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1)
    assert async_tee.flush(BOUND_S)  # a flush still reaches a backed-off worker at once


def test_a_running_and_an_idle_session_report_the_same_figures(provider):
    from async_tee._session.lifecycle import NO_SESSION

    session = async_tee.start_telemetry(provider)
    running = session.stats()

    def shape(d):
        return {
            k: shape(v) if isinstance(v, dict) and k not in EMPTY_TABLES else None
            for k, v in d.items()
        }

    assert shape(running) == shape(NO_SESSION.stats())
    assert async_tee.shutdown_telemetry(5)


EMPTY_TABLES = ("non_finite_by_series", "exporters")

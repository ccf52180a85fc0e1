"""Nothing a caller passes stops the pipeline: poison steps, poison values, broken mappings.

The poison cases run through the real pipeline to a real OTLP receiver and check what
matters to the user: every later good step still arrives as its own point, or, logged
back to back, is counted as coalesced into a newer one (docs/semantics.md §9). The property
test throws generated hostile calls (hypothesis, 10,000 examples by default) at the real
pipeline: no exception escapes, the accounting identity holds after every example, and
the worker is alive and records a good dict at the end.
"""

from __future__ import annotations

import asyncio
import math
import os
import tracemalloc
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
from helpers import collect, running
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import async_tee
from async_tee._worker.loop import Worker
from async_tee.sink import OtlpSink

REWARD = "rl.reward.mean"
EXAMPLES = int(os.environ.get("ASYNC_TEE_HYPOTHESIS_EXAMPLES", "10000"))
SHARDS = 4  # the examples in 4 tests of their own seeds, so the test processes share them


class RaisingEq:
    """A hashable step whose comparison raises."""

    def __hash__(self) -> int:
        return 1

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparing me")

    def __gt__(self, other: object) -> bool:
        raise RuntimeError("no comparing me")


class RaisingFloat:
    """A value whose conversion raises ``error``, a BaseException included."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __float__(self) -> float:
        raise self.error


class BrokenMapping(Mapping[str, Any]):
    """A mapping that fails while it is copied (as one mutated by another thread does)."""

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        yield "reward"
        raise RuntimeError("dictionary changed size during iteration")

    def __len__(self) -> int:
        return 2


def _identity_holds(stats: dict[str, Any]) -> bool:
    return bool(stats["enqueued"] == stats["recorded"] + stats["dropped"] + stats["pending"])


def _good_steps(logger: async_tee.Logger, steps: range) -> None:
    """Log ``steps`` back to back: a newer step may replace one waiting for its export."""
    for step in steps:
        logger.log_metrics({"reward": float(step), "vllm/prompt_tokens": 1.0}, step, "train")
        logger.log_metrics({"t": 1.0}, step, "timing/train", step_finished=True)


def _received_steps(sink: OtlpSink) -> set[Any]:
    """The steps of the exports that carried the reward."""
    return {step for step, _ in sink.by_step(REWARD) if step is not None}


def _paced_steps(logger: async_tee.Logger, sink: OtlpSink, steps: range) -> None:
    """Log each of ``steps`` once the sink received the one before: each is exported alone.

    Nothing else is collected meanwhile, so no newer step can replace a step's export.
    """
    for step in steps:
        _good_steps(logger, range(step, step + 1))
        assert _arrives(sink, step), f"step {step} never reached the receiver"


def _arrives(sink: OtlpSink, step: int) -> bool:
    """Whether an export of ``step`` reaches the sink within 10 s."""
    return sink.wait_for(lambda s: step in _received_steps(s), 10)


@pytest.mark.slow
@pytest.mark.parametrize(
    "poison",
    [
        {"step": np.array([0, 1])},
        {"step": RaisingEq()},
        {"value": RaisingFloat(SystemExit(1))},
        {"value": RaisingFloat(KeyboardInterrupt())},
        {"value": RaisingFloat(asyncio.CancelledError())},
        {"value": RaisingFloat(GeneratorExit())},
    ],
    ids=[
        "array-step",
        "raising-eq-step",
        "SystemExit",
        "KeyboardInterrupt",
        "Cancelled",
        "GenExit",
    ],
)
def test_after_a_poison_call_every_later_step_is_exported(sink: OtlpSink, poison):
    async_tee.start_telemetry(
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint,
            "ASYNC_TEE_MIN_EXPORT_INTERVAL": "0",
        }
    )
    logger = async_tee.Logger()
    _paced_steps(logger, sink, range(1))  # step 0 connects the exporter's channel
    value = poison.get("value", 7.0)
    step = poison.get("step", 1)
    async_tee.tee_rl_metrics_to_otel({"reward": value, "vllm/prompt_tokens": 10.0}, "train", step)
    paced, back_to_back = range(1, 6), range(6, 11)
    _paced_steps(logger, sink, paced)  # each arrives on its own, or a poison broke the exports
    _good_steps(logger, back_to_back)  # a newer step may replace a waiting export (§9)
    assert async_tee.shutdown_telemetry(10)
    later = set(range(1, 11))
    received = _received_steps(sink)
    assert received <= {0, *later}
    assert all(value == step for step, value in sink.by_step(REWARD) if step is not None)
    stats = async_tee.stats()
    steps = stats["steps"]
    assert steps["completed"] == 1 + len(later)  # step 0 and every later good step
    assert steps["exported"] + steps["coalesced"] == steps["completed"]
    assert stats["exports"]["failure"] == 0  # every step exported on its own was delivered
    # Step 0 and the paced steps arrived, so each was exported on its own: the coalesced
    # steps are back-to-back ones, and a coalesced step is in no export (the periodic
    # one is 60 s away), so every later step arrived as its own point or was coalesced.
    assert set(paced) <= received
    assert len(later - received) == steps["coalesced"]
    assert stats["worker_died"] == 0
    assert _identity_holds(stats)
    if "step" in poison:
        assert steps["unusable"] == 1  # taken as no step, never stored
        assert stats["errors"]["registry"] == 0
    else:
        assert stats["dropped_by_reason"]["error"] == 1  # the poisoned dict, counted


def test_a_dict_that_fails_to_copy_is_counted_as_dropped(provider, reader, logs):
    async_tee.start_telemetry(provider)
    async_tee.tee_rl_metrics_to_otel(BrokenMapping(), "timing/train", 1)  # copied whole
    async_tee.tee_rl_metrics_to_otel({"reward": 2.0}, "train", 2)
    assert async_tee.flush(10)
    stats = async_tee.stats()
    assert stats["enqueued"] == 2  # both were handed over
    assert stats["dropped_by_reason"]["snapshot"] == 1
    assert stats["recorded"] == 1
    assert _identity_holds(stats)
    assert collect(reader)[(REWARD, frozenset())] == 2.0


def test_a_worker_that_dies_says_so_and_the_tee_stops_enqueuing(provider, monkeypatch, logs):
    session = running(async_tee.start_telemetry(provider))

    def die(self: Worker) -> None:
        raise SystemExit("the loop's own code failed")  # no caller can cause this: injected

    monkeypatch.setattr(Worker, "_report_loss", die)
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1)
    assert session.worker is not None
    session.worker.wake()
    session.worker.thread.join(10)
    assert not session.worker.thread.is_alive()
    stats = async_tee.stats()
    assert stats["worker_died"] == 1
    assert stats["exporting"] is False
    enqueued = stats["enqueued"]
    async_tee.tee_rl_metrics_to_otel({"reward": 2.0}, "train", 2)  # a no-op now
    assert async_tee.stats()["enqueued"] == enqueued
    assert any("worker stopped unexpectedly" in r.getMessage() for r in logs.records)


# ------------------------------------------------------------------ generated hostile calls

_ERRORS = st.sampled_from(
    [ValueError("v"), SystemExit(2), KeyboardInterrupt(), GeneratorExit(), RecursionError()]
)
_SCALARS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.complex_numbers(allow_nan=True),
    st.builds(np.float32, st.floats(width=32)),
    st.builds(np.int64, st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    st.builds(np.array, st.lists(st.floats(), max_size=3)),
    st.builds(RaisingFloat, _ERRORS),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
# Keys the shipped rows and families read, so hostile values reach the mapping code.
_KEYS = st.one_of(
    st.sampled_from(
        [
            "reward",
            "loss",
            "lr",
            "vllm/prompt_tokens",
            "vllm/generation_tokens",
            "efficiency/idle/refit_bubble_s",
            "efficiency/efficiency_pct",
            "efficiency/efficiency_pct_is_per_step",
            "policy_init_time_s",
            "total_setup_time_s",
        ]
    ),
    st.text(max_size=12),
    st.integers(),
    st.none(),
)
_METRICS = st.one_of(
    st.dictionaries(_KEYS, _VALUES, max_size=8),
    st.just(BrokenMapping()),
    st.just(None),
    st.integers(),
)
_PREFIXES = st.one_of(
    st.sampled_from(["train", "", None, "timing/setup", "timing/train", "performance"]),
    st.text(max_size=6),
    st.integers(),
)
_STEPS = st.one_of(
    st.integers(min_value=-5, max_value=10**12),
    st.floats(allow_nan=False, max_value=1e300),  # the check's own step below is above
    st.floats().filter(lambda x: not math.isfinite(x)),
    st.none(),
    st.just(np.array([1, 2])),
    st.builds(RaisingEq),
    st.text(max_size=3),
    st.builds(RaisingFloat, _ERRORS),
)
_CALLS = st.lists(st.tuples(_METRICS, _PREFIXES, _STEPS, st.booleans()), min_size=1, max_size=4)


@pytest.mark.slow
@pytest.mark.timeout(300)  # 2,500 examples a shard: ~25 s, ~1 min under coverage on a slow host
@pytest.mark.parametrize("shard", range(SHARDS))
def test_generated_hostile_calls_never_escape_and_the_pipeline_keeps_working(
    provider, reader, shard
):
    session = running(async_tee.start_telemetry(provider))
    examples = [0]
    per_shard = -(-EXAMPLES // SHARDS)

    @seed(shard)
    @settings(
        max_examples=per_shard,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(calls=_CALLS)
    def hostile(calls: list[tuple[Any, Any, Any, bool]]) -> None:
        examples[0] += 1
        for metrics, prefix, step, finished in calls:
            async_tee.tee_rl_metrics_to_otel(metrics, prefix, step, step_finished=finished)
        stats = session.stats(lag_percentiles=False)  # no lag sort: cheap enough per example
        assert _identity_holds(stats), stats
        assert stats["worker_died"] == 0

    hostile()
    assert examples[0] >= per_shard
    assert async_tee.flush(30)
    stats = async_tee.stats()
    assert _identity_holds(stats)
    assert stats["pending"] == 0
    assert stats["exporting"] is True
    # The worker is alive and records a good dict after all of it.
    async_tee.tee_rl_metrics_to_otel({"reward": 4242.0}, "train", 1e301, step_finished=True)
    assert async_tee.flush(10)  # completes the finished step: exports show it
    assert collect(reader)[(REWARD, frozenset())] == 4242.0
    assert math.isfinite(async_tee.stats()["lag_ms"]["max"])


# ------------------------------------------------------------------ bounded by what is teed


def _padded(metrics: dict[str, Any], size: int) -> dict[str, Any]:
    """``metrics`` plus keys nothing reads, up to ``size`` keys (rollout-environment noise)."""
    out = dict(metrics)
    for i in range(size - len(out)):
        out[f"env/noise_{i}"] = [float(i)] * 4
    return out


def _exported(dicts: list[tuple[dict[str, Any], str]]) -> dict[Any, Any]:
    """What a fresh session on a fresh provider exports for ``dicts``."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    async_tee.start_telemetry(provider)
    for metrics, prefix in dicts:
        async_tee.tee_rl_metrics_to_otel(metrics, prefix, 1)
    assert async_tee.flush(10)
    exported = collect(reader)
    assert async_tee.shutdown_telemetry(10)
    provider.shutdown()
    return exported


@pytest.mark.parametrize("size", [400, 2_000, 100_000])
def test_a_large_dict_exports_exactly_what_the_small_one_does(calls, size):
    train = next(c for c in calls if c["prefix"] == "train" and len(c["metrics"]) > 60)
    efficiency = next(c for c in calls if c["prefix"] == "")
    small = _exported([(train["metrics"], "train"), (efficiency["metrics"], "")])
    assert len(small) >= 20  # the training scalars, vLLM rows and efficiency categories
    padded = [
        (_padded(train["metrics"], size), "train"),
        (_padded(efficiency["metrics"], size), ""),
    ]
    assert _exported(padded) == small


def test_queued_memory_is_bounded_by_the_teed_keys_not_the_dict(provider):
    async_tee.start_telemetry(provider, queue_size=64, drain_interval_s=60.0)  # worker asleep
    big = _padded({"reward": 1.0, "loss": 2.0}, 20_000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for step in range(40):
            async_tee.tee_rl_metrics_to_otel(big, "train", step)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # 40 whole copies would hold ~40 x 0.6 MiB; the snapshots hold the two read keys.
    assert held < 256 * 1024, held
    assert async_tee.stats()["pending"] == 40


def test_a_large_setup_dict_is_copied_whole(provider, reader):
    setup = {f"phase_{i}_time_s": float(i) for i in range(500)}  # > FILTER_ABOVE, < 512 sets
    async_tee.start_telemetry(provider)
    async_tee.tee_rl_metrics_to_otel(setup, "timing/setup", 0)
    assert async_tee.flush(10)
    phases = {dict(attrs)["rl.setup.phase"] for name, attrs in collect(reader)}
    assert len(phases) == 500  # the setup family reads every key ending in _s


class RaisingKey(str):
    """A key whose comparison raises: equal by hash to a key the worker reads."""

    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparing this key")

    def endswith(self, *args: Any) -> bool:
        raise RuntimeError("no suffixes either")


def test_a_key_whose_comparison_raises_costs_its_own_value_alone(provider, reader):
    async_tee.start_telemetry(provider)
    train = {RaisingKey("loss"): 9.0, "reward": 1.0, "grad_norm": 2.0}
    timing = {RaisingKey("policy_training"): 3.0, "total_step_time": 4.0}
    async_tee.tee_rl_metrics_to_otel(train, "train", 1)
    async_tee.tee_rl_metrics_to_otel(timing, "timing/train", 1, step_finished=True)
    assert async_tee.flush(10)
    points = collect(reader)
    assert points[(REWARD, frozenset())] == 1.0  # the dict's other values arrive
    assert points[("rl.grad_norm", frozenset())] == 2.0
    assert ("rl.policy.loss", frozenset()) not in points  # the bad key alone is lost...
    stats = async_tee.stats()
    assert stats["values_skipped"]["left_out"] == 1  # ...and counted, not booked as recorded
    assert stats["errors"]["tee"] == 0
    # A dict copied whole is read with plain-str keys: the bad key's text is a phase.
    phases = {dict(attrs).get("rl.step.phase") for name, attrs in points}
    assert "policy_training" in phases
    assert points[("rl.step.duration", frozenset())] == 4.0


RSS_CHILD = """
import os, resource, sys
import async_tee
if sys.argv[1] == "on":
    async_tee.start_telemetry(environ={"OTEL_METRICS_EXPORTER": "none"}, drain_interval_s=60.0)
def rss_kib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
before = rss_kib()
for step in range(100):  # a rollout's raw data beside the scalars, a fresh 8 MB list a step
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0, "raw": [0.0] * 1_000_000}, "train", step)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


@pytest.mark.slow
def test_a_queued_dict_keeps_no_unread_value_alive():
    import subprocess
    import sys

    grew = {
        mode: int(
            subprocess.run(
                [sys.executable, "-c", RSS_CHILD, mode],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout
        )
        for mode in ("off", "on")
    }
    # Off, each list dies at the next step; on, the worker sleeps through all 100 calls, so
    # a snapshot holding the list would keep 100 of them (800 MB) alive.
    assert grew["on"] - grew["off"] < 4 * 1024, grew


def test_dicts_pending_behind_a_stuck_worker_are_booked_as_dropped_at_shutdown(provider):
    import threading

    session = running(async_tee.start_telemetry(provider))
    release = threading.Event()
    consumer = session.worker.consumer
    process = consumer.process

    def stuck(snapshot: Any) -> None:
        release.wait(30)  # a consumer that hangs, as a stuck SDK lock would
        process(snapshot)

    consumer.process = stuck  # type: ignore[method-assign,assignment]
    for step in range(101):
        async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", step)
    assert async_tee.shutdown_telemetry(0.5) is False  # the deadline, not the worker
    stats = async_tee.stats()
    assert stats["pending"] == 0
    assert stats["dropped_by_reason"]["shutdown"] == 101 - stats["recorded"]
    assert _identity_holds(stats)
    release.set()  # it comes back: it discards what it holds, and the books still add up
    session.worker.thread.join(10)
    assert not session.worker.thread.is_alive()
    after = async_tee.stats()
    assert after["enqueued"] == 101
    assert _identity_holds(after)
    assert after["pending"] == 0


def test_a_dict_read_whole_keeps_at_most_the_attribute_set_bound_and_counts_the_rest(
    provider, reader
):
    setup = {f"phase_{i}_time_s": float(i) for i in range(600)}
    async_tee.start_telemetry(provider)  # ASYNC_TEE_MAX_ATTRIBUTE_SETS: 512
    async_tee.tee_rl_metrics_to_otel(setup, "timing/setup", 0)
    assert async_tee.flush(10)
    phases = {dict(attrs)["rl.setup.phase"] for name, attrs in collect(reader)}
    assert len(phases) == 512
    assert async_tee.stats()["values_skipped"]["left_out"] == 600 - 512

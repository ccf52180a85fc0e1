"""The fixture's whole run through the tee: exactly the expected series, in memory and over OTLP."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from helpers import collect, load_calls, running, units

import async_tee
from async_tee.sink import OtlpSink

EFFICIENCY = "rl.efficiency.seconds"


def eff(
    category: str, measurement: str, window: str, bucket: str
) -> tuple[str, frozenset[tuple[str, str]]]:
    return (
        EFFICIENCY,
        frozenset(
            {
                "rl.efficiency.category": category,
                "rl.efficiency.measurement": measurement,
                "rl.efficiency.window": window,
                "rl.bucket": bucket,
            }.items()
        ),
    )


def plain(name: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return (name, frozenset())


def setup(phase: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return ("rl.setup.duration", frozenset({"rl.setup.phase": phase}.items()))


EXPECTED: dict[tuple[str, frozenset[tuple[str, str]]], float] = {
    setup("vllm_init"): 71.8,
    setup("policy_init"): 94.2,
    setup("parallel_wall"): 95.0,
    setup("collective_init"): 6.4,
    setup("total_setup"): 141.3,
    setup("other_setup"): 39.9,
    plain("rl.reward.mean"): 0.5234,
    plain("rl.kl.divergence"): 0.00087,
    plain("rl.policy.loss"): -0.0123,
    plain("rl.entropy"): 0.412,
    plain("rl.response.length.mean"): 257.6,
    plain("rl.grad_norm"): 0.2871,
    plain("rl.learning_rate"): 5e-06,
    plain("rl.vllm.prompt_tokens"): 49152.0,
    plain("rl.vllm.generation_tokens"): 131891.0,
    plain("rl.vllm.generations.ok"): 512.0,
    plain("rl.vllm.generations.failed"): 0.0,
    plain("rl.vllm.prompt_length.mean"): 96.0,
    plain("rl.vllm.generation_length.mean"): 257.6,
    eff("init/total", "wall_clock", "run", "overhead"): 182.4,
    eff("idle/buffer_starvation", "wall_clock", "step", "idle"): 0.5,
    eff("idle/refit_bubble", "wall_clock", "step", "idle"): 3.8,
    eff("idle/validation", "wall_clock", "step", "idle"): 0.0,
    eff("idle/buffer_full_backoff", "thread_seconds", "run", "idle"): 812.0,
    eff("wasted/failed_trajectory", "thread_seconds", "run", "wasted"): 0.0,
    eff("idle/generation_limit_pause", "collector_wall_clock", "run", "idle"): 95.3,
    eff("idle/refit_event_wait", "collector_wall_clock", "run", "idle"): 41.7,
    (
        "rl.efficiency.pct",
        frozenset(
            {"rl.efficiency.measurement": "wall_clock", "rl.efficiency.window": "step"}.items()
        ),
    ): 93.3,
}


def phase(name: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return ("rl.step.phase.duration", frozenset({"rl.step.phase": name}.items()))


def _logged(prefix: str) -> dict[str, Any]:
    (metrics,) = [c["metrics"] for c in load_calls() if c["prefix"] == prefix]
    return metrics


_PERFORMANCE, _TIMING, _EFFICIENCY_DICT = (
    _logged("performance"),
    _logged("timing/train"),
    _logged(""),
)
EXPECTED.update(
    {
        plain("rl.reward.total.mean"): 0.5234,
        plain("rl.generation.kl_error"): 0.00091,
        plain("rl.logprob.token_mult_error"): 1.0131,
        plain("rl.truncation.ratio"): 0.043,
        **{
            plain(name): _PERFORMANCE[key]
            for key, name in {
                "tokens_per_sec": "rl.throughput.tokens",
                "tokens_per_sec_per_gpu": "rl.throughput.tokens.per_gpu",
                "samples_per_sec": "rl.throughput.samples",
                "samples_per_sec_per_gpu": "rl.throughput.samples.per_gpu",
                "generation_tokens_per_sec": "rl.throughput.generation.tokens",
                "generation_tokens_per_sec_per_gpu": "rl.throughput.generation.tokens.per_gpu",
                "training_worker_group_tokens_per_sec": "rl.throughput.training.tokens",
                "training_worker_group_tokens_per_sec_per_gpu": (
                    "rl.throughput.training.tokens.per_gpu"
                ),
                "policy_training_tokens_per_sec_per_gpu": (
                    "rl.throughput.policy_training.tokens.per_gpu"
                ),
                "policy_and_reference_logprobs_tokens_per_sec_per_gpu": (
                    "rl.throughput.logprobs.tokens.per_gpu"
                ),
                "average_token_imbalance": "rl.token_imbalance.mean",
            }.items()
        },
        plain("rl.step.duration"): _TIMING["total_step_time"],
        plain("rl.throughput.valid_tokens.per_gpu"): _TIMING["valid_tokens_per_sec_per_gpu"],
        # Every other key of the step's timing dict is a phase (16 in the fixture).
        **{
            phase(key): value
            for key, value in _TIMING.items()
            if key not in ("total_step_time", "valid_tokens_per_sec_per_gpu")
        },
        plain("rl.efficiency.wall_time"): _EFFICIENCY_DICT["efficiency/total_wall_time_s"],
        plain("rl.efficiency.productive"): _EFFICIENCY_DICT["efficiency/productive_time_s"],
        plain("rl.efficiency.waste"): _EFFICIENCY_DICT["efficiency/total_waste_s"],
        plain("rl.efficiency.thread_time"): _EFFICIENCY_DICT["efficiency/thread_seconds_total_s"],
    }
)
assert len([key for key in EXPECTED if key[0] == "rl.step.phase.duration"]) == 16

EXPECTED_UNITS = {
    "rl.setup.duration": ("s", "Gauge"),
    "rl.efficiency.seconds": ("s", "Gauge"),
    "rl.efficiency.pct": ("%", "Gauge"),
    "rl.reward.mean": ("", "Gauge"),
    "rl.response.length.mean": ("{token}", "Gauge"),
    "rl.vllm.prompt_tokens": ("{token}", "Sum"),
    "rl.vllm.generations.ok": ("{generation}", "Sum"),
}


def run_fixture() -> None:
    for call in load_calls():
        async_tee.tee_rl_metrics_to_otel(
            call["metrics"], call["prefix"], call["step"], call.get("step_finished", False)
        )


def test_fixture_through_the_tee_gives_exactly_the_expected_series(provider, reader):
    async_tee.start_telemetry(provider)
    before = time.time()
    run_fixture()
    assert async_tee.flush(10)
    got = collect(reader)
    # Step 42 said step_finished (its timing/train dict), so the flush completed it: every
    # export shows it, and the start-up phases (step 0) are held for the run.
    step_series: set[tuple[str, frozenset[tuple[str, str]]]] = {
        ("rl.step", frozenset()),
        ("rl.step.time", frozenset()),
    }
    assert set(got) == set(EXPECTED) | step_series
    assert got[("rl.step", frozenset())] == 42
    assert before <= got[("rl.step.time", frozenset())] <= time.time()
    for key, value in EXPECTED.items():
        assert got[key] == pytest.approx(value), key
        assert type(got[key]) is float, f"{key} must be a double, got {type(got[key])}"
    kinds = units(reader)
    for name, expected in EXPECTED_UNITS.items():
        assert kinds[name] == expected, name
    stats = async_tee.stats()
    # Every call but the GPU monitor's (prefix ray) is teed.
    assert stats["enqueued"] == 6
    assert stats["recorded"] == 6
    assert sum(stats["values_skipped"].values()) == 0
    assert stats["dropped"] == 0


def test_aggregate_efficiency_keys_never_become_categories(provider, reader):
    async_tee.start_telemetry(provider)
    run_fixture()
    assert async_tee.flush(10)
    categories = {
        dict(attrs)["rl.efficiency.category"]
        for name, attrs in collect(reader)
        if name == EFFICIENCY
    }
    for aggregate in ("thread_seconds_total", "total_waste", "productive_time", "total_wall_time"):
        assert aggregate not in categories
    assert len(categories) == 8


def test_ignored_prefixes_create_nothing(provider, reader):
    async_tee.start_telemetry(provider)
    for call in load_calls():
        if call["prefix"] == "ray":
            async_tee.tee_rl_metrics_to_otel(call["metrics"], call["prefix"], call["step"])
    # A dict under a prefix no row reads is not even enqueued, even if it carries teed keys.
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0, "loss": 2.0}, "refit", 1)
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train/", 1)
    assert async_tee.flush(10)
    assert collect(reader) == {}
    assert async_tee.stats()["enqueued"] == 0


def test_plain_train_dict_creates_no_efficiency_or_setup_points(provider, reader):
    async_tee.start_telemetry(provider)
    async_tee.tee_rl_metrics_to_otel({"reward": 0.25, "unrelated": 3.0}, "train", 1)
    assert async_tee.flush(10)
    assert collect(reader) == {plain("rl.reward.mean"): 0.25}


def test_none_prefix_counts_as_empty(provider, reader):
    async_tee.start_telemetry(provider)
    async_tee.tee_rl_metrics_to_otel({"efficiency/efficiency_pct": 50.0}, None, 1)
    assert async_tee.flush(10)
    got = collect(reader)
    (key,) = got
    assert key[0] == "rl.efficiency.pct"
    assert dict(key[1])["rl.efficiency.window"] == "run"  # no per-step flag: run, never step


def test_nan_loss_is_withdrawn_and_counted_not_exported_stale(provider, reader, caplog):
    async_tee.start_telemetry(provider)
    async_tee.tee_rl_metrics_to_otel({"loss": 0.5}, "train", 1)
    assert async_tee.flush(10)
    assert collect(reader)[plain("rl.policy.loss")] == 0.5
    for step in range(2, 50):
        async_tee.tee_rl_metrics_to_otel({"loss": math.nan}, "train", step)
    assert async_tee.flush(10)
    assert plain("rl.policy.loss") not in collect(reader)  # a gap, not a stale healthy 0.5
    stats = async_tee.stats()
    assert stats["values_skipped"]["non_finite"] == 48
    assert stats["non_finite_by_series"]["rl.policy.loss"] == 48
    assert sum(stats["non_finite_by_series"].values()) == 48  # every other series at 0
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def _sink_environ(sink: OtlpSink, protocol: str) -> dict[str, Any]:
    endpoint = sink.grpc_endpoint if protocol == "grpc" else sink.http_endpoint
    return {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc" if protocol == "grpc" else "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_TIMEOUT": "5",
        "OTEL_METRIC_EXPORT_INTERVAL": "600000",
        "OTEL_SERVICE_NAME": "fixture-test",
        "RANK": "3",
        "WORLD_SIZE": "8",
    }


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_fixture_over_real_otlp_reaches_the_receiver(sink, protocol):
    handle = running(async_tee.start_telemetry(environ=_sink_environ(sink, protocol)))
    assert handle.is_exporting
    assert handle.owns_provider
    run_fixture()
    assert async_tee.flush(10)
    assert async_tee.shutdown_telemetry(10)  # the final export delivers everything
    received = {key: point for key, point in sink.latest().items() if key[0].startswith("rl.")}
    assert set(received) == set(EXPECTED) | {plain("rl.step"), plain("rl.step.time")}
    assert received[plain("rl.step")].value == 42  # shutdown completes the open step
    for key, value in EXPECTED.items():
        point = received[key]
        assert point.value == pytest.approx(value), key
        assert point.value_type == "double", key
        assert point.protocol == protocol
    some = received[plain("rl.vllm.prompt_tokens")]
    assert (some.kind, some.monotonic, some.unit) == ("sum", True, "{token}")
    resource = some.resource
    assert resource["service.name"] == "fixture-test"
    assert resource["rl.rank"] == 3
    assert resource["rl.world_size"] == 8
    assert resource["service.instance.id"] == f"{resource['rl.run.id']}/rank-3"
    # async_tee's own series travel with them.
    assert "async_tee.enqueued" in sink.names()
    assert "async_tee.dropped" in sink.names()

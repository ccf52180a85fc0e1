"""The public surface: every exported name resolves and says what it does."""

from __future__ import annotations

import inspect

import pytest

import async_tee
from async_tee import metrics, vocabulary

SEED_METRICS_NAMES = [
    "warn_once",
    "ensure_metric_group_registered",
    "record_rl_metrics",
    "create_rl_metric_instruments",
    "efficiency_measurements",
    "efficiency_window",
    "map_efficiency_seconds",
    "map_teed_scalars",
    "tee_rl_metrics_to_otel",
    "setup_phase",
    "map_setup_seconds",
    "_metric_specs",
    "_record",
    "_tee_setup_metrics",
    "_tee_scalars",
    "_tee_efficiency_metrics",
    "_tee_rl_metrics_to_otel",
    "RL_EFFICIENCY_SECONDS_METRIC",
    "RL_EFFICIENCY_PCT_METRIC",
    "RL_EFFICIENCY_MEASUREMENT_ATTR",
    "WALL_CLOCK_MEASUREMENT",
    "COLLECTOR_WALL_CLOCK_MEASUREMENT",
    "THREAD_SECONDS_MEASUREMENT",
    "RL_EFFICIENCY_WINDOW_ATTR",
    "STEP_WINDOW",
    "RUN_WINDOW",
    "RL_SETUP_DURATION_METRIC",
    "RL_SETUP_PHASE_ATTR",
    "_EFFICIENCY_KEY_PREFIX",
    "_EFFICIENCY_SECONDS_SUFFIX",
    "RL_METRIC_GROUP",
    "_EFFICIENCY_SECONDS_KEY",
    "_EFFICIENCY_PCT_KEY_REGISTRY",
    "_SETUP_DURATION_KEY",
    "_REGISTERED",
    "_REGISTRATION_FAILED",
    "_WARNED",
    "_TRAIN_PREFIXES",
    "logger",
]

SEED_VOCABULARY_NAMES = [
    "METRIC_NAME_PREFIX",
    "INIT_TOTAL_CATEGORY",
    "RUN_WINDOW_WALL_CLOCK_CATEGORIES",
    "as_scalar",
    "registry_key",
    "RecordedMetric",
    "TeedMetric",
    "freeze_metrics",
    "_check_not_frozen",
    "register_teed_metrics",
    "teed_metrics",
    "register_recorded_metrics",
    "recorded_metrics",
    "_REGISTERED",
    "_FROZEN",
    "_RECORDED",
]


@pytest.mark.parametrize("name", async_tee.__all__)
def test_every_public_name_resolves_and_is_documented(name):
    obj = getattr(async_tee, name)
    if name == "__version__":
        assert isinstance(obj, str)
        return
    if callable(obj):
        assert inspect.getdoc(obj), f"async_tee.{name} has no docstring"


@pytest.mark.parametrize("name", SEED_METRICS_NAMES)
def test_every_seed_metrics_name_exists(name):
    assert hasattr(metrics, name), f"async_tee.metrics.{name} (seed API) is missing"


@pytest.mark.parametrize("name", SEED_VOCABULARY_NAMES)
def test_every_seed_vocabulary_name_exists(name):
    assert hasattr(vocabulary, name), f"async_tee.vocabulary.{name} (seed API) is missing"


def test_seed_constant_values():
    assert metrics._TRAIN_PREFIXES == ("train", "")
    assert metrics.RL_EFFICIENCY_SECONDS_METRIC == "rl.efficiency.seconds"
    assert metrics.RL_EFFICIENCY_PCT_METRIC == "rl.efficiency.pct"
    assert metrics.RL_SETUP_DURATION_METRIC == "rl.setup.duration"
    assert metrics.RL_SETUP_PHASE_ATTR == "rl.setup.phase"
    assert metrics.RL_METRIC_GROUP == "rl"
    assert metrics._EFFICIENCY_SECONDS_KEY == "efficiency_seconds"
    assert metrics._SETUP_DURATION_KEY == "setup_duration"
    assert vocabulary.METRIC_NAME_PREFIX == "rl."
    assert frozenset({"init/total"}) == vocabulary.RUN_WINDOW_WALL_CLOCK_CATEGORIES


def test_tee_and_record_are_no_ops_until_started():
    async_tee.tee_rl_metrics_to_otel({"reward": 1.0}, "train", 1)
    async_tee.record_rl_metrics({"reward_mean": 1.0})
    async_tee.create_rl_metric_instruments()
    assert async_tee.stats()["enqueued"] == 0
    assert async_tee.flush(0.1) is True
    assert async_tee.shutdown_telemetry(0.1) is True


def test_seed_flags_follow_the_declarations(provider):
    assert metrics._REGISTERED is False
    assert vocabulary._FROZEN is False
    async_tee.start_telemetry(provider)
    assert metrics._REGISTERED is True
    assert metrics._REGISTRATION_FAILED is False
    assert vocabulary._FROZEN is True
    with pytest.raises(AttributeError):
        _ = metrics._NO_SUCH_NAME


def test_seed_private_tee_functions_record_synchronously_into_any_meter(provider, reader, calls):
    from helpers import collect

    meter = provider.get_meter("seed-shape")
    assert metrics.ensure_metric_group_registered()
    setup = next(c for c in calls if c["prefix"] == "timing/setup")
    metrics._tee_setup_metrics(meter, setup["metrics"])
    metrics._tee_scalars(meter, {"reward": 0.25, "vllm/prompt_tokens": 3.0}, 1)
    metrics._tee_efficiency_metrics(meter, {"efficiency/idle/validation_s": 2.0})
    metrics._tee_rl_metrics_to_otel({"loss": 0.5}, "train", 1, meter)
    metrics._record(meter, {"grad_norm": 1.5})
    points = collect(reader)
    assert points[("rl.reward.mean", frozenset())] == 0.25
    assert points[("rl.policy.loss", frozenset())] == 0.5
    assert points[("rl.grad_norm", frozenset())] == 1.5
    assert points[("rl.vllm.prompt_tokens", frozenset())] == 3.0
    assert any(name == "rl.setup.duration" for name, _ in points)
    assert any(
        name == "rl.efficiency.seconds" and ("rl.efficiency.category", "idle/validation") in attrs
        for name, attrs in points
    )


def test_seed_private_tee_uses_the_running_sessions_recorder(provider, reader):
    from helpers import collect, running

    pipeline = running(async_tee.start_telemetry(provider))
    metrics.create_rl_metric_instruments()
    for _ in range(2):  # the session's recorder remembers the step: counted once
        metrics._tee_rl_metrics_to_otel({"vllm/prompt_tokens": 4.0}, "train", 9)
    assert len(pipeline.consumer.recorder.counted) == 1
    assert collect(reader)[("rl.vllm.prompt_tokens", frozenset())] == 4.0

"""Tests for async_tee.mapping: the pure mappers from a Logger dict to rl.* series values."""

from __future__ import annotations

import math

import pytest
from helpers import load_calls

from async_tee._declare.rows import (
    COLLECTOR_WALL_CLOCK_MEASUREMENT,
    DECLARATIONS,
    THREAD_SECONDS_MEASUREMENT,
    WALL_CLOCK_MEASUREMENT,
    EfficiencyCategory,
)
from async_tee._worker.mapping import (
    RUN_WINDOW,
    STEP_WINDOW,
    efficiency_window,
    map_efficiency_pct,
    map_efficiency_seconds,
    map_setup_seconds,
    map_teed_scalars,
    setup_phase,
)
from async_tee.vocabulary import (
    TeedMetric,
    efficiency_categories,
    efficiency_measurements,
    freeze_metrics,
    register_teed_metrics,
    set_efficiency_categories,
)

PCT = "efficiency/efficiency_pct"
PER_STEP = "efficiency/efficiency_pct_is_per_step"


def call(prefix, index=0):
    """The fixture's index-th log_metrics call under ``prefix``."""
    return [c["metrics"] for c in load_calls() if c["prefix"] == prefix][index]


# --------------------------------------------------------------------------- setup phases


@pytest.mark.parametrize(
    ("key", "phase"),
    [
        ("vllm_init_time_s", "vllm_init"),
        ("policy_init_time_s", "policy_init"),
        ("foo_s", "foo"),
        ("a_s", "a"),
        ("x_time_s_s", "x_time_s"),  # only the last suffix goes
        ("time_s", "time"),  # "_time_s" needs its leading underscore
        ("_s", None),
        ("_time_s", None),
        ("s", None),
        ("", None),
        ("parallel_init_enabled", None),
        ("total_setup_time", None),
        ("foo_S", None),
        (None, None),
        (3, None),
        (("a", "_s"), None),
        (b"foo_s", None),
    ],
)
def test_setup_phase(key, phase):
    assert setup_phase(key) == phase


def test_map_setup_seconds_on_the_fixture():
    setup = call("timing/setup")
    assert "parallel_init_enabled" in setup  # the flag is really there to be excluded
    assert map_setup_seconds(setup) == {
        "vllm_init": 71.8,
        "policy_init": 94.2,
        "parallel_wall": 95.0,
        "collective_init": 6.4,
        "total_setup": 141.3,
        "other_setup": 39.9,
    }


def test_map_setup_seconds_excludes_non_numbers_and_takes_bools_as_0_or_1():
    result = map_setup_seconds(
        {
            "good_time_s": 1.5,
            "int_s": 2,
            "flag_s": True,
            "off_time_s": False,
            "text_s": "3.0",
            "list_s": [1.0],
            "dict_time_s": {"a": 1.0},
            "none_s": None,
            "_s": 9.0,
            "_time_s": 9.0,
            "enabled": 1.0,
            7: 1.0,  # type: ignore[dict-item]
        }
    )
    assert result == {"good": 1.5, "int": 2.0, "flag": 1.0, "off": 0.0}
    assert type(result["int"]) is float


def test_map_setup_seconds_keeps_nan_as_nan():
    result = map_setup_seconds({"vllm_init_time_s": math.nan, "ok_s": 1.0})
    assert set(result) == {"vllm_init", "ok"}
    assert math.isnan(result["vllm_init"])


def test_map_setup_seconds_returns_a_new_dict():
    source = {"a_s": 1.0}
    result = map_setup_seconds(source)
    result["b"] = 2.0
    assert source == {"a_s": 1.0}


# -------------------------------------------------------------------------- efficiency


DEFAULT_CATEGORIES = {
    "init/total": EfficiencyCategory(WALL_CLOCK_MEASUREMENT, "overhead"),
    "idle/buffer_starvation": EfficiencyCategory(WALL_CLOCK_MEASUREMENT, "idle"),
    "idle/refit_bubble": EfficiencyCategory(WALL_CLOCK_MEASUREMENT, "idle"),
    "idle/validation": EfficiencyCategory(WALL_CLOCK_MEASUREMENT, "idle"),
    "idle/buffer_full_backoff": EfficiencyCategory(THREAD_SECONDS_MEASUREMENT, "idle"),
    "wasted/failed_trajectory": EfficiencyCategory(THREAD_SECONDS_MEASUREMENT, "wasted"),
    "idle/generation_limit_pause": EfficiencyCategory(COLLECTOR_WALL_CLOCK_MEASUREMENT, "idle"),
    "idle/refit_event_wait": EfficiencyCategory(COLLECTOR_WALL_CLOCK_MEASUREMENT, "idle"),
}


def test_default_categories_match_the_spec_table():
    assert efficiency_categories() == DEFAULT_CATEGORIES
    assert efficiency_measurements() == {
        category: spec.measurement for category, spec in DEFAULT_CATEGORIES.items()
    }


def test_efficiency_categories_returns_a_copy():
    efficiency_categories()["x"] = EfficiencyCategory(WALL_CLOCK_MEASUREMENT)
    efficiency_measurements()["y"] = WALL_CLOCK_MEASUREMENT
    assert "x" not in efficiency_categories()
    assert "y" not in efficiency_measurements()


@pytest.mark.parametrize(
    ("category", "measurement", "window"),
    [
        ("init/total", WALL_CLOCK_MEASUREMENT, RUN_WINDOW),
        ("idle/buffer_starvation", WALL_CLOCK_MEASUREMENT, STEP_WINDOW),
        ("idle/refit_bubble", WALL_CLOCK_MEASUREMENT, STEP_WINDOW),
        ("idle/validation", WALL_CLOCK_MEASUREMENT, STEP_WINDOW),
        ("any/new_category", WALL_CLOCK_MEASUREMENT, STEP_WINDOW),
        ("idle/buffer_full_backoff", THREAD_SECONDS_MEASUREMENT, RUN_WINDOW),
        ("wasted/failed_trajectory", THREAD_SECONDS_MEASUREMENT, RUN_WINDOW),
        ("idle/generation_limit_pause", COLLECTOR_WALL_CLOCK_MEASUREMENT, RUN_WINDOW),
        ("idle/refit_event_wait", COLLECTOR_WALL_CLOCK_MEASUREMENT, RUN_WINDOW),
        ("init/total", THREAD_SECONDS_MEASUREMENT, RUN_WINDOW),
        ("init/total", COLLECTOR_WALL_CLOCK_MEASUREMENT, RUN_WINDOW),
    ],
)
def test_efficiency_window(category, measurement, window):
    assert efficiency_window(category, measurement) == window


def test_window_constants():
    assert (STEP_WINDOW, RUN_WINDOW) == ("step", "run")
    assert (WALL_CLOCK_MEASUREMENT, COLLECTOR_WALL_CLOCK_MEASUREMENT) == (
        "wall_clock",
        "collector_wall_clock",
    )
    assert THREAD_SECONDS_MEASUREMENT == "thread_seconds"


def test_map_efficiency_seconds_on_the_fixture():
    metrics = call("")
    result = map_efficiency_seconds(metrics, efficiency_measurements())
    assert result == {
        "init/total": 182.4,
        "idle/buffer_starvation": 0.5,
        "idle/refit_bubble": 3.8,
        "idle/validation": 0.0,
        "idle/buffer_full_backoff": 812.0,
        "wasted/failed_trajectory": 0.0,
        "idle/generation_limit_pause": 95.3,
        "idle/refit_event_wait": 41.7,
    }
    # the aggregate keys really are in the dict, sharing the prefix and suffix
    for aggregate in ("total_waste", "productive_time", "total_wall_time", "thread_seconds_total"):
        assert f"efficiency/{aggregate}_s" in metrics
        assert aggregate not in result


def test_map_efficiency_seconds_reads_only_the_given_categories():
    metrics = {
        "efficiency/a_s": 1.0,
        "efficiency/b_s": 2.0,
        "efficiency/total_waste_s": 3.0,
        "a_s": 4.0,
        "efficiency/a": 5.0,
    }
    assert map_efficiency_seconds(metrics, {"a": WALL_CLOCK_MEASUREMENT}) == {"a": 1.0}
    assert map_efficiency_seconds(metrics, {}) == {}


def test_map_efficiency_seconds_skips_absent_and_non_scalar_values_keeps_nan():
    metrics = {
        "efficiency/a_s": None,
        "efficiency/b_s": "1.0",
        "efficiency/c_s": b"1",
        "efficiency/d_s": [1.0],
        "efficiency/e_s": math.nan,
        "efficiency/f_s": 2,
    }
    categories = dict.fromkeys("abcdefg", WALL_CLOCK_MEASUREMENT)
    result = map_efficiency_seconds(metrics, categories)
    assert set(result) == {"e", "f"}
    assert math.isnan(result["e"])
    assert result["f"] == 2.0
    assert type(result["f"]) is float


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param({PER_STEP: 1.0}, (93.3, STEP_WINDOW), id="flag-1.0"),
        pytest.param({PER_STEP: True}, (93.3, STEP_WINDOW), id="flag-true"),
        pytest.param({PER_STEP: 1}, (93.3, STEP_WINDOW), id="flag-int"),
        pytest.param({}, (93.3, RUN_WINDOW), id="flag-absent"),
        pytest.param({PER_STEP: None}, (93.3, RUN_WINDOW), id="flag-none"),
        pytest.param({PER_STEP: 0}, (93.3, RUN_WINDOW), id="flag-0"),
        pytest.param({PER_STEP: 0.0}, (93.3, RUN_WINDOW), id="flag-0.0"),
        pytest.param({PER_STEP: False}, (93.3, RUN_WINDOW), id="flag-false"),
        pytest.param({PER_STEP: math.nan}, (93.3, RUN_WINDOW), id="flag-nan"),
    ],
)
def test_map_efficiency_pct_window(extra, expected):
    assert map_efficiency_pct({PCT: 93.3, **extra}) == expected


def test_map_efficiency_pct_numpy_flags():
    np = pytest.importorskip("numpy")
    assert map_efficiency_pct({PCT: 1.0, PER_STEP: np.float64(1.0)}) == (1.0, STEP_WINDOW)
    assert map_efficiency_pct({PCT: 1.0, PER_STEP: np.float64("nan")}) == (1.0, RUN_WINDOW)
    # an array has no truth value: unknown, so run
    assert map_efficiency_pct({PCT: 1.0, PER_STEP: np.array([1.0, 1.0])}) == (1.0, RUN_WINDOW)


@pytest.mark.parametrize(
    "metrics",
    [
        pytest.param({}, id="absent"),
        pytest.param({PCT: None, PER_STEP: 1.0}, id="none"),
        pytest.param({PCT: "93.3", PER_STEP: 1.0}, id="str"),
        pytest.param({PCT: b"93.3", PER_STEP: 1.0}, id="bytes"),
        pytest.param({PCT: [93.3], PER_STEP: 1.0}, id="list"),
        pytest.param({PCT: {"v": 93.3}}, id="dict"),
        pytest.param({"efficiency/init/total_pct": 2.9, PER_STEP: 1.0}, id="other-pct-only"),
    ],
)
def test_map_efficiency_pct_without_a_usable_pct(metrics):
    assert map_efficiency_pct(metrics) is None


def test_map_efficiency_pct_on_the_fixture():
    assert map_efficiency_pct(call("")) == (93.3, STEP_WINDOW)


def test_map_efficiency_pct_nan_value_is_passed_on():
    result = map_efficiency_pct({PCT: math.nan})
    assert result is not None
    value, window = result
    assert math.isnan(value)
    assert window == RUN_WINDOW


# ---------------------------------------------------------------------- teed scalars


def test_map_teed_scalars_on_the_rollout_train_dict():
    assert map_teed_scalars(call("train", 0)) == {
        "response_length_mean": 257.6,
        "reward_total_mean": 0.5234,
        "truncation_ratio": 0.043,
    }


def test_map_teed_scalars_on_the_full_train_dict():
    result = map_teed_scalars(call("train", 1))
    assert result == {
        "reward_mean": 0.5234,
        "reward_total_mean": 0.5234,
        "generation_kl_error": 0.00091,
        "logprob_token_mult_error": 1.0131,
        "truncation_ratio": 0.043,
        "kl_divergence": 0.00087,
        "policy_loss": -0.0123,
        "entropy": 0.412,
        "response_length_mean": 257.6,
        "grad_norm": 0.2871,
        "learning_rate": 5e-06,
        "vllm_prompt_tokens": 49152.0,
        "vllm_generation_tokens": 131891.0,
        "vllm_generations_ok": 512.0,
        "vllm_generations_failed": 0.0,
        "vllm_prompt_length_mean": 96.0,
        "vllm_generation_length_mean": 257.6,
    }
    # critic/loss is not logged by GRPO: absent, not zero
    assert "value_loss" not in result
    assert all(type(v) is float for v in result.values())


@pytest.mark.parametrize("prefix", ["timing/setup", "", "performance", "timing/train", "ray"])
def test_map_teed_scalars_on_other_dicts_is_empty(prefix):
    assert map_teed_scalars(call(prefix)) == {}


def test_map_teed_scalars_skips_none_and_non_scalars():
    result = map_teed_scalars(
        {
            "reward": None,
            "loss": "0.5",
            "grad_norm": b"1",
            "lr": [1e-5],
            "kl_penalty": math.inf,
            "vllm/prompt_tokens": 3,
            "critic/loss": 0.25,
        }
    )
    assert set(result) == {"kl_divergence", "vllm_prompt_tokens", "value_loss"}
    assert result["kl_divergence"] == math.inf
    assert result["vllm_prompt_tokens"] == 3.0
    assert result["value_loss"] == 0.25


def test_map_teed_scalars_uses_the_declared_rows():
    register_teed_metrics([TeedMetric("reward", "rl.reward.custom"), TeedMetric("x/y", "rl.x")])
    result = map_teed_scalars({"reward": 1.0, "x/y": 2.0, "loss": 3.0})
    assert result == {"reward_custom": 1.0, "x": 2.0, "policy_loss": 3.0}


def test_map_teed_scalars_with_explicit_rows():
    rows = [TeedMetric("a", "rl.a.b")]
    assert map_teed_scalars({"a": 1.0, "reward": 2.0}, rows) == {"a_b": 1.0}
    assert map_teed_scalars({"a": 1.0, "reward": 2.0}, []) == {}


# ------------------------------------------------------------- set_efficiency_categories


def test_set_efficiency_categories_replaces_the_map():
    set_efficiency_categories(
        {
            "custom/x": WALL_CLOCK_MEASUREMENT,
            "custom/y": EfficiencyCategory(THREAD_SECONDS_MEASUREMENT, "idle"),
        }
    )
    assert efficiency_categories() == {
        "custom/x": EfficiencyCategory(WALL_CLOCK_MEASUREMENT, None),
        "custom/y": EfficiencyCategory(THREAD_SECONDS_MEASUREMENT, "idle"),
    }
    assert efficiency_measurements() == {
        "custom/x": WALL_CLOCK_MEASUREMENT,
        "custom/y": THREAD_SECONDS_MEASUREMENT,
    }
    metrics = {"efficiency/custom/x_s": 1.0, "efficiency/init/total_s": 2.0}
    assert map_efficiency_seconds(metrics, efficiency_measurements()) == {"custom/x": 1.0}


def test_set_efficiency_categories_to_empty():
    set_efficiency_categories({})
    assert efficiency_measurements() == {}


@pytest.mark.parametrize(
    "categories",
    [
        pytest.param({"": WALL_CLOCK_MEASUREMENT}, id="empty-category"),
        pytest.param({3: WALL_CLOCK_MEASUREMENT}, id="non-str-category"),
        pytest.param({None: WALL_CLOCK_MEASUREMENT}, id="none-category"),
        pytest.param({"a": "cpu_seconds"}, id="unknown-measurement"),
        pytest.param({"a": "WALL_CLOCK"}, id="measurement-case"),
        pytest.param({"a": EfficiencyCategory("bogus", "idle")}, id="unknown-in-dataclass"),
        pytest.param({"a": 3}, id="int-spec"),
        pytest.param({"a": None}, id="none-spec"),
        pytest.param({"ok": WALL_CLOCK_MEASUREMENT, "bad": "bogus"}, id="one-bad-among-good"),
    ],
)
def test_set_efficiency_categories_validation(categories):
    before = efficiency_categories()
    with pytest.raises(ValueError, match="efficiency category"):
        set_efficiency_categories(categories)
    assert efficiency_categories() == before


def test_set_efficiency_categories_after_freeze_raises():
    freeze_metrics()
    before = efficiency_categories()
    with pytest.raises(RuntimeError, match="registration is closed"):
        set_efficiency_categories({"custom/x": WALL_CLOCK_MEASUREMENT})
    assert efficiency_categories() == before


def test_categories_are_declarations_reset_between_tests():
    assert DECLARATIONS.categories == DEFAULT_CATEGORIES

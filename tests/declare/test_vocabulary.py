"""Tests for async_tee.vocabulary: scalar coercion, registry keys, row declaration."""

from __future__ import annotations

import enum
import math
import warnings
from decimal import Decimal
from fractions import Fraction

import pytest

from async_tee import vocabulary
from async_tee._declare import shipped as default_rows
from async_tee.vocabulary import (
    RecordedMetric,
    TeedMetric,
    as_scalar,
    freeze_metrics,
    recorded_metrics,
    register_recorded_metrics,
    register_teed_metrics,
    registry_key,
    teed_metrics,
)

# --------------------------------------------------------------------------- as_scalar


class Level(enum.IntEnum):
    HIGH = 7


class MyFloat(float):
    pass


class MyInt(int):
    pass


class FloatRaises:
    def __float__(self):
        raise RuntimeError("no float for you")


class FloatRaisesValueError:
    def __float__(self):
        raise ValueError("nope")


class FloatReturnsStr:
    def __float__(self):
        return "1.0"


class FloatSubRaises(float):
    def __float__(self):
        raise RuntimeError("float subclass that refuses")


class PlainFloatable:
    """Not numeric by type, but with a working __float__: accepted as a real number."""

    def __float__(self):
        return 4.25


class NoFloat:
    pass


class _Device:
    def __init__(self, kind):
        self.type = kind


class FakeTensor:
    """A torch-like scalar: shape, dtype and device; counts every __float__ call."""

    def __init__(self, value, shape=(), dtype="torch.float32", device="cpu"):
        self.value = value
        self.shape = shape
        self.dtype = dtype
        self.device = _Device(device)
        self.float_calls = 0

    def __float__(self):
        self.float_calls += 1
        return float(self.value)

    def reshape(self, shape):  # torch and numpy read a one-element value as a 0-d one
        self.shape = shape
        return self


class CudaTensor(FakeTensor):
    """Reading it would force a device sync: __float__ must never be called."""

    def __init__(self):
        super().__init__(1.0, device="cuda")

    def __float__(self):
        self.float_calls += 1
        raise AssertionError("as_scalar read a CUDA tensor (forces a device sync)")


class BadShape:
    """shape is not iterable: a foreign object whose shape cannot be trusted."""

    shape = 5
    dtype = "float32"

    def __float__(self):
        return 1.0


class ShapeRaises:
    dtype = "float32"

    @property
    def shape(self):
        raise RuntimeError("shape exploded")

    def __float__(self):
        return 1.0


HUGE = 10**400


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(3, 3.0, id="int"),
        pytest.param(0, 0.0, id="int-zero"),
        pytest.param(-(2**53), -(2.0**53), id="int-big-negative"),
        pytest.param(2.5, 2.5, id="float"),
        pytest.param(-0.0, -0.0, id="negative-zero"),
        pytest.param(HUGE, None, id="huge-int"),
        pytest.param(-HUGE, None, id="huge-negative-int"),
        pytest.param(MyInt(HUGE), None, id="huge-int-subclass"),
        pytest.param(True, 1.0, id="bool-true"),
        pytest.param(False, 0.0, id="bool-false"),
        pytest.param("1.0", None, id="str"),
        pytest.param("", None, id="empty-str"),
        pytest.param(b"1.0", None, id="bytes"),
        pytest.param(bytearray(b"1"), None, id="bytearray"),
        pytest.param(None, None, id="none"),
        pytest.param([1.0], None, id="list"),
        pytest.param([], None, id="empty-list"),
        pytest.param({"a": 1.0}, None, id="dict"),
        pytest.param((1.0,), None, id="tuple"),
        pytest.param({1.0}, None, id="set"),
        pytest.param(1 + 0j, None, id="complex"),
        pytest.param(Decimal("1.5"), 1.5, id="decimal"),
        pytest.param(Decimal("sNaN"), None, id="decimal-signalling-nan"),
        pytest.param(Fraction(1, 4), 0.25, id="fraction"),
        pytest.param(Fraction(HUGE), None, id="fraction-overflow"),
        pytest.param(Level.HIGH, 7.0, id="int-enum"),
        pytest.param(MyFloat(1.25), 1.25, id="float-subclass"),
        pytest.param(FloatRaises(), None, id="float-raises-runtime"),
        pytest.param(FloatRaisesValueError(), None, id="float-raises-value"),
        pytest.param(FloatSubRaises(2.0), None, id="float-subclass-float-raises"),
        pytest.param(FloatReturnsStr(), None, id="float-returns-str"),
        pytest.param(PlainFloatable(), 4.25, id="object-with-float"),
        pytest.param(NoFloat(), None, id="object-without-float"),
        pytest.param(object(), None, id="bare-object"),
        pytest.param(float, None, id="the-float-type"),
        pytest.param(BadShape(), None, id="uniterable-shape"),
        pytest.param(ShapeRaises(), None, id="shape-raises"),
    ],
)
def test_as_scalar(value, expected):
    result = as_scalar(value)
    if expected is None:
        assert result is None
    else:
        assert type(result) is float
        assert result == expected
        assert math.copysign(1.0, result) == math.copysign(1.0, expected)


@pytest.mark.parametrize(
    ("value", "check"),
    [
        pytest.param(math.nan, math.isnan, id="nan"),
        pytest.param(math.inf, lambda v: v == math.inf, id="inf"),
        pytest.param(-math.inf, lambda v: v == -math.inf, id="-inf"),
        pytest.param(MyFloat("nan"), math.isnan, id="float-subclass-nan"),
        pytest.param(Decimal("NaN"), math.isnan, id="decimal-nan"),
        pytest.param(Decimal("1e400"), lambda v: v == math.inf, id="decimal-beyond-float"),
    ],
)
def test_as_scalar_returns_non_finite_floats_as_they_are(value, check):
    result = as_scalar(value)
    assert type(result) is float
    assert check(result)


def _numpy_cases():
    np = pytest.importorskip("numpy")
    return np


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        pytest.param(lambda np: np.float32(1.5), 1.5, id="float32"),
        pytest.param(lambda np: np.float64(2.25), 2.25, id="float64"),
        pytest.param(lambda np: np.float16(0.5), 0.5, id="float16"),
        pytest.param(lambda np: np.int64(7), 7.0, id="int64"),
        pytest.param(lambda np: np.int64(2**62), float(2**62), id="int64-large"),
        pytest.param(lambda np: np.uint8(255), 255.0, id="uint8"),
        pytest.param(lambda np: np.bool_(True), 1.0, id="bool_-true"),
        pytest.param(lambda np: np.bool_(False), 0.0, id="bool_-false"),
        pytest.param(lambda np: np.array(3.5), 3.5, id="0d-array"),
        pytest.param(lambda np: np.array(4, dtype=np.int32), 4.0, id="0d-int-array"),
        pytest.param(lambda np: np.array(True), 1.0, id="0d-bool-array"),
        pytest.param(lambda np: np.array("1.0"), None, id="0d-str-array"),
        pytest.param(lambda np: np.array([1.0]), 1.0, id="1-element-array"),
        pytest.param(lambda np: np.array([[1.0]]), 1.0, id="1x1-array"),
        pytest.param(lambda np: np.array([1.0, 2.0]), None, id="multi-element-array"),
        pytest.param(lambda np: np.array([]), None, id="empty-array"),
        pytest.param(lambda np: np.str_("1.0"), None, id="numpy-str"),
        pytest.param(lambda np: np.complex128(1.0), None, id="complex128"),
        pytest.param(lambda np: np.complex64(1 + 2j), None, id="complex64"),
        pytest.param(lambda np: np.array(1 + 2j), None, id="0d-complex-array"),
        pytest.param(lambda np: np.array(b"1.5"), None, id="0d-bytes-array"),
        pytest.param(lambda np: np.array("1.0", dtype=object), None, id="0d-object-array"),
        pytest.param(lambda np: np.timedelta64(5, "s"), None, id="timedelta64"),
        pytest.param(lambda np: np.datetime64("2020-01-01"), None, id="datetime64"),
    ],
)
def test_as_scalar_numpy(make, expected):
    np = _numpy_cases()
    value = make(np)
    # record rather than raise, so that a value accepted with a warning (numpy's
    # ComplexWarning when float() drops an imaginary part) is seen as accepted
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = as_scalar(value)
    assert [str(w.message) for w in caught] == []
    if expected is None:
        assert result is None
    else:
        assert type(result) is float
        assert result == expected


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda np: np.float32("nan"), id="float32-nan"),
        pytest.param(lambda np: np.float64("inf"), id="float64-inf"),
        pytest.param(lambda np: np.array(np.nan), id="0d-nan"),
    ],
)
def test_as_scalar_numpy_non_finite(make):
    np = _numpy_cases()
    result = as_scalar(make(np))
    assert type(result) is float
    assert not math.isfinite(result)


def test_cuda_tensor_is_refused_without_reading_it():
    tensor = CudaTensor()
    assert as_scalar(tensor) is None
    assert tensor.float_calls == 0


@pytest.mark.parametrize(
    ("tensor", "expected", "reads"),
    [
        pytest.param(FakeTensor(0.75), 0.75, 1, id="cpu-scalar"),
        pytest.param(FakeTensor(3, dtype="torch.int64"), 3.0, 1, id="cpu-int-scalar"),
        pytest.param(FakeTensor(1.0, shape=(1,)), 1.0, 1, id="cpu-1-element"),
        pytest.param(FakeTensor(1.0, shape=(2, 2)), None, 0, id="cpu-matrix"),
        pytest.param(FakeTensor(1.0, dtype="torch.bool"), 1.0, 1, id="cpu-bool"),
        pytest.param(FakeTensor(1.0, device="mps"), None, 0, id="mps"),
        pytest.param(FakeTensor(1.0, device="cuda"), None, 0, id="cuda"),
        pytest.param(FakeTensor(1.0, shape=(1,), device="cuda"), None, 0, id="cuda-1-element"),
    ],
)
def test_as_scalar_tensor_like(tensor, expected, reads):
    result = as_scalar(tensor)
    if expected is None:
        assert result is None
    else:
        assert type(result) is float
        assert result == expected
    assert tensor.float_calls == reads


# ------------------------------------------------------------------------- registry_key


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("rl.reward.mean", "reward_mean"),
        ("rl.entropy", "entropy"),
        ("rl.grad_norm", "grad_norm"),
        ("rl.vllm.generations.ok", "vllm_generations_ok"),
        ("rl.efficiency.seconds", "efficiency_seconds"),
        ("rl.rl.x", "rl_x"),  # only the leading prefix goes
        ("other.series", "other_series"),
        ("rlx.y", "rlx_y"),  # "rl" without the dot is not the prefix
        ("plain", "plain"),
    ],
)
def test_registry_key(name, key):
    assert registry_key(name) == key


def test_row_key_is_the_registry_key():
    assert TeedMetric("reward", "rl.reward.mean").key == "reward_mean"
    assert RecordedMetric("rl.host.memory.used").key == "host_memory_used"


# --------------------------------------------------------------- register_teed_metrics


def names():
    return [row.name for row in teed_metrics()]


def by_logger_key():
    return {row.logger_key: row.name for row in teed_metrics()}


def test_defaults_are_declared_in_order():
    shipped = (
        default_rows.TRAINING_SCALARS
        + default_rows.VLLM_DELTAS
        + default_rows.TRAINING_GAUGES
        + default_rows.THROUGHPUT
        + default_rows.STEP_TIMING
        + default_rows.VALIDATION
        + default_rows.EFFICIENCY_TOTALS
        + default_rows.ROLLOUT_WATCHDOG
    )
    expected = [row.name for row in shipped]
    assert names() == expected
    assert by_logger_key()["reward"] == "rl.reward.mean"
    assert by_logger_key()["vllm/prompt_tokens"] == "rl.vllm.prompt_tokens"


def test_teed_metrics_keeps_declaration_order():
    before = names()
    register_teed_metrics([TeedMetric("z", "rl.z"), TeedMetric("a", "rl.a")])
    register_teed_metrics([TeedMetric("m", "rl.m")])
    assert names() == [*before, "rl.z", "rl.a", "rl.m"]


def test_duplicate_logger_key_is_refused():
    register_teed_metrics([TeedMetric("my/key", "rl.mine")])
    with pytest.raises(ValueError, match="my/key"):
        register_teed_metrics([TeedMetric("my/key", "rl.other")])
    assert by_logger_key()["my/key"] == "rl.mine"
    assert "rl.other" not in names()


def test_duplicate_series_name_is_refused():
    register_teed_metrics([TeedMetric("my/key", "rl.mine")])
    with pytest.raises(ValueError, match=r"rl\.mine"):
        register_teed_metrics([TeedMetric("other/key", "rl.mine")])
    assert "other/key" not in by_logger_key()


def test_identical_row_twice_is_a_no_op():
    row = TeedMetric("my/key", "rl.mine", kind="counter", unit="s", description="d")
    register_teed_metrics([row])
    before = teed_metrics()
    register_teed_metrics([row])
    register_teed_metrics([TeedMetric("my/key", "rl.mine", "counter", "s", "d")])
    assert teed_metrics() == before


def test_identical_default_row_redeclared_is_a_no_op():
    before = teed_metrics()
    register_teed_metrics(default_rows.TRAINING_SCALARS)
    default_rows.declare_defaults()
    assert teed_metrics() == before


def test_same_key_same_name_other_attributes_collides():
    register_teed_metrics([TeedMetric("my/key", "rl.mine", unit="s")])
    with pytest.raises(ValueError, match="my/key"):
        register_teed_metrics([TeedMetric("my/key", "rl.mine", unit="ms")])


@pytest.mark.parametrize(
    "rows",
    [
        pytest.param([TeedMetric("k", "rl.a"), TeedMetric("k", "rl.b")], id="same-key"),
        pytest.param([TeedMetric("k1", "rl.a"), TeedMetric("k2", "rl.a")], id="same-name"),
        pytest.param(
            [TeedMetric("k", "rl.a"), TeedMetric("k", "rl.a", kind="counter")],
            id="same-key-and-name-other-kind",
        ),
    ],
)
def test_collision_within_one_call_declares_nothing(rows):
    before = teed_metrics()
    with pytest.raises(ValueError, match="collide"):
        register_teed_metrics(rows)
    assert teed_metrics() == before


def test_identical_rows_within_one_call_are_declared_once():
    register_teed_metrics([TeedMetric("k", "rl.a"), TeedMetric("k", "rl.a")])
    assert names().count("rl.a") == 1


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("rl.bad name", id="space"),
        pytest.param("9rl", id="leading-digit"),
        pytest.param("", id="empty"),
        pytest.param(".rl", id="leading-dot"),
        pytest.param("r" + "a" * 255, id="256-chars"),
        pytest.param("rl.é", id="non-ascii"),
        pytest.param("rl.a-b", id="key-not-identifier-dash"),
        pytest.param("rl.a/b", id="key-not-identifier-slash"),
        pytest.param("rl.1a", id="key-starts-with-digit"),
        pytest.param(None, id="not-a-str"),
    ],
)
def test_bad_series_name_is_refused(name):
    before = teed_metrics()
    with pytest.raises(ValueError, match="series name"):
        register_teed_metrics([TeedMetric("k", name)])
    assert teed_metrics() == before


def test_longest_valid_name_is_accepted():
    name = "rl." + "a" * 252
    assert len(name) == 255
    register_teed_metrics([TeedMetric("k", name)])
    assert names()[-1] == name


@pytest.mark.parametrize(
    "unit",
    [
        pytest.param("µs", id="micro-sign"),
        pytest.param("a" * 64, id="64-chars"),
        pytest.param(None, id="not-a-str"),
    ],
)
def test_bad_unit_is_refused(unit):
    with pytest.raises(ValueError, match="unit"):
        register_teed_metrics([TeedMetric("k", "rl.k", unit=unit)])
    assert "rl.k" not in names()


def test_longest_valid_unit_is_accepted():
    register_teed_metrics([TeedMetric("k", "rl.k", unit="a" * 63)])
    assert "rl.k" in names()


@pytest.mark.parametrize(
    "kind",
    ["observable_gauge", "observable_counter", "observable_up_down_counter", "summary", ""],
)
def test_bad_kind_for_a_teed_row_is_refused(kind):
    with pytest.raises(ValueError, match="kind"):
        register_teed_metrics([TeedMetric("k", "rl.k", kind=kind)])
    assert "rl.k" not in names()


@pytest.mark.parametrize("kind", ["gauge", "counter", "histogram", "up_down_counter"])
def test_every_synchronous_kind_is_accepted_for_a_teed_row(kind):
    register_teed_metrics([TeedMetric("k", "rl.k", kind=kind)])
    assert teed_metrics()[-1] == TeedMetric("k", "rl.k", kind=kind)


@pytest.mark.parametrize("logger_key", ["", None, 3])
def test_bad_logger_key_is_refused(logger_key):
    with pytest.raises(ValueError, match="logger_key"):
        register_teed_metrics([TeedMetric(logger_key, "rl.k")])


def test_a_bad_row_anywhere_in_the_call_declares_nothing():
    before = teed_metrics()
    with pytest.raises(ValueError, match=r"rl\.bad name"):
        register_teed_metrics([TeedMetric("ok", "rl.ok"), TeedMetric("bad", "rl.bad name")])
    assert teed_metrics() == before


def test_a_collision_anywhere_in_the_call_declares_nothing():
    register_teed_metrics([TeedMetric("taken", "rl.taken")])
    before = teed_metrics()
    with pytest.raises(ValueError, match="taken"):
        register_teed_metrics([TeedMetric("fresh", "rl.fresh"), TeedMetric("taken", "rl.x")])
    assert teed_metrics() == before


def test_a_failed_call_does_not_withdraw_the_default_it_would_replace():
    register_teed_metrics([TeedMetric("taken", "rl.taken")])
    before = teed_metrics()
    with pytest.raises(ValueError, match="taken"):
        register_teed_metrics(
            [TeedMetric("reward", "rl.my.reward"), TeedMetric("other", "rl.taken")]
        )
    assert teed_metrics() == before
    assert by_logger_key()["reward"] == "rl.reward.mean"


def test_one_call_may_replace_two_defaults_by_key_and_by_name():
    register_teed_metrics(
        [TeedMetric("reward", "rl.my.reward"), TeedMetric("my_loss", "rl.policy.loss")]
    )
    keys = by_logger_key()
    assert keys["reward"] == "rl.my.reward"
    assert keys["my_loss"] == "rl.policy.loss"
    assert "loss" not in keys
    assert "rl.reward.mean" not in names()


def test_a_default_is_not_replaced_by_another_default():
    with pytest.raises(ValueError, match="reward"):
        vocabulary.declare_teed([TeedMetric("reward", "rl.other.default")], default=True)
    assert by_logger_key()["reward"] == "rl.reward.mean"


def test_not_a_teed_metric_is_refused():
    with pytest.raises(ValueError, match="TeedMetric"):
        register_teed_metrics([RecordedMetric("rl.k")])  # type: ignore[list-item]


def test_registration_after_freeze_raises_naming_the_series():
    freeze_metrics()
    with pytest.raises(RuntimeError, match=r"rl\.late\.series"):
        register_teed_metrics([TeedMetric("late", "rl.late.series")])
    assert "rl.late.series" not in names()


def test_identical_row_after_freeze_is_a_no_op_but_a_changed_one_raises():
    # An owner module imported again after telemetry started (a reload) must not crash.
    freeze_metrics()
    register_teed_metrics([default_rows.TRAINING_SCALARS[0]])
    with pytest.raises(RuntimeError, match=r"rl\.reward\.mean"):
        register_teed_metrics([TeedMetric("reward", "rl.reward.mean", unit="{point}")])
    assert by_logger_key()["reward"] == "rl.reward.mean"


def test_identical_recorded_row_after_freeze_is_a_no_op():
    row = RecordedMetric("rl.host.memory", unit="By")
    register_recorded_metrics([row])
    freeze_metrics()
    register_recorded_metrics([row])
    assert recorded_metrics() == (row,)


def test_recorded_registration_after_freeze_raises_naming_the_series():
    freeze_metrics()
    with pytest.raises(RuntimeError, match=r"rl\.host\.memory"):
        register_recorded_metrics([RecordedMetric("rl.host.memory")])
    assert recorded_metrics() == ()


def test_user_row_with_the_default_logger_key_replaces_the_default():
    register_teed_metrics([TeedMetric("reward", "rl.reward.custom")])
    assert by_logger_key()["reward"] == "rl.reward.custom"
    assert "rl.reward.mean" not in names()
    # the other defaults are untouched
    assert by_logger_key()["loss"] == "rl.policy.loss"


def test_user_row_with_the_default_series_name_replaces_the_default():
    register_teed_metrics([TeedMetric("my_reward", "rl.reward.mean", unit="{point}")])
    assert "reward" not in by_logger_key()
    assert by_logger_key()["my_reward"] == "rl.reward.mean"
    assert names().count("rl.reward.mean") == 1
    assert next(r for r in teed_metrics() if r.name == "rl.reward.mean").unit == "{point}"


def test_user_row_with_same_key_and_name_but_new_unit_replaces_the_default():
    register_teed_metrics([TeedMetric("reward", "rl.reward.mean", unit="{point}")])
    assert [r.unit for r in teed_metrics() if r.logger_key == "reward"] == ["{point}"]


def test_a_replaced_default_is_no_longer_replaceable_by_another_user_row():
    register_teed_metrics([TeedMetric("reward", "rl.reward.custom")])
    with pytest.raises(ValueError, match="reward"):
        register_teed_metrics([TeedMetric("reward", "rl.reward.other")])
    with pytest.raises(ValueError, match=r"rl\.reward\.custom"):
        register_teed_metrics([TeedMetric("other", "rl.reward.custom")])


def test_user_rows_collide_with_each_other_not_only_with_defaults():
    register_teed_metrics([TeedMetric("a", "rl.a")])
    with pytest.raises(ValueError, match="logger key 'a'"):
        register_teed_metrics([TeedMetric("a", "rl.reward.mean")])
    # the failed call must not have withdrawn the default it tried to replace
    assert by_logger_key()["reward"] == "rl.reward.mean"


# ----------------------------------------------------------- register_recorded_metrics


def _observe(_options):
    return []


@pytest.mark.parametrize(
    "kind", ["observable_gauge", "observable_counter", "observable_up_down_counter"]
)
def test_observable_recorded_row_needs_a_callback(kind):
    with pytest.raises(ValueError, match="callback"):
        register_recorded_metrics([RecordedMetric("rl.obs", kind=kind)])
    assert recorded_metrics() == ()
    register_recorded_metrics([RecordedMetric("rl.obs", kind=kind, callback=_observe)])
    assert [row.name for row in recorded_metrics()] == ["rl.obs"]


@pytest.mark.parametrize("kind", ["gauge", "counter", "histogram", "up_down_counter"])
def test_synchronous_recorded_row_refuses_a_callback(kind):
    with pytest.raises(ValueError, match="callback"):
        register_recorded_metrics([RecordedMetric("rl.sync", kind=kind, callback=_observe)])
    assert recorded_metrics() == ()
    register_recorded_metrics([RecordedMetric("rl.sync", kind=kind)])
    assert [row.kind for row in recorded_metrics()] == [kind]


@pytest.mark.parametrize(
    ("name", "kind", "unit", "match"),
    [
        ("rl.bad name", "gauge", "", "series name"),
        ("rl.k", "summary", "", "kind"),
        ("rl.k", "gauge", "µs", "unit"),
    ],
)
def test_malformed_recorded_row_is_refused(name, kind, unit, match):
    with pytest.raises(ValueError, match=match):
        register_recorded_metrics([RecordedMetric(name, kind=kind, unit=unit)])
    assert recorded_metrics() == ()


def test_recorded_name_taken_by_a_teed_row_is_refused():
    register_teed_metrics([TeedMetric("my/key", "rl.mine")])
    with pytest.raises(ValueError, match=r"rl\.mine"):
        register_recorded_metrics([RecordedMetric("rl.mine")])
    assert recorded_metrics() == ()


def test_teed_name_taken_by_a_recorded_row_is_refused():
    register_recorded_metrics([RecordedMetric("rl.mine")])
    with pytest.raises(ValueError, match=r"rl\.mine"):
        register_teed_metrics([TeedMetric("my/key", "rl.mine")])
    assert "my/key" not in by_logger_key()


def test_recorded_row_with_another_kind_under_a_taken_name_is_refused():
    register_recorded_metrics([RecordedMetric("rl.mine")])
    with pytest.raises(ValueError, match=r"rl\.mine"):
        register_recorded_metrics([RecordedMetric("rl.mine", kind="counter")])
    assert recorded_metrics() == (RecordedMetric("rl.mine"),)


def test_recorded_collision_anywhere_in_the_call_declares_nothing():
    register_teed_metrics([TeedMetric("taken", "rl.taken")])
    with pytest.raises(ValueError, match=r"rl\.taken"):
        register_recorded_metrics([RecordedMetric("rl.fresh"), RecordedMetric("rl.taken")])
    assert recorded_metrics() == ()


def test_recorded_collision_within_one_call_declares_nothing():
    with pytest.raises(ValueError, match="collide"):
        register_recorded_metrics(
            [RecordedMetric("rl.x"), RecordedMetric("rl.y"), RecordedMetric("rl.x", "counter")]
        )
    assert recorded_metrics() == ()


def test_identical_recorded_row_twice_is_a_no_op():
    register_recorded_metrics([RecordedMetric("rl.obs", "observable_gauge", callback=_observe)])
    register_recorded_metrics([RecordedMetric("rl.obs", "observable_gauge", callback=_observe)])
    assert len(recorded_metrics()) == 1


def test_same_recorded_row_with_another_callback_is_refused():
    register_recorded_metrics([RecordedMetric("rl.obs", "observable_gauge", callback=_observe)])
    with pytest.raises(ValueError, match=r"rl\.obs"):
        register_recorded_metrics(
            [RecordedMetric("rl.obs", "observable_gauge", callback=lambda _o: [])]
        )
    assert recorded_metrics()[0].callback is _observe


def test_recorded_row_may_replace_a_shipped_default():
    register_recorded_metrics([RecordedMetric("rl.reward.mean")])
    assert "rl.reward.mean" not in names()
    assert "reward" not in by_logger_key()
    assert [row.name for row in recorded_metrics()] == ["rl.reward.mean"]


def test_recorded_metrics_keeps_declaration_order():
    register_recorded_metrics([RecordedMetric("rl.z"), RecordedMetric("rl.a")])
    register_recorded_metrics([RecordedMetric("rl.m")])
    assert [row.name for row in recorded_metrics()] == ["rl.z", "rl.a", "rl.m"]


def test_freeze_is_reset_between_tests():
    # guards the autouse fixture the tests above rely on
    assert vocabulary._FROZEN is False


def test_a_held_row_is_a_gauge_or_a_counter():
    for kind in ("gauge", "counter"):
        TeedMetric("w/state", f"rl.w.{kind}", kind=kind, prefix="", held=True).validate()
    with pytest.raises(ValueError, match="held series"):
        TeedMetric("w/lat", "rl.w.lat", kind="histogram", prefix="", held=True).validate()

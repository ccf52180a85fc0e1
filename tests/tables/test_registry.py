"""Tests for async_tee.registry against a real MeterProvider and InMemoryMetricReader."""

from __future__ import annotations

import logging
import math

import pytest
from helpers import collect
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics.export import Gauge, Histogram, Sum

from async_tee import registry
from async_tee.registry import (
    FrozenAttributes,
    MetricSpec,
    create_metric_instruments,
    group_specs,
    record_metrics,
    register_metric_group,
)

NO_ATTRS: frozenset[tuple[str, str]] = frozenset()


def attrs(**kwargs):
    return frozenset(kwargs.items())


def metric(reader, name):
    """The collected Metric named ``name`` (one collection), or None."""
    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics if data else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for found in scope_metrics.metrics:
                if found.name == name:
                    return found
    return None


def records(caplog, level, logger="async_tee"):
    return [r for r in caplog.records if r.name == logger and r.levelno == level]


def warnings(caplog, logger="async_tee"):
    return records(caplog, logging.WARNING, logger)


def otel_warnings(caplog):
    return [
        r
        for r in caplog.records
        if r.name.startswith("opentelemetry") and r.levelno >= logging.WARNING
    ]


@pytest.fixture
def meter(provider):
    return provider.get_meter("t")


def _observe_five(_options):
    return [Observation(5.0, {"src": "cb"})]


def _standard_group():
    register_metric_group(
        "g",
        [
            MetricSpec("g", "rl.g"),
            MetricSpec("c", "rl.c", kind="counter", unit="{token}"),
            MetricSpec("u", "rl.u", kind="up_down_counter"),
            MetricSpec("h", "rl.h", kind="histogram", unit="s", buckets=(0.1, 1, 10)),
            MetricSpec("obs", "rl.obs", kind="observable_gauge", callback=_observe_five),
        ],
    )


# ---------------------------------------------------------------------------- MetricSpec


def _cb(_options):
    return []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"key": "not-ident", "name": "rl.x"}, "identifier", id="key-dash"),
        pytest.param({"key": "1a", "name": "rl.x"}, "identifier", id="key-digit"),
        pytest.param({"key": "", "name": "rl.x"}, "identifier", id="key-empty"),
        pytest.param({"key": None, "name": "rl.x"}, "identifier", id="key-none"),
        pytest.param({"key": "a b", "name": "rl.x"}, "identifier", id="key-space"),
        pytest.param({"key": "x", "name": "rl.bad name"}, "instrument name", id="name-space"),
        pytest.param({"key": "x", "name": "9rl"}, "instrument name", id="name-digit"),
        pytest.param({"key": "x", "name": ""}, "instrument name", id="name-empty"),
        pytest.param({"key": "x", "name": "r" * 256}, "instrument name", id="name-256"),
        pytest.param({"key": "x", "name": "rl.x", "kind": "summary"}, "kind", id="kind"),
        pytest.param({"key": "x", "name": "rl.x", "unit": "µs"}, "unit", id="unit-micro"),
        pytest.param(
            {"key": "x", "name": "rl.x", "callback": _cb}, "callback", id="callback-on-gauge"
        ),
        pytest.param(
            {"key": "x", "name": "rl.x", "kind": "counter", "callback": _cb},
            "callback",
            id="callback-on-counter",
        ),
        pytest.param(
            {"key": "x", "name": "rl.x", "kind": "histogram", "callback": _cb},
            "callback",
            id="callback-on-histogram",
        ),
        pytest.param(
            {"key": "x", "name": "rl.x", "kind": "observable_gauge"},
            "callback",
            id="observable-gauge-no-callback",
        ),
        pytest.param(
            {"key": "x", "name": "rl.x", "kind": "observable_counter"},
            "callback",
            id="observable-counter-no-callback",
        ),
        pytest.param(
            {"key": "x", "name": "rl.x", "kind": "observable_up_down_counter"},
            "callback",
            id="observable-udc-no-callback",
        ),
        pytest.param(
            {"key": "x", "name": "rl.x", "buckets": (1.0, 2.0)}, "histogram", id="buckets-gauge"
        ),
        pytest.param(
            {"key": "x", "name": "rl.x", "kind": "counter", "buckets": (1.0,)},
            "histogram",
            id="buckets-counter",
        ),
        pytest.param(
            {"key": "x", "name": "rl.x", "kind": "histogram", "buckets": (1.0, 1.0)},
            "increasing",
            id="buckets-repeated",
        ),
        pytest.param(
            {"key": "x", "name": "rl.x", "kind": "histogram", "buckets": (2.0, 1.0)},
            "increasing",
            id="buckets-decreasing",
        ),
        pytest.param(
            {"key": "x", "name": "rl.x", "kind": "histogram", "buckets": (1.0, 3.0, 2.0)},
            "increasing",
            id="buckets-not-sorted",
        ),
        pytest.param(
            {"key": "x", "name": "rl.x", "kind": "histogram", "buckets": (1.0, math.inf)},
            "finite",
            id="buckets-inf",
        ),
        pytest.param(
            {"key": "x", "name": "rl.x", "kind": "histogram", "buckets": (math.nan,)},
            "finite",
            id="buckets-nan",
        ),
    ],
)
def test_metric_spec_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MetricSpec(**kwargs)


def test_metric_spec_valid_forms():
    spec = MetricSpec("h", "rl.h", kind="histogram", buckets=[0, 1, 2.5])  # type: ignore[arg-type]
    assert spec.buckets == (0.0, 1.0, 2.5)
    assert all(type(b) is float for b in spec.buckets)
    assert MetricSpec("o", "rl.o", kind="observable_counter", callback=_cb).callback is _cb
    assert MetricSpec("g", "rl.g").kind == "gauge"


# ------------------------------------------------------------------ register_metric_group


@pytest.mark.parametrize(
    ("group", "specs", "match"),
    [
        pytest.param("", [MetricSpec("a", "rl.a")], "non-empty", id="empty-name"),
        pytest.param(None, [MetricSpec("a", "rl.a")], "non-empty", id="none-name"),
        pytest.param("g", [], "no specs", id="empty-specs"),
        pytest.param("g", iter(()), "no specs", id="empty-iterator"),
        pytest.param(
            "g",
            [MetricSpec("a", "rl.a"), MetricSpec("a", "rl.b")],
            "duplicate key",
            id="duplicate-key",
        ),
        pytest.param(
            "g",
            [MetricSpec("a", "rl.a"), MetricSpec("b", "rl.a")],
            "duplicate name",
            id="duplicate-name",
        ),
        pytest.param("g", [MetricSpec("a", "rl.a"), "rl.b"], "MetricSpec", id="not-a-spec"),
    ],
)
def test_register_metric_group_errors(group, specs, match):
    with pytest.raises(ValueError, match=match):
        register_metric_group(group, specs)
    assert group_specs("g") == ()


def test_second_registration_of_a_group_is_refused():
    first = (MetricSpec("a", "rl.a"),)
    register_metric_group("g", first)
    with pytest.raises(ValueError, match="already registered"):
        register_metric_group("g", [MetricSpec("b", "rl.b")])
    with pytest.raises(ValueError, match="already registered"):
        register_metric_group("g", first)
    assert group_specs("g") == first


def test_register_metric_group_reads_the_specs_once():
    specs = [MetricSpec("a", "rl.a")]
    register_metric_group("g", (s for s in specs))
    specs.append(MetricSpec("b", "rl.b"))
    assert group_specs("g") == (MetricSpec("a", "rl.a"),)


# --------------------------------------------------------------------- record_metrics


def test_gauge_last_value_wins(meter, reader):
    register_metric_group("g", [MetricSpec("g", "rl.g")])
    record_metrics(meter, "g", {"g": 1.0})
    record_metrics(meter, "g", {"g": 2.5})
    assert collect(reader) == {("rl.g", NO_ATTRS): 2.5}
    # reported again every cycle, not only once
    assert collect(reader) == {("rl.g", NO_ATTRS): 2.5}
    assert isinstance(metric(reader, "rl.g").data, Gauge)


def test_gauge_none_is_skipped_and_keeps_the_last_value(meter, reader):
    register_metric_group("g", [MetricSpec("g", "rl.g")])
    record_metrics(meter, "g", {"g": 1.0})
    record_metrics(meter, "g", {"g": None})
    assert collect(reader) == {("rl.g", NO_ATTRS): 1.0}
    assert registry.RegistryCounts() == registry.instrument_registry(meter).counts


def test_unrecorded_gauge_exports_nothing(meter, reader):
    register_metric_group("g", [MetricSpec("g", "rl.g"), MetricSpec("other", "rl.other")])
    record_metrics(meter, "g", {"other": 1.0})
    assert collect(reader) == {("rl.other", NO_ATTRS): 1.0}


def test_counter_accumulates_deltas_as_a_monotonic_sum(meter, reader):
    register_metric_group("g", [MetricSpec("c", "rl.c", kind="counter", unit="{token}")])
    record_metrics(meter, "g", {"c": 2})
    record_metrics(meter, "g", {"c": 3.5})
    record_metrics(meter, "g", {"c": 0})
    found = metric(reader, "rl.c")
    assert isinstance(found.data, Sum)
    assert found.data.is_monotonic is True
    assert found.unit == "{token}"
    assert [p.value for p in found.data.data_points] == [5.5]
    record_metrics(meter, "g", {"c": 1})
    assert collect(reader) == {("rl.c", NO_ATTRS): 6.5}


def test_up_down_counter(meter, reader):
    register_metric_group("g", [MetricSpec("u", "rl.u", kind="up_down_counter")])
    record_metrics(meter, "g", {"u": 5})
    record_metrics(meter, "g", {"u": -7})
    found = metric(reader, "rl.u")
    assert isinstance(found.data, Sum)
    assert found.data.is_monotonic is False
    assert [p.value for p in found.data.data_points] == [-2.0]
    assert registry.instrument_registry(meter).counts.rejected == 0


def test_histogram_arrives_with_its_buckets(meter, reader):
    register_metric_group(
        "g", [MetricSpec("h", "rl.h", kind="histogram", unit="s", buckets=(0.1, 1, 10))]
    )
    for value in (0.05, 0.5, 5, 50):
        record_metrics(meter, "g", {"h": value})
    found = metric(reader, "rl.h")
    assert isinstance(found.data, Histogram)
    assert found.unit == "s"
    (point,) = found.data.data_points
    assert tuple(point.explicit_bounds) == (0.1, 1.0, 10.0)
    assert tuple(point.bucket_counts) == (1, 1, 1, 1)
    assert point.count == 4
    assert point.sum == pytest.approx(55.55)


def test_ints_arrive_as_doubles(meter, reader):
    register_metric_group(
        "g",
        [
            MetricSpec("g", "rl.g"),
            MetricSpec("c", "rl.c", kind="counter"),
            MetricSpec("u", "rl.u", kind="up_down_counter"),
            MetricSpec("h", "rl.h", kind="histogram"),
        ],
    )
    record_metrics(meter, "g", {"g": 3, "c": 4, "u": 5, "h": 6})
    points = collect(reader)
    for name, expected in (("rl.g", 3.0), ("rl.c", 4.0), ("rl.u", 5.0)):
        value = points[(name, NO_ATTRS)]
        assert type(value) is float, name
        assert value == expected
    (hist,) = metric(reader, "rl.h").data.data_points
    assert type(hist.sum) is float
    assert hist.sum == 6.0


def test_numpy_values_arrive_as_doubles(meter, reader):
    np = pytest.importorskip("numpy")
    register_metric_group("g", [MetricSpec("g", "rl.g"), MetricSpec("n", "rl.n")])
    record_metrics(meter, "g", {"g": np.float32(0.5), "n": np.int64(7)})
    points = collect(reader)
    assert points == {("rl.g", NO_ATTRS): 0.5, ("rl.n", NO_ATTRS): 7.0}
    assert all(type(v) is float for v in points.values())


def test_attributes(meter, reader):
    register_metric_group("g", [MetricSpec("g", "rl.g"), MetricSpec("c", "rl.c", kind="counter")])
    record_metrics(meter, "g", {"g": 1.0, "c": 1}, {"phase": "a"})
    record_metrics(meter, "g", {"g": 2.0, "c": 2}, {"phase": "b", "rank": 3, "ok": True})
    record_metrics(meter, "g", {"g": 3.0, "c": 4}, {"phase": "a"})
    record_metrics(meter, "g", {"c": 8}, FrozenAttributes({"phase": "a"}))
    record_metrics(meter, "g", {"g": 4.0, "c": 16})
    assert collect(reader) == {
        ("rl.g", attrs(phase="a")): 3.0,
        ("rl.g", attrs(phase="b", rank=3, ok=True)): 2.0,
        ("rl.g", NO_ATTRS): 4.0,
        ("rl.c", attrs(phase="a")): 13.0,
        ("rl.c", attrs(phase="b", rank=3, ok=True)): 2.0,
        ("rl.c", NO_ATTRS): 16.0,
    }


def test_attribute_order_does_not_make_a_new_set(meter, reader):
    register_metric_group("g", [MetricSpec("c", "rl.c", kind="counter")])
    record_metrics(meter, "g", {"c": 1}, {"a": "1", "b": "2"})
    record_metrics(meter, "g", {"c": 1}, {"b": "2", "a": "1"})
    assert collect(reader) == {("rl.c", attrs(a="1", b="2")): 2.0}


def test_attributes_are_snapshotted_at_record_time(meter, reader):
    register_metric_group("g", [MetricSpec("g", "rl.g")])
    attributes = {"phase": "a"}
    record_metrics(meter, "g", {"g": 1.0}, attributes)
    attributes["phase"] = "mutated"
    assert collect(reader) == {("rl.g", attrs(phase="a")): 1.0}


# ------------------------------------------------------------------- never-raise paths


def _assert_warned_once_then_debug(logs, first, repeat):
    first()
    assert len(warnings(logs)) == 1, [r.getMessage() for r in warnings(logs)]
    message = warnings(logs)[0].getMessage()
    debug_before = len(records(logs, logging.DEBUG))
    repeat()
    assert len(warnings(logs)) == 1, [r.getMessage() for r in warnings(logs)]
    assert len(records(logs, logging.DEBUG)) == debug_before + 1
    return message


def test_unknown_group_warns_once(meter, reader, logs):
    def rec():
        record_metrics(meter, "nope", {"x": 1.0})

    message = _assert_warned_once_then_debug(logs, rec, rec)
    assert "nope" in message
    assert collect(reader) == {}


def test_unknown_key_warns_once_and_other_keys_still_record(meter, reader, logs):
    register_metric_group("g", [MetricSpec("g", "rl.g")])

    def rec():
        record_metrics(meter, "g", {"missing": 1.0, "g": 2.0})

    message = _assert_warned_once_then_debug(logs, rec, rec)
    assert "missing" in message
    assert registry.instrument_registry(meter).counts.rejected == 2
    assert collect(reader) == {("rl.g", NO_ATTRS): 2.0}


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("1.0", id="str"),
        pytest.param(b"1", id="bytes"),
        pytest.param([1.0], id="list"),
        pytest.param({"a": 1}, id="dict"),
        pytest.param(10**400, id="huge-int"),
    ],
)
def test_non_numeric_value_warns_once(meter, reader, logs, value):
    register_metric_group("g", [MetricSpec("g", "rl.g"), MetricSpec("ok", "rl.ok")])
    record_metrics(meter, "g", {"g": 1.0})

    def rec():
        record_metrics(meter, "g", {"g": value, "ok": 3.0})

    message = _assert_warned_once_then_debug(logs, rec, rec)
    assert "rl.g" in message
    assert registry.instrument_registry(meter).counts.rejected == 2
    # the gauge keeps its last good value; the other key is recorded
    assert collect(reader) == {("rl.g", NO_ATTRS): 1.0, ("rl.ok", NO_ATTRS): 3.0}


@pytest.mark.parametrize(
    "attributes",
    [
        pytest.param({"a": {"b": 1}}, id="dict-value"),
        pytest.param({1: "x"}, id="non-str-key"),
        pytest.param({"": "x"}, id="empty-key"),
        pytest.param({"a": None}, id="none-value"),
        pytest.param({"a": math.nan}, id="nan-value"),
        pytest.param({"a": object()}, id="object-value"),
        pytest.param(["a", "b"], id="not-a-mapping"),
    ],
)
def test_bad_attributes_warn_once(meter, reader, logs, attributes):
    register_metric_group("g", [MetricSpec("g", "rl.g")])

    def rec():
        record_metrics(meter, "g", {"g": 1.0}, attributes)

    _assert_warned_once_then_debug(logs, rec, rec)
    assert registry.instrument_registry(meter).counts.rejected == 2
    assert collect(reader) == {}


def test_negative_counter_delta_warns_once(meter, reader, logs):
    register_metric_group("g", [MetricSpec("c", "rl.c", kind="counter")])
    record_metrics(meter, "g", {"c": 5})

    def rec():
        record_metrics(meter, "g", {"c": -1})

    message = _assert_warned_once_then_debug(logs, rec, rec)
    assert "rl.c" in message
    assert registry.instrument_registry(meter).counts.rejected == 2
    assert collect(reader) == {("rl.c", NO_ATTRS): 5.0}


def test_a_held_counter_keeps_its_last_total_and_refuses_a_negative_one(meter, reader, logs):
    register_metric_group("g", [MetricSpec("h", "rl.h", kind="counter", held=True)])
    for total in (5.0, 7.0, 7.0):  # running totals, as logged: replaced, never added up
        record_metrics(meter, "g", {"h": total})

    def rec():
        record_metrics(meter, "g", {"h": -1.0})

    message = _assert_warned_once_then_debug(logs, rec, rec)
    assert "rl.h" in message
    assert "total" in message
    assert registry.instrument_registry(meter).counts.rejected == 2
    assert collect(reader) == {("rl.h", NO_ATTRS): 7.0}


class Clock:
    """A monotonic clock the test moves (the registry's ``clock``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def held(meter):
    """A held gauge and a held counter on ``meter``, a TTL of 10 s, and the registry's clock."""
    register_metric_group(
        "g",
        [
            MetricSpec("h", "rl.h", held=True),
            MetricSpec("t", "rl.t", kind="counter", held=True),
        ],
    )
    tables = registry.instrument_registry(meter)
    tables.begin_session(held_ttl_s=10.0)
    tables.clock = clock = Clock()
    return tables, clock


def test_a_held_value_not_logged_within_the_ttl_is_withdrawn_until_logged_again(
    meter, reader, held, logs
):
    tables, clock = held
    record_metrics(meter, "g", {"h": 1.0, "t": 5.0}, {"a": "x"})
    record_metrics(meter, "g", {"h": 2.0}, {"a": "y"})
    clock.now += 6
    record_metrics(meter, "g", {"h": 3.0}, {"a": "y"})  # y logged again; x and t are not
    clock.now += 4  # x and t: 10 s since logged, the TTL itself: still shown
    assert collect(reader) == {
        ("rl.h", attrs(a="x")): 1.0,
        ("rl.h", attrs(a="y")): 3.0,
        ("rl.t", attrs(a="x")): 5.0,
    }
    assert tables.counts.held_expired == 0
    clock.now += 0.5
    assert collect(reader) == {("rl.h", attrs(a="y")): 3.0}  # x and t withdrawn, per set
    assert tables.counts.held_expired == 2
    debug = [r.getMessage() for r in logs.records if "withdrawn" in r.getMessage()]
    assert sorted(debug) == [
        "async_tee: rl.h: 1 attribute set(s) not logged for 10 s; withdrawn until logged",
        "async_tee: rl.t: 1 attribute set(s) not logged for 10 s; withdrawn until logged",
    ]
    clock.now += 100
    assert collect(reader) == {}  # y too, now
    assert collect(reader) == {}
    assert tables.counts.held_expired == 3  # each withdrawal counted once, not per export
    record_metrics(meter, "g", {"h": 4.0, "t": 6.0}, {"a": "x"})  # logged again: back
    assert collect(reader) == {("rl.h", attrs(a="x")): 4.0, ("rl.t", attrs(a="x")): 6.0}


def test_a_held_counter_comes_back_with_its_cumulative_start(meter, reader, held):
    _tables, clock = held

    def total():
        (found,) = metric(reader, "rl.t").data.data_points
        return found.value, found.start_time_unix_nano

    record_metrics(meter, "g", {"t": 5.0})
    assert total()[0] == 5.0
    start = total()[1]
    clock.now += 11
    assert metric(reader, "rl.t") is None
    record_metrics(meter, "g", {"t": 7.0})
    assert total() == (7.0, start)  # the same cumulative series, not a restart


def test_the_fast_path_dates_a_held_value_too(meter, reader, held):
    tables, clock = held
    record_metrics(meter, "g", {"h": 1.0})
    table = tables.tables("g")["h"]
    clock.now += 8
    assert table.store(2.0, FrozenAttributes({}))  # the worker's store, as the recorder calls it
    clock.now += 8
    assert collect(reader) == {("rl.h", NO_ATTRS): 2.0}  # 8 s since the store: fresh
    assert table.shown is None  # held: every export reads the points, computed now
    assert not table.store(math.nan, FrozenAttributes({}))


def test_a_held_ttl_of_zero_holds_for_good(meter, reader, held):
    tables, clock = held
    tables.begin_session(held_ttl_s=0)
    record_metrics(meter, "g", {"h": 1.0})
    clock.now += 1e9
    assert collect(reader) == {("rl.h", NO_ATTRS): 1.0}
    assert tables.counts.held_expired == 0


def test_a_non_finite_held_value_is_withdrawn_as_a_gauge_is(meter, reader, held):
    tables, _clock = held
    record_metrics(meter, "g", {"h": 1.0})
    record_metrics(meter, "g", {"h": math.nan})
    assert collect(reader) == {}
    assert (tables.counts.non_finite, tables.counts.held_expired) == (1, 0)


@pytest.mark.parametrize("ttl", [-1.0, math.nan])
def test_a_negative_held_ttl_is_refused(meter, ttl):
    with pytest.raises(ValueError, match="held TTL"):
        registry.instrument_registry(meter).begin_session(held_ttl_s=ttl)


def test_value_for_an_observable_key_warns_once(meter, reader, logs):
    register_metric_group(
        "g", [MetricSpec("obs", "rl.obs", kind="observable_gauge", callback=_observe_five)]
    )

    def rec():
        record_metrics(meter, "g", {"obs": 1.0})

    message = _assert_warned_once_then_debug(logs, rec, rec)
    assert "rl.obs" in message
    assert registry.instrument_registry(meter).counts.rejected == 2
    assert collect(reader) == {("rl.obs", attrs(src="cb")): 5.0}


def test_failing_observable_callback_warns_once_across_collections(meter, reader, logs):
    calls = []

    def broken(_options):
        calls.append(1)
        raise RuntimeError("callback exploded")

    register_metric_group(
        "g",
        [
            MetricSpec("bad", "rl.bad", kind="observable_gauge", callback=broken),
            MetricSpec("good", "rl.good", kind="observable_gauge", callback=_observe_five),
        ],
    )
    create_metric_instruments(meter, "g")
    assert collect(reader) == {("rl.good", attrs(src="cb")): 5.0}
    assert collect(reader) == {("rl.good", attrs(src="cb")): 5.0}
    assert len(calls) == 2
    (warning,) = warnings(logs)
    assert "rl.bad" in warning.getMessage()
    assert warning.exc_info is not None
    assert warning.exc_info[0] is RuntimeError
    assert len(records(logs, logging.DEBUG)) == 1
    assert registry.instrument_registry(meter).counts.errors == 2
    # the SDK never saw the exception: no traceback of its own per export
    assert otel_warnings(logs) == []


class RefusingMeter:
    """A meter whose SDK refuses every instrument, as the real one does for a bad name."""

    def __init__(self):
        self.attempts = 0

    def _refuse(self, *args, **kwargs):
        self.attempts += 1
        raise Exception("SDK refused the instrument")  # the SDK raises a bare Exception

    create_counter = create_up_down_counter = create_histogram = create_gauge = _refuse
    create_observable_gauge = create_observable_counter = _refuse
    create_observable_up_down_counter = _refuse


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(MetricSpec("x", "rl.x"), id="gauge"),
        pytest.param(MetricSpec("x", "rl.x", kind="counter"), id="counter"),
        pytest.param(MetricSpec("x", "rl.x", kind="up_down_counter"), id="up_down_counter"),
        pytest.param(MetricSpec("x", "rl.x", kind="histogram"), id="histogram"),
    ],
)
def test_instrument_the_sdk_refuses_warns_once_and_never_raises(logs, spec):
    register_metric_group("g", [spec])
    bad = RefusingMeter()

    def rec():
        record_metrics(bad, "g", {"x": 1.0})  # type: ignore[arg-type]

    message = _assert_warned_once_then_debug(logs, rec, rec)
    assert "rl.x" in message
    assert bad.attempts == 1  # not retried every record
    assert registry.instrument_registry(bad).counts.errors == 1  # type: ignore[arg-type]


def test_refused_instrument_creation_via_create_metric_instruments(logs):
    register_metric_group(
        "g",
        [
            MetricSpec("x", "rl.x"),
            MetricSpec("o", "rl.o", kind="observable_gauge", callback=_observe_five),
        ],
    )
    bad = RefusingMeter()
    create_metric_instruments(bad, "g")  # type: ignore[arg-type]
    create_metric_instruments(bad, "g")  # type: ignore[arg-type]
    assert len(warnings(logs)) == 2  # one per instrument, not per call
    assert bad.attempts == 2
    record_metrics(bad, "g", {"x": 1.0})  # type: ignore[arg-type]
    assert len(warnings(logs)) == 2


class HistogramRefusingMeter:
    """Delegates to a real meter but refuses histograms: one bad instrument among good."""

    def __init__(self, meter):
        self._meter = meter

    def __getattr__(self, name):
        return getattr(self._meter, name)

    def create_histogram(self, *args, **kwargs):
        raise Exception("SDK refused the histogram")


def test_one_refused_instrument_does_not_stop_the_others(meter, reader, logs):
    register_metric_group("g", [MetricSpec("h", "rl.h", kind="histogram"), MetricSpec("g", "rl.g")])
    wrapped = HistogramRefusingMeter(meter)
    record_metrics(wrapped, "g", {"h": 1.0, "g": 2.0})  # type: ignore[arg-type]
    record_metrics(wrapped, "g", {"h": 1.0, "g": 3.0})  # type: ignore[arg-type]
    assert collect(reader) == {("rl.g", NO_ATTRS): 3.0}
    (warning,) = warnings(logs)
    assert "rl.h" in warning.getMessage()


class _ExplodingHistogram:
    def record(self, *args, **kwargs):
        raise RuntimeError("emit failed")


class EmitFailingMeter(HistogramRefusingMeter):
    def create_histogram(self, *args, **kwargs):
        return _ExplodingHistogram()


def test_failed_emit_warns_once_and_other_keys_still_record(meter, reader, logs):
    register_metric_group("g", [MetricSpec("h", "rl.h", kind="histogram"), MetricSpec("g", "rl.g")])
    wrapped = EmitFailingMeter(meter)

    def rec():
        record_metrics(wrapped, "g", {"h": 1.0, "g": 2.0})  # type: ignore[arg-type]

    message = _assert_warned_once_then_debug(logs, rec, rec)
    assert "rl.h" in message
    assert registry.instrument_registry(wrapped).counts.errors == 2  # type: ignore[arg-type]
    assert collect(reader) == {("rl.g", NO_ATTRS): 2.0}


def test_values_that_are_not_a_mapping_never_raise(meter, logs):
    register_metric_group("g", [MetricSpec("g", "rl.g")])
    record_metrics(meter, "g", [("g", 1.0)])  # type: ignore[arg-type]
    record_metrics(meter, "g", None)  # type: ignore[arg-type]
    assert len(warnings(logs)) == 1
    assert registry.instrument_registry(meter).counts.errors == 2


# ---------------------------------------------------------------------- non-finite values


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_withdraws_the_gauge_value_for_that_attribute_set(meter, reader, bad):
    register_metric_group("g", [MetricSpec("g", "rl.g")])
    record_metrics(meter, "g", {"g": 1.0}, {"a": "x"})
    record_metrics(meter, "g", {"g": 2.0}, {"a": "y"})
    assert collect(reader) == {("rl.g", attrs(a="x")): 1.0, ("rl.g", attrs(a="y")): 2.0}
    record_metrics(meter, "g", {"g": bad}, {"a": "x"})
    assert collect(reader) == {("rl.g", attrs(a="y")): 2.0}
    assert registry.instrument_registry(meter).counts.non_finite == 1
    assert registry.instrument_registry(meter).counts.non_finite_by_series == {"rl.g": 1}
    # a finite value brings the series back
    record_metrics(meter, "g", {"g": 3.0}, {"a": "x"})
    assert collect(reader) == {("rl.g", attrs(a="x")): 3.0, ("rl.g", attrs(a="y")): 2.0}


def test_many_nan_records_are_counted_and_never_reach_the_sdk(meter, reader, logs):
    logs.set_level(logging.DEBUG)
    register_metric_group(
        "g",
        [
            MetricSpec("g", "rl.g"),
            MetricSpec("c", "rl.c", kind="counter"),
            MetricSpec("h", "rl.h", kind="histogram"),
        ],
    )
    record_metrics(meter, "g", {"g": 1.0, "c": 2.0, "h": 3.0})
    for _ in range(100):
        record_metrics(meter, "g", {"g": math.nan, "c": math.nan, "h": math.nan})
    points = collect(reader)
    assert ("rl.g", NO_ATTRS) not in points
    assert points[("rl.c", NO_ATTRS)] == 2.0  # a total is kept, the delta only skipped
    (hist,) = metric(reader, "rl.h").data.data_points
    assert hist.count == 1
    assert hist.sum == 3.0
    assert registry.instrument_registry(meter).counts.non_finite == 300
    assert registry.instrument_registry(meter).counts.non_finite_by_series == {
        "rl.g": 100,
        "rl.c": 100,
        "rl.h": 100,
    }
    assert otel_warnings(logs) == []
    assert warnings(logs) == []


def test_numpy_nan_is_non_finite_too(meter, reader):
    np = pytest.importorskip("numpy")
    register_metric_group("g", [MetricSpec("g", "rl.g")])
    record_metrics(meter, "g", {"g": 1.0})
    record_metrics(meter, "g", {"g": np.float32("nan")})
    assert collect(reader) == {}
    assert registry.instrument_registry(meter).counts.non_finite_by_series == {"rl.g": 1}


# ------------------------------------------------------------------------- cardinality


@pytest.mark.parametrize("kind", ["gauge", "counter", "up_down_counter"])
def test_cardinality_bound(meter, reader, logs, kind):
    registry.instrument_registry(meter).begin_session(3)
    register_metric_group("g", [MetricSpec("s", "rl.s", kind=kind)])
    for i in range(10):
        record_metrics(meter, "g", {"s": 1.0}, {"i": str(i)})
    points = collect(reader)
    assert set(points) == {("rl.s", attrs(i=str(i))) for i in range(3)}
    assert registry.instrument_registry(meter).counts.cardinality == 7
    (warning,) = warnings(logs)
    assert "rl.s" in warning.getMessage()
    # a set already admitted is still updated past the bound
    record_metrics(meter, "g", {"s": 5.0}, {"i": "0"})
    assert registry.instrument_registry(meter).counts.cardinality == 7
    expected = 5.0 if kind == "gauge" else 6.0
    assert collect(reader)[("rl.s", attrs(i="0"))] == expected


def test_cardinality_bound_on_a_histogram(meter, reader, logs):
    registry.instrument_registry(meter).begin_session(3)
    register_metric_group("g", [MetricSpec("h", "rl.h", kind="histogram")])
    for i in range(10):
        record_metrics(meter, "g", {"h": 1.0}, {"i": str(i)})
    record_metrics(meter, "g", {"h": 1.0}, {"i": "1"})
    points = metric(reader, "rl.h").data.data_points
    assert sorted((dict(p.attributes)["i"], p.count) for p in points) == [
        ("0", 1),
        ("1", 2),
        ("2", 1),
    ]
    assert registry.instrument_registry(meter).counts.cardinality == 7
    assert len(warnings(logs)) == 1


def test_cardinality_bound_applies_to_series_created_afterwards(meter, reader):
    register_metric_group("g", [MetricSpec("s", "rl.s")])
    create_metric_instruments(meter, "g")
    registry.instrument_registry(meter).begin_session(3)
    for i in range(10):
        record_metrics(meter, "g", {"s": 1.0}, {"i": str(i)})
    assert len(collect(reader)) == 10
    assert registry.instrument_registry(meter).counts.cardinality == 0


@pytest.mark.parametrize("limit", [0, -1])
def test_set_max_attribute_sets_refuses_less_than_one(meter, limit):
    with pytest.raises(ValueError, match="at least 1"):
        registry.instrument_registry(meter).begin_session(limit)


# --------------------------------------------------------------- create_metric_instruments


def test_create_metric_instruments_is_idempotent_and_exports_observables(provider, reader, caplog):
    caplog.set_level(logging.DEBUG)
    _standard_group()
    create_metric_instruments(provider.get_meter("t"), "g")
    create_metric_instruments(provider.get_meter("t"), "g")
    record_metrics(provider.get_meter("t"), "g", {"g": 1.0, "c": 2, "u": -3, "h": 0.5})
    create_metric_instruments(provider.get_meter("t"), "g")
    points = collect(reader)
    assert points[("rl.obs", attrs(src="cb"))] == 5.0
    assert points[("rl.g", NO_ATTRS)] == 1.0
    assert points[("rl.c", NO_ATTRS)] == 2.0
    assert points[("rl.u", NO_ATTRS)] == -3.0
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert registry.RegistryCounts() == registry.instrument_registry(provider.get_meter("t")).counts


def test_observable_series_is_not_exported_without_create(meter, reader):
    _standard_group()
    assert collect(reader) == {}
    create_metric_instruments(meter, "g")
    assert collect(reader) == {("rl.obs", attrs(src="cb")): 5.0}


@pytest.mark.parametrize(
    ("kind", "data_type", "monotonic"),
    [
        ("observable_gauge", Gauge, None),
        ("observable_counter", Sum, True),
        ("observable_up_down_counter", Sum, False),
    ],
)
def test_observable_kinds(meter, reader, kind, data_type, monotonic):
    register_metric_group("g", [MetricSpec("o", "rl.o", kind=kind, callback=_observe_five)])
    create_metric_instruments(meter, "g")
    found = metric(reader, "rl.o")
    assert isinstance(found.data, data_type)
    if monotonic is not None:
        assert found.data.is_monotonic is monotonic
    assert [(p.value, dict(p.attributes)) for p in found.data.data_points] == [(5.0, {"src": "cb"})]


def test_create_metric_instruments_for_an_unknown_group_warns_once(meter, logs):
    create_metric_instruments(meter, "nope")
    create_metric_instruments(meter, "nope")
    assert len(warnings(logs)) == 1
    assert len(records(logs, logging.DEBUG)) == 1


def test_a_group_registered_after_a_failed_lookup_still_works(meter, reader):
    record_metrics(meter, "g", {"g": 1.0})
    register_metric_group("g", [MetricSpec("g", "rl.g")])
    record_metrics(meter, "g", {"g": 2.0})
    assert collect(reader) == {("rl.g", NO_ATTRS): 2.0}

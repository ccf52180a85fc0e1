"""The worker's recorder: its one-store fast path records exactly what the checked path does.

``RLRecorder`` stores a finite float for a gauge that already holds a point in one step
(``LastValue.store``); everything else goes through ``InstrumentRegistry.record``'s
checks. Generated sequences of the fixture's ``train`` and ``""`` dicts, their values
replaced by floats, NaN, infinities, ints, numpy scalars, bools, strings and None, must
leave the same tables and the same counts as mapping each dict first
(``map_teed_scalars``, ``map_efficiency_seconds``) and recording the result through the
registry, which is how the recorder worked before the fast path.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider

from async_tee import testing
from async_tee._declare import series as _series
from async_tee._declare.groups import RL_METRIC_GROUP, ensure_metric_group_registered
from async_tee._worker.mapping import (
    PCT_ATTRIBUTES,
    map_efficiency_pct,
    map_efficiency_seconds,
    map_teed_scalars,
)
from async_tee._worker.recorder import COUNTED_STEPS, CountedSteps, RLRecorder
from async_tee.registry import InstrumentRegistry, instrument_registry
from async_tee.vocabulary import teed_metrics

_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**20), 10**20),
    st.floats(-1e6, 1e6).map(np.float32),
    st.floats(allow_nan=True).map(np.float64),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)


def _dicts(calls: list[dict[str, Any]]) -> st.SearchStrategy[list[tuple[dict[str, Any], str]]]:
    """Sequences of the fixture's ``train`` and ``""`` dicts, some values replaced."""
    teed = [(c["metrics"], c["prefix"]) for c in calls if c["prefix"] in ("train", "")]

    def varied(original: tuple[dict[str, Any], str]) -> st.SearchStrategy[Any]:
        metrics, prefix = original
        keys = sorted(metrics)
        return st.dictionaries(st.sampled_from(keys), _VALUES, max_size=len(keys)).map(
            lambda changes: ({**metrics, **changes}, prefix)
        )

    return st.lists(st.one_of([varied(original) for original in teed]), max_size=12)


def _checked(recorder: RLRecorder, metrics: dict[str, Any], prefix: str, step: int) -> None:
    """The recorder's path before the fast one: map the whole dict, then record it."""
    rows = teed_metrics()
    values = map_teed_scalars(metrics, rows, prefix)
    for key in {row.key for row in rows if row.kind == "counter"}.intersection(values):
        if not recorder.counted.first_time(step, key):
            del values[key]
    recorder.record(values)
    if prefix == "":
        attributes = recorder.efficiency_attributes
        for category, seconds in map_efficiency_seconds(metrics, attributes).items():
            recorder.record({_series.EFFICIENCY_SECONDS.key: seconds}, attributes[category])
        pct = map_efficiency_pct(metrics)
        if pct is not None:
            recorder.record({_series.EFFICIENCY_PCT.key: pct[0]}, PCT_ATTRIBUTES[pct[1]])


def _state(registry: InstrumentRegistry) -> tuple[dict[str, Any], dict[str, Any]]:
    tables = {}
    for key, series in (registry.instruments(RL_METRIC_GROUP) or {}).items():
        points = getattr(series, "points", None)
        if points is not None:
            # NaN never reaches a table; compare the values themselves.
            tables[key] = {k: v[0] for k, v in points.items()}
    counts = registry.counts
    return tables, {
        "non_finite": counts.non_finite,
        "rejected": counts.rejected,
        "errors": counts.errors,
        "by_series": dict(counts.non_finite_by_series),
    }


def test_the_fast_path_records_what_the_checked_path_does(calls):
    testing.reset()
    assert ensure_metric_group_registered()
    provider = MeterProvider(shutdown_on_exit=False)

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(sequence=_dicts(calls), warm=st.booleans())
    def check(sequence: list[tuple[dict[str, Any], str]], warm: bool) -> None:
        fast_tables = instrument_registry(provider.get_meter(f"fast-{id(sequence)}"))
        slow_tables = instrument_registry(provider.get_meter(f"slow-{id(sequence)}"))
        fast, slow = RLRecorder(fast_tables), RLRecorder(slow_tables)
        if warm:  # every gauge already holds a point: the fast path is taken from the start
            for metrics, prefix in ((c["metrics"], c["prefix"]) for c in calls):
                if prefix in ("train", ""):
                    fast.tee(metrics, prefix, 0)
                    _checked(slow, metrics, prefix, 0)
        for step, (metrics, prefix) in enumerate(sequence, start=1):
            fast.tee(metrics, prefix, step // 2)  # two dicts a step: counters once per step
            _checked(slow, metrics, prefix, step // 2)
        assert _state(fast_tables) == _state(slow_tables)
        tables = _state(fast_tables)[0]
        assert all(math.isfinite(v) for table in tables.values() for v in table.values())

    try:
        check()
    finally:
        provider.shutdown()


def test_a_stored_counter_refuses_what_record_refuses():
    # Once a total holds a point its deltas take the one-step path; a negative, NaN or
    # non-float delta must still go through the registry's checks and be counted.
    testing.reset()
    assert ensure_metric_group_registered()
    provider = MeterProvider(shutdown_on_exit=False)
    try:
        registry = instrument_registry(provider.get_meter("counters"))
        recorder = RLRecorder(registry)
        key = "vllm/prompt_tokens"
        recorder.tee({key: 10.0}, "train", 1)
        recorder.tee({key: -5.0}, "train", 2)
        recorder.tee({key: float("nan")}, "train", 3)
        recorder.tee({key: np.float64(2.0)}, "train", 4)
        recorder.tee({key: 3.0}, "train", 5)
        recorder.tee({key: 3.0}, "train", 5)  # the same step again: counted once
        tables, counts = _state(registry)
        assert tables["vllm_prompt_tokens"] == {(): 15.0}
        assert counts["rejected"] == 1
        assert counts["non_finite"] == 1
    finally:
        provider.shutdown()


def test_counted_steps_are_bounded_and_forget_the_oldest():
    counted = CountedSteps()
    for step in range(10 * COUNTED_STEPS):
        assert counted.first_time(step, "k")
        assert not counted.first_time(step, "k")
    assert len(counted) == COUNTED_STEPS
    assert not counted.first_time(10 * COUNTED_STEPS - 1, "k")  # recent: remembered
    assert counted.first_time(0, "k")  # long gone: counted again


def test_a_recently_seen_step_is_kept_while_newer_ones_arrive():
    counted = CountedSteps(capacity=2)
    assert counted.first_time(1, "k")
    assert counted.first_time(2, "k")
    assert not counted.first_time(1, "k")  # touching step 1 makes step 2 the oldest
    assert counted.first_time(3, "k")
    assert not counted.first_time(1, "k")
    assert counted.first_time(2, "k")

"""The catalog, Prometheus names checked against the real exporter, and the collision check."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider

import async_tee
from async_tee import cli, metrics, registry
from async_tee._declare import series as _series
from async_tee._declare import shipped as default_rows
from async_tee._declare.prometheus_names import (
    check_prometheus_names,
    otlp_prometheus_name,
    prometheus_label,
    prometheus_name,
    prometheus_sample_names,
)
from async_tee._session import stats as _stats
from async_tee._tables.self_series import self_metric_specs
from async_tee.catalog import render_catalog, series_catalog
from async_tee.registry import MetricSpec, group_specs, register_metric_group
from async_tee.vocabulary import (
    RecordedMetric,
    TeedMetric,
    recorded_metrics,
    register_recorded_metrics,
    register_teed_metrics,
    registry_key,
    teed_metrics,
)

prometheus = pytest.importorskip("opentelemetry.exporter.prometheus")
prometheus_client = pytest.importorskip("prometheus_client")

TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)$")
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]")


def _reader() -> tuple[Any, Any]:
    """A real PrometheusMetricReader and the registry it serves from: its own, or, for the
    exporter's floor release (0.51b0, which takes no ``registry``), the process's, left when
    its provider shuts down."""
    registry_ = prometheus_client.CollectorRegistry()
    try:
        reader = prometheus.PrometheusMetricReader(registry=registry_, disable_target_info=True)
    except TypeError:
        return prometheus.PrometheusMetricReader(
            disable_target_info=True
        ), prometheus_client.REGISTRY
    return reader, registry_


_DEFAULT_SERIES = re.compile(r"^(?:# (?:HELP|TYPE) )?(?:python|process)_")


def exposition(provider_setup) -> str:
    """What a real PrometheusMetricReader puts on /metrics after ``provider_setup(meter)``."""
    reader, registry_ = _reader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    try:
        provider_setup(provider)
        text = prometheus_client.generate_latest(registry_).decode()
    finally:
        provider.shutdown()
    # The process's registry (the floor release) also serves its own collectors' series.
    return "\n".join(line for line in text.splitlines() if not _DEFAULT_SERIES.match(line))


def parse(text: str) -> tuple[dict[str, str], set[str]]:
    """{family name: type} from the TYPE lines, and every sample name."""
    types, samples = {}, set()
    for line in text.splitlines():
        match = TYPE_LINE.match(line)
        if match:
            types[match.group(1)] = match.group(2)
        elif not line.startswith("#") and line.strip():
            sample = SAMPLE_LINE.match(line)
            assert sample, line
            samples.add(sample.group(1))
    return types, samples


def emit(meter, name: str, unit: str, kind: str) -> None:
    """Create one instrument of ``kind`` and give it a point."""

    def observe(_options):
        return [Observation(1.0)]

    if kind == "gauge":
        meter.create_gauge(name, unit=unit).set(1.0)
    elif kind == "counter":
        meter.create_counter(name, unit=unit).add(1)
    elif kind == "up_down_counter":
        meter.create_up_down_counter(name, unit=unit).add(1)
    elif kind == "histogram":
        meter.create_histogram(name, unit=unit).record(1.0)
    else:
        getattr(meter, f"create_{kind}")(name, unit=unit, callbacks=[observe])


CASES = [
    # MEASURED.md's rules
    ("rl.reward.mean", "", "gauge"),
    ("rl.vllm.prompt_tokens", "{token}", "counter"),
    ("rl.x-y/z", "ms", "histogram"),
    ("rl.mem.used", "By", "up_down_counter"),
    ("rl.util", "%", "gauge"),
    ("rl.rate", "1/s", "gauge"),
    ("rl.ratio", "1", "counter"),
    ("rl.mem", "By", "observable_up_down_counter"),
    ("rl.t", "s", "observable_counter"),
    ("rl.o", "{dict}", "observable_gauge"),
    # what the exporter really does beyond them
    ("rl.efficiency.seconds", "s", "gauge"),  # no second _seconds
    ("rl.efficiency.pct", "%", "gauge"),
    ("rl.tokens_total", "", "counter"),  # one _total
    ("rl.tokens_total", "", "gauge"),  # a gauge keeps it
    ("rl.c_total", "s", "counter"),  # _total stripped, unit added, _total back
    ("rl.x__y..z", "", "gauge"),  # runs of invalid characters collapse
    ("rl.lat", "us", "histogram"),
    ("rl.dur", "min", "gauge"),
    ("rl.q", "{a}/s", "gauge"),
    ("rl.b", "By/s", "gauge"),
    ("rl.w", "kBy", "gauge"),
    ("rl.v", "1/{x}", "gauge"),
    ("rl.v2", "m/h", "gauge"),
    ("rl.n", "foo bar", "gauge"),
    ("rl.hist_total", "", "histogram"),
    ("Rl.Mixed.Case", "Cel", "gauge"),
]


@pytest.mark.parametrize(
    "attribute",
    ["rl.efficiency.category", "rl.bucket", "a:b", "x..y--z", "3d.view", "_ok", "Mixed.Case"],
)
def test_prometheus_label_agrees_with_the_real_exporter(attribute):
    def setup(provider):
        provider.get_meter("t").create_gauge("rl.g").set(1.0, {attribute: "v"})

    text = exposition(setup)
    sample = next(line for line in text.splitlines() if line.startswith("rl_g{"))
    assert f'{prometheus_label(attribute)}="v"' in sample, sample


@pytest.mark.parametrize(("name", "unit", "kind"), CASES)
def test_prometheus_name_agrees_with_the_real_exporter(name, unit, kind):
    text = exposition(lambda provider: emit(provider.get_meter("t"), name, unit, kind))
    types, samples = parse(text)
    assert list(types) == [prometheus_name(name, kind, unit)], text
    assert samples == set(prometheus_sample_names(name, kind, unit)), text


def test_measured_examples():
    assert prometheus_name("rl.reward.mean", "gauge", "") == "rl_reward_mean"
    assert prometheus_name("rl.vllm.prompt_tokens", "counter", "{token}") == (
        "rl_vllm_prompt_tokens_total"
    )
    assert prometheus_name("rl.efficiency.seconds", "gauge", "s") == "rl_efficiency_seconds"
    assert prometheus_name("rl.setup.duration", "gauge", "s") == "rl_setup_duration_seconds"
    with pytest.raises(ValueError, match="unknown metric kind"):
        prometheus_name("rl.x", "summary", "")


WATCHDOG_KEYS = [row.logger_key for row in default_rows.ROLLOUT_WATCHDOG]


def test_every_catalogued_series_appears_on_a_real_metrics_page_under_its_name(calls, monkeypatch):
    """The registry's real instruments, fed the fixture, exported by the real reader."""
    monkeypatch.setattr(_stats, "SNAPSHOT_TTL_S", 0.0)  # two scrapes, each its own stats
    reader, registry_ = _reader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    try:
        async_tee.start_telemetry(provider)
        logger = async_tee.Logger()
        for call in calls:
            logger.log_metrics(
                call["metrics"], call["step"], call["prefix"], None, call.get("step_finished")
            )
        assert async_tee.flush()  # step 42 said step_finished: a flush completes it
        step_42, _ = parse(prometheus_client.generate_latest(registry_).decode())
        # Step 43 logs what the fixture lacks; a page shows one step, so read both.
        extra = {"buffer_size": 3, "avg_trajectory_age": 1.5, "truncation_rate": 0.01}
        logger.log_metrics(
            {"critic/loss": 0.2, "reward": float("nan"), "reward_std": 0.1, **extra}, 43, "train"
        )
        logger.log_metrics({"accuracy": 0.5, "avg_length": 99, "pass_k": 0.75}, 43, "validation")
        # NeMo-RL's stall watchdog: held series, logged at the last completed step.
        watchdog = {key: 2.0 for key in WATCHDOG_KEYS}
        watchdog.update({"gen_fleet/shards/healthy": 3.0, "gen_fleet/restart_attempts/0": 1.0})
        logger.log_metrics(watchdog, 42)
        # A trainer's keys no series reads pass through (docs/semantics.md §13).
        logger.log_metrics({"rewards/format/mean": 0.5, "reward": 0.25}, 43, "transformers")
        logger.log_metrics({"total_validation_time": 3.5}, 43, "timing/validation", None, True)
        assert async_tee.flush()
        step_43, _ = parse(prometheus_client.generate_latest(registry_).decode())
        types = {**step_42, **step_43}
    finally:
        async_tee.shutdown_telemetry(5.0)
        provider.shutdown()
    entries = series_catalog()
    # Every series is on one of the two pages (rl.reward.mean, withdrawn by its NaN in step
    # 43, on the first); neither page repeats an older step's value.
    expected = {e.prometheus_name for e in entries}
    assert "rl_reward_mean" in step_42
    assert "rl_reward_mean" in step_43  # the trainer's reward, the NaN left out
    assert "rl_throughput_tokens_per_second" not in step_43  # not logged in step 43
    assert expected <= set(types), sorted(expected - set(types))
    for entry in entries:
        if entry.prometheus_name in types:
            assert (
                types[entry.prometheus_name]
                == {
                    "gauge": "gauge",
                    "observable_gauge": "gauge",
                    "counter": "counter",
                    "observable_counter": "counter",
                    "histogram": "histogram",
                }[entry.kind]
            )


# ---------------------------------------------------------------- the catalog


DEFAULT_NAMES = [row.name for row in default_rows.TRAINING_SCALARS + default_rows.VLLM_DELTAS]


def test_catalog_holds_every_default_derived_and_self_series():
    by_name = {entry.name: entry for entry in series_catalog()}
    for row in default_rows.TRAINING_SCALARS + default_rows.VLLM_DELTAS:
        entry = by_name[row.name]
        first_key = entry.logger_key.split(", ")[0]  # then the trainers' keys (§13)
        assert (entry.kind, entry.unit, first_key, entry.source) == (
            row.kind,
            row.unit,
            row.logger_key,
            "teed",
        )
        assert entry.attributes == ()
    assert by_name["rl.vllm.prompt_tokens"].prometheus_name == "rl_vllm_prompt_tokens_total"
    assert by_name["rl.reward.mean"].prometheus_name == "rl_reward_mean"
    assert by_name["rl.reward.mean"].logger_key.split(", ") == [
        "reward",
        "transformers:reward",
        "lightning:reward",
        "lightning:train/reward",
        "verl:critic/score/mean",
    ]
    logged = by_name["rl.logged.value"]
    assert (logged.prometheus_name, logged.source) == ("rl_logged_value", "trainer")
    assert logged.attributes == ("rl.trainer", "rl.key")
    seconds = by_name["rl.efficiency.seconds"]
    assert seconds.prometheus_name == "rl_efficiency_seconds"
    assert seconds.logger_key == "efficiency/<category>_s"
    assert seconds.attributes == (
        "rl.efficiency.category",
        "rl.efficiency.measurement",
        "rl.efficiency.window",
        "rl.bucket",
    )
    pct = by_name["rl.efficiency.pct"]
    assert pct.prometheus_name == "rl_efficiency_pct_percent"
    assert pct.attributes == ("rl.efficiency.measurement", "rl.efficiency.window")
    assert pct.logger_key == "efficiency/efficiency_pct"
    setup = by_name["rl.setup.duration"]
    assert (setup.prometheus_name, setup.attributes, setup.logger_key) == (
        "rl_setup_duration_seconds",
        ("rl.setup.phase",),
        "timing/setup:*_s",
    )
    own = {name: entry for name, entry in by_name.items() if name.startswith("async_tee.")}
    assert {spec.name for spec in self_metric_specs()} == set(own)
    assert own["async_tee.dropped"].attributes == ("reason",)
    assert own["async_tee.dropped"].prometheus_name == "async_tee_dropped_total"
    assert own["async_tee.lag"].prometheus_name == "async_tee_lag_milliseconds"
    assert all(entry.logger_key == "" and entry.source == "self" for entry in own.values())


def test_catalog_attributes_of_self_metrics_match_their_callbacks():
    snapshot = {
        "enqueued": 1,
        "recorded": 1,
        "pending": 0,
        "capacity": 8,
        "dropped_by_reason": {"overflow": 1},
        "values_skipped": {"non_finite": 1},
        "non_finite_by_series": {"rl.x": 1},
        "errors": {"tee": 1},
        "exports": {"success": 1},
        "exports_by_trigger": {"step": {"success": 1}},
        "steps": {"coalesced": 1},
        "delivery": {"queued": 1, "dropped": {"overflow": 1}},
        "worker_died": 0,
    }
    catalogued = {e.name: e.attributes for e in series_catalog() if e.source == "self"}
    for spec in self_metric_specs():
        if spec.callback is None:
            assert catalogued[spec.name] == ()
            continue
        reader = spec.callback.reading(lambda: snapshot)  # type: ignore[attr-defined]
        keys = {tuple(sorted(o.attributes or {})) for o in reader(None)}
        assert keys == {tuple(sorted(catalogued[spec.name]))}, spec.name


def test_the_rl_group_declares_the_derived_series_as_stated_once():
    declared = {
        (spec.key, spec.name, spec.kind, spec.unit)
        for spec in metrics._metric_specs()
        if spec.name in {series.name for series in _series.DERIVED}
    }
    stated = {(s.key, s.name, s.kind, s.unit) for s in _series.DERIVED}
    assert declared == stated
    assert all(s.key == registry_key(s.name) for s in _series.DERIVED)


def test_catalog_lists_user_rows():
    register_teed_metrics([TeedMetric("my/acc", "rl.my.accuracy", unit="%")])
    register_recorded_metrics([RecordedMetric("rl.host.memory", unit="By")])
    by_name = {entry.name: entry for entry in series_catalog()}
    assert by_name["rl.my.accuracy"].prometheus_name == "rl_my_accuracy_percent"
    assert by_name["rl.my.accuracy"].logger_key == "my/acc"
    assert by_name["rl.host.memory"].prometheus_name == "rl_host_memory_bytes"
    assert by_name["rl.host.memory"].source == "recorded"
    assert by_name["rl.host.memory"].logger_key == ""


def test_catalog_table_is_aligned_and_complete(capsys):
    assert cli.main(["catalog"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["OTel", "name", "Prometheus", "name"]
    assert set(lines[1]) <= {"-", " "}
    prometheus_column = lines[0].index("Prometheus name")
    kind_column = lines[0].index("kind")
    for entry in series_catalog():
        (line,) = [line for line in lines if line.split()[0] == entry.name]
        assert line[prometheus_column:kind_column].strip() == entry.prometheus_name
        assert line[kind_column:].split()[0] == entry.kind
    assert len(lines) == 2 + len(series_catalog())
    assert all(line == line.rstrip() for line in lines)


def test_catalog_json_output(capsys):
    assert cli.main(["catalog", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [item["name"] for item in data] == [entry.name for entry in series_catalog()]
    by_name = {item["name"]: item for item in data}
    for name in [*DEFAULT_NAMES, "rl.efficiency.seconds", "rl.efficiency.pct", "rl.setup.duration"]:
        assert name in by_name
    assert by_name["rl.vllm.generations.ok"] == {
        "name": "rl.vllm.generations.ok",
        "prometheus_name": "rl_vllm_generations_ok_total",
        "kind": "counter",
        "unit": "{generation}",
        "attributes": [],
        "logger_key": "vllm/generations_ok",
        "description": "Generations that completed.",
        "source": "teed",
    }
    assert by_name["async_tee.errors"]["attributes"] == ["where"]


def test_render_catalog_json_round_trips():
    entries = series_catalog()
    assert json.loads(render_catalog(entries, as_json=True)) == [e.as_dict() for e in entries]


# ---------------------------------------------------------------- collisions


# prometheus/otlptranslator's own cases (metric_namer_test.go), as the Collector and
# Prometheus 3's OTLP receiver name them by default.
OTLP_CASES = [
    ("system.filesystem.usage", "gauge", "By", "system_filesystem_usage_bytes"),
    ("system.network.io", "counter", "By", "system_network_io_bytes_total"),
    ("rl.truncation.ratio", "gauge", "1", "rl_truncation_ratio"),  # "ratio" once, at the end
    ("rl.accuracy", "gauge", "1", "rl_accuracy_ratio"),
    ("rl.accuracy", "up_down_counter", "1", "rl_accuracy"),  # gauges only
    ("rl.requests", "counter", "1", "rl_requests_total"),  # counters exempt
    ("rl.total.tokens", "counter", "{token}", "rl_tokens_total"),
    ("rl.throughput", "gauge", "{token}/s", "rl_throughput_per_second"),
    ("rl.seconds.spent", "gauge", "s", "rl_seconds_spent"),  # a token already there
    ("2xx.count", "gauge", "", "_2xx_count"),
]


@pytest.mark.parametrize(("name", "kind", "unit", "expected"), OTLP_CASES)
def test_otlp_prometheus_name_follows_the_translator(name, kind, unit, expected):
    assert otlp_prometheus_name(name, kind, unit) == expected


def test_every_catalog_series_has_one_name_on_every_path():
    for entry in series_catalog():
        assert otlp_prometheus_name(entry.name, entry.kind, entry.unit) == entry.prometheus_name


@pytest.mark.parametrize(
    ("name", "kind", "unit", "says"),
    [
        ("rl.acc", "gauge", "1", r"'rl_acc'.*'rl_acc_ratio'.*unit ''"),
        ("rl.total.tokens", "counter", "", r"'rl_total_tokens_total'.*'rl_tokens_total'.*Rename"),
        ("rl.seconds.spent", "gauge", "s", r"'rl_seconds_spent_seconds'.*'rl_seconds_spent'"),
    ],
)
def test_a_series_named_apart_behind_otlp_is_refused(name, kind, unit, says):
    with pytest.raises(ValueError, match=says):
        check_prometheus_names([(name, kind, unit)])


def test_check_prometheus_names_names_both_series():
    with pytest.raises(ValueError, match=r"'rl\.x_y'.*'rl\.x\.y'.*'rl_x_y'"):
        check_prometheus_names([("rl.x.y", "gauge", ""), ("rl.x_y", "gauge", "")])
    with pytest.raises(ValueError, match="'rl_loss'"):  # OTel lowercases instrument names
        check_prometheus_names([("rl.Loss", "gauge", "")], [("rl.loss", "gauge", "")])
    check_prometheus_names([("rl.x", "gauge", ""), ("rl.x", "gauge", "")])  # one series
    check_prometheus_names([("rl.x", "gauge", ""), ("rl.x", "counter", "")])  # x vs x_total


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param(TeedMetric("a", "rl.x.y"), TeedMetric("b", "rl.x_y"), id="dot-underscore"),
        pytest.param(TeedMetric("a", "rl.x__y"), TeedMetric("b", "rl.x_y"), id="underscore-run"),
        pytest.param(
            TeedMetric("a", "rl.lat", unit="s"), TeedMetric("b", "rl.lat_seconds"), id="unit"
        ),
        pytest.param(
            TeedMetric("a", "rl.tok", kind="counter"), TeedMetric("b", "rl.tok_total"), id="total"
        ),
        pytest.param(
            TeedMetric("a", "rl.h", kind="histogram"), TeedMetric("b", "rl.h_count"), id="sample"
        ),
    ],
)
def test_register_teed_metrics_rejects_prometheus_collisions(first, second):
    before = teed_metrics()
    with pytest.raises(ValueError, match=rf"{re.escape(second.name)}.*{re.escape(first.name)}"):
        register_teed_metrics([first, second])  # within one call
    assert teed_metrics() == before  # a failed call changes nothing
    register_teed_metrics([first])
    with pytest.raises(ValueError, match="Prometheus"):
        register_teed_metrics([second])  # across calls
    assert teed_metrics() == (*before, first)


def test_register_teed_metrics_collision_with_a_default_row():
    with pytest.raises(ValueError, match=r"rl\.reward_mean.*rl\.reward\.mean.*rl_reward_mean"):
        register_teed_metrics([TeedMetric("my_reward", "rl.reward_mean")])


def test_a_row_replacing_a_default_may_take_its_prometheus_name():
    register_teed_metrics([TeedMetric("reward", "rl.reward_mean")])  # same logger key
    assert "rl.reward.mean" not in [row.name for row in teed_metrics()]
    register_recorded_metrics([RecordedMetric("rl.policy.loss", unit="{nat}")])  # same name
    assert "rl.policy.loss" in [row.name for row in recorded_metrics()]


def test_register_teed_metrics_collision_with_a_derived_series():
    with pytest.raises(ValueError, match=r"rl\.efficiency_seconds.*rl\.efficiency\.seconds"):
        register_teed_metrics([TeedMetric("e", "rl.efficiency_seconds")])
    with pytest.raises(ValueError, match=r"rl_setup_duration_seconds"):
        register_teed_metrics([TeedMetric("d", "rl.setup.duration_seconds")])


def test_register_recorded_metrics_rejects_prometheus_collisions():
    with pytest.raises(ValueError, match=r"rl\.policy_loss.*rl\.policy\.loss"):
        register_recorded_metrics([RecordedMetric("rl.policy_loss")])
    register_recorded_metrics([RecordedMetric("rl.host.memory", unit="By")])
    with pytest.raises(ValueError, match=r"rl\.host\.memory_bytes.*rl\.host\.memory"):
        register_recorded_metrics([RecordedMetric("rl.host.memory_bytes")])
    with pytest.raises(ValueError, match=r"rl\.gpu_util.*rl\.gpu\.util"):
        register_recorded_metrics([RecordedMetric("rl.gpu.util"), RecordedMetric("rl.gpu_util")])
    assert [row.name for row in recorded_metrics()] == ["rl.host.memory"]
    # a teed row colliding with a recorded one
    with pytest.raises(ValueError, match=r"rl\.host_memory.*rl\.host\.memory"):
        register_teed_metrics([TeedMetric("mem", "rl.host_memory", unit="By")])


def test_register_metric_group_rejects_prometheus_collisions():
    with pytest.raises(ValueError, match=r"g\.x_y.*g\.x\.y"):
        register_metric_group("g", [MetricSpec("a", "g.x.y"), MetricSpec("b", "g.x_y")])
    assert group_specs("g") == ()
    register_metric_group("first", [MetricSpec("a", "g.lat", unit="s")])
    with pytest.raises(ValueError, match=r"g\.lat_seconds.*g\.lat.*g_lat_seconds"):
        register_metric_group("second", [MetricSpec("b", "g.lat_seconds")])
    assert group_specs("second") == ()
    register_metric_group("third", [MetricSpec("c", "g.lat", kind="counter", unit="ms")])
    assert registry.group_specs("third")

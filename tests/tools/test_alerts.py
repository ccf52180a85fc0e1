"""The generated alert rules: they read only the catalog's series, Prometheus's own tools
accept them, and each fires on the history it is for and not on a healthy one.

``promtool`` is Prometheus 3's, built by ``servers/build``: ``check rules`` on the generated file,
``test rules`` with one synthetic history that must fire each rule, at the time and with
the labels and annotations Prometheus would give it, and one that must not.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest

import servers
from async_tee import alerts, cli
from async_tee.catalog import series_catalog

needs_promtool = pytest.mark.servers


@pytest.fixture
def promtool() -> str:
    return servers.binary("promtool")


LABEL_NAMES = {"rl_rank", "rl_run_id"}  # resource attributes, on target_info
METRIC = re.compile(r"\b((?:rl|async_tee)_[a-z0-9_]+)\b")


def catalog_names() -> set[str]:
    names = set()
    for entry in series_catalog():
        names.add(entry.prometheus_name)
        if entry.kind == "histogram":
            names |= {entry.prometheus_name + s for s in ("_bucket", "_sum", "_count")}
    return names


def test_every_rule_reads_only_series_the_catalog_has():
    names = catalog_names()
    for rule in alerts.alert_rules():
        used = set(METRIC.findall(rule.expr)) - LABEL_NAMES
        assert used <= names, (rule.name, used - names)
        assert set(rule.metrics) <= used, rule.name


def test_a_rule_whose_series_left_the_catalog_fails(monkeypatch):
    entries = [e for e in series_catalog() if e.name != "rl.step.time"]
    monkeypatch.setattr(alerts, "series_catalog", lambda: entries)
    with pytest.raises(KeyError, match=r"rl\.step\.time"):
        alerts.alert_rules()


def test_every_rule_joins_the_run_and_rank_and_has_what_a_receiver_needs():
    rules = alerts.alert_rules()
    assert len({rule.name for rule in rules}) == len(rules)
    for rule in rules:
        assert "rl_run_id" in rule.expr, rule.name
        assert "rl_rank" in rule.expr, rule.name
        assert rule.severity in ("critical", "warning")
        assert "{{ $labels.rl_run_id }}" in rule.description, rule.name
        assert rule.summary
        assert rule.look_at


def test_thresholds_reach_the_rules():
    rules = {
        r.name: r
        for r in alerts.alert_rules(
            alerts.AlertThresholds(
                stuck_after_s=60, rollout_idle_s=120, straggler_steps=3, for_multiplier=2
            )
        )
    }
    assert "> 60 unless" in rules["RLTrainerStuck"].expr
    assert rules["RLTrainerStuck"].expr.endswith("< 60)")  # the watchdog's idle, same bound
    fresh = alerts.alert_rules(alerts.AlertThresholds(rank_silent_s=45))[0]
    assert "timestamp(rl_rollout_idle_seconds)) < 45 and" in fresh.expr  # and current
    assert rules["RLRolloutIdle"].expr.endswith("> 120")
    assert rules["RLTrainerStuck"].for_s == 600
    assert rules["RLStraggler"].expr.endswith("> 3")
    assert rules["RLNoFirstStep"].for_s == 2 * 7200


@pytest.mark.parametrize(
    ("text", "seconds"), [("300", 300), ("90s", 90), ("15m", 900), ("2h", 7200), ("1.5", 1.5)]
)
def test_durations_parse(text, seconds):
    assert alerts.parse_duration(text) == seconds


@pytest.mark.parametrize("seconds", [900, 7200, 90, 1.5, 0])
def test_durations_render_as_prometheus_reads_them(seconds):
    text = alerts.prometheus_duration(seconds)
    assert re.fullmatch(r"\d+(ms|s|m|h|d)", text)
    assert alerts.parse_duration(text) == seconds


@pytest.mark.parametrize(
    "bad", [{"queue_full_fraction": 0}, {"stuck_after_s": -1}, {"window_s": 0}]
)
def test_impossible_thresholds_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        alerts.AlertThresholds(**bad)


def test_the_command_writes_the_file_with_the_flags(tmp_path, capsys):
    out = tmp_path / "rules.yml"
    assert cli.main(["alerts", "--output", str(out), "--stuck-after", "20m"]) == 0
    assert "wrote 12 rules" in capsys.readouterr().out
    text = out.read_text()
    assert text == alerts.render_rules(alerts.AlertThresholds(stuck_after_s=1200))
    assert "target_info > 1200" in text
    with pytest.raises(SystemExit) as exited:
        cli.main(["alerts", "--stuck-after", "soon"])
    assert exited.value.code == 2


@needs_promtool
def test_promtool_accepts_the_generated_file(tmp_path, promtool):
    path = tmp_path / "rules.yml"
    path.write_text(alerts.render_rules())
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts.alert_rules())} rules found" in done.stdout


# ------------------------------------------------------------------ promtool test rules

RANK0 = {"job": "train", "instance": "h:1"}
RANK1 = {"job": "train", "instance": "h:2"}
IDENTITY = {"rl_run_id": "run-1"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    body = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def identities(*ranks: tuple[dict[str, str], int, str]) -> list[dict[str, str]]:
    """``target_info`` of each (process labels, rank, values)."""
    return [
        series("target_info", {**where, **IDENTITY, "rl_rank": str(rank)}, values)
        for where, rank, values in ranks
    ]


def expand(template: str, labels: dict[str, str], value: str) -> str:
    """A rule annotation as Prometheus renders it, for the labels and the value's text."""
    text = re.sub(r"\{\{ \$value(?: \| \w+)? \}\}", value, template)
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)


# Each rule: a history that fires it (the eval time, the alert's labels beyond alertname and
# severity, and its $value as the annotation prints it), and one that must not fire it.
SCENARIOS: dict[str, dict[str, Any]] = {
    "RLTrainerStuck": {
        # Steps every minute to minute 10, then none: over 15 min since at 25 min, for 5 min.
        "fires": [
            *identities((RANK0, 0, "1x60")),
            series("rl_step_time_seconds", RANK0, "0+60x10 600x50"),
        ],
        "quiet": [
            *identities((RANK0, 0, "1x60")),
            series("rl_step_time_seconds", RANK0, "0+60x60"),
        ],
        "at": "32m",
        "labels": {**RANK0, **IDENTITY, "rl_rank": "0"},
        "value": "22m 0s",
    },
    "RLRolloutIdle": {
        # NeMo-RL's watchdog: progress until 10 min, then idle grows a minute a minute; over
        # 10 min at 21 min, for 1 min.
        "fires": [
            *identities((RANK0, 0, "1x40")),
            series("rl_step_time_seconds", RANK0, "0+60x10 600x30"),
            series("rl_rollout_idle_seconds", RANK0, "0x10 0+60x30"),
        ],
        "quiet": [  # steps stop, but rollouts keep committing: a long step, not a hang
            *identities((RANK0, 0, "1x40")),
            series("rl_step_time_seconds", RANK0, "0+60x10 600x30"),
            series("rl_rollout_idle_seconds", RANK0, "0x10 30x30"),
        ],
        "at": "23m",
        "labels": {**RANK0, **IDENTITY, "rl_rank": "0"},
        "value": "12m 0s",
    },
    "RLNoFirstStep": {
        # Exporting (its queue's capacity) for over 2 h, and no step: start-up, not stuck.
        "fires": [
            *identities((RANK0, 0, "1x200")),
            series("async_tee_queue_capacity", RANK0, "1024x200"),
        ],
        "quiet": [
            *identities((RANK0, 0, "1x200"), (RANK1, 1, "1x200")),
            series("async_tee_queue_capacity", RANK0, "1024x200"),
            series("async_tee_queue_capacity", RANK1, "1024x200"),
            series("rl_step_time_seconds", RANK1, "_x100 6000+60x100"),  # a rank of it steps
        ],
        "at": "130m",
        "labels": {**RANK0, **IDENTITY, "rl_rank": "0"},
        "value": "1",
    },
    "RLRankGone": {
        # Rank 1 stops exporting at 10 min (gone once the 5 min lookback passes), rank 0 goes on.
        "fires": identities((RANK0, 0, "1x60"), (RANK1, 1, "1x10")),
        "quiet": identities((RANK0, 0, "1x10"), (RANK1, 1, "1x10")),  # the whole run ended
        "at": "18m",
        "labels": {**IDENTITY, "rl_rank": "1"},
        "value": "1",
    },
    "RLNonFiniteValues": {
        "fires": [
            *identities((RANK0, 0, "1x30")),
            series(
                "async_tee_non_finite_total", {**RANK0, "series": "rl.policy.loss"}, "0x10 1x20"
            ),
        ],
        "quiet": [
            *identities((RANK0, 0, "1x30")),
            series("async_tee_non_finite_total", {**RANK0, "series": "rl.policy.loss"}, "0x30"),
        ],
        "at": "12m",
        "labels": {**RANK0, **IDENTITY, "rl_rank": "0", "series": "rl.policy.loss"},
        "value": "1",
    },
    "RLStraggler": {
        # Rank 1 stops at step 10 while rank 0 goes on: 11 behind at 21 min, for 2 min.
        "fires": [
            *identities((RANK0, 0, "1x30"), (RANK1, 1, "1x30")),
            series("rl_step", RANK0, "0+1x30"),
            series("rl_step", RANK1, "0+1x10 10x20"),
        ],
        "quiet": [
            *identities((RANK0, 0, "1x30"), (RANK1, 1, "1x30")),
            series("rl_step", RANK0, "0+1x30"),
            series("rl_step", RANK1, "0+1x30"),
        ],
        "at": "25m",
        "labels": {**RANK1, **IDENTITY, "rl_rank": "1"},
        "value": "15",
    },
    "AsyncTeeExportsFailing": {
        "fires": [
            *identities((RANK0, 0, "1x30")),
            series(
                "async_tee_exports_total",
                {**RANK0, "trigger": "step", "result": "failure"},
                "0x10 2x20",
            ),
        ],
        "quiet": [
            *identities((RANK0, 0, "1x30")),
            series(
                "async_tee_exports_total", {**RANK0, "trigger": "step", "result": "failure"}, "0x30"
            ),
            series(
                "async_tee_exports_total",
                {**RANK0, "trigger": "step", "result": "success"},
                "0+1x30",
            ),
        ],
        "at": "12m",
        "labels": {**RANK0, **IDENTITY, "rl_rank": "0", "result": "failure"},
        "value": "2",
    },
    "AsyncTeeDropping": {
        "fires": [
            *identities((RANK0, 0, "1x30")),
            series("async_tee_dropped_total", {**RANK0, "reason": "overflow"}, "0x10 5x20"),
        ],
        "quiet": [
            *identities((RANK0, 0, "1x30")),
            series("async_tee_dropped_total", {**RANK0, "reason": "overflow"}, "0x30"),
        ],
        "at": "12m",
        "labels": {**RANK0, **IDENTITY, "rl_rank": "0", "reason": "overflow"},
        "value": "5",
    },
    "AsyncTeeExportsDropped": {
        "fires": [  # a receiver away past the backlog's bound: the oldest requests went
            *identities((RANK0, 0, "1x30")),
            series("async_tee_export_dropped_total", {**RANK0, "reason": "overflow"}, "0x10 7x20"),
        ],
        "quiet": [  # a long outage the backlog held: nothing dropped
            *identities((RANK0, 0, "1x30")),
            series("async_tee_export_dropped_total", {**RANK0, "reason": "overflow"}, "0x30"),
        ],
        "at": "12m",
        "labels": {**RANK0, **IDENTITY, "rl_rank": "0", "reason": "overflow"},
        "value": "7",
    },
    "AsyncTeeWorkerDied": {
        "fires": [
            *identities((RANK0, 0, "1x30")),
            series("async_tee_worker_died", RANK0, "0x10 1x20"),
        ],
        "quiet": [*identities((RANK0, 0, "1x30")), series("async_tee_worker_died", RANK0, "0x30")],
        "at": "12m",
        "labels": {**RANK0, **IDENTITY, "rl_rank": "0"},
        "value": "1",
    },
    "AsyncTeeQueueNearFull": {
        "fires": [
            *identities((RANK0, 0, "1x30")),
            series("async_tee_queue_depth", RANK0, "1000x30"),
            series("async_tee_queue_capacity", RANK0, "1024x30"),
        ],
        "quiet": [
            *identities((RANK0, 0, "1x30")),
            series("async_tee_queue_depth", RANK0, "10x30"),
            series("async_tee_queue_capacity", RANK0, "1024x30"),
        ],
        "at": "5m",
        "labels": {**RANK0, **IDENTITY, "rl_rank": "0"},
        "value": "97.66%",
    },
    "AsyncTeeLagHigh": {
        # Every record 5-10 s after its tee call: p99 9,950 ms, for 5 min.
        "fires": [
            *identities((RANK0, 0, "1x30")),
            series("async_tee_lag_milliseconds_bucket", {**RANK0, "le": "5000"}, "0x30"),
            series("async_tee_lag_milliseconds_bucket", {**RANK0, "le": "10000"}, "0+10x30"),
            series("async_tee_lag_milliseconds_bucket", {**RANK0, "le": "+Inf"}, "0+10x30"),
        ],
        "quiet": [
            *identities((RANK0, 0, "1x30")),
            series("async_tee_lag_milliseconds_bucket", {**RANK0, "le": "5000"}, "0+10x30"),
            series("async_tee_lag_milliseconds_bucket", {**RANK0, "le": "10000"}, "0+10x30"),
            series("async_tee_lag_milliseconds_bucket", {**RANK0, "le": "+Inf"}, "0+10x30"),
        ],
        "at": "12m",
        "labels": {**RANK0, **IDENTITY, "rl_rank": "0"},
        "value": "9950",
    },
}


def test_every_rule_has_a_scenario():
    assert set(SCENARIOS) == {rule.name for rule in alerts.alert_rules()}


def unit_tests(rules: list[alerts.AlertRule]) -> dict[str, Any]:
    """promtool's test file: per rule, the firing history and the quiet one."""
    tests = []
    for rule in rules:
        scenario = SCENARIOS[rule.name]
        labels = {**scenario["labels"], "severity": rule.severity}
        annotations = {
            key: expand(text, scenario["labels"], scenario["value"])
            for key, text in rule.annotations().items()
        }
        expected = [{"exp_labels": labels, "exp_annotations": annotations}]
        for history, alerts_expected in (("fires", expected), ("quiet", [])):
            tests.append(
                {
                    "name": f"{rule.name} {history}",
                    "interval": "1m",
                    "input_series": scenario[history],
                    "alert_rule_test": [
                        {"eval_time": scenario["at"], "alertname": other.name, "exp_alerts": []}
                        for other in rules
                        if other.name != rule.name and history == "quiet"
                    ]
                    + [
                        {
                            "eval_time": scenario["at"],
                            "alertname": rule.name,
                            "exp_alerts": alerts_expected,
                        }
                    ],
                }
            )
    return {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}


@needs_promtool
def test_each_rule_fires_on_its_history_and_nothing_fires_on_a_quiet_one(tmp_path, promtool):
    rules = alerts.alert_rules()
    (tmp_path / "rules.yml").write_text(alerts.render_rules())
    (tmp_path / "tests.yml").write_text(json.dumps(unit_tests(rules), indent=1))
    done = subprocess.run(
        [promtool, "test", "rules", "tests.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_a_stuck_rank_pends_before_it_fires(tmp_path, promtool):
    """The stuck rule's ``for:``: pending is not firing (promtool reports only firing)."""
    rule = next(r for r in alerts.alert_rules() if r.name == "RLTrainerStuck")
    scenario = SCENARIOS[rule.name]
    (tmp_path / "rules.yml").write_text(alerts.render_rules())
    test = unit_tests([rule])
    test["tests"] = test["tests"][:1]
    test["tests"][0]["alert_rule_test"][0]["eval_time"] = "28m"  # pending since 25 min
    test["tests"][0]["alert_rule_test"][0]["exp_alerts"] = []
    (tmp_path / "tests.yml").write_text(json.dumps(test))
    done = subprocess.run(
        [promtool, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert scenario["at"] == "32m"  # and fired by then: the test above


@needs_promtool
@pytest.mark.parametrize(
    ("idle", "at", "value"),
    [
        ("0x10 30x50", "32m", None),  # rollouts committing: a long step, not a hang
        ("0x10 0+10x50", "36m", None),  # a small growing idle, logged: still not a hang
        ("0x10 0+60x50", "32m", "22m 0s"),  # no rollout committed for as long: a hang
        # The watchdog stops logging at 28 min with its last idle small (its rank withdraws
        # the held value; the rank's other series go on). Stale 3 min later, at 31 min: pending,
        # and firing 5 min on. Its last sample is still inside the 5-minute lookback until
        # 33 min, so a rule that asked only whether the idle is low would still be quiet at 36.
        ("0x10 0.5x17", "36m", "26m 0s"),
    ],
    ids=["committing", "growing-small", "idle-long", "watchdog-stopped"],
)
def test_a_long_step_with_rollouts_committing_is_not_stuck(tmp_path, promtool, idle, at, value):
    """The stuck rule's history, with NeMo-RL's watchdog: steps stop at 10 min; while the
    watchdog reports, current, that rollouts commit it is a long step, not a hang; once its
    reports stop, its last idle vouches for nothing."""
    rule = next(r for r in alerts.alert_rules() if r.name == "RLTrainerStuck")
    scenario = SCENARIOS[rule.name]
    history = [*scenario["fires"], series("rl_rollout_idle_seconds", RANK0, idle)]
    test = unit_tests([rule])
    test["tests"] = test["tests"][:1]
    test["tests"][0]["input_series"] = history
    expected = test["tests"][0]["alert_rule_test"][0]
    expected["eval_time"] = at
    if value is None:
        expected["exp_alerts"] = []
    else:
        for annotations in (a["exp_annotations"] for a in expected["exp_alerts"]):
            annotations["description"] = expand(rule.description, scenario["labels"], value)
    (tmp_path / "rules.yml").write_text(alerts.render_rules())
    (tmp_path / "tests.yml").write_text(json.dumps(test))
    done = subprocess.run(
        [promtool, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr

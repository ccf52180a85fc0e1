"""The Grafana dashboard: built from the catalog, every series on a panel, every query by rank."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

pytest.importorskip("grafana_foundation_sdk")

import async_tee
from async_tee import alerts, cli, dashboard
from async_tee.catalog import series_catalog
from async_tee.vocabulary import RecordedMetric, TeedMetric

CHOSEN = 'target_info{rl_run_id=~"$run", rl_rank=~"$rank"}'
RANK_JOIN = "* on (job, instance) group_left (rl_rank, rl_run_id) " + CHOSEN


def leaf_panels(board):
    """Every panel that is not a row, with the title of the row it sits under."""
    found, row = [], None
    for item in board["panels"]:
        if item["type"] == "row":
            row = item["title"]
            found += [(row, nested) for nested in item.get("panels", [])]
        else:
            found.append((row, item))
    return found


def panels_by_title(board):
    return {panel["title"]: (row, panel) for row, panel in leaf_panels(board)}


def test_json_round_trips_with_the_six_variables_and_the_datasource_everywhere():
    board = json.loads(dashboard.render_dashboard("my-prometheus"))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "run", "instance", "rank", "key"]
    source = variables["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    assert source["current"]["value"] == "my-prometheus"
    assert variables["job"]["query"] == "label_values(target_info, job)"
    assert variables["run"]["query"] == 'label_values(target_info{job=~"$job"}, rl_run_id)'
    chosen_run = 'target_info{job=~"$job", rl_run_id=~"$run"}'
    assert variables["instance"]["query"] == f"label_values({chosen_run}, instance)"
    assert variables["rank"]["query"] == f"label_values({chosen_run}, rl_rank)"
    assert variables["key"]["query"] == 'label_values(rl_logged_value{job=~"$job"}, rl_key)'
    for name in ("job", "run", "instance", "rank", "key"):
        assert variables[name]["multi"] is True, name
        assert variables[name]["includeAll"] is True, name
        assert variables[name]["allValue"] == ".*"
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    panels = leaf_panels(board)
    assert panels
    for _, panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    rows = [item["id"] for item in board["panels"] if item["type"] == "row"]
    ids = rows + [panel["id"] for _, panel in panels]
    assert len(ids) == len(set(ids))


def test_every_catalog_series_is_queried_and_every_query_joins_the_rank():
    board = dashboard.build_dashboard()
    queries = dashboard.panel_queries(board)
    for entry in series_catalog():
        pattern = rf"\b{re.escape(entry.prometheus_name)}(_bucket)?\{{"
        assert any(re.search(pattern, q) for q in queries), entry.prometheus_name
    for row, panel in leaf_panels(board):
        if not row.startswith("Alerts"):  # the rules' own join: every rank, with its run
            assert panel["targets"][0]["expr"].count(RANK_JOIN) == 1, panel["title"]


def test_the_alerts_row_plots_what_each_rule_compares_and_firing_alerts_annotate():
    board = dashboard.build_dashboard()
    panels = panels_by_title(board)
    plotted = [rule for rule in alerts.alert_rules() if rule.quantity is not None]
    assert len(plotted) >= 8
    for rule in plotted:
        row, panel = panels[f"{rule.name}: {rule.summary}"]
        assert row.startswith("Alerts")
        assert rule.quantity is not None
        expr = panel["targets"][0]["expr"]
        quantity = alerts.with_selector(rule.quantity, 'job=~"$job", instance=~"$instance"')
        chosen = f"and on (rl_run_id, rl_rank) group by (rl_run_id, rl_rank) ({CHOSEN})"
        assert expr == f"({quantity}) {chosen}"  # every rank as the rule sees it; then chosen
        assert alerts.without_selector(rule.quantity) in rule.expr or "increase(" in expr
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps[-1]["value"] == rule.threshold
    (annotation,) = board["annotations"]["list"]
    assert annotation["expr"] == 'ALERTS{alertstate="firing"}'


def test_the_families_land_in_their_rows_with_their_query_shapes():
    panels = panels_by_title(dashboard.build_dashboard())
    row, reward = panels["rl.reward.mean"]
    assert row == "Training scalars"
    assert reward["targets"][0]["expr"] == (
        'rl_reward_mean{job=~"$job", instance=~"$instance"} ' + RANK_JOIN
    )
    assert reward["targets"][0]["legendFormat"] == "rank {{rl_rank}}"
    row, tokens = panels["rl.vllm.generation_tokens /s"]
    assert row == "vLLM"
    assert tokens["targets"][0]["expr"].startswith(
        'rate(rl_vllm_generation_tokens_total{job=~"$job", instance=~"$instance"}'
        "[$__rate_interval]) * on"
    )
    assert panels["rl.vllm.generation_tokens per $__rate_interval"][0] == "vLLM"
    row, efficiency = panels["rl.efficiency.seconds by category (mean over the selected ranks)"]
    assert row == "Efficiency"
    assert efficiency["targets"][0]["legendFormat"] == "{{rl_efficiency_category}}"
    assert "by (rl_efficiency_category, rl_bucket)" in efficiency["targets"][0]["expr"]
    row, setup = panels["rl.setup.duration by phase (slowest selected rank)"]
    assert (row, setup["type"]) == ("Start-up phases", "bargauge")
    row, since = panels["Seconds since the last step"]
    assert row == "Step and liveness"
    assert since["targets"][0]["expr"].startswith("(time() - rl_step_time_seconds{")
    row, lag = panels["async_tee.lag p99"]
    assert row == "async_tee health"
    assert lag["targets"][0]["expr"].startswith(
        "histogram_quantile(0.99, sum by (le, job, instance) "
        "(rate(async_tee_lag_milliseconds_bucket{"
    )
    assert panels["async_tee.exports /s"][1]["targets"][0]["legendFormat"] == (
        "rank {{rl_rank}} {{trigger}} {{result}}"
    )


def test_panel_queries_reads_panels_nested_in_collapsed_rows():
    board = dashboard.build_dashboard()
    health = next(item for item in board["panels"] if item["title"] == "async_tee health")
    assert health["collapsed"] is True
    nested = [t["expr"] for p in health["panels"] for t in p["targets"]]
    assert nested
    assert set(nested) <= set(dashboard.panel_queries(board))


def test_a_declared_row_gets_a_panel_with_no_other_change():
    async_tee.register_teed_metrics(
        [
            TeedMetric("my/acc", "rl.my.accuracy", unit="%"),
            TeedMetric("my/samples", "rl.my.samples", kind="counter", unit="{sample}"),
        ]
    )
    async_tee.register_recorded_metrics([RecordedMetric("rl.my.latency", "histogram", "ms")])
    board = dashboard.build_dashboard()
    panels = panels_by_title(board)
    row, accuracy = panels["rl.my.accuracy"]
    assert row == "Training scalars"
    assert accuracy["targets"][0]["expr"].startswith("rl_my_accuracy_percent{")
    assert accuracy["fieldConfig"]["defaults"]["unit"] == "percent"
    row, samples = panels["rl.my.samples /s"]
    assert row == "Other"
    assert samples["targets"][0]["expr"].startswith("rate(rl_my_samples_total{")
    row, latency = panels["rl.my.latency p99"]
    assert row == "Other"
    assert "rl_my_latency_milliseconds_bucket{" in latency["targets"][0]["expr"]


def test_expand_variables_leaves_no_dollar_in_any_query():
    for query in dashboard.panel_queries(dashboard.build_dashboard()):
        expanded = dashboard.expand_variables(query, rate_interval="30s")
        assert "$" not in expanded, expanded
    query = 'rate(x{job=~"$job", instance=~"${instance}"}[$__rate_interval]) ' + RANK_JOIN
    assert dashboard.expand_variables(query, {"rank": "0|3"}) == (
        'rate(x{job=~".*", instance=~".*"}[1m]) '
        "* on (job, instance) group_left (rl_rank, rl_run_id) "
        'target_info{rl_run_id=~".*", rl_rank=~"0|3"}'
    )
    with pytest.raises(ValueError, match=r"\$nope"):
        dashboard.expand_variables("x{a=~'$nope'}")


def test_cli_writes_the_file_with_output_and_json_to_stdout_without(tmp_path, capsys):
    path = tmp_path / "board.json"
    assert cli.main(["dashboard", "--datasource", "prom-uid", "--output", str(path)]) == 0
    board = json.loads(path.read_text())
    panels = len(dashboard.panel_queries(board))
    out = capsys.readouterr().out.strip()
    assert out == f"async-tee dashboard: wrote {panels} panels to {path}"
    assert board["templating"]["list"][0]["current"]["value"] == "prom-uid"

    assert cli.main(["dashboard"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["templating"]["list"][0]["current"]["value"] == "prometheus"
    assert dashboard.panel_queries(printed) == dashboard.panel_queries(board)


def test_cli_without_the_sdk_names_the_extra_and_exits_1(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "grafana_foundation_sdk", None)  # import now fails
    assert cli.main(["dashboard"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert dashboard.INSTALL_HINT in lines[0]
    assert "pip install '.[dashboard]'" in lines[0]


def test_importing_async_tee_or_the_cli_loads_neither_the_module_nor_the_sdk():
    code = (
        "import sys, async_tee, async_tee.cli\n"
        "assert 'async_tee.dashboard' not in sys.modules\n"
        "import async_tee.dashboard\n"
        "assert not [m for m in sys.modules if m.startswith('grafana_foundation_sdk')]\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr

"""``async-tee stack``: the files of each path, and what each must set (the end-to-end tests
run these same configs in the real servers: tests/e2e/test_paths.py)."""

from __future__ import annotations

import pytest

from async_tee import cli, stack


def test_the_cli_offers_exactly_the_stack_paths():
    for path in stack.PATHS:
        assert cli._parser().parse_args(["stack", "--output", "x", "--path", path]).path == path
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["stack", "--output", "x", "--path", "carrier-pigeon"])


@pytest.mark.parametrize("path", stack.PATHS)
def test_each_path_writes_its_files_and_sets_what_it_needs(path, tmp_path, capsys):
    assert cli.main(["stack", "--output", str(tmp_path), "--path", path]) == 0
    assert f"for the {path} path" in capsys.readouterr().out
    written = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    collector = path in stack.COLLECTOR_PATHS
    assert ("otelcol.yaml" in written) is collector
    assert {"prometheus.yml", "rules.yml", "compose.yaml", "ranks.env"} <= written
    prometheus = (tmp_path / "prometheus.yml").read_text()
    compose = (tmp_path / "compose.yaml").read_text()
    assert stack.PROMETHEUS_IMAGE in compose
    assert (stack.COLLECTOR_IMAGE in compose) is collector
    assert ("honor_labels: true" in prometheus) is (path == "collector")
    for flag in stack.prometheus_flags(path):
        assert flag in compose
    if collector:
        included = ", ".join(f'"{name}"' for name in stack.PROMOTED)
        config = (tmp_path / "otelcol.yaml").read_text()
        assert f"resource_constant_labels:\n      included: [{included}]" in config
    assert ("promote_resource_attributes" in prometheus) is (path == "otlp")
    env = dict(line.split("=", 1) for line in (tmp_path / "ranks.env").read_text().split())
    assert env["OTEL_METRICS_EXPORTER"] == ("prometheus" if path == "scrape" else "otlp")
    if path == "otlp":  # Prometheus takes OTLP over HTTP only
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
        assert env["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"].endswith("/api/v1/otlp/v1/metrics")


def test_an_unknown_path_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="scrape"):
        stack.render_stack("carrier-pigeon")
    with pytest.raises(ValueError, match="no Collector"):
        stack.collector_config("otlp", stack.StackAddresses())


def test_the_remote_write_collector_keeps_what_it_accepts_on_disk_and_sends_it_in_order():
    """What the real Collector does with these keys: tests/e2e/test_collector_restart.py."""
    yaml = pytest.importorskip("yaml")
    at = stack.StackAddresses(collector_data="/data/otelcol")
    files = stack.render_stack("remote-write", at)
    config = yaml.safe_load(files["otelcol.yaml"])
    pipeline = config["service"]["pipelines"]["metrics"]
    assert pipeline["processors"] == ["memory_limiter"]  # first; no batch holds what it took
    exporter = config["exporters"]["prometheus_remote_write"]
    assert exporter["wal"]["directory"] == "/data/otelcol"  # the log, on the volume
    assert exporter["remote_write_queue"] == {"enabled": False}  # answered once in the log
    assert exporter["max_batch_request_parallelism"] == 1  # one request at a time: in order
    assert exporter["retry_on_failure"]["max_elapsed_time"] == "0s"  # never given up
    assert "extensions" not in config  # nothing uses file_storage: the exporter has no queue
    compose = yaml.safe_load(files["compose.yaml"])
    assert "otelcol-data:/data/otelcol" in compose["services"]["otelcol"]["volumes"]
    assert compose["volumes"] == {"otelcol-data": {}}
    assert compose["services"]["otelcol"]["restart"] == "unless-stopped"


def test_the_collector_path_limits_memory_and_keeps_nothing_to_send():
    yaml = pytest.importorskip("yaml")
    files = stack.render_stack("collector")
    config = yaml.safe_load(files["otelcol.yaml"])
    assert config["service"]["pipelines"]["metrics"]["processors"] == ["memory_limiter"]
    assert "sending_queue" not in config["exporters"]["prometheus"]  # pulled: nothing waits
    assert "volumes" not in yaml.safe_load(files["compose.yaml"])


def test_the_node_agent_answers_once_on_disk_and_forwards_in_order_without_giving_up():
    """What the real agent does with these keys: tests/e2e/test_fleet.py."""
    yaml = pytest.importorskip("yaml")
    from async_tee.stack.agent import AgentSettings, agent_config

    at = AgentSettings(data="/node/otelcol", store_otlp="http://store:19291/api/v1/otlp/v1/metrics")
    config = yaml.safe_load(agent_config(at))
    assert config["extensions"]["file_storage"]["directory"] == "/node/otelcol"
    assert config["extensions"]["file_storage"]["fsync"] is True  # accepted = on disk
    assert config["service"]["extensions"] == ["file_storage"]
    assert config["service"]["pipelines"]["metrics"] == {
        "receivers": ["otlp"],
        "processors": ["memory_limiter"],  # no batch processor holds what it took in memory
        "exporters": ["otlp_http"],
    }
    exporter = config["exporters"]["otlp_http"]
    assert exporter["metrics_endpoint"] == at.store_otlp
    queue = exporter["sending_queue"]
    assert queue["storage"] == "file_storage"  # the queue is the one on disk
    assert queue["num_consumers"] == 1  # one send at a time: a rank's samples in order
    assert queue["queue_size"] == at.queue_requests  # bounded: past it, refused retryably
    assert queue["batch"]["min_size"] == at.batch_points
    assert exporter["retry_on_failure"]["max_elapsed_time"] == "0s"  # never given up


def test_the_fleet_writes_the_agent_the_store_and_what_each_rank_sets(tmp_path, capsys):
    """The same flags run the real store in tests/e2e/test_fleet.py (servers.run_store)."""
    yaml = pytest.importorskip("yaml")
    from async_tee.stack import fleet

    assert cli.main(["stack", "--output", str(tmp_path), "--path", "fleet"]) == 0
    assert "for the fleet path" in capsys.readouterr().out
    written = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert {"agent.yaml", "rules.yml", "compose.yaml", "ranks.env"} <= written
    assert "prometheus.yml" not in written  # the store is Thanos: Query serves its API
    at = fleet.FleetAddresses()
    compose = yaml.safe_load((tmp_path / "compose.yaml").read_text())
    services = compose["services"]
    parts = ["router", "receive-0", "receive-1", "receive-2", "query", "rule"]
    assert set(services) == {"agent", "grafana", *parts}
    assert services["router"]["command"] == fleet.router_argv(at)
    assert services["receive-1"]["command"] == fleet.receiver_argv(at, 1)
    assert all(services[p]["image"] == fleet.THANOS_IMAGE for p in parts)
    router = services["router"]["command"]
    assert "--receive.replication-factor=2" in router
    for name in stack.PROMOTED:  # the router translates OTLP: it promotes the identity
        assert f"--receive.otlp-promote-resource-attributes={name}" in router
    assert not any(flag.startswith("--receive.local-endpoint") for flag in router)  # routes
    assert "--deduplication.func=chain" in services["query"]["command"]
    agent = yaml.safe_load((tmp_path / "agent.yaml").read_text())
    assert agent["exporters"]["otlp_http"]["metrics_endpoint"] == at.otlp_url
    assert services["agent"]["ports"] == ["127.0.0.1:4317:4317", "127.0.0.1:4318:4318"]
    env = dict(line.split("=", 1) for line in (tmp_path / "ranks.env").read_text().split())
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://localhost:4318"  # the node's agent
    datasource = (tmp_path / "grafana/datasources/prometheus.yaml").read_text()
    assert f"url: http://{at.query.http}" in datasource


def test_a_replication_factor_the_ring_cannot_hold_is_refused():
    from async_tee.stack import fleet

    with pytest.raises(ValueError, match="replication_factor 4 needs 1 to 3 receivers"):
        fleet.FleetAddresses(replication_factor=4)

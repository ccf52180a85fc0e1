"""The command line: the sink in the foreground (both protocols, SIGTERM), the demo, usage."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpExporter,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.resources import Resource

import async_tee
from async_tee import cli, demo
from async_tee._declare import shipped as default_rows

BOUND_S = 20.0  # generous: these machines are shared and noisy
ROOT = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    """The environment without any OTLP endpoint, so the demo uses its embedded sink."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ASYNC_TEE_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Lines:
    """Reads a subprocess's stdout (or ``stream``) on a thread, so a test can wait for a line."""

    def __init__(self, proc: subprocess.Popen[str], stream: IO[str] | None = None) -> None:
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        source = proc.stdout if stream is None else stream
        assert source is not None
        self.thread = threading.Thread(target=self._read, args=(source,), daemon=True)
        self.thread.start()

    def _read(self, source: IO[str]) -> None:
        for line in source:
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

    def wait_for(self, predicate, timeout_s: float = BOUND_S) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no matching line within {timeout_s} s; saw {self.seen}")
            try:
                line = self.queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"stdout closed; saw {self.seen}")
            self.seen.append(line)
            if predicate(line):
                return line

    def rest(self) -> list[str]:
        self.thread.join(BOUND_S)
        out = []
        while not self.queue.empty():
            line = self.queue.get()
            if line is not None:
                out.append(line)
        self.seen += out
        return out


def sink_command(grpc_port: int, http_port: int, *options: str) -> list[str]:
    return [
        *(sys.executable, "-m", "async_tee", "sink", *options),
        *("--grpc-port", str(grpc_port), "--http-port", str(http_port)),
    ]


@pytest.fixture
def sink_process() -> Iterator[tuple[subprocess.Popen[str], Lines, int, int]]:
    grpc_port, http_port = free_port(), free_port()
    proc = subprocess.Popen(
        sink_command(grpc_port, http_port),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=clean_env(),
    )
    try:
        yield proc, Lines(proc), grpc_port, http_port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(BOUND_S)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def export_one(
    protocol: str,
    grpc_port: int,
    http_port: int,
    name: str,
    value: float,
    resource: Resource | None = None,
) -> None:
    """Send one gauge point with the real OTLP exporter of ``protocol``."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[reader],
        resource=Resource.create() if resource is None else resource,  # the SDK's default
        shutdown_on_exit=False,
    )
    provider.get_meter("cli-test").create_gauge(name, unit="s").set(value, {"proto": protocol})
    data = reader.get_metrics_data()
    provider.shutdown()
    assert data is not None
    exporter: GrpcExporter | HttpExporter
    if protocol == "grpc":
        exporter = GrpcExporter(endpoint=f"http://127.0.0.1:{grpc_port}", insecure=True)
    else:
        exporter = HttpExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/metrics")
    try:
        assert exporter.export(data, timeout_millis=10_000) is MetricExportResult.SUCCESS
    finally:
        exporter.shutdown()


@pytest.mark.slow
def test_sink_prints_points_from_both_protocols_and_exits_0_on_sigterm(sink_process):
    proc, lines, grpc_port, http_port = sink_process
    banner = lines.wait_for(lambda line: "receiving OTLP metrics" in line)
    assert f"127.0.0.1:{grpc_port}" in banner
    assert f"127.0.0.1:{http_port}/v1/metrics" in banner
    rank_3 = Resource({"service.instance.id": "job-7/rank-3", "rl.rank": 3})
    export_one("grpc", grpc_port, http_port, "rl.cli.grpc", 1.5, rank_3)
    grpc_line = lines.wait_for(lambda line: "rl.cli.grpc" in line)
    assert grpc_line == "[grpc job-7/rank-3] rl.cli.grpc{proto='grpc'} = 1.5 s (gauge)"
    rank_4 = Resource({"service.instance.id": "job-7/rank-4", "rl.rank": 4})
    export_one("http", grpc_port, http_port, "rl.cli.http", 2.5, rank_4)
    http_line = lines.wait_for(lambda line: "rl.cli.http" in line)
    assert http_line == "[http job-7/rank-4] rl.cli.http{proto='http'} = 2.5 s (gauge)"
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(BOUND_S) == 0
    assert time.monotonic() - started < BOUND_S
    assert any("stopped; received 2 points in 1 gRPC and 1 HTTP" in line for line in lines.rest())


@pytest.mark.slow
def test_sink_stops_cleanly_on_ctrl_c(sink_process):
    proc, lines, _, _ = sink_process
    lines.wait_for(lambda line: "receiving OTLP metrics" in line)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(BOUND_S) == 0
    assert any("stopped; received 0 points" in line for line in lines.rest())
    assert proc.stderr is not None
    assert "Traceback" not in proc.stderr.read()


@pytest.mark.slow
def test_sink_json_prints_only_json_lines_on_stdout():
    grpc_port, http_port = free_port(), free_port()
    with subprocess.Popen(
        sink_command(grpc_port, http_port, "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=clean_env(),
    ) as proc:
        out, err = Lines(proc), Lines(proc, proc.stderr)
        try:
            banner = err.wait_for(lambda line: "receiving OTLP metrics" in line)
            assert f"127.0.0.1:{http_port}/v1/metrics" in banner
            for rank, protocol in enumerate(("grpc", "http")):
                resource = Resource({"service.instance.id": f"job-7/rank-{rank}", "rl.rank": rank})
                export_one(
                    protocol, grpc_port, http_port, f"rl.cli.{protocol}", rank + 0.5, resource
                )
                out.wait_for(lambda line, p=protocol: f"rl.cli.{p}" in line)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(BOUND_S) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        out.rest()  # read both to the end: `seen` then holds every line
        err.rest()
        stdout, stderr = out.seen, err.seen
    assert not any("receiving OTLP metrics" in line for line in stdout)
    rows = [json.loads(line) for line in stdout]  # every stdout line is one JSON object
    assert [(row["protocol"], row["name"], row["value"]) for row in rows] == [
        ("grpc", "rl.cli.grpc", 0.5),
        ("http", "rl.cli.http", 1.5),
    ]
    assert [row["resource"] for row in rows] == [
        {"service.instance.id": "job-7/rank-0", "rl.rank": 0},
        {"service.instance.id": "job-7/rank-1", "rl.rank": 1},
    ]
    assert rows[0]["kind"] == "gauge"
    assert rows[0]["unit"] == "s"
    assert rows[0]["attributes"] == {"proto": "grpc"}
    assert rows[0]["scope"] == "cli-test"
    assert rows[0]["time_unix_nano"] > 0
    assert any("stopped; received 2 points in 1 gRPC and 1 HTTP" in line for line in stderr)
    assert not any("Traceback" in line for line in stderr)


@pytest.mark.slow
def test_sink_quiet_prints_no_points():
    grpc_port, http_port = free_port(), free_port()
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "async_tee",
            "sink",
            "--quiet",
            "--grpc-port",
            str(grpc_port),
            "--http-port",
            str(http_port),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=clean_env(),
    ) as proc:
        lines = Lines(proc)
        try:
            lines.wait_for(lambda line: "receiving OTLP metrics" in line)
            export_one("grpc", grpc_port, http_port, "rl.cli.quiet", 1.0)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(BOUND_S) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        rest = lines.rest()
    assert not any("rl.cli.quiet" in line for line in rest)
    assert any("stopped; received 1 points" in line for line in rest)


def test_sink_reports_a_port_it_cannot_bind(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["sink", "--http-port", str(port), "--grpc-port", "0"]) == 1
    assert "cannot listen" in capsys.readouterr().err


# ---------------------------------------------------------------- demo


def default_series_names() -> set[str]:
    names = {row.name for row in default_rows.TRAINING_SCALARS + default_rows.VLLM_DELTAS}
    return names | {"rl.efficiency.seconds", "rl.efficiency.pct", "rl.setup.duration"}


EXPORTS_LINE = re.compile(r"^  exports: (\d+) = (.+); (\d+) succeeded, (\d+) failed\.$", re.M)
EXPORT_PART = re.compile(
    r"(\d+) (step exports|periodic|on flush|at shutdown)(?: \((\d+) failed\))?"
)
TRIGGERS = {
    "step exports": "step",
    "periodic": "interval",
    "on flush": "flush",
    "at shutdown": "shutdown",
}
STEPS_LINE = re.compile(
    r"^  steps: (\d+) completed = (\d+) with an export of their own \+ (\d+) coalesced "
    r"into a later one(?:; each of the (\d+) in a step export of its own|; (\d+) of them in step "
    r"exports|; (\d+) in step exports \+ the last in the export at shutdown)?\.$",
    re.M,
)
TABLE_EXPORTS = re.compile(
    r"^  async_tee\.exports +(\d+) +\{export\} +result=success trigger=(\w+)$", re.M
)


def assert_demo_figures_agree(report: str, stats: dict[str, Any] | None = None) -> None:
    """The report's export and step figures add up, to each other and to ``stats``.

    The per-trigger exports add up to the total it prints; the steps exported are the step
    exports it prints plus the step the shutdown export carried; the table's
    ``async_tee.exports`` rows (the sink's last export, which cannot count itself) agree
    with the summary; and with ``stats``, every printed figure is the one stats() gave.
    """
    exports = EXPORTS_LINE.findall(report)
    assert len(exports) == 1, report
    total, parts_text, succeeded, failed = exports[0]
    parts = {}
    for part in parts_text.split(" + "):
        match = EXPORT_PART.fullmatch(part)
        assert match, f"not a count by trigger: {part!r}"
        parts[TRIGGERS[match[2]]] = (int(match[1]), int(match[3] or 0))
    assert sum(n for n, _ in parts.values()) == int(total), exports[0]
    assert int(succeeded) + int(failed) == int(total), exports[0]
    assert sum(f for _, f in parts.values()) == int(failed), exports[0]
    step_exports = parts.get("step", (0, 0))[0]

    steps = STEPS_LINE.findall(report)
    assert len(steps) == 1, report
    completed, exported, coalesced, each, of_them, then_shutdown = steps[0]
    assert int(completed) == int(exported) + int(coalesced), steps[0]
    if each:
        assert int(each) == int(exported) == step_exports, steps[0]
    elif then_shutdown:
        assert int(then_shutdown) == step_exports == int(exported) - 1, steps[0]
        assert "shutdown" in parts, exports[0]
    elif of_them:
        assert int(of_them) == step_exports, steps[0]
    else:
        assert int(exported) == 0, steps[0]

    table = {trigger: int(value) for value, trigger in TABLE_EXPORTS.findall(report)}
    if table and parts.get("shutdown", (0, 1))[1] == 0:  # the shutdown export arrived last
        for trigger, (attempts, failures) in parts.items():
            expected = 0 if trigger == "shutdown" else attempts - failures
            assert table[trigger] == expected, (trigger, table, parts)

    if stats is not None:
        assert int(total) == stats["exports"]["success"] + stats["exports"]["failure"]
        assert int(succeeded) == stats["exports"]["success"]
        assert int(failed) == stats["exports"]["failure"]
        for trigger, counts in stats["exports_by_trigger"].items():
            attempts = counts["success"] + counts["failure"]
            assert parts.get(trigger, (0, 0)) == (attempts, counts["failure"]), trigger
        assert step_exports == sum(stats["exports_by_trigger"]["step"].values())
        assert int(completed) == stats["steps"]["completed"]
        assert int(exported) == stats["steps"]["exported"]
        assert int(coalesced) == stats["steps"]["coalesced"]


def test_demo_end_to_end_receives_every_default_series(tmp_path):
    jsonl = tmp_path / "demo.jsonl"
    progress = tmp_path / "progress.txt"
    with progress.open("w", encoding="utf-8") as stream:
        result = demo.run(steps=3, step_seconds=0.05, jsonl_path=jsonl, progress=stream)
    assert result.ok
    assert result.mode == "embedded"
    assert not result.stalled
    assert result.missing_defaults == []
    assert result.series is not None
    received = {series.name for series in result.series}
    assert default_series_names() <= received
    categories = {
        s.attributes["rl.efficiency.category"]
        for s in result.series
        if s.name == "rl.efficiency.seconds"
    }
    assert categories == set(default_rows.EFFICIENCY_CATEGORIES)
    assert {"async_tee.enqueued", "async_tee.dropped", "async_tee.lag"} <= received
    # Step-aligned export: every step each series was logged in arrived as its own point.
    per_step = [s for s in result.series if s.steps_logged is not None]
    assert {s.name for s in per_step} >= {"rl.reward.mean", "rl.step", "rl.setup.duration"}
    for s in per_step:
        assert s.steps_received == s.steps_logged, s.name
    # the rollout keys are logged twice a step: each delta still counts once
    for name, check in result.counter_checks.items():
        assert check["received"] == check["logged"], name
    logged = result.counter_checks["rl.vllm.generations.ok"]["logged"]
    assert logged is not None
    assert logged > 0
    assert result.delivered
    stats = result.stats
    assert stats["dropped"] == 0
    assert stats["pending"] == 0
    # setup, then per step: train x2, performance, "" and timing/train (all teed now)
    assert stats["enqueued"] == stats["recorded"] == 1 + 3 * 5
    assert stats["exports"]["success"] >= 1
    assert stats["exports"]["failure"] == 0
    assert result.latency_us["all"]["calls"] == 1 + 3 * 5 + result.monitor_calls
    assert result.monitor_calls >= 1
    assert set(result.latency_us) >= {"train", '""', "timing/setup", "timing/train", "ray"}
    assert result.latency_us["train"]["tee"]["p50"] > 0
    assert result.jsonl_path == str(jsonl)
    lines = jsonl.read_text(encoding="utf-8").splitlines()
    assert len(lines) == result.jsonl_lines == result.latency_us["all"]["calls"]
    assert {json.loads(line)["prefix"] for line in lines} == {
        "timing/setup",
        "train",
        "performance",
        "",
        "timing/train",
        "ray",
    }
    assert len(progress.read_text(encoding="utf-8").splitlines()) == 3
    report = demo.render_result(result)
    assert "Every default series arrived" in report
    assert "rl.vllm.prompt_tokens" in report
    assert "µs" in report
    assert_demo_figures_agree(report, stats)
    json.dumps(result.as_dict())  # JSON-ready


@pytest.mark.slow
def test_demo_with_a_stalled_sink_keeps_training_pace_and_receives_nothing():
    steps, step_seconds = 3, 0.05
    started = time.monotonic()
    result = demo.run(steps=steps, step_seconds=step_seconds, stall=True, shutdown_timeout_s=2.0)
    assert time.monotonic() - started < BOUND_S
    assert result.stalled
    assert result.ok
    assert result.series == []
    assert result.missing_defaults  # nothing arrived
    assert not result.delivered
    # the training loop was not held up by the stalled collector (generous bound)
    assert result.loop_seconds < steps * step_seconds + 2.0
    assert result.stats["dropped"] == 0
    report = demo.render_result(result)
    assert "it was stalled, as asked" in report
    assert "Every default series arrived" not in report
    assert "Default series NOT received" not in report  # no list of 29 names when stalled
    assert_demo_figures_agree(report, result.stats)


def test_demo_exports_to_an_external_endpoint(sink):
    result = demo.run(
        steps=2, step_seconds=0.01, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint}
    )
    assert result.mode == "external"
    assert result.endpoint == sink.http_endpoint
    assert result.series is None
    assert result.missing_defaults is None
    assert result.ok
    assert result.delivered
    assert default_series_names() <= sink.names()
    assert "caller's side only" in demo.render_result(result)


def test_demo_refuses_bad_arguments_and_running_telemetry(provider):
    with pytest.raises(ValueError, match="steps"):
        demo.run(steps=0)
    with pytest.raises(ValueError, match="step_seconds"):
        demo.run(steps=1, step_seconds=-1)
    async_tee.start_telemetry(provider)
    with pytest.raises(RuntimeError, match="already running"):
        demo.run(steps=1, step_seconds=0)


@pytest.mark.slow
def test_demo_command_line_json():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "async_tee",
            "demo",
            "--steps",
            "3",
            "--step-seconds",
            "0.05",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=clean_env(),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"]
    assert data["missing_defaults"] == []
    assert data["delivered"]
    assert default_series_names() <= {series["name"] for series in data["series"]}
    assert len([line for line in proc.stderr.splitlines() if line.startswith("step ")]) == 3
    # The paced floor: each train dict but the first step's, timed between the calls.
    floor, tee = data["paced_floor_us"], data["latency_us"]["train"]["tee"]
    assert 0 < floor["p50"] <= floor["max"]
    assert data["tee_cpu_us"]["p50"] > 0
    assert tee["p50"] > 0


@pytest.mark.slow
def test_demo_command_line_table():
    proc = subprocess.run(
        [sys.executable, "-m", "async_tee", "demo", "--steps", "2", "--step-seconds", "0.02"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=clean_env(),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Every default series arrived" in proc.stdout
    assert "Caller-side cost" in proc.stdout
    assert "train at trainer pace: tee p50" in proc.stdout
    assert "paced floor" in proc.stdout
    assert_demo_figures_agree(proc.stdout)
    assert "async_tee.exports" in proc.stdout  # the table's rows were checked too
    # The library logs its effective configuration at INFO; the command line shows it,
    # once, at Python's default logging set-up.
    started = [line for line in proc.stderr.splitlines() if "telemetry started" in line]
    assert len(started) == 1, proc.stderr
    assert started[0].startswith("INFO async_tee: telemetry started: enabled=True")
    assert "otlp_endpoint='http://127.0.0.1:" in started[0]


def test_usage_errors_exit_2(capsys):
    for argv in ([], ["demo", "--steps", "0"], ["sink", "--grpc-port", "70000"], ["nope"]):
        with pytest.raises(SystemExit) as caught:
            cli.main(argv)
        assert caught.value.code == 2
    capsys.readouterr()


def test_version_and_help_from_python_m():
    proc = subprocess.run(
        [sys.executable, "-m", "async_tee", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"async_tee {async_tee.__version__}"


def synthetic_result(**changes) -> demo.DemoResult:
    base = demo.DemoResult(
        steps=1,
        step_seconds=0.0,
        mode="embedded",
        endpoint="http://127.0.0.1:1",
        stalled=False,
        series=[demo.ReceivedSeries("rl.reward.mean", {}, 0.5, "", "gauge")],
        missing_defaults=["rl.policy.loss"],
        counter_checks={"rl.vllm.prompt_tokens": {"logged": 10.0, "received": 8.0}},
        latency_us={
            "all": {
                "calls": 1,
                "tee": {"p50": 1, "p99": 1, "max": 1},
                "log_metrics": {"p50": 2, "p99": 2, "max": 2},
            }
        },
        paced_floor_us={"p50": 1, "p99": 1, "max": 1},
        tee_cpu_us={"p50": 1, "p99": 1, "max": 1},
        loop_seconds=0.1,
        log_seconds_on_training_thread=0.0,
        stats=async_tee.stats(),
        delivered=True,
        shutdown_seconds=0.0,
        shutdown_timeout_s=5.0,
        jsonl_path=None,
        jsonl_lines=0,
        monitor_calls=0,
    )
    for name, value in changes.items():
        setattr(base, name, value)
    return base


def consistent_stats() -> dict[str, Any]:
    """stats() of a 20-step run: 19 step exports, the last step in the shutdown export."""
    stats = copy.deepcopy(async_tee.stats())
    stats["exports"] = {"success": 19, "failure": 1}
    by_trigger = stats["exports_by_trigger"]
    by_trigger["step"] = {"success": 17, "failure": 1}
    by_trigger["interval"] = {"success": 1, "failure": 0}
    by_trigger["shutdown"] = {"success": 1, "failure": 0}
    stats["steps"].update(completed=20, exported=19, coalesced=1)
    return stats


def test_the_demo_figures_check_fails_on_a_broken_report():
    stats = consistent_stats()
    report = demo.render_result(synthetic_result(stats=stats))
    assert "  exports: 20 = 18 step exports (1 failed) + 1 periodic + 1 at shutdown; " in report
    assert "19 succeeded, 1 failed." in report
    assert (
        "  steps: 20 completed = 19 with an export of their own + 1 coalesced into a later "
        "one; 18 in step exports + the last in the export at shutdown." in report
    )
    assert_demo_figures_agree(report, stats)
    broken = [
        report.replace(" + 1 at shutdown;", ";"),  # the total counts an export not listed
        report.replace("= 18 step exports", "= 19 step exports"),
        report.replace("19 succeeded, 1 failed", "20 succeeded, 0 failed"),
        report.replace("= 19 with an export", "= 20 with an export"),
        report.replace("18 in step exports + the last", "19 in step exports + the last"),
        report.replace("\n  exports: ", "\n  exported: "),  # the line is gone
    ]
    for text in broken:
        assert text != report
        with pytest.raises(AssertionError):
            assert_demo_figures_agree(text, stats)
    # A report true to itself but not to stats() fails too.
    other = consistent_stats()
    other["exports_by_trigger"]["interval"] = {"success": 2, "failure": 0}
    with pytest.raises(AssertionError):
        assert_demo_figures_agree(report, other)
    # The table's async_tee.exports rows must agree with the summary.
    rows = [
        demo.ReceivedSeries(
            "async_tee.exports", {"result": "success", "trigger": trigger}, value, "{export}", "sum"
        )
        for trigger, value in (("step", 17), ("interval", 1), ("shutdown", 0), ("flush", 0))
    ]
    with_table = demo.render_result(synthetic_result(stats=stats, series=rows))
    assert "async_tee.exports there counts the exports before it" in with_table
    assert_demo_figures_agree(with_table, stats)
    rows[0] = dataclasses.replace(rows[0], value=18)
    with pytest.raises(AssertionError):
        assert_demo_figures_agree(demo.render_result(synthetic_result(stats=stats, series=rows)))


def demo_argv(*options: str) -> list[str]:
    return ["demo", "--steps", "1", "--step-seconds", "0", *options]


def test_the_demo_command_shows_async_tee_info_lines_and_restores_the_logger(capsys):
    library = logging.getLogger("async_tee")
    before = (list(library.handlers), library.level, library.propagate)
    assert cli.main(demo_argv()) == 0
    assert (list(library.handlers), library.level, library.propagate) == before
    err = capsys.readouterr().err
    assert err.count("INFO async_tee: telemetry started: enabled=True") == 1, err
    assert "step 1/1" in err


def test_the_demo_command_quiet_shows_no_progress_and_no_info_lines(capsys):
    assert cli.main(demo_argv("--quiet")) == 0
    out, err = capsys.readouterr()
    assert "telemetry started" not in err
    assert "step 1/1" not in err
    assert "  exports: " in out


def test_the_demo_command_adds_no_handler_where_info_lines_already_show(caplog, capsys):
    caplog.set_level(logging.INFO, logger="async_tee")  # a handler (root's) shows them
    assert cli.main(demo_argv()) == 0
    assert "telemetry started" not in capsys.readouterr().err  # not a second time
    assert any("telemetry started" in r.getMessage() for r in caplog.records)


def test_a_missing_default_is_listed_and_fails_the_command(monkeypatch, capsys):
    result = synthetic_result()
    assert not result.ok
    report = demo.render_result(result)
    assert "Default series NOT received (1):\n  rl.policy.loss" in report
    assert "10 logged, 8 received (MISMATCH)" in report
    monkeypatch.setattr(demo, "run", lambda **_kwargs: result)
    assert cli.main(["demo", "--steps", "1"]) == 1
    assert "NOT received" in capsys.readouterr().out
    assert synthetic_result(missing_defaults=[]).ok
    assert synthetic_result(mode="external", missing_defaults=None, series=None).ok

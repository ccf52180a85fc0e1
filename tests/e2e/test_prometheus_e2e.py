"""End to end through a real Prometheus server (Debian's package) scraping async_tee.

One process teeing the fixture, and a launched job of 4 real rank processes per launcher
family (torchrun, SLURM, Open MPI), each serving its own port with no port set for it,
scraped by one Prometheus: every rank's values are there under its own rank, and every
query of the generated dashboard returns data from them.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import load_calls

import async_tee

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port: int, expr: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]["result"]


def free_ports(count: int) -> int:
    """A base port with ``count`` free ports from it on (checked by binding each)."""
    for _ in range(200):
        base = random.randrange(20_000, 60_000)
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError("no run of free ports found")


@contextlib.contextmanager
def run_prometheus(
    tmp_path: Path, jobs: dict[str, list[int]], rules: str | None = None
) -> Iterator[int]:
    """A real Prometheus scraping each job's ports every second; yields its web port.

    ``rules``: a rules file's text, evaluated every second.
    """
    web = free_port()
    config = tmp_path / "prometheus.yml"
    lines = ["global:", "  scrape_interval: 1s", "  evaluation_interval: 1s"]
    if rules is not None:
        (tmp_path / "rules.yml").write_text(rules)
        lines += ["rule_files:", f"  - {tmp_path / 'rules.yml'}"]
    lines += ["scrape_configs:"]
    for job, ports in jobs.items():
        targets = ", ".join(f"'127.0.0.1:{port}'" for port in ports)
        lines += [f"  - job_name: {job}", "    static_configs:", f"      - targets: [{targets}]"]
    config.write_text("\n".join(lines) + "\n")
    assert PROMETHEUS is not None
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield web
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def prometheus_server(tmp_path):
    target = free_port()
    with run_prometheus(tmp_path, {"async_tee": [target]}) as web:
        yield target, web


def wait_for_query(web: int, expr: str, done: Any, timeout_s: float = 45) -> list[dict[str, Any]]:
    """Poll a query until ``done(result)`` holds; the last result either way."""
    deadline = time.monotonic() + timeout_s
    result: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):  # the server may still be starting
            result = query(web, expr)
            if done(result):
                return result
        time.sleep(0.5)  # polling an external server, not waiting for our worker
    return result


@pytest.mark.slow
def test_fixture_run_is_queryable_in_a_real_prometheus(prometheus_server):
    target, web = prometheus_server
    handle = async_tee.start_telemetry(
        environ={
            "OTEL_METRICS_EXPORTER": "prometheus",
            "OTEL_EXPORTER_PROMETHEUS_PORT": str(target),
        }
    )
    assert handle.is_exporting
    for call in load_calls():
        finished = call.get("step_finished", False)
        async_tee.tee_rl_metrics_to_otel(call["metrics"], call["prefix"], call["step"], finished)
    assert async_tee.flush(10)  # completes step 42, which said step_finished

    wanted = {
        "rl_reward_mean": 0.5234,
        "rl_vllm_prompt_tokens_total": 49152.0,
        'rl_efficiency_seconds{rl_efficiency_category="idle/refit_bubble"}': 3.8,
        'rl_setup_duration_seconds{rl_setup_phase="vllm_init"}': 71.8,
    }
    found: dict[str, float] = {}
    deadline = time.monotonic() + 45  # target discovery is throttled: ~5-6 s to first sample
    while time.monotonic() < deadline and len(found) < len(wanted):
        for expr in wanted:
            if expr in found:
                continue
            try:
                result = query(web, expr)
            except OSError:
                break  # the server is still starting
            if result:
                found[expr] = float(result[0]["value"][1])
        if len(found) < len(wanted):
            time.sleep(0.5)  # polling an external server, not waiting for our worker
    names = {expr.split("{")[0] for expr in wanted}
    assert found.keys() == wanted.keys(), f"missing from Prometheus: {names - set(found)}"
    for expr, value in wanted.items():
        assert found[expr] == pytest.approx(value), expr
    assert async_tee.shutdown_telemetry(5)


# Each launcher family's variables for rank r of a 4-rank job on one node.
FAMILIES = {
    "torchrun": lambda r: {
        "RANK": str(r),
        "LOCAL_RANK": str(r),
        "WORLD_SIZE": "4",
        "GROUP_RANK": "0",
        "TORCHELASTIC_RUN_ID": "job-torchrun",
    },
    "slurm": lambda r: {
        "SLURM_PROCID": str(r),
        "SLURM_LOCALID": str(r),
        "SLURM_NTASKS": "4",
        "SLURM_NODEID": "0",
        "SLURM_JOB_ID": "4242",
    },
    "openmpi": lambda r: {
        "OMPI_COMM_WORLD_RANK": str(r),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(r),
        "OMPI_COMM_WORLD_SIZE": "4",
    },
}
RANKS = 4
RANK_PROCESS = Path(__file__).parents[1] / "rank_process.py"
_LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_", "OMPI_", "PMI_", "OTEL_")


def _rank_env(family: str, rank: int, base: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_VARIABLES)}
    return {
        **env,
        **FAMILIES[family](rank),
        "OTEL_METRICS_EXPORTER": "prometheus",
        # The base for the whole job, as a launcher's environment carries it: no rank is
        # given a port of its own.
        "ASYNC_TEE_PROMETHEUS_BASE_PORT": str(base),
        "ASYNC_TEE_MIN_EXPORT_INTERVAL": "0",
    }


def _by_rank(result: list[dict[str, Any]]) -> dict[str, float]:
    return {row["metric"].get("rl_rank", ""): float(row["value"][1]) for row in result}


def _end(procs: dict[Any, subprocess.Popen[str]]) -> dict[Any, Any]:
    """Close every rank's stdin (it shuts down), and read its last line: what it delivered."""
    for proc in procs.values():
        with contextlib.suppress(OSError, ValueError):
            assert proc.stdin is not None
            proc.stdin.close()
    ends = {}
    for key, proc in procs.items():
        assert proc.stdout is not None
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        lines = proc.stdout.read().splitlines()
        proc.stdout.close()
        ends[key] = {k: v for k, v in json.loads(lines[-1]).items() if k != "at"} if lines else None
    return ends


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_every_rank_of_every_launcher_family_is_scraped_under_its_own_rank(tmp_path):
    dashboard = pytest.importorskip("async_tee.dashboard")
    pytest.importorskip("grafana_foundation_sdk")
    bases = {family: free_ports(RANKS) for family in FAMILIES}
    jobs = {family: [base + r for r in range(RANKS)] for family, base in bases.items()}
    procs: dict[tuple[str, int], subprocess.Popen[str]] = {}
    with run_prometheus(tmp_path, jobs) as web:
        try:
            for family, base in bases.items():
                for rank in range(RANKS):
                    procs[(family, rank)] = subprocess.Popen(
                        [sys.executable, str(RANK_PROCESS), "--step-seconds", "0.3"],
                        env=_rank_env(family, rank, base),
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
            # Keep stepping until Prometheus scrapes every rank, and a few scrapes more so
            # rates over the counters and the lag histogram have samples to work with.
            every_target = wait_for_query(
                web, "count(rl_step)", lambda r: r and float(r[0]["value"][1]) == 12
            )
            assert every_target, "Prometheus never scraped all 12 ranks"
            rates_filled = wait_for_query(
                web,
                "count(rate(async_tee_lag_milliseconds_count[1m]) > 0)",
                lambda r: r and float(r[0]["value"][1]) == 12,
            )
            assert rates_filled, "rates over 1m never covered every rank's steps"
            reports = {}
            for proc in procs.values():
                assert proc.stdin is not None
                proc.stdin.write("stop\n")
                proc.stdin.flush()
            for key, proc in procs.items():
                assert proc.stdout is not None
                reports[key] = json.loads(proc.stdout.readline())

            for (family, rank), report in reports.items():
                assert report["rank"] == rank
                assert report["exporting"], (family, rank)
                assert report["prometheus_address"] == ["127.0.0.1", bases[family] + rank]
                assert report["stats"]["ranks"]["launcher"] == family
                assert report["stats"]["exporters"]["prometheus"]["state"] == "started"

            join = " * on (job, instance) group_left (rl_rank) target_info"
            for family in FAMILIES:
                steps = {rank: reports[(family, rank)]["steps"] for rank in range(RANKS)}
                rewards = {str(r): r + 0.25 for r in range(RANKS)}
                tokens = {str(r): 1000.0 * (r + 1) * steps[r] for r in range(RANKS)}
                for name, wanted in [
                    ("rl_reward_mean", rewards),
                    ("rl_vllm_prompt_tokens_total", tokens),
                ]:
                    expr = f'{name}{{job="{family}"}}{join}'
                    got = _by_rank(wait_for_query(web, expr, lambda r, w=wanted: _by_rank(r) == w))
                    assert got == wanted, (family, name)

            built = dashboard.build_dashboard()
            empty = []
            for expr in dashboard.panel_queries(built):
                concrete = dashboard.expand_variables(expr)
                result = query(web, concrete)
                if not [row for row in result if row["value"][1] not in ("NaN", "+Inf", "-Inf")]:
                    empty.append(concrete)
            assert not empty, f"dashboard queries with no data: {empty}"
        finally:
            ends = _end(procs)
    for key, proc in procs.items():
        assert proc.returncode == 0, key
        assert ends[key] == {"delivered": True}, key  # every exporter served to the end


def firing_and_pending(web: int) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{web}/api/v1/alerts"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]["alerts"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_generated_alerts_fire_in_a_real_prometheus(tmp_path):
    """Three ranks of one torchrun job: rank 0 healthy, rank 1 stops stepping after 3 steps
    (still serving), rank 2 logs one NaN ``grad_norm``. The stuck rule goes pending, then
    firing, for rank 1 alone; the non-finite rule fires for rank 2; nothing ever names
    rank 0. Rules from ``async-tee alerts`` with short thresholds, evaluated every second."""
    from async_tee import alerts

    # A healthy rank's scraped step time lags by up to a drain (the worker's longest sleep while
    # dicts trickle, 1 s), a scrape (1 s) and an evaluation (1 s) plus its own step (0.3 s): a
    # stuck threshold inside that budget fires on healthy ranks now and then (it did, about one
    # run in ten). 5 s clears it with a margin; the stuck rank still fires within seconds.
    thresholds = alerts.AlertThresholds(stuck_after_s=5, for_multiplier=2 / 300)
    base = free_ports(3)
    argv = {
        0: ["--nan-step", "0"],
        1: ["--nan-step", "0", "--steps", "3"],
        2: ["--nan-step", "2"],
    }
    procs: dict[int, subprocess.Popen[str]] = {}
    seen: dict[tuple[str, str], list[tuple[float, str]]] = {}
    with run_prometheus(
        tmp_path, {"train": [base + r for r in range(3)]}, alerts.render_rules(thresholds)
    ) as web:
        try:
            for rank, extra in argv.items():
                env = {**_rank_env("torchrun", rank, base), "WORLD_SIZE": "3"}
                procs[rank] = subprocess.Popen(
                    [sys.executable, str(RANK_PROCESS), "--step-seconds", "0.3", *extra],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            assert procs[1].stdout is not None
            stopped_stepping = json.loads(procs[1].stdout.readline())  # its 3 steps are done
            assert stopped_stepping["steps"] == 3
            last_step = time.monotonic()

            def states(name: str, rank: str) -> set[str]:
                return {state for _, state in seen.get((name, rank), [])}

            deadline = last_step + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    for alert in firing_and_pending(web):
                        key = (alert["labels"]["alertname"], alert["labels"].get("rl_rank", ""))
                        seen.setdefault(key, []).append((time.monotonic(), alert["state"]))
                if "firing" in states("RLTrainerStuck", "1") and "firing" in states(
                    "RLNonFiniteValues", "2"
                ):
                    break
                time.sleep(0.2)  # polling an external server, not waiting for our worker
            for rank in (0, 2):  # both still stepping: stop them
                stdin = procs[rank].stdin
                assert stdin is not None
                stdin.write("stop\n")
                stdin.flush()
        finally:
            ends = _end(procs)
    assert states("RLTrainerStuck", "1") == {"pending", "firing"}, seen
    stuck = seen[("RLTrainerStuck", "1")]
    assert stuck[0][1] == "pending"  # pending before firing: the rule's for:
    assert "firing" in states("RLNonFiniteValues", "2"), seen
    assert not [key for key in seen if key[1] == "0"], seen  # the healthy rank: nothing, ever
    assert {name for name, _ in seen} <= {"RLTrainerStuck", "RLNonFiniteValues", "RLStraggler"}
    fired = next(at for at, state in stuck if state == "firing") - last_step
    print(f"stuck: fired {fired:.1f} s after the last step (threshold 5 s, for 2 s)")
    assert all(end == {"delivered": True} for end in ends.values()), ends

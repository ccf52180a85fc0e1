"""End to end through a real Prometheus 3 server (servers/build) scraping async_tee.

One process teeing the fixture, and a launched job of 4 real rank processes per launcher
family (torchrun, SLURM, Open MPI), each serving its own port with no port set for it,
scraped by one Prometheus: every rank's values are there under its own rank, and every
query of the generated dashboard returns data from them.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    RANK_PROCESS,
    end_ranks,
    environ_without_launcher,
    load_calls,
    stop_stepping,
)

import async_tee
import servers
from servers import free_port, free_ports, query, wait_for_query

pytestmark = pytest.mark.servers


@contextlib.contextmanager
def run_prometheus(tmp_path: Path, jobs: dict[str, list[int]]) -> Iterator[int]:
    """A real Prometheus 3 scraping each job's ports every second; yields its web port."""
    web = free_port()
    config = tmp_path / "prometheus.yml"
    lines = ["global:", "  scrape_interval: 1s", "scrape_configs:"]
    for job, ports in jobs.items():
        targets = ", ".join(f"'127.0.0.1:{port}'" for port in ports)
        lines += [f"  - job_name: {job}", "    static_configs:", f"      - targets: [{targets}]"]
    config.write_text("\n".join(lines) + "\n")
    argv = [
        servers.binary("prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{web}",
    ]
    with servers.server(argv, web, tmp_path / "prometheus.log", "prometheus"):
        yield web


@pytest.fixture
def prometheus_server(tmp_path):
    target = free_port()
    with run_prometheus(tmp_path, {"async_tee": [target]}) as web:
        yield target, web


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


def _rank_env(family: str, rank: int, base: int) -> dict[str, str]:
    return {
        **environ_without_launcher(),
        **FAMILIES[family](rank),
        "OTEL_METRICS_EXPORTER": "prometheus",
        # The base for the whole job, as a launcher's environment carries it: no rank is
        # given a port of its own.
        "ASYNC_TEE_PROMETHEUS_BASE_PORT": str(base),
        "ASYNC_TEE_MIN_EXPORT_INTERVAL": "0",
    }


def _by_rank(result: list[dict[str, Any]]) -> dict[str, float]:
    return {row["metric"].get("rl_rank", ""): float(row["value"][1]) for row in result}


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
            reports = stop_stepping(procs)

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
            ends = end_ranks(procs)
    for key, proc in procs.items():
        assert proc.returncode == 0, key
        assert ends[key] is True, key  # every exporter served to the end

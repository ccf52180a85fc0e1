"""End to end through a real Prometheus server (Debian's package) scraping async_tee."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
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


@pytest.fixture
def prometheus_server(tmp_path):
    target, web = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: async_tee\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
    )
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
        yield target, web
    finally:
        proc.terminate()
        proc.wait(timeout=10)


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
        async_tee.tee_rl_metrics_to_otel(call["metrics"], call["prefix"], call["step"])
    assert async_tee.flush(10)

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

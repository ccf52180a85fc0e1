"""Many ranks as a launcher starts them: real processes, the launcher's variables, one receiver.

- ``ASYNC_TEE_EXPORT_RANKS`` picks which ranks export; the others start no thread at all.
- Ranks that all get one explicit Prometheus port (the collision a shared
  ``OTEL_EXPORTER_PROMETHEUS_PORT`` makes): one serves, and every other one says it did
  not deliver, in one warning line naming the fix, while its training goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

RANK_PROCESS = Path(__file__).parents[1] / "rank_process.py"
_LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "SLURM_", "OMPI_", "PMI_")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_VARIABLES)}
    env = {k: v for k, v in env.items() if not k.startswith(("OTEL_", "ASYNC_TEE_"))}
    return {**env, **extra}


def _run_ranks(envs: list[dict[str, str]], steps: int = 3) -> list[tuple[Any, Any, str]]:
    """Start every rank, let each log ``steps`` steps, end them: (report, end, stderr)."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(RANK_PROCESS), "--steps", str(steps), "--step-seconds", "0"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for env in envs
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        report, end = (json.loads(line) for line in out.splitlines())
        results.append((report, end, err))
    return results


def _resources(sink) -> dict[int, dict[str, Any]]:
    """The resource of every process that sent rl.reward.mean, by its rl.rank."""
    return {p.resource["rl.rank"]: p.resource for p in sink.points() if p.name == "rl.reward.mean"}


@pytest.mark.parametrize(
    ("setting", "exporting"),
    [("0", [0]), ("local0", [0, 2]), ("all", [0, 1, 2, 3])],
)
def test_export_ranks_chooses_who_exports_and_the_others_start_nothing(sink, setting, exporting):
    # Two nodes of two ranks each, launched by torchrun.
    envs = [
        _env(
            RANK=str(rank),
            LOCAL_RANK=str(rank % 2),
            WORLD_SIZE="4",
            GROUP_RANK=str(rank // 2),
            TORCHELASTIC_RUN_ID="job-ranks",
            ASYNC_TEE_EXPORT_RANKS=setting,
            OTEL_EXPORTER_OTLP_ENDPOINT=sink.http_endpoint,
            ASYNC_TEE_MIN_EXPORT_INTERVAL="0",
        )
        for rank in range(4)
    ]
    results = _run_ranks(envs)
    for rank, (report, end, _) in enumerate(results):
        exports = rank in exporting
        assert report["exporting"] is exports, rank
        assert report["stats"]["ranks"]["exports"] is exports, rank
        assert end["delivered"] is True, rank
        if exports:
            assert report["threads"], rank
            assert report["stats"]["recorded"] == report["stats"]["enqueued"] > 0
        else:
            assert report["threads"] == [], rank  # not even the worker
            assert report["stats"]["enqueued"] == 0, rank
    resources = _resources(sink)
    assert sorted(resources) == exporting
    for rank, resource in resources.items():
        assert resource["service.instance.id"] == f"job-ranks/rank-{rank}"
        assert resource["rl.node_rank"] == rank // 2
    values = {p.resource["rl.rank"]: p.value for p in sink.points() if p.name == "rl.reward.mean"}
    assert values == {rank: rank + 0.25 for rank in exporting}


def test_ranks_sharing_one_explicit_port_one_serves_the_others_say_they_did_not(tmp_path):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    envs = [
        _env(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="4",
            OTEL_METRICS_EXPORTER="prometheus",
            OTEL_EXPORTER_PROMETHEUS_PORT=str(port),  # one port for all: the collision
        )
        for rank in range(4)
    ]
    results = _run_ranks(envs, steps=2)
    served = [report for report, _, _ in results if report["exporting"]]
    failed = [(report, end, err) for report, end, err in results if not report["exporting"]]
    assert len(served) == 1
    assert served[0]["prometheus_address"] == ["127.0.0.1", port]
    assert len(failed) == 3
    for report, end, err in failed:
        state = report["stats"]["exporters"]["prometheus"]
        assert state["state"] == "failed"
        assert report["stats"]["exporting"] is False
        assert end["delivered"] is False
        warnings = [line for line in err.splitlines() if line.strip()]
        assert len(warnings) == 1, err  # one line, no traceback
        assert "OTEL_EXPORTER_PROMETHEUS_PORT" in warnings[0]
        assert "ASYNC_TEE_PROMETHEUS_BASE_PORT" in warnings[0]
        assert report["stats"]["recorded"] > 0  # training went on, teeing as before

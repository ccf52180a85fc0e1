"""Run identity: two jobs on one host never share a resource; a restarted rank keeps its own.

Each rank is a real process exporting over OTLP to the suite's receiver, started the way a
launcher starts it (``RANK``/``WORLD_SIZE``, and the job id a launcher sets, or none).
"Launchers" are real parent processes too, because without a job id the ranks started by
one launcher share the launcher's identity.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from async_tee.config import load_settings, run_id

pytestmark = pytest.mark.slow

_JOB_VARIABLES = (
    "ASYNC_TEE_RUN_ID",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PMIX_NAMESPACE",
)

RANK_CODE = """
import os, async_tee
async_tee.start_telemetry()
async_tee.tee_rl_metrics_to_otel({"reward": float(os.environ["RANK"])}, "train", 1)
assert async_tee.shutdown_telemetry(10)
"""

# A launcher: starts two ranks of one job and waits for them, as torchrun's agent does.
LAUNCHER_CODE = """
import os, subprocess, sys
code = sys.argv[1]
ranks = [
    subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "RANK": str(rank)})
    for rank in range(2)
]
sys.exit(max(rank.wait(timeout=60) for rank in ranks))
"""


# One process starting the ranks of two jobs at once, each job with its own rendezvous (a
# sweep driver, a shell script backgrounding both): without a job id they share a parent.
TWO_JOBS_CODE = """
import os, subprocess, sys
code = sys.argv[1]
ranks = [
    subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
    )
    for port in ("29500", "29501")
    for rank in range(2)
]
sys.exit(max(rank.wait(timeout=60) for rank in ranks))
"""


def _env(sink, **job: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _JOB_VARIABLES}
    return {
        **env,
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint,
        "OTEL_METRIC_EXPORT_INTERVAL": "600000",
        "WORLD_SIZE": "2",
        **job,
    }


def _launch(sink, **job: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(LAUNCHER_CODE), textwrap.dedent(RANK_CODE)],
        env=_env(sink, **job),
        text=True,
    )


def _resources(sink) -> list[dict[str, Any]]:
    """One resource per exporting process that sent rl.reward.mean."""
    seen = {}
    for point in sink.points():
        if point.name == "rl.reward.mean":
            seen[point.resource["service.instance.id"]] = point.resource
    return list(seen.values())


@pytest.mark.parametrize(
    "jobs",
    [
        ({"ASYNC_TEE_RUN_ID": "job-a"}, {"ASYNC_TEE_RUN_ID": "job-b"}),
        ({"TORCHELASTIC_RUN_ID": "none"}, {}),  # torchrun's placeholder, and no id at all
    ],
    ids=["two-run-ids", "no-ids"],
)
def test_two_concurrent_jobs_on_one_host_reach_the_receiver_apart(sink, jobs):
    launchers = [_launch(sink, **job) for job in jobs]  # both run at once
    assert [launcher.wait(timeout=90) for launcher in launchers] == [0, 0]
    resources = _resources(sink)
    assert len(resources) == 4  # 2 jobs x 2 ranks, none merged
    runs = {resource["rl.run.id"] for resource in resources}
    assert len(runs) == 2
    for run in runs:  # each job's two ranks share its run id, told apart by rank
        ranks = sorted(r["rl.rank"] for r in resources if r["rl.run.id"] == run)
        assert ranks == [0, 1]
    for resource in resources:
        expected = f"{resource['rl.run.id']}/rank-{resource['rl.rank']}"
        assert resource["service.instance.id"] == expected


def test_two_jobs_whose_ranks_share_one_parent_stay_apart_by_their_rendezvous(sink):
    launcher = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TWO_JOBS_CODE), textwrap.dedent(RANK_CODE)],
        env=_env(sink),
        timeout=90,
        check=False,
    )
    assert launcher.returncode == 0
    resources = _resources(sink)
    assert len(resources) == 4  # 2 jobs x 2 ranks, none merged
    runs = {resource["rl.run.id"] for resource in resources}
    assert {run.rsplit("-", 1)[1] for run in runs} == {"127.0.0.1:29500", "127.0.0.1:29501"}
    for run in runs:
        assert sorted(r["rl.rank"] for r in resources if r["rl.run.id"] == run) == [0, 1]


def test_a_rank_restarted_within_its_job_keeps_its_identity(sink):
    env = _env(sink, TORCHELASTIC_RUN_ID="job-7", RANK="1")
    for _ in range(2):  # the rank, then the rank restarted by the launcher
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(RANK_CODE)],
            env=env,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0
    resources = _resources(sink)
    assert len(resources) == 1
    assert resources[0]["service.instance.id"] == "job-7/rank-1"
    assert resources[0]["rl.run.id"] == "job-7"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"ASYNC_TEE_RUN_ID": "mine", "TORCHELASTIC_RUN_ID": "te", "SLURM_JOB_ID": "9"}, "mine"),
        ({"TORCHELASTIC_RUN_ID": "te", "SLURM_JOB_ID": "9"}, "te"),
        ({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "9"}, "9"),
        ({"SLURM_JOB_ID": "9", "SLURM_ARRAY_TASK_ID": "3"}, "9_3"),
    ],
)
def test_run_id_sources_in_order(environ, expected):
    assert run_id(environ) == expected
    attributes = dict(load_settings(environ={**environ, "RANK": "2"}).resource_attributes)
    assert attributes["rl.run.id"] == expected
    assert attributes["service.instance.id"] == f"{expected}/rank-2"


def test_without_an_id_ranks_share_their_launchers_and_a_lone_process_has_its_own():
    ranked = run_id({"RANK": "0"})
    assert ranked.startswith("local-")
    assert f"-{os.getppid()}-" in ranked or ranked.endswith(f"-{os.getppid()}")
    alone = run_id({})
    assert f"-{os.getpid()}-" in alone or alone.endswith(f"-{os.getpid()}")
    assert ranked != alone
    rendezvous = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert run_id({"RANK": "0", **rendezvous}) == f"{ranked}-10.0.0.1:29500"
    assert run_id({"RANK": "0", "PMIX_NAMESPACE": "prterun-x-1@1"}) == f"{ranked}-prterun-x-1@1"
    assert run_id(rendezvous) == alone  # not launched: the process's own id already differs


def test_resource_text_with_no_utf8_form_is_escaped():
    environ = {"OTEL_RESOURCE_ATTRIBUTES": "team=a\udcffb", "ASYNC_TEE_RUN_ID": "run\udcff"}
    attributes = dict(load_settings(environ=environ).resource_attributes)
    assert attributes["team"] == "a\\udcffb"
    assert attributes["rl.run.id"] == "run\\udcff"
    assert str(attributes["service.instance.id"]).startswith("run\\udcff/")

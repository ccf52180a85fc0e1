"""Which rank a process is (each launcher family), which ranks export, which port each serves."""

from __future__ import annotations

import os
import socket

import pytest

from async_tee._settings import LauncherRanks
from async_tee.config import launcher_ranks, load_settings, run_id

TORCHRUN = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "GROUP_RANK": "2"}
SLURM = {"SLURM_PROCID": "6", "SLURM_LOCALID": "2", "SLURM_NTASKS": "16", "SLURM_NODEID": "1"}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "7",
    "OMPI_COMM_WORLD_LOCAL_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "32",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
}
MPICH = {"PMI_RANK": "9", "PMI_SIZE": "12", "MPI_LOCALRANKID": "1"}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (TORCHRUN, LauncherRanks("torchrun", 5, 1, 8, 2)),
        (SLURM, LauncherRanks("slurm", 6, 2, 16, 1)),
        (OPENMPI, LauncherRanks("openmpi", 7, 3, 32, 1)),
        (MPICH, LauncherRanks("mpich", 9, 1, 12, None)),
        ({}, LauncherRanks()),
    ],
    ids=["torchrun", "slurm", "openmpi", "mpich", "none"],
)
def test_each_launcher_family_is_read(environ, expected):
    assert launcher_ranks(environ) == expected
    attributes = dict(load_settings(environ=environ).resource_attributes)
    for field, attribute in [
        ("rank", "rl.rank"),
        ("local_rank", "rl.local_rank"),
        ("world_size", "rl.world_size"),
        ("node_rank", "rl.node_rank"),
    ]:
        assert attributes.get(attribute) == getattr(expected, field), attribute
    if expected.rank is not None:
        assert str(attributes["service.instance.id"]).endswith(f"/rank-{expected.rank}")


def test_torchrun_inside_srun_is_torchruns_rank_never_a_mix():
    # torchrun started by srun: SLURM_PROCID is the agent's rank, RANK the trainer's.
    ranks = launcher_ranks({**SLURM, "RANK": "3", "WORLD_SIZE": "8"})
    assert ranks == LauncherRanks("torchrun", 3, None, 8, None)


@pytest.mark.parametrize("raw", ["x", "-1", "1.5", ""])
def test_a_family_whose_variables_are_not_whole_numbers_is_skipped(raw):
    assert launcher_ranks({"RANK": raw, **SLURM}).launcher == "slurm"
    assert launcher_ranks({"PMI_RANK": raw}) == LauncherRanks()


def test_ranks_started_by_one_launcher_share_its_local_run_id():
    # Without a job id, a rank's run id is its launcher's (the parent process), whichever
    # family's variables say it was launched.
    for environ in (TORCHRUN, SLURM, OPENMPI, MPICH):
        assert f"-{os.getppid()}-" in run_id(environ) + "-"
    assert f"-{os.getpid()}-" in run_id({}) + "-"


def test_a_process_that_starts_its_ranks_names_the_run_as_they_do():
    # Lightning's own launcher: rank 0 runs the script and starts the other local ranks as
    # its children, who name the run by their parent, with the rendezvous.
    rendezvous = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    own = run_id({"LOCAL_RANK": "0", "WORLD_SIZE": "2", **rendezvous}, starts_ranks=True)
    assert own.startswith(f"local-{socket.gethostname()}-{os.getpid()}-")
    assert own.endswith("-10.0.0.1:29500")
    alone = run_id({**rendezvous}, starts_ranks=True)  # no rank variable: the same
    assert alone == own
    assert run_id({"SLURM_JOB_ID": "77"}, starts_ranks=True) == "77"  # a job id still wins


# ------------------------------------------------------------------------ which ranks export


@pytest.mark.parametrize(
    ("setting", "environ", "exports"),
    [
        ("all", {"RANK": "3", "LOCAL_RANK": "3"}, True),
        ("0", {"RANK": "0", "LOCAL_RANK": "0"}, True),
        ("0", {"RANK": "3", "LOCAL_RANK": "3"}, False),
        ("0", {"RANK": "8", "LOCAL_RANK": "0"}, False),
        ("0", {}, True),  # a single process counts as rank 0
        ("local0", {"RANK": "8", "LOCAL_RANK": "0"}, True),
        ("local0", {"RANK": "9", "LOCAL_RANK": "1"}, False),
        ("local0", {"PMI_RANK": "0"}, True),  # no local rank: only global rank 0
        ("local0", {"PMI_RANK": "4"}, False),
        ("LOCAL0", {"SLURM_PROCID": "12", "SLURM_LOCALID": "0"}, True),
        (" 0 ", {"OMPI_COMM_WORLD_RANK": "1"}, False),
    ],
)
def test_export_ranks_picks_the_ranks_that_start_telemetry(setting, environ, exports, logs):
    settings = load_settings(environ={**environ, "ASYNC_TEE_EXPORT_RANKS": setting})
    assert settings.exports_from_this_rank is exports
    assert not [r for r in logs.records if r.levelname == "WARNING"]


@pytest.mark.parametrize("raw", ["1", "rank0", "none", "0,1"])
def test_a_malformed_export_ranks_exports_everywhere_with_one_warning(raw, logs):
    settings = load_settings(environ={"RANK": "3", "ASYNC_TEE_EXPORT_RANKS": raw})
    assert settings.export_ranks == "all"
    assert settings.exports_from_this_rank
    (warning,) = [r.getMessage() for r in logs.records if r.levelname == "WARNING"]
    assert "ASYNC_TEE_EXPORT_RANKS" in warning


# ------------------------------------------------------------------------ Prometheus ports


@pytest.mark.parametrize(
    ("environ", "port", "base"),
    [
        ({}, 9464, 9464),
        ({"LOCAL_RANK": "3"}, 9467, 9464),
        ({"SLURM_LOCALID": "7", "ASYNC_TEE_PROMETHEUS_BASE_PORT": "9100"}, 9107, 9100),
        ({"OMPI_COMM_WORLD_LOCAL_RANK": "2", "ASYNC_TEE_PROMETHEUS_BASE_PORT": "0"}, 0, 0),
        # OTel's own variable is this process's port, as given: never offset again.
        ({"LOCAL_RANK": "3", "OTEL_EXPORTER_PROMETHEUS_PORT": "9300"}, 9300, None),
        ({"LOCAL_RANK": "3", "OTEL_EXPORTER_PROMETHEUS_PORT": "0"}, 0, None),
        # Past the last port: reported by the exporter as unable to start.
        ({"LOCAL_RANK": "7", "ASYNC_TEE_PROMETHEUS_BASE_PORT": "65530"}, 65537, 65530),
    ],
)
def test_each_local_rank_serves_on_base_plus_local_rank(environ, port, base):
    settings = load_settings(environ=environ)
    assert (settings.prometheus_port, settings.prometheus_base_port) == (port, base)


def test_a_malformed_explicit_port_falls_back_to_the_per_rank_rule(logs):
    settings = load_settings(environ={"LOCAL_RANK": "2", "OTEL_EXPORTER_PROMETHEUS_PORT": "x"})
    assert (settings.prometheus_port, settings.prometheus_base_port) == (9466, 9464)
    (warning,) = [r.getMessage() for r in logs.records if r.levelname == "WARNING"]
    assert "OTEL_EXPORTER_PROMETHEUS_PORT" in warning

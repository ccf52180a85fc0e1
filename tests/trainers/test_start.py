"""Telemetry started for a trainer, as the trainer's rank (§13): no heavy package needed."""

from __future__ import annotations

import os

import pytest
from helpers import environ_without_launcher

import async_tee
from async_tee._session import lifecycle
from async_tee.config import run_id
from async_tee.integrations._start import placed, start_for


def warnings_of(logs: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in logs.records if r.levelname == "WARNING"]


def test_a_process_alone_keeps_its_environment():
    """A rank variable would make its run id its parent's (every run from one shell alike)."""
    env = environ_without_launcher()
    assert placed(env, 0, 0, 1) == env
    assert placed(env, None, None, None) == env
    assert placed(env, 0, None, None) == env


def test_a_rank_the_launcher_did_not_say_is_the_trainers(logs):
    env = environ_without_launcher()
    assert placed(env, 3, 1, 4) == {**env, "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}
    assert placed(env, 3, None, 4) == {**env, "RANK": "3", "WORLD_SIZE": "4"}
    assert warnings_of(logs) == []


def test_a_process_that_started_its_ranks_names_the_run_by_itself():
    """Rank 0 of Lightning's own launcher: its children name the run by it, so must it."""
    env = {**environ_without_launcher(), "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
    out = placed(env, 0, None, 2, starts_ranks=True)
    assert out["ASYNC_TEE_RUN_ID"] == run_id(env, starts_ranks=True)
    assert f"-{os.getpid()}-" in out["ASYNC_TEE_RUN_ID"] + "-"
    assert "ASYNC_TEE_RUN_ID" not in placed(env, 0, None, 2)
    assert placed(env, 0, None, 1, starts_ranks=True) == env  # alone: as before


def test_a_launcher_that_agrees_is_left_as_it_is(logs):
    env = {**environ_without_launcher(), "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}
    assert placed(env, 3, 1, 4) == env
    assert warnings_of(logs) == []


def test_a_launcher_that_disagrees_loses_to_the_trainer_and_it_is_said_once(logs):
    env = {**environ_without_launcher(), "RANK": "0", "WORLD_SIZE": "4", "NODE_RANK": "1"}
    for _ in range(2):
        out = placed(env, 2, 2, 4)
        assert (out["RANK"], out["LOCAL_RANK"], out["WORLD_SIZE"]) == ("2", "2", "4")
        assert "NODE_RANK" not in out  # one family answers for all four numbers
    (said,) = warnings_of(logs)
    assert "says rank 0 of 4" in said
    assert "rank 2 of 4" in said


def test_started_as_the_trainers_rank_with_that_identity(monkeypatch):
    for name in set(os.environ) - set(environ_without_launcher()):
        monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    assert start_for("lightning", 1, 1, 2) is True
    ranks = async_tee.stats()["ranks"]
    assert (ranks["rank"], ranks["local_rank"], ranks["world_size"]) == (1, 1, 2)
    session = lifecycle.active()
    assert session is not None
    assert str(dict(session.settings.resource_attributes)["service.instance.id"]).endswith(
        "/rank-1"
    )
    assert start_for("lightning", 1, 1, 2) is False  # running: not started twice
    assert async_tee.shutdown_telemetry(5.0) is True


def test_a_running_session_of_another_rank_is_kept_and_said(monkeypatch, logs):
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    async_tee.start_telemetry()
    assert start_for("transformers", 7, 0, 8) is False
    assert any("transformers says rank 7" in said for said in warnings_of(logs))
    assert async_tee.shutdown_telemetry(5.0) is True


def test_a_failing_start_never_reaches_training(monkeypatch, logs):
    def broken(**_: object) -> None:
        raise OSError("no")

    monkeypatch.setattr(lifecycle, "start_telemetry", broken)
    assert start_for("verl") is False
    assert any("starting telemetry for verl failed" in said for said in warnings_of(logs))

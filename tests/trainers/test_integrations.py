"""The integrations on the real trainers, on CPU: every key of every step at the receiver (§13).

Each test runs a real trainer (TRL's ``GRPOTrainer``, ``transformers.Trainer``, a Lightning
``Trainer``, verl's ``Tracking``) with its async_tee integration, which starts telemetry from
the environment: OTLP/HTTP to a real receiver on 127.0.0.1 (``OtlpSink``), a step export for
every step (``ASYNC_TEE_MIN_EXPORT_INTERVAL=0``: the toy steps take milliseconds, and the default
1 s would fold them, §9). A recorder beside the integration holds what the trainer logged; every
number of it must arrive, at its step, in the series §13 names, and the session must prove the
delivery (``shutdown_telemetry()`` is True).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from trainers.toys import run_grpo, run_hf_trainer, run_lightning

import async_tee
from async_tee._declare import trainers as trainer_keys
from async_tee.integrations.lightning import AsyncTeeLogger
from async_tee.integrations.transformers import AsyncTeeCallback
from async_tee.sink import OtlpSink
from async_tee.vocabulary import as_scalar

pytestmark = [pytest.mark.trainers, pytest.mark.timeout(300)]

Series = tuple[str, frozenset[tuple[str, str]]]
LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


@pytest.fixture
def exporting(sink: OtlpSink, monkeypatch: pytest.MonkeyPatch) -> OtlpSink:
    """The environment a user sets: OTLP to the sink; nothing of a launcher (one process)."""
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.http_endpoint)
    monkeypatch.setenv("ASYNC_TEE_MIN_EXPORT_INTERVAL", "0")
    monkeypatch.setenv("ASYNC_TEE_FLUSH_SIGNALS", "")
    for name in LAUNCHER:
        monkeypatch.delenv(name, raising=False)
    return sink


def series_of(trainer: trainer_keys.TrainerKeys, key: str) -> Series:
    """Where §13 records a trainer's key."""
    aliases = dict(trainer.aliases)
    if key in aliases:
        return (aliases[key], frozenset())
    phase = trainer.phase_prefix
    if phase and key.startswith(phase) and len(key) > len(phase):
        return ("rl.step.phase.duration", frozenset({("rl.step.phase", key[len(phase) :])}))
    return ("rl.logged.value", frozenset({("rl.trainer", trainer.prefix), ("rl.key", key)}))


def expected(
    trainer: trainer_keys.TrainerKeys, logged: Iterable[tuple[int, Mapping[str, Any]]]
) -> dict[Series, dict[int, float]]:
    """Each series' value at each step: the last number logged for it in that step."""
    out: dict[Series, dict[int, float]] = {}
    for step, metrics in logged:
        for key, raw in metrics.items():
            value = as_scalar(raw)
            if value is not None and math.isfinite(value):
                out.setdefault(series_of(trainer, key), {})[step] = value
    return out


def received(sink: OtlpSink, series: Series) -> dict[int, set[float]]:
    """Every value the receiver got for ``series``, by the step its export carried."""
    out: dict[int, set[float]] = {}
    for step, value in sink.by_step(series[0], dict(series[1])):
        assert step is not None, f"{series}: exported without its step"
        assert value is not None
        out.setdefault(int(step), set()).add(float(value))
    return out


def assert_every_step_arrived(
    sink: OtlpSink,
    trainer: trainer_keys.TrainerKeys,
    logged: list[tuple[int, dict[str, Any]]],
    finished_steps: int,
) -> dict[Series, dict[int, float]]:
    """Delivery proven, every logged number at its step, and the session's counts exact."""
    counts = async_tee.stats()
    assert async_tee.shutdown_telemetry(30.0) is True  # every request delivered: the evidence
    want = expected(trainer, logged)
    assert want
    for series, by_step in want.items():
        got = received(sink, series)
        assert set(got) == set(by_step), (series, sorted(got), sorted(by_step))
        for step, value in by_step.items():
            assert got[step] == {value}, (series, step)  # the last step's is repeated as is
    steps = {step for step, _ in logged}
    assert counts["enqueued"] == len(logged) + finished_steps
    assert counts["dropped"] == 0
    assert counts["values_skipped"]["key_limit"] == 0
    assert counts["values_skipped"]["stale_step"] == 0
    assert received(sink, ("rl.step.time", frozenset())).keys() == steps  # each step exported
    return want


def test_grpo_every_key_of_every_step_reaches_the_receiver_at_its_step(exporting, tmp_path):
    run = run_grpo([AsyncTeeCallback()], tmp_path, steps=3)
    steps = {step for step, _ in run.logged}
    assert steps == {1, 2, 3}
    want = assert_every_step_arrived(exporting, trainer_keys.TRANSFORMERS, run.logged, len(steps))
    # TRL's keys of a NeMo-RL meaning are in NeMo-RL's series; its own, as logged.
    names = {series[0] for series in want}
    assert {"rl.reward.mean", "rl.kl.divergence", "rl.policy.loss", "rl.entropy"} <= names
    assert {"rl.grad_norm", "rl.learning_rate", "rl.response.length.mean"} <= names
    logged_keys = {dict(s[1])["rl.key"] for s in want if s[0] == "rl.logged.value"}
    assert {"rewards/length_reward/mean", "rewards/cat_reward/mean", "reward_std"} <= logged_keys
    assert "train_runtime" in logged_keys  # the end of train's dict joins the last step


def test_a_plain_trainer_too(exporting, tmp_path):
    run = run_hf_trainer([AsyncTeeCallback()], tmp_path, steps=3)
    steps = {step for step, _ in run.logged}
    want = assert_every_step_arrived(exporting, trainer_keys.TRANSFORMERS, run.logged, len(steps))
    assert ("rl.policy.loss", frozenset()) in want


def test_lightning_every_key_of_every_step_reaches_the_receiver_at_its_step(exporting, tmp_path):
    run = run_lightning(AsyncTeeLogger(), tmp_path, steps=3)
    logged = run.recorder.steps
    assert len({step for step, _ in logged}) >= 3
    # one end-of-step marker: at finalize (the steps before end when the next one starts)
    want = assert_every_step_arrived(exporting, trainer_keys.LIGHTNING, logged, 1)
    names = {series[0] for series in want}
    assert {"rl.policy.loss", "rl.reward.mean", "rl.kl.divergence"} <= names
    assert (
        "rl.logged.value",
        frozenset({("rl.trainer", "lightning"), ("rl.key", "lr-SGD")}),
    ) in want

"""The toy runs run the real trainers for their steps, and log what the integrations will see."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trainers.toys import run_grpo, run_hf_trainer, run_lightning
from trainers.verl_toys import RecordingBackend, run_verl_tracking, verl_fit_logs

pytestmark = pytest.mark.trainers

GRPO_KEYS = {
    "loss",
    "grad_norm",
    "learning_rate",
    "num_tokens",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
    "rewards/length_reward/mean",
    "rewards/length_reward/std",
    "rewards/cat_reward/mean",
    "rewards/cat_reward/std",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "kl",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
    "step_time",
    "epoch",
}
TRAINER_KEYS = {"loss", "grad_norm", "learning_rate", "epoch"}
END_KEYS = {
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "total_flos",
    "train_loss",
    "epoch",
}


def shape(logged: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, list[str]]]:
    return [(step, sorted(metrics)) for step, metrics in logged]


def value_types(logged: list[tuple[int, dict[str, Any]]]) -> dict[str, set[type]]:
    types: dict[str, set[type]] = {}
    for _, metrics in logged:
        for key, value in metrics.items():
            types.setdefault(key, set()).add(type(value))
    return types


@pytest.fixture(autouse=True)
def no_new_threads() -> Iterator[None]:
    """No run leaves a thread behind (a hub telemetry thread, a progress bar's monitor...)."""
    before = set(threading.enumerate())
    yield
    assert [t.name for t in set(threading.enumerate()) - before] == []


def test_grpo_logs_trls_keys_at_each_step_then_the_end_of_training(tmp_path: Path):
    run = run_grpo([], tmp_path)
    assert run.trainer.state.global_step == 3
    assert shape(run.logged) == [
        (1, sorted(GRPO_KEYS)),
        (2, sorted(GRPO_KEYS)),
        (3, sorted(GRPO_KEYS)),
        (3, sorted(END_KEYS)),
    ]
    assert set().union(*value_types(run.logged).values()) == {float}
    assert [step for step, _ in run.logged] == [
        entry["step"] for entry in run.trainer.state.log_history
    ]


def test_grpo_without_a_kl_term_logs_no_kl(tmp_path: Path):
    run = run_grpo([], tmp_path, steps=1, beta=0.0)
    assert shape(run.logged) == [(1, sorted(GRPO_KEYS - {"kl"})), (1, sorted(END_KEYS))]


def test_a_plain_trainer_logs_loss_grad_norm_and_learning_rate(tmp_path: Path):
    run = run_hf_trainer([], tmp_path)
    assert shape(run.logged) == [
        (1, sorted(TRAINER_KEYS)),
        (2, sorted(TRAINER_KEYS)),
        (3, sorted(TRAINER_KEYS)),
        (3, sorted(END_KEYS)),
    ]
    assert set().union(*value_types(run.logged).values()) == {float}


def test_lightning_logs_each_step_with_the_epoch_and_finalizes(tmp_path: Path):
    run = run_lightning([], tmp_path)
    # LearningRateMonitor logs at each epoch's start and each step's: twice at step 0
    metrics = ["epoch", "kl", "reward", "train/loss"]
    assert shape(run.recorder.steps) == [
        (0, ["lr-SGD"]),
        (0, ["lr-SGD"]),
        (0, metrics),
        (1, ["lr-SGD"]),
        (1, metrics),
        (2, ["lr-SGD"]),
        (2, metrics),
    ]
    assert value_types(run.recorder.steps) == {
        "lr-SGD": {float},
        "train/loss": {float},
        "reward": {float},
        "kl": {float},
        "epoch": {int},
    }
    assert run.trainer.global_step == 3
    assert run.recorder.hyperparams == [{"lr": 0.1}]
    assert run.recorder.finalized == ["success"]


def test_verls_tracking_calls_every_backend_in_its_dict_but_finishes_only_its_own():
    logs = verl_fit_logs(3)
    extra = RecordingBackend()
    recorded = run_verl_tracking(logs, backends={"extra": extra})
    for backend in (recorded, extra):
        assert backend.steps == logs
        assert not backend.finished
    types = value_types(recorded.steps)
    assert types["training/global_step"] == {int}
    assert types["critic/score/mean"] == {float}
    assert types["training/off_policy/trajectory_spans/max"] == {np.int64}
    assert types["num_turns/min"] == {np.int32}

"""What an export says a step logged: that step's values, counted skips, numbered steps.

In memory, on the real SDK: the session's tables read by an ``InMemoryMetricReader``.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from helpers import collect

import async_tee

NO_ATTRS: frozenset[tuple[str, str]] = frozenset()
REWARD = ("rl.reward.mean", NO_ATTRS)
TOKENS = ("rl.vllm.prompt_tokens", NO_ATTRS)
STEP = ("rl.step", NO_ATTRS)


class CudaScalar:
    """A one-element tensor on an accelerator: reading it would sync the device."""

    shape = ()
    dtype = "torch.float32"

    class device:
        type = "cuda"

    def __float__(self) -> float:
        raise AssertionError("read a device tensor")


def test_values_not_taken_are_counted_by_reason(provider, reader):
    async_tee.start_telemetry(provider)
    tee = async_tee.tee_rl_metrics_to_otel
    tee(
        {"reward": "0.5", "loss": CudaScalar(), "grad_norm": True, "lr": np.array([2e-5])},
        "train",
        1,
    )
    tee({"efficiency/idle/new_category_s": 1.0, "efficiency/total_waste_s": 2.0}, "", 1, True)
    assert async_tee.flush(5)
    got = collect(reader)
    assert got[("rl.grad_norm", frozenset())] == 1.0  # a bool as TensorBoard records it
    assert got[("rl.learning_rate", frozenset())] == 2e-5  # a shape-(1,) array is its element
    assert got[("rl.efficiency.waste", frozenset())] == 2.0  # a total is a row of its own
    assert REWARD not in got
    assert ("rl.policy.loss", frozenset()) not in got
    tee({"reward": 0.25}, "train", 1)  # step 1 was completed by the flush: too late
    assert async_tee.flush(5)
    assert REWARD not in collect(reader)
    skipped = async_tee.stats()["values_skipped"]
    assert skipped["not_a_number"] == 1
    assert skipped["device_tensor"] == 1
    assert skipped["unknown_category"] == 1
    assert skipped["stale_step"] == 1


@pytest.mark.parametrize("efficiency_last", [False, True], ids=["async-order", "after-finish"])
def test_a_step_export_shows_that_step_only_in_either_efficiency_order(
    provider, reader, efficiency_last
):
    async_tee.start_telemetry(provider)
    tee = async_tee.tee_rl_metrics_to_otel
    for step in (1, 2):
        tee({"reward": step / 10, "vllm/prompt_tokens": 100} if step == 1 else {}, "train", step)
        efficiency = {"efficiency/efficiency_pct": 50.0 + step}
        if not efficiency_last:
            tee(efficiency, "", step)
        tee({"total_step_time": float(step)}, "timing/train", step, step_finished=True)
        if efficiency_last:
            tee(efficiency, "", step)  # inside the settle time: still this step's
        assert async_tee.flush(5)
        got = collect(reader)
        assert got[STEP] == step
        assert got[("rl.step.duration", frozenset())] == float(step)
        assert [v for (name, _), v in got.items() if name == "rl.efficiency.pct"] == [50.0 + step]
    # Step 2 logged no reward: absent from its export, not step 1's 0.1 repeated.
    assert REWARD not in got
    assert got[TOKENS] == 100.0  # a counter's total runs on


def test_the_two_argument_call_numbers_steps_ended_by_the_timing_dict(provider, reader):
    async_tee.start_telemetry(provider)
    tee = async_tee.tee_rl_metrics_to_otel
    for step in (1, 2, 3):
        rollout = {"vllm/prompt_tokens": 10.0 * step}
        tee(rollout, "train")
        tee({**rollout, "reward": float(step)}, "train")  # the rollout keys again
        tee({"total_step_time": 1.0}, "timing/train")
        assert async_tee.flush(5)
        got = collect(reader)
        assert got[STEP] == step
        assert got[REWARD] == float(step)
    assert got[TOKENS] == 60.0  # 10 + 20 + 30: each step's delta once


def test_a_loop_with_no_step_ending_dict_counts_every_delta(provider, reader, caplog):
    async_tee.start_telemetry(provider)
    with caplog.at_level(logging.WARNING, logger="async_tee"):
        for _ in range(5):
            async_tee.tee_rl_metrics_to_otel({"vllm/prompt_tokens": 7.0, "reward": 1.0}, "train")
        assert async_tee.flush(5)
    got = collect(reader)
    assert got[TOKENS] == 35.0  # the copies held back while probing are counted after all
    assert STEP not in got  # no step was numbered: none is claimed
    assert async_tee.stats()["steps"]["completed"] == 0
    assert any("step-ending" in r.getMessage() for r in caplog.records)

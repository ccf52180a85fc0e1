"""A NeMo-RL GRPO loop shape replayed through the seed's Logger, in a process of its own.

The Logger here is the seed's: it fans each dict out to its backends (none here) and then
makes the seed's exact tee call, ``tee_rl_metrics_to_otel(metrics, prefix)``: no step, no
``step_finished``. The calls, their order, keys and value types are ``grpo_replay``'s; a step
lasts at least ``--step-seconds`` (the rollout dict half-way, the rest at its end, as the
real loop logs them). Three steps carry a value the tee must judge: ``reward`` a string
(step 5), a shape-(1,) numpy array (step 9), absent (step 13). Validation runs every 5th step.

Prints one JSON line: per step, every shipped gauge row's logged value as a plain float (or
null: absent or not a number), and per counter row the sum of its deltas, each step's delta
once. Then shuts down (the last step's export) and prints ``{"delivered": ...}``.
"""

from __future__ import annotations

import argparse
import json
import numbers
import random
import time
from typing import Any

import numpy as np
from grpo_replay import Call, setup_calls, step_calls

import async_tee
from async_tee.vocabulary import teed_metrics

PERTURBED = {5: "a string", 9: "array", 13: "absent"}


class SeedLogger:
    """NeMo-RL's ``Logger.log_metrics``, reduced to its tee line."""

    def log_metrics(self, metrics: dict[str, Any], step: int, prefix: str = "") -> None:
        del step  # the backends take it; the seed's tee line does not
        async_tee.tee_rl_metrics_to_otel(metrics, prefix)


def plain(value: Any) -> float | None:
    """What a backend would plot: a real number, a bool as 0/1, a one-element array."""
    if isinstance(value, np.ndarray):
        return float(value.reshape(())) if value.size == 1 else None
    if isinstance(value, numbers.Real):
        return float(value)
    return None


def perturb(calls: list[Call], step: int) -> list[Call]:
    how = PERTURBED.get(step)
    out = []
    for call in calls:
        metrics = dict(call.metrics)
        if call.prefix == "train" and "reward" in metrics and how is not None:
            if how == "a string":
                metrics["reward"] = "0.5"
            elif how == "array":
                metrics["reward"] = np.array([float(metrics["reward"]) + 0.125])
            else:
                del metrics["reward"]
        out.append(Call(metrics, call.prefix, call.step, call.step_finished))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=("sync", "async"), required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=1.2)
    args = parser.parse_args()

    async_tee.start_telemetry()
    logger = SeedLogger()
    rows = [row for row in teed_metrics() if not row.held]  # no stall watchdog in these loops
    gauges: dict[int, dict[str, float | None]] = {}
    deltas: dict[str, float] = {row.name: 0.0 for row in rows if row.kind == "counter"}
    rng = random.Random(args.shape)
    for call in setup_calls(args.shape, val_at_start=False, rng=rng):
        logger.log_metrics(call.metrics, call.step, call.prefix)
    for step in range(1, args.steps + 1):
        started = time.monotonic()
        calls = perturb(step_calls(args.shape, step, validate=step % 5 == 0, rng=rng), step)
        logged: dict[str, float | None] = {}
        counted: set[str] = set()
        for index, call in enumerate(calls):
            if index == 0:
                time.sleep(args.step_seconds / 2)  # generation
            elif index == 1:
                time.sleep(max(0.0, args.step_seconds - (time.monotonic() - started)))
            logger.log_metrics(call.metrics, call.step, call.prefix)
            for row in rows:
                if call.prefix not in row.prefixes or row.logger_key not in call.metrics:
                    continue
                value = plain(call.metrics[row.logger_key])
                if row.kind == "counter":
                    if row.name not in counted and value is not None:
                        deltas[row.name] += value  # a step's delta once (sync logs it twice)
                        counted.add(row.name)
                else:
                    logged[row.name] = value
        gauges[step] = logged
    async_tee.flush(10)
    skipped = async_tee.stats()["values_skipped"]
    print(json.dumps({"gauges": gauges, "counters": deltas, "skipped": skipped}), flush=True)
    print(json.dumps({"delivered": async_tee.shutdown_telemetry(10)}), flush=True)


if __name__ == "__main__":
    main()

"""NeMo-RL's stall watchdog, teed: held series logged at the last completed step while steps stop.

Its loop (``nemo_rl/algorithms/single_controller.py``) calls ``logger.log_metrics(metrics,
step=<train steps completed>)`` every ``interval_s``, prefix ``""``, with ``rollout/*`` and
``gen_fleet/*`` keys; the ``*_total`` keys are running totals (docs/semantics.md §3g).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import async_tee
from async_tee.sink import OtlpSink


def _watchdog(idle_s: float, committed: float, skipped: float = 0.0) -> dict[str, float]:
    """One watchdog dict, as ``_stall_watchdog_pump`` builds it (a subset of its keys)."""
    return {
        "rollout/committed_total": committed,
        "rollout/skipped_total": skipped,
        "rollout/max_consecutive_infra_drops": 0.0,
        "rollout/inflight": 2.0,
        "rollout/idle_s": idle_s,
        "rollout/train_steps": 3.0,
        "gen_fleet/serving_shards": 4.0,
        "gen_fleet/shards/healthy": 3.0,
        "gen_fleet/shards/dead": 1.0,
        "gen_fleet/shards/zombie": 1.0,  # a state NeMo-RL does not have: left out, counted
        "gen_fleet/membership_epoch": 2.0,
        "gen_fleet/restart_attempts/0": 2.0,  # per shard: left out, counted
        "gen_fleet/shard_weight_version/0": 5.0,
    }


def _at(sink: OtlpSink, name: str, time_unix_nano: int) -> float | None:
    found = [
        p.value for p in sink.points() if p.name == name and p.time_unix_nano == time_unix_nano
    ]
    return found[-1] if found else None


@pytest.mark.parametrize("call", ["two-argument", "four-argument"])
def test_watchdog_keys_are_held_and_its_totals_exported_as_logged(sink, call):
    session = async_tee.start_telemetry(
        environ={
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint,
            "ASYNC_TEE_MIN_EXPORT_INTERVAL": "0",
        }
    )
    assert isinstance(session, async_tee.Pipeline)
    logger = async_tee.Logger()
    for step in (1, 2, 3):
        logger.log_metrics({"reward": float(step)}, step, "train")
        logger.log_metrics({"total_step_time": 1.0}, step, "timing/train", step_finished=True)
    assert async_tee.flush(5)
    # Steps stop; the watchdog logs at the last completed step, the two-argument call.
    for idle_s, committed in ((30.0, 5.0), (60.0, 7.0), (90.0, 7.0)):
        if call == "two-argument":
            logger.log_metrics(_watchdog(idle_s, committed), 3)
        else:
            logger.log_metrics(_watchdog(idle_s, committed), 3, "", None)
    assert async_tee.flush(5)
    assert session.flush_and_export(5)
    points = {p.name: p for p in sink.points()}
    assert points["rl.rollout.idle"].value == 90.0  # the last logged, not skipped as stale
    committed = points["rl.rollout.committed"]
    assert committed.value == 7.0  # the last logged total, not 5 + 7 + 7
    assert (committed.kind, committed.monotonic, committed.temporality) == (
        "sum",
        True,
        "cumulative",
    )
    assert points["rl.gen_fleet.serving_shards"].value == 4.0
    shards = {
        p.attributes["rl.shard.state"]: p.value
        for p in sink.points()
        if p.name == "rl.gen_fleet.shards"
    }
    assert shards == {"healthy": 3.0, "dead": 1.0}  # a bounded attribute: the known states
    skipped = async_tee.stats()["values_skipped"]
    assert skipped["stale_step"] == 0  # none of the watchdog's values was taken as stale
    assert (skipped["unknown_state"], skipped["per_shard"]) == (3, 6)  # three dicts

    # Held for the run: a step's export carries the state though the step did not log it.
    logger.log_metrics({"reward": 4.0}, 4, "train")
    logger.log_metrics({"total_step_time": 1.0}, 4, "timing/train", step_finished=True)
    assert async_tee.flush(5)
    assert sink.wait_for(
        lambda s: any(p.name == "rl.step" and p.value == 4 for p in s.points()), 10
    )
    step_4 = next(p for p in sink.points() if p.name == "rl.step" and p.value == 4)
    assert _at(sink, "rl.rollout.idle", step_4.time_unix_nano) == 90.0
    assert _at(sink, "rl.rollout.committed", step_4.time_unix_nano) == 7.0
    assert _at(sink, "rl.reward.mean", step_4.time_unix_nano) == 4.0
    assert async_tee.shutdown_telemetry(5)


TRAINER = """
import os, time
import async_tee

async_tee.start_telemetry()
logger = async_tee.Logger()
for step in range(1, 4):
    logger.log_metrics({"reward": float(step)}, step, "train")
    logger.log_metrics({"total_step_time": 1.0}, step, "timing/train", step_finished=True)
print("stepped", flush=True)
# A hang: no step completes; the watchdog still logs every 0.2 s at the last step.
started = time.monotonic()
for tick in range(1, int(os.environ["TICKS"]) + 1):
    time.sleep(0.2)
    logger.log_metrics(
        {
            "rollout/idle_s": time.monotonic() - started,
            "rollout/committed_total": 10.0 + tick,
            "rollout/inflight": 1.0,
        },
        3,
    )
print("idle", tick, flush=True)
async_tee.shutdown_telemetry(5)
"""


@pytest.mark.slow
def test_a_hung_trainers_watchdog_reaches_the_receiver_while_its_steps_stop(sink):
    ticks = 20  # 4 s: the worker drains about once a second while steps stand still
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TRAINER)],
        env={
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint,
            "OTEL_METRIC_EXPORT_INTERVAL": "300",  # the periodic export carries held series
            "ASYNC_TEE_FLUSH_SIGNALS": "",
            "TICKS": str(ticks),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"idle {ticks}" in done.stdout
    idle = [p for p in sink.points() if p.name == "rl.rollout.idle"]
    steps = {p.value for p in sink.points() if p.name == "rl.step"}
    assert max(steps) == 3  # no step after the hang began (step 2 may be coalesced)
    values = [p.value for p in sorted(idle, key=lambda p: p.time_unix_nano)]
    assert len(set(values)) >= 3  # exported while the steps stood still, several times
    assert values == sorted(values)  # idle only grows
    totals = [p.value for p in sink.points() if p.name == "rl.rollout.committed"]
    assert max(totals) == 10.0 + ticks  # the last logged total, exactly
    assert set(totals) <= {10.0 + tick for tick in range(1, ticks + 1)}  # never a sum


def test_a_restarted_trainers_totals_start_afresh(sink):
    """A trainer that restarts (a new session: a new process, or a new start in this one)
    exports its own running totals from its own start, nothing carried over."""
    for totals in ((20.0, 25.0), (1.0, 3.0)):
        async_tee.start_telemetry(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint})
        logger = async_tee.Logger()
        logger.log_metrics({"reward": 1.0}, 1, "train")
        logger.log_metrics({"total_step_time": 1.0}, 1, "timing/train", step_finished=True)
        for committed in totals:
            logger.log_metrics({"rollout/committed_total": committed}, 1)
        assert async_tee.shutdown_telemetry(5)
    got = [
        p.value
        for p in sorted(sink.points(), key=lambda p: p.time_unix_nano)
        if p.name == "rl.rollout.committed"
    ]
    assert got[-1] == 3.0  # the second run's own total
    assert 25.0 in got  # the first run's, before it
    assert set(got) <= {20.0, 25.0, 1.0, 3.0}  # each a logged total, never a sum

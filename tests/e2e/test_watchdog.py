"""NeMo-RL's stall watchdog, teed: held series logged at the last completed step while steps stop.

Its loop (``nemo_rl/algorithms/single_controller.py``) calls ``logger.log_metrics(metrics,
step=<train steps completed>)`` every ``interval_s``, prefix ``""``, with ``rollout/*`` and
``gen_fleet/*`` keys; the ``*_total`` keys are running totals (docs/semantics.md §3g).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from helpers import RANK_PROCESS, collect, end_ranks, environ_without_launcher

import async_tee
from async_tee import alerts, stack
from async_tee.sink import OtlpSink
from servers import firing_and_pending, free_ports, local_addresses, run_stack, wait_for_query


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


HELD_SETS = 9
"""The held attribute sets one ``_watchdog`` dict logs: six rows, the serving shards and two
shard states."""


def _latest(sink: OtlpSink) -> dict[str, float | None]:
    """The newest export's points, by series (each held series here has one set but shards)."""
    points = sink.points()
    newest = max(p.time_unix_nano for p in points)
    return {p.name: p.value for p in points if p.time_unix_nano == newest}


def _scraped(address: tuple[str, int]) -> dict[str, float | None]:
    """The rank's ``/metrics`` now: each series' last sample by name (labels dropped)."""
    host, port = address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        page = response.read().decode()
    found = re.findall(r"^([a-z_]+)(?:\{[^}]*\})? (\S+)$", page, re.MULTILINE)
    return {name: float(value) for name, value in found}


@pytest.mark.parametrize("way", ["otlp", "provider", "prometheus"])
def test_a_held_value_not_logged_within_the_ttl_leaves_every_export_until_logged_again(
    sink, provider, reader, way
):
    """The TTL set small through the environment and waited out on the real clock: the
    OTLP export built from the tables, the SDK's collection of a provider passed in and
    the Prometheus scrape (both call the series' callback) all leave the stale sets out."""
    environ = {
        "ASYNC_TEE_HELD_TTL": "0.5",
        "ASYNC_TEE_MIN_EXPORT_INTERVAL": "0",
        "ASYNC_TEE_FLUSH_SIGNALS": "",
    }
    names = ("rl.rollout.idle", "rl.rollout.committed", "rl.step")
    if way == "prometheus":
        environ.update(OTEL_METRICS_EXPORTER="prometheus", OTEL_EXPORTER_PROMETHEUS_PORT="0")
        names = ("rl_rollout_idle_seconds", "rl_rollout_committed_total", "rl_step")
    elif way == "otlp":
        environ.update(OTEL_EXPORTER_OTLP_ENDPOINT=sink.http_endpoint)
    idle, committed, step = names
    session = async_tee.start_telemetry(provider if way == "provider" else None, environ=environ)
    assert isinstance(session, async_tee.Pipeline)

    def exported() -> dict[str, float | None]:
        assert async_tee.flush(5)
        if way == "prometheus":
            address = session.prometheus_address
            assert address is not None
            return _scraped(address)
        if way == "provider":
            return {name: value for (name, _attributes), value in collect(reader).items()}
        assert session.flush_and_export(5)
        return _latest(sink)

    logger = async_tee.Logger()
    logger.log_metrics({"reward": 1.0}, 1, "train")
    logger.log_metrics({"total_step_time": 1.0}, 1, "timing/train", step_finished=True)
    logged_at = time.monotonic()
    logger.log_metrics(_watchdog(0.5, 5.0), 1)
    before = exported()
    assert time.monotonic() - logged_at < 0.5, "the first export came after the TTL: rerun"
    assert (before[idle], before[committed], before[step]) == (0.5, 5.0, 1.0)

    time.sleep(max(0.0, logged_at + 0.6 - time.monotonic()))  # the TTL, on the real clock
    after = exported()
    assert idle not in after
    assert committed not in after
    assert after[step] == 1.0  # the step's own series are not held: unchanged
    assert async_tee.stats()["values_skipped"]["held_expired"] == HELD_SETS

    logger.log_metrics({"rollout/idle_s": 40.0}, 1)  # the watchdog again: back
    again = exported()
    assert again[idle] == 40.0
    assert committed not in again  # not logged again: still out
    assert async_tee.stats()["values_skipped"]["held_expired"] == HELD_SETS
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


def _sending_timestamps(original):
    """``stack.collector_config`` with its ``prometheus`` exporter sending each sample's time."""

    def config(path, at, extra_exporters=None):
        text = original(path, at, extra_exporters)
        changed = re.sub(
            r"(\n    metric_expiration: \S+\n)", r"\1    send_timestamps: true\n", text
        )
        assert changed != text, "the collector's prometheus exporter block changed: update this"
        return changed

    return config


@pytest.mark.slow
@pytest.mark.servers
@pytest.mark.timeout(150)
@pytest.mark.parametrize("path", [*stack.PATHS, "collector+timestamps"])
def test_a_watchdog_that_stops_while_its_trainer_hangs_no_longer_spares_it(
    path, tmp_path, monkeypatch
):
    """Two ranks stop stepping after 3 steps, on each path of ``async-tee stack`` (and behind a
    Collector whose ``prometheus`` exporter sends timestamps). Rank 0's watchdog stops 3 ticks
    later, its last idle under a second (``ASYNC_TEE_HELD_TTL=1``); rank 1's goes on logging
    an idle of 0 (rollouts committing). ``RLTrainerStuck`` fires for rank 0 and never names
    rank 1. Behind a Collector serving stale series for 2 minutes, only the freshness clause
    can end rank 0's reprieve in time when it sends timestamps; the expiration does without."""
    thresholds = alerts.AlertThresholds(
        stuck_after_s=5, rollout_idle_s=600, rank_silent_s=3, for_multiplier=2 / 300
    )
    timestamps = path == "collector+timestamps"
    if timestamps:
        path = "collector"
        # where render_stack looks it up (the package only re-exports it)
        sending = _sending_timestamps(stack.paths.collector_config)
        monkeypatch.setattr(stack.paths, "collector_config", sending)
    base = free_ports(2) if path == "scrape" else None
    targets = tuple(f"127.0.0.1:{base + r}" for r in range(2)) if base else ()
    addresses = local_addresses(targets, metric_expiration_s=120 if timestamps else 3)
    watchdogs = {0: ["--watchdog-stops-after", "3"], 1: ["--watchdog", "committing"]}
    procs: dict[int, subprocess.Popen[str]] = {}
    fired: dict[str, float] = {}  # rank -> when RLTrainerStuck was first seen firing for it
    named: set[str] = set()  # every rank RLTrainerStuck named, pending or firing
    with run_stack(path, tmp_path, addresses, thresholds) as running:
        web = running.web
        try:
            for rank, extra in watchdogs.items():
                env = environ_without_launcher()
                env.update(
                    RANK=str(rank),
                    LOCAL_RANK=str(rank),
                    WORLD_SIZE="2",
                    ASYNC_TEE_RUN_ID="hung",
                    ASYNC_TEE_MIN_EXPORT_INTERVAL="0",
                    ASYNC_TEE_HELD_TTL="1",
                    OTEL_METRIC_EXPORT_INTERVAL="1000",  # pushed: a current sample every second
                    **running.rank_environment(),
                )
                if base is not None:
                    env.update(
                        ASYNC_TEE_PROMETHEUS_BASE_PORT=str(base),
                        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
                    )
                argv = [sys.executable, str(RANK_PROCESS), "--steps", "3", "--nan-step", "0"]
                with (tmp_path / f"rank-{rank}.log").open("w") as err:
                    procs[rank] = subprocess.Popen(
                        [*argv, *extra],
                        env=env,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=err,
                        text=True,
                    )
            for proc in procs.values():
                assert proc.stdout is not None
                assert json.loads(proc.stdout.readline())["steps"] == 3  # the steps are done
            hung = time.time()
            watched = wait_for_query(web, "count(rl_rollout_idle_seconds)", bool)
            assert watched, f"{path}: the watchdogs' idle never arrived"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (
                "0" not in fired or time.time() < fired["0"] + 5  # and 5 s more for rank 1
            ):
                with contextlib.suppress(OSError):
                    for alert in firing_and_pending(web):
                        if alert["labels"]["alertname"] != "RLTrainerStuck":
                            continue
                        rank = alert["labels"].get("rl_rank", "")
                        named.add(rank)
                        if alert["state"] == "firing":
                            fired.setdefault(rank, time.time())
                time.sleep(0.2)  # polling an external server, not waiting for our worker
        finally:
            ends = end_ranks(procs)
    assert "0" in fired, f"{path}: the rank whose watchdog stopped was spared: {named}"
    assert named == {"0"}, f"{path}: the rank whose watchdog reports was not spared: {named}"
    took = fired["0"] - hung
    print(f"{path}{' (timestamps)' if timestamps else ''}: stuck fired {took:.1f} s after")
    assert took >= thresholds.stuck_after_s
    assert all(ends.values()), ends

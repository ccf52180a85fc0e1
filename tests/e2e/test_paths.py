"""Every path users run, on the real servers: 4 rank processes of 2 runs, every query proven.

Per path of ``async-tee stack`` ((a) Prometheus 3 scrapes each rank; (b1) OTLP -> Collector's
``prometheus`` exporter <- scrape; (b2) OTLP -> Collector -> remote write; (c) OTLP/HTTP ->
Prometheus 3's OTLP receiver), started from the stack's own configs: every series' name read
back equals the catalog's; every dashboard query, for one run and one rank, returns data of
that run and rank only; a NeMo-Lens selector finds the series behind a Collector or the OTLP
receiver; and the alert rules fire for the rank that earned them, and only for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    catalog_names,
    end_ranks,
    pushing_rank_env,
    start_rank_process,
    stop_stepping,
)

from async_tee import alerts, stack
from servers import (
    RunningFleet,
    RunningStack,
    dashboard_for,
    firing_and_pending,
    free_ports,
    local_addresses,
    own_counters,
    query,
    run_fleet,
    run_stack,
    wait_for_query,
)

pytestmark = [pytest.mark.slow, pytest.mark.servers]

RUNS = {"run-a": 0.0, "run-b": 100.0}  # each run's reward offset: its values are its own
RANKS = 2


EVERY_PATH = (*stack.PATHS, "fleet")
"""The four paths to one Prometheus, and the fleet (2 node agents into Thanos)."""


def _running(
    path: str,
    folder: Path,
    addresses: stack.StackAddresses,
    thresholds: alerts.AlertThresholds | None = None,
) -> contextlib.AbstractContextManager[RunningStack | RunningFleet]:
    """The stack of ``path`` from its generated configs; the fleet's with 2 node agents (rank
    r on node r % 2)."""
    if path == "fleet":
        return run_fleet(folder, nodes=2, thresholds=thresholds)
    return run_stack(path, folder, addresses, thresholds)


def rank_env(
    running: RunningStack | RunningFleet, run: str, rank: int, base: int | None
) -> dict[str, str]:
    env = pushing_rank_env(running, run, rank, RANKS)
    if base is not None:
        env.update(
            ASYNC_TEE_PROMETHEUS_BASE_PORT=str(base), OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1"
        )
    return env


start_rank = start_rank_process


@pytest.mark.timeout(150)
@pytest.mark.parametrize("path", EVERY_PATH)
def test_every_query_on_every_path_finds_its_run_and_rank_only(path, tmp_path):
    dashboard = pytest.importorskip("async_tee.dashboard")  # the reward query below
    pytest.importorskip("grafana_foundation_sdk")
    bases = {run: free_ports(RANKS) if path == "scrape" else None for run in RUNS}
    targets = tuple(
        f"127.0.0.1:{base + rank}" for base in bases.values() if base for rank in range(RANKS)
    )
    procs: dict[tuple[str, int], subprocess.Popen[str]] = {}
    with _running(path, tmp_path, local_addresses(targets)) as running:
        web = running.web
        try:
            for run, offset in RUNS.items():
                for rank in range(RANKS):
                    env = rank_env(running, run, rank, bases[run])
                    log = tmp_path / f"{run}-{rank}.log"
                    procs[(run, rank)] = start_rank(env, log, "--reward-offset", str(offset))
            runs = 'target_info{rl_run_id=~"run-."}'
            every = f"count(rl_reward_mean * on (job, instance) group_left () {runs})"
            seen = wait_for_query(web, every, lambda r: r and float(r[0]["value"][1]) == 4)
            assert seen, f"{path}: not all 4 ranks arrived ({seen})"
            filled = wait_for_query(
                web,
                "count(rate(async_tee_lag_milliseconds_count[1m]) > 0)",
                lambda r: r and float(r[0]["value"][1]) == 4,
            )
            assert filled, f"{path}: rates over 1m never covered every rank"
            watched = wait_for_query(  # the stall watchdog's thread: two samples a rank
                web,
                "count(count_over_time(rl_rollout_committed_total[1m]) > 1)",
                lambda r: r and float(r[0]["value"][1]) == 4,
            )
            assert watched, f"{path}: the watchdog's series never reached every rank"

            # One name per series on every path: what the server holds is the catalog's.
            held = query(web, 'group by (__name__) ({__name__=~"(rl|async_tee)_.+"})')
            names = {row["metric"]["__name__"] for row in held}
            catalog = catalog_names()
            assert names <= catalog, f"{path}: names not in the catalog: {names - catalog}"
            assert catalog <= names, f"{path}: catalog names never seen: {catalog - names}"

            # Every dashboard query, for run-b's rank 1: data, and only that run's and rank's.
            # A rank's later series may still be on their way on a loaded box: polled to a
            # deadline, all queries at once.
            deadline = time.monotonic() + 30
            while True:
                empty, foreign = dashboard_for(web, {"run": "run-b", "rank": "1"})
                if not empty or time.monotonic() > deadline:
                    break
                time.sleep(0.5)  # polling an external server, not waiting for our worker
            assert not empty, f"{path}: queries with no data: {empty}"
            assert not foreign, f"{path}: queries with another run's or rank's series: {foreign}"
            reward = dashboard.expand_variables(
                "rl_reward_mean * on (job, instance) group_left (rl_rank, rl_run_id) "
                'target_info{rl_run_id=~"$run", rl_rank=~"$rank"}',
                {"run": "run-b", "rank": "1"},
            )
            assert [float(r["value"][1]) for r in query(web, reward)] == [101.25]

            if path != "scrape":  # NeMo-Lens's selectors: resource attributes on every series
                lens = 'rl_reward_mean{service_name="rank_process", nemo_run_id="run-b"}'
                rows = query(web, lens)
                assert {r["metric"].get("dl_rank") for r in rows} == {"0", "1"}, (path, rows)
                assert sorted(float(r["value"][1]) for r in rows) == [100.25, 101.25]
            reports = stop_stepping(procs)
        finally:
            ends = end_ranks(procs)
    for key, report in reports.items():
        assert report["exporting"], key
    assert all(ends.values()), ends  # every rank delivered to the end


def _events(log: Path) -> dict[str, float]:
    """The events a rank printed on stderr (``{"event": ..., "at": ...}`` lines)."""
    found = {}
    for line in log.read_text().splitlines():
        if line.startswith('{"event"'):
            event = json.loads(line)
            found[event["event"]] = event["at"]
    return found


@pytest.mark.timeout(150)
@pytest.mark.parametrize("path", EVERY_PATH)
def test_the_alerts_fire_for_the_rank_that_earned_them_on_every_path(path, tmp_path):
    """One run of 4 ranks: 0 healthy; 1 stops stepping after 3 steps (still exporting); 2 logs
    one NaN ``grad_norm``; 3 is killed (SIGKILL) once it has exported. Stuck and rollout-idle
    (its stall watchdog still reports) fire for rank 1, non-finite for rank 2, rank-gone for
    rank 3; nothing ever names rank 0. Rules from
    ``async-tee alerts`` with short thresholds, evaluated every second; the seconds from each
    event to firing are printed."""
    thresholds = alerts.AlertThresholds(
        stuck_after_s=5, rollout_idle_s=5, rank_silent_s=3, for_multiplier=2 / 300
    )
    base = free_ports(4) if path == "scrape" else None
    targets = tuple(f"127.0.0.1:{base + r}" for r in range(4)) if base else ()
    # The Collector's prometheus exporter serves a series that stopped arriving this long.
    addresses = local_addresses(targets, metric_expiration_s=3)
    argv = {
        0: ["--nan-step", "0"],
        1: ["--nan-step", "0", "--steps", "3"],
        2: ["--nan-step", "2", "--print-events"],
    }
    argv[3] = ["--nan-step", "0"]
    procs: dict[int, subprocess.Popen[str]] = {}
    seen: dict[tuple[str, str], float] = {}  # (alert, rank) -> when first seen firing
    with _running(path, tmp_path, addresses, thresholds) as running:
        web = running.web
        try:
            for rank, extra in argv.items():
                env = {**rank_env(running, "run-a", rank, base), "WORLD_SIZE": "4"}
                procs[rank] = start_rank(env, tmp_path / f"rank-{rank}.log", *extra)
            assert procs[1].stdout is not None
            assert json.loads(procs[1].stdout.readline())["steps"] == 3  # its steps are done
            last_step = time.time()
            exported = wait_for_query(web, 'target_info{rl_rank="3"}', bool)
            assert exported, f"{path}: rank 3 never exported"
            procs[3].kill()
            killed = time.time()
            wanted = {
                ("RLTrainerStuck", "1"),
                ("RLRolloutIdle", "1"),  # its stall watchdog goes on reporting, idle growing
                ("RLNonFiniteValues", "2"),
                ("RLRankGone", "3"),
            }
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not wanted <= seen.keys():
                with contextlib.suppress(OSError):
                    for alert in firing_and_pending(web):
                        key = (alert["labels"]["alertname"], alert["labels"].get("rl_rank", ""))
                        if alert["state"] == "firing":
                            seen.setdefault(key, time.time())
                        assert key[1] != "0", f"{path}: the healthy rank alerted: {alert}"
                time.sleep(0.2)  # polling an external server, not waiting for our worker
            for rank in (0, 2):
                stdin = procs[rank].stdin
                assert stdin is not None
                stdin.write("stop\n")
                stdin.flush()
        finally:
            ends = end_ranks(procs)
    assert wanted <= seen.keys(), (path, seen)
    nan_at = _events(tmp_path / "rank-2.log")["nan"]
    took = {
        "RLTrainerStuck": seen[("RLTrainerStuck", "1")] - last_step,
        "RLRolloutIdle": seen[("RLRolloutIdle", "1")] - last_step,
        "RLNonFiniteValues": seen[("RLNonFiniteValues", "2")] - nan_at,
        "RLRankGone": seen[("RLRankGone", "3")] - killed,
    }
    print(
        f"{path}: seconds from the event to firing: "
        + json.dumps({k: round(v, 1) for k, v in took.items()})
    )
    assert took["RLTrainerStuck"] >= thresholds.stuck_after_s  # not before its threshold
    assert took["RLRolloutIdle"] >= thresholds.rollout_idle_s
    assert {ends[rank] for rank in (0, 1, 2)} == {True}, ends


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


RANKS_AT_ONCE, STEPS = 32, 8


def _missing(rows: list[dict[str, Any]], reports: dict[int, Any]) -> dict[int, int]:
    """How many of each rank's steps (0, the set-up call, to ``STEPS``) have no sample."""
    by_rank = {row["metric"]["rl_rank"]: {float(v) for _, v in row["values"]} for row in rows}
    every = set(map(float, range(STEPS + 1)))
    return {rank: len(every - by_rank.get(str(rank), set())) for rank in reports}


def _coalesced(reports: dict[int, Any]) -> dict[int, int]:
    return {rank: report["stats"]["steps"]["coalesced"] for rank, report in reports.items()}


@pytest.mark.timeout(240)
def test_32_ranks_through_one_collector_every_step_of_every_rank_arrives(tmp_path):
    """32 rank processes -> one Collector -> remote write -> Prometheus 3: every step of every
    rank is a sample in Prometheus, the Collector's debug and remote-write exporters each passed
    on every point its receiver took, and nothing was refused or failed. Prints what it took."""
    debug = {"debug": "    verbosity: basic\n"}
    with run_stack("remote-write", tmp_path, extra_exporters=debug) as running:
        procs: dict[int, subprocess.Popen[str]] = {}
        try:
            collector_cpu = _cpu_seconds(running.pids["otelcol"])
            started = time.monotonic()
            for rank in range(RANKS_AT_ONCE):
                env = {**rank_env(running, "wide", rank, None), "WORLD_SIZE": str(RANKS_AT_ONCE)}
                log = tmp_path / f"rank-{rank}.log"
                procs[rank] = start_rank(env, log, "--steps", str(STEPS), "--nan-step", "0")
            reports = {}
            for rank, proc in procs.items():
                assert proc.stdout is not None
                reports[rank] = json.loads(proc.stdout.readline())  # its steps are flushed
        finally:
            ends = end_ranks(procs)
        took = time.monotonic() - started
        port = running.addresses.collector_telemetry_port
        deadline = time.monotonic() + 20
        while True:  # the last batch may still be on its way out: poll the Collector
            counts = own_counters(port)
            accepted = counts["otelcol_receiver_accepted_metric_points_total"]
            if counts["otelcol_exporter_sent_metric_points_total"] == 2 * accepted:
                break  # both exporters (remote write, debug) passed on every point
            assert time.monotonic() < deadline, counts
            time.sleep(0.2)  # polling an external server, not waiting for our worker
        collector_cpu = _cpu_seconds(running.pids["otelcol"]) - collector_cpu
        # What the Collector passed on is in its remote-write log, sent within a second or two.
        samples = wait_for_query(
            running.web,
            'rl_step{rl_run_id="wide"}[10m]',
            lambda rows: _missing(rows, reports) == _coalesced(reports),
            timeout_s=20,
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{running.web}/metrics", timeout=10) as got:
            own = [  # Prometheus's own word on samples it refused (for the failure message)
                line
                for line in got.read().decode().splitlines()
                if line.startswith(("prometheus_tsdb_out_of_order", "prometheus_tsdb_head_samples"))
            ]
    assert all(ends.values()), ends
    assert [reports[r]["steps"] for r in procs] == [STEPS] * RANKS_AT_ONCE
    assert counts.get("otelcol_receiver_refused_metric_points_total", 0) == 0, counts
    assert counts.get("otelcol_exporter_send_failed_metric_points_total", 0) == 0, counts
    by_rank = {row["metric"]["rl_rank"]: {float(v) for _, v in row["values"]} for row in samples}
    assert sorted(by_rank, key=int) == [str(r) for r in procs]
    for rank, report in reports.items():
        # Every step is a sample, but a step the rank coalesced into the next one (its export
        # still busy when the next step completed, on a box this loaded) and counted so.
        steps = report["stats"]["steps"]
        missing = set(map(float, range(STEPS + 1))) - by_rank[str(rank)]  # 0: the set-up call
        exports = report["stats"]["exports"]
        assert len(missing) == steps["coalesced"], (rank, missing, steps, exports, own, counts)
        # Reported before the session ends: the newest step may still wait for its export
        # (the final one carries it), so at most one step is neither exported nor folded yet.
        waiting = steps["completed"] - steps["exported"] - steps["coalesced"]
        assert waiting in (0, 1), (rank, steps)
    coalesced = sum(report["stats"]["steps"]["coalesced"] for report in reports.values())
    sent = "otelcol_exporter_sent_metric_points_total/"
    assert counts[sent + "debug"] == counts[sent + "prometheus_remote_write"] == accepted
    logged = counts["otelcol_exporter_prometheusremotewrite_wal_bytes_written_total"]
    print(
        f"32 ranks x {STEPS} steps in {took:.1f} s: the Collector took {accepted:.0f} points "
        f"({accepted / took:.0f}/s) for {collector_cpu:.2f} CPU-s "
        f"({1e6 * collector_cpu / accepted:.1f} CPU-us a point); {coalesced} steps coalesced; "
        f"its remote-write log took {logged / accepted:.0f} bytes a point"
    )

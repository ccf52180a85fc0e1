"""The fleet on the real servers: node agents (Collectors) and Thanos Receive, Query and Rule.

As ``async-tee stack --path fleet`` writes it (``servers.run_fleet``): rank processes export
OTLP/HTTP to their node's agent, which keeps what it accepted on disk and forwards it to the
store's router, which sends each series to 2 of the 3 ingesting receivers. What every path is
held to (every catalog name, every dashboard query, every alert rule) is proven on the fleet
too, in tests/e2e/test_paths.py; here, what only the fleet has: the replicas, one receiver
killed mid-run with no step of any rank lost, and an agent killed while the store is away with
no step lost either. And the store takes Prometheus remote write: the Collector of the
``remote-write`` path writes to it as to Prometheus 3.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    end_ranks,
    pushing_rank_env,
    start_rank_process,
    stop_stepping,
)

from async_tee import stack
from servers import (
    STORE_RECEIVERS,
    STORE_REPLICATION,
    RunningAgent,
    RunningStack,
    agent_settings,
    get,
    metric_samples,
    own_counters,
    query,
    run_agent,
    run_fleet,
    run_stack,
    run_store,
    wait_for_query,
)

pytestmark = [pytest.mark.slow, pytest.mark.servers]

RUNS = {"run-a": 0.0, "run-b": 100.0}  # each run's reward offset: its values are its own


def start_rank(
    to: RunningAgent | RunningStack, run: str, rank: int, world: int, log: Path, *argv: str
) -> subprocess.Popen[str]:
    """A rank process exporting every second, to its node's agent or a stack; stderr to ``log``."""
    return start_rank_process(pushing_rank_env(to, run, rank, world), log, *argv)


def replicas(web: int, expr: str) -> list[dict[str, Any]]:
    """The query's result per receiver: each replica's series, not deduplicated."""
    rows: list[dict[str, Any]] = get(web, "/api/v1/query", query=expr, dedup="false")["result"]
    return rows


def _labels_of(rows: list[dict[str, Any]], label: str) -> set[str]:
    return {row["metric"][label] for row in rows if label in row["metric"]}


def _steps_held(rows: list[dict[str, Any]]) -> dict[str, set[float]]:
    """Each rank's ``rl_step`` values among a range query's rows."""
    held: dict[str, set[float]] = {}
    for row in rows:
        held.setdefault(row["metric"]["rl_rank"], set()).update(float(v) for _, v in row["values"])
    return held


def _last_step(web: int, expr: str) -> float:
    rows = query(web, f"max({expr})")
    return float(rows[0]["value"][1]) if rows else -1.0


@pytest.mark.timeout(180)
def test_a_receiver_killed_mid_run_loses_no_step(tmp_path):
    """2 ranks step every 0.3 s; one receiver holding rank 0's ``rl_step`` is killed (SIGKILL)
    once steps arrive, stays down for 3 more steps at least, and is restarted on its own data.
    Every step of every rank is in the store afterwards (read through Query, replicas merged);
    the killed receiver's own copy misses the steps of its outage, and holds steps again after
    its restart; the ranks never saw a failed export."""
    procs: dict[int, subprocess.Popen[str]] = {}
    step, rank_0 = 'rl_step{rl_run_id="crash"}', 'rl_step{rl_run_id="crash", rl_rank="0"}'
    with run_fleet(tmp_path, nodes=2) as fleet:
        store, web = fleet.store, fleet.web
        try:
            for rank in range(2):
                log = tmp_path / f"rank-{rank}.log"
                procs[rank] = start_rank(fleet.agents[rank], "crash", rank, 2, log)
            first = wait_for_query(web, rank_0, bool)
            assert first, "rank 0's steps never arrived"
            # Each series is held by STORE_REPLICATION receivers, and every receiver holds some.
            held_by: dict[str, set[str]] = {}
            for row in replicas(web, '{__name__=~"rl_.+", rl_run_id="crash"}'):
                labels = {k: v for k, v in row["metric"].items() if k != "receive_replica"}
                key = json.dumps(labels, sort_keys=True)
                held_by.setdefault(key, set()).add(row["metric"]["receive_replica"])
            assert {len(r) for r in held_by.values()} == {STORE_REPLICATION}
            receivers = {f"receive-{i}" for i in range(STORE_RECEIVERS)}
            assert set().union(*held_by.values()) == receivers
            holders = _labels_of(replicas(web, rank_0), "receive_replica")
            assert len(holders) == STORE_REPLICATION, holders
            killed = min(holders)
            own_copy = f'rl_step{{rl_run_id="crash", rl_rank="0", receive_replica="{killed}"}}'
            with store.receiver_down(int(killed.rsplit("-", 1)[1])):
                down_at = _last_step(web, step)
                deadline = time.monotonic() + 30
                while _last_step(web, step) < down_at + 3:  # steps go on arriving meanwhile
                    assert time.monotonic() < deadline, "no steps arrived with a receiver down"
                    time.sleep(0.2)  # polling an external server
                up_at = _last_step(web, step)
            deadline = time.monotonic() + 30
            while not any(float(r["value"][1]) > up_at for r in replicas(web, own_copy)):
                assert time.monotonic() < deadline, "the restarted receiver took no step again"
                time.sleep(0.2)  # polling an external server
            reports = stop_stepping(procs)
        finally:
            ends = end_ranks(procs)
        # The agents' own word: the store stayed writable with one receiver down (each series
        # has a second copy), so no send of theirs failed, and they passed on all they took.
        counts = [own_counters(agent.settings.telemetry_port) for agent in fleet.agents]
        last = {str(r): report["steps"] for r, report in reports.items()}
        coalesced = {str(r): report["stats"]["steps"]["coalesced"] for r, report in reports.items()}

        def missing(rows: list[dict[str, Any]]) -> dict[str, int]:
            held = _steps_held(rows)
            return {
                r: len(set(map(float, range(n + 1))) - held.get(r, set())) for r, n in last.items()
            }

        rows = wait_for_query(web, f"{step}[10m]", lambda rows: missing(rows) == coalesced)
        own = _steps_held(replicas(web, f"{own_copy}[10m]"))
    outage = {float(s) for s in range(int(down_at) + 1, int(up_at) + 1)}
    print(
        f"receiver {killed} down from step {down_at:.0f} to {up_at:.0f}; its copy of rank 0 "
        f"misses {sorted(outage - own['0'])}; coalesced {coalesced}"
    )
    assert all(ends.values()), ends
    # Every step is a sample, but a step the rank coalesced into the next one and counted so.
    assert missing(rows) == coalesced, (missing(rows), coalesced)
    assert outage - own["0"], f"receiver {killed} held every step of its outage: not down?"
    assert max(own["0"]) > up_at
    for rank, report in reports.items():
        assert report["stats"]["exports"]["failure"] == 0, (rank, report["stats"]["exports"])
    for agent in counts:
        assert agent.get("otelcol_exporter_send_failed_metric_points_total", 0) == 0, agent
        assert agent.get("otelcol_receiver_refused_metric_points_total", 0) == 0, agent


def _queued(agent: RunningAgent) -> float:
    """The requests an agent holds in its sending queue now (its own gauge)."""
    return sum(
        sample.value
        for sample in metric_samples(agent.settings.telemetry_port)
        if sample.name == "otelcol_exporter_queue_size"
    )


@pytest.mark.timeout(180)
def test_an_agent_killed_while_the_store_is_away_loses_no_step(tmp_path):
    """2 ranks step every 0.3 s through one agent. The store's router goes away; the agent
    keeps what the ranks send in its queue on disk; it is killed (SIGKILL) holding at least 4
    requests and started again on the same folder, where it finds them; the ranks keep what
    it could not take meanwhile. Once the router is back, every step of both ranks is in the
    store, and no rank dropped anything."""
    procs: dict[int, subprocess.Popen[str]] = {}
    ends: dict[int, Any] = {}
    step = 'rl_step{rl_run_id="agent-crash"}'
    node = tmp_path / "node-0"
    (tmp_path / "store").mkdir()
    with run_store(tmp_path / "store") as store, contextlib.ExitStack() as outage:
        settings = agent_settings(node, store.otlp_url)
        try:
            with run_agent(node, settings) as agent:
                for rank in range(2):
                    log = tmp_path / f"rank-{rank}.log"
                    procs[rank] = start_rank(agent, "agent-crash", rank, 2, log)
                assert wait_for_query(store.web, step, bool), "no step arrived"
                outage.enter_context(store.router_down())
                deadline = time.monotonic() + 30
                while (held := _queued(agent)) < 4:  # the ranks' steps pile up on its disk
                    assert time.monotonic() < deadline, "the agent queued nothing"
                    time.sleep(0.2)  # polling an external server
                os.kill(agent.pid, signal.SIGKILL)
            with run_agent(node, settings, "agent-again.log") as again:
                found = _queued(again)
                outage.close()  # the router is back: the agent sends what it kept
                reports = stop_stepping(procs)
                ends = end_ranks(procs)
                every = {
                    str(r): set(map(float, range(report["steps"] + 1)))
                    for r, report in reports.items()
                }
                coalesced = {
                    str(r): report["stats"]["steps"]["coalesced"] for r, report in reports.items()
                }

                def missing(rows: list[dict[str, Any]]) -> dict[str, int]:
                    held_steps = _steps_held(rows)
                    return {r: len(s - held_steps.get(r, set())) for r, s in every.items()}

                rows = wait_for_query(
                    store.web, f"{step}[10m]", lambda rows: missing(rows) == coalesced
                )
        finally:
            if not ends:
                end_ranks(procs)
    print(f"the agent held {held:.0f} requests when killed, found {found:.0f} on restart")
    assert found >= held  # what it had accepted was on disk
    assert all(ends.values()), ends  # each rank delivered its backlog to the end
    assert missing(rows) == coalesced, (missing(rows), coalesced)
    for rank, report in reports.items():
        assert sum(report["stats"]["delivery"]["dropped"].values()) == 0, (rank, report)


@pytest.mark.timeout(150)
def test_the_collectors_remote_write_fills_the_store_as_it_fills_prometheus(tmp_path):
    """The ``remote-write`` path's Collector with a second remote-write exporter, to the store:
    2 ranks of 6 steps; the store holds every step of both and the names Prometheus 3 holds."""
    promoted = ", ".join(stack.PROMOTED)
    procs: dict[int, subprocess.Popen[str]] = {}
    (tmp_path / "store").mkdir()
    with run_store(tmp_path / "store") as store:
        to_store = {
            "prometheus_remote_write/store": (
                f"    endpoint: {store.remote_write_url}\n"
                f"    resource_constant_labels:\n      included: [{promoted}]\n"
            )
        }
        (tmp_path / "stack").mkdir()
        with run_stack("remote-write", tmp_path / "stack", extra_exporters=to_store) as running:
            try:
                for rank in range(2):
                    log = tmp_path / f"rank-{rank}.log"
                    procs[rank] = start_rank(running, "written", rank, 2, log, "--steps", "6")
                reports = {}
                for rank, proc in procs.items():
                    assert proc.stdout is not None
                    reports[str(rank)] = json.loads(proc.stdout.readline())  # steps flushed
            finally:
                ends = end_ranks(procs)
            every = {
                r: set(map(float, range(report["steps"] + 1))) for r, report in reports.items()
            }
            coalesced = {r: report["stats"]["steps"]["coalesced"] for r, report in reports.items()}

            def missing(rows: list[dict[str, Any]]) -> dict[str, int]:
                held = _steps_held(rows)
                return {r: len(steps - held.get(r, set())) for r, steps in every.items()}

            expr = 'rl_step{rl_run_id="written"}[10m]'
            in_store = wait_for_query(store.web, expr, lambda rows: missing(rows) == coalesced)
            in_prometheus = wait_for_query(
                running.web, expr, lambda rows: missing(rows) == coalesced
            )
            names = 'group by (__name__) ({__name__=~"(rl|async_tee)_.+", rl_run_id="written"})'
            store_names = {row["metric"]["__name__"] for row in query(store.web, names)}
            prometheus_names = {row["metric"]["__name__"] for row in query(running.web, names)}
    assert all(ends.values()), ends
    assert missing(in_store) == coalesced == missing(in_prometheus)
    assert "rl_step" in store_names
    assert store_names == prometheus_names

"""The first hop's outages on the real servers: every step arrives, at its own time, in order.

A rank process steps every second, exporting as ``async-tee stack`` configures it, while the
server it sends to (the Collector on the remote-write path, Prometheus 3 itself on the OTLP
path) is SIGKILLed and started again later on the same port and data. Read back from
Prometheus: every step's ``rl_step`` sample, each at its own timestamp, in step order; nothing
dropped by async_tee, nothing refused or failed at the Collector, no out-of-order sample and no
refused write at Prometheus. Past the backlog's bound, exactly the counted oldest requests are
missing and ``AsyncTeeExportsDropped`` fires.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import RANK_PROCESS, end_ranks, environ_without_launcher, stop_stepping

from async_tee import stack
from servers import (
    get,
    local_addresses,
    otelcol_argv,
    port_of,
    prometheus_argv,
    server,
    wait_for_query,
    write_stack,
)

pytestmark = [pytest.mark.slow, pytest.mark.servers]

STEP_S = 1.0


class Stack:
    """The stack of one path from its generated configs, each server started and killed apart."""

    def __init__(self, path: str, folder: Path) -> None:
        self.path = path
        self.folder = folder
        self.at = write_stack(path, folder, local_addresses())  # the Collector's log in folder
        self.web = port_of(self.at.prometheus_listen)
        self.run = f"outage-{folder.name}"  # its own run: no other test's samples in a query
        self.running = contextlib.ExitStack()
        self.pids: dict[str, int] = {}
        self.starts = 0

    def start(self, what: str) -> None:
        """Start ``what`` (``prometheus`` or ``otelcol``); wait until it listens."""
        self.starts += 1
        log = self.folder / f"{what}-{self.starts}.log"
        if what == "prometheus":
            argv, port = prometheus_argv(self.path, self.folder, self.at), self.web
        else:
            argv, port = otelcol_argv(self.folder), port_of(self.at.collector_otlp_http)
        self.pids[what] = self.running.enter_context(server(argv, port, log, what))

    def kill(self, what: str) -> None:
        """SIGKILL ``what``: no flush, no goodbye, as the OOM killer or a node loss does."""
        os.kill(self.pids.pop(what), signal.SIGKILL)

    def rank_environment(self, **extra: str) -> dict[str, str]:
        env = environ_without_launcher()
        env.update(stack.rank_environment(self.path, self.at))
        env.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            ASYNC_TEE_RUN_ID=self.run,
            # Steps a second apart: no step may fold into the next on a late worker's jitter.
            ASYNC_TEE_MIN_EXPORT_INTERVAL="0.5",
            ASYNC_TEE_SHUTDOWN_TIMEOUT="20",
            **extra,
        )
        return env


@contextlib.contextmanager
def _stack(path: str, folder: Path) -> Iterator[Stack]:
    running = Stack(path, folder)
    with running.running:
        running.start("prometheus")
        if path in stack.COLLECTOR_PATHS:
            running.start("otelcol")
        yield running


def _start_rank(env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    with log.open("w") as err:
        return subprocess.Popen(
            [sys.executable, str(RANK_PROCESS), "--step-seconds", str(STEP_S), "--nan-step", "0"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )


def _samples(web: int, run: str, window_s: int = 900) -> list[tuple[float, float]]:
    """Every raw ``rl_step`` sample of ``run`` in Prometheus: (timestamp, step), oldest first."""
    rows = get(web, "/api/v1/query", query=f'rl_step{{rl_run_id="{run}"}}[{window_s}s]')
    samples = [(float(t), float(v)) for row in rows["result"] for t, v in row["values"]]
    return sorted(samples)


def _first_times(samples: list[tuple[float, float]]) -> dict[float, float]:
    """Each step's first sample time (a later export repeats the last step)."""
    first: dict[float, float] = {}
    for at, step in samples:
        first.setdefault(step, at)
    return first


def _scrape(port: int, within_s: float = 30.0) -> dict[str, float]:
    """A server's own ``/metrics``: each sample's value by its line's name and labels.

    Polled until it answers: a restarted Collector takes its OTLP port before it serves its own
    telemetry (refused once in a run on a loaded box)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
                text = answer.read().decode()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # polling an external server's start
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def _total(values: dict[str, float], name: str, where: str = "") -> float:
    return sum(v for k, v in values.items() if k.split("{")[0] == name and where in k)


def _run_outage(
    running: Stack, what: str, down_s: float, tmp_path: Path, **extra: str
) -> tuple[dict[str, Any], list[tuple[float, float]], bool | None]:
    """Step; kill ``what`` after a few steps; start it again ``down_s`` later; step on.

    Returns:
        The rank's report, Prometheus's ``rl_step`` samples of the run, and whether the
        rank's shutdown said delivered.
    """
    rank = _start_rank(running.rank_environment(**extra), tmp_path / "rank.log")
    procs = {0: rank}
    try:
        wait_for_query(running.web, f'rl_step{{rl_run_id="{running.run}"}} >= 3', bool, 60)
        running.kill(what)
        time.sleep(down_s)  # the outage itself: the real servers are away this long
        running.start(what)
        time.sleep(3 * STEP_S)  # steps after the restart go through the same path
        (report,) = stop_stepping(procs).values()
        steps = int(report["steps"])
        newest = f'max_over_time(rl_step{{rl_run_id="{running.run}"}}[15m]) >= {steps}'
        wait_for_query(running.web, newest, bool, 60)
        samples = _samples(running.web, running.run)
        (delivered,) = end_ranks(procs).values()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return report, samples, delivered


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("path", "what", "down_s"),
    [
        ("remote-write", "otelcol", 12.0),
        ("remote-write", "otelcol", 120.0),
        ("otlp", "prometheus", 60.0),
    ],
    ids=["collector-12s", "collector-120s", "prometheus-otlp-60s"],
)
def test_nothing_is_lost_across_an_outage_of_the_first_hop(path, what, down_s, tmp_path):
    with _stack(path, tmp_path) as running:
        report, samples, delivered = _run_outage(running, what, down_s, tmp_path)
        prometheus = _scrape(running.web)
        collector = (
            _scrape(running.at.collector_telemetry_port) if path in stack.COLLECTOR_PATHS else {}
        )
    steps = int(report["steps"])
    delivery = report["stats"]["delivery"]
    assert steps >= down_s / STEP_S  # steps went on through the outage
    assert delivery["retries"] >= 1  # the outage was felt
    assert delivery["dropped"] == {"overflow": 0, "refused": 0, "shutdown": 0}
    assert report["stats"]["steps"]["coalesced"] == 0
    first = _first_times(samples)
    logged = [float(step) for step in range(steps + 1)]  # the set-up dict's step 0 too
    assert sorted(first) == logged  # every step
    times = [first[step] for step in logged]
    assert times == sorted(times), samples  # in step order ...
    assert len(set(times)) == len(logged)  # ... each at its own time
    assert _total(prometheus, "prometheus_tsdb_out_of_order_samples_total") == 0
    assert _total(prometheus, "prometheus_http_requests_total", 'code="4') == 0
    if collector:  # the Collector started after the outage: nothing refused or failed
        assert _total(collector, "otelcol_receiver_refused_metric_points_total") == 0
        assert _total(collector, "otelcol_exporter_send_failed_metric_points_total") == 0
    assert delivered is True


@pytest.mark.timeout(200)
def test_past_the_backlogs_bound_exactly_the_counted_oldest_requests_are_missing(tmp_path):
    with _stack("otlp", tmp_path) as running:
        # About six requests of the rank's steps: a 20 s outage at 1 s steps overflows it.
        report, samples, delivered = _run_outage(
            running, "prometheus", 20.0, tmp_path, ASYNC_TEE_EXPORT_BACKLOG_BYTES="120000"
        )
        fired = wait_for_query(
            running.web,
            f'ALERTS{{alertname="AsyncTeeExportsDropped", rl_run_id="{running.run}", '
            'reason="overflow"}',
            bool,
            90,
        )
    steps = int(report["steps"])
    dropped = report["stats"]["delivery"]["dropped"]
    assert dropped["overflow"] >= 5
    assert dropped["refused"] == dropped["shutdown"] == 0
    arrived = sorted(_first_times(samples))
    missing = sorted(set(range(steps + 1)) - {int(step) for step in arrived})
    # The oldest of the outage went: one run of consecutive steps, as many as were dropped
    # (each a step's request; the periodic export makes none at this pace).
    assert missing == list(range(missing[0], missing[0] + len(missing)))
    assert len(missing) == dropped["overflow"]
    assert missing[-1] < steps - 3  # the newest were kept
    assert fired
    assert delivered is False  # the rank says its delivery was not whole

"""Helpers the tests share: the fixture's calls, and what a reader or the process holds now.

Imported by the test modules (``from helpers import ...``); the fixtures live in
``conftest.py``, which imports from here too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import async_tee

FIXTURE = Path(__file__).parent / "fixtures" / "grpo_step.json"

Point = tuple[str, frozenset[tuple[str, Any]]]


def load_calls() -> list[dict[str, Any]]:
    """The fixture's log_metrics calls: step, prefix, metrics (and step_metric...)."""
    calls: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["calls"]
    return calls


def own_threads() -> list[str]:
    """Names of the live threads async_tee started (they all start with ``async-tee``)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("async-tee")]


def collect(reader: InMemoryMetricReader, prefix: str = "rl.") -> dict[Point, Any]:
    """Every data point the reader collects now, keyed by (series, attributes)."""
    out: dict[Point, Any] = {}
    data = reader.get_metrics_data()
    if data is None:
        return out
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if not metric.name.startswith(prefix):
                    continue
                for point in metric.data.data_points:
                    key = (metric.name, frozenset(dict(point.attributes or {}).items()))
                    out[key] = getattr(point, "value", point)
    return out


def units(reader: InMemoryMetricReader) -> dict[str, tuple[str, str]]:
    """{series: (unit, data type name)} of everything collected now."""
    out = {}
    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics if data else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                out[metric.name] = (metric.unit or "", type(metric.data).__name__)
    return out


def running(session: object) -> async_tee.Pipeline:
    """``session`` as the running ``Pipeline`` it must be (a disabled one fails the test)."""
    assert isinstance(session, async_tee.Pipeline), session
    return session


def tee_fixture_steps(steps: int) -> int:
    """Tee the fixture's teed step dicts ``steps`` times; how many dicts that was."""
    calls = [c for c in load_calls() if c["prefix"] in ("train", "")]
    for step in range(1, steps + 1):
        for call in calls:
            async_tee.tee_rl_metrics_to_otel(call["metrics"], call["prefix"], step)
    return steps * len(calls)


RANK_PROCESS = Path(__file__).parent / "rank_process.py"
"""One rank of a launched job (``tests/rank_process.py``), as the multi-rank tests start it."""
_LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_", "OMPI_", "PMI_", "OTEL_")


def environ_without_launcher() -> dict[str, str]:
    """This process's environment without a launcher's rank variables or any ``OTEL_*``."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_VARIABLES)}


def pushing_rank_env(to: Any, run: str, rank: int, world: int) -> dict[str, str]:
    """A rank process's environment: its launcher's variables, its run, an export every second
    and what ``to`` (a running stack, store or agent) tells its ranks to set."""
    env = environ_without_launcher()
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        ASYNC_TEE_RUN_ID=run,
        ASYNC_TEE_MIN_EXPORT_INTERVAL="0",
        OTEL_METRIC_EXPORT_INTERVAL="1000",  # pushed paths: a current sample every second
    )
    env.update(to.rank_environment(rank))
    return env


def start_rank_process(env: dict[str, str], log: Path, *argv: str) -> subprocess.Popen[str]:
    """A rank process stepping every 0.3 s; its stderr (warnings, events) goes to ``log``."""
    with log.open("w") as err:
        return subprocess.Popen(
            [sys.executable, str(RANK_PROCESS), "--step-seconds", "0.3", *argv],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )


def catalog_names() -> set[str]:
    """Every sample name the catalog's series have in Prometheus."""
    from async_tee._declare.prometheus_names import prometheus_sample_names
    from async_tee.catalog import series_catalog

    return {
        name
        for entry in series_catalog()
        for name in prometheus_sample_names(entry.name, entry.kind, entry.unit)
    }


def stop_stepping(procs: dict[Any, subprocess.Popen[str]]) -> dict[Any, Any]:
    """Tell each rank process to stop stepping; its report (a JSON line) by key."""
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.write("stop\n")
        proc.stdin.flush()
    reports = {}
    for key, proc in procs.items():
        assert proc.stdout is not None
        reports[key] = json.loads(proc.stdout.readline())
    return reports


def end_ranks(procs: dict[Any, subprocess.Popen[str]]) -> dict[Any, Any]:
    """Close each rank's stdin (it shuts down); its last stdout line says what it delivered."""
    for proc in procs.values():
        with contextlib.suppress(OSError, ValueError):
            assert proc.stdin is not None
            proc.stdin.close()
    ends = {}
    for key, proc in procs.items():
        assert proc.stdout is not None
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        lines = proc.stdout.read().splitlines()
        proc.stdout.close()
        ends[key] = json.loads(lines[-1]).get("delivered") if lines else None
    return ends


def behind_a_held_lock(
    command: list[str], env: dict[str, str], lock: Path, folder: Path, calls: Path, count: int = 3
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``command`` ``count`` times at once while ``lock`` is held (``flock``), so each one
    surely asks while another would build; once all say they wait, release it. Asserts nothing
    ran (no line in ``calls``) while the lock was held; returns each run, stdout and stderr."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    held = os.open(lock, os.O_WRONLY | os.O_CREAT, 0o644)
    fcntl.flock(held, fcntl.LOCK_EX)
    logs = [folder / f"caller-{i}.err" for i in range(count)]
    procs: list[subprocess.Popen[str]] = []
    try:
        for log in logs:
            with log.open("wb") as err:
                procs.append(
                    subprocess.Popen(
                        command, env=env, stdout=subprocess.PIPE, stderr=err, text=True
                    )
                )
        deadline = time.monotonic() + 30
        while not all("waiting for it" in log.read_text() for log in logs):
            assert time.monotonic() < deadline, [log.read_text() for log in logs]
            assert all(p.poll() is None for p in procs), "a build ran past a held lock"
            time.sleep(0.05)  # polling other processes' output
        assert not calls.exists(), "the build ran while the lock was held"
    finally:
        os.close(held)
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    return [
        subprocess.CompletedProcess(command, p.returncode, out, log.read_text())
        for p, out, log in zip(procs, outputs, logs, strict=True)
    ]

"""The real servers of the end-to-end tests: built by ``servers/build``, run from the stack.

``run_stack(path, ...)`` starts what ``async-tee stack --path <path>`` describes, from the same
generated configs (``async_tee.stack``), with the binaries built here: Prometheus 3 always, the
OpenTelemetry Collector on the two Collector paths. Only the addresses differ from the compose
file's: 127.0.0.1 and free ports, a 1 s scrape and evaluation interval.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from async_tee import stack
from async_tee.alerts import AlertThresholds

REPO = Path(__file__).parents[1]
BUILD = REPO / "servers" / "build"
NO_GO = (
    "no Go on this machine, so the real Collector and Prometheus 3 cannot be built (servers/build)"
)


def go_found() -> bool:
    return shutil.which("go") is not None or os.access("/usr/local/go/bin/go", os.X_OK)


def build_servers() -> None:
    """Build what is missing (minutes, once per machine); its progress goes to stderr."""
    subprocess.run([str(BUILD)], check=True, stdout=subprocess.DEVNULL)


_BUILT: dict[str, str] = {}  # the paths, once every binary was found (a build only adds)


def built() -> dict[str, str] | None:
    """Each built binary's path by name, or None while any is missing."""
    if not _BUILT:
        if subprocess.run([str(BUILD), "--check"], check=False).returncode != 0:
            return None
        out = subprocess.run([str(BUILD)], check=True, capture_output=True, text=True).stdout
        _BUILT.update(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
    return _BUILT


def binary(name: str) -> str:
    """The path of ``otelcol``, ``prometheus`` or ``promtool`` (3.x), built by servers/build.

    Skips the test when Go is absent (never in CI: there it fails).
    """
    found = built()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{NO_GO}; CI must build them")
        pytest.skip(NO_GO if not go_found() else "servers/build failed: run it to see why")
    return found[name]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(count: int) -> int:
    """A base port with ``count`` free ports from it on (checked by binding each)."""
    for _ in range(200):
        base = random.randrange(20_000, 60_000)
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError("no run of free ports found")


def get(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)["data"]


def query(port: int, expr: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = get(port, "/api/v1/query", query=expr)["result"]
    return result


def wait_for_query(web: int, expr: str, done: Any, timeout_s: float = 45) -> list[dict[str, Any]]:
    """Poll a query until ``done(result)`` holds; the last result either way."""
    deadline = time.monotonic() + timeout_s
    result: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):  # the server may still be starting
            result = query(web, expr)
            if done(result):
                return result
        time.sleep(0.5)  # polling an external server, not waiting for our worker
    return result


def firing_and_pending(web: int) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = get(web, "/api/v1/alerts")["alerts"]
    return alerts


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)  # polling an external server's start
    raise RuntimeError(f"{what} never listened on {port}:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def server(argv: list[str], port: int, log: Path, what: str) -> Iterator[int]:
    """Run ``argv`` (its output to ``log``) until the block ends; yields its pid once ``port``
    listens. Raises ``RuntimeError`` with the log's tail if it exits or never listens."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port, proc, log, what)
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclasses.dataclass(frozen=True)
class RunningStack:
    """A started stack: the path, where its parts listen, and what a rank sets to export."""

    path: str
    web: int
    addresses: stack.StackAddresses
    folder: Path
    pids: dict[str, int]  # "prometheus", and "otelcol" on a Collector path

    def rank_environment(self) -> dict[str, str]:
        return stack.rank_environment(self.path, self.addresses)


def local_addresses(
    rank_targets: tuple[str, ...] = (), metric_expiration_s: float = 300.0
) -> stack.StackAddresses:
    web, grpc, http, metrics, own = (free_port() for _ in range(5))
    return stack.StackAddresses(
        prometheus=f"127.0.0.1:{web}",
        prometheus_listen=f"127.0.0.1:{web}",
        collector_otlp_grpc=f"127.0.0.1:{grpc}",
        collector_otlp_http=f"127.0.0.1:{http}",
        ranks_reach="127.0.0.1",
        collector_metrics_listen=f"127.0.0.1:{metrics}",
        collector_metrics=f"127.0.0.1:{metrics}",
        collector_telemetry_port=own,
        collector_telemetry=f"127.0.0.1:{own}",
        rank_targets=rank_targets,
        scrape_interval_s=1.0,
        metric_expiration_s=metric_expiration_s,
    )


def write_stack(
    path: str,
    folder: Path,
    at: stack.StackAddresses,
    thresholds: AlertThresholds | None = None,
    extra_exporters: Mapping[str, str] | None = None,
) -> stack.StackAddresses:
    """Write the stack of ``path`` into ``folder``; the addresses it was written for: ``at``
    with the Collector keeping its data in ``folder`` too (its remote-write log)."""
    at = dataclasses.replace(at, collector_data=str(folder / "otelcol-data"))
    files = stack.render_stack(path, at, thresholds)
    if extra_exporters:
        files["otelcol.yaml"] = stack.collector_config(path, at, extra_exporters)
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return at


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def prometheus_argv(
    path: str, folder: Path, at: stack.StackAddresses, prometheus: str | None = None
) -> list[str]:
    """How to start the Prometheus of a stack written into ``folder`` (its data kept there)."""
    return [
        prometheus or binary("prometheus"),
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address={at.prometheus_listen}",
        *stack.prometheus_flags(path),
    ]


def otelcol_argv(folder: Path) -> list[str]:
    """How to start the Collector of a stack written into ``folder``."""
    return [binary("otelcol"), f"--config={folder / 'otelcol.yaml'}"]


@contextlib.contextmanager
def run_stack(
    path: str,
    folder: Path,
    addresses: stack.StackAddresses | None = None,
    thresholds: AlertThresholds | None = None,
    extra_exporters: Mapping[str, str] | None = None,
    prometheus: str | None = None,
) -> Iterator[RunningStack]:
    """Start the stack of ``path`` from its generated configs; yields it once all listen.

    ``prometheus``: another Prometheus binary (Debian's 2.42) on the scrape path.
    """
    at = write_stack(path, folder, addresses or local_addresses(), thresholds, extra_exporters)
    web = port_of(at.prometheus_listen)
    pids: dict[str, int] = {}
    with contextlib.ExitStack() as running:
        pids["prometheus"] = running.enter_context(
            server(
                prometheus_argv(path, folder, at, prometheus),
                web,
                folder / "prometheus.log",
                "prometheus",
            )
        )
        if path in stack.COLLECTOR_PATHS:
            pids["otelcol"] = running.enter_context(
                server(
                    otelcol_argv(folder),
                    port_of(at.collector_otlp_grpc),
                    folder / "otelcol.log",
                    "otelcol",
                )
            )
        yield RunningStack(path, web, at, folder, pids)


def metric_samples(port: int) -> list[Any]:
    """Every sample a server's own ``/metrics`` serves now (``prometheus_client`` samples:
    name, labels, value)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def own_counters(port: int) -> dict[str, float]:
    """A server's own counters: by name (summed over labels), and by ``name/exporter`` for
    a Collector exporter's."""
    found: dict[str, float] = {}
    for sample in metric_samples(port):
        if sample.name.endswith("_total"):
            keys = [sample.name]
            if "exporter" in sample.labels:
                keys.append(f"{sample.name}/{sample.labels['exporter']}")
            for key in keys:
                found[key] = found.get(key, 0.0) + sample.value
    return found


def dashboard_for(web: int, chosen: dict[str, str]) -> tuple[list[str], list[str]]:
    """Every dashboard query for the ``chosen`` run and rank, asked of the server at ``web``:
    those with no data, and those with another run's or rank's series."""
    from async_tee import dashboard

    empty, foreign = [], []
    for expr in dashboard.panel_queries(dashboard.build_dashboard()):
        concrete = dashboard.expand_variables(expr, chosen)
        rows = [r for r in query(web, concrete) if r["value"][1] not in ("NaN", "+Inf", "-Inf")]
        if not rows:
            empty.append(concrete)
        runs = {row["metric"]["rl_run_id"] for row in rows if "rl_run_id" in row["metric"]}
        ranks = {row["metric"]["rl_rank"] for row in rows if "rl_rank" in row["metric"]}
        if runs - {chosen["run"]} or ranks - {chosen["rank"]}:
            foreign.append(concrete)
    return empty, foreign

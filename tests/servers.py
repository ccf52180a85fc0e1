"""The real servers of the end-to-end tests: built by ``servers/build``, run from the stack.

``run_stack(path, ...)`` starts what ``async-tee stack --path <path>`` describes, from the same
generated configs (``async_tee.stack``), with the binaries built here: Prometheus 3 always, the
OpenTelemetry Collector on the two Collector paths. Only the addresses differ from the compose
file's: 127.0.0.1 and free ports, a 1 s scrape and evaluation interval.

``run_store(...)`` starts the store that scales out: Thanos receivers in a hashring behind a
router, read through Thanos Query, the alert rules evaluated by Thanos Rule.
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
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from async_tee import stack
from async_tee.alerts import AlertThresholds, render_rules
from async_tee.stack import fleet
from async_tee.stack.agent import AgentSettings, agent_config

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
    """The path of ``otelcol``, ``prometheus``, ``promtool`` (3.x) or ``thanos``, built by
    servers/build.

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


def distinct_free_ports(count: int) -> list[int]:
    """``count`` free ports, all different (each held until all are found)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            sock = held.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


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


def get(port: int, path: str, timeout_s: float = 10.0, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.load(response)["data"]


def query(port: int, expr: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = get(port, "/api/v1/query", timeout_s, query=expr)["result"]
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
    alerts: list[dict[str, Any]] = get(web, "/api/v1/alerts")["alerts"] or []  # Thanos: null
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


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a server: SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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
        stop(proc)


@dataclasses.dataclass(frozen=True)
class RunningStack:
    """A started stack: the path, where its parts listen, and what a rank sets to export."""

    path: str
    web: int
    addresses: stack.StackAddresses
    folder: Path
    pids: dict[str, int]  # "prometheus", and "otelcol" on a Collector path

    def rank_environment(self, rank: int = 0) -> dict[str, str]:
        """What each rank sets to export on this path (the same for every rank)."""
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


STORE_RECEIVERS, STORE_REPLICATION = 3, 2
"""Ingesting receivers in the store's hashring, and how many of them hold each series."""


def _local_part(name: str, ports: Iterator[int], receives: bool = False) -> fleet.ThanosPart:
    where = [f"127.0.0.1:{next(ports)}" for _ in range(4 if receives else 2)]
    return fleet.ThanosPart(name, *where)


def local_fleet(folder: Path) -> fleet.FleetAddresses:
    """The fleet's store on 127.0.0.1 and free ports, its data in ``folder``, rules every 1 s."""
    ports = iter(distinct_free_ports(4 * (STORE_RECEIVERS + 1) + 4))
    return fleet.FleetAddresses(
        router=_local_part("router", ports, receives=True),
        receivers=tuple(
            _local_part(f"receive-{i}", ports, receives=True) for i in range(STORE_RECEIVERS)
        ),
        replication_factor=STORE_REPLICATION,
        query=_local_part("query", ports),
        rule=_local_part("rule", ports),
        listen_host="127.0.0.1",
        data=str(folder),
        rules_file=str(folder / "rules.yml"),
        evaluation_interval_s=1.0,
    )


@dataclasses.dataclass(frozen=True)
class RunningStore:
    """A started store: where agents write, where tests read, and its receivers.

    ``web`` is Thanos Query's HTTP port: Prometheus's HTTP API (queries, rules, alerts), so the
    helpers above read it as they read a Prometheus. ``receiver_down(i)`` is a block during
    which ingesting receiver ``i`` is killed (SIGKILL, as a crash), restarted on its own data
    when the block ends; ``router_down()`` the same for the router (the whole store away for
    the agents).
    """

    web: int
    addresses: fleet.FleetAddresses
    folder: Path
    pids: dict[str, int]  # "router", "receive-0", ..., "query", "rule" (as started)
    receiver_down: Callable[[int], contextlib.AbstractContextManager[None]]
    router_down: Callable[[], contextlib.AbstractContextManager[None]]

    @property
    def otlp_url(self) -> str:
        return self.addresses.otlp_url

    @property
    def remote_write_url(self) -> str:
        return self.addresses.remote_write_url

    def rank_environment(self, rank: int = 0) -> dict[str, str]:
        """What a rank sets to export to the store itself (no agent): OTLP/HTTP to the router."""
        return {
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": self.otlp_url,
        }


def _ready(port: int) -> bool:
    """Whether a Thanos component's ``/-/ready`` says so."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:  # not listening yet, or 503 while it starts
        return False


STARTS = 3
"""Starts of a Thanos component that exits before it is ready: Receive 0.42.5 can panic at
start on a loaded box (its first prune runs at once, racing a tenant's database still being
opened: a nil pointer in ``MultiTSDB.Prune``, seen in CI); started again, as a supervisor
(the compose file's ``restart``) would."""


def _start_thanos(argv: list[str], http: int, log: Path, what: str) -> subprocess.Popen[bytes]:
    """Start a Thanos component (its output appended to ``log``); returns once it is ready."""
    for start in range(1, STARTS + 1):
        with log.open("ab") as out:
            proc = subprocess.Popen([binary("thanos"), *argv], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not _ready(http):
            exited = proc.poll() is not None
            if exited and start < STARTS:
                break  # exited before it was ready: start it again
            if exited or time.monotonic() > deadline:
                stop(proc)
                raise RuntimeError(f"{what} never became ready:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)  # polling an external server's start
        else:
            return proc
    raise AssertionError("unreachable: the last start returns or raises")


def _query_sees(web: int, grpc_addresses: set[str]) -> bool:
    """Whether Thanos Query reaches every one of these StoreAPI endpoints, healthy."""
    with contextlib.suppress(OSError):
        stores = get(web, "/api/v1/stores")
        healthy = {
            store["name"]
            for group in stores.values()
            for store in group
            if store.get("lastError") is None
        }
        return grpc_addresses <= healthy
    return False


@contextlib.contextmanager
def run_store(folder: Path, thresholds: AlertThresholds | None = None) -> Iterator[RunningStore]:
    """Start the fleet's store from its generated flags; yields it once Query reaches every part.

    The router, ``STORE_RECEIVERS`` ingesting receivers (replication ``STORE_REPLICATION``),
    Query over them and Rule evaluating async_tee's alert rules every second: the flags
    ``async-tee stack --path fleet`` writes, with local addresses (``local_fleet``).
    """
    at = local_fleet(folder)
    (folder / "rules.yml").write_text(render_rules(thresholds))
    query_http = port_of(at.query.http)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    argv = {part.name: fleet.receiver_argv(at, i) for i, part in enumerate(at.receivers)}
    argv[at.router.name] = fleet.router_argv(at)
    argv[at.query.name] = fleet.query_argv(at)
    argv[at.rule.name] = fleet.rule_argv(at)
    parts = {part.name: part for part in (*at.receivers, at.router, at.query, at.rule)}

    def start(name: str) -> None:
        log = folder / f"{name}.log"
        procs[name] = _start_thanos(argv[name], port_of(parts[name].http), log, f"thanos {name}")

    @contextlib.contextmanager
    def down(name: str) -> Iterator[None]:
        procs[name].kill()
        procs[name].wait()
        try:
            yield
        finally:
            start(name)
            if name != at.router.name:
                deadline = time.monotonic() + 30
                while not _query_sees(query_http, {parts[name].grpc}):
                    assert time.monotonic() < deadline, f"Query never reached {name} again"
                    time.sleep(0.2)  # polling an external server

    try:
        for name in argv:
            start(name)
        deadline = time.monotonic() + 30
        stores = {part.grpc for part in (*at.receivers, at.rule)}
        while not _query_sees(query_http, stores):
            assert time.monotonic() < deadline, get(query_http, "/api/v1/stores")
            time.sleep(0.2)  # polling an external server
        yield RunningStore(
            web=query_http,
            addresses=at,
            folder=folder,
            pids={name: proc.pid for name, proc in procs.items()},
            receiver_down=lambda index: down(at.receivers[index].name),
            router_down=lambda: down(at.router.name),
        )
    finally:
        for proc in reversed(procs.values()):
            stop(proc)


@dataclasses.dataclass(frozen=True)
class RunningAgent:
    """A started node agent: where its node's ranks export, its own metrics, its process."""

    settings: AgentSettings
    folder: Path
    pid: int

    def rank_environment(self, rank: int = 0) -> dict[str, str]:
        """What each rank of the agent's node sets (the fleet's ``ranks.env``, local ports)."""
        return {
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{self.settings.otlp_http}",
        }


def agent_settings(folder: Path, store_otlp: str, **overrides: Any) -> AgentSettings:
    """A node agent on 127.0.0.1 and free ports, its queue in ``folder``, sending to the store."""
    grpc, http, own = distinct_free_ports(3)
    return AgentSettings(
        otlp_grpc=f"127.0.0.1:{grpc}",
        otlp_http=f"127.0.0.1:{http}",
        telemetry_port=own,
        data=str(folder / "queue"),
        store_otlp=store_otlp,
        **overrides,
    )


@contextlib.contextmanager
def run_agent(
    folder: Path, settings: AgentSettings, log_name: str = "agent.log"
) -> Iterator[RunningAgent]:
    """Start a node agent from the fleet's generated config; yields it once it listens."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "agent.yaml").write_text(agent_config(settings))
    argv = [binary("otelcol"), f"--config={folder / 'agent.yaml'}"]
    with server(argv, port_of(settings.otlp_http), folder / log_name, "agent") as pid:
        yield RunningAgent(settings, folder, pid)


@dataclasses.dataclass(frozen=True)
class RunningFleet:
    """The store and one agent per simulated node (each node's ranks export to its agent)."""

    store: RunningStore
    agents: list[RunningAgent]

    @property
    def web(self) -> int:
        return self.store.web

    def rank_environment(self, rank: int = 0) -> dict[str, str]:
        """What rank ``rank`` sets: it runs on node ``rank % nodes``, and exports to its agent."""
        return self.agents[rank % len(self.agents)].rank_environment()


@contextlib.contextmanager
def run_fleet(
    folder: Path, nodes: int = 2, thresholds: AlertThresholds | None = None
) -> Iterator[RunningFleet]:
    """The fleet as ``async-tee stack --path fleet`` writes it: the store, and an agent per node."""
    (folder / "store").mkdir(parents=True, exist_ok=True)
    with run_store(folder / "store", thresholds) as store, contextlib.ExitStack() as agents:
        running = [
            agents.enter_context(
                run_agent(
                    folder / f"node-{n}", agent_settings(folder / f"node-{n}", store.otlp_url)
                )
            )
            for n in range(nodes)
        ]
        yield RunningFleet(store, running)

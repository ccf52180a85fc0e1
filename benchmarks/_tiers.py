"""The stacks a load is driven into: where ranks export, each tier's processes, where to count.

A :class:`Target` is a running stack described by what a capacity run needs of it, whatever it
is made of: the agents' OTLP/HTTP endpoints (a simulated rank exports to its node's), its
tiers (``agent``, ``store``: each one or more processes, with the port of each one's own
metrics) and the store's Prometheus-API query port. :data:`TARGETS` starts each from the
real servers ``tests/servers.py`` runs (``servers/build`` builds them):

- ``remote-write``: one Collector (``async-tee stack --path remote-write``) remote-writing
  to one Prometheus 3 (the stack's 15 s scrape and rule-evaluation interval): the
  single-machine stack. Agent tier: the Collector; store tier: Prometheus.

**Measured per tier**: CPU seconds of every process (``utime + stime`` of
``/proc/<pid>/stat``, all its threads) and the tier's own figures, read from each process's
``/metrics`` and summed (:data:`FIGURES`: for a Collector the points its receiver accepted or
refused, its exporter sent or failed to send or enqueue, its queue and its remote-write log's
lag; for a Prometheus-TSDB store the samples appended, refused as out of order, the head's
series, the write requests by code and the seconds spent evaluating rules).

**Counted in the store**, through its query API: every ``rl_step`` sample of the run
(selected by its run id label), by rank: which (rank, step) pairs are present.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from async_tee.stack import StackAddresses

TESTS = Path(__file__).resolve().parents[1] / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import servers  # noqa: E402 - tests/servers.py, found through the path above

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Process:
    """One process of a tier, and the port of its own metrics (None: it serves none)."""

    pid: int
    telemetry_port: int | None = None


@dataclasses.dataclass(frozen=True)
class Tier:
    """The processes doing one job (``agent``, ``store``); ``kind`` says which figures to read."""

    name: str
    kind: str
    processes: tuple[Process, ...]


@dataclasses.dataclass(frozen=True)
class Target:
    """A running stack under load.

    Attributes:
        name: Which stack (a key of :data:`TARGETS`).
        endpoints: The agents' OTLP/HTTP URLs; node n's ranks export to ``n % len``'s.
        tiers: Its tiers, the agents' first.
        query_port: The store's Prometheus HTTP API (``/api/v1/query``).
        run_label: The label the store gives ``rl.run.id``.
    """

    name: str
    endpoints: tuple[str, ...]
    tiers: tuple[Tier, ...]
    query_port: int
    run_label: str = "rl_run_id"

    def tier(self, name: str) -> Tier:
        """The tier called ``name``."""
        return next(tier for tier in self.tiers if tier.name == name)


# ------------------------------------------------------------------ the stacks


@contextlib.contextmanager
def remote_write(folder: Path) -> Iterator[Target]:
    """One Collector remote-writing to one Prometheus 3, as ``async-tee stack`` writes them.

    On free ports of 127.0.0.1, with the stack's own scrape and rule-evaluation interval
    (``StackAddresses``' default, 15 s: the tests' 1 s would evaluate the alert rules over
    every rank's series each second).
    """
    at = dataclasses.replace(
        servers.local_addresses(), scrape_interval_s=StackAddresses().scrape_interval_s
    )
    with servers.run_stack("remote-write", folder, at) as stack:
        at = stack.addresses
        yield Target(
            name="remote-write",
            endpoints=(f"http://{at.collector_otlp_http}/v1/metrics",),
            tiers=(
                Tier(
                    "agent",
                    "otelcol",
                    (Process(stack.pids["otelcol"], servers.port_of(at.collector_telemetry)),),
                ),
                Tier("store", "prometheus", (Process(stack.pids["prometheus"], stack.web),)),
            ),
            query_port=stack.web,
        )


FLEET_AGENTS = 2
"""Node agents in the fleet target: the simulated nodes' ranks spread over them."""


@contextlib.contextmanager
def fleet(folder: Path) -> Iterator[Target]:
    """The fleet, as ``async-tee stack --path fleet`` writes it: ``FLEET_AGENTS`` node agents
    into Thanos (a router, 3 ingesting receivers with replication factor 2, Query, Rule).

    Store tier: the router and the receivers (what ingests); Query and Rule read, and are a
    tier of their own (``query``), so the store's per-point cost is its write path's."""
    with servers.run_fleet(folder, nodes=FLEET_AGENTS) as running:
        store = running.store
        at = store.addresses
        writers = [at.router, *at.receivers]
        yield Target(
            name="fleet",
            endpoints=tuple(f"http://{a.settings.otlp_http}/v1/metrics" for a in running.agents),
            tiers=(
                Tier(
                    "agent",
                    "otelcol",
                    tuple(Process(a.pid, a.settings.telemetry_port) for a in running.agents),
                ),
                Tier(
                    "store",
                    "thanos",
                    tuple(
                        Process(store.pids[part.name], servers.port_of(part.http))
                        for part in writers
                    ),
                ),
                Tier(
                    "query",
                    "thanos",
                    tuple(
                        Process(store.pids[part.name], servers.port_of(part.http))
                        for part in (at.query, at.rule)
                    ),
                ),
            ),
            query_port=store.web,
        )


TARGETS: Mapping[str, Callable[[Path], contextlib.AbstractContextManager[Target]]] = {
    "remote-write": remote_write,
    "fleet": fleet,
}
"""Every stack a capacity run can start, by name: each a context manager given a folder."""


# ------------------------------------------------------------------ what each tier says


@dataclasses.dataclass(frozen=True)
class Figure:
    """One figure of a tier: a metric of its own, summed over processes and matching labels."""

    name: str
    metric: str
    gauge: bool = False
    labels: tuple[tuple[str, str], ...] = ()


FIGURES: Mapping[str, tuple[Figure, ...]] = {
    "otelcol": (
        Figure("accepted", "otelcol_receiver_accepted_metric_points_total"),
        Figure("refused", "otelcol_receiver_refused_metric_points_total"),
        Figure("failed", "otelcol_receiver_failed_metric_points_total"),
        Figure("sent", "otelcol_exporter_sent_metric_points_total"),
        Figure("send_failed", "otelcol_exporter_send_failed_metric_points_total"),
        Figure("enqueue_failed", "otelcol_exporter_enqueue_failed_metric_points_total"),
        Figure("queue_size", "otelcol_exporter_queue_size", gauge=True),
        Figure("queue_capacity", "otelcol_exporter_queue_capacity", gauge=True),
        # Recorded every 15 s (lag_record_frequency): a level from up to 15 s ago.
        Figure("wal_lag", "otelcol_exporter_prometheusremotewrite_wal_lag", gauge=True),
        Figure(
            "wal_written_bytes", "otelcol_exporter_prometheusremotewrite_wal_bytes_written_total"
        ),
        Figure("wal_read_bytes", "otelcol_exporter_prometheusremotewrite_wal_bytes_read_total"),
    ),
    "prometheus": (
        Figure("appended", "prometheus_tsdb_head_samples_appended_total"),
        Figure("out_of_order", "prometheus_tsdb_out_of_order_samples_total"),
        Figure("head_series", "prometheus_tsdb_head_series", gauge=True),
        Figure("rule_eval_s", "prometheus_rule_group_duration_seconds_sum"),
        Figure(
            "write_requests_ok",
            "prometheus_http_requests_total",
            labels=(("handler", "/api/v1/write"), ("code", "204")),
        ),
        Figure(
            "otlp_requests_ok",
            "prometheus_http_requests_total",
            labels=(("handler", "/api/v1/otlp/v1/metrics"), ("code", "200")),
        ),
    ),
    "thanos": (
        # Each ingesting receiver's TSDB (a copy each: replication 2 appends every sample twice).
        Figure("appended", "prometheus_tsdb_head_samples_appended_total"),
        Figure("out_of_order", "prometheus_tsdb_out_of_order_samples_total"),
        Figure("head_series", "prometheus_tsdb_head_series", gauge=True),
        # The router's answers to the agents' OTLP requests and its replication's failures.
        Figure(
            "otlp_requests_ok",
            "http_requests_total",
            labels=(("handler", "otlp"), ("code", "200")),
        ),
        Figure(
            "replications_failed",
            "thanos_receive_replications_total",
            labels=(("result", "error"),),
        ),
        Figure(
            "forwards_failed",
            "thanos_receive_forward_requests_total",
            labels=(("result", "error"),),
        ),
    ),
}
"""The figures read from each kind of process's own ``/metrics``."""

GAUGES = frozenset(f.name for figures in FIGURES.values() for f in figures if f.gauge)
"""The figures that are levels, not counts (a window's change means nothing for them)."""


def backlog(figures: Mapping[str, float]) -> dict[str, float]:
    """What a tier holds not sent on yet, from its figures at one moment: its sending queue's
    requests, and the bytes its remote-write log holds unread (written less read)."""
    return {
        "queue_size": figures.get("queue_size", 0.0),
        "wal_pending_bytes": figures.get("wal_written_bytes", 0.0)
        - figures.get("wal_read_bytes", 0.0),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, every thread (``/proc``)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def read_figures(tier: Tier) -> dict[str, float]:
    """The tier's figures now, summed over its processes (a process that cannot say: left out)."""
    totals = {figure.name: 0.0 for figure in FIGURES.get(tier.kind, ())}
    for process in tier.processes:
        if process.telemetry_port is None:
            continue
        try:
            samples = servers.metric_samples(process.telemetry_port)
        except OSError:
            continue
        for figure in FIGURES.get(tier.kind, ()):
            for sample in samples:
                if sample.name == figure.metric and all(
                    sample.labels.get(k) == v for k, v in figure.labels
                ):
                    totals[figure.name] += sample.value
    return totals


def machine_busy_seconds() -> float:
    """CPU seconds every process of the machine spent so far (``/proc/stat``, all CPUs)."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) * _TICK_S


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Every tier's CPU seconds and figures, and the machine's CPU, at one moment."""

    at: float
    cpu_s: dict[str, float]
    figures: dict[str, dict[str, float]]
    machine_s: float = 0.0


def snapshot(target: Target) -> Snapshot:
    """Every tier's CPU and figures now."""
    return Snapshot(
        time.monotonic(),
        {tier.name: sum(cpu_seconds(p.pid) for p in tier.processes) for tier in target.tiers},
        {tier.name: read_figures(tier) for tier in target.tiers},
        machine_busy_seconds(),
    )


def change(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """Per tier: CPU seconds spent between the two, each count's change, each level's end."""
    out: dict[str, Any] = {}
    for tier, cpu in after.cpu_s.items():
        figures = {
            name: value if name in GAUGES else value - before.figures[tier].get(name, 0.0)
            for name, value in after.figures[tier].items()
        }
        out[tier] = {"cpu_s": cpu - before.cpu_s[tier], "figures": figures}
    return out


class Sampler:
    """Snapshots every ``interval_s`` on a thread of its own, until :meth:`stop`."""

    def __init__(self, target: Target, interval_s: float = 1.0) -> None:
        self.target = target
        self.interval_s = interval_s
        self.snapshots: list[Snapshot] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(OSError):  # a process that just ended
                self.snapshots.append(snapshot(self.target))

    def stop(self) -> None:
        """Stop sampling; wait for the thread."""
        self._stop.set()
        self._thread.join(10)

    def first_after(self, at: float) -> Snapshot | None:
        """The first snapshot taken at or after ``at`` (monotonic), if any."""
        return next((s for s in list(self.snapshots) if s.at >= at), None)

    def peak_backlog(self, tier: str) -> dict[str, float]:
        """The most the tier held not sent on while sampling (:func:`backlog`)."""
        levels = [backlog(s.figures[tier]) for s in self.snapshots]
        return {
            name: max((level[name] for level in levels), default=0.0)
            for name in ("queue_size", "wal_pending_bytes")
        }

    def busiest_cores(self, tier: str) -> float:
        """The tier's highest CPU use between two samples, in cores."""
        pairs = zip(self.snapshots, self.snapshots[1:], strict=False)
        return max(
            ((b.cpu_s[tier] - a.cpu_s[tier]) / (b.at - a.at) for a, b in pairs if b.at > a.at),
            default=0.0,
        )


# ------------------------------------------------------------------ counting in the store


def steps_in_store(target: Target, run_id: str, window_s: float) -> dict[int, set[int]]:
    """Each rank's ``rl_step`` values the store holds for run ``run_id`` (the last ``window_s``)."""
    expr = f'rl_step{{{target.run_label}="{run_id}"}}[{max(1, int(window_s))}s]'
    found: dict[int, set[int]] = {}
    for series in servers.query(target.query_port, expr):
        labels = series["metric"]
        rank = int(labels.get("rl_rank", labels.get("instance", "").rpartition("-")[2]))
        found.setdefault(rank, set()).update(int(float(v)) for _, v in series["values"])
    return found


def missing_steps(found: Mapping[int, set[int]], ranks: int, steps: int) -> list[tuple[int, int]]:
    """The (rank, step) pairs not in ``found``."""
    expected = set(range(1, steps + 1))
    return [(r, s) for r in range(ranks) for s in sorted(expected - found.get(r, set()))]


SAMPLES_QUERY_TIMEOUT_S = 120.0
"""A count over every series of a run of thousands of ranks takes Thanos Query tens of seconds."""


def samples_in_store(target: Target, run_id: str, window_s: float) -> int | None:
    """Every sample the store holds of run ``run_id``'s series (the last ``window_s``); None
    when the store could not say in time (a figure beside the (rank, step) count, not it)."""
    selector = f'{{{target.run_label}="{run_id}"}}'
    window = f"[{max(1, int(window_s))}s]"
    timeout = SAMPLES_QUERY_TIMEOUT_S
    try:
        # Per name: count_over_time drops it, and two series left with one label set fail.
        names = [
            series["metric"]["__name__"]
            for series in servers.query(
                target.query_port, f"group by (__name__) ({selector})", timeout
            )
        ]
        total = 0
        for name in names:
            expr = f"sum(count_over_time({name}{selector}{window}))"
            result = servers.query(target.query_port, expr, timeout)
            total += int(float(result[0]["value"][1])) if result else 0
    except OSError:  # a timeout included
        return None
    return total

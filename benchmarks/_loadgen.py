"""A load generator: N simulated ranks, each exporting every NeMo-RL GRPO step over OTLP/HTTP.

Usage: ``python benchmarks/_loadgen.py --endpoint URL [--endpoint URL ...] --ranks N
--step-s T --steps K [--out PATH]`` (``bench_fleet.py`` runs it in a process of its own and
reads its JSON report; ``--help`` lists the rest).

**A rank as async_tee makes it.** Rank r of an N-rank job runs on node ``r // ranks_per_node``
and exports to that node's endpoint (its agent). Its environment is what torchrun gives it
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
``TORCHELASTIC_RUN_ID``), the job's script name as ``OTEL_SERVICE_NAME`` and its node's host
name; its resource is built from that environment as a session builds it
(``async_tee.config.load_settings``, then ``Resource.create``): run id, ranks,
``service.instance.id`` ``<run>/rank-<r>``, ``service.name``, ``host.name``.

**Its requests: a template per step, filled per rank.** One real session (``start_telemetry``,
exporting OTLP to an in-process ``OtlpSink``, the resource of rank 0) tees the fixture's calls
as each step 1..K (the setup call first, every value varied per step, the same on every rank
as a data-parallel job's reduced metrics are), flushes, and async_tee's own ``TableEncoder``
builds that step's request from the session's tables. Per send, the rank's resource (encoded by
``TableEncoder`` too) replaces the template's, every point's time becomes the send's and
``rl.step.time`` the rank's own: the bytes a session with that rank's resource sends for that
step (``tests/bench/test_loadgen.py`` compares them, decoded, with a real session's). A rank
costs its resource's bytes (~0.4 kB) and a few slots, so one process holds thousands.

**The cadence.** Rank r completes step k at ``start + (k - 1) * T + phase_r`` with ``phase_r =
frac(r * 0.618...) * T`` (the golden ratio's sequence: every run of ranks, and so every
node's, is spread over the step), and posts that step's request then, once per step, as a
session exports each completed step.

**Sending as async_tee does.** A rank's requests go in order, one at a time: its backlog holds
the ones not delivered yet (past ``max_pending`` the oldest waiting one is dropped, counted, as
the session's bounded backlog does). Each endpoint has ``connections`` kept-alive HTTP/1.1
connections, each carrying one request at a time: the bound on requests in flight. A request is
a POST with the headers async_tee's transport sends. Answers: 2xx is delivered (a partial
success's rejected points counted); HTTP 429/502/503/504, a refused or reset connection and a
timeout are sent again after async_tee's own backoff (``_export/sender.backoff_s``: 0.5 s
doubling to 5 s, or the ``Retry-After``); any other status is refused for good (dropped,
counted by status). After the last step, what is left gets ``drain_s`` to be delivered; what is
still not is reported, by rank and step.

**Reported** (``LoadReport``): requests and points made, sent, delivered; every answer by
kind; retries and drops by reason; the (rank, step) pairs not delivered; round-trip time,
how late each step's request was made and how long it waited for a connection (percentiles);
the generator's own CPU per request, and its request building's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import resource
import struct
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from _otlp_http import HttpClient, NoAnswer
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

import async_tee
from async_tee import __version__
from async_tee._declare.groups import RL_METRIC_GROUP
from async_tee._declare.series import SELF_METRIC_GROUP
from async_tee._export.encode import TableEncoder
from async_tee._export.provider import SCOPE
from async_tee._export.sender import backoff_s
from async_tee._export.transport import RETRYABLE_HTTP, partial, retry_after_s
from async_tee.config import load_settings
from async_tee.sink import OtlpSink

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parent / "tests" / "fixtures" / "grpo_step.json"

GOLDEN = 0.6180339887498949
"""The fractional step of the phase sequence (the golden ratio's inverse)."""
SERVICE = "run_grpo_math"
"""``service.name`` of every simulated rank: NeMo-RL's GRPO script, as a real run is named."""
VARY = 0.05
"""How far a step's values stray from the fixture's (a factor in 1 +/- VARY, per key)."""
LATENESS_WARN_S = 0.1
"""A request made later than this after its time means the generator could not keep up."""
_QUANTUM_NS = 1000
"""Samples are kept to the µs: the histograms stay small at millions of requests."""

_TIME_TAG = b"\x19"  # time_unix_nano: field 3 of a number or histogram point, fixed64
_DOUBLE_TAG = b"\x21"  # as_double: field 4 of a number point, fixed64
_LEN_FIELD_1 = 0x0A  # field 1, length-delimited: resource_metrics, and a ResourceMetrics' resource
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")


# ------------------------------------------------------------------ a rank's identity


def rank_environ(rank: int, world: int, ranks_per_node: int, run_id: str) -> dict[str, str]:
    """What torchrun gives rank ``rank`` of a ``world``-rank job, its node and the job's name."""
    node = rank // ranks_per_node
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % ranks_per_node),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(ranks_per_node),
        "GROUP_RANK": str(node),
        "TORCHELASTIC_RUN_ID": run_id,
        "OTEL_SERVICE_NAME": SERVICE,
        "OTEL_RESOURCE_ATTRIBUTES": f"host.name={node_name(node)}",
    }


def node_name(node: int) -> str:
    """The host name of node ``node``."""
    return f"node-{node:04d}"


def rank_resource(environ: Mapping[str, str]) -> Any:
    """The resource a session started with ``environ`` exports under (``build_exports``)."""
    from opentelemetry.sdk.resources import Resource

    return Resource.create(dict(load_settings(environ).resource_attributes))


# ------------------------------------------------------------------ a step's calls


def fixture_calls() -> list[dict[str, Any]]:
    """The fixture's ``log_metrics`` calls: step, prefix, metrics, step_finished."""
    calls: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["calls"]
    return calls


def _vary(value: Any, rng: random.Random) -> Any:
    """A float other than 0 and 1 moved by up to ``VARY``; anything else as it is."""
    if type(value) is float and value not in (0.0, 1.0):
        return value * (1 + rng.uniform(-VARY, VARY))
    return value


def setup_calls() -> list[tuple[str, dict[str, Any], int, bool]]:
    """The calls logged once before the loop (the fixture's step-0 calls)."""
    return [
        (call["prefix"], dict(call["metrics"]), 0, bool(call.get("step_finished", False)))
        for call in fixture_calls()
        if call["step"] == 0
    ]


def step_calls(step: int) -> list[tuple[str, dict[str, Any], int, bool]]:
    """Every call of step ``step``: the fixture's, in order, values varied (seeded by the step).

    ``(prefix, metrics, step, step_finished)``, as ``tee_rl_metrics_to_otel`` takes them.
    """
    rng = random.Random(step)
    return [
        (
            call["prefix"],
            {key: _vary(value, rng) for key, value in call["metrics"].items()},
            step,
            bool(call.get("step_finished", False)),
        )
        for call in fixture_calls()
        if call["step"] != 0
    ]


# ------------------------------------------------------------------ protobuf framing


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at ``at`` and where it ends."""
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _length_delimited_1(data: bytes, at: int = 0) -> tuple[int, int]:
    """Field 1 (length-delimited) starting at ``at``: where its value starts and ends."""
    if data[at] != _LEN_FIELD_1:
        raise ValueError(f"expected field 1 (length-delimited) at {at}, found tag {data[at]}")
    length, start = _read_varint(data, at + 1)
    return start, start + length


def split_request(data: bytes) -> tuple[bytes, bytes]:
    """An ``ExportMetricsServiceRequest`` of one resource: its resource field, and the rest.

    The rest is the ``ResourceMetrics``' fields after its resource (the scope's metrics, the
    schema URL): ``join_request(resource, rest)`` is the same request again.
    """
    start, end = _length_delimited_1(data)
    if end != len(data):
        raise ValueError("the request holds more than one ResourceMetrics")
    resource_metrics = data[start:end]
    _, resource_end = _length_delimited_1(resource_metrics)
    return resource_metrics[:resource_end], resource_metrics[resource_end:]


def join_request(resource_field: bytes, rest: bytes | bytearray) -> bytes:
    """The request of one ``ResourceMetrics``: ``resource_field`` then ``rest``."""
    size = len(resource_field) + len(rest)
    return b"".join((bytes((_LEN_FIELD_1,)), _varint(size), resource_field, rest))


# ------------------------------------------------------------------ the templates


@dataclasses.dataclass(frozen=True)
class StepTemplate:
    """One step's request as the encoder built it, without its resource.

    Attributes:
        step: The step (``rl.step``'s value in it).
        rest: The ``ResourceMetrics``' fields after the resource (``split_request``).
        time_field: The tag and value of every point's time: found ``points`` times in ``rest``.
        step_time_at: Where ``rl.step.time``'s value (a double) is in ``rest``.
        points: The data points of the request.
    """

    step: int
    rest: bytes
    time_field: bytes
    step_time_at: int
    points: int

    @classmethod
    def of(cls, data: bytes, step: int) -> StepTemplate:
        """The template of ``data``, one export's request of ``step``.

        Raises:
            ValueError: It is not one export of that step (no ``rl.step`` of ``step``, times
                that differ, a time or step time not found exactly where expected).
        """
        request = ExportMetricsServiceRequest.FromString(data)
        times: set[int] = set()
        points = 0
        values: dict[str, float] = {}
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        points += 1
                        times.add(point.time_unix_nano)
                        if metric.name in ("rl.step", "rl.step.time"):
                            values[metric.name] = point.as_double
        if values.get("rl.step") != step or "rl.step.time" not in values:
            raise ValueError(f"not a request of step {step}: rl.step {values.get('rl.step')}")
        if len(times) != 1:
            raise ValueError(f"the points of step {step}'s request have {len(times)} times")
        _, rest = split_request(data)
        time_field = _TIME_TAG + _U64.pack(times.pop())
        if rest.count(time_field) != points:
            raise ValueError("a point's time is not found once per point")
        step_time = _DOUBLE_TAG + _F64.pack(values["rl.step.time"])
        if rest.count(step_time) != 1:
            raise ValueError("rl.step.time's value is not found exactly once")
        return cls(step, rest, time_field, rest.find(step_time) + 1, points)

    def fill(self, now_ns: int, step_time_s: float) -> bytearray:
        """``rest`` with every point's time ``now_ns`` and ``rl.step.time`` ``step_time_s``."""
        rest = bytearray(self.rest.replace(self.time_field, _TIME_TAG + _U64.pack(now_ns)))
        _F64.pack_into(rest, self.step_time_at, step_time_s)
        return rest


def session_environ(endpoint: str) -> dict[str, str]:
    """The template session's exporter: OTLP/HTTP to ``endpoint``, every step its own export."""
    return {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_METRIC_EXPORT_INTERVAL": "3600000",
        "ASYNC_TEE_MIN_EXPORT_INTERVAL": "0",
    }


class Requests:
    """Every rank's request of every step: the step templates, each rank's resource field."""

    def __init__(self, templates: Sequence[StepTemplate], resources: Sequence[bytes]) -> None:
        self.templates = list(templates)
        self.resources = list(resources)

    @classmethod
    def build(
        cls, ranks: int, steps: int, ranks_per_node: int, run_id: str, timeout_s: float = 30.0
    ) -> Requests:
        """Run a session as rank 0 through ``steps`` steps; encode every rank's resource.

        Raises:
            RuntimeError: The session did not start exporting, or a step was not recorded
                within ``timeout_s``.
        """
        environs = (rank_environ(r, ranks, ranks_per_node, run_id) for r in range(ranks))
        with OtlpSink() as sink:
            first = rank_environ(0, ranks, ranks_per_node, run_id)
            session = async_tee.start_telemetry(
                environ={**first, **session_environ(sink.http_endpoint)}
            )
            try:
                if not isinstance(session, async_tee.Pipeline) or not session.is_exporting:
                    raise RuntimeError("the template session did not start exporting")
                groups = (SELF_METRIC_GROUP, RL_METRIC_GROUP)
                encoder = TableEncoder(
                    session.instruments, groups, rank_resource(first), SCOPE, __version__
                )
                templates = []
                for prefix, metrics, step, finished in setup_calls():
                    async_tee.tee_rl_metrics_to_otel(metrics, prefix, step, finished)
                for step in range(1, steps + 1):
                    for prefix, metrics, at, finished in step_calls(step):
                        async_tee.tee_rl_metrics_to_otel(metrics, prefix, at, finished)
                    if not async_tee.flush(timeout_s):
                        raise RuntimeError(f"step {step} was not recorded in {timeout_s} s")
                    session.exports.counts.collections += 1  # a collection of its own
                    templates.append(StepTemplate.of(encoder.request().data, step))
                # A resource as the encoder writes it: a request of no series, its first field.
                resources = [
                    split_request(
                        TableEncoder(
                            session.instruments, (), rank_resource(env), SCOPE, __version__
                        )
                        .request()
                        .data
                    )[0]
                    for env in environs
                ]
            finally:
                async_tee.shutdown_telemetry(5.0)
        return cls(templates, resources)

    def request(self, rank: int, step: int, now_ns: int, step_time_s: float) -> bytes:
        """Rank ``rank``'s request of ``step`` (from 1), made at ``now_ns`` (Unix ns)."""
        rest = self.templates[step - 1].fill(now_ns, step_time_s)
        return join_request(self.resources[rank], rest)

    @property
    def points(self) -> int:
        """Points per request (every step's request has as many)."""
        return self.templates[-1].points


# ------------------------------------------------------------------ the load


@dataclasses.dataclass(frozen=True)
class LoadConfig:
    """One run of the generator.

    Attributes:
        endpoints: The agents' OTLP/HTTP URLs; node n's ranks export to ``n % len``'s.
        ranks: Simulated ranks.
        step_s: The step's length (each rank posts once per step).
        steps: Steps per rank.
        ranks_per_node: Ranks of a node (sharing an endpoint, numbered as torchrun does).
        run_id: The job's id (``rl.run.id``): tells this run's series apart in a store.
        connections: Kept-alive connections per endpoint: the requests in flight to it.
        max_pending: A rank's backlog bound, in requests (the oldest waiting one goes).
        timeout_s: The longest a send waits for its answer (``OTEL_EXPORTER_OTLP_TIMEOUT``).
        drain_s: After the last step, the longest to wait for what is left to be delivered.
    """

    endpoints: tuple[str, ...]
    ranks: int
    step_s: float
    steps: int
    ranks_per_node: int = 8
    run_id: str = "loadgen"
    connections: int = 16
    max_pending: int = 64
    timeout_s: float = 10.0
    drain_s: float = 60.0

    def endpoint_of(self, rank: int) -> int:
        """The index of the endpoint rank ``rank`` exports to (its node's)."""
        return (rank // self.ranks_per_node) % len(self.endpoints)

    def phase_s(self, rank: int) -> float:
        """When in its step rank ``rank`` completes it."""
        return (rank * GOLDEN) % 1.0 * self.step_s


class _Pending:
    """A request made and not yet delivered or dropped."""

    __slots__ = ("attempts", "data", "ready_ns", "step")

    def __init__(self, step: int, data: bytes, ready_ns: int) -> None:
        self.step = step
        self.data = data
        self.ready_ns = ready_ns  # when it became the next to send (monotonic ns)
        self.attempts = 0


class LoadGenerator:
    """Drives ``config.ranks`` ranks through ``config.steps`` steps; counts every answer."""

    def __init__(
        self,
        config: LoadConfig,
        requests: Requests,
        on_start: Callable[[float], None] | None = None,
    ) -> None:
        """Ready to :meth:`run`; ``on_start`` is called with the Unix time the load starts."""
        self.config = config
        self.requests = requests
        self.on_start = on_start
        ranks = config.ranks
        self._pending: list[deque[_Pending] | None] = [None] * ranks
        self._busy = bytearray(ranks)  # queued for a connection, in flight, or awaiting a retry
        self._in_flight = bytearray(ranks)
        self._delivered = bytearray(ranks * config.steps)  # [rank * steps + step - 1]
        self._outstanding = 0
        self._ready: list[asyncio.Queue[int]] = []
        self._idle: asyncio.Event | None = None
        self.counts: Counter[str] = Counter()
        self.answers: Counter[str] = Counter()
        self.retried: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.rtt_ns: Counter[int] = Counter()
        self.late_ns: Counter[int] = Counter()
        self.wait_ns: Counter[int] = Counter()
        self.build_ns: Counter[int] = Counter()
        self.max_pending_seen = 0
        self.last_error: dict[str, str] = {}

    # -- making requests

    def _make(self, rank: int, step: int) -> None:
        started = time.perf_counter_ns()
        data = self.requests.request(rank, step, time.time_ns(), time.time())
        now = time.perf_counter_ns()
        self.build_ns[(now - started) // _QUANTUM_NS * _QUANTUM_NS] += 1
        pending = self._pending[rank]
        if pending is None:
            pending = self._pending[rank] = deque()
        if len(pending) >= self.config.max_pending:  # the oldest waiting one goes
            del pending[1 if self._in_flight[rank] else 0]
            self.dropped["overflow"] += 1
            self._outstanding -= 1
        pending.append(_Pending(step, data, now))
        self.max_pending_seen = max(self.max_pending_seen, len(pending))
        self.counts["made"] += 1
        self.counts["points_made"] += self.requests.points
        self._outstanding += 1
        if not self._busy[rank]:
            self._busy[rank] = 1
            self._ready[self.config.endpoint_of(rank)].put_nowait(rank)

    async def _schedule(self, start: float) -> None:
        """Make each rank's request of each step at its time."""
        config = self.config
        loop = asyncio.get_running_loop()
        order = sorted(range(config.ranks), key=config.phase_s)
        phases = [config.phase_s(rank) for rank in order]
        for step in range(1, config.steps + 1):
            base = start + (step - 1) * config.step_s
            for rank, phase in zip(order, phases, strict=True):
                due = base + phase
                ahead = due - loop.time()
                if ahead > 0.001:
                    await asyncio.sleep(ahead)
                late = max(0, int((loop.time() - due) * 1e9))
                self.late_ns[late // _QUANTUM_NS * _QUANTUM_NS] += 1
                self._make(rank, step)

    # -- sending them

    async def _sender(self, endpoint: int) -> None:
        """One connection to ``endpoint``: sends the ranks that are ready, one at a time."""
        client = HttpClient(self.config.endpoints[endpoint])
        ready = self._ready[endpoint]
        try:
            while True:
                rank = await ready.get()
                await self._send_next(rank, client, ready)
        finally:
            client.close()
            self.counts["connects"] += client.connects

    async def _send_next(self, rank: int, client: HttpClient, ready: asyncio.Queue[int]) -> None:
        pending = self._pending[rank]
        assert pending
        request = pending[0]
        started = time.perf_counter_ns()
        self.wait_ns[(started - request.ready_ns) // _QUANTUM_NS * _QUANTUM_NS] += 1
        self.counts["sent"] += 1
        self._in_flight[rank] = 1
        retry_after: str | None = None
        try:
            status, headers, body = await client.post(request.data, self.config.timeout_s)
        except NoAnswer as failed:
            status, kind = 0, failed.reason
            self.last_error[kind] = str(failed)
        else:
            kind = "2xx" if 200 <= status < 300 else str(status)
            retry_after = headers.get("retry-after")
        finally:
            self._in_flight[rank] = 0
        ended = time.perf_counter_ns()
        self.rtt_ns[(ended - started) // _QUANTUM_NS * _QUANTUM_NS] += 1
        self.answers[kind] += 1
        if kind == "2xx":
            self._settled(rank, pending)
            self.counts["delivered"] += 1
            self.counts["points_delivered"] += self.requests.points
            self.counts["points_rejected"] += partial_rejected(body)
            self._delivered[rank * self.config.steps + request.step - 1] = 1
        elif status in RETRYABLE_HTTP or status == 0:
            self.retried[kind] += 1
            request.attempts += 1
            wait = backoff_s(request.attempts, retry_after_s(retry_after))
            asyncio.get_running_loop().call_later(wait, ready.put_nowait, rank)
            return  # still busy: the same request goes first again
        else:
            self._settled(rank, pending)
            self.refused[kind] += 1
        if pending:
            pending[0].ready_ns = ended
            ready.put_nowait(rank)
        else:
            self._busy[rank] = 0

    def _settled(self, rank: int, pending: deque[_Pending]) -> None:
        """The request in flight was delivered or refused: it leaves the rank's backlog."""
        pending.popleft()
        self._outstanding -= 1
        if self._outstanding == 0 and self._idle is not None:
            self._idle.set()

    # -- the run

    async def run(self) -> dict[str, Any]:
        """Drive every rank through every step, then drain; the report."""
        config = self.config
        loop = asyncio.get_running_loop()
        self._ready = [asyncio.Queue() for _ in config.endpoints]
        self._idle = asyncio.Event()
        senders = [
            asyncio.create_task(self._sender(endpoint))
            for endpoint in range(len(config.endpoints))
            for _ in range(config.connections)
        ]
        cpu0, wall0 = _cpu_times(), time.perf_counter()
        start = loop.time() + 0.05
        started_unix = time.time() + 0.05
        if self.on_start is not None:
            self.on_start(started_unix)
        await self._schedule(start)
        scheduled = time.perf_counter()
        drained = True
        if self._outstanding:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), config.drain_s)
            except asyncio.TimeoutError:
                drained = False
        cpu1 = _cpu_times()
        cpu = (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1])
        wall = time.perf_counter() - wall0
        for task in senders:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        return self._report(cpu, wall, scheduled - wall0, drained, started_unix)

    def missing(self) -> list[tuple[int, int]]:
        """The (rank, step) pairs not delivered."""
        steps = self.config.steps
        return [
            (index // steps, index % steps + 1)
            for index, done in enumerate(self._delivered)
            if not done
        ]

    def _report(
        self,
        cpu: tuple[float, float],
        wall_s: float,
        schedule_s: float,
        drained: bool,
        started_unix: float,
    ) -> dict[str, Any]:
        config = self.config
        cpu_s = sum(cpu)
        missing = self.missing()
        undelivered = sum(len(p) for p in self._pending if p)
        sent = self.counts["sent"]
        made = self.counts["made"]
        late = percentiles_us(self.late_ns)
        return {
            "config": dataclasses.asdict(config),
            "started_unix": started_unix,
            "points_per_request": self.requests.points,
            "request_bytes": len(self.requests.request(0, 1, 0, 0.0)),
            "requests": {
                "made": made,
                "sent": sent,
                "delivered": self.counts["delivered"],
                "undelivered_at_end": undelivered,
                "max_backlog": self.max_pending_seen,
            },
            "points": {
                "made": self.counts["points_made"],
                "delivered": self.counts["points_delivered"],
                "rejected": self.counts["points_rejected"],
            },
            "answers": dict(self.answers),
            "retried": dict(self.retried),
            "refused": dict(self.refused),
            "dropped": dict(self.dropped),
            "last_error": self.last_error,
            "connects": self.counts["connects"],
            "steps": {
                "expected": config.ranks * config.steps,
                "delivered": config.ranks * config.steps - len(missing),
                "missing": len(missing),
                "missing_first": missing[:20],
            },
            "drained": drained,
            "schedule_s": schedule_s,
            "wall_s": wall_s,
            "rtt_us": percentiles_us(self.rtt_ns),
            "late_us": late,
            "kept_up": late["p99"] < LATENESS_WARN_S * 1e6,
            "waited_us": percentiles_us(self.wait_ns),
            "generator": {
                "cpu_s": cpu_s,
                "user_s": cpu[0],
                "system_s": cpu[1],
                "cpu_us_per_request": 1e6 * cpu_s / sent if sent else None,
                "build_us": percentiles_us(self.build_ns),
                "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            },
        }


def _cpu_times() -> tuple[float, float]:
    """This process's user and system CPU seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def partial_rejected(body: bytes) -> int:
    """The points a 2xx answer's body says were rejected (OTLP partial success)."""
    if not body:
        return 0
    try:
        return partial(ExportMetricsServiceResponse.FromString(body)).rejected_points
    except Exception:  # a body that is not one says nothing, as async_tee reads it
        return 0


def percentiles_us(hist: Counter[int]) -> dict[str, float]:
    """Nearest-rank p50, p90, p99, p99.9 and max (µs) of nanosecond samples (empty: zeros)."""
    if not hist:
        return {"n": 0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "p99.9": 0.0, "max": 0.0}
    from _common import percentiles

    return {"n": sum(hist.values()), **percentiles(hist)}


def run(
    config: LoadConfig,
    requests: Requests | None = None,
    on_start: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Build the requests (unless given), drive the load, and return the report."""
    started = time.perf_counter()
    cpu0 = time.process_time()
    if requests is None:
        requests = Requests.build(config.ranks, config.steps, config.ranks_per_node, config.run_id)
    setup = {"s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu0}
    report = asyncio.run(LoadGenerator(config, requests, on_start).run())
    report["setup"] = setup
    return report


# ------------------------------------------------------------------ the command


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--endpoint", action="append", required=True, help="an agent's URL")
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--step-s", type=float, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--run-id", default=f"loadgen-{int(time.time())}")
    parser.add_argument("--connections", type=int, default=16, help="per endpoint")
    parser.add_argument("--max-pending", type=int, default=64, help="a rank's backlog")
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--drain-s", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=None, help="the JSON report (else stdout)")
    return parser.parse_args(argv)


def config_of(args: argparse.Namespace) -> LoadConfig:
    """The run the options describe."""
    return LoadConfig(
        endpoints=tuple(args.endpoint),
        ranks=args.ranks,
        step_s=args.step_s,
        steps=args.steps,
        ranks_per_node=args.ranks_per_node,
        run_id=args.run_id,
        connections=args.connections,
        max_pending=args.max_pending,
        timeout_s=args.timeout_s,
        drain_s=args.drain_s,
    )


def _say_start(unix: float) -> None:
    print(json.dumps({"event": "load", "unix": unix}), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the generator: a line ``{"event": "load", ...}`` on stdout when the load starts,
    then the report as JSON to ``--out``, else as the last line of stdout."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    report = run(config_of(args), on_start=_say_start)
    if args.out is None:
        print(json.dumps(report), flush=True)
    else:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

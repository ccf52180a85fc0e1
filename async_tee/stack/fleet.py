"""The fleet: a Collector agent per node, forwarding to Thanos Receive, read through Thanos Query.

The store scales out. A router (stateless) takes each agent's OTLP, translates it as Prometheus
3 does and sends each series to ``replication_factor`` of the ingesting receivers by a
hashring; each ingesting receiver keeps its share in its own TSDB, marked by its
``receive_replica`` label; the query reads every receiver and merges the copies sample by
sample; Thanos Rule evaluates the alert rules through the query; Grafana reads the query as
its Prometheus. More nodes: more agents. More series: more receivers in the ring.
"""

from __future__ import annotations

import dataclasses
import json

from async_tee.alerts import AlertThresholds, render_rules
from async_tee.stack.agent import AgentSettings, agent_config
from async_tee.stack.common import (
    COLLECTOR_IMAGE,
    COLLECTOR_MEMORY_MIB,
    GRAFANA_SERVICE,
    PROMOTED,
    grafana_files,
    seconds,
)

__all__ = [
    "THANOS_IMAGE",
    "FleetAddresses",
    "ThanosPart",
    "query_argv",
    "receiver_argv",
    "render_fleet",
    "router_argv",
    "rule_argv",
]

THANOS_IMAGE = "quay.io/thanos/thanos:v0.42.5"
REPLICA_LABELS = ("receive_replica", "rule_replica")
"""The labels telling copies apart (a receiver's, the rule evaluator's): the query merges them."""
OTLP_PATH = "/api/v1/otlp"
"""Where a receiver's write port takes OTLP/HTTP metrics (the full path: no ``/v1/metrics``)."""
REMOTE_WRITE_PATH = "/api/v1/receive"
"""Where a receiver's write port takes Prometheus remote write."""


@dataclasses.dataclass(frozen=True)
class ThanosPart:
    """One Thanos process: how the others reach each of its listeners (``host:port``).

    ``write`` (remote write and OTLP) and ``capnproto`` (replication) are a receiver's.
    """

    name: str
    grpc: str
    http: str
    write: str = ""
    capnproto: str = ""


def _part(name: str, receives: bool = False) -> ThanosPart:
    """A part as compose names it, on Thanos's default ports."""
    if receives:
        return ThanosPart(name, f"{name}:10901", f"{name}:10902", f"{name}:19291", f"{name}:19391")
    return ThanosPart(name, f"{name}:10901", f"{name}:10902")


_ROUTER = _part("router", receives=True)
_RECEIVERS = tuple(_part(f"receive-{i}", receives=True) for i in range(3))
_QUERY, _RULE = _part("query"), _part("rule")


@dataclasses.dataclass(frozen=True)
class FleetAddresses:
    """The store's parts and where they keep their data: compose's by default.

    Attributes:
        router: The receiver the agents write to; it routes, keeps nothing.
        receivers: The ingesting receivers of the hashring.
        replication_factor: How many receivers keep each series (2: one may be lost).
        query: Thanos Query: the Prometheus API that Grafana and the rule evaluator read.
        rule: Thanos Rule, evaluating the alert rules.
        listen_host: The host every part listens on (``0.0.0.0`` in a container).
        data: The folder under which each part keeps its data (``<data>/<part name>``).
        rules_file: The alert rules' file as the rule evaluator reads it.
        evaluation_interval_s: How often the rules are evaluated.
    """

    router: ThanosPart = _ROUTER
    receivers: tuple[ThanosPart, ...] = _RECEIVERS
    replication_factor: int = 2
    query: ThanosPart = _QUERY
    rule: ThanosPart = _RULE
    listen_host: str = "0.0.0.0"
    data: str = "/data"
    rules_file: str = "/etc/thanos/rules.yml"
    evaluation_interval_s: float = 15.0

    def __post_init__(self) -> None:
        if not 1 <= self.replication_factor <= len(self.receivers):
            raise ValueError(
                f"replication_factor {self.replication_factor} needs 1 to "
                f"{len(self.receivers)} receivers (there are {len(self.receivers)})"
            )

    @property
    def otlp_url(self) -> str:
        """Where the agents send OTLP/HTTP metrics: the router's."""
        return f"http://{self.router.write}{OTLP_PATH}"

    @property
    def remote_write_url(self) -> str:
        """Where a Prometheus remote-write client writes: the router's."""
        return f"http://{self.router.write}{REMOTE_WRITE_PATH}"


def _listen(at: FleetAddresses, part: ThanosPart) -> list[str]:
    """A part's listening flags: each of its listeners, on ``listen_host`` at its port."""
    flags = [("grpc-address", part.grpc), ("http-address", part.http)]
    flags += [("remote-write.address", part.write), ("receive.capnproto-address", part.capnproto)]
    return [
        f"--{flag}={at.listen_host}:{where.rsplit(':', 1)[1]}" for flag, where in flags if where
    ]


def receiver_argv(at: FleetAddresses, index: int) -> list[str]:
    """Ingesting receiver ``index``: keeps the series the ring gives it, under its replica label."""
    part = at.receivers[index]
    return [
        "receive",
        f"--tsdb.path={at.data}/{part.name}",
        *_listen(at, part),
        f"--receive.local-endpoint={part.grpc}",  # its name in the ring: it ingests
        f'--label=receive_replica="{part.name}"',
    ]


def router_argv(at: FleetAddresses) -> list[str]:
    """The router: takes OTLP and remote write, and sends each series to its receivers."""
    ring = [{"hashring": "default", "endpoints": [part.grpc for part in at.receivers]}]
    return [
        "receive",
        f"--tsdb.path={at.data}/{at.router.name}",
        *_listen(at, at.router),
        f"--receive.hashrings={json.dumps(ring)}",  # and no local endpoint: it only routes
        f"--receive.replication-factor={at.replication_factor}",
        f'--label=receive_replica="{at.router.name}"',
        *(f"--receive.otlp-promote-resource-attributes={name}" for name in PROMOTED),
    ]


def query_argv(at: FleetAddresses) -> list[str]:
    """The query: every receiver and the rule evaluator (its alerts), the copies merged."""
    endpoints = [part.grpc for part in at.receivers] + [at.rule.grpc]
    return [
        "query",
        *_listen(at, at.query),
        "--endpoint.sd-config=" + json.dumps({"endpoints": [{"address": e} for e in endpoints]}),
        *(f"--query.replica-label={label}" for label in REPLICA_LABELS),
        "--deduplication.func=chain",  # replicas hold the same samples: merged one to one
    ]


def rule_argv(at: FleetAddresses) -> list[str]:
    """The rule evaluator: async_tee's alert rules, evaluated through the query."""
    return [
        "rule",
        f"--data-dir={at.data}/{at.rule.name}",
        *_listen(at, at.rule),
        f"--query={at.query.http}",
        f"--rule-file={at.rules_file}",
        f"--eval-interval={seconds(at.evaluation_interval_s)}",
        '--label=rule_replica="0"',
    ]


def _service(part: ThanosPart, argv: list[str], extra: str = "") -> str:
    command = "".join(f"\n      - {json.dumps(arg)}" for arg in argv)
    return (
        f"  {part.name}:\n"
        f"    image: {THANOS_IMAGE}\n"
        f"    command:{command}\n"
        "    restart: unless-stopped\n"
        "    volumes:\n"
        "      - ./rules.yml:/etc/thanos/rules.yml:ro\n"
        "      - thanos-data:/data\n" + extra
    )


COMPOSE_AGENT = AgentSettings(
    otlp_grpc="0.0.0.0:4317",  # in its container; published on the node's loopback only
    otlp_http="0.0.0.0:4318",
    store_otlp=FleetAddresses().otlp_url,
)
"""The node agent as the compose file runs it."""


def render_fleet(
    at: FleetAddresses | None = None,
    agent: AgentSettings = COMPOSE_AGENT,
    thresholds: AlertThresholds | None = None,
    dashboard: str | None = None,
) -> dict[str, str]:
    """Every file of the fleet stack: relative file name -> text.

    ``agent.yaml`` is each node's; the compose file runs the store, Grafana and one node's
    agent (``ranks.env``: what each rank sets). ``thresholds``: the alert rules' (the
    defaults when omitted); ``dashboard``: Grafana's (``async-tee dashboard``), or None.
    """
    at = at or FleetAddresses()
    compose = (
        "# Generated by `async-tee stack --path fleet`: the store (Thanos Receive, Query, Rule),\n"
        "# Grafana and this node's agent. Every other node runs agent.yaml in its own Collector.\n"
        "services:\n"
        "  agent:\n"
        f"    image: {COLLECTOR_IMAGE}\n"
        "    command: [--config=/etc/otelcol/config.yaml]\n"
        "    restart: unless-stopped  # after a crash it comes back and sends what it kept\n"
        f"    environment: [GOMEMLIMIT={COLLECTOR_MEMORY_MIB * 4 // 5}MiB]\n"
        '    user: "0:0"  # the image has no folder its own user may write\n'
        "    volumes:\n"
        "      - ./agent.yaml:/etc/otelcol/config.yaml:ro\n"
        f"      - agent-data:{agent.data}\n"
        '    ports: ["127.0.0.1:4317:4317", "127.0.0.1:4318:4318"]\n'
        + "".join(_service(part, receiver_argv(at, i)) for i, part in enumerate(at.receivers))
        + _service(at.router, router_argv(at))
        + _service(at.query, query_argv(at), '    ports: ["10902:10902"]\n')
        + _service(at.rule, rule_argv(at))
        + GRAFANA_SERVICE
        + "volumes:\n  agent-data: {}\n  thanos-data: {}\n"
    )
    files = {
        "agent.yaml": agent_config(agent),
        "rules.yml": render_rules(thresholds),
        "compose.yaml": compose,
        "ranks.env": (
            "OTEL_METRICS_EXPORTER=otlp\n"
            "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf\n"
            f"OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:{agent.otlp_http.rsplit(':', 1)[1]}\n"
        ),
        **grafana_files(f"http://{at.query.http}"),
    }
    if dashboard is not None:
        files["dashboard.json"] = dashboard
    return files

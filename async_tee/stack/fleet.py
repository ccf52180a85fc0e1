"""The fleet: a Collector agent per node, forwarding to Thanos Receive, read through Thanos Query.

The store scales out: a hashring of receivers, each series kept by ``replication_factor`` of
them (the query deduplicates the copies by their ``receive_replica`` label); Thanos Rule
evaluates the same alert rules against the query; Grafana reads the query as its Prometheus.
"""

from __future__ import annotations

import dataclasses
import json

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
    "hashring",
    "query_flags",
    "receive_flags",
    "render_fleet",
    "rule_flags",
]

THANOS_IMAGE = "quay.io/thanos/thanos:v0.42.0"
REPLICA_LABEL = "receive_replica"
"""The label a receiver puts on what it keeps: the query merges the copies it tells apart."""
OTLP_PATH = "/api/v1/otlp/v1/metrics"
"""Where a receiver's remote-write port takes OTLP/HTTP."""


@dataclasses.dataclass(frozen=True)
class FleetAddresses:
    """Where each part of the store listens and keeps its data: compose's by default.

    Attributes:
        receivers: Each receiver's ``host`` (its gRPC, HTTP and write ports below).
        replication_factor: How many receivers keep each series.
        receive_grpc_port, receive_http_port, receive_write_port: A receiver's ports.
        query: Where the query listens for HTTP (the Prometheus API Grafana reads).
        query_grpc: Where the query listens for gRPC.
        rule_http, rule_grpc: Where the rule evaluator listens.
        data: The folder under which each part keeps its data (``<data>/<part>``).
        evaluation_interval_s: How often the rules are evaluated.
        rules_file: The alert rules' file as the rule evaluator reads it.
        hashring_file: The hashring's file as the receivers read it.
    """

    receivers: tuple[str, ...] = ("receive-0", "receive-1", "receive-2")
    replication_factor: int = 2
    receive_grpc_port: int = 10901
    receive_http_port: int = 10902
    receive_write_port: int = 19291
    query: str = "query:10902"
    query_grpc: str = "query:10901"
    rule_http: str = "rule:10902"
    rule_grpc: str = "rule:10901"
    data: str = "/data"
    evaluation_interval_s: float = 15.0
    rules_file: str = "/etc/thanos/rules.yml"
    hashring_file: str = "/etc/thanos/hashring.json"

    def __post_init__(self) -> None:
        if not 1 <= self.replication_factor <= len(self.receivers):
            raise ValueError(
                f"replication_factor {self.replication_factor} needs 1 to "
                f"{len(self.receivers)} receivers (there are {len(self.receivers)})"
            )

    def receiver_grpc(self, host: str) -> str:
        """One receiver's gRPC address: its name in the ring, and where the query reads it."""
        return f"{host}:{self.receive_grpc_port}"

    def store_otlp(self, host: str) -> str:
        """The OTLP/HTTP URL of one receiver (any of them routes by the hashring)."""
        return f"http://{host}:{self.receive_write_port}{OTLP_PATH}"


def hashring(at: FleetAddresses) -> str:
    """The receivers' hashring file: one ring of every receiver."""
    ring = [{"hashring": "default", "endpoints": [at.receiver_grpc(h) for h in at.receivers]}]
    return json.dumps(ring, indent=2) + "\n"


def receive_flags(at: FleetAddresses, host: str) -> list[str]:
    """One receiver's flags: routes by the ring, keeps its share, takes OTLP."""
    return [
        "receive",
        f"--tsdb.path={at.data}/{host}",
        f"--grpc-address=0.0.0.0:{at.receive_grpc_port}",
        f"--http-address=0.0.0.0:{at.receive_http_port}",
        f"--remote-write.address=0.0.0.0:{at.receive_write_port}",
        f"--receive.hashrings-file={at.hashring_file}",
        f"--receive.local-endpoint={at.receiver_grpc(host)}",
        f"--receive.replication-factor={at.replication_factor}",
        f'--label={REPLICA_LABEL}="{host}"',
        *(f"--receive.otlp-promote-resource-attributes={name}" for name in PROMOTED),
    ]


def query_flags(at: FleetAddresses) -> list[str]:
    """The query's flags: every receiver and the rule evaluator, copies merged."""
    return [
        "query",
        f"--http-address=0.0.0.0:{at.query.rsplit(':', 1)[1]}",
        f"--grpc-address=0.0.0.0:{at.query_grpc.rsplit(':', 1)[1]}",
        *(f"--endpoint={at.receiver_grpc(h)}" for h in at.receivers),
        f"--endpoint={at.rule_grpc}",
        f"--query.replica-label={REPLICA_LABEL}",
    ]


def rule_flags(at: FleetAddresses) -> list[str]:
    """The rule evaluator's flags: the alert rules, evaluated against the query."""
    return [
        "rule",
        f"--data-dir={at.data}/rule",
        f"--http-address=0.0.0.0:{at.rule_http.rsplit(':', 1)[1]}",
        f"--grpc-address=0.0.0.0:{at.rule_grpc.rsplit(':', 1)[1]}",
        f"--rule-file={at.rules_file}",
        f"--query=http://{at.query}",
        f"--eval-interval={seconds(at.evaluation_interval_s)}",
        '--label=rule_replica="rule-0"',
    ]


def _service(name: str, flags: list[str], extra: str = "") -> str:
    command = "".join(f"\n      - {json.dumps(flag)}" for flag in flags)
    return (
        f"  {name}:\n"
        f"    image: {THANOS_IMAGE}\n"
        f"    command:{command}\n"
        "    volumes:\n"
        "      - ./hashring.json:/etc/thanos/hashring.json:ro\n"
        "      - ./rules.yml:/etc/thanos/rules.yml:ro\n"
        "      - thanos-data:/data\n" + extra
    )


COMPOSE_AGENT = AgentSettings(
    otlp_grpc="0.0.0.0:4317",  # in its container; published on the node's loopback only
    otlp_http="0.0.0.0:4318",
    store_otlp=FleetAddresses().store_otlp("receive-0"),
)
"""The node agent as the compose file runs it."""


def render_fleet(
    rules: str, at: FleetAddresses | None = None, agent: AgentSettings = COMPOSE_AGENT
) -> dict[str, str]:
    """Every file of the fleet stack: relative name -> text (the caller adds the dashboard).

    ``agent.yaml`` is each node's; the compose file runs the store, Grafana and one node's
    agent. ``rules``: the alert rules' file (``async-tee alerts``).
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
        + "".join(
            _service(host, receive_flags(at, host), "    restart: unless-stopped\n")
            for host in at.receivers
        )
        + _service("query", query_flags(at), '    ports: ["10902:10902"]\n')
        + _service("rule", rule_flags(at))
        + GRAFANA_SERVICE
        + "volumes:\n  agent-data: {}\n  thanos-data: {}\n"
    )
    return {
        "agent.yaml": agent_config(agent),
        "hashring.json": hashring(at),
        "rules.yml": rules,
        "compose.yaml": compose,
        "ranks.env": (
            "OTEL_METRICS_EXPORTER=otlp\n"
            "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf\n"
            f"OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:{agent.otlp_http.rsplit(':', 1)[1]}\n"
        ),
        **grafana_files(f"http://{at.query}"),
    }

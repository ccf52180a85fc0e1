"""A session's configuration: one frozen value handed to every part (docs/semantics.md §7)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LauncherRanks:
    """This process's place in its job, as its launcher said, or all None.

    Attributes:
        launcher: The family that said it (``torchrun``, ``slurm``, ``openmpi``,
            ``mpich``), or ``""`` when no launcher variable is set.
        rank: The global rank.
        local_rank: The rank among the processes of this node.
        world_size: How many ranks the job has.
        node_rank: Which node this is.
    """

    launcher: str = ""
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    node_rank: int | None = None


DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318"  # "/v1/metrics" appended
DEFAULT_PROMETHEUS_PORT = 9464
DEFAULT_TRAINER_KEYS = 256
"""Distinct keys a trainer's prefix passes through to ``rl.logged.value`` in a session
(``ASYNC_TEE_TRAINER_KEYS``; docs/semantics.md §13): within the series' attribute-set bound."""
DEFAULT_HELD_TTL_S = 90.0
"""How long a held series' value is exported after it was last logged (``ASYNC_TEE_HELD_TTL``).

Three of NeMo-RL's stall-watchdog ticks (``stall_watchdog.interval_s``, 30 s by default): a
healthy watchdog logs again within about two (its sleep, then an environment check bounded
by one tick), so a third is slack; a watchdog that stopped is out of every export within
1.5 minutes, far inside ``RLTrainerStuck``'s 15 (docs/semantics.md §3g).
"""


@dataclasses.dataclass(frozen=True)
class Settings:
    """The effective configuration; see the constants above for each field's variable."""

    enabled: bool = True
    queue_size: int = 1024
    drain_interval_s: float = 0.05
    shutdown_timeout_s: float = 5.0
    max_attribute_sets: int = 512
    held_ttl_s: float = DEFAULT_HELD_TTL_S
    trainer_keys: int = DEFAULT_TRAINER_KEYS
    flush_signals: tuple[str, ...] = ("TERM",)
    step_export: bool = True
    min_export_interval_s: float = 1.0
    exporters: tuple[str, ...] = ("otlp",)
    otlp_protocol: str = "http/protobuf"  # the OTel specification's default
    otlp_endpoint: str = DEFAULT_HTTP_ENDPOINT + "/v1/metrics"
    otlp_headers: tuple[tuple[str, str], ...] = ()
    otlp_timeout_s: float = 10.0
    otlp_compression: str = "none"
    otlp_insecure: bool | None = None
    otlp_certificate: str = ""
    otlp_client_certificate: str = ""
    otlp_client_key: str = ""
    otlp_proxy: str = ""  # the HTTP(S)_PROXY that applies to the endpoint, not NO_PROXY'd
    export_backlog_bytes: int = 64 * 1024 * 1024
    export_interval_ms: float = 60_000.0
    export_timeout_ms: float = 30_000.0
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int = DEFAULT_PROMETHEUS_PORT
    prometheus_base_port: int | None = DEFAULT_PROMETHEUS_PORT
    resource_attributes: tuple[tuple[str, str | int], ...] = ()
    ranks: LauncherRanks = dataclasses.field(default_factory=LauncherRanks)
    export_ranks: str = "all"

    @property
    def exports_from_this_rank(self) -> bool:
        """Whether ``export_ranks`` lets this process start telemetry.

        No launcher rank counts as rank 0; for ``local0``, no local rank counts as local
        rank 0 only on global rank 0 (or with no rank at all).
        """
        rank, local_rank = self.ranks.rank, self.ranks.local_rank
        if self.export_ranks == "0":
            return rank in (None, 0)
        if self.export_ranks == "local0":
            return local_rank == 0 or (local_rank is None and rank in (None, 0))
        return True

    def describe(self) -> str:
        """One line for the log: headers' values and the endpoint's credentials redacted."""
        fields = dataclasses.asdict(self)
        fields["otlp_headers"] = [name for name, _ in self.otlp_headers]
        fields["otlp_endpoint"] = redact_url(self.otlp_endpoint)
        fields["otlp_proxy"] = redact_url(self.otlp_proxy)
        return " ".join(f"{name}={value!r}" for name, value in fields.items())

    def __repr__(self) -> str:
        return f"Settings({self.describe()})"

    @property
    def secrets(self) -> tuple[str, ...]:
        """The text no log line, figure or repr may show: header values, URL credentials."""
        found = [value for _, value in self.otlp_headers if value]
        for url in (self.otlp_endpoint, self.otlp_proxy):
            userinfo = _userinfo(url)
            if userinfo:
                found += [userinfo, *(part for part in userinfo.split(":") if part)]
        return tuple(sorted(set(found), key=len, reverse=True))


def _userinfo(url: str) -> str:
    """The ``user:password`` of ``scheme://user:password@host...``, or ""."""
    authority = url.split("://", 1)[-1].split("/", 1)[0]
    return authority.rpartition("@")[0]


def redact_url(url: str) -> str:
    """``url`` with its credentials (``user:password@``) shown as ``***@``."""
    userinfo = _userinfo(url)
    return url.replace(f"{userinfo}@", "***@", 1) if userinfo else url

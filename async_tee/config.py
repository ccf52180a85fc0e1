"""Every environment variable async_tee reads, parsed into ``Settings`` (docs/semantics.md §7)."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import socket
import sys
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from async_tee._export.exporters import EXPORTER_KINDS
from async_tee._reporting import warn_once
from async_tee._settings import (
    DEFAULT_GRPC_ENDPOINT,
    DEFAULT_HTTP_ENDPOINT,
    DEFAULT_PROMETHEUS_PORT,
    LauncherRanks,
    redact_url,
)
from async_tee._settings import Settings as Settings

ASYNC_TEE_ENABLED = "ASYNC_TEE_ENABLED"
"""bool, default true: false (``0``, ``false``, ``no``, ``off``) makes everything a no-op."""

ASYNC_TEE_QUEUE_SIZE = "ASYNC_TEE_QUEUE_SIZE"
"""int items, default 1024: the hand-off queue's bound; the oldest dict goes past it."""

ASYNC_TEE_DRAIN_INTERVAL = "ASYNC_TEE_DRAIN_INTERVAL"
"""float seconds, default 0.05: the shortest the worker sleeps between drains (while dicts
arrive it sleeps until ``_worker.WAKE_TARGET`` are due, up to the least time between step
exports)."""

ASYNC_TEE_SHUTDOWN_TIMEOUT = "ASYNC_TEE_SHUTDOWN_TIMEOUT"
"""float seconds, default 5.0: the one deadline for draining and shutting down at exit."""

ASYNC_TEE_MAX_ATTRIBUTE_SETS = "ASYNC_TEE_MAX_ATTRIBUTE_SETS"
"""int, default 512: attribute sets kept per series; later ones are dropped and counted."""

ASYNC_TEE_HELD_TTL = "ASYNC_TEE_HELD_TTL"
"""float seconds, default 90: a held series' attribute set not logged again for this long is
withdrawn from exports until it is logged again (0: held for good; docs/semantics.md §3g)."""

ASYNC_TEE_TRAINER_KEYS = "ASYNC_TEE_TRAINER_KEYS"
"""int, default 256: distinct keys each trainer's prefix passes through to ``rl.logged.value``
in a session; a later new key is counted (``key_limit``) and named once (docs/semantics.md §13)."""

ASYNC_TEE_STEP_EXPORT = "ASYNC_TEE_STEP_EXPORT"
"""bool, default true: export each completed step over OTLP as its own export (a provider
async_tee builds; Prometheus is scraped and keeps its scrape interval)."""

ASYNC_TEE_MIN_EXPORT_INTERVAL = "ASYNC_TEE_MIN_EXPORT_INTERVAL"
"""float seconds, default 1.0: the least time between a step export and the export before
it; faster steps are folded into the next export and counted."""

ASYNC_TEE_RUN_ID = "ASYNC_TEE_RUN_ID"
"""str, default the launcher's job id: the ``rl.run.id`` resource attribute (see
``run_id``), also part of ``service.instance.id``."""

ASYNC_TEE_FLUSH_SIGNALS = "ASYNC_TEE_FLUSH_SIGNALS"
"""comma list of signal names, default ``TERM``: on these, drain and export before the
process goes on dying (``TERM,USR1`` for Slurm's ``--signal``; empty: install nothing)."""

ASYNC_TEE_RANK_ATTRIBUTES = "ASYNC_TEE_RANK_ATTRIBUTES"
"""bool, default true: add the launcher's ranks (``rl.rank``, ``rl.local_rank``, ...) to the
resource (which launcher variables are read: :data:`FAMILIES`)."""

ASYNC_TEE_EXPORT_RANKS = "ASYNC_TEE_EXPORT_RANKS"
"""``all`` (default) | ``0`` | ``local0``: which ranks start telemetry. ``0``: global rank 0
only; ``local0``: local rank 0 of each node. On the others ``start_telemetry`` starts
nothing and the tee stays a no-op. A process with no launcher rank counts as rank 0."""

ASYNC_TEE_EXPORT_BACKLOG_BYTES = "ASYNC_TEE_EXPORT_BACKLOG_BYTES"
"""int bytes, default 67108864 (64 MiB): the OTLP requests kept while the receiver is away,
sent in order when it answers; past it the oldest go, counted (docs/semantics.md §7)."""

ASYNC_TEE_PROMETHEUS_BASE_PORT = "ASYNC_TEE_PROMETHEUS_BASE_PORT"
"""int, default 9464: with no ``OTEL_EXPORTER_PROMETHEUS_PORT``, each local rank serves
Prometheus on this port plus its local rank (0: any free port, for every rank)."""

OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"
OTEL_METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
OTEL_EXPORTER_OTLP_HEADERS = "OTEL_EXPORTER_OTLP_HEADERS"
OTEL_EXPORTER_OTLP_METRICS_HEADERS = "OTEL_EXPORTER_OTLP_METRICS_HEADERS"
OTEL_EXPORTER_OTLP_COMPRESSION = "OTEL_EXPORTER_OTLP_COMPRESSION"
OTEL_EXPORTER_OTLP_METRICS_COMPRESSION = "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION"
OTEL_EXPORTER_OTLP_TIMEOUT = "OTEL_EXPORTER_OTLP_TIMEOUT"
OTEL_EXPORTER_OTLP_METRICS_TIMEOUT = "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT"
OTEL_EXPORTER_OTLP_INSECURE = "OTEL_EXPORTER_OTLP_INSECURE"
OTEL_EXPORTER_OTLP_METRICS_INSECURE = "OTEL_EXPORTER_OTLP_METRICS_INSECURE"
OTEL_EXPORTER_OTLP_CERTIFICATE = "OTEL_EXPORTER_OTLP_CERTIFICATE"
OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE = "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE"
OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"
OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE = "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE"
OTEL_EXPORTER_OTLP_CLIENT_KEY = "OTEL_EXPORTER_OTLP_CLIENT_KEY"
OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY = "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY"
OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE = (
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
)
OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION = (
    "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"
)
OTEL_METRIC_EXPORT_INTERVAL = "OTEL_METRIC_EXPORT_INTERVAL"
OTEL_METRIC_EXPORT_TIMEOUT = "OTEL_METRIC_EXPORT_TIMEOUT"
OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
OTEL_RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
OTEL_EXPORTER_PROMETHEUS_HOST = "OTEL_EXPORTER_PROMETHEUS_HOST"
OTEL_EXPORTER_PROMETHEUS_PORT = "OTEL_EXPORTER_PROMETHEUS_PORT"

RUN_ID_ATTRIBUTE = "rl.run.id"
"""The resource attribute naming the run (``run_id``)."""

EXPORTERS = (*EXPORTER_KINDS, "none")
"""What ``OTEL_METRICS_EXPORTER`` may name: each exporter of the table, or ``none``."""
PROTOCOLS = ("http/protobuf", "grpc")
COMPRESSIONS = ("none", "gzip", "deflate")

# Python's OTLP exporters read the timeout in seconds where the OTel spec says
# milliseconds, so a spec-style "10000" would mean 2.8 hours: a value this large is taken
# as milliseconds, with a warning.
_MILLISECONDS_THRESHOLD = 1000.0

EXPORT_RANKS = ("all", "0", "local0")


_RANK_ATTRIBUTES = (
    ("rank", "rl.rank"),
    ("local_rank", "rl.local_rank"),
    ("world_size", "rl.world_size"),
    ("node_rank", "rl.node_rank"),
    # The names NeMo's own stack (NeMo-Lens) gives the rank and the world size.
    ("rank", "dl.rank"),
    ("world_size", "dl.world_size"),
)
NEMO_RUN_ID_ATTRIBUTE = "nemo.run.id"
"""The run id again under NeMo-Lens's name, so its dashboards' ``nemo_run_id`` finds it."""


def _warn_malformed(name: str, raw: str, default: object) -> None:
    warn_once(
        f"env:{name}",
        "async_tee: ignoring malformed %s=%r; using %r",
        name,
        raw,
        default,
    )


def _bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    _warn_malformed(name, raw, default)
    return default


def _number(
    environ: Mapping[str, str], name: str, default: float, minimum: float, maximum: float
) -> float:
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not minimum <= value <= maximum:
        _warn_malformed(name, raw, default)
        return default
    return value


def _integer(
    environ: Mapping[str, str], name: str, default: int, minimum: int, maximum: int
) -> int:
    value = _number(environ, name, default, minimum, maximum)
    if value != int(value):
        _warn_malformed(name, environ.get(name, ""), default)
        return default
    return int(value)


def _first(environ: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first of ``names`` set to a non-blank value, with that value."""
    for name in names:
        raw = environ.get(name)
        if raw is not None and raw.strip():
            return name, raw.strip()
    return None


def _exporters(environ: Mapping[str, str], default: tuple[str, ...]) -> tuple[str, ...]:
    raw = environ.get(OTEL_METRICS_EXPORTER)
    if raw is None or not raw.strip():
        return default
    names = tuple(dict.fromkeys(part.strip().lower() for part in raw.split(",") if part.strip()))
    unknown = [name for name in names if name not in EXPORTERS]
    if unknown or not names:
        _warn_malformed(OTEL_METRICS_EXPORTER, raw, ",".join(default))
        return default
    return tuple(name for name in names if name != "none") or ("none",)


# Signals a process cannot catch, or that are not about ending it.
_UNFLUSHABLE = frozenset(("KILL", "STOP", "CHLD", "CONT", "WINCH", "URG"))


def _signals(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Signal names without ``SIG`` (``TERM``), from ``ASYNC_TEE_FLUSH_SIGNALS``."""
    raw = environ.get(ASYNC_TEE_FLUSH_SIGNALS)
    if raw is None:
        return ("TERM",)
    names = [part.strip().upper().removeprefix("SIG") for part in raw.split(",") if part.strip()]
    known = {name.removeprefix("SIG") for name in signal.Signals.__members__}
    if any(name not in known or name in _UNFLUSHABLE for name in names):
        _warn_malformed(ASYNC_TEE_FLUSH_SIGNALS, raw, "TERM")
        return ("TERM",)
    return tuple(dict.fromkeys(names))


def _choice(environ: Mapping[str, str], names: tuple[str, ...], allowed: tuple[str, ...]) -> str:
    """The first of ``names`` set, lowercased, if ``allowed``; else ``allowed[0]``."""
    found = _first(environ, *names)
    if found is None:
        return allowed[0]
    name, raw = found
    if raw.lower() not in allowed:
        _warn_malformed(name, raw, allowed[0])
        return allowed[0]
    return raw.lower()


def _protocol(environ: Mapping[str, str]) -> str:
    names = (OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL)
    return _choice(environ, names, PROTOCOLS)


def _endpoint(environ: Mapping[str, str], protocol: str) -> str:
    endpoint = _endpoint_of(environ, protocol)
    chosen = _first(environ, OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL)
    grpc_port = _port_of(DEFAULT_GRPC_ENDPOINT)
    if protocol != "grpc" and chosen is None and _port_of(endpoint) == grpc_port:
        # The Python SDK's otlp exporter defaults to gRPC: its users point at 4317.
        warn_once(
            "env:otlp-grpc-port",
            "async_tee: exporting OTLP/HTTP (the default protocol, as in the OTel "
            "specification) to %s, the OTLP/gRPC port %d: every export will fail. Set "
            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc, or use the collector's OTLP/HTTP port, %d",
            redact_url(endpoint),
            grpc_port,
            _port_of(DEFAULT_HTTP_ENDPOINT),
        )
    return endpoint


def _endpoint_of(environ: Mapping[str, str], protocol: str) -> str:
    specific = _first(environ, OTEL_EXPORTER_OTLP_METRICS_ENDPOINT)
    if specific is not None:
        return specific[1]  # used as is, per the OTel spec
    general = _first(environ, OTEL_EXPORTER_OTLP_ENDPOINT)
    if protocol == "grpc":
        return general[1] if general else DEFAULT_GRPC_ENDPOINT
    base = general[1] if general else DEFAULT_HTTP_ENDPOINT
    return base.rstrip("/") + "/v1/metrics"


def _port_of(url: str) -> int | None:
    try:
        return urlsplit(url.strip()).port
    except ValueError:
        return None


def _headers(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    found = _first(environ, OTEL_EXPORTER_OTLP_METRICS_HEADERS, OTEL_EXPORTER_OTLP_HEADERS)
    if found is None:
        return ()
    name, raw = found
    headers = []
    for part in raw.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            _warn_malformed(name, "<redacted>", "no headers")
            return ()
        headers.append((unquote(key.strip()).lower(), unquote(value.strip())))
    return tuple(headers)


def _timeout(environ: Mapping[str, str]) -> float:
    found = _first(environ, OTEL_EXPORTER_OTLP_METRICS_TIMEOUT, OTEL_EXPORTER_OTLP_TIMEOUT)
    if found is None:
        return 10.0
    name, raw = found
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        _warn_malformed(name, raw, 10.0)
        return 10.0
    if value >= _MILLISECONDS_THRESHOLD:
        warn_once(
            f"env:{name}:ms",
            "async_tee: %s=%s looks like milliseconds (the OTel spec's unit; Python's "
            "exporters read seconds): using %.3f s",
            name,
            raw,
            value / 1000.0,
        )
        return value / 1000.0
    return value


def _compression(environ: Mapping[str, str]) -> str:
    names = (OTEL_EXPORTER_OTLP_METRICS_COMPRESSION, OTEL_EXPORTER_OTLP_COMPRESSION)
    return _choice(environ, names, COMPRESSIONS)


def _insecure(environ: Mapping[str, str]) -> bool | None:
    """The first non-blank insecure flag; None (decided by the endpoint's scheme) if none."""
    found = _first(environ, OTEL_EXPORTER_OTLP_METRICS_INSECURE, OTEL_EXPORTER_OTLP_INSECURE)
    return None if found is None else _bool(environ, found[0], False)


def _path(environ: Mapping[str, str], *names: str) -> str:
    """The first non-blank of ``names`` (a file's path), or ""."""
    found = _first(environ, *names)
    return found[1] if found else ""


def _proxy(environ: Mapping[str, str], endpoint: str) -> str:
    """The proxy ``http_proxy``/``https_proxy`` give the endpoint's scheme, or "".

    Unless ``no_proxy`` exempts its host; read as the standard library reads them, lower
    case first.
    """
    try:
        url = urlsplit(endpoint)
    except ValueError:
        return ""
    scheme = url.scheme.lower()
    proxy = next(
        (environ[n] for n in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY") if environ.get(n)),
        "",
    )
    no_proxy = next((environ[n] for n in ("no_proxy", "NO_PROXY") if environ.get(n)), "")
    host = url.hostname or ""
    if not proxy or _bypassed(host, no_proxy):
        return ""
    return proxy if "://" in proxy else f"http://{proxy}"


def _bypassed(host: str, no_proxy: str) -> bool:
    """Whether ``no_proxy`` (``*``, or hosts and domains, comma-separated) names ``host``."""
    host = host.lower()
    for entry in no_proxy.lower().split(","):
        entry = entry.strip().lstrip(".")
        entry = entry.rpartition(":")[0] if entry.count(":") == 1 else entry  # host:port
        if entry == "*" or (entry and (host == entry or host.endswith("." + entry))):
            return True
    return False


def _warn_unapplied(environ: Mapping[str, str]) -> None:
    """Warn once about a variable the OTel SDK reads and async_tee's OTLP does not apply."""
    unapplied = (
        (OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, "cumulative"),
        (OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION, "explicit_bucket_histogram"),
        ("ASYNC_TEE_ENCODER", "tables"),
    )
    for name, sent in unapplied:
        raw = environ.get(name, "").strip().lower()
        if raw and raw != sent:
            warn_once(
                f"env:{name}",
                "async_tee: %s=%s is not applied: async_tee's OTLP requests are built from its "
                "own tables, %s (what Prometheus stores)",
                name,
                raw,
                sent.replace("_", " "),
            )


def _start_ticks(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot (Linux), or "" if unknown.

    With the pid it names one process incarnation: a pid reused later has another value.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # Field 22; the command name (field 2) may hold spaces, so split after its ")".
            return stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError, ValueError):
        return ""


def run_id(environ: Mapping[str, str], *, starts_ranks: bool = False) -> str:
    """The run's identity (``rl.run.id``): the first found of the four sources below.

    1. ``ASYNC_TEE_RUN_ID``;
    2. ``TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv-id``; its placeholder ``none`` is skipped);
    3. ``SLURM_JOB_ID``, with ``_<SLURM_ARRAY_TASK_ID>`` for an array task;
    4. else a local id, ``local-<host>-<pid>-<start ticks>``: of the launcher (the parent
       process) when a rank variable says a launcher started this process, so the ranks it
       started on one node share it, followed by the job's rendezvous (``-<MASTER_ADDR>:
       <MASTER_PORT>``, else ``-<PMIX_NAMESPACE>``) when the launcher set one, so two jobs
       whose ranks one process started stay apart; of this process otherwise. Another job,
       or the same command run again, gets another one, so two jobs are never merged.

    ``starts_ranks``: this process is itself the launcher of its node's other ranks (rank 0
    of Lightning's own ``ddp`` launcher, which runs the script and starts local ranks 1.. as
    its children): its local id is its own, with the rendezvous, as its children name it.
    """
    explicit = _first(environ, ASYNC_TEE_RUN_ID)
    if explicit is not None:
        return explicit[1]
    elastic = _first(environ, "TORCHELASTIC_RUN_ID")
    if elastic is not None and elastic[1].lower() != "none":
        return elastic[1]
    slurm = _first(environ, "SLURM_JOB_ID")
    if slurm is not None:
        task = _first(environ, "SLURM_ARRAY_TASK_ID")
        return slurm[1] if task is None else f"{slurm[1]}_{task[1]}"
    ranks = launcher_ranks(environ)
    launched = ranks.rank is not None or ranks.local_rank is not None
    pid = os.getppid() if launched and not starts_ranks else os.getpid()
    ticks = _start_ticks(pid)
    local = f"local-{socket.gethostname()}-{pid}" + (f"-{ticks}" if ticks else "")
    rendezvous = _rendezvous(environ) if launched or starts_ranks else None
    return local if rendezvous is None else f"{local}-{rendezvous}"


def _rendezvous(environ: Mapping[str, str]) -> str | None:
    """Where one job's ranks meet, which two jobs running at once cannot share, or None.

    torchrun-style launches: ``MASTER_ADDR:MASTER_PORT`` (one listening port per job); PMIx
    launches (Open MPI, ``srun --mpi=pmix``): the job's ``PMIX_NAMESPACE``.
    """
    addr, port = _first(environ, "MASTER_ADDR"), _first(environ, "MASTER_PORT")
    if addr is not None and port is not None:
        return f"{addr[1]}:{port[1]}"
    namespace = _first(environ, "PMIX_NAMESPACE")
    return None if namespace is None else namespace[1]


def _resource_attributes(
    environ: Mapping[str, str], launched: LauncherRanks | None
) -> tuple[tuple[str, str | int], ...]:
    """The resource: ``OTEL_*``'s attributes, the launcher's ranks (None: left out), the ids."""
    attributes: dict[str, str | int] = {}
    raw = environ.get(OTEL_RESOURCE_ATTRIBUTES, "")
    for part in raw.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            _warn_malformed(OTEL_RESOURCE_ATTRIBUTES, raw, "the well-formed pairs only")
            continue
        attributes[unquote(key.strip())] = unquote(value.strip())
    service = _first(environ, OTEL_SERVICE_NAME)
    if service is not None:
        attributes["service.name"] = service[1]
    if launched is not None:
        for field, attribute in _RANK_ATTRIBUTES:
            value = getattr(launched, field)
            if value is not None and attribute not in attributes:
                attributes[attribute] = value
    attributes.setdefault("service.name", default_service_name())
    # One identity per (run, rank): two jobs on a host never share one, and a rank
    # restarted within its job continues its own series rather than starting a new
    # random one (unbounded cardinality across restarts in a backend that keeps them).
    run = str(attributes.setdefault(RUN_ID_ATTRIBUTE, run_id(environ)))
    attributes.setdefault(NEMO_RUN_ID_ATTRIBUTE, run)
    host = str(attributes.setdefault("host.name", socket.gethostname()))
    if "rl.rank" in attributes:
        instance = f"{run}/rank-{attributes['rl.rank']}"
    else:
        instance = f"{run}/{host}/pid-{os.getpid()}"
    attributes.setdefault("service.instance.id", instance)
    return tuple(
        (_utf8(key), _utf8(value) if isinstance(value, str) else value)
        for key, value in attributes.items()
    )


def default_service_name() -> str:
    """``service.name`` when neither ``OTEL_SERVICE_NAME`` nor the resource sets one.

    The training script's name without its suffix (``run_grpo_math`` for ``python
    examples/run_grpo_math.py``), as the job is known on the launcher's command line; the
    OTel SDK's ``unknown_service`` when there is no script (``python -c``, a REPL). For
    ``python -m package``, the package's name.
    """
    script = sys.argv[0] if sys.argv else ""
    stem = os.path.splitext(os.path.basename(script))[0]
    if stem == "__main__":  # python -m package: the package's name
        stem = os.path.basename(os.path.dirname(script))
    return stem if stem and stem not in ("-c", "-m", "-") else "unknown_service"


def _utf8(text: str) -> str:
    """``text`` with what has no UTF-8 form (a lone surrogate from the environment) escaped."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _export_ranks(environ: Mapping[str, str]) -> str:
    return _choice(environ, (ASYNC_TEE_EXPORT_RANKS,), EXPORT_RANKS)


def _prometheus_ports(environ: Mapping[str, str], ranks: LauncherRanks) -> tuple[int, int | None]:
    """``(port to serve on, the base it came from)``; the base is None for an explicit port.

    ``OTEL_EXPORTER_PROMETHEUS_PORT`` is this process's port, as OTel means it (a wrapper
    that sets it per rank keeps its ports). Without it, each local rank serves on
    ``ASYNC_TEE_PROMETHEUS_BASE_PORT + local rank``; a base of 0 means any free port.
    """
    explicit = _first(environ, OTEL_EXPORTER_PROMETHEUS_PORT)
    if explicit is not None:
        if explicit[1].isdigit() and int(explicit[1]) <= 65535:
            return int(explicit[1]), None
        # Ignored, as if it were not set: the per-rank rule below applies.
        _warn_malformed(OTEL_EXPORTER_PROMETHEUS_PORT, explicit[1], "the base port + local rank")
    base = _integer(environ, ASYNC_TEE_PROMETHEUS_BASE_PORT, DEFAULT_PROMETHEUS_PORT, 0, 65535)
    # Past 65535 the port is out of range: the exporter reports it cannot start.
    return (base + (ranks.local_rank or 0) if base else 0), base


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read every variable from ``environ`` (``os.environ`` by default). Never raises."""
    env = os.environ if environ is None else environ
    defaults = Settings()
    enabled = _bool(env, ASYNC_TEE_ENABLED, True) and not _bool(env, OTEL_SDK_DISABLED, False)
    protocol = _protocol(env)
    endpoint = _endpoint(env, protocol)
    _warn_unapplied(env)
    ranks = launcher_ranks(env)
    prometheus_port, prometheus_base_port = _prometheus_ports(env, ranks)
    return Settings(
        enabled=enabled,
        queue_size=_integer(env, ASYNC_TEE_QUEUE_SIZE, defaults.queue_size, 1, 1_000_000),
        drain_interval_s=_number(
            env, ASYNC_TEE_DRAIN_INTERVAL, defaults.drain_interval_s, 0.001, 60.0
        ),
        shutdown_timeout_s=_number(
            env, ASYNC_TEE_SHUTDOWN_TIMEOUT, defaults.shutdown_timeout_s, 0.0, 600.0
        ),
        max_attribute_sets=_integer(
            env, ASYNC_TEE_MAX_ATTRIBUTE_SETS, defaults.max_attribute_sets, 1, 100_000
        ),
        held_ttl_s=_number(env, ASYNC_TEE_HELD_TTL, defaults.held_ttl_s, 0.0, 86_400.0),
        trainer_keys=_integer(env, ASYNC_TEE_TRAINER_KEYS, defaults.trainer_keys, 0, 100_000),
        flush_signals=_signals(env),
        step_export=_bool(env, ASYNC_TEE_STEP_EXPORT, defaults.step_export),
        min_export_interval_s=_number(
            env, ASYNC_TEE_MIN_EXPORT_INTERVAL, defaults.min_export_interval_s, 0.0, 3600.0
        ),
        exporters=_exporters(env, defaults.exporters),
        otlp_protocol=protocol,
        otlp_endpoint=endpoint,
        otlp_headers=_headers(env),
        otlp_timeout_s=_timeout(env),
        otlp_compression=_compression(env),
        otlp_insecure=_insecure(env),
        otlp_certificate=_path(
            env, OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE, OTEL_EXPORTER_OTLP_CERTIFICATE
        ),
        otlp_client_certificate=_path(
            env,
            OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE,
            OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE,
        ),
        otlp_client_key=_path(
            env, OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY, OTEL_EXPORTER_OTLP_CLIENT_KEY
        ),
        otlp_proxy=_proxy(env, endpoint) if protocol != "grpc" else "",
        export_backlog_bytes=_integer(
            env, ASYNC_TEE_EXPORT_BACKLOG_BYTES, defaults.export_backlog_bytes, 1, 2**40
        ),
        export_interval_ms=_number(
            env, OTEL_METRIC_EXPORT_INTERVAL, defaults.export_interval_ms, 1.0, 86_400_000.0
        ),
        export_timeout_ms=_number(
            env, OTEL_METRIC_EXPORT_TIMEOUT, defaults.export_timeout_ms, 1.0, 86_400_000.0
        ),
        prometheus_host=(_first(env, OTEL_EXPORTER_PROMETHEUS_HOST) or ("", "127.0.0.1"))[1],
        prometheus_port=prometheus_port,
        prometheus_base_port=prometheus_base_port,
        resource_attributes=_resource_attributes(
            env, ranks if _bool(env, ASYNC_TEE_RANK_ATTRIBUTES, True) else None
        ),
        ranks=ranks,
        export_ranks=_export_ranks(env),
    )


# Which rank this process is: one launcher family answers for all four numbers, the first
# in FAMILIES' order that sets any of its variables to a whole number. Families nest
# (torchrun under srun sees both), so they are never mixed and an explicit RANK wins (§10).
# (family, rank, local rank, world size, node rank variables in order of preference)
FAMILIES: tuple[tuple[str, str, str, str, tuple[str, ...]], ...] = (
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE", ("GROUP_RANK", "NODE_RANK")),
    ("slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", ("SLURM_NODEID",)),
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_SIZE",
        ("OMPI_COMM_WORLD_NODE_RANK",),
    ),
    ("mpich", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", ()),
)
"""Each launcher family's variables, in the order the families are asked."""


def _whole(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def launcher_ranks(environ: Mapping[str, str]) -> LauncherRanks:
    """The ranks the first family with a whole-number variable sets. Never raises."""
    for family, rank, local_rank, world_size, node_ranks in FAMILIES:
        node = next(
            (n for n in (_whole(environ, name) for name in node_ranks) if n is not None), None
        )
        found = LauncherRanks(
            family,
            _whole(environ, rank),
            _whole(environ, local_rank),
            _whole(environ, world_size),
            node,
        )
        if dataclasses.astuple(found)[1:] != (None, None, None, None):
            return found
    return LauncherRanks()

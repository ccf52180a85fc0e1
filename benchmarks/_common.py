"""What every benchmark script shares: the fixture, statistics, processes, output.

- **Fixture**: the sync-GRPO step in ``tests/fixtures/grpo_step.json``; the 68-key ``train``
  dict is the one every caller-latency figure times.
- **Statistics**: samples are integer nanoseconds folded into an exact histogram
  (``Counter``); percentiles are nearest-rank, never interpolated, never means. A latency
  curve is kept as ``CURVE_POINTS`` quantiles whose levels crowd into the tail (the
  distance to 1 is log-spaced), so the JSON stays small and the plot still shows p99.99.
- **Receiver**: a real ``OtlpSink`` in another process (``_receiver.py``), so decoding
  exports never takes this process's GIL; ``--stall`` makes every export hang.
- **Session**: the real ``start_telemetry`` exporting over OTLP/HTTP every
  ``EXPORT_INTERVAL_MS`` with a 1 s exporter timeout; the threads it reports
  (``Pipeline.threads``) are timed and joined, after a bounded shutdown and
  ``testing.reset`` so the next block starts clean.
- **Interleaving**: ``rotated`` gives each round's order; rounds rotate so that no variant
  always runs first or last while the machine drifts.
- **Output**: machine info (platform, CPU, versions, commit), JSON and markdown writers
  (to a temp dir unless ``--out`` says otherwise: ``run_all.py`` merges every part into
  ``results/latest.json``), and table formatting shared by the scripts and ``run_all.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from statistics import median
from typing import Any, TypeVar

import async_tee
from async_tee import testing

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FIXTURE = ROOT / "tests" / "fixtures" / "grpo_step.json"
RECEIVER = HERE / "_receiver.py"
RESULTS = HERE / "results"

EXPORT_INTERVAL_MS = 1000
OTLP_TIMEOUT_S = 1
SHUTDOWN_S = 2.0
PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("p99.9", 0.999))
# Shares of calls slower than these: the tails come from rare events at a steady rate per
# second, so whether p99.9 lands on them depends on how many calls a second there are.
OVER_US = (5, 30, 1000)
CURVE_POINTS = 200
CURVE_TAIL_DECADES = 5  # the last level is 1 - 10**-5
VERSIONED_PACKAGES = (
    "async_tee",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-grpc",
    "grpcio",
    "protobuf",
    "janus",
    "mlflow-skinny",
    "tensorboardX",
    "matplotlib",
)

T = TypeVar("T")

# ------------------------------------------------------------------ fixture


def fixture_calls() -> list[tuple[str, dict[str, Any]]]:
    """The fixture's ``log_metrics`` calls, in order, as ``(prefix, metrics)``."""
    calls = json.loads(FIXTURE.read_text())["calls"]
    return [(call["prefix"], dict(call["metrics"])) for call in calls]


def find_call(prefix: str, keys: int | None = None) -> dict[str, Any]:
    """The first fixture call with ``prefix`` (and ``keys`` keys, if given)."""
    for call_prefix, metrics in fixture_calls():
        if call_prefix == prefix and (keys is None or len(metrics) == keys):
            return metrics
    raise SystemExit(f"{FIXTURE}: no {prefix!r} call with {keys} keys")


def load_train_dict() -> dict[str, Any]:
    """The fixture's ``train`` call with 68 keys: the dict every latency figure times."""
    return find_call("train", 68)


# ------------------------------------------------------------------ statistics


def percentiles(hist: Counter[int]) -> dict[str, float]:
    """Nearest-rank percentiles and max (µs) of an exact histogram of nanosecond samples."""
    total = sum(hist.values())
    pending = sorted(
        ((name, max(1, math.ceil(q * total))) for name, q in PERCENTILES), key=lambda p: p[1]
    )
    out: dict[str, float] = {}
    seen = 0
    values = sorted(hist.items())
    for value, count in values:
        seen += count
        while pending and pending[0][1] <= seen:
            out[pending.pop(0)[0]] = value / 1000
    out["max"] = values[-1][0] / 1000
    return {name: out[name] for name, _ in (*PERCENTILES, ("max", 1))}


def share_over(hist: Counter[int]) -> dict[str, float]:
    """Percentage of samples slower than each of ``OVER_US``."""
    total = sum(hist.values())
    return {
        f">{limit}us": 100 * sum(c for v, c in hist.items() if v > limit * 1000) / total
        for limit in OVER_US
    }


def curve_levels(points: int = CURVE_POINTS) -> list[float]:
    """Quantile levels from 0 to ``1 - 10**-CURVE_TAIL_DECADES``, log-spaced towards 1."""
    step = CURVE_TAIL_DECADES / (points - 1)
    return [1 - 10 ** (-i * step) for i in range(points)]


def quantile_curve(hist: Counter[int], points: int = CURVE_POINTS) -> dict[str, list[float]]:
    """``points`` nearest-rank quantiles (µs) of a histogram, for a latency plot."""
    total = sum(hist.values())
    levels = curve_levels(points)
    ranks = [max(1, math.ceil(q * total)) for q in levels]
    values: list[float] = []
    seen = 0
    items = iter(sorted(hist.items()))
    value = 0
    for rank in ranks:
        while seen < rank:
            value, count = next(items)
            seen += count
        values.append(value / 1000)
    return {"q": [round(q, 7) for q in levels], "us": values}


def histogram_summary(hists: Sequence[Counter[int]]) -> dict[str, Any]:
    """Pooled percentiles, tail shares and curve, plus the median of the per-block p50s."""
    pooled: Counter[int] = Counter()
    for hist in hists:
        pooled.update(hist)
    block_p50s = [percentiles(hist)["p50"] for hist in hists]
    return {
        "n": sum(pooled.values()),
        "blocks": len(hists),
        "us": percentiles(pooled),
        "pct_calls_over": share_over(pooled),
        "block_p50_us": block_p50s,
        "median_block_p50_us": median(block_p50s),
        "curve": quantile_curve(pooled),
    }


def rotated(items: Sequence[T], round_: int, rounds: int) -> list[T]:
    """``items`` rotated for round ``round_`` of ``rounds``: each starts first once."""
    shift = round_ * len(items) // max(1, rounds)
    return [*items[shift:], *items[:shift]]


# ------------------------------------------------------------------ processes and threads


class Receiver:
    """An ``OtlpSink`` in a child process (``_receiver.py``); stops when its stdin closes."""

    def __init__(self, stall: bool = False) -> None:
        command = [sys.executable, str(RECEIVER), *(["--stall"] if stall else [])]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        ports = line.split()
        if len(ports) != 2 or not all(port.isdigit() for port in ports):
            self.close()
            raise RuntimeError(f"receiver did not start (printed {line!r})")
        self.grpc_port, self.http_port = int(ports[0]), int(ports[1])
        self.port = self.http_port  # the default protocol's (OTLP/HTTP)

    def close(self) -> None:
        """Close its stdin and wait for it to exit; kill it after 5 s."""
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_receiver(stack: contextlib.ExitStack, stall: bool = False) -> Receiver:
    """A receiver closed when ``stack`` unwinds."""
    receiver = Receiver(stall=stall)
    stack.callback(receiver.close)
    return receiver


def otlp_environ(port: int) -> dict[str, str]:
    """The exporter settings, passed to ``start_telemetry(environ=...)``."""
    return {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": str(OTLP_TIMEOUT_S),
        "OTEL_METRIC_EXPORT_INTERVAL": str(EXPORT_INTERVAL_MS),
    }


def thread_cpu_ns(thread: threading.Thread) -> int | None:
    """CPU time of a live thread, or None where the platform cannot tell."""
    try:
        return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))  # type: ignore[arg-type]
    except (AttributeError, OSError, TypeError):
        return None


def rss_bytes() -> int:
    """This process's resident set size (``VmRSS`` in ``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


@dataclass
class Session:
    """A running session: its ``Pipeline``, the threads it started, and what teardown saw.

    ``threads`` is ``handle.threads`` (the worker, the exporting thread, any server)
    as the session reported them when it started, so teardown joins exactly those.
    """

    handle: async_tee.Pipeline
    threads: list[threading.Thread]
    info: dict[str, Any] = field(default_factory=dict)

    def thread(self, name: str) -> threading.Thread | None:
        """The session's thread called ``name``, if it started one."""
        return next((t for t in self.threads if t.name == name), None)


@contextlib.contextmanager
def pipeline(port: int, queue_size: int | None = None) -> Iterator[Session]:
    """The real pipeline exporting to ``port``; shut down, joined and reset afterwards."""
    handle = async_tee.start_telemetry(environ=otlp_environ(port), queue_size=queue_size)
    if not isinstance(handle, async_tee.Pipeline) or not handle.is_exporting:
        raise RuntimeError("start_telemetry did not start exporting")
    running = Session(handle, handle.threads)
    try:
        yield running
    finally:
        started = time.perf_counter()
        running.info["shutdown_ok"] = async_tee.shutdown_telemetry(SHUTDOWN_S)
        running.info["shutdown_s"] = time.perf_counter() - started
        for thread in running.threads:  # let the exporter's thread end before the next block
            thread.join(max(0.0, started + 3 * SHUTDOWN_S - time.perf_counter()))
        running.info["threads_left"] = [t.name for t in running.threads if t.is_alive()]
        testing.reset(SHUTDOWN_S)


def quiet_logging() -> None:
    """Export failures are expected against stalled receivers: keep stderr readable."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)


def progress(message: str) -> None:
    """One progress line on stderr (stdout carries the report)."""
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ machine and versions


def source_revision() -> dict[str, Any]:
    """The git commit measured, and whether ``async_tee/`` differs from it (read-only git)."""

    def git(*command: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *command], cwd=ROOT, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    changes = git("status", "--porcelain", "--", "async_tee")
    return {"commit": git("rev-parse", "HEAD"), "async_tee_modified": bool(changes)}


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (empty where there is none)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""


def package_versions(packages: Iterable[str] = VERSIONED_PACKAGES) -> dict[str, str | None]:
    """Installed versions (None where a package is missing)."""
    versions: dict[str, str | None] = {}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def machine_info() -> dict[str, Any]:
    """Platform, Python, CPUs, the versions that matter and the commit measured."""
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "switch_interval_s": sys.getswitchinterval(),
        "versions": package_versions(),
        "source": source_revision(),
    }


def machine_line(machine: dict[str, Any]) -> str:
    """One markdown sentence: platform, CPUs, versions present, commit."""
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items() if v)
    modified = " (async_tee/ modified)" if machine["source"]["async_tee_modified"] else ""
    return (
        f"{machine['platform']}, Python {machine['python']}, {machine['cpu_count']} CPUs "
        f"({machine['cpu_model']}); {versions}; commit {machine['source']['commit']}"
        f"{modified}."
    )


# ------------------------------------------------------------------ output


def fmt(value: float | None) -> str:
    """A time or size in a table: three decimals below 10, one above."""
    if value is None:
        return ""
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def fmt_opt(value: float | None, spec: str = ".0f", missing: str = "") -> str:
    """A figure formatted with ``spec``, or ``missing`` where there is none."""
    return missing if value is None else format(value, spec)


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table as lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def text_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A plain-text table as lines: first column left-aligned, the rest right-aligned."""
    table = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return [
        "  ".join(
            [row[0].ljust(widths[0])]
            + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        )
        for row in table
    ]


def markdown_page(title: str, machine: dict[str, Any], lines: Sequence[str]) -> str:
    """A part's markdown page: title, machine line, then its section."""
    return "\n".join([f"# {title}", "", machine_line(machine), "", *lines]) + "\n"


def bench_parser(doc: str) -> argparse.ArgumentParser:
    """A script's parser with the options every part takes: ``--quick`` and ``--out``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, no figure to trust")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (markdown beside)")
    return parser


def parse_bench_args(
    parser: argparse.ArgumentParser, name: str, argv: list[str] | None
) -> argparse.Namespace:
    """Parse, and default ``--out`` to ``<name>.json`` in a fresh temp dir."""
    args = parser.parse_args(argv)
    args.out = args.out or Path(tempfile.mkdtemp(prefix="async-tee-bench-")) / f"{name}.json"
    return args


def publish(
    out: Path, report: dict[str, Any], title: str, section: Sequence[str], console: Sequence[str]
) -> None:
    """Print ``console``; write ``out`` (JSON) and its markdown page beside it (``.md``)."""
    print("\n" + "\n".join(console))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown_page(title, report["machine"], section))
    print(f"\nwrote {out} and {out.with_suffix('.md')}")
    print(f"{Path(sys.argv[0]).stem} took {report['duration_s']:.0f} s")

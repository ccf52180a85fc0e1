"""The ``async-tee`` command line: ``sink``, ``demo``, ``catalog``, ``dashboard``, ``alerts``."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

__all__ = ["main"]

_POLL_S = 0.5  # how often the sink's foreground loop re-checks for a stop request


def _bounded(
    convert: Callable[[str], float], low: float, high: float, expected: str
) -> Callable[[str], Any]:
    """An argparse ``type``: ``convert`` the text, and refuse what falls outside [low, high]."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{expected}: {text!r}")
        return value

    return parse


_port = _bounded(int, 0, 65535, "not a TCP port (0-65535)")
_positive_int = _bounded(int, 1, math.inf, "must be an integer >= 1")
_seconds = _bounded(float, 0, 3600, "must be a number of seconds in [0, 3600]")


def _parser() -> argparse.ArgumentParser:
    from async_tee import __version__

    parser = argparse.ArgumentParser(
        prog="async-tee",
        description="Mirror an RL trainer's metric dicts into OpenTelemetry, off the hot path.",
    )
    parser.add_argument("--version", action="version", version=f"async_tee {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sink = commands.add_parser(
        "sink",
        help="run an OTLP metrics receiver and print every point it receives",
        description="Receive OTLP metrics over gRPC and HTTP and print one line per data "
        "point, until Ctrl-C or SIGTERM. Port 0 picks a free port; the first line says "
        "which.",
    )
    sink.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    sink.add_argument("--grpc-port", type=_port, default=4317, help="default: %(default)s")
    sink.add_argument("--http-port", type=_port, default=4318, help="default: %(default)s")
    sink.add_argument("--quiet", action="store_true", help="do not print the points")
    sink.add_argument(
        "--json",
        action="store_true",
        help="print each point as one JSON object per line (JSON Lines) on stdout; the "
        "banner and the stop line go to stderr",
    )
    sink.set_defaults(handler=_run_sink)

    demo = commands.add_parser(
        "demo",
        help="simulate a GRPO run, export it over OTLP, and report what arrived and its cost",
        description="Simulate a GRPO training run logged through async_tee.Logger, export "
        "it over OTLP/HTTP to an embedded sink (or to OTEL_EXPORTER_OTLP_ENDPOINT when set), "
        "and report the series received and the caller-side cost. Progress, and async_tee's "
        "INFO log lines (the effective configuration), go to stderr.",
    )
    demo.add_argument("--steps", type=_positive_int, default=20, help="default: %(default)s")
    demo.add_argument(
        "--step-seconds",
        type=_seconds,
        default=0.5,
        help="simulated work per step (default: %(default)s)",
    )
    demo.add_argument(
        "--stall",
        action="store_true",
        help="stall the embedded sink: nothing arrives, and training keeps its pace",
    )
    demo.add_argument(
        "--quiet",
        action="store_true",
        help="no progress lines and no async_tee INFO lines (the effective configuration, "
        "where it exports) on stderr; warnings still show",
    )
    demo.add_argument("--json", action="store_true", help="print the result as JSON")
    demo.add_argument("--jsonl", metavar="PATH", help="keep the JSONL backend's file here")
    demo.set_defaults(handler=_run_demo)

    catalog = commands.add_parser(
        "catalog",
        help="list every series async_tee exports, with its Prometheus name",
        description="List every declared series: OTel name, Prometheus name, kind, unit, "
        "attributes, the logger key it reads, and its description.",
    )
    catalog.add_argument("--json", action="store_true", help="print JSON instead of a table")
    catalog.set_defaults(handler=_run_catalog)

    dashboard = commands.add_parser(
        "dashboard",
        help="write a Grafana dashboard (JSON) with a panel for every series",
        description="Generate a Grafana dashboard from the series catalog: one panel per "
        "series, queried on Prometheus with job, run, instance and rank variables. Needs "
        "pip install '.[dashboard]' from a checkout (Python >= 3.11).",
    )
    dashboard.add_argument(
        "--datasource",
        default="prometheus",
        help="the Prometheus data source's name or uid (default: %(default)s)",
    )
    dashboard.add_argument("--output", metavar="PATH", help="write here instead of stdout")
    dashboard.set_defaults(handler=_run_dashboard)

    alerts = commands.add_parser(
        "alerts",
        help="write Prometheus alert rules (YAML) for a training job",
        description="Generate a Prometheus rules file from the series catalog: a stuck "
        "trainer, a run with no first step, a rank gone, non-finite values, a straggler, and "
        "async_tee's own failures. Durations take 300, 300s, 5m or 2h.",
    )
    alerts.add_argument("--output", metavar="PATH", help="write here instead of stdout")
    defaults = _alert_defaults()
    for flag, dest, kind, what in _ALERT_FLAGS:
        alerts.add_argument(
            flag,
            dest=dest,
            type=kind,
            default=getattr(defaults, dest),
            help=f"{what} (default: %(default)s)",
        )
    alerts.set_defaults(handler=_run_alerts)

    stack = commands.add_parser(
        "stack",
        help="write a runnable stack: Collector(s), the store, alert rules, dashboard, compose",
        description="Write the configs for one path from the ranks to Prometheus, with the "
        "alert rules loaded and the dashboard provisioned, and a compose file naming the "
        "official images. Paths: scrape (Prometheus scrapes each rank), collector (OTLP -> "
        "Collector's prometheus exporter <- scrape), remote-write (OTLP -> Collector -> "
        "remote write), otlp (OTLP/HTTP -> Prometheus 3's OTLP receiver), fleet (OTLP -> "
        "a Collector agent per node -> Thanos Receive, read through Thanos Query).",
    )
    stack.add_argument("--output", metavar="DIR", required=True, help="the folder to write")
    stack.add_argument(
        "--path",
        default="remote-write",
        choices=("scrape", "collector", "remote-write", "otlp", "fleet"),
        help="how the ranks' series reach Prometheus (default: %(default)s)",
    )
    stack.set_defaults(handler=_run_stack)
    return parser


def _alert_defaults() -> Any:
    from async_tee.alerts import AlertThresholds

    return AlertThresholds()


def _duration(text: str) -> float:
    from async_tee.alerts import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


_fraction = _bounded(float, 0, 1, "must be a fraction in (0, 1]")
_non_negative = _bounded(float, 0, math.inf, "must be a number >= 0")
_ALERT_FLAGS = (
    ("--stuck-after", "stuck_after_s", _duration, "no step completed for this long"),
    ("--rollout-idle-after", "rollout_idle_s", _duration, "NeMo-RL's watchdog idle this long"),
    ("--first-step-within", "first_step_within_s", _duration, "start-up allowance"),
    ("--straggler-steps", "straggler_steps", _positive_int, "steps behind the run's furthest"),
    ("--queue-full", "queue_full_fraction", _fraction, "queue fill that warns"),
    ("--lag-p99-ms", "lag_p99_ms", _non_negative, "tee-to-record p99 lag that warns"),
    ("--rank-gone-window", "rank_gone_window_s", _duration, "how far back a rank counts"),
    (
        "--rank-silent-after",
        "rank_silent_s",
        _duration,
        "no sample this long: not current (exports, watchdog)",
    ),
    ("--window", "window_s", _duration, "window of the counters' increase"),
    ("--for-multiplier", "for_multiplier", _non_negative, "scales every rule's for:"),
)


def _run_alerts(args: argparse.Namespace) -> int:
    from async_tee.alerts import AlertThresholds, alert_rules, render_rules

    try:
        thresholds = AlertThresholds(
            **{dest: getattr(args, dest) for _, dest, _, _ in _ALERT_FLAGS}
        )
    except ValueError as exc:
        print(f"async-tee alerts: {exc}", file=sys.stderr)
        return 2
    text = render_rules(thresholds)
    if args.output is None:
        print(text, end="")
        return 0
    with open(args.output, "w", encoding="utf-8") as out:
        out.write(text)
    print(f"async-tee alerts: wrote {len(alert_rules(thresholds))} rules to {args.output}")
    return 0


def _run_stack(args: argparse.Namespace) -> int:
    from async_tee.stack import render_stack

    try:
        from async_tee.dashboard import render_dashboard

        dashboard: str | None = render_dashboard()
    except ImportError as exc:  # the dashboard's extra is missing: the rest still runs
        print(f"async-tee stack: no dashboard.json ({exc})", file=sys.stderr)
        dashboard = None
    if args.path == "fleet":
        from async_tee.stack.fleet import render_fleet

        files = render_fleet(dashboard=dashboard)
    else:
        files = render_stack(args.path, dashboard=dashboard)
    for name, text in files.items():
        target = os.path.join(args.output, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as out:
            out.write(text)
    print(
        f"async-tee stack: wrote {len(files)} files for the {args.path} path to {args.output}; "
        f"docker compose up there, and start each rank with the variables in ranks.env"
    )
    return 0


def _run_catalog(args: argparse.Namespace) -> int:
    from async_tee.catalog import render_catalog, series_catalog

    print(render_catalog(series_catalog(), as_json=args.json))
    return 0


def _run_dashboard(args: argparse.Namespace) -> int:
    from async_tee.dashboard import panel_queries, render_dashboard

    try:
        text = render_dashboard(args.datasource)
    except ImportError as exc:
        print(f"async-tee dashboard: {exc}", file=sys.stderr)
        return 1
    if args.output is None:
        print(text)
        return 0
    with open(args.output, "w", encoding="utf-8") as out:
        out.write(text + "\n")
    panels = len(panel_queries(json.loads(text)))  # one query per panel
    print(f"async-tee dashboard: wrote {panels} panels to {args.output}")
    return 0


class _LinePrinter:
    """Writes whole lines to stdout (or stderr) from any thread; stops quietly if it goes away."""

    def __init__(self, to_stderr: bool = False) -> None:
        self._lock = threading.Lock()
        self._broken = False
        self._to_stderr = to_stderr

    def __call__(self, line: str) -> None:
        with self._lock:
            if self._broken:
                return
            stream = sys.stderr if self._to_stderr else sys.stdout
            try:
                stream.write(line + "\n")
                stream.flush()
            except (OSError, ValueError):  # a closed pipe (| head) must not spam warnings
                self._broken = True


def _run_sink(args: argparse.Namespace) -> int:
    from async_tee.sink import OtlpSink

    printer = _LinePrinter()
    notice = _LinePrinter(to_stderr=True) if args.json else printer  # stdout stays pure JSONL
    stop = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    sink = OtlpSink(
        args.host,
        args.grpc_port,
        args.http_port,
        echo=None if args.quiet else printer,
        echo_format="json" if args.json else "text",
    )
    # Ctrl-C and SIGTERM both just ask the loop below to stop: a KeyboardInterrupt could
    # land anywhere (even between printing the banner and entering the loop).
    previous = {
        signum: signal.signal(signum, request_stop) for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        try:
            sink.start()
        except (OSError, RuntimeError) as exc:
            print(f"async-tee sink: cannot listen: {exc}", file=sys.stderr)
            return 1
        notice(
            f"async-tee sink: receiving OTLP metrics on gRPC {sink.grpc_endpoint} and HTTP "
            f"{sink.http_endpoint}/v1/metrics (Ctrl-C to stop)"
        )
        while not stop.wait(_POLL_S):
            pass
    finally:
        sink.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    requests = sink.requests
    notice(
        f"async-tee sink: stopped; received {len(sink.points())} points in "
        f"{requests['grpc']} gRPC and {requests['http']} HTTP requests"
    )
    return 0


@contextlib.contextmanager
def _library_log(quiet: bool) -> Iterator[None]:
    """While a command runs telemetry: show the ``async_tee`` logger's INFO lines on stderr.

    The library logs where it exports ("telemetry started: ...", "serving Prometheus
    metrics on ...") at INFO, which Python's default WARNING level hides. This puts one
    handler on the ``async_tee`` logger only (not the root logger), unless ``quiet``, the
    logger has a handler already, or its INFO lines already reach one; the logger is as it
    was afterwards (``main`` may be called in-process).
    """
    library = logging.getLogger("async_tee")
    shown = library.isEnabledFor(logging.INFO) and library.hasHandlers()
    if quiet or library.handlers or shown:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))  # "async_tee: ..."
    level, propagate = library.level, library.propagate
    library.addHandler(handler)
    library.setLevel(logging.INFO)
    library.propagate = False  # a root handler would print each line a second time
    try:
        yield
    finally:
        library.removeHandler(handler)
        library.setLevel(level)
        library.propagate = propagate


def _run_demo(args: argparse.Namespace) -> int:
    from async_tee import demo

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with _library_log(args.quiet):
        result = demo.run(
            steps=args.steps,
            step_seconds=args.step_seconds,
            stall=args.stall,
            jsonl_path=args.jsonl,
            progress=None if args.quiet else sys.stderr,
        )
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, default=str))
    else:
        print(demo.render_result(result))
    return 0 if result.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``async-tee`` command line.

    Args:
        argv: The arguments after the program name; ``sys.argv[1:]`` by default.

    Returns:
        The exit status: 0 on success, 1 when a command failed (the sink could not
        listen, or the demo's embedded sink missed a default series), 2 on bad usage.
    """
    args = _parser().parse_args(argv)
    handler: Any = args.handler
    return int(handler(args))

"""Alerts: how long from the event to the alert, per rule, in a real Prometheus.

Usage: ``python benchmarks/bench_alerts.py [--rounds N] [--quick] [--out PATH]``
(``run_all.py`` runs it as the ``alerts`` part of ``results/latest.json``; run alone, it
writes its JSON and markdown to a temp dir unless ``--out`` is given). Needs Prometheus 3 as
``servers/build`` builds it (else a ``prometheus`` on ``PATH``); without one the report says
so and holds no row.

**The run.** Per round, a real Prometheus (scrape and evaluation interval 1 s) loads the
rules of ``async-tee alerts`` with short thresholds (:data:`THRESHOLDS`: stuck after 5 s,
every ``for:`` scaled by 1/60, so the stuck rule's is 5 s and the rank-gone rule's 1 s; a
straggler at 5 steps) and scrapes four real async_tee processes, the four ranks of one
torchrun-style job, each serving ``/metrics`` (the Prometheus exporter) and logging the
fixture's calls through ``async_tee.Logger`` every 0.2 s. After ``EVENT_AFTER_S`` each rank
but rank 0 has its event and prints when (Unix time): rank 1 stops stepping (it keeps
serving: a hung rank), rank 2 logs one NaN loss (and steps on), rank 3 exits at once
without shutting down (a lost rank). The parent polls ``/api/v1/alerts`` every 0.1 s and
records, per rule, when its alert for that rank first shows pending and firing.

**Reported**, per rule: the rule's own delay (threshold + ``for:``; for the straggler, the
time the other ranks take to get its threshold's steps ahead, plus ``for:``), and the
measured seconds from the event to pending and to firing (median and max over rounds);
the rest is the scrape and the evaluation interval (up to 1 s each) and the time a value
takes to reach a scrape. Rank 0, healthy, must never be named: the count of alerts naming
it is reported (0 expected).

Full: 3 rounds (about a minute and a half). ``--quick``: one round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from statistics import median
from typing import Any

from _common import (
    bench_parser,
    fmt_opt,
    machine_info,
    md_table,
    parse_bench_args,
    progress,
    publish,
    text_table,
)
from bench_export import fixture_calls, log_step

import async_tee
from async_tee import alerts


def _prometheus() -> str | None:
    """Prometheus 3 as ``servers/build`` built it, else one on ``PATH``, else None."""
    build = Path(__file__).parents[1] / "servers" / "build"
    if subprocess.run([str(build), "--check"], check=False).returncode == 0:
        out = subprocess.run([str(build)], capture_output=True, text=True, check=True).stdout
        return dict(line.split("=", 1) for line in out.split())["prometheus"]
    return shutil.which("prometheus")


PROMETHEUS = _prometheus()
THRESHOLDS = alerts.AlertThresholds(stuck_after_s=5, straggler_steps=5, for_multiplier=1 / 60)
STEP_S = 0.2
EVENT_AFTER_S = 6.0
ROUND_TIMEOUT_S = 45.0
POLL_S = 0.1
ROLES = {0: "healthy", 1: "stuck", 2: "nan", 3: "gone"}
EXPECTED = {  # (alert, rank) -> the role whose event it follows
    ("RLTrainerStuck", "1"): "stuck",
    ("RLStraggler", "1"): "stuck",
    ("RLNonFiniteValues", "2"): "nan",
    ("RLRankGone", "3"): "gone",
}


# ------------------------------------------------------------------ a rank


def run_rank(role: str) -> int:
    """Log the fixture's steps every ``STEP_S``; at ``EVENT_AFTER_S`` have ``role``'s event."""
    async_tee.start_telemetry()
    setup, calls = fixture_calls()
    logger = async_tee.Logger()
    log_step(logger, [setup], 0)
    started = time.monotonic()
    step, evented = 0, False
    while True:
        step += 1
        due = not evented and time.monotonic() - started >= EVENT_AFTER_S and role != "healthy"
        if due:
            evented = True
            print(json.dumps({"role": role, "event_at": time.time(), "step": step}), flush=True)
            if role == "gone":
                os._exit(1)  # lost: no shutdown, no last export
            if role == "stuck":
                time.sleep(3600)  # hung: still serving /metrics
        train = next(c for c in calls if c.prefix == "train")
        loss = train.metrics.get("loss")
        if due:  # role "nan": this step's loss is NaN
            train.metrics["loss"] = float("nan")
        log_step(logger, calls, step)
        train.metrics["loss"] = loss
        time.sleep(STEP_S)


# ------------------------------------------------------------------ the parent


def _free_base(count: int) -> int:
    for base in range(21_000, 60_000, 97):
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError("no run of free ports")


def _alerts(web: int) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{web}/api/v1/alerts"
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.load(response)["data"]["alerts"]


def run_round(index: int) -> dict[str, Any]:
    """One job of four ranks scraped by one Prometheus; when each alert pended and fired."""
    assert PROMETHEUS is not None
    base = _free_base(5)
    web = base + 4
    with (
        tempfile.TemporaryDirectory(prefix="async-tee-alerts-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        rules = Path(tmp) / "rules.yml"
        rules.write_text(alerts.render_rules(THRESHOLDS))
        targets = ", ".join(f"'127.0.0.1:{base + r}'" for r in ROLES)
        config = Path(tmp) / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{rules}']\n"
            "scrape_configs:\n"
            f"  - {{job_name: train, static_configs: [{{targets: [{targets}]}}]}}\n"
        )
        server = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={Path(tmp) / 'data'}",
                f"--web.listen-address=127.0.0.1:{web}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        stack.callback(server.wait, 10)
        stack.callback(server.terminate)
        ranks = {}
        for rank, role in ROLES.items():
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RANK"))},
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(len(ROLES)),
                "TORCHELASTIC_RUN_ID": f"bench-alerts-{os.getpid()}-{index}",
                "OTEL_METRICS_EXPORTER": "prometheus",
                "ASYNC_TEE_PROMETHEUS_BASE_PORT": str(base),
                "ASYNC_TEE_MIN_EXPORT_INTERVAL": "0",
            }
            proc = subprocess.Popen(
                [sys.executable, __file__, "--rank", role],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            stack.callback(proc.wait, 10)
            stack.callback(proc.kill)
            ranks[role] = proc
        events: dict[str, float] = {}

        def read_event(role: str, proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # the rank's one line: when its event happened
            if line:
                events[role] = json.loads(line)["event_at"]

        for role, proc in ranks.items():
            threading.Thread(target=read_event, args=(role, proc), daemon=True).start()
        seen: dict[tuple[str, str], dict[str, float]] = {}
        named_healthy = 0
        deadline = time.monotonic() + ROUND_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                now = time.time()
                for alert in _alerts(web):
                    key = (alert["labels"]["alertname"], alert["labels"].get("rl_rank", ""))
                    seen.setdefault(key, {}).setdefault(alert["state"], now)
                    named_healthy += key[1] == "0"
            if all("firing" in seen.get(key, {}) for key in EXPECTED):
                break
            time.sleep(POLL_S)
    delays = {}
    for (name, rank_label), role in EXPECTED.items():
        at = seen.get((name, rank_label), {})
        event = events.get(role)
        delays[name] = {
            state: None if event is None or state not in at else at[state] - event
            for state in ("pending", "firing")
        }
    return {"round": index, "delays": delays, "named_healthy": named_healthy, "events": events}


def own_delay(name: str) -> float:
    """The rule's own part of the delay: its threshold (as time) and its ``for:``."""
    rule = next(r for r in alerts.alert_rules(THRESHOLDS) if r.name == name)
    threshold = {
        "RLTrainerStuck": THRESHOLDS.stuck_after_s,
        "RLStraggler": (THRESHOLDS.straggler_steps + 1) * STEP_S,
    }.get(name, 0.0)
    return threshold + rule.for_s


def summarise(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for name, _ in EXPECTED:

        def values(state: str, name: str = name) -> list[float]:
            return [d for r in rounds if (d := r["delays"][name][state]) is not None]

        pending, firing = values("pending"), values("firing")
        rows.append(
            {
                "rule": name,
                "own_s": own_delay(name),
                "pending_s": {"median": median(pending), "max": max(pending)} if pending else None,
                "firing_s": {"median": median(firing), "max": max(firing)} if firing else None,
                "fired": f"{len(firing)}/{len(rounds)}",
            }
        )
    return rows


HEADER = (
    "rule",
    "threshold + for: s",
    "to pending s (median / max)",
    "to firing s (median / max)",
    "fired",
)


def table_rows(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    def pair(value: dict[str, float] | None) -> str:
        return "-" if value is None else f"{value['median']:.1f} / {value['max']:.1f}"

    return [
        (
            r["rule"],
            fmt_opt(r["own_s"], ".1f"),
            pair(r["pending_s"]),
            pair(r["firing_s"]),
            r["fired"],
        )
        for r in rows
    ]


def _method(report: dict[str, Any]) -> str:
    t = report["config"]["thresholds"]
    return (
        f"{report['config']['rounds']} round(s); a real Prometheus (scrape and evaluation "
        "every 1 s) with the rules of `async-tee alerts` at short thresholds (stuck after "
        f"{t['stuck_after_s']:g} s, straggler at {t['straggler_steps']} steps, every `for:` "
        f"x{t['for_multiplier']:.4g}) scraping the 4 ranks of one job logging a step every "
        f"{STEP_S:g} s; after {EVENT_AFTER_S:g} s rank 1 stops stepping, rank 2 logs one NaN "
        "loss, rank 3 exits without shutting down. Seconds from the event (the rank's own "
        "clock) to the alert's first `pending` and `firing` in `/api/v1/alerts` (polled "
        f"every {POLL_S:g} s). Alerts naming the healthy rank 0: "
        f"{sum(r['named_healthy'] for r in report['rounds'])}."
    )


def section(report: dict[str, Any]) -> list[str]:
    if report.get("skipped"):
        return [f"Not run: {report['skipped']}."]
    return [_method(report), "", *md_table(HEADER, table_rows(report["rows"]))]


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (jobs)")
    parser.add_argument("--rank", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        return run_rank(args.rank)
    args = parse_bench_args(parser, "alerts", argv)
    started = time.perf_counter()
    report: dict[str, Any] = {
        "machine": machine_info(),
        "config": {
            "rounds": args.rounds or (1 if args.quick else 3),
            "thresholds": {
                "stuck_after_s": THRESHOLDS.stuck_after_s,
                "straggler_steps": THRESHOLDS.straggler_steps,
                "for_multiplier": THRESHOLDS.for_multiplier,
            },
        },
    }
    if PROMETHEUS is None:
        report.update(skipped="no prometheus binary (run servers/build)", rows=[])
    else:
        rounds = []
        for index in range(report["config"]["rounds"]):
            rounds.append(run_round(index))
            progress(f"[{index + 1}] {json.dumps(rounds[-1]['delays'])}")
        report.update(rounds=rounds, rows=summarise(rounds))
    report["duration_s"] = time.perf_counter() - started
    console = (
        section(report) if report.get("skipped") else text_table(HEADER, table_rows(report["rows"]))
    )
    publish(args.out, report, TITLE, section(report), console)
    return 0


TITLE = "Alerts: from the event to the alert, per rule"

if __name__ == "__main__":
    sys.exit(main())

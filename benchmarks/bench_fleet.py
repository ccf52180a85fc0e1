"""Fleet capacity: simulated ranks into a stack's agents; each tier's CPU per point; the knee.

Usage: ``nice -n 10 python benchmarks/bench_fleet.py [--target remote-write]
[--sweep STEP_S:DURATION_S:RANKS,RANKS,...]... [--wait-quiet-s S] [--quick] [--out PATH]``
(``--help`` lists the rest; ``--judge REPORT ...`` judges saved reports' runs again, as one).
Needs the real servers ``servers/build`` builds.

**A run** (one rank count at one cadence): a fresh stack (``_tiers.TARGETS``); its tiers' CPU
while idle (``--idle-s``); then the load generator (``_loadgen.py``, a process of its own)
drives the ranks for the sweep's duration (every rank's every step, staggered over the step,
each request what a real session with that rank's resource sends). While it runs, every tier's
CPU and own figures are sampled each second (the agents' queue and remote-write log, the
store's head). Once it has delivered what it could, the store's query API is polled until every
(rank, step) is there or ``CATCH_UP_S`` passed. The window runs from the load's start to then:
per tier, CPU seconds (every process's ``utime + stime``), the points the agents accepted, and
CPU-µs per point; again from the end of the first ``WARM_STEPS`` steps (``steady``: a store
makes each rank's series at its first step, once per run); the samples the store holds of the
run; what is missing. The machine is shared: the other processes' CPU in the window is
reported, ``--wait-quiet-s`` waits for a quiet machine before each run, and a run past the knee
while others used more than ``--disturbed-above`` cores is measured again (``--retries``).

**The knee**, per cadence: runs at rising rank counts until one is past it: anything the
generator's answers, the agents' or the store's figures call not accepted (a refused,
retried, failed or dropped request or point), a rank with more than one request waiting (an
export slower than its step), an agent's queue or log still holding a step's requests once the
last was accepted, a (rank, step) missing from the store, or the store more than
``CATCH_UP_OK_S`` (or a step) behind the last send. A run the generator could not drive on time
(its requests made more than ``_loadgen.LATENESS_WARN_S`` late at p99) says so.

**Capacity** (:func:`capacity`), per tier at 1 s, 10 s and 60 s steps: the per-point CPU of the
last run that kept up at that cadence (else the nearest measured cadence below), ranks per core
(one core's CPU-µs a second over a rank's points a second, ``points_per_request / step_s``) and
the cores per 1,000 and 10,000 ranks.

Output: tables on stdout, JSON at ``--out`` (a temp dir by default) and markdown beside it.
Full: 100 to 400 ranks at 1 s steps for 30 s, 1,000 to 3,000 ranks at 10 s steps for 120 s,
each sweep stopping at its first run past the knee, then 2,000 ranks at 60 s steps for 300 s
(about 30 minutes on a quiet 2-core machine). ``--quick``: 20 ranks, 1 s steps, 10 s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import _tiers as tiers
from _common import (
    bench_parser,
    fmt_opt,
    machine_info,
    machine_line,
    md_table,
    parse_bench_args,
    progress,
    publish,
    text_table,
)

from async_tee.stack.agent import AgentSettings

HERE = Path(__file__).resolve().parent
LOADGEN = HERE / "_loadgen.py"
IDLE_S = 5.0
"""How long each tier's idle CPU is measured before the load."""
CATCH_UP_S = 60.0
"""After the last send, the longest the store is given to hold every (rank, step)."""
CATCH_UP_OK_S = 5.0
"""A store that needs longer than this (or than a step) after the last send is behind."""
POLL_S = 0.5
QUIET_LOOK_S = 3.0
WARM_STEPS = 2
"""Steps after which a run is steady: every rank's series exist in the store."""
LOG_TAIL = 4000
"""Characters kept of each server's log, for a run past the knee."""
CADENCES_S = (1.0, 10.0, 60.0)
FLEETS = (1_000, 10_000)


@dataclasses.dataclass(frozen=True)
class Sweep:
    """Rising rank counts at one cadence, each run ``duration_s`` long."""

    step_s: float
    duration_s: float
    ranks: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> Sweep:
        """``STEP_S:DURATION_S:RANKS,RANKS,...`` (``1:30:100,200``)."""
        step, duration, ranks = text.split(":")
        return cls(float(step), float(duration), tuple(int(n) for n in ranks.split(",")))


FULL = (
    Sweep(1.0, 30.0, (100, 150, 200, 250, 300, 400)),
    Sweep(10.0, 120.0, (1_000, 1_500, 2_000, 3_000)),
    Sweep(60.0, 300.0, (2_000,)),
)
QUICK = (Sweep(1.0, 10.0, (20,)),)


# ------------------------------------------------------------------ one run


@contextlib.contextmanager
def _generator(
    target: tiers.Target, args: Any, ranks: int, step_s: float, steps: int
) -> Iterator[Any]:
    """The load generator's process, driving ``target``'s agents; ended with the block."""
    command = [sys.executable, str(LOADGEN), "--ranks", str(ranks), "--step-s", str(step_s)]
    command += ["--steps", str(steps), "--run-id", f"fleet-{ranks}-{int(time.time())}"]
    command += ["--ranks-per-node", str(args.ranks_per_node)]
    command += ["--connections", str(args.connections), "--drain-s", str(args.drain_s)]
    for endpoint in target.endpoints:
        command += ["--endpoint", endpoint]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(30)
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()


def _line(process: Any) -> dict[str, Any]:
    line = process.stdout.readline()
    if not line:
        process.wait(30)
        raise RuntimeError(f"the load generator ended ({process.returncode}) without a report")
    event: dict[str, Any] = json.loads(line)
    return event


BATCH_GRACE_S = AgentSettings().flush_s + 0.5
"""After the last request was accepted, how long an agent may still hold requests by design
(its batch's flush timeout) before what it holds counts as falling behind."""


def wait_quiet(below_cores: float, within_s: float) -> float:
    """Wait (up to ``within_s``) until the machine's CPU use is under ``below_cores``.

    The machine is shared: a run measured beside another job's build finds that job's knee.
    Returns the cores in use at the last look (over ``QUIET_LOOK_S``).
    """
    deadline = time.monotonic() + within_s
    while True:
        before = tiers.machine_busy_seconds()
        time.sleep(QUIET_LOOK_S)  # measuring the machine's load
        busy = (tiers.machine_busy_seconds() - before) / QUIET_LOOK_S
        if busy < below_cores or time.monotonic() > deadline:
            return busy
        progress(f"  the machine is busy ({busy:.2f} cores in use): waiting")


def run_load(args: Any, ranks: int, step_s: float, duration_s: float) -> dict[str, Any]:
    """One run: a fresh stack, ``ranks`` ranks at ``step_s`` for ``duration_s``; its figures."""
    steps = max(1, round(duration_s / step_s))
    busy_before = wait_quiet(args.quiet_below, args.wait_quiet_s) if args.wait_quiet_s else None
    progress(f"{args.target}: {ranks} ranks, {step_s:g} s steps, {steps} steps")
    with contextlib.ExitStack() as running:
        folder = running.enter_context(tempfile.TemporaryDirectory(prefix="async-tee-fleet-"))
        target = running.enter_context(tiers.TARGETS[args.target](Path(folder)))
        idle0 = tiers.snapshot(target)
        time.sleep(args.idle_s)  # measuring the idle tiers, not waiting for anything
        idle = tiers.change(idle0, tiers.snapshot(target))
        generator = running.enter_context(_generator(target, args, ranks, step_s, steps))
        with tiers.Sampler(target) as sampler:
            started = _line(generator)
            before = tiers.snapshot(target)
            load = _line(generator)
            sent_at = time.monotonic()
            time.sleep(BATCH_GRACE_S)  # a fleet agent's batch may wait this long to fill
            loaded = tiers.snapshot(target)
            found, missing, query_error = _wait_for_store(target, load, sent_at, args.catch_up_s)
            caught_up_s = time.monotonic() - sent_at
            after = tiers.snapshot(target)
        window_s = time.time() - started["unix"] + 5
        stored = tiers.samples_in_store(target, load["config"]["run_id"], window_s)
        logs = {
            log.name: log.read_text(errors="replace")[-LOG_TAIL:]
            for log in Path(folder).glob("*.log")
        }
    run = {
        "target": args.target,
        "ranks": ranks,
        "step_s": step_s,
        "steps": steps,
        "generator": load,
        "idle": {tier: {"cores": figures["cpu_s"] / args.idle_s} for tier, figures in idle.items()},
        "window_s": after.at - before.at,
        "tiers": tiers.change(before, after),
        "steady": _steady(sampler, before, after, step_s, steps),
        "machine": {**_machine(before, after, load), "busy_before_cores": busy_before},
        "peaks": {
            tier.name: {
                "busiest_cores": sampler.busiest_cores(tier.name),
                **sampler.peak_backlog(tier.name),
            }
            for tier in target.tiers
        },
        "backlog_at_load_end": {
            tier: tiers.backlog(figures) for tier, figures in loaded.figures.items()
        },
        "store": {
            "ranks_found": len(found),
            "present": ranks * steps - len(missing),
            "missing": len(missing),
            "missing_first": missing[:20],
            "caught_up_s": caught_up_s,
            "samples_of_run": stored,
            "query_error": query_error,
        },
    }
    run.update(costs(run))
    run["past_knee"] = past_knee(run)
    if run["past_knee"]:
        run["log_tails"] = logs  # what the servers said about it
    return run


def _steady(
    sampler: tiers.Sampler,
    before: tiers.Snapshot,
    after: tiers.Snapshot,
    step_s: float,
    steps: int,
) -> dict[str, Any] | None:
    """The window after the first ``WARM_STEPS`` steps (every series made), or None if short.

    A store makes a rank's series at its first step: that cost comes once per run, not per point.
    """
    if steps < 2 * WARM_STEPS:
        return None
    warm = sampler.first_after(before.at + WARM_STEPS * step_s)
    if warm is None or warm.at >= after.at:
        return None
    return {"window_s": after.at - warm.at, "tiers": tiers.change(warm, after)}


def _machine(
    before: tiers.Snapshot, after: tiers.Snapshot, load: dict[str, Any]
) -> dict[str, float]:
    """The machine's CPU in the window, in cores: all of it, and the share of other processes.

    Others: every process but the tiers' and the generator's (its load window's CPU).
    """
    window = after.at - before.at
    busy = after.machine_s - before.machine_s
    ours = sum(after.cpu_s.values()) - sum(before.cpu_s.values())
    ours += load["generator"]["cpu_s"]
    return {"cores": busy / window, "others_cores": max(0.0, busy - ours) / window}


def _wait_for_store(
    target: tiers.Target, load: dict[str, Any], sent_at: float, catch_up_s: float = CATCH_UP_S
) -> tuple[dict[int, set[int]], list[tuple[int, int]], str]:
    """Poll the store until every (rank, step) is there, or ``catch_up_s`` passed.

    Returns what was found, what is missing (all of it until a query answered) and the
    last query's error ("" if it answered).
    """
    config = load["config"]
    found: dict[int, set[int]] = {}
    missing = tiers.missing_steps(found, config["ranks"], config["steps"])
    error = ""
    while True:
        window_s = time.time() - load["started_unix"] + 5  # from the run's first sample to now
        try:
            found = tiers.steps_in_store(target, config["run_id"], window_s)
        except OSError as exc:  # the store busy or restarting: asked again
            error = f"{type(exc).__name__}: {exc}"
        else:
            error = ""
            missing = tiers.missing_steps(found, config["ranks"], config["steps"])
            if not missing:
                return found, missing, error
        if time.monotonic() - sent_at > catch_up_s:
            return found, missing, error
        time.sleep(POLL_S)  # polling an external server


# ------------------------------------------------------------------ what a run says


def costs(run: dict[str, Any]) -> dict[str, Any]:
    """Points per second and, per tier, CPU-µs per point the agents accepted (and per idle)."""
    agent = run["tiers"]["agent"]["figures"]
    accepted = agent.get("accepted", 0.0)
    schedule_s = run["generator"]["schedule_s"]
    per_point: dict[str, Any] = {}
    for tier, figures in run["tiers"].items():
        cpu = figures["cpu_s"]
        idle = run["idle"][tier]["cores"] * run["window_s"]
        per_point[tier] = {
            "cpu_us": 1e6 * cpu / accepted if accepted else None,
            "cpu_us_less_idle": 1e6 * max(0.0, cpu - idle) / accepted if accepted else None,
            "cores": cpu / run["window_s"] if run["window_s"] else None,
        }
    steady = run.get("steady")
    if steady:
        steady_accepted = steady["tiers"]["agent"]["figures"].get("accepted", 0.0)
        for tier, figures in steady["tiers"].items():
            cpu = figures["cpu_s"]
            per_point[tier]["cpu_us_steady"] = (
                1e6 * cpu / steady_accepted if steady_accepted else None
            )
            per_point[tier]["cores_steady"] = cpu / steady["window_s"]
    generator = run["generator"]["generator"]
    points = run["generator"]["points_per_request"]
    per_point["generator"] = {
        "cpu_us": generator["cpu_us_per_request"] / points
        if generator["cpu_us_per_request"]
        else None,
        "cpu_us_per_request": generator["cpu_us_per_request"],
        "cores": generator["cpu_s"] / run["generator"]["wall_s"],
    }
    return {
        "points_per_s": run["generator"]["points"]["delivered"] / schedule_s,
        "accepted_points": accepted,
        "per_point": per_point,
    }


def past_knee(run: dict[str, Any]) -> list[str]:
    """Why the run is past the knee (empty: every point accepted, stored, in time)."""
    reasons: list[str] = []
    load = run["generator"]
    other = {k: v for k, v in load["answers"].items() if k != "2xx"}
    if other:
        reasons.append(f"answers other than 2xx: {other}")
    for what in ("dropped", "refused"):
        if load[what]:
            reasons.append(f"the generator {what}: {load[what]}")
    if load["requests"]["max_backlog"] > 1:
        reasons.append(f"a rank had {load['requests']['max_backlog']} requests waiting")
    if not load["kept_up"]:
        reasons.append(f"the generator fell behind (p99 {load['late_us']['p99']:.0f} µs late)")
    # A step of an agent's ranks still held once the last was accepted: it falls behind.
    ranks_per_agent = run["ranks"] / len(load["config"]["endpoints"])
    delivered = max(1, load["requests"]["delivered"])
    for tier, figures in run["tiers"].items():
        counts = figures["figures"]
        logged = counts.get("wal_written_bytes", 0.0) / delivered  # a request in the log
        step_held = {"queue_size": ranks_per_agent, "wal_pending_bytes": ranks_per_agent * logged}
        for name in ("refused", "failed", "send_failed", "enqueue_failed", "out_of_order"):
            if counts.get(name):
                reasons.append(f"{tier} {name}: {counts[name]:.0f}")
        for name, held in run["backlog_at_load_end"][tier].items():
            if held and held >= step_held[name]:
                reasons.append(f"{tier} {name} at the load's end: {held:,.0f}")
    store = run["store"]
    if store["missing"]:
        reasons.append(f"{store['missing']} (rank, step) missing from the store")
    elif store["caught_up_s"] > max(CATCH_UP_OK_S, run["step_s"]):
        reasons.append(f"the store took {store['caught_up_s']:.1f} s after the last send")
    return reasons


def capacity(knees: dict[str, dict[str, Any]], runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per tier and cadence: CPU-µs per point, ranks per core, cores per 1,000 and 10,000 ranks.

    Each cadence's figures come from the per-point cost (steady, when the run was long
    enough) of the last run that kept up at that cadence, else at the nearest measured
    cadence below it (a store's cost per point grows as its points per series fall: then an
    upper bound on the ranks). A core's CPU-µs a second over a rank's points a second:
    ``ranks_per_core = 1e6 * step_s / (cpu_us_per_point * points_per_request)``.
    """
    by_cadence: dict[float, dict[str, Any]] = {}
    for run in runs:
        cadence = knees.get(f"{run['step_s']:g}s")
        if cadence and run["ranks"] == cadence["last_keeping_up"]:
            by_cadence[run["step_s"]] = run
    out: dict[str, Any] = {}
    for step in CADENCES_S:
        measured = [cadence for cadence in sorted(by_cadence) if cadence <= step]
        if not measured:
            continue
        basis = by_cadence[measured[-1]]
        points = basis["generator"]["points_per_request"]
        for tier, cost in basis["per_point"].items():
            per_point = cost.get("cpu_us_steady") or cost["cpu_us"]
            if not per_point:
                continue
            out.setdefault(tier, {})[f"{step:g}s"] = {
                "from": {"ranks": basis["ranks"], "step_s": basis["step_s"]},
                "steady": bool(cost.get("cpu_us_steady")),
                "cpu_us_per_point": per_point,
                "ranks_per_core": 1e6 * step / (per_point * points),
                "cores_per_ranks": {
                    str(fleet): fleet * points / step * per_point / 1e6 for fleet in FLEETS
                },
            }
    return out


# ------------------------------------------------------------------ the report


def tier_names(run: dict[str, Any]) -> list[str]:
    """The run's tiers, in the stack's order (the agents first)."""
    return list(run["tiers"])


def row(run: dict[str, Any]) -> list[str]:
    """One run as a table row (``header`` names its columns)."""
    load = run["generator"]
    per_point = run["per_point"]
    names = tier_names(run)
    return [
        f"{run['ranks']}",
        f"{run['step_s']:g}",
        fmt_opt(run["points_per_s"], ",.0f"),
        " / ".join(fmt_opt(per_point[name]["cpu_us"], ".1f") for name in names),
        " / ".join(fmt_opt(per_point[name]["cores"], ".2f") for name in names),
        fmt_opt(per_point["generator"]["cpu_us_per_request"], ".0f"),
        fmt_opt(load["rtt_us"]["p50"] / 1000, ".1f")
        + " / "
        + fmt_opt(load["rtt_us"]["p99"] / 1000, ".1f"),
        f"{run['store']['present']:,} / {run['ranks'] * run['steps']:,}",
        f"{run['store']['caught_up_s']:.1f}",
        f"{run['machine']['others_cores']:.2f}",
        "; ".join(run["past_knee"]) or "keeps up",
    ]


def header(run: dict[str, Any]) -> list[str]:
    """The columns of :func:`row` for runs of ``run``'s stack."""
    names = " / ".join(tier_names(run))
    return [
        "ranks",
        "step s",
        "points/s",
        f"CPU-µs/point ({names})",
        f"cores ({names})",
        "generator µs/request",
        "rtt p50 / p99 ms",
        "(rank, step) stored",
        "catch-up s",
        "others' cores",
        "verdict",
    ]


def capacity_rows(table: dict[str, Any]) -> list[list[str]]:
    """Ranks per core and cores per fleet, per tier and cadence."""
    rows = []
    for tier, cadences in table.items():
        for step, cell in cadences.items():
            basis = cell["from"]
            rows.append(
                [
                    tier,
                    step,
                    fmt_opt(cell["cpu_us_per_point"], ".1f"),
                    fmt_opt(cell["ranks_per_core"], ",.0f"),
                    *(fmt_opt(cell["cores_per_ranks"][str(n)], ".2f") for n in FLEETS),
                    f"{basis['ranks']} ranks at {basis['step_s']:g} s"
                    + ("" if cell["steady"] else " (whole run)"),
                ]
            )
    return rows


CAPACITY_HEADER = (
    "tier",
    "step",
    "CPU-µs/point",
    "ranks/core",
    *(f"cores/{n:,} ranks" for n in FLEETS),
    "cost measured in",
)


def section(report: dict[str, Any]) -> list[str]:
    """The markdown section."""
    lines = [
        f"Stack `{report['target']}`; each rank sends {report['points_per_request']} points "
        f"({report['request_bytes']:,} bytes) per step.",
        "",
        *md_table(header(report["runs"][0]), [row(run) for run in report["runs"]]),
        "",
        *(f"Knee at {step} steps: {found['text']}" for step, found in report["knees"].items()),
        *machines_note(report["runs"]),
    ]
    if report.get("capacity"):
        lines += ["", *md_table(CAPACITY_HEADER, capacity_rows(report["capacity"]))]
    lines += ["", "Counts (points, but where said):", ""]
    lines += md_table(COUNTS_HEADER, [counts_row(run) for run in report["runs"]])
    return lines


def machines_note(runs: list[dict[str, Any]]) -> list[str]:
    """Where runs judged together (``--judge``) were measured on different machines: which."""
    by_machine: dict[str, list[str]] = {}
    for run in runs:
        if "measured_on" in run:
            found = by_machine.setdefault(machine_line(run["measured_on"]), [])
            found.append(f"{run['ranks']} ranks at {run['step_s']:g} s")
    if len(by_machine) < 2:
        return []
    lines = ["", "The runs were measured on more than one machine of this kind:", ""]
    return lines + [f"- {', '.join(names)}: {line}" for line, names in by_machine.items()]


COUNTS_HEADER = (
    "ranks x steps",
    "made",
    "delivered (answered 2xx)",
    "answers not 2xx",
    "agent accepted",
    "agent refused",
    "agent sent on",
    "store appended (samples)",
    "samples of the run in the store",
    "(rank, step) present / missing",
)


def counts_row(run: dict[str, Any]) -> list[str]:
    """What one run made, and what each tier accepted and held."""
    load = run["generator"]
    agent = run["tiers"]["agent"]["figures"]
    store = run["tiers"].get("store", {}).get("figures", {})
    others = sum(v for k, v in load["answers"].items() if k != "2xx")
    return [
        f"{run['ranks']} x {run['steps']}",
        f"{load['points']['made']:,}",
        f"{load['points']['delivered']:,}",
        f"{others:,}",
        f"{agent.get('accepted', 0):,.0f}",
        f"{agent.get('refused', 0):,.0f}",
        f"{agent.get('sent', 0):,.0f}",
        f"{store.get('appended', 0):,.0f}",
        "?" if run["store"]["samples_of_run"] is None else f"{run['store']['samples_of_run']:,}",
        f"{run['store']['present']:,} / {run['store']['missing']:,}",
    ]


def knee(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """At one cadence: the most ranks every run of which kept up, the fewest any run of which
    did not (a rank count measured twice may be on the edge: kept up once, not again)."""
    outcomes: dict[int, list[dict[str, Any]]] = {}
    for run in runs:
        outcomes.setdefault(run["ranks"], []).append(run)
    kept = [n for n, tries in outcomes.items() if not any(run["past_knee"] for run in tries)]
    past = [n for n, tries in outcomes.items() if any(run["past_knee"] for run in tries)]
    last = max(kept, default=None)
    first = min(past, default=None)
    parts = []
    if last is not None:
        parts.append(f"{last} ranks keep up")
    reasons: list[str] = []
    if first is not None:
        tries = outcomes[first]
        reasons = next(run["past_knee"] for run in tries if run["past_knee"])
        edge = sum(not run["past_knee"] for run in tries)
        kept_text = f", though {edge} of its {len(tries)} runs kept up" if edge else ""
        parts.append(f"{first} ranks are past it ({'; '.join(reasons)}{kept_text})")
    else:
        parts.append("no run was past it")
    return {
        "last_keeping_up": last,
        "first_past": first,
        "reasons": reasons,
        "text": "; ".join(parts) + ".",
    }


def parse_args(argv: list[str] | None = None) -> Any:
    """The command's options."""
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--target", choices=sorted(tiers.TARGETS), default="remote-write")
    parser.add_argument(
        "--sweep",
        action="append",
        default=None,
        help="STEP_S:DURATION_S:RANKS,RANKS,... (repeatable; replaces the plan's sweeps)",
    )
    parser.add_argument("--idle-s", type=float, default=IDLE_S, help="idle CPU measured first")
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--connections", type=int, default=16, help="per agent")
    parser.add_argument("--drain-s", type=float, default=30.0)
    parser.add_argument(
        "--catch-up-s",
        type=float,
        default=CATCH_UP_S,
        help="how long the store may take to hold every (rank, step) after the last send "
        "(a run past the knee: wait it out to count what was kept)",
    )
    parser.add_argument("--keep-going", action="store_true", help="run past the knee too")
    parser.add_argument(
        "--judge",
        type=Path,
        action="append",
        default=None,
        help="judge the runs of saved reports again, as one report (repeatable; no run)",
    )
    parser.add_argument(
        "--wait-quiet-s", type=float, default=0.0, help="before each run, wait this long at most"
    )
    parser.add_argument(
        "--quiet-below", type=float, default=0.3, help="...for the machine to use fewer cores"
    )
    parser.add_argument(
        "--disturbed-above",
        type=float,
        default=0.5,
        help="a run past the knee while other processes used more cores is measured again",
    )
    parser.add_argument("--retries", type=int, default=2, help="...at most this many times")
    return parse_bench_args(parser, "fleet", argv)


def judged(runs: list[dict[str, Any]], target: str, duration_s: float) -> dict[str, Any]:
    """The report of ``runs``: each run's costs and verdict, the knee per cadence, capacity."""
    runs = sorted(runs, key=lambda run: (run["step_s"], run["ranks"]))  # stable: retries kept
    for run in runs:
        run.update(costs(run))
        run["past_knee"] = past_knee(run)
    cadences = sorted({run["step_s"] for run in runs})
    knees = {
        f"{step:g}s": knee([run for run in runs if run["step_s"] == step]) for step in cadences
    }
    first = runs[0]["generator"]
    return {
        "machine": machine_info(),
        "target": target,
        "points_per_request": first["points_per_request"],
        "request_bytes": first["request_bytes"],
        "runs": runs,
        "knees": knees,
        "capacity": capacity(knees, runs),
        "duration_s": duration_s,
    }


def main(argv: list[str] | None = None) -> int:
    """Sweep, find the knees, derive the capacity, publish (or judge a report's runs again)."""
    args = parse_args(argv)
    started = time.perf_counter()
    if args.judge:
        old = [json.loads(path.read_text()) for path in args.judge]
        if len({report["target"] for report in old}) > 1:
            raise SystemExit("--judge: reports of different stacks")
        for report in old:  # each run keeps the machine it was measured on
            for run in report["runs"]:
                run.setdefault("measured_on", report["machine"])
        runs = [run for report in old for run in report["runs"]]
        report = judged(runs, old[0]["target"], sum(r["duration_s"] for r in old))
        report["machine"] = old[-1]["machine"]
    else:
        report = judged(measure(args), args.target, 0.0)
        report["duration_s"] = time.perf_counter() - started
    runs = report["runs"]
    console = text_table(header(runs[0]), [row(run) for run in runs])
    console += ["", *(f"{step}: {found['text']}" for step, found in report["knees"].items())]
    if report["capacity"]:
        console += ["", *text_table(CAPACITY_HEADER, capacity_rows(report["capacity"]))]
    publish(args.out, report, "Fleet capacity", section(report), console)
    return 0


def measure(args: Any) -> list[dict[str, Any]]:
    """Each sweep's runs, rising, up to its knee (past it too with ``--keep-going``)."""
    sweeps = (
        [Sweep.parse(text) for text in args.sweep]
        if args.sweep
        else (QUICK if args.quick else FULL)
    )
    runs = []
    for sweep in sweeps:
        for ranks in sweep.ranks:
            run = run_load(args, ranks, sweep.step_s, sweep.duration_s)
            disturbed: list[dict[str, Any]] = []
            # Past the knee beside another job's load: that job's knee; measured again.
            while run["past_knee"] and len(disturbed) < args.retries and _disturbed(run, args):
                progress(f"  others used {run['machine']['others_cores']:.2f} cores: again")
                disturbed.append(run)
                run = run_load(args, ranks, sweep.step_s, sweep.duration_s)
            run["disturbed_runs"] = disturbed
            runs.append(run)
            _checkpoint(args, runs)
            progress("  " + "  ".join(text_table(header(run), [row(run)])[1:]))
            if run["past_knee"] and not args.keep_going:
                break
    return runs


def _checkpoint(args: Any, runs: list[dict[str, Any]]) -> None:
    """The runs so far, for ``--judge``, beside ``--out``: a killed sweep keeps them."""
    partial = {"target": args.target, "machine": machine_info(), "duration_s": 0.0, "runs": runs}
    path = args.out.with_suffix(".partial.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(partial, indent=1) + "\n")


def _disturbed(run: dict[str, Any], args: Any) -> bool:
    """Whether other processes used more than ``--disturbed-above`` cores during the run."""
    return bool(run["machine"]["others_cores"] > args.disturbed_above)


if __name__ == "__main__":
    sys.exit(main())

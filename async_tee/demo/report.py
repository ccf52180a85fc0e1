"""Owns the demo's report: a :class:`~async_tee.demo.DemoResult` rendered as text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from async_tee.demo.runner import DemoResult

__all__ = ["render_result"]


def _format_value(value: float | int | str | None) -> str:
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))  # counter totals: 2707147, not 2.70715e+06
        return f"{value:.6g}"
    return "-" if value is None else str(value)


def _table(header: list[str], rows: list[list[str]], right: frozenset[int]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)]


_TRIGGERS = (
    ("step", "step exports"),
    ("interval", "periodic"),
    ("flush", "on flush"),
    ("shutdown", "at shutdown"),
)
"""``exports_by_trigger`` keys in the order shown, and how the report names each."""


def _attempts(stats: Mapping[str, Any], trigger: str) -> int:
    counts = stats["exports_by_trigger"].get(trigger, {})
    return int(counts.get("success", 0) + counts.get("failure", 0))


def _exports_line(stats: Mapping[str, Any]) -> str:
    """Every export from ``stats``: the total, the same by trigger, and how many succeeded.

    The total is ``exports`` (success + failure); the per-trigger parts are
    ``exports_by_trigger`` and add up to it (a trigger with no export is left out).
    """
    totals = stats["exports"]
    by_trigger = stats["exports_by_trigger"]
    parts = []
    for trigger, label in _TRIGGERS:
        attempts = _attempts(stats, trigger)
        if attempts:
            failures = by_trigger[trigger]["failure"]
            parts.append(f"{attempts} {label}" + (f" ({failures} failed)" if failures else ""))
    total = totals["success"] + totals["failure"]
    if not total:
        return "  exports: none."
    return (
        f"  exports: {total} = {' + '.join(parts)}; "
        f"{totals['success']} succeeded, {totals['failure']} failed."
    )


def _steps_line(stats: Mapping[str, Any]) -> str:
    """The steps from ``stats``: completed = exported + coalesced, and where they went.

    ``exported`` counts the steps given an export of their own (sent or failed): the step
    exports, and the step still open at the end, which the final export at shutdown
    carries (``exports_by_trigger`` counts that export under ``shutdown``).
    """
    steps = stats["steps"]
    step_exports = _attempts(stats, "step")
    exported = steps["exported"]
    line = (
        f"  steps: {steps['completed']} completed = {exported} with an export of their own + "
        f"{steps['coalesced']} coalesced into a later one"
    )
    carried = exported - step_exports  # the final export carries the open step, if any
    if exported == 0:
        return line + "."
    if carried == 0:
        return line + f"; each of the {exported} in a step export of its own."
    if carried == 1 and _attempts(stats, "shutdown"):
        return line + f"; {step_exports} in step exports + the last in the export at shutdown."
    return line + f"; {step_exports} of them in step exports."


def render_result(result: DemoResult) -> str:
    """The end-of-run report: series received, caller-side cost, pipeline stats, delivery."""
    out: list[str] = []
    where = (
        f"an embedded OTLP sink at {result.endpoint}"
        if result.mode == "embedded"
        else f"{result.endpoint} (OTEL_EXPORTER_OTLP_ENDPOINT)"
    )
    out.append(
        f"async_tee demo: {result.steps} simulated GRPO steps x {result.step_seconds:g} s, "
        f"exported over OTLP to {where}"
        + (", which was stalled for the whole run (--stall)" if result.stalled else "")
    )
    out.append("")
    if result.series is None:
        out.append(
            "Series received: not visible from here (an external collector); "
            "the figures below are the caller's side only."
        )
    elif not result.series:
        out.append(
            "Series received by the sink: none"
            + (" -- it was stalled, as asked," if result.stalled else ",")
            + " so none of the default series arrived."
        )
    else:
        out.append(
            f"Series received by the sink: the last point of each series and attribute set "
            f"({len(result.series)}), and the steps logged vs the steps whose own values "
            "arrived (each in an export carrying its rl.step):"
        )
        rows = [
            [
                s.name,
                _format_value(s.value),
                s.unit,
                "" if s.steps_logged is None else f"{s.steps_received}/{s.steps_logged}",
                " ".join(f"{k}={v}" for k, v in s.attributes.items()),
            ]
            for s in result.series
        ]
        header = ["series", "value", "unit", "steps", "attributes"]
        out += ["  " + line for line in _table(header, rows, frozenset({1, 3}))]
        if any(s.name == "async_tee.exports" for s in result.series):
            out.append(
                "  (async_tee.* rows: the values collected into the last export received; "
                "async_tee.exports there counts the exports before it, not that one.)"
            )
        short = [s for s in result.series if (s.steps_received or 0) < (s.steps_logged or 0)]
        out.append(
            f"  Steps: {len(short)} series missed steps (folded into later exports: see "
            "ASYNC_TEE_MIN_EXPORT_INTERVAL)."
            if short
            else "  Steps: every logged step of every series arrived as its own point."
        )
    if result.missing_defaults:
        if result.series:  # (with nothing received, the line above already said so)
            out.append("")
            out.append(f"Default series NOT received ({len(result.missing_defaults)}):")
            out += [f"  {name}" for name in result.missing_defaults]
    elif result.missing_defaults is not None:
        out.append("")
        out.append(
            "Every default series arrived (training scalars, vLLM counters, the 8 "
            "efficiency categories, efficiency %, start-up phases)."
        )
    checks = [
        f"  {name}: {check['logged']:.0f} logged, "
        + (
            "nothing received"
            if check["received"] is None
            else f"{check['received']:.0f} received"
            + (
                " (each step's delta counted once)"
                if check["received"] == check["logged"]
                else " (MISMATCH)"
            )
        )
        for name, check in result.counter_checks.items()
    ]
    if result.series:
        out.append("Counters (the rollout keys are logged twice a step, under 'train'):")
        out += checks
    out.append("")
    out.append("Caller-side cost per log_metrics call (perf_counter_ns on the calling thread), µs:")
    rows = []
    for prefix, figures in result.latency_us.items():
        tee, call = figures["tee"], figures["log_metrics"]
        rows.append(
            [
                prefix,
                str(figures["calls"]),
                *(f"{tee[q]:.1f}" for q in ("p50", "p99", "max")),
                *(f"{call[q]:.1f}" for q in ("p50", "p99", "max")),
            ]
        )
    header = [
        "prefix",
        "calls",
        "tee p50",
        "tee p99",
        "tee max",
        "call p50",
        "call p99",
        "call max",
    ]
    out += ["  " + line for line in _table(header, rows, frozenset(range(1, 8)))]
    out.append(
        "  (tee = async_tee's share; call = the whole Logger.log_metrics, JSONL backend "
        "included; a prefix no family or row reads, such as ray, is not teed)"
    )
    train, floor, cpu = result.latency_us.get("train"), result.paced_floor_us, result.tee_cpu_us
    if train and floor["p50"] > 0:
        tee = train["tee"]
        out.append(
            f"  train at trainer pace: tee p50 {tee['p50']:.1f} µs against {floor['p50']:.1f} µs "
            f"for the paced floor (a train dict copied into a deque between the calls, after as "
            f"much idle time): {tee['p50'] / floor['p50']:.1f}x; p99 {tee['p99']:.1f} against "
            f"{floor['p99']:.1f} µs. The tee's CPU time on this thread: p50 {cpu['p50']:.1f} µs "
            "(thread_time_ns, its own system call included)"
            + (
                f"; the other {tee['p50'] - cpu['p50']:.1f} µs of its p50 waited (the GIL another "
                "thread held, the scheduler)."
                if tee["p50"] > cpu["p50"]
                else ": work, not waits for the GIL (after idle time every touch of memory misses "
                "the caches, the floor's too)."
            )
        )
    nominal = result.steps * result.step_seconds
    share = (
        100 * result.log_seconds_on_training_thread / result.loop_seconds
        if result.loop_seconds
        else 0.0
    )
    out.append(
        f"Training loop: {result.loop_seconds:.2f} s for {result.steps} x "
        f"{result.step_seconds:g} s = {nominal:.2f} s of simulated work; the training "
        f"thread spent {1000 * result.log_seconds_on_training_thread:.2f} ms in log_metrics "
        f"({share:.3f} %)."
    )
    stats = result.stats
    out.append("")
    dropped = stats["dropped_by_reason"]
    skipped = stats["values_skipped"]
    out.append(
        f"async_tee.stats(): enqueued {stats['enqueued']}, recorded {stats['recorded']}, "
        f"dropped {stats['dropped']} (overflow {dropped['overflow']}, error {dropped['error']}, "
        f"shutdown {dropped['shutdown']}), pending {stats['pending']}; values skipped: "
        f"non-finite {skipped['non_finite']}, rejected {skipped['rejected']}, "
        f"cardinality {skipped['cardinality']}; worker lag p50 {stats['lag_ms']['p50']:.1f} ms, "
        f"max {stats['lag_ms']['max']:.1f} ms."
    )
    out.append(_exports_line(stats))
    out.append(_steps_line(stats))
    out.append(
        f"shutdown_telemetry(timeout_s={result.shutdown_timeout_s:g}) returned "
        + (
            "True: everything delivered"
            if result.delivered
            else "False: not everything was delivered"
        )
        + f" (took {result.shutdown_seconds:.2f} s)."
    )
    where_jsonl = (
        f"to {result.jsonl_path}"
        if result.jsonl_path
        else "to a temporary file, now removed; --jsonl PATH keeps it"
    )
    out.append(f"JsonlBackend wrote {result.jsonl_lines} lines {where_jsonl}.")
    out.append(
        f"Callers: the training loop; a GPU-monitor thread ({result.monitor_calls} 'ray' "
        "dicts); a coroutine inside a running event loop (the efficiency dicts)."
    )
    if result.stalled:
        out.append("")
        out.append(
            f"The collector was stalled, yet the training loop took {result.loop_seconds:.2f} s "
            f"for {nominal:.2f} s of simulated work: exports run on async_tee's exporting thread "
            "and the tee only enqueues, so nothing on the training thread waits for the collector."
        )
    return "\n".join(out)

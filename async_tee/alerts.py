"""Prometheus alert rules over async_tee's series: ``async-tee alerts`` (docs/semantics.md §6)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping

from async_tee._declare import series as _series
from async_tee.catalog import series_catalog

__all__ = ["AlertRule", "AlertThresholds", "alert_rules", "parse_duration", "render_rules"]

GROUP = "async_tee"
"""The rule group's name in the generated file."""

IDENTITY = "on (job, instance) group_left (rl_rank, rl_run_id) target_info"
"""The join that puts a process's rank and run on a series (OTel resource attributes are
on ``target_info`` only): ``<vector> * IDENTITY``; ``target_info`` is 1."""

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a number of seconds, or Prometheus-style ``90s``, ``15m``, ``2h``.

    Raises:
        ValueError: ``text`` is not one of those, or is negative.
    """
    found = _DURATION.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"not a duration: {text!r} (say 300, 300s, 5m or 2h)")
    return float(found.group(1)) * _UNIT_S[found.group(2)]


def prometheus_duration(seconds: float) -> str:
    """``seconds`` as a Prometheus duration in the largest unit that holds it whole."""
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {seconds}")
    ms = round(seconds * 1000)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms" if ms else "0s"


SELECTOR = "{sel}"
"""Where a rule's quantity takes the dashboard's selector (nothing in the rule itself)."""


def without_selector(quantity: str) -> str:
    """A quantity as the rule writes it: its dashboard selector slots removed."""
    return quantity.replace("{" + SELECTOR + "}", "").replace(", " + SELECTOR, "")


def with_selector(quantity: str, matchers: str) -> str:
    """A quantity as a dashboard panel writes it: ``matchers`` in its selector slots."""
    return quantity.replace(SELECTOR, matchers)


@dataclasses.dataclass(frozen=True)
class AlertThresholds:
    """Every threshold of the rules, with defaults for a run of steps of seconds to minutes.

    Attributes:
        stuck_after_s: No step completed for this long on a rank that has stepped (and,
            where NeMo-RL's stall watchdog reports, no rollout committed for as long, or
            its report is not current: no sample within ``rank_silent_s``).
        rollout_idle_s: NeMo-RL's stall watchdog: no rollout committed and no step
            completed for this long (its ``stall_timeout_s``, 600 s by default).
        first_step_within_s: A run with no completed step this long after its ranks
            started exporting (model loading, compilation, the first rollout).
        straggler_steps: A rank this many steps behind the furthest rank of its run.
        queue_full_fraction: The tee's queue this full (of ``ASYNC_TEE_QUEUE_SIZE``).
        lag_p99_ms: The tee-to-record lag's p99 over ``window_s`` above this.
        rank_gone_window_s: A rank that exported within this window and does not now,
            while its run goes on.
        rank_silent_s: A rank whose newest export is older than this does not export now.
            On a scrape a dead rank's series end at once (staleness markers); pushed over
            OTLP (a Collector's remote write, Prometheus 3's OTLP receiver) they have none
            and would stay current for Prometheus's 5-minute lookback. Keep it above the
            export interval (``OTEL_METRIC_EXPORT_INTERVAL``, 60 s by default). The stall
            watchdog's idle time is current by the same measure (``RLTrainerStuck``).
        window_s: The window of the counters' ``increase`` (NaN, drops, failed exports).
        for_multiplier: Scales every rule's ``for:`` (pending period); 0 fires at once.
    """

    stuck_after_s: float = 900.0
    rollout_idle_s: float = 600.0
    first_step_within_s: float = 7200.0
    straggler_steps: int = 10
    queue_full_fraction: float = 0.9
    lag_p99_ms: float = 5000.0
    rank_gone_window_s: float = 3600.0
    rank_silent_s: float = 180.0
    window_s: float = 300.0
    for_multiplier: float = 1.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"alert threshold {field.name} must be >= 0, got {value!r}")
        if not 0 < self.queue_full_fraction <= 1:
            raise ValueError(
                f"queue_full_fraction must be in (0, 1], got {self.queue_full_fraction}"
            )
        if self.window_s <= 0 or self.rank_gone_window_s <= 0 or self.rank_silent_s <= 0:
            raise ValueError("window_s, rank_gone_window_s and rank_silent_s must be > 0")


@dataclasses.dataclass(frozen=True)
class AlertRule:
    """One alerting rule.

    Attributes:
        name: The alert's name (``alertname``).
        severity: ``critical`` or ``warning`` (the ``severity`` label).
        expr: The PromQL expression; every series it returns is an alert.
        for_s: How long ``expr`` must hold before the alert fires (pending until then).
        summary: One line, the alert's ``summary`` annotation.
        description: Which run and rank, and what happened (``$labels`` templates only).
        look_at: What to look at first (the ``look_at`` annotation).
        metrics: The catalog's Prometheus names the rule reads.
        quantity: What ``expr`` compares with its threshold, with :data:`SELECTOR` slots
            for the dashboard's matchers; None where the rule is a set difference.
        threshold: The number the quantity is compared with, for the dashboard.
    """

    name: str
    severity: str
    expr: str
    for_s: float
    summary: str
    description: str
    look_at: str
    metrics: tuple[str, ...]
    quantity: str | None = None
    threshold: float | None = None

    def annotations(self) -> dict[str, str]:
        """The rule's annotations, in file order."""
        return {"summary": self.summary, "description": self.description, "look_at": self.look_at}


def _names() -> Mapping[str, str]:
    """OTel name -> Prometheus name, for every series in the catalog."""
    return {entry.name: entry.prometheus_name for entry in series_catalog()}


def _where(extra: str = "") -> str:
    """A selector with a slot for the dashboard's matchers, and ``extra`` matchers."""
    return "{" + ", ".join(part for part in (extra, SELECTOR) if part) + "}"


_RANK = "run {{ $labels.rl_run_id }}, rank {{ $labels.rl_rank }} ({{ $labels.instance }})"


def alert_rules(thresholds: AlertThresholds | None = None) -> list[AlertRule]:
    """The rules, each reading only series the catalog has (``KeyError`` otherwise)."""
    t = thresholds or AlertThresholds()
    names = _names()
    step = names[_series.RL_STEP_METRIC]
    step_time = names[_series.RL_STEP_TIME_METRIC]
    non_finite, dropped = names["async_tee.non_finite"], names["async_tee.dropped"]
    exports, died = names["async_tee.exports"], names["async_tee.worker.died"]
    depth, capacity = names["async_tee.queue.depth"], names["async_tee.queue.capacity"]
    lag = names["async_tee.lag"]
    export_dropped = names["async_tee.export.dropped"]
    idle = names["rl.rollout.idle"]
    window = prometheus_duration(t.window_s)
    gone = prometheus_duration(t.rank_gone_window_s)

    def for_(seconds: float) -> float:
        return seconds * t.for_multiplier

    def compared(quantity: str, threshold: float) -> str:
        return f"{without_selector(quantity)} > {threshold:g}"

    def rose(counter: str) -> str:
        """A counter's series that rose within the window.

        An increase, or a series new in the window and above 0: its first sample came
        after its first event (a scrape that follows a NaN logged at start-up).
        """
        plain = without_selector(counter)
        return f"(increase({plain}[{window}]) > 0 or ({plain} > 0 unless {plain} offset {window}))"

    stuck = f"(time() - {step_time}{_where()}) * {IDENTITY}"
    idle_q = f"{idle}{_where()} * {IDENTITY}"
    # A long step is not a hang while the stall watchdog sees rollouts committing and says so
    # now: its idle sample is fresh. A watchdog that stopped logging leaves its last value
    # (withdrawn after ASYNC_TEE_HELD_TTL); pushed, that value's last sample would stay
    # current for Prometheus's lookback, and a Collector that sends timestamps serves it on.
    fresh = f"(time() - timestamp({idle}{_where()})) < {t.rank_silent_s:g}"
    progressing = f"on (job, instance) ({fresh} and {idle}{_where()} < {t.stuck_after_s:g})"
    steps = f"({step}{_where()} * {IDENTITY})"
    straggler = f"max by (rl_run_id) {steps} - on (rl_run_id) group_right () {steps}"
    sessions = f"group by (job, instance) ({capacity}{_where()}) * {IDENTITY}"
    stepped = f"group by (rl_run_id) ({step_time} * {IDENTITY})"
    ranks = 'target_info{rl_run_id!=""}'
    # Exporting now: a current target_info whose newest sample is recent (no staleness
    # marker ends a pushed series).
    current = (
        f"({ranks} unless on (job, instance) (time() - timestamp({ranks})) > {t.rank_silent_s:g})"
    )
    by_rank = "group by (rl_run_id, rl_rank)"
    non_finite_q = f"increase({non_finite}{_where()}[{window}]) * {IDENTITY}"
    failures = _where('result="failure"')
    failed = f"sum without (trigger) (increase({exports}{failures}[{window}]))"
    dropped_q = f"increase({dropped}{_where()}[{window}]) * {IDENTITY}"
    export_dropped_q = f"increase({export_dropped}{_where()}[{window}]) * {IDENTITY}"
    fill = f"{depth}{_where()} / {capacity}{_where()} * {IDENTITY}"
    buckets = f"rate({lag}_bucket{_where()}[{window}])"
    lag_q = f"histogram_quantile(0.99, sum by (le, job, instance) ({buckets})) * {IDENTITY}"
    return [
        AlertRule(
            "RLTrainerStuck",
            "critical",
            f"{compared(stuck, t.stuck_after_s)} unless {without_selector(progressing)}",
            for_(300),
            "No training step completed for over "
            f"{prometheus_duration(t.stuck_after_s)} on a rank that was stepping",
            f"{_RANK}: last step completed {{{{ $value | humanizeDuration }}}} ago.",
            "The rank's log and stack (py-spy dump): a hung collective, a stalled data "
            "or rollout worker, a checkpoint that does not finish.",
            (step_time, idle),
            stuck,
            t.stuck_after_s,
        ),
        AlertRule(
            "RLRolloutIdle",
            "critical",
            compared(idle_q, t.rollout_idle_s),
            for_(60),
            "No rollout committed and no step completed for over "
            f"{prometheus_duration(t.rollout_idle_s)} (NeMo-RL's stall watchdog)",
            f"{_RANK}: the stall watchdog saw no progress for {{{{ $value | humanizeDuration }}}}.",
            "Rollouts in flight (rl_rollout_inflight), serving generation shards "
            "(rl_gen_fleet_serving_shards), infra drops; the controller's log.",
            (idle,),
            idle_q,
            t.rollout_idle_s,
        ),
        AlertRule(
            "RLNoFirstStep",
            "critical",
            f"{without_selector(sessions)} unless on (rl_run_id) {stepped}",
            for_(t.first_step_within_s),
            "A run's ranks have exported for "
            f"{prometheus_duration(t.first_step_within_s)} and no step has completed",
            f"{_RANK}: telemetry started, no rank of the run has completed a step.",
            "Start-up: model loading, weight sync, compilation, the first rollout; the "
            "rank's log for where it waits.",
            (capacity, step_time),
        ),
        AlertRule(
            "RLRankGone",
            "critical",
            f"{by_rank} (last_over_time({ranks}[{gone}])) unless on (rl_run_id, rl_rank) "
            f"{by_rank} {current} and on (rl_run_id) group by (rl_run_id) {current}",
            for_(60),
            "A rank stopped exporting while the rest of its run goes on",
            f"run {{{{ $labels.rl_run_id }}}}, rank {{{{ $labels.rl_rank }}}}: exported "
            f"within {gone}, not now; other ranks of the run still export.",
            "Whether the process is alive (OOM killer, a node lost) and its last log lines.",
            (),
        ),
        AlertRule(
            "RLNonFiniteValues",
            "warning",
            f"{rose(non_finite + _where())} * {IDENTITY}",
            for_(0),
            "A training series received NaN or infinite values",
            f"{_RANK}: {{{{ $value }}}} non-finite values of {{{{ $labels.series }}}} in "
            f"the last {window}; they are counted, not exported.",
            "The loss scale, the learning rate, the batch that produced it; a NaN loss "
            "usually means the run should stop.",
            (non_finite,),
            non_finite_q,
            0,
        ),
        AlertRule(
            "RLStraggler",
            "warning",
            compared(straggler, t.straggler_steps),
            for_(120),
            f"A rank is more than {t.straggler_steps} steps behind its run",
            f"{_RANK}: {{{{ $value }}}} steps behind the furthest rank of its run.",
            "The slow rank's node: GPU clocks, thermal throttling, a noisy neighbour, data "
            "loading.",
            (step,),
            straggler,
            t.straggler_steps,
        ),
        AlertRule(
            "AsyncTeeExportsFailing",
            "warning",
            f"sum without (trigger) {rose(exports + failures)} * {IDENTITY}",
            for_(0),
            "Exports of training telemetry failed",
            f"{_RANK}: {{{{ $value }}}} failed exports in the last {window} (seen once "
            "one got through).",
            "The collector's health and OTEL_EXPORTER_OTLP_ENDPOINT; async_tee.stats() "
            'shows the last error under "exporters".',
            (exports,),
            f"{failed} * {IDENTITY}",
            0,
        ),
        AlertRule(
            "AsyncTeeDropping",
            "warning",
            f"{rose(dropped + _where())} * {IDENTITY}",
            for_(0),
            "The tee dropped logged dicts",
            f"{_RANK}: {{{{ $value }}}} dicts dropped ({{{{ $labels.reason }}}}) in the "
            f"last {window}.",
            "overflow: a burst larger than ASYNC_TEE_QUEUE_SIZE, or a worker starved of "
            "the GIL; error: async_tee's log.",
            (dropped,),
            dropped_q,
            0,
        ),
        AlertRule(
            "AsyncTeeExportsDropped",
            "warning",
            f"{rose(export_dropped + _where())} * {IDENTITY}",
            for_(0),
            "OTLP export requests were dropped before delivery: steps are missing",
            f"{_RANK}: {{{{ $value }}}} export requests dropped ({{{{ $labels.reason }}}}) in "
            f"the last {window}; the steps they carried never reached the receiver.",
            "overflow: the receiver was away longer than ASYNC_TEE_EXPORT_BACKLOG_BYTES holds; "
            "refused: the rank's log names the receiver's answer and its fix; shutdown: the "
            "receiver was away when the rank stopped.",
            (export_dropped,),
            export_dropped_q,
            0,
        ),
        AlertRule(
            "AsyncTeeWorkerDied",
            "critical",
            compared(f"{died}{_where()} * {IDENTITY}", 0),
            for_(0),
            "async_tee's worker stopped: this rank's telemetry is off",
            f"{_RANK}: the worker thread ended unexpectedly; nothing more is recorded.",
            "async_tee's error in the rank's log.",
            (died,),
            f"{died}{_where()} * {IDENTITY}",
            0,
        ),
        AlertRule(
            "AsyncTeeQueueNearFull",
            "warning",
            compared(fill, t.queue_full_fraction),
            for_(60),
            f"The tee's queue is over {t.queue_full_fraction:.0%} full",
            f"{_RANK}: the queue is {{{{ $value | humanizePercentage }}}} full; dicts "
            "are dropped when it is full.",
            "The worker's CPU share (GIL contention) and ASYNC_TEE_QUEUE_SIZE.",
            (depth, capacity),
            fill,
            t.queue_full_fraction,
        ),
        AlertRule(
            "AsyncTeeLagHigh",
            "warning",
            compared(lag_q, t.lag_p99_ms),
            for_(300),
            f"Tee-to-record lag p99 above {t.lag_p99_ms:g} ms",
            f"{_RANK}: p99 lag {{{{ $value }}}} ms over {window}.",
            "The worker's CPU share (GIL contention) and ASYNC_TEE_DRAIN_INTERVAL.",
            (lag + "_bucket",),
            lag_q,
            t.lag_p99_ms,
        ),
    ]


def _quoted(text: str) -> str:
    """A YAML double-quoted scalar (JSON's escapes are YAML's)."""
    return json.dumps(text, ensure_ascii=False)


def render_rules(thresholds: AlertThresholds | None = None) -> str:
    """The rules as a Prometheus rules file (YAML, one group), ready for ``rule_files``."""
    lines = [
        "# Generated by `async-tee alerts` from async_tee's series catalog.",
        "groups:",
        f"  - name: {GROUP}",
        "    rules:",
    ]
    for rule in alert_rules(thresholds):
        lines += [
            f"      - alert: {rule.name}",
            f"        expr: {_quoted(rule.expr)}",
            f"        for: {prometheus_duration(rule.for_s)}",
            "        labels:",
            f"          severity: {rule.severity}",
            "        annotations:",
            *(f"          {key}: {_quoted(value)}" for key, value in rule.annotations().items()),
        ]
    return "\n".join(lines) + "\n"

"""Every series async_tee derives or reports itself, each stated once (docs/semantics.md §3, §6)."""

from __future__ import annotations

import dataclasses

RL_EFFICIENCY_SECONDS_METRIC = "rl.efficiency.seconds"
RL_EFFICIENCY_PCT_METRIC = "rl.efficiency.pct"
RL_SETUP_DURATION_METRIC = "rl.setup.duration"
RL_STEP_METRIC = "rl.step"
RL_STEP_TIME_METRIC = "rl.step.time"

RL_EFFICIENCY_CATEGORY_ATTR = "rl.efficiency.category"
RL_EFFICIENCY_MEASUREMENT_ATTR = "rl.efficiency.measurement"
RL_EFFICIENCY_WINDOW_ATTR = "rl.efficiency.window"
RL_BUCKET_ATTR = "rl.bucket"
RL_SETUP_PHASE_ATTR = "rl.setup.phase"
RL_STEP_PHASE_ATTR = "rl.step.phase"
RL_SHARD_STATE_ATTR = "rl.shard.state"
RL_STEP_PHASE_DURATION_METRIC = "rl.step.phase.duration"
RL_TRAINER_ATTR = "rl.trainer"
RL_KEY_ATTR = "rl.key"

SELF_METRIC_GROUP = "async_tee"
"""The registry group of the ``async_tee.*`` series."""

LAG_KEY = "lag"
LAG_BUCKETS_MS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000)
"""Lag boundaries in milliseconds (how late the worker recorded a dict, docs/semantics.md §6):
from well under one drain's work to the seconds a worker starved of the GIL falls behind."""


@dataclasses.dataclass(frozen=True)
class Series:
    """One series async_tee defines itself.

    Attributes:
        key: The registry key it is recorded against (a Python identifier).
        name: The OTel series name.
        kind: The registry kind (``gauge``, ``histogram``, ``observable_counter``, ...).
        unit: The OTel unit, or empty.
        description: Help text carried to the backend.
        attributes: The attribute keys its points carry (``rl.bucket`` only on the
            efficiency categories that have a bucket).
        logger_key: The ``Logger`` key or key pattern it reads; empty for self-series.
        stats_field: For self-series, the ``stats()`` field an export reads it from.
    """

    key: str
    name: str
    kind: str
    unit: str
    description: str
    attributes: tuple[str, ...] = ()
    logger_key: str = ""
    stats_field: str = ""
    held: bool = False

    @property
    def triple(self) -> tuple[str, str, str]:
        """``(name, kind, unit)``, what the Prometheus collision check reads."""
        return (self.name, self.kind, self.unit)


EFFICIENCY_SECONDS = Series(
    "efficiency_seconds",
    RL_EFFICIENCY_SECONDS_METRIC,
    "gauge",
    "s",
    "Seconds spent per efficiency category (async runs).",
    (
        RL_EFFICIENCY_CATEGORY_ATTR,
        RL_EFFICIENCY_MEASUREMENT_ATTR,
        RL_EFFICIENCY_WINDOW_ATTR,
        RL_BUCKET_ATTR,
    ),
    "efficiency/<category>_s",
)
EFFICIENCY_PCT = Series(
    "efficiency_pct",
    RL_EFFICIENCY_PCT_METRIC,
    "gauge",
    "%",
    "Share of wall time spent productively.",
    (RL_EFFICIENCY_MEASUREMENT_ATTR, RL_EFFICIENCY_WINDOW_ATTR),
    "efficiency/efficiency_pct",
)
SETUP_DURATION = Series(
    "setup_duration",
    RL_SETUP_DURATION_METRIC,
    "gauge",
    "s",
    "Start-up phase durations, reported once at step 0.",
    (RL_SETUP_PHASE_ATTR,),
    "timing/setup:*_s",
)
STEP_PHASE_DURATION = Series(
    "step_phase_duration",
    RL_STEP_PHASE_DURATION_METRIC,
    "gauge",
    "s",
    "Seconds the step spent in each phase of its timing dict (phases nest: never sum them).",
    (RL_STEP_PHASE_ATTR,),
    "timing/train:*",
)

STEP = Series(
    "step",
    RL_STEP_METRIC,
    "gauge",
    "{step}",
    "The last step completed: the step the other rl.* values of a step-aligned export belong to.",
    logger_key="step",
)
STEP_TIME = Series(
    "step_time",
    RL_STEP_TIME_METRIC,
    "gauge",
    "s",
    "Unix time at which the last step completed (its last dict was logged): a liveness signal.",
    logger_key="step",
)

GEN_FLEET_SHARDS = Series(
    "gen_fleet_shards",
    "rl.gen_fleet.shards",
    "gauge",
    "{shard}",
    "Generation shards per state, as NeMo-RL's fleet health last reported them (held).",
    (RL_SHARD_STATE_ATTR,),
    "gen_fleet/shards/<state>",
    held=True,
)
LOGGED_VALUE = Series(
    "logged_value",
    "rl.logged.value",
    "gauge",
    "",
    "A trainer's logged key no rl.* series reads, as logged (the key is the rl.key attribute).",
    (RL_TRAINER_ATTR, RL_KEY_ATTR),
    "<trainer>:*",
)
SHARD_STATES = ("healthy", "suspect", "dead", "restarting", "stale", "retired")
"""NeMo-RL's ``ShardState`` values: the states ``rl.gen_fleet.shards`` reads (bounded)."""

DERIVED: tuple[Series, ...] = (
    EFFICIENCY_SECONDS,
    EFFICIENCY_PCT,
    SETUP_DURATION,
    STEP_PHASE_DURATION,
    STEP,
    STEP_TIME,
    GEN_FLEET_SHARDS,
    LOGGED_VALUE,
)
"""The ``rl.*`` series the tee derives itself; no declared row may take their names."""


def _self(
    key: str, name: str, kind: str, unit: str, description: str, field: str, *by: str
) -> Series:
    return Series(key, name, kind, unit, description, by, stats_field=field)


SELF: tuple[Series, ...] = (
    _self(
        "enqueued",
        "async_tee.enqueued",
        "observable_counter",
        "{dict}",
        "Dicts handed to the tee on a teed prefix.",
        "enqueued",
    ),
    _self(
        "recorded",
        "async_tee.recorded",
        "observable_counter",
        "{dict}",
        "Dicts mapped and recorded by the worker.",
        "recorded",
    ),
    _self(
        "dropped",
        "async_tee.dropped",
        "observable_counter",
        "{dict}",
        "Dicts not recorded, by reason (overflow, error, shutdown, snapshot).",
        "dropped_by_reason",
        "reason",
    ),
    _self(
        "queue_depth",
        "async_tee.queue.depth",
        "observable_gauge",
        "{dict}",
        "Dicts waiting for the worker.",
        "pending",
    ),
    _self(
        "worker_died",
        "async_tee.worker.died",
        "observable_gauge",
        "",
        "1 if the worker stopped unexpectedly (the tee is then off), else 0.",
        "worker_died",
    ),
    _self(
        "queue_capacity",
        "async_tee.queue.capacity",
        "observable_gauge",
        "{dict}",
        "The hand-off queue's bound (ASYNC_TEE_QUEUE_SIZE).",
        "capacity",
    ),
    _self(
        "values_skipped",
        "async_tee.values.skipped",
        "observable_counter",
        "{value}",
        "Values not exported, by reason (non_finite, rejected, cardinality).",
        "values_skipped",
        "reason",
    ),
    _self(
        "non_finite",
        "async_tee.non_finite",
        "observable_counter",
        "{value}",
        "NaN or infinite values seen, by series.",
        "non_finite_by_series",
        "series",
    ),
    _self(
        "errors",
        "async_tee.errors",
        "observable_counter",
        "{error}",
        "Failures inside async_tee, by where they happened.",
        "errors",
        "where",
    ),
    _self(
        "exports",
        "async_tee.exports",
        "observable_counter",
        "{export}",
        "Export attempts of the providers async_tee built, by what triggered them and result.",
        "exports_by_trigger",
        "trigger",
        "result",
    ),
    _self(
        "export_queued",
        "async_tee.export.queued",
        "observable_gauge",
        "{request}",
        "OTLP export requests not delivered yet: the first hop's backlog, sent in order.",
        "delivery.queued",
    ),
    _self(
        "export_dropped",
        "async_tee.export.dropped",
        "observable_counter",
        "{request}",
        "OTLP export requests never delivered, by reason (overflow, refused, shutdown).",
        "delivery.dropped",
        "reason",
    ),
    _self(
        "steps_coalesced",
        "async_tee.steps.coalesced",
        "observable_counter",
        "{step}",
        "Completed steps whose values were not exported on their own (folded into a later export).",
        "steps.coalesced",
    ),
    Series(
        LAG_KEY,
        "async_tee.lag",
        "histogram",
        "ms",
        "How late the worker recorded a dict: from the tee call, or from the wake the worker "
        "had planned if later, to the record in the SDK.",
    ),
)
"""async_tee's own series; all but the lag histogram are read from ``stats()`` per export."""

"""The mapping of a logged dict to ``rl.*`` values, compiled once (docs/semantics.md §2, §3)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from async_tee._declare import series as _series
from async_tee._declare.attributes import NO_ATTRIBUTES, FrozenAttributes
from async_tee._declare.rows import (
    BUILT_IN_PREFIXES,
    SETUP_PREFIX,
    STEP_TIMING_PREFIX,
    WALL_CLOCK_MEASUREMENT,
    EfficiencyCategory,
    TeedMetric,
)
from async_tee._declare.trainers import TRAINERS, TrainerKeys
from async_tee.vocabulary import (
    DEVICE_TENSOR,
    NOT_A_NUMBER,
    RUN_WINDOW_WALL_CLOCK_CATEGORIES,
    as_scalar,
    skip_reason,
    teed_metrics,
)

STEP_WINDOW = "step"
"""The value covers the current step (the driver resets its timer every step)."""

RUN_WINDOW = "run"
"""The value is cumulative over the run so far."""

EFFICIENCY_KEY_PREFIX = "efficiency/"
EFFICIENCY_SECONDS_SUFFIX = "_s"
EFFICIENCY_PCT_KEY = "efficiency/efficiency_pct"
EFFICIENCY_PCT_IS_PER_STEP_KEY = "efficiency/efficiency_pct_is_per_step"

_SETUP_SUFFIXES = ("_time_s", "_s")

READ_WHOLE = frozenset({SETUP_PREFIX, STEP_TIMING_PREFIX, ""})
"""The prefixes whose every key a family reads: start-up phases, step phases, and the
``""`` dict's efficiency keys (an ``efficiency/<c>_s`` of a category not in the map is
counted, so it must be seen). Their dicts are copied whole, up to a bound (§6); every other
prefix's are snapshotted to the keys its rows read."""


class Store(Protocol):
    """A registry table's one-store fast path (``registry.LastValue.store``)."""

    def store(self, raw: Any, attributes: FrozenAttributes) -> bool:
        """Record ``raw`` at once if it is a finite float for a held set; else False."""


ScalarPlan = tuple[tuple[str, str, bool, "Store | None"], ...]
"""Per declared row of one prefix: its ``Logger`` key, its registry key, whether it is a
counter (fed per-step deltas), and its table (None: every value takes the registry's checks)."""
HeldPlan = tuple[tuple[str, str], ...]
"""A prefix's held rows (``TeedMetric.held``): ``(logger key, registry key)``."""
ROWS_PER_OFFER = 256
"""Declared rows mapped between two offers of the GIL (a few hundred µs at most)."""

EfficiencyPlan = tuple[tuple[str, str], ...]
"""Per known category: its ``Logger`` seconds key and the category."""

Skipped = dict[str, int]
"""Values not taken, by reason (``async_tee.values.skipped{reason}``)."""

UNKNOWN_CATEGORY = "unknown_category"
"""The reason an ``efficiency/<c>_s`` value of a category not in the map is not taken."""

STALE_STEP = "stale_step"
"""The reason a gauge value of a dict of an older step is not taken: the tables hold a
newer step's values, and an export names one step (docs/semantics.md §9)."""

UNKNOWN_STATE = "unknown_state"
"""A ``gen_fleet/shards/<state>`` key whose state is not one of NeMo-RL's (``SHARD_STATES``)."""
PER_SHARD = "per_shard"
"""A per-shard key of NeMo-RL's fleet health (``gen_fleet/restart_attempts/<shard>``, ...):
not read, one attribute set a shard would grow with the fleet."""
FLEET_SHARDS_PREFIX = "gen_fleet/shards/"
PER_SHARD_PREFIXES = ("gen_fleet/restart_attempts/", "gen_fleet/shard_weight_version/")

KEY_LIMIT = "key_limit"
"""A trainer's key past the keys its prefix passes through (``ASYNC_TEE_TRAINER_KEYS``)."""

HELD_EXPIRED = "held_expired"
"""A held series' attribute set withdrawn from exports: not logged again within
``ASYNC_TEE_HELD_TTL`` (counted by the registry, once per withdrawal; docs/semantics.md §3g)."""

LEFT_OUT_REASON = "left_out"
"""The reason for keys the caller left out of a snapshot: past the bound of a dict read
whole, or a key whose lookup raised (docs/semantics.md §6)."""

SKIP_REASONS = (
    "non_finite",
    "rejected",
    "cardinality",
    NOT_A_NUMBER,
    DEVICE_TENSOR,
    UNKNOWN_CATEGORY,
    STALE_STEP,
    LEFT_OUT_REASON,
    UNKNOWN_STATE,
    PER_SHARD,
    HELD_EXPIRED,
    KEY_LIMIT,
)
"""Every reason ``async_tee.values.skipped`` counts a value under (docs/semantics.md §4, §8):
the registry's three, and the mapping's: not a number, a tensor on an accelerator, an
efficiency category not in the map, a gauge value of a step already exported, a key the
caller left out of its snapshot."""


@dataclasses.dataclass(frozen=True)
class TrainerPlan:
    """What a trainer's prefix reads besides its scalars (docs/semantics.md §13).

    Attributes:
        read: The keys its aliases and declared rows read: never passed through.
        phase_prefix: Its keys under this are step phases (empty: none are).
    """

    read: frozenset[str]
    phase_prefix: str = ""


@dataclasses.dataclass(frozen=True)
class MappingPlan:
    """What the mapping reads from each teed dict, compiled once a session.

    Attributes:
        scalars: The declared rows each prefix's dicts are read for (``""`` for None), in
            declaration order.
        efficiency: The known efficiency categories.
        efficiency_attributes: Each category's attribute set on ``rl.efficiency.seconds``.
        efficiency_keys: Every ``efficiency/`` key of a ``""`` dict that is read (by a
            category or a row); another ``efficiency/<c>_s`` is an unknown category.
        phase_rows: The ``timing/train`` keys a row reads: not step phases.
        trainers: For each trainer's prefix (``_declare/trainers``), what it reads besides
            its scalars; its scalars hold its aliases, then any rows declared on it.
        snapshot_keys: For each prefix the tee takes (None counts as ``""``), the keys
            the caller snapshots a dict of it to (every key read from it), or None where a
            family reads every key (``timing/setup``, ``timing/train``, ``""``: copied
            whole, up to a bound), §6.
    """

    scalars: Mapping[str, ScalarPlan]
    efficiency: EfficiencyPlan
    efficiency_attributes: Mapping[str, FrozenAttributes]
    efficiency_keys: frozenset[str]
    phase_rows: frozenset[str]
    snapshot_keys: Mapping[str | None, tuple[str, ...] | None]
    held: Mapping[str, HeldPlan] = dataclasses.field(default_factory=dict)
    trainers: Mapping[str, TrainerPlan] = dataclasses.field(default_factory=dict)

    @property
    def prefixes(self) -> frozenset[str | None]:
        """Every prefix the tee takes (None counts as ``""``)."""
        return frozenset(self.snapshot_keys)

    def bind(self, tables: Mapping[str, Store]) -> MappingPlan:
        """The same plan with each row's table (a session's registry), for the fast path."""
        scalars = {
            prefix: tuple((lk, key, counted, tables.get(key)) for lk, key, counted, _ in plan)
            for prefix, plan in self.scalars.items()
        }
        return dataclasses.replace(self, scalars=scalars)


def efficiency_window(category: str, measurement: str) -> str:
    """Return the period one efficiency value covers.

    Wall-clock timers are reset every step except the run-window categories
    (``init/total``, measured once and republished); every other measurement kind is a
    cumulative timer that is never reset.
    """
    if measurement == WALL_CLOCK_MEASUREMENT:
        return RUN_WINDOW if category in RUN_WINDOW_WALL_CLOCK_CATEGORIES else STEP_WINDOW
    return RUN_WINDOW


def efficiency_seconds_key(category: str) -> str:
    """The ``Logger`` key of a category's seconds: ``efficiency/<category>_s``."""
    return f"{EFFICIENCY_KEY_PREFIX}{category}{EFFICIENCY_SECONDS_SUFFIX}"


def efficiency_attributes(
    categories: Mapping[str, EfficiencyCategory],
) -> dict[str, FrozenAttributes]:
    """The attribute set of every known category (bounded by the category map)."""
    out = {}
    for category, spec in categories.items():
        attributes = {
            _series.RL_EFFICIENCY_CATEGORY_ATTR: category,
            _series.RL_EFFICIENCY_MEASUREMENT_ATTR: spec.measurement,
            _series.RL_EFFICIENCY_WINDOW_ATTR: efficiency_window(category, spec.measurement),
        }
        if spec.bucket:
            attributes[_series.RL_BUCKET_ATTR] = spec.bucket
        out[category] = FrozenAttributes(attributes)
    return out


PCT_ATTRIBUTES = {
    window: FrozenAttributes(
        {
            _series.RL_EFFICIENCY_MEASUREMENT_ATTR: WALL_CLOCK_MEASUREMENT,
            _series.RL_EFFICIENCY_WINDOW_ATTR: window,
        }
    )
    for window in (STEP_WINDOW, RUN_WINDOW)
}
"""``rl.efficiency.pct``'s attribute set for each window."""


def _scalar_plan(rows: Iterable[TeedMetric]) -> ScalarPlan:
    return tuple((row.logger_key, row.key, row.kind == "counter", None) for row in rows)


def _efficiency_plan(categories: Iterable[str]) -> EfficiencyPlan:
    return tuple((efficiency_seconds_key(category), category) for category in categories)


def compile_plan(
    rows: Iterable[TeedMetric], categories: Mapping[str, EfficiencyCategory]
) -> MappingPlan:
    """The plan for these rows and categories (the closed declarations, at session start)."""
    rows = tuple(rows)
    by_prefix: dict[str, list[TeedMetric]] = {prefix or "": [] for prefix in BUILT_IN_PREFIXES}
    for row in rows:
        for prefix in row.prefixes:
            by_prefix.setdefault(prefix, []).append(row)
    del by_prefix[SETUP_PREFIX]  # its every key is a start-up phase
    scalars = {
        prefix: _scalar_plan(row for row in group if not row.held)
        for prefix, group in by_prefix.items()
    }
    trainers = {}
    for trainer in TRAINERS:
        aliases = _alias_plan(trainer, rows)
        scalars[trainer.prefix] = aliases + scalars.get(trainer.prefix, ())
        keys = frozenset(row[0] for row in scalars[trainer.prefix])
        trainers[trainer.prefix] = TrainerPlan(keys, trainer.phase_prefix)
    held = {
        prefix: plan
        for prefix, group in by_prefix.items()
        if (plan := tuple((row.logger_key, row.key) for row in group if row.held))
    }

    def read(prefix: str) -> tuple[str, ...]:
        held_keys = [logger_key for logger_key, _ in held.get(prefix, ())]
        return tuple(dict.fromkeys([*(row[0] for row in scalars[prefix]), *held_keys]))

    efficiency = _efficiency_plan(categories)
    seconds_keys = [seconds_key for seconds_key, _ in efficiency]
    pct_keys = [EFFICIENCY_PCT_KEY, EFFICIENCY_PCT_IS_PER_STEP_KEY]
    row_keys = set(read(""))
    whole = READ_WHOLE | trainers.keys()
    snapshot_keys = {
        prefix: None if (prefix or "") in whole else read(prefix or "")
        for prefix in (*BUILT_IN_PREFIXES, *by_prefix, *trainers)
    }
    return MappingPlan(
        scalars=scalars,
        efficiency=efficiency,
        efficiency_attributes=efficiency_attributes(categories),
        efficiency_keys=frozenset((*seconds_keys, *pct_keys, *row_keys)),
        phase_rows=frozenset(read(STEP_TIMING_PREFIX)),
        snapshot_keys=snapshot_keys,
        held=held,
        trainers=trainers,
    )


def _alias_plan(trainer: TrainerKeys, rows: tuple[TeedMetric, ...]) -> ScalarPlan:
    """A trainer's aliases as scalar rows: each into the declared row of its series.

    An alias whose series no row declares now (a user's row renamed it) reads nothing:
    its key is passed through instead.
    """
    by_name = {row.name: row for row in rows if not row.held}
    return tuple(
        (key, row.key, row.kind == "counter", None)
        for key, name in trainer.aliases
        if (row := by_name.get(name)) is not None
    )


def count_skipped(skipped: Skipped | None, reason: str, count: int = 1) -> None:
    """Add ``count`` values not taken for ``reason`` to ``skipped`` (None: not counting)."""
    if skipped is not None:
        skipped[reason] = skipped.get(reason, 0) + count


def scalar_values(
    plan: ScalarPlan,
    metrics: Mapping[str, Any],
    step: Any = None,
    first_time: Callable[[Any, str, float], bool] | None = None,
    skipped: Skipped | None = None,
    stale: bool = False,
    spend: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Map the declared rows of one dict: ``{registry key: value}`` left to record.

    A value a row's table stores in one step (a finite float) is recorded there and left
    out; a counter's value counts only the first time its ``(step, key)`` is seen
    (``first_time``; without a step, or without ``first_time``, every value counts). An
    absent key (or None) is left out: absent means no data, never zero. A value that is
    not a scalar is left out and counted in ``skipped`` by reason; so is a gauge's value
    from a dict of an older step (``stale``), whose counters still count. ``spend`` (the
    worker's ``_worker/gil`` budget) is called between runs of ``ROWS_PER_OFFER`` rows, so
    thousands of declared rows are not one hold of the GIL.
    """
    get = metrics.get
    values: dict[str, float] = {}
    for start in range(0, len(plan), ROWS_PER_OFFER):
        if start and spend is not None:
            spend()
        _map_rows(
            plan[start : start + ROWS_PER_OFFER], get, values, step, first_time, skipped, stale
        )
    return values


def _map_rows(
    plan: ScalarPlan,
    get: Callable[[str], Any],
    values: dict[str, float],
    step: Any,
    first_time: Callable[[Any, str, float], bool] | None,
    skipped: Skipped | None,
    stale: bool,
) -> None:
    """``scalar_values`` for a run of rows, into ``values``."""
    for logger_key, key, counted, table in plan:
        raw = get(logger_key)
        if raw is None:
            continue
        if not counted:
            if stale:
                count_skipped(skipped, STALE_STEP)
                continue
            if table is not None and table.store(raw, NO_ATTRIBUTES):
                continue
        value = as_scalar(raw)
        if value is None:
            count_skipped(skipped, skip_reason(raw))
            continue
        if counted:  # a step's delta counts once: check before adding it
            if step is not None and first_time is not None and not first_time(step, key, value):
                continue
            if table is not None and table.store(raw, NO_ATTRIBUTES):
                continue
        values[key] = value


def held_values(
    plan: HeldPlan, metrics: Mapping[str, Any], skipped: Skipped | None = None
) -> dict[str, float]:
    """Map a dict's held rows: ``{registry key: value}``, whatever the dict's step.

    A held row's value is the state now (a counter's: its running total), so a dict of a
    completed step counts as much as the open step's. An absent key (or None) is left
    out; a value that is not a scalar is left out and counted in ``skipped``.
    """
    values: dict[str, float] = {}
    for logger_key, key in plan:
        raw = metrics.get(logger_key)
        if raw is None:
            continue
        value = as_scalar(raw)
        if value is None:
            count_skipped(skipped, skip_reason(raw))
            continue
        values[key] = value
    return values


def fleet_values(
    metrics: Mapping[str, Any], skipped: Skipped | None = None
) -> Iterator[tuple[str, float]]:
    """A ``""`` dict's shard counts per state: ``(state, count)`` (docs/semantics.md §3g).

    Only NeMo-RL's states are read (a bounded attribute); another state's key, and every
    per-shard key, is left out and counted in ``skipped`` (``unknown_state``, ``per_shard``).
    """
    for key, raw in metrics.items():
        if type(key) is not str or not key.startswith("gen_fleet/"):
            continue
        if key.startswith(FLEET_SHARDS_PREFIX):
            state = key[len(FLEET_SHARDS_PREFIX) :]
            if state not in _series.SHARD_STATES:
                count_skipped(skipped, UNKNOWN_STATE)
                continue
            value = as_scalar(raw)
            if value is None:
                count_skipped(skipped, skip_reason(raw))
                continue
            yield state, value
        elif key.startswith(PER_SHARD_PREFIXES):
            count_skipped(skipped, PER_SHARD)


def efficiency_values(
    plan: EfficiencyPlan,
    metrics: Mapping[str, Any],
    table: Store | None = None,
    attributes: Mapping[str, FrozenAttributes] | None = None,
    skipped: Skipped | None = None,
) -> Iterator[tuple[str, float]]:
    """Map the known categories' seconds of one dict: ``(category, seconds)`` left to record.

    Only the known categories' keys are read, so the aggregate ``efficiency/*_s`` keys
    (``total_waste_s``, ``productive_time_s``, ...) stay out of the per-category series.
    With a ``table`` (and the categories' ``attributes``), a finite float is stored at once
    and left out. Values that are not scalars are left out (and counted in ``skipped``).
    """
    get = metrics.get
    for seconds_key, category in plan:
        raw = get(seconds_key)
        if raw is None:
            continue
        if table is not None and attributes is not None and table.store(raw, attributes[category]):
            continue
        value = as_scalar(raw)
        if value is not None:
            yield category, value
        else:
            count_skipped(skipped, skip_reason(raw))


def exact_str_keys(metrics: dict[Any, Any]) -> dict[Any, Any]:
    """``metrics`` with every key an exact ``str``; the dict itself when they all are.

    A ``str`` subclass key becomes its plain text (``str.__str__``, which runs none of the
    subclass's methods); a key that is not a string goes (no family reads one). A subclass
    may override ``__eq__``, ``__hash__`` or ``endswith`` to raise; after this the families
    compare plain strings only, so one such key cannot cost its dict's other values.
    """
    for key in metrics:
        if type(key) is not str:
            break
    else:
        return metrics
    return {str.__str__(key): value for key, value in metrics.items() if isinstance(key, str)}


def unknown_categories(metrics: Mapping[str, Any], read: frozenset[str]) -> list[str]:
    """The ``efficiency/<c>_s`` keys of a ``""`` dict that nothing reads: unknown categories.

    A category the trainer added after the map was written would otherwise be lost in
    silence; the caller counts and names them.
    """
    left = metrics.keys() - read  # in C: most dicts hold no key nothing reads
    if not left:
        return []
    return [
        key
        for key in metrics
        if key in left
        and isinstance(key, str)
        and key.startswith(EFFICIENCY_KEY_PREFIX)
        and key.endswith(EFFICIENCY_SECONDS_SUFFIX)
    ]


def step_phase_values(
    metrics: Mapping[str, Any], rows: frozenset[str], skipped: Skipped | None = None
) -> Iterator[tuple[str, float]]:
    """The step's phases in a ``timing/train`` dict: ``(phase, seconds)``, phase = the key.

    Every key a row does not read is a phase (``total_step_time`` is a row, the step's
    whole time). Phases nest and overlap (``prepare_for_generation/total`` holds
    ``prepare_for_generation/transfer_and_update_weights``): one dimensioned series, never
    summed. Values that are not scalars are left out (and counted in ``skipped``).
    """
    for key, raw in metrics.items():
        if key in rows or not isinstance(key, str) or not key or raw is None:
            continue
        value = as_scalar(raw)
        if value is None:
            count_skipped(skipped, skip_reason(raw))
        else:
            yield key, value


def logged_values(
    metrics: Mapping[str, Any], plan: TrainerPlan, skipped: Skipped | None = None
) -> Iterator[tuple[bool, str, float]]:
    """A trainer's keys no alias or row reads: ``(is_phase, phase or key, value)``.

    A key under the trainer's phase prefix is a step phase, named by the rest of the key;
    every other key is passed through as it was logged. Values that are not scalars are
    left out (and counted in ``skipped``).
    """
    phase_prefix = plan.phase_prefix
    for key, value in step_phase_values(metrics, plan.read, skipped):  # the same reading
        if phase_prefix and key.startswith(phase_prefix) and len(key) > len(phase_prefix):
            yield True, key[len(phase_prefix) :], value
        else:
            yield False, key, value


def map_efficiency_pct(metrics: Mapping[str, Any]) -> tuple[float, str] | None:
    """Extract ``(pct, window)`` from a raw dict, or None when it carries no usable pct.

    The window is ``step`` only when ``efficiency/efficiency_pct_is_per_step`` is truthy;
    absent or falsy means ``run``, because a run-to-date ratio labelled per-step is the
    harmful mistake.
    """
    raw = metrics.get(EFFICIENCY_PCT_KEY)
    value = None if raw is None else as_scalar(raw)
    if value is None:
        return None
    flag = metrics.get(EFFICIENCY_PCT_IS_PER_STEP_KEY)
    try:
        per_step = bool(flag) and flag == flag  # NaN is truthy but means "unknown"
    except Exception:  # noqa: BLE001 - an array-like flag has no truth value
        per_step = False
    return value, STEP_WINDOW if per_step else RUN_WINDOW


def setup_phase(key: Any) -> str | None:
    """Return the start-up phase a ``timing/setup`` key names, or None.

    ``vllm_init_time_s`` -> ``vllm_init``; ``foo_s`` -> ``foo``; ``_s``, ``_time_s`` and
    keys without either suffix (flags such as ``parallel_init_enabled``) name no phase.
    """
    if not isinstance(key, str):
        return None
    for suffix in _SETUP_SUFFIXES:
        if key.endswith(suffix):
            phase = key[: -len(suffix)]
            return phase or None
    return None


def map_setup_seconds(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Extract ``{phase: seconds}`` from a ``timing/setup`` dict; non-numbers are left out."""
    out: dict[str, float] = {}
    for key, raw in metrics.items():
        phase = setup_phase(key)
        if phase is None:
            continue
        value = as_scalar(raw)
        if value is not None:
            out[phase] = value
    return out


# The seed's pure mappers: views of the plans above, compiled once per set of rows.

_cached_scalar_plan = functools.lru_cache(maxsize=8)(_scalar_plan)
_cached_efficiency_plan = functools.lru_cache(maxsize=8)(_efficiency_plan)


def map_teed_scalars(
    metrics: Mapping[str, Any],
    rows: Iterable[TeedMetric] | None = None,
    prefix: str | None = "train",
) -> dict[str, float]:
    """Extract ``{registry key: value}`` for every declared row present in ``metrics``.

    Args:
        metrics: A raw ``Logger`` metrics dict.
        rows: The rows to look up; every declared teed row by default. Only the rows that
            read ``prefix`` are looked up.
        prefix: The prefix ``metrics`` was logged under (a key is read only from its own
            dict's prefix); ``train`` by default.

    Returns:
        Counters included, e.g. ``{"reward_mean": 0.75, "vllm_prompt_tokens": 400.0}``.
        An absent key or a value that is not a scalar is left out.
    """
    candidates = teed_metrics() if rows is None else tuple(rows)
    plan = _cached_scalar_plan(tuple(row for row in candidates if (prefix or "") in row.prefixes))
    return scalar_values(plan, metrics)


def map_efficiency_seconds(
    metrics: Mapping[str, Any], measurement_by_category: Mapping[str, object]
) -> dict[str, float]:
    """Extract ``{category: seconds}`` for the categories in ``measurement_by_category``.

    Only those categories' keys are read (:func:`efficiency_values`).
    """
    plan = _cached_efficiency_plan(tuple(measurement_by_category))
    return dict(efficiency_values(plan, metrics))

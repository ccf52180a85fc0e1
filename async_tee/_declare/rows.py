"""The row types owners declare, and ``DECLARATIONS``, holding them all (docs/semantics.md §5)."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

METRIC_NAME_PREFIX = "rl."
"""Every series async_tee declares starts with this."""

SYNCHRONOUS_KINDS = ("gauge", "counter", "histogram", "up_down_counter")
"""Kinds that are recorded to."""

OBSERVABLE_KINDS = ("observable_gauge", "observable_counter", "observable_up_down_counter")
"""Kinds whose value the exporter pulls from a callback once per export cycle."""

METRIC_KINDS = SYNCHRONOUS_KINDS + OBSERVABLE_KINDS
"""Every kind the metric registry accepts."""

WALL_CLOCK_MEASUREMENT = "wall_clock"
"""The driver's own sequential clock: safe to sum against the step's wall time."""

COLLECTOR_WALL_CLOCK_MEASUREMENT = "collector_wall_clock"
"""Sequential, but on another process's timeline: read per phase, never add up."""

THREAD_SECONDS_MEASUREMENT = "thread_seconds"
"""Accumulated across concurrent threads; may exceed wall time (a saturation signal)."""

MEASUREMENT_KINDS = (
    WALL_CLOCK_MEASUREMENT,
    COLLECTOR_WALL_CLOCK_MEASUREMENT,
    THREAD_SECONDS_MEASUREMENT,
)

HELD_KINDS = ("gauge", "counter")
"""The kinds a held series may be (``TeedMetric.held``)."""

PER_STEP_PREFIXES = ("train", "")
"""The prefixes a row with no prefix of its own reads: the per-step dicts."""

SETUP_PREFIX = "timing/setup"
"""Prefix of the start-up phases dict, logged once at step 0."""

STEP_TIMING_PREFIX = "timing/train"
"""Prefix of the step's timing dict, the last dict of every NeMo-RL step: its keys no row
reads are the step's phases, and it ends a step for callers that pass no step."""

ROWLESS_PREFIXES = (SETUP_PREFIX,)
"""Prefixes whose every key belongs to a derived family: no row may be declared there."""

TRAIN_PREFIXES: tuple[str | None, ...] = PER_STEP_PREFIXES
"""Prefixes of the per-step dicts (the training scalars and the efficiency dict)."""

BUILT_IN_PREFIXES: tuple[str | None, ...] = (
    *TRAIN_PREFIXES,
    None,
    SETUP_PREFIX,
    STEP_TIMING_PREFIX,
)
"""The prefixes the tee takes whatever rows are declared (their families are built in);
the declared rows' prefixes add to them (:attr:`MappingPlan.prefixes`)."""


# OTel's SDK raises a bare Exception at instrument creation for any other name, and for a
# unit that is not ASCII or longer than 63 characters: catch both at declaration instead.
_INSTRUMENT_NAME = re.compile(r"[a-zA-Z][-_./a-zA-Z0-9]{0,254}")
_MAX_UNIT_LENGTH = 63


def registry_key(name: str) -> str:
    """Registry key for a series name (``rl.reward.mean`` -> ``reward_mean``).

    Registry keys must be Python identifiers, so the shared prefix goes and dots become
    underscores. Derived rather than typed out so that a row cannot name its series one
    thing and record against another.
    """
    if name.startswith(METRIC_NAME_PREFIX):
        name = name[len(METRIC_NAME_PREFIX) :]
    return name.replace(".", "_")


def validate_series(name: str, kind: str, unit: str) -> None:
    """Raise ``ValueError`` unless a series with this name, kind and unit can be created.

    Raises:
        ValueError: The name is not a valid OTel instrument name, its registry key is not
            a Python identifier, the kind is unknown, or the unit is not short ASCII.
    """
    if not isinstance(name, str) or not _INSTRUMENT_NAME.fullmatch(name):
        raise ValueError(
            f"series name {name!r} is not a valid OpenTelemetry instrument name "
            "(letters, digits, '_', '.', '-', '/'; starting with a letter; at most 255)"
        )
    if not registry_key(name).isidentifier():
        raise ValueError(
            f"series name {name!r} gives registry key {registry_key(name)!r}, "
            "which is not a Python identifier"
        )
    if kind not in METRIC_KINDS:
        raise ValueError(f"series {name!r}: kind {kind!r} is not one of {METRIC_KINDS}")
    if not isinstance(unit, str) or not unit.isascii() or len(unit) > _MAX_UNIT_LENGTH:
        raise ValueError(
            f"series {name!r}: unit {unit!r} must be ASCII and at most "
            f"{_MAX_UNIT_LENGTH} characters (write 'us', not the micro sign)"
        )


def _check_callback(name: str, kind: str, callback: object) -> None:
    observable = kind in OBSERVABLE_KINDS
    if observable and callback is None:
        raise ValueError(f"observable series {name!r} needs a callback")
    if not observable and callback is not None:
        raise ValueError(f"series {name!r} of kind {kind!r} cannot take a callback")


@dataclasses.dataclass(frozen=True)
class RecordedMetric:
    """A series recorded directly, with no ``Logger`` key behind it.

    Declared by its owner for the same reason the teed rows are: the module that calls
    ``record_rl_metrics`` for a series is the one that names it.

    Attributes:
        name: OTel series name emitted; :func:`registry_key` derives the key.
        kind: One of the registry's kinds (``gauge``, ``counter``, ``histogram``,
            ``up_down_counter``, or an ``observable_*`` kind with a ``callback``).
        unit: UCUM-ish unit string, or empty when dimensionless.
        description: Help text carried to the backend.
        callback: For the observable kinds only: called once per export cycle; returns
            ``opentelemetry.metrics.Observation`` objects.
    """

    name: str
    kind: str = "gauge"
    unit: str = ""
    description: str = ""
    callback: Callable[..., Any] | None = dataclasses.field(default=None, compare=False)

    @functools.cached_property
    def key(self) -> str:
        """Registry key recorded against (computed once: the worker reads it per dict)."""
        return registry_key(self.name)

    def validate(self) -> None:
        """Raise ``ValueError`` for a malformed row (name, kind, unit, callback)."""
        validate_series(self.name, self.kind, self.unit)
        _check_callback(self.name, self.kind, self.callback)


@dataclasses.dataclass(frozen=True)
class TeedMetric:
    """One ``Logger`` key mirrored into OTel, and how it is declared to the registry.

    Attributes:
        logger_key: Key as it appears in the dict handed to ``Logger.log_metrics``.
        name: OTel series name emitted; :func:`registry_key` derives the key.
        kind: One of ``gauge``, ``counter``, ``histogram``, ``up_down_counter``. A
            counter is fed the logged value as a delta.
        unit: UCUM-ish unit string, or empty when dimensionless.
        description: Help text carried to the backend.
        prefix: The prefix of the dict its key arrives in (``"performance"``,
            ``"timing/train"``, ``""``, ...). None, the default, means the per-step
            dicts: ``train`` and ``""``. A key is read only from its own dict's prefix.
        held: A state held for the run rather than a step's value (a stall watchdog's,
            logged while steps may not move, at the last completed step): recorded
            whatever the dict's step and in every export until logged again. A held
            ``counter``'s value is its running total, exported as it is (docs/semantics.md §3g).
    """

    logger_key: str
    name: str
    kind: str = "gauge"
    unit: str = ""
    description: str = ""
    prefix: str | None = None
    held: bool = False

    @functools.cached_property
    def key(self) -> str:
        """Registry key recorded against (computed once: the worker reads it per dict)."""
        return registry_key(self.name)

    @property
    def prefixes(self) -> tuple[str, ...]:
        """The prefixes of the dicts this row reads (None: the per-step ``train``, ``""``)."""
        return PER_STEP_PREFIXES if self.prefix is None else (self.prefix,)

    @property
    def source(self) -> str:
        """Where its value is logged, as a reader writes it: ``performance/tokens_per_sec``."""
        return f"{self.prefix}/{self.logger_key}" if self.prefix else self.logger_key

    def validate(self) -> None:
        """Raise ``ValueError`` for a malformed row (logger key, prefix, name, kind, unit)."""
        if not isinstance(self.logger_key, str) or not self.logger_key:
            raise ValueError(f"series {self.name!r}: logger_key must be a non-empty string")
        if self.prefix is not None and not isinstance(self.prefix, str):
            raise ValueError(f"series {self.name!r}: prefix must be a string or None")
        if self.prefix in ROWLESS_PREFIXES:
            raise ValueError(
                f"series {self.name!r}: every key of a {self.prefix!r} dict is read as a "
                "start-up phase (rl.setup.duration); declare no row under it"
            )
        if self.kind not in SYNCHRONOUS_KINDS:
            raise ValueError(
                f"teed series {self.name!r}: kind {self.kind!r} is not one of "
                f"{SYNCHRONOUS_KINDS} (a logged value is recorded, never pulled)"
            )
        if self.held and self.kind not in HELD_KINDS:
            raise ValueError(
                f"teed series {self.name!r}: a held series is a gauge (the state now) or a "
                f"counter (its running total), not a {self.kind!r}"
            )
        validate_series(self.name, self.kind, self.unit)


@dataclasses.dataclass(frozen=True)
class EfficiencyCategory:
    """How one efficiency category is measured, and which bucket it sums into.

    Attributes:
        measurement: One of :data:`MEASUREMENT_KINDS`.
        bucket: The ``rl.bucket`` attribute (``idle``, ``wasted``, ``overhead``), or None.
    """

    measurement: str
    bucket: str | None = None


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """One series of a metric group.

    Attributes:
        key: The registry key values are recorded against; a Python identifier.
        name: The OTel instrument name.
        kind: ``gauge``, ``counter``, ``histogram``, ``up_down_counter``, or one of
            ``observable_gauge``, ``observable_counter``, ``observable_up_down_counter``.
        unit: UCUM-ish unit, ASCII, at most 63 characters.
        description: Help text carried to the backend.
        callback: For observable kinds only, called once per export cycle with the SDK's
            ``CallbackOptions``; returns ``Observation`` objects.
        buckets: For histograms, explicit bucket boundaries (the SDK's default ones,
            0-10,000, suit neither seconds nor milliseconds).
    """

    key: str
    name: str
    kind: str = "gauge"
    unit: str = ""
    description: str = ""
    callback: Callable[..., Iterable[Any]] | None = dataclasses.field(default=None, compare=False)
    buckets: tuple[float, ...] | None = None
    held: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key.isidentifier():
            raise ValueError(f"metric key {self.key!r} must be a Python identifier")
        validate_series(self.name, self.kind, self.unit)
        _check_callback(self.name, self.kind, self.callback)
        if self.buckets is not None:
            bounds = tuple(float(b) for b in self.buckets)
            if self.kind != "histogram":
                raise ValueError(f"metric {self.name!r}: only a histogram takes buckets")
            if any(not math.isfinite(b) for b in bounds) or list(bounds) != sorted(set(bounds)):
                raise ValueError(f"metric {self.name!r}: buckets must be finite and increasing")
            object.__setattr__(self, "buckets", bounds)
        if self.held and self.kind not in HELD_KINDS:
            raise ValueError(f"metric {self.name!r}: only a gauge or a counter is held")


class Declarations:
    """Every declaration of this process, in one place.

    Attributes:
        teed: Teed rows by (prefix, logger key), in declaration order.
        recorded: Directly recorded rows by series name, in declaration order.
        defaults: Series names of shipped rows that a user's row may replace.
        frozen: Whether declaration is closed (telemetry has started).
        categories: The known efficiency categories.
        groups: The registry's metric groups by name.
        rl_group_failed: Whether declaring the ``rl`` group failed for good.
    """

    def __init__(self) -> None:
        self.teed: dict[tuple[str | None, str], TeedMetric] = {}
        self.recorded: dict[str, RecordedMetric] = {}
        self.defaults: set[str] = set()
        self.frozen = False
        self.categories: dict[str, EfficiencyCategory] = {}
        self.groups: dict[str, tuple[MetricSpec, ...]] = {}
        self.rl_group_failed = False

    def reset(self) -> None:
        """Forget every declaration and reopen declaring (containers cleared in place)."""
        self.teed.clear()
        self.recorded.clear()
        self.defaults.clear()
        self.categories.clear()
        self.groups.clear()
        self.frozen = False
        self.rl_group_failed = False

    def check_not_frozen(self, name: str) -> None:
        """Raise ``RuntimeError`` if declaring ``name`` now would come too late."""
        if self.frozen:
            raise RuntimeError(
                f"cannot declare series {name!r}: telemetry has started and metric "
                "registration is closed; import the module that declares it before "
                "async_tee.start_telemetry()"
            )


DECLARATIONS = Declarations()
"""The process's declarations: owners declare at import, before any session exists."""

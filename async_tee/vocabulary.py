"""Names shared by the code that produces metrics and the code that exports them.

Every name here has readers on both sides of that split, so this module imports only the
standard library: an owner module (a torch-heavy algorithm) can declare its rows without
pulling in OpenTelemetry, and the exporting side can read them without the training stack.

Owners call :func:`register_teed_metrics` at import, next to the code that logs the keys,
so renaming a key renames its declaration with it. The rows are collected process-wide and
handed to the metric registry once, when telemetry starts; after that registration is
closed (:func:`freeze_metrics`) and a late declaration raises instead of vanishing.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable
from typing import Any

from async_tee.prometheus_names import check_prometheus_names

METRIC_NAME_PREFIX = "rl."
"""Every series async_tee declares starts with this."""

INIT_TOTAL_CATEGORY = "init/total"
"""The efficiency category measured once at start-up and republished every step."""

RUN_WINDOW_WALL_CLOCK_CATEGORIES: frozenset[str] = frozenset({INIT_TOTAL_CATEGORY})
"""Wall-clock efficiency categories whose value covers the whole run, not one step."""

SYNCHRONOUS_KINDS = ("gauge", "counter", "histogram", "up_down_counter")
"""Kinds that are recorded to."""

OBSERVABLE_KINDS = ("observable_gauge", "observable_counter", "observable_up_down_counter")
"""Kinds whose value the exporter pulls from a callback once per export cycle."""

METRIC_KINDS = SYNCHRONOUS_KINDS + OBSERVABLE_KINDS
"""Every kind the metric registry accepts."""

DERIVED_SERIES: tuple[tuple[str, str, str], ...] = (
    ("rl.efficiency.seconds", "gauge", "s"),
    ("rl.efficiency.pct", "gauge", "%"),
    ("rl.setup.duration", "gauge", "s"),
)
"""``(name, kind, unit)`` of the series the tee derives itself (SEMANTICS 3c, 3d).

No declared row may take their Prometheus names; ``metrics`` declares them from here.
"""

# OTel's SDK raises a bare Exception at instrument creation for any other name, and for a
# unit that is not ASCII or longer than 63 characters: catch both at declaration instead.
_INSTRUMENT_NAME = re.compile(r"[a-zA-Z][-_./a-zA-Z0-9]{0,254}")
_MAX_UNIT_LENGTH = 63


def as_scalar(value: Any) -> float | None:
    """Coerce a logged value to float, or None when it is not a usable scalar.

    Shared by every family that reads a raw ``Logger`` dict, so they agree on what counts
    as a number. Accepts ``int``, ``float`` and their subclasses (``numpy.float64``), any
    other real number with ``__float__`` (``numpy.float32``/``int64``, ``Decimal``), and
    zero-dimensional arrays or tensors that live on the CPU. Rejects ``bool`` (a flag is
    not a measurement), strings, containers, arrays with elements, and tensors on an
    accelerator (reading one would force a device sync). Non-finite floats are returned
    as they are; the recording side decides what they become. Never raises.
    """
    cls = type(value)
    if cls is float:
        return value  # type: ignore[no-any-return]
    if cls is int:
        try:
            return float(value)
        except OverflowError:  # an int beyond float range is not a usable scalar
            return None
    if cls is bool or isinstance(value, (str, bytes, bytearray, complex, dict, list, tuple)):
        return None
    if isinstance(value, (int, float)):  # subclasses: numpy.float64, IntEnum, ...
        return _to_float(value)
    return _coerce_foreign(value)


def _coerce_foreign(value: Any) -> float | None:
    """Coerce a numpy/torch-like scalar without importing either library."""
    try:
        return _coerce_foreign_unguarded(value)
    except Exception:  # noqa: BLE001 - a foreign object's attributes may raise anything
        return None


# numpy dtype kinds that hold real numbers; strings, bytes, objects, complex numbers and
# datetimes would otherwise be parsed or truncated by float() (np.array("1.0") -> 1.0).
_REAL_DTYPE_KINDS = ("f", "i", "u")


def _coerce_foreign_unguarded(value: Any) -> float | None:
    raw_dtype = getattr(value, "dtype", None)
    kind = getattr(raw_dtype, "kind", None)
    if isinstance(kind, str) and kind not in _REAL_DTYPE_KINDS:
        return None
    dtype = "" if raw_dtype is None else str(raw_dtype)
    if dtype in ("bool", "torch.bool") or type(value).__name__ in ("bool_", "bool"):
        return None
    shape = getattr(value, "shape", None)
    if shape is not None and tuple(shape) != ():
        return None
    device = getattr(value, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        return None
    if not hasattr(type(value), "__float__"):
        return None
    return _to_float(value)


def _to_float(value: Any) -> float | None:
    try:
        result = float(value)
    except Exception:  # noqa: BLE001 - __float__ of a foreign object may raise anything
        return None
    return result if type(result) is float else None


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
    """

    logger_key: str
    name: str
    kind: str = "gauge"
    unit: str = ""
    description: str = ""

    @functools.cached_property
    def key(self) -> str:
        """Registry key recorded against (computed once: the worker reads it per dict)."""
        return registry_key(self.name)


_REGISTERED: dict[str, TeedMetric] = {}
_RECORDED: dict[str, RecordedMetric] = {}
_DEFAULTS: set[str] = set()  # series names of shipped rows that a user row may replace
_FROZEN = False


def freeze_metrics() -> None:
    """Close registration, once the rows have been handed to the registry.

    Called when telemetry starts. The registry reads the rows once per process, so a row
    declared after that would be read into the recorded values but never declared: a late
    ``register_*`` call raises ``RuntimeError`` instead of being dropped in silence.
    """
    global _FROZEN
    _FROZEN = True


def _check_not_frozen(name: str) -> None:
    if _FROZEN:
        raise RuntimeError(
            f"cannot declare series {name!r}: telemetry has started and metric "
            "registration is closed; import the module that declares it before "
            "async_tee.start_telemetry()"
        )


def _claimed_names() -> dict[str, str]:
    """Map every declared series name to where it was declared, for duplicate checks."""
    claimed = {row.name: f"logger key {row.logger_key!r}" for row in _REGISTERED.values()}
    claimed.update({row.name: "a recorded row" for row in _RECORDED.values()})
    return claimed


def _validate_teed(row: TeedMetric) -> None:
    if not isinstance(row, TeedMetric):
        raise ValueError(f"expected a TeedMetric, got {type(row).__name__}")
    if not isinstance(row.logger_key, str) or not row.logger_key:
        raise ValueError(f"series {row.name!r}: logger_key must be a non-empty string")
    if row.kind not in SYNCHRONOUS_KINDS:
        raise ValueError(
            f"teed series {row.name!r}: kind {row.kind!r} is not one of {SYNCHRONOUS_KINDS} "
            "(a logged value is recorded, never pulled)"
        )
    validate_series(row.name, row.kind, row.unit)


def _validate_recorded(row: RecordedMetric) -> None:
    if not isinstance(row, RecordedMetric):
        raise ValueError(f"expected a RecordedMetric, got {type(row).__name__}")
    validate_series(row.name, row.kind, row.unit)
    observable = row.kind in OBSERVABLE_KINDS
    if observable and row.callback is None:
        raise ValueError(f"observable series {row.name!r} needs a callback")
    if not observable and row.callback is not None:
        raise ValueError(f"series {row.name!r} of kind {row.kind!r} cannot take a callback")


def _drop_default(name: str) -> None:
    """Withdraw a shipped default row so a user row can take its name or logger key."""
    _DEFAULTS.discard(name)
    for logger_key, row in list(_REGISTERED.items()):
        if row.name == name:
            del _REGISTERED[logger_key]


def _check_prometheus(new: Iterable[TeedMetric | RecordedMetric], replaced: set[str]) -> None:
    """Raise ``ValueError`` if a new row would share a Prometheus name with another series.

    Checked against every declared row but the defaults this declaration replaces, and
    against the derived series; Prometheus would otherwise keep one and drop the other.
    """
    declared: list[TeedMetric | RecordedMetric] = [*_REGISTERED.values(), *_RECORDED.values()]
    kept = ((row.name, row.kind, row.unit) for row in declared if row.name not in replaced)
    check_prometheus_names(
        [(row.name, row.kind, row.unit) for row in new], [*kept, *DERIVED_SERIES]
    )


def _is_declared(row: RecordedMetric) -> bool:
    existing = _RECORDED.get(row.name)
    return existing is not None and existing == row and existing.callback is row.callback


def register_teed_metrics(rows: Iterable[TeedMetric], *, _default: bool = False) -> None:
    """Declare rows for teeing, from the module that logs their keys.

    Declaring a row identical to one already declared is a no-op (a module may be imported
    twice). A row that claims the logger key or the series name of one of async_tee's
    shipped default rows replaces that default row.

    Raises:
        ValueError: Two rows claim the same logger key or the same series name, a row
            would share its Prometheus name with another declared or derived series
            (``rl.x.y`` and ``rl.x_y`` are both ``rl_x_y``), or a row is malformed (bad
            name, kind or unit). Every collision would be silent otherwise: the first
            makes one row unreachable, the second makes two rows record against one
            instrument, the third makes Prometheus drop one of two series.
        RuntimeError: Registration is already closed; see :func:`freeze_metrics`.
    """
    rows = tuple(rows)
    for row in rows:
        _validate_teed(row)
        if _REGISTERED.get(row.logger_key) != row:  # re-declaring as is stays a no-op
            _check_not_frozen(row.name)
    seen_keys: dict[str, TeedMetric] = {}
    seen_names: dict[str, TeedMetric] = {}
    for row in rows:  # collisions inside one call are as wrong as across calls
        other = seen_keys.get(row.logger_key) or seen_names.get(row.name)
        if other is not None and other != row:
            raise ValueError(f"rows {other!r} and {row!r} collide within one declaration")
        seen_keys[row.logger_key] = seen_names[row.name] = row
    claimed = _claimed_names()
    for row in rows:  # check every row before changing anything: a failed call changes nothing
        existing = _REGISTERED.get(row.logger_key)
        if existing == row:
            continue
        if existing is not None and (_default or existing.name not in _DEFAULTS):
            raise ValueError(
                f"logger key {row.logger_key!r} is already teed as {existing.name!r}; "
                f"cannot also tee it as {row.name!r}"
            )
        if row.name in claimed and (_default or row.name not in _DEFAULTS):
            raise ValueError(
                f"series {row.name!r} is already declared by {claimed[row.name]}; "
                f"cannot declare it again for logger key {row.logger_key!r}"
            )
    new = [row for row in rows if _REGISTERED.get(row.logger_key) != row]
    replaced: set[str] = set()
    if not _default:
        for row in new:
            existing = _REGISTERED.get(row.logger_key)
            if existing is not None and existing.name in _DEFAULTS:
                replaced.add(existing.name)
            if row.name in _DEFAULTS:
                replaced.add(row.name)
    _check_prometheus(new, replaced)
    for row in rows:
        existing = _REGISTERED.get(row.logger_key)
        if existing == row:
            continue
        if not _default:
            if existing is not None and existing.name in _DEFAULTS:
                _drop_default(existing.name)
            if row.name in _DEFAULTS:
                _drop_default(row.name)
        _REGISTERED[row.logger_key] = row
        if _default:
            _DEFAULTS.add(row.name)


def teed_metrics() -> tuple[TeedMetric, ...]:
    """Every row declared so far, in declaration order."""
    return tuple(_REGISTERED.values())


def register_recorded_metrics(rows: Iterable[RecordedMetric]) -> None:
    """Declare rows from the module that records them.

    Declaring a row identical to one already declared is a no-op.

    Raises:
        ValueError: The series name is already declared, the row would share its
            Prometheus name with another declared or derived series, or the row is
            malformed (bad name, kind or unit; a callback missing on an observable kind
            or present on a synchronous one).
        RuntimeError: Registration is already closed; see :func:`freeze_metrics`.
    """
    rows = tuple(rows)
    for row in rows:
        _validate_recorded(row)
        if not _is_declared(row):  # re-declaring as is stays a no-op
            _check_not_frozen(row.name)
    claimed = _claimed_names()
    in_call: dict[str, RecordedMetric] = {}
    for row in rows:  # check every row before changing anything: a failed call changes nothing
        other = in_call.setdefault(row.name, row)
        if other is not row and not (other == row and other.callback is row.callback):
            raise ValueError(f"rows {other!r} and {row!r} collide within one declaration")
        existing = _RECORDED.get(row.name)
        if existing is not None and existing == row and existing.callback is row.callback:
            continue
        if row.name in claimed and row.name not in _DEFAULTS:
            raise ValueError(f"series {row.name!r} is already declared by {claimed[row.name]}")
    new = [row for row in rows if not _is_declared(row)]
    _check_prometheus(new, {row.name for row in new if row.name in _DEFAULTS})
    for row in rows:
        if _is_declared(row):
            continue
        if row.name in _DEFAULTS:
            _drop_default(row.name)
        _RECORDED[row.name] = row


def recorded_metrics() -> tuple[RecordedMetric, ...]:
    """Every directly-recorded row declared so far, in declaration order."""
    return tuple(_RECORDED.values())

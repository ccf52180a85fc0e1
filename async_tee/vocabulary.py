"""Declaring rows: the names the logging and the exporting side share (docs/semantics.md §5)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from async_tee._declare import series as _series
from async_tee._declare.prometheus_names import check_prometheus_names
from async_tee._declare.rows import (
    DECLARATIONS,
    MEASUREMENT_KINDS,
    METRIC_KINDS,
    METRIC_NAME_PREFIX,
    OBSERVABLE_KINDS,
    SYNCHRONOUS_KINDS,
    EfficiencyCategory,
    RecordedMetric,
    TeedMetric,
    registry_key,
    validate_series,
)

__all__ = [
    "INIT_TOTAL_CATEGORY",
    "METRIC_KINDS",
    "METRIC_NAME_PREFIX",
    "OBSERVABLE_KINDS",
    "RUN_WINDOW_WALL_CLOCK_CATEGORIES",
    "SYNCHRONOUS_KINDS",
    "RecordedMetric",
    "TeedMetric",
    "as_scalar",
    "efficiency_categories",
    "efficiency_measurements",
    "freeze_metrics",
    "recorded_metrics",
    "register_recorded_metrics",
    "register_teed_metrics",
    "registry_key",
    "set_efficiency_categories",
    "skip_reason",
    "teed_metrics",
    "validate_series",
]

INIT_TOTAL_CATEGORY = "init/total"
"""The efficiency category measured once at start-up and republished every step."""

RUN_WINDOW_WALL_CLOCK_CATEGORIES: frozenset[str] = frozenset({INIT_TOTAL_CATEGORY})
"""Wall-clock efficiency categories whose value covers the whole run, not one step."""

# The seed's module-level tables, now the process's one declarations object (the same
# containers, so reading them here reads the declarations).
_REGISTERED: dict[tuple[str | None, str], TeedMetric] = DECLARATIONS.teed
_RECORDED: dict[str, RecordedMetric] = DECLARATIONS.recorded


def __getattr__(name: str) -> Any:
    if name == "_FROZEN":  # the seed's flag, read live from the declarations
        return DECLARATIONS.frozen
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def as_scalar(value: Any) -> float | None:
    """Coerce a logged value to float, or None when it is not a usable scalar.

    Shared by every family that reads a raw ``Logger`` dict, so they agree on what counts
    as a number, and they take what the trainer's TensorBoard backend takes: ``int``,
    ``float`` and their subclasses (``numpy.float64``), ``bool`` as 0 or 1, any other real
    number with ``__float__`` (``numpy.float32``/``int64``, ``Decimal``), and arrays or
    tensors of exactly one element that live on the CPU (a 0-d or shape-(1,) array, a
    ``torch`` scalar). Rejects strings, containers, arrays with more elements, and tensors
    on an accelerator (reading one would force a device sync); :func:`skip_reason` says
    which. Non-finite floats are returned as they are; the recording side decides what
    they become. Never raises.
    """
    cls = type(value)
    if cls is float:
        return value  # type: ignore[no-any-return]
    if cls is int or cls is bool:
        try:
            return float(value)
        except OverflowError:  # an int beyond float range is not a usable scalar
            return None
    if isinstance(value, (str, bytes, bytearray, complex, dict, list, tuple)):
        return None
    if isinstance(value, (int, float)):  # subclasses: numpy.float64, IntEnum, ...
        return _to_float(value)
    return _coerce_foreign(value)


NOT_A_NUMBER = "not_a_number"
"""Why a string, container, multi-element array or other object is not taken."""

DEVICE_TENSOR = "device_tensor"
"""Why a tensor on an accelerator is not taken: reading it would sync the device."""


def skip_reason(value: Any) -> str:
    """Why :func:`as_scalar` did not take ``value``: a device tensor, or not a number."""
    try:
        device = getattr(value, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            return DEVICE_TENSOR
    except Exception:  # noqa: BLE001 - a foreign object's attributes may raise anything
        pass
    return NOT_A_NUMBER


def _coerce_foreign(value: Any) -> float | None:
    """Coerce a numpy/torch-like scalar without importing either library."""
    try:
        return _coerce_foreign_unguarded(value)
    except Exception:  # noqa: BLE001 - a foreign object's attributes may raise anything
        return None


# numpy dtype kinds that hold real numbers or booleans; strings, bytes, objects, complex
# numbers and datetimes would otherwise be parsed or truncated by float() (np.array("1.0")).
_REAL_DTYPE_KINDS = ("f", "i", "u", "b")


def _coerce_foreign_unguarded(value: Any) -> float | None:
    raw_dtype = getattr(value, "dtype", None)
    kind = getattr(raw_dtype, "kind", None)
    if isinstance(kind, str) and kind not in _REAL_DTYPE_KINDS:
        return None
    if str(raw_dtype).startswith("torch.complex"):
        return None
    shape = getattr(value, "shape", None)
    if shape is not None and tuple(shape) != ():
        if any(dim != 1 for dim in tuple(shape)):
            return None  # more than one element (or none): not a scalar
        value = value.reshape(())  # one element: read it as the 0-d value it holds
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


def freeze_metrics() -> None:
    """Close registration, once the rows have been handed to the registry.

    Called when telemetry starts. The registry reads the rows once per process, so a row
    declared after that would be read into the recorded values but never declared: a late
    ``register_*`` call raises ``RuntimeError`` instead of being dropped in silence.
    """
    DECLARATIONS.frozen = True


def _check_not_frozen(name: str) -> None:
    DECLARATIONS.check_not_frozen(name)


def _claimed_names() -> dict[str, str]:
    """Map every declared series name to where it was declared, for duplicate checks."""
    claimed = {row.name: f"logger key {row.source!r}" for row in _REGISTERED.values()}
    claimed.update({row.name: "a recorded row" for row in _RECORDED.values()})
    return claimed


def _drop_default(name: str) -> None:
    """Withdraw a shipped default row so a user row can take its name or logger key."""
    DECLARATIONS.defaults.discard(name)
    for address, row in list(_REGISTERED.items()):
        if row.name == name:
            del _REGISTERED[address]


def _address(row: TeedMetric) -> tuple[str | None, str]:
    return (row.prefix, row.logger_key)


def _claimant(row: TeedMetric) -> TeedMetric | None:
    """The declared row that reads ``row``'s key from one of its prefixes, if any."""
    exact = _REGISTERED.get(_address(row))
    if exact is not None:
        return exact
    prefixes = set(row.prefixes)
    for other in _REGISTERED.values():
        if other.logger_key == row.logger_key and prefixes.intersection(other.prefixes):
            return other
    return None


def _check_prometheus(new: Iterable[TeedMetric | RecordedMetric], replaced: set[str]) -> None:
    """Raise ``ValueError`` if a new row would share a Prometheus name with another series.

    Checked against every declared row but the defaults this declaration replaces, and
    against the derived series; Prometheus would otherwise keep one and drop the other.
    """
    declared: list[TeedMetric | RecordedMetric] = [*_REGISTERED.values(), *_RECORDED.values()]
    kept = ((row.name, row.kind, row.unit) for row in declared if row.name not in replaced)
    derived = (series.triple for series in _series.DERIVED)
    check_prometheus_names([(row.name, row.kind, row.unit) for row in new], [*kept, *derived])


def _is_declared(row: RecordedMetric) -> bool:
    existing = _RECORDED.get(row.name)
    return existing is not None and existing == row and existing.callback is row.callback


def _expect(row: object, cls: type) -> None:
    if not isinstance(row, cls):
        raise ValueError(f"expected a {cls.__name__}, got {type(row).__name__}")


def register_teed_metrics(rows: Iterable[TeedMetric]) -> None:
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
    declare_teed(rows, default=False)


def declare_teed(rows: Iterable[TeedMetric], *, default: bool) -> None:
    """:func:`register_teed_metrics`, saying whether these are shipped default rows.

    Default rows (``default=True``, only async_tee's own) may be replaced by a user's row
    that claims their logger key or series name; they never replace anything themselves.

    Raises:
        ValueError: As :func:`register_teed_metrics`.
        RuntimeError: As :func:`register_teed_metrics`.
    """
    rows = tuple(rows)
    defaults = DECLARATIONS.defaults
    for row in rows:
        _expect(row, TeedMetric)
        row.validate()
        if _REGISTERED.get(_address(row)) != row:  # re-declaring as is stays a no-op
            _check_not_frozen(row.name)
    seen_keys: dict[tuple[str, str], TeedMetric] = {}
    seen_names: dict[str, TeedMetric] = {}
    for row in rows:  # collisions inside one call are as wrong as across calls
        reads = [(prefix, row.logger_key) for prefix in row.prefixes]
        others = [seen_keys.get(read) for read in reads] + [seen_names.get(row.name)]
        for other in others:
            if other is not None and other != row:
                raise ValueError(f"rows {other!r} and {row!r} collide within one declaration")
        seen_keys.update(dict.fromkeys(reads, row))
        seen_names[row.name] = row
    claimed = _claimed_names()
    for row in rows:  # check every row before changing anything: a failed call changes nothing
        existing = _claimant(row)
        if existing == row:
            continue
        if existing is not None and (default or existing.name not in defaults):
            raise ValueError(
                f"logger key {row.source!r} is already teed as {existing.name!r}; "
                f"cannot also tee it as {row.name!r}"
            )
        if row.name in claimed and (default or row.name not in defaults):
            raise ValueError(
                f"series {row.name!r} is already declared by {claimed[row.name]}; "
                f"cannot declare it again for logger key {row.source!r}"
            )
    new = [row for row in rows if _REGISTERED.get(_address(row)) != row]
    replaced: set[str] = set()
    if not default:
        for row in new:
            existing = _claimant(row)
            if existing is not None and existing.name in defaults:
                replaced.add(existing.name)
            if row.name in defaults:
                replaced.add(row.name)
    _check_prometheus(new, replaced)
    for row in rows:
        existing = _claimant(row)
        if existing == row:
            continue
        if not default:
            if existing is not None and existing.name in defaults:
                _drop_default(existing.name)
            if row.name in defaults:
                _drop_default(row.name)
        _REGISTERED[_address(row)] = row
        if default:
            defaults.add(row.name)


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
    defaults = DECLARATIONS.defaults
    for row in rows:
        _expect(row, RecordedMetric)
        row.validate()
        if not _is_declared(row):  # re-declaring as is stays a no-op
            _check_not_frozen(row.name)
    claimed = _claimed_names()
    in_call: dict[str, RecordedMetric] = {}
    for row in rows:  # check every row before changing anything: a failed call changes nothing
        other = in_call.setdefault(row.name, row)
        if other is not row and not (other == row and other.callback is row.callback):
            raise ValueError(f"rows {other!r} and {row!r} collide within one declaration")
        if _is_declared(row):
            continue
        if row.name in claimed and row.name not in defaults:
            raise ValueError(f"series {row.name!r} is already declared by {claimed[row.name]}")
    new = [row for row in rows if not _is_declared(row)]
    _check_prometheus(new, {row.name for row in new if row.name in defaults})
    for row in rows:
        if _is_declared(row):
            continue
        if row.name in defaults:
            _drop_default(row.name)
        _RECORDED[row.name] = row


def recorded_metrics() -> tuple[RecordedMetric, ...]:
    """Every directly-recorded row declared so far, in declaration order."""
    return tuple(_RECORDED.values())


def set_efficiency_categories(categories: Mapping[str, EfficiencyCategory | str]) -> None:
    """Replace the known efficiency categories (only before telemetry starts).

    Args:
        categories: ``{category: EfficiencyCategory}``, or ``{category: measurement}``
            for categories without a bucket.

    Raises:
        ValueError: A category is empty or a measurement kind is unknown.
        RuntimeError: Telemetry has started and declarations are closed.
    """
    parsed: dict[str, EfficiencyCategory] = {}
    for category, spec in categories.items():
        if isinstance(spec, str):
            spec = EfficiencyCategory(spec)
        if not isinstance(category, str) or not category:
            raise ValueError(f"efficiency category must be a non-empty string: {category!r}")
        if not isinstance(spec, EfficiencyCategory) or spec.measurement not in MEASUREMENT_KINDS:
            raise ValueError(
                f"efficiency category {category!r}: measurement must be one of "
                f"{MEASUREMENT_KINDS}, got {spec!r}"
            )
        parsed[category] = spec
    DECLARATIONS.check_not_frozen("rl.efficiency.seconds")
    DECLARATIONS.categories.clear()
    DECLARATIONS.categories.update(parsed)


def efficiency_categories() -> dict[str, EfficiencyCategory]:
    """Every known efficiency category with its measurement and bucket."""
    return dict(DECLARATIONS.categories)


def efficiency_measurements() -> dict[str, str]:
    """Map each known efficiency category to its measurement kind."""
    return {category: spec.measurement for category, spec in DECLARATIONS.categories.items()}

"""The catalog: every series async_tee would export, as a table or JSON (docs/semantics.md §3)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from async_tee import vocabulary
from async_tee._declare import series as _series
from async_tee._declare.prometheus_names import prometheus_name
from async_tee._declare.trainers import TRAINERS

__all__ = ["CatalogEntry", "render_catalog", "series_catalog"]


@dataclasses.dataclass(frozen=True)
class CatalogEntry:
    """One series async_tee would export.

    Attributes:
        name: The OTel series name.
        prometheus_name: Its name on a Prometheus ``/metrics`` page.
        kind: The registry kind (``gauge``, ``counter``, ``observable_counter``, ...).
        unit: The OTel unit, or empty.
        attributes: The attribute keys its points carry (``rl.bucket`` only on the
            efficiency categories that have a bucket).
        logger_key: The ``Logger`` key it reads: a key, a pattern
            (``efficiency/<category>_s``, ``timing/setup:*_s``), or empty when it is
            recorded directly or is async_tee's own; then, comma-separated, the trainers'
            keys of the same meaning (``verl:critic/score/mean``, docs/semantics.md §13).
        description: Its help text.
        source: ``teed``, ``recorded``, ``efficiency``, ``setup``, ``step``, ``watchdog``,
            ``trainer`` or ``self``.
    """

    name: str
    prometheus_name: str
    kind: str
    unit: str
    attributes: tuple[str, ...]
    logger_key: str
    description: str
    source: str

    def as_dict(self) -> dict[str, Any]:
        """The entry as a JSON-ready dict."""
        out = dataclasses.asdict(self)
        out["attributes"] = list(self.attributes)
        return out


def _entry(
    name: str,
    kind: str,
    unit: str,
    description: str,
    *,
    source: str,
    logger_key: str = "",
    attributes: Sequence[str] = (),
) -> CatalogEntry:
    return CatalogEntry(
        name=name,
        prometheus_name=prometheus_name(name, kind, unit),
        kind=kind,
        unit=unit,
        attributes=tuple(attributes),
        logger_key=logger_key,
        description=description,
        source=source,
    )


def series_catalog() -> list[CatalogEntry]:
    """Every series declared now, in the order the registry would create them.

    Reads the current declarations, so rows an owner module declared at import appear
    once that module is imported. Never touches OpenTelemetry.
    """
    aliases: dict[str, list[str]] = {}
    for trainer in TRAINERS:
        for key, name in trainer.aliases:
            aliases.setdefault(name, []).append(f"{trainer.prefix}:{key}")
    entries = [
        _entry(
            row.name,
            row.kind,
            row.unit,
            row.description,
            source="teed",
            logger_key=", ".join([row.source, *aliases.get(row.name, ())]),
        )
        for row in vocabulary.teed_metrics()
    ]
    entries += [
        _entry(row.name, row.kind, row.unit, row.description, source="recorded")
        for row in vocabulary.recorded_metrics()
    ]
    sources = {
        _series.EFFICIENCY_SECONDS.name: "efficiency",
        _series.EFFICIENCY_PCT.name: "efficiency",
        _series.SETUP_DURATION.name: "setup",
        _series.STEP_PHASE_DURATION.name: "step",
        _series.STEP.name: "step",
        _series.STEP_TIME.name: "step",
        _series.GEN_FLEET_SHARDS.name: "watchdog",
        _series.LOGGED_VALUE.name: "trainer",
    }
    entries += [
        _entry(
            series.name,
            series.kind,
            series.unit,
            series.description,
            source=sources[series.name],
            logger_key=series.logger_key,
            attributes=series.attributes,
        )
        for series in _series.DERIVED
    ]
    entries += [
        _entry(
            series.name,
            series.kind,
            series.unit,
            series.description,
            source="self",
            attributes=series.attributes,
        )
        for series in _series.SELF
    ]
    return entries


_COLUMNS = (
    ("OTel name", "name"),
    ("Prometheus name", "prometheus_name"),
    ("kind", "kind"),
    ("unit", "unit"),
    ("attributes", "attributes"),
    ("logger key", "logger_key"),
    ("description", "description"),
)


def render_catalog(entries: Sequence[CatalogEntry], *, as_json: bool = False) -> str:
    """Render ``entries`` as an aligned text table, or as a JSON list (``as_json``)."""
    if as_json:
        return json.dumps([entry.as_dict() for entry in entries], indent=2)
    rows = [[title for title, _ in _COLUMNS]]
    for entry in entries:
        cells = []
        for _, field in _COLUMNS:
            value = getattr(entry, field)
            cells.append(",".join(value) if isinstance(value, tuple) else str(value))
        rows.append([cell or "-" for cell in cells])
    widths = [max(len(row[column]) for row in rows) for column in range(len(_COLUMNS))]
    lines = []
    for index, row in enumerate(rows):
        # The last column (the description) is not padded, so lines carry no trailing blanks.
        lines.append(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)

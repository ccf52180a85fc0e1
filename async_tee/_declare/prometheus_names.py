"""Each series' Prometheus name, and the check that no two collide (docs/semantics.md §5)."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "check_prometheus_names",
    "otlp_prometheus_name",
    "prometheus_label",
    "prometheus_name",
    "prometheus_sample_names",
    "prometheus_type",
    "prometheus_unit",
]

# opentelemetry-exporter-prometheus, _mapping.py: one "_" per run of invalid characters.
_INVALID_RUN = re.compile(r"[^a-zA-Z0-9:]+")
_INVALID_LABEL_RUN = re.compile(r"[^a-zA-Z0-9]+")  # label names allow no ":"
# UCUM annotations; greedy, like the exporter's.
_ANNOTATION = re.compile(r"{.*}")
_UNITS = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "1": "",
    "%": "percent",
}
_PER_UNITS = {
    "s": "second",
    "m": "minute",
    "h": "hour",
    "d": "day",
    "w": "week",
    "mo": "month",
    "y": "year",
}
_TYPES = {
    "gauge": "gauge",
    "observable_gauge": "gauge",
    "counter": "counter",
    "observable_counter": "counter",
    # A cumulative non-monotonic sum is a gauge on Prometheus (OTel's compatibility spec).
    "up_down_counter": "gauge",
    "observable_up_down_counter": "gauge",
    "histogram": "histogram",
}
_TOTAL = "_total"


def _sanitize(text: str) -> str:
    return _INVALID_RUN.sub("_", text)


def prometheus_label(attribute: str) -> str:
    """The label an attribute key becomes (the exporter's ``sanitize_attribute``).

    Labels allow no ``:``, so every run of characters outside ``[a-zA-Z0-9]`` becomes one
    ``_``; a leading digit becomes ``_`` too: ``rl.efficiency.category`` ->
    ``rl_efficiency_category``.
    """
    if attribute[:1].isdigit():
        attribute = "_" + attribute[1:]
    return _INVALID_LABEL_RUN.sub("_", attribute)


def prometheus_type(kind: str) -> str:
    """The Prometheus type a series of this registry kind is exported as.

    Raises:
        ValueError: ``kind`` is not one of the registry's kinds.
    """
    try:
        return _TYPES[kind]
    except KeyError:
        raise ValueError(f"unknown metric kind {kind!r}; expected one of {tuple(_TYPES)}") from None


def prometheus_unit(unit: str) -> str:
    """The name suffix (without its ``_``) the exporter derives from a unit; may be empty."""
    unit = _ANNOTATION.sub("", unit)
    if unit in _UNITS:
        return _UNITS[unit]
    top, slash, bottom = unit.partition("/")
    if slash:
        bottom = _sanitize(bottom)
        if bottom:
            top = _sanitize(top)
            top = _UNITS.get(top, top)
            bottom = _PER_UNITS.get(bottom, bottom)
            return f"{top}_per_{bottom}" if top else f"per_{bottom}"
    return _sanitize(unit).strip("_")


def _family(name: str, kind: str, unit: str) -> tuple[str, str]:
    """The metric family name the exporter builds, and the Prometheus type."""
    kind_type = prometheus_type(kind)
    name = name.lower()  # the OTel SDK lowercases instrument names (they are case-insensitive)
    if name and name[0].isdigit():
        name = "_" + name[1:]
    family = _sanitize(name)
    if kind_type == "counter" and family.endswith(_TOTAL):
        family = family[: -len(_TOTAL)]  # prometheus_client adds it back, once
    suffix = prometheus_unit(unit)
    if suffix and not family.endswith("_" + suffix):
        family += "_" + suffix
    return family, kind_type


def prometheus_name(name: str, kind: str, unit: str) -> str:
    """The name a series is queried by on Prometheus (its ``# TYPE`` line on ``/metrics``).

    Args:
        name: The OTel series name, e.g. ``rl.vllm.prompt_tokens``.
        kind: The registry kind, e.g. ``counter``.
        unit: Its unit, e.g. ``{token}``.

    Returns:
        E.g. ``rl_vllm_prompt_tokens_total``. A histogram's name is its family name; its
        samples are ``_bucket``, ``_count`` and ``_sum`` (:func:`prometheus_sample_names`).

    Raises:
        ValueError: ``kind`` is not one of the registry's kinds.
    """
    family, kind_type = _family(name, kind, unit)
    return family + _TOTAL if kind_type == "counter" else family


def prometheus_sample_names(name: str, kind: str, unit: str) -> tuple[str, ...]:
    """Every sample name the series puts on ``/metrics`` (three for a histogram).

    Raises:
        ValueError: ``kind`` is not one of the registry's kinds.
    """
    family, kind_type = _family(name, kind, unit)
    if kind_type == "histogram":
        return (f"{family}_bucket", f"{family}_count", f"{family}_sum")
    return (family + _TOTAL,) if kind_type == "counter" else (family,)


def _otlp_unit_suffixes(unit: str) -> tuple[str, str]:
    """prometheus/otlptranslator's unit suffixes: (main, ``per_<unit>``), each cleaned up."""
    main, slash, per = unit.partition("/")
    main, per = main.strip(), per.strip()
    main = "" if not main or "{" in main or "}" in main else _UNITS.get(main, main)
    if slash and per and "{" not in per and "}" not in per:
        per = "per_" + _PER_UNITS.get(per, per)
    else:
        per = ""
    clean = [
        re.sub("_+", "_", _INVALID_RUN.sub("_", part)).removeprefix("_") for part in (main, per)
    ]
    return clean[0], clean[1]


def otlp_prometheus_name(name: str, kind: str, unit: str) -> str:
    """The name a series gets where OTLP is translated (Collector, remote write, Prometheus 3).

    The Collector's ``prometheus`` and ``prometheusremotewrite`` exporters and Prometheus 3's
    OTLP receiver name through ``prometheus/otlptranslator`` (underscore escaping, with
    suffixes: every one's default). It differs from the Python exporter in three ways a
    declaration can hit: a gauge of unit ``"1"`` gets ``_ratio``; a counter's ``total`` token
    moves to the end wherever it stood; a unit already among the name's tokens is not added.

    Raises:
        ValueError: ``kind`` is not one of the registry's kinds.
    """
    kind_type = prometheus_type(kind)
    tokens = [token for token in _INVALID_RUN.split(name.lower()) if token]
    main, per = _otlp_unit_suffixes(unit)
    if main in tokens:
        main = ""
    per = "" if per == "per_" else per.removesuffix("_")
    if per in tokens:
        per = ""
    if per:
        main = main.removesuffix("_")
    tokens += [suffix for suffix in (main, per) if suffix]
    if kind_type == "counter":
        tokens = [token for token in tokens if token != "total"] + ["total"]
    if unit == "1" and kind in ("gauge", "observable_gauge"):
        tokens = [token for token in tokens if token != "ratio"] + ["ratio"]
    joined = "_".join(tokens)
    return "_" + joined if joined[:1].isdigit() else joined


def _claims(name: str, kind: str, unit: str) -> tuple[str, ...]:
    return (prometheus_name(name, kind, unit), *prometheus_sample_names(name, kind, unit))


def check_prometheus_names(
    new: Iterable[tuple[str, str, str]], existing: Iterable[tuple[str, str, str]] = ()
) -> None:
    """Raise ``ValueError`` if two series would share a name on Prometheus.

    Both arguments hold ``(name, kind, unit)`` triples. ``new`` is checked against
    ``existing`` and against itself; ``existing`` is trusted. Two entries with the same
    OTel name are one series here (duplicate names are the registry's check).

    Raises:
        ValueError: Two series would be exported under one Prometheus name (a metric name
            or a histogram's ``_bucket``/``_count``/``_sum`` sample), or a new series would be
            named differently behind OTLP (:func:`otlp_prometheus_name`) than on ``/metrics``.
            The message names the series and the names.
    """
    claimed: dict[str, tuple[str, str]] = {}
    for name, kind, unit in existing:
        for exposed in _claims(name, kind, unit):
            claimed.setdefault(exposed, (name, kind))
    for name, kind, unit in new:
        for exposed in _claims(name, kind, unit):
            other = claimed.get(exposed)
            if other is not None and other[0] != name:
                raise ValueError(
                    f"series {name!r} ({kind}) and series {other[0]!r} ({other[1]}) would "
                    f"both be exported to Prometheus as {exposed!r}; Prometheus would keep "
                    "one and drop the other without an error. Rename one of them."
                )
            claimed[exposed] = (name, kind)
        translated = otlp_prometheus_name(name, kind, unit)
        if translated != prometheus_name(name, kind, unit):
            raise ValueError(
                f"series {name!r} ({kind}, unit {unit!r}) would be named "
                f"{prometheus_name(name, kind, unit)!r} on async_tee's /metrics but "
                f"{translated!r} behind an OpenTelemetry Collector or Prometheus 3's OTLP "
                "receiver, so one dashboard could not serve both. "
                + (
                    "Declare a dimensionless gauge with unit '' (not '1')."
                    if unit == "1"
                    else "Rename it so its unit and 'total' appear once, at the end."
                )
            )

"""The Grafana dashboard built from the catalog: ``async-tee dashboard`` (docs/semantics.md §10)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from async_tee._declare import series as _series
from async_tee._declare.prometheus_names import prometheus_label, prometheus_type
from async_tee.catalog import CatalogEntry, series_catalog

__all__ = [
    "INSTALL_HINT",
    "build_dashboard",
    "expand_variables",
    "panel_queries",
    "render_dashboard",
]

INSTALL_HINT = "pip install '.[dashboard]' (from a checkout)"
"""How to get the dashboard's one dependency, ``grafana-foundation-sdk`` (Python >= 3.11)."""

_SELECTOR = '{job=~"$job", instance=~"$instance"}'
_RATE = "[$__rate_interval]"
_RANK_LEGEND = "rank {{rl_rank}}"
_REGEX_VARIABLES = {
    "job": "label_values(target_info, job)",
    "run": 'label_values(target_info{job=~"$job"}, rl_run_id)',
    "instance": 'label_values(target_info{job=~"$job", rl_run_id=~"$run"}, instance)',
    "rank": 'label_values(target_info{job=~"$job", rl_run_id=~"$run"}, rl_rank)',
    "key": 'label_values(rl_logged_value{job=~"$job"}, rl_key)',
}
_CHOSEN = 'target_info{rl_run_id=~"$run", rl_rank=~"$rank"}'
"""The processes the run and rank variables select (``target_info`` is 1)."""
_INTERVALS = ("__rate_interval", "__interval", "__range")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_ANNOTATION = re.compile(r"\{(.*)\}")
_GRAFANA_UNITS = {"s": "s", "ms": "ms", "us": "µs", "ns": "ns", "%": "percent", "By": "bytes"}


@dataclasses.dataclass(frozen=True)
class _PanelSpec:
    """One panel, before the SDK sees it: what to show and how."""

    title: str
    description: str
    expr: str
    legend: str
    unit: str = "short"
    kind: str = "timeseries"  # or "stat", "bargauge" (both instant queries)
    threshold: float | None = None  # drawn as a line: an alert rule's


def _by_rank(expr: str) -> str:
    """Join ``expr`` to ``target_info`` so it carries, and is filtered by, run and rank.

    ``expr`` must bind tighter than ``*`` (a selector, a call, or parenthesized). The
    value is kept (``target_info`` is 1). A process with no ``rl_rank`` still matches
    ``rl_rank=~".*"`` (an absent label is the empty string), so single-process runs show.
    """
    return f"{expr} * on (job, instance) group_left (rl_rank, rl_run_id) {_CHOSEN}"


def _legend(entry: CatalogEntry, prefix: str = "") -> str:
    labels = "".join(f" {{{{{prometheus_label(a)}}}}}" for a in entry.attributes)
    return f"{prefix}{_RANK_LEGEND}{labels}"


def _unit(entry: CatalogEntry, *, per_second: bool = False) -> str:
    """The Grafana unit for the series' values, or for their rate."""
    annotation = _ANNOTATION.fullmatch(entry.unit)
    name = annotation.group(1) if annotation else entry.unit
    if per_second:
        return f"suffix: {name}/s" if name and name != "1" else "cps"
    if annotation:
        return f"suffix: {name}"
    return _GRAFANA_UNITS.get(entry.unit, "short")


def _raw(entry: CatalogEntry) -> _PanelSpec:
    expr = _by_rank(entry.prometheus_name + _SELECTOR)
    return _PanelSpec(entry.name, entry.description, expr, _legend(entry), _unit(entry))


def _rate(entry: CatalogEntry, function: str = "rate") -> _PanelSpec:
    expr = _by_rank(f"{function}({entry.prometheus_name}{_SELECTOR}{_RATE})")
    per_second = function == "rate"
    suffix = " /s" if per_second else " per $__rate_interval"
    return _PanelSpec(
        entry.name + suffix,
        entry.description,
        expr,
        _legend(entry),
        _unit(entry, per_second=per_second),
    )


def _p99(entry: CatalogEntry) -> _PanelSpec:
    by = ", ".join(["le", "job", "instance", *map(prometheus_label, entry.attributes)])
    buckets = f"rate({entry.prometheus_name}_bucket{_SELECTOR}{_RATE})"
    expr = _by_rank(f"histogram_quantile(0.99, sum by ({by}) ({buckets}))")
    legend = _legend(entry, "p99 ")
    return _PanelSpec(entry.name + " p99", entry.description, expr, legend, _unit(entry))


def _generic(entry: CatalogEntry) -> list[_PanelSpec]:
    """Counter -> rate, histogram -> p99, gauge (and up-down counter) -> raw value."""
    kind = prometheus_type(entry.kind)
    if kind == "counter":
        return [_rate(entry)]
    if kind == "histogram":
        return [_p99(entry)]
    return [_raw(entry)]


def _vllm(entry: CatalogEntry) -> list[_PanelSpec]:
    if prometheus_type(entry.kind) == "counter":
        return [_rate(entry), _rate(entry, "increase")]
    return _generic(entry)


def _efficiency(entry: CatalogEntry) -> list[_PanelSpec]:
    if entry.name != _series.RL_EFFICIENCY_SECONDS_METRIC:
        return _generic(entry)
    category, bucket = (
        prometheus_label(_series.RL_EFFICIENCY_CATEGORY_ATTR),
        prometheus_label(_series.RL_BUCKET_ATTR),
    )
    expr = f"avg by ({category}, {bucket}) ({_by_rank(entry.prometheus_name + _SELECTOR)})"
    title = entry.name + " by category (mean over the selected ranks)"
    return [_PanelSpec(title, entry.description, expr, f"{{{{{category}}}}}", _unit(entry))]


def _setup(entry: CatalogEntry) -> list[_PanelSpec]:
    if entry.name != _series.RL_SETUP_DURATION_METRIC:
        return _generic(entry)
    phase = prometheus_label(_series.RL_SETUP_PHASE_ATTR)
    expr = f"max by ({phase}) ({_by_rank(entry.prometheus_name + _SELECTOR)})"
    title = entry.name + " by phase (slowest selected rank)"
    legend = f"{{{{{phase}}}}}"
    return [_PanelSpec(title, entry.description, expr, legend, _unit(entry), "bargauge")]


def _step(entry: CatalogEntry) -> list[_PanelSpec]:
    if entry.name != _series.RL_STEP_TIME_METRIC:
        return _generic(entry)
    expr = _by_rank(f"(time() - {entry.prometheus_name}{_SELECTOR})")
    description = f"time() - {entry.prometheus_name}: {entry.description}"
    title = "Seconds since the last step"
    return [_PanelSpec(title, description, expr, _RANK_LEGEND, "s", "stat")]


def _trainer(entry: CatalogEntry) -> list[_PanelSpec]:
    """A trainer's keys as logged: the ones the ``key`` variable picks (all by default)."""
    key = prometheus_label(_series.RL_KEY_ATTR)
    selector = f'{{job=~"$job", instance=~"$instance", {key}=~"$key"}}'
    expr = _by_rank(entry.prometheus_name + selector)
    title = "Trainer keys as logged (pick them with the key variable)"
    return [_PanelSpec(title, entry.description, expr, _legend(entry), _unit(entry))]


@dataclasses.dataclass(frozen=True)
class _Row:
    title: str
    collapsed: bool
    panels: Callable[[CatalogEntry], list[_PanelSpec]]


_ROWS: dict[str, _Row] = {
    "training": _Row("Training scalars", False, _generic),
    "vllm": _Row("vLLM", False, _vllm),
    "throughput": _Row("Throughput", False, _generic),
    "validation": _Row("Validation (the steps that ran it)", False, _generic),
    "efficiency": _Row("Efficiency", False, _efficiency),
    "setup": _Row("Start-up phases", False, _setup),
    "step": _Row("Step and liveness", False, _step),
    "trainer": _Row("Trainer keys", False, _trainer),
    "self": _Row("async_tee health", True, _generic),
    "other": _Row("Other", True, _generic),
}


_ROW_BY_NAME = (
    ("rl.vllm.", "vllm"),
    ("rl.throughput.", "throughput"),
    ("rl.validation.", "validation"),
    ("rl.efficiency.", "efficiency"),
    ("rl.step.", "step"),
)
"""Teed and recorded rows by the start of their name: the shipped families' rows."""


def _row_of(entry: CatalogEntry) -> str:
    """The row an entry's panels go in: by its source, then its name and kind."""
    if entry.source in ("efficiency", "setup", "step", "trainer", "self"):
        return entry.source
    if entry.source in ("teed", "recorded"):
        for start, row in _ROW_BY_NAME:
            if entry.name.startswith(start):
                return row
        if entry.name.startswith("rl.") and prometheus_type(entry.kind) == "gauge":
            return "training"
    return "other"


_ALERTS_ROW = _Row("Alerts: what each rule of `async-tee alerts` compares", False, _generic)
_MATCHERS = 'job=~"$job", instance=~"$instance"'


def _alert_panels() -> list[_PanelSpec]:
    """One panel per alert rule with a quantity: that quantity, its threshold a line."""
    from async_tee.alerts import alert_rules, with_selector

    # What the rule sees (a straggler is behind every rank of its run), then the chosen ranks.
    chosen = f"and on (rl_run_id, rl_rank) group by (rl_run_id, rl_rank) ({_CHOSEN})"
    return [
        _PanelSpec(
            f"{rule.name}: {rule.summary}",
            f"Alert {rule.name} ({rule.severity}) fires when this is above {rule.threshold:g} "
            f"for {rule.for_s:g} s. {rule.look_at}",
            f"({with_selector(rule.quantity, _MATCHERS)}) {chosen}",
            "rank {{rl_rank}} {{instance}}",
            threshold=rule.threshold,
        )
        for rule in alert_rules()
        if rule.quantity is not None and rule.threshold is not None
    ]


def _layout(entries: Sequence[CatalogEntry]) -> list[tuple[_Row, list[_PanelSpec]]]:
    """The alerts row, then the rows that have panels, in ``_ROWS`` order, each with its panels."""
    grouped: dict[str, list[_PanelSpec]] = {key: [] for key in _ROWS}
    for entry in entries:
        key = _row_of(entry)
        grouped[key] += _ROWS[key].panels(entry)
    rows = [(_ROWS[key], panels) for key, panels in grouped.items() if panels]
    return [(_ALERTS_ROW, _alert_panels()), *rows]


def _require_sdk() -> None:
    """Raise ``ImportError`` naming the extra when ``grafana-foundation-sdk`` is missing."""
    try:
        import grafana_foundation_sdk  # noqa: F401 - only whether it imports
    except ImportError as exc:
        raise ImportError(
            f"the dashboard needs grafana-foundation-sdk (Python >= 3.11): {INSTALL_HINT}"
        ) from exc


def _sdk_dashboard(datasource: str, layout: list[tuple[_Row, list[_PanelSpec]]]) -> Any:
    """Build the dashboard with the SDK's builders; returns its (unencoded) model."""
    from grafana_foundation_sdk.builders import (
        bargauge,
        common,
        dashboard,
        prometheus,
        stat,
        timeseries,
    )
    from grafana_foundation_sdk.models import common as common_models
    from grafana_foundation_sdk.models import dashboard as models

    ref = models.DataSourceRef(type_val="prometheus", uid="${datasource}")
    board = (
        dashboard.Dashboard("async_tee")
        .uid("async-tee")
        .description("Generated by `async-tee dashboard` from async_tee's series catalog.")
        .tags(["async_tee", "rl"])
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard.DatasourceVariable("datasource")
            .label("Data source")
            .type("prometheus")
            .current(models.VariableOption(text=datasource, value=datasource))
        )
        .annotation(
            dashboard.AnnotationQuery()
            .name("Firing alerts")
            .datasource(ref)
            .expr('ALERTS{alertstate="firing"}')
            .icon_color("red")
            .enable(True)
        )
    )
    for name, query in _REGEX_VARIABLES.items():
        board = board.with_variable(
            dashboard.QueryVariable(name)
            .query(query)
            .datasource(ref)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(models.VariableOption(text="All", value="$__all"))
            .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(models.VariableSort.NATURAL_ASC)
        )

    ids = itertools.count(1)

    def panel(spec: _PanelSpec) -> Any:
        built: Any  # three builder classes with the same panel methods and no common base
        if spec.kind == "stat":
            built = stat.Panel().reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
        elif spec.kind == "bargauge":
            built = (
                bargauge.Panel()
                .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
                .orientation(common_models.VizOrientation.HORIZONTAL)
            )
        else:
            built = timeseries.Panel()
            if spec.threshold is not None:
                built = built.thresholds(
                    dashboard.ThresholdsConfig()
                    .mode(models.ThresholdsMode("absolute"))
                    .steps(
                        [
                            models.Threshold(value=None, color="green"),
                            models.Threshold(value=spec.threshold, color="red"),
                        ]
                    )
                ).thresholds_style(
                    common.GraphThresholdsStyleConfig().mode(
                        common_models.GraphThresholdsStyleMode("dashed")
                    )
                )
        built = (
            built.id(next(ids))
            .title(spec.title)
            .description(spec.description)
            .datasource(ref)
            .unit(spec.unit)
            .span(8)
            .height(8)
        )
        target = prometheus.Dataquery().expr(spec.expr).legend_format(spec.legend)
        target = target.ref_id("A").datasource(ref)
        return built.with_target(target if spec.kind == "timeseries" else target.instant())

    for row, specs in layout:
        section = dashboard.Row(row.title).id(next(ids))
        if row.collapsed:  # Grafana keeps a collapsed row's panels inside the row
            for spec in specs:
                section = section.with_panel(panel(spec))
            board = board.with_row(section)
        else:  # an open row's panels follow it on the dashboard
            board = board.with_row(section.collapsed(False))
            for spec in specs:
                board = board.with_panel(panel(spec))
    return board.build()


def build_dashboard(
    datasource: str = "prometheus", entries: Sequence[CatalogEntry] | None = None
) -> dict[str, Any]:
    """The Grafana dashboard for ``entries`` (the current catalog by default), as plain JSON.

    Args:
        datasource: The Prometheus data source's name or uid: the default of the
            dashboard's ``datasource`` variable, which every panel and query uses.
        entries: The series to show; ``series_catalog()`` when omitted.

    Returns:
        A JSON-ready dict (Grafana's dashboard model): a ``datasource`` variable,
        ``job``/``run``/``instance``/``rank``/``key`` multi-select variables, and one row
        per family.

    Raises:
        ImportError: ``grafana-foundation-sdk`` is not installed (:data:`INSTALL_HINT`).
    """
    _require_sdk()
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    model = _sdk_dashboard(datasource, _layout(series_catalog() if entries is None else entries))
    result: dict[str, Any] = json.loads(json.dumps(model, cls=JSONEncoder))
    return result


def render_dashboard(datasource: str = "prometheus") -> str:
    """The dashboard for the current catalog as JSON text (indent 2), ready to import."""
    return json.dumps(build_dashboard(datasource), indent=2)


def _panels(panels: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Every panel that is not a row, including those nested in (collapsed) rows."""
    found: list[Mapping[str, Any]] = []
    for item in panels:
        if item.get("type") == "row":
            found += _panels(item.get("panels") or [])
        else:
            found.append(item)
    return found


def panel_queries(dashboard: Mapping[str, Any]) -> list[str]:
    """Every target ``expr`` of every panel of ``dashboard``, rows' panels included."""
    return [
        target["expr"]
        for item in _panels(dashboard.get("panels") or [])
        for target in item.get("targets") or []
        if "expr" in target
    ]


def expand_variables(
    expr: str, values: Mapping[str, str] | None = None, rate_interval: str = "1m"
) -> str:
    """Substitute the dashboard's template variables, as Grafana would before querying.

    Args:
        expr: A panel query, e.g. from :func:`panel_queries`.
        values: Regexes for ``job``, ``run``, ``instance``, ``rank`` and ``key``; ``.*``
            (All) for any not given.
        rate_interval: What ``$__rate_interval``, ``$__interval`` and ``$__range`` become.

    Returns:
        The query with no ``$`` left: PromQL a Prometheus server accepts as is.

    Raises:
        ValueError: ``expr`` uses a variable the dashboard does not define.
    """
    chosen = {name: ".*" for name in _REGEX_VARIABLES}
    chosen.update(values or {})
    chosen.update(dict.fromkeys(_INTERVALS, rate_interval))

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in chosen:
            raise ValueError(f"{expr!r} uses ${name}, which the dashboard does not define")
        return chosen[name]

    return _VARIABLE.sub(substitute, expr)

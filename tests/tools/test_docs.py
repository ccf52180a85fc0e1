"""The docs say each thing once, and say it as the code does.

- Every constant the docs cite is read from the code, and every citation of it in the
  README, docs/semantics.md and the package's docstrings and comments must state the
  code's value. A citation is the constant's name in backticks followed by its value:
  ``ASYNC_TEE_QUEUE_SIZE`` (default 1024), ``STEP_SETTLE_S`` (0.1 s), ``WAKE_TARGET`` = 64,
  ``FORK_PAUSE_S``, 1 s. A bare mention (no value after it) is not checked, so prose may
  name a constant without repeating its value.
- The README's configuration table and config.py's variable docstrings state the
  ``Settings`` defaults.
- The README's benchmark table is generated from ``benchmarks/results/latest.json``
  (``benchmarks/summary.py``), its links into docs/semantics.md resolve, its Layout lists
  every module, and it stays short.
- Neither the README nor docs/semantics.md carries history or measured figures: those
  belong to the CHANGELOG and ``benchmarks/results/latest.md``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import itertools
import json
import math
import pkgutil
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import async_tee
from async_tee import config
from async_tee._worker.steps import BACKSTOP_GRACE, STEP_SETTLE_S

PACKAGE = Path(async_tee.__file__).parent
ROOT = PACKAGE.parent
README = ROOT / "README.md"
SEMANTICS = ROOT / "docs" / "semantics.md"
GUARANTEES = ROOT / "docs" / "guarantees.md"
LATEST_JSON = ROOT / "benchmarks" / "results" / "latest.json"
SUMMARY = ROOT / "benchmarks" / "summary.py"


def _modules() -> list[ModuleType]:
    found = [async_tee]
    for info in pkgutil.walk_packages(async_tee.__path__, "async_tee."):
        if info.name != "async_tee.__main__":
            found.append(importlib.import_module(info.name))
    return found


def _constant(name: str, module: str) -> Any:
    """``module.name``; if it moved, the one module of the package that defines it."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        holders = [m for m in _modules() if name in vars(m)]
        assert len(holders) == 1, f"{name}: not in {module}, and defined in {holders}"
        return getattr(holders[0], name)


_DEFAULTS = config.Settings()

# name: (the code's value, its unit: "s", "ms" or None for a count or a share)
CONSTANTS: dict[str, tuple[float, str | None]] = {
    "ASYNC_TEE_QUEUE_SIZE": (_DEFAULTS.queue_size, None),
    "ASYNC_TEE_DRAIN_INTERVAL": (_DEFAULTS.drain_interval_s, "s"),
    "ASYNC_TEE_SHUTDOWN_TIMEOUT": (_DEFAULTS.shutdown_timeout_s, "s"),
    "ASYNC_TEE_MAX_ATTRIBUTE_SETS": (_DEFAULTS.max_attribute_sets, None),
    "ASYNC_TEE_MIN_EXPORT_INTERVAL": (_DEFAULTS.min_export_interval_s, "s"),
    "ASYNC_TEE_HELD_TTL": (_DEFAULTS.held_ttl_s, "s"),
    "ASYNC_TEE_TRAINER_KEYS": (_DEFAULTS.trainer_keys, None),
    "ASYNC_TEE_PROMETHEUS_BASE_PORT": (float(_DEFAULTS.prometheus_base_port or 0), None),
    "OTEL_METRIC_EXPORT_INTERVAL": (_DEFAULTS.export_interval_ms, "ms"),
    "OTEL_METRIC_EXPORT_TIMEOUT": (_DEFAULTS.export_timeout_ms, "ms"),
    "STEP_SETTLE_S": (STEP_SETTLE_S, "s"),
    "BACKSTOP_GRACE": (BACKSTOP_GRACE, None),
    "WAKE_TARGET": (_constant("WAKE_TARGET", "async_tee._worker.loop"), None),
    "TRICKLE_INTERVAL_S": (_constant("TRICKLE_INTERVAL_S", "async_tee._worker.loop"), "s"),
    "LONGEST_SLEEP_S": (_constant("LONGEST_SLEEP_S", "async_tee._worker.loop"), "s"),
    "BATCH_SIZE": (_constant("BATCH_SIZE", "async_tee._worker.loop"), None),
    "LAG_SAMPLES": (_constant("LAG_SAMPLES", "async_tee._worker.loop"), None),
    "LOSS_WARNING_INTERVAL_S": (
        _constant("LOSS_WARNING_INTERVAL_S", "async_tee._worker.loop"),
        "s",
    ),
    "COUNTED_STEPS": (_constant("COUNTED_STEPS", "async_tee._worker.recorder"), None),
    "SLICE_S": (_constant("SLICE_S", "async_tee._worker.gil"), "s"),
    "MAIN_GRACE_S": (_constant("MAIN_GRACE_S", "async_tee._session.signals"), "s"),
    "FAILING_AFTER": (_constant("FAILING_AFTER", "async_tee._export.sender"), None),
    "MAX_RETRY_AFTER_S": (_constant("MAX_RETRY_AFTER_S", "async_tee._export.transport"), "s"),
    "HANDOVER_S": (_constant("HANDOVER_S", "async_tee._worker.gil"), "s"),
    "CANCEL_MARGIN_S": (_constant("CANCEL_MARGIN_S", "async_tee._export.sender"), "s"),
    "FORK_PAUSE_S": (_constant("FORK_PAUSE_S", "async_tee._session.session"), "s"),
    "SNAPSHOT_TTL_S": (_constant("SNAPSHOT_TTL_S", "async_tee._session.stats"), "s"),
    "MAX_WARNED_KEYS": (_constant("MAX_WARNED_KEYS", "async_tee._reporting"), None),
}

UNITS_S = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6}

# `NAME`, ``NAME``, :data:`NAME` or a qualified `_worker.NAME`, then "(default V", "(V",
# "= V" or ", V unit" (the comma form needs a unit: ", 2 of them" is not a citation).
_UNIT = r"µs|us|ms|s"


def _citation(name: str) -> re.Pattern[str]:
    token = rf"(?::data:)?`{{1,2}}(?:[\w.]+\.)?{name}`{{1,2}}"

    def number(i: int, unit_required: bool = False) -> str:
        unit = rf"\s*(?P<unit{i}>{_UNIT})\b"
        return rf"(?P<number{i}>\d[\d,]*(?:\.\d+)?)" + (unit if unit_required else f"(?:{unit})?")

    value = (
        rf"\s*(?:\(\s*(?:default\s+)?{number(0)}"
        rf"|=\s*{number(1)}"
        rf"|,\s*(?:default\s+)?{number(2, unit_required=True)})"
    )
    return re.compile(token + value)


def _doc_files() -> list[Path]:
    return [README, SEMANTICS, *sorted(PACKAGE.rglob("*.py"))]


def _citations(name: str) -> list[tuple[str, int, float, str | None]]:
    """Every citation of ``name``: (file, line, number, unit)."""
    found = []
    pattern = _citation(name)
    for path in _doc_files():
        text = path.read_text()
        for match in pattern.finditer(text):
            i = next(i for i in range(3) if match.group(f"number{i}") is not None)
            number = float(match.group(f"number{i}").replace(",", ""))
            line = text.count("\n", 0, match.start()) + 1
            found.append((str(path.relative_to(ROOT)), line, number, match.group(f"unit{i}")))
    return found


def _in_code_unit(number: float, unit: str | None, code_unit: str | None) -> float | None:
    """The cited number in the code's unit, or None where the units cannot agree."""
    if code_unit is None:
        return number if unit is None else None
    if unit is None:  # a bare number is in the code's own unit
        return number
    return number * UNITS_S[unit] / UNITS_S[code_unit]


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("name", sorted(CONSTANTS))
def test_every_citation_of_a_constant_states_the_codes_value(name):
    value, code_unit = CONSTANTS[name]
    citations = _citations(name)
    if name not in _TABLE_FIELDS:  # else the configuration table cites it (checked below)
        assert citations, f"{name} is never cited with its value: cite it, or drop it here"
    wrong = [
        f"{path}:{line}: {number:g}{' ' + unit if unit else ''}"
        for path, line, number, unit in citations
        if (cited := _in_code_unit(number, unit, code_unit)) is None or not _same(cited, value)
    ]
    assert not wrong, (
        f"{name} is {value:g}{' ' + code_unit if code_unit else ''} in the code: {wrong}"
    )


# Phrasings that restate a constant's value without naming it (how the copies used to drift:
# "sleeps until ~32 are due", "more than 384 keys"): each must state the code's value too.
_PHRASES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "WAKE_TARGET": (
        (r"until (?:about |~)?(\d+) (?:more |dicts )*(?:are|have) (?:due|arrived)", None),
    ),
    "COUNTED_STEPS": ((r"(\d+) most recent(?:ly seen)?(?: distinct)? steps", None),),
    "BATCH_SIZE": ((r"batches of (\d+)", None), (r"capacity \+ (\d+)", None)),
    "LAG_SAMPLES": ((r"last (\d+) (?:items|lags|dicts)", None),),
    "STEP_SETTLE_S": ((r"(?:arrived|arrives) for (\d+(?:\.\d+)?) s\b", "s"),),
    "LONGEST_SLEEP_S": (
        (r"doubl\w* up to (\d+(?:\.\d+)?) s\b", "s"),
        (r"(?:within|at most) (\d+(?:\.\d+)?) s\b, sooner", "s"),
    ),
    "SLICE_S": (
        (r"every ~?(\d+(?:\.\d+)?) ms of", "ms"),
        (r"slices of ~?(\d+(?:\.\d+)?) ms", "ms"),
    ),
    "HANDOVER_S": ((r"sleeps? (\d+) µs", "µs"),),
    "ASYNC_TEE_DRAIN_INTERVAL": ((r"drain timer is (\d+) ms", "ms"),),
    "MAX_WARNED_KEYS": ((r"past (\d+) distinct sites", None),),
}


@pytest.mark.parametrize("name", sorted(_PHRASES))
def test_unnamed_restatements_of_a_constant_state_the_codes_value(name):
    value, code_unit = CONSTANTS[name]
    wrong = []
    for path in _doc_files():
        text = path.read_text()
        for pattern, unit in _PHRASES[name]:
            for match in re.finditer(pattern, text):
                cited = _in_code_unit(float(match.group(1)), unit, code_unit)
                if cited is None or not _same(cited, value):
                    line = text.count("\n", 0, match.start()) + 1
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r}")
    assert not wrong, f"{name} is {value:g} in the code: {wrong}"


# The README's configuration table: variable -> the Settings field of its default.
_TABLE_FIELDS = {
    "ASYNC_TEE_ENABLED": "enabled",
    "ASYNC_TEE_QUEUE_SIZE": "queue_size",
    "ASYNC_TEE_DRAIN_INTERVAL": "drain_interval_s",
    "ASYNC_TEE_SHUTDOWN_TIMEOUT": "shutdown_timeout_s",
    "ASYNC_TEE_MAX_ATTRIBUTE_SETS": "max_attribute_sets",
    "ASYNC_TEE_EXPORT_RANKS": "export_ranks",
    "ASYNC_TEE_PROMETHEUS_BASE_PORT": "prometheus_base_port",
    "ASYNC_TEE_FLUSH_SIGNALS": "flush_signals",
    "ASYNC_TEE_STEP_EXPORT": "step_export",
    "ASYNC_TEE_MIN_EXPORT_INTERVAL": "min_export_interval_s",
    "OTEL_METRICS_EXPORTER": "exporters",
    "OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL": "otlp_protocol",
    "OTEL_EXPORTER_OTLP_[METRICS_]TIMEOUT": "otlp_timeout_s",
    "OTEL_EXPORTER_OTLP_[METRICS_]COMPRESSION": "otlp_compression",
    "OTEL_METRIC_EXPORT_INTERVAL": "export_interval_ms",
    "OTEL_METRIC_EXPORT_TIMEOUT": "export_timeout_ms",
}


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def _as_cell(value: object) -> str:
    """How the README's table writes a default."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _numeric(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def test_the_readmes_configuration_table_states_the_settings_defaults():
    rows = {}
    for line in _section(README.read_text(), "Configuration").splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) >= 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[2].strip("`")
    assert set(_TABLE_FIELDS) <= set(rows), set(_TABLE_FIELDS) - set(rows)
    wrong = []
    for variable, field in _TABLE_FIELDS.items():
        code, doc = _as_cell(getattr(_DEFAULTS, field)), rows[variable]
        code_number, doc_number = _numeric(code), _numeric(doc)
        if code_number is not None and doc_number is not None:
            same = _same(code_number, doc_number)
        else:
            same = code == doc
        if not same:
            wrong.append(f"{variable}: README {doc!r}, Settings.{field} = {code!r}")
    assert not wrong, wrong


def test_config_docstrings_state_the_settings_defaults():
    """``ASYNC_TEE_X = "ASYNC_TEE_X"`` followed by ``\"\"\"int, default 1024: ...\"\"\"``."""
    body = ast.parse(Path(config.__file__).read_text()).body
    checked, wrong = 0, []
    for node, following in itertools.pairwise(body):
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in _TABLE_FIELDS
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            continue
        match = re.search(r"\bdefault (\d[\d_]*(?:\.\d+)?)\b", following.value.value)
        if match is None:
            continue
        name = node.targets[0].id
        code = getattr(_DEFAULTS, _TABLE_FIELDS[name])
        checked += 1
        if not _same(float(match.group(1)), float(code)):
            wrong.append(f"{name}: docstring says default {match.group(1)}, Settings has {code}")
    assert checked >= 5, "config.py's variable docstrings no longer state their defaults"
    assert not wrong, wrong


def _load_summary() -> Any:
    spec = importlib.util.spec_from_file_location("bench_summary", SUMMARY)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_summary", module)
    spec.loader.exec_module(module)
    return module


def test_readme_benchmark_table_is_generated_from_latest_json():
    summary = _load_summary()
    results = json.loads(LATEST_JSON.read_text())
    assert not results["config"]["quick"], "latest.json is a --quick run"
    assert summary.block(README.read_text()) == summary.render(results), (
        "the README's benchmark table is not render(latest.json): "
        "run `python benchmarks/summary.py`"
    )
    first_screen = summary.block(README.read_text(), summary.HEADLINE_START, summary.HEADLINE_END)
    assert first_screen == summary.headline(results), (
        "the README's first-screen figures are not headline(latest.json): "
        "run `python benchmarks/summary.py`"
    )
    assert "at trainer pace" in first_screen
    assert "back to back" in first_screen


def _github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation gone, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_links_into_the_semantics_resolve():
    semantics = SEMANTICS.read_text()
    anchors = {_github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", semantics, re.M)}
    anchors |= set(re.findall(r'<a id="([^"]+)"></a>', semantics))
    links = re.findall(r"docs/semantics\.md#([\w-]+)", README.read_text())
    links += re.findall(r"\]\(semantics\.md#([\w-]+)", GUARANTEES.read_text())
    assert links, "nothing links to a section of docs/semantics.md"
    assert set(links) <= anchors, sorted(set(links) - anchors)


def test_every_guarantee_row_links_to_its_section():
    rows = [
        line
        for line in GUARANTEES.read_text().splitlines()
        if line.startswith("| ") and not line.startswith(("| guarantee", "| ---"))
    ]
    assert rows
    assert all("](semantics.md#" in row for row in rows), [
        row[:60] for row in rows if "](semantics.md#" not in row
    ]
    assert "docs/guarantees.md" in _section(README.read_text(), "Guarantees")


def test_every_test_the_docs_name_exists():
    text = README.read_text() + GUARANTEES.read_text()
    named = re.findall(r"`((?:\w+/)?test_\w+\.py)::(test_\w+)", text)
    assert named
    missing = [
        f"{module}::{name}"
        for module, name in named
        if not (ROOT / "tests" / module).exists()
        or not re.search(rf"^(?:async )?def {name}\(", (ROOT / "tests" / module).read_text(), re.M)
    ]
    assert not missing, missing


def test_the_readme_is_at_most_350_lines():
    assert len(README.read_text().splitlines()) <= 350


def test_the_layout_lists_every_folder_and_public_module_once():
    layout = _section(README.read_text(), "Layout")
    listed = [
        name
        for group in re.findall(r"^- ([^:]*):", layout, re.M)
        for name in re.findall(r"`(\w+)/?`", group)
    ]
    public = re.search(r"^- Public: (.*)$", layout, re.M)
    assert public, "the Layout names the public modules on a line of their own"
    listed += re.findall(r"`(\w+)/?`", public.group(1).split(";")[0])
    listed.append("__init__")
    on_disk = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.parent.name for p in PACKAGE.glob("*/__init__.py")
    }
    on_disk.discard("__main__")
    assert sorted(listed) == sorted(set(listed)), "a name is listed twice"
    assert set(listed) == on_disk, {
        "not in the Layout": sorted(on_disk - set(listed)),
        "no such module or folder": sorted(set(listed) - on_disk),
    }


# History and figures belong to the CHANGELOG and benchmarks/results/latest.md.
_NOT_IN_THE_CONTRACT = (
    r"before this change",
    r"measured before",
    r"\bwas \d",
    r"\bnear \d+ keys",
    r"\b\d+ series\b",
    r"on this project's (?:noisy )?(?:2-vCPU )?host",
)


@pytest.mark.parametrize("path", [README, SEMANTICS, GUARANTEES], ids=lambda p: p.name)
def test_the_readme_and_the_semantics_carry_no_history_or_figures(path):
    text = path.read_text()
    found = [m.group(0) for p in _NOT_IN_THE_CONTRACT for m in re.finditer(p, text)]
    assert not found, found


def test_readme_capacity_table_is_generated_from_each_stacks_full_fleet_run():
    summary = _load_summary()
    reports = {name: json.loads(path.read_text()) for name, path in summary.CAPACITY_JSON.items()}
    assert set(reports) == {"remote-write", "fleet"}  # both stacks measured, published
    assert summary.block(
        README.read_text(), summary.CAPACITY_START, summary.CAPACITY_END
    ) == summary.render_capacity(reports), (
        "the README's capacity table is not render_capacity(results/capacity-*.json): "
        "run `python benchmarks/summary.py`"
    )
    fleet = reports["fleet"]
    counted = [run for run in fleet["runs"] if run["ranks"] >= 2000 and run["step_s"] == 10]
    assert counted, "no run of 2,000 ranks at 10 s steps in the fleet's report"
    assert counted[0]["store"]["missing"] == 0  # every rank's every step in the store

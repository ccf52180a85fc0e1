"""The trainers' integrations: a real trainer's step time with its async_tee integration on and off.

Usage: ``python benchmarks/bench_integrations.py [--rounds N] [--quick] [--out PATH]``
(needs the trainers' heavy packages of ``.ci/trainers.txt``: ``.ci/use-trainers-env VENV``;
without them the report says so and nothing runs; verl, which does not install on Python 3.13,
is skipped alone).

**The trainers** are the toy runs of ``tests/trainers`` on CPU (a one-layer Llama of hidden size
16 and a word tokenizer, built there): TRL's ``GRPOTrainer`` and a plain ``transformers.Trainer``
with ``AsyncTeeCallback``, a Lightning ``Trainer`` with ``AsyncTeeLogger``, each logging every
step, torch on one thread (``one_torch_thread``); verl's real ``Tracking`` (its console backend,
printing to ``/dev/null``) with ``AsyncTeeBackend``, logging verl's realistic GRPO step dict
(``verl_toys.VERL_STEP_METRICS``, 76 keys) every ``VERL_GAP_S`` (verl's ``fit`` needs GPUs; its
driver waits on Ray between two logs, the GIL free, as the sleep here).

**A step** is timed by a callback that sees its boundaries: from one step's start to the next's
(HF: ``on_step_begin``; Lightning: a ``Callback``'s ``on_train_batch_start``), so the logging
after the step's end (``on_log``, ``log_metrics``: where the integrations tee) falls inside; a
run's first step (warm-up) and last (no next start: the train's end) are left out. verl's step
is one ``Tracking.log`` call, console against console + async_tee.

**On and off.** ``off``: the trainer without the integration, no telemetry. ``on``: the
integration plugged in, telemetry exporting as every benchmark here does
(``_common.pipeline``: OTLP/HTTP to a real ``OtlpSink`` in a child process, ``_receiver.py``,
so decoding exports never takes the trainer's GIL; step export on with its default 1 s minimum
interval). Per trainer a warm-up run (not measured), then ``--rounds`` rounds of one ``off``
and one ``on`` run each, their order rotated per round, so the machine's drift hits both.
Ratios are ``on`` over ``off`` in the same run: of the p50 step and of the sum of the steps.

**The hooks.** Every hook of the integration (the methods ``Trainer.hooks`` names) is wrapped in a
``perf_counter_ns`` pair, and the ``tee_rl_metrics_to_otel`` it calls too (the integration
module's name, patched for the run): per step, the time in hooks on the training thread and of
it in the tee call (the tee's own cost, of the same dict at the same moment; the rest is the
hook's extra, the timing's own cost included: ``wrapper_floor``), and per hook method, per
call. The worker's and the exporting thread's CPU
(``pthread_getcpuclockid``) over the run, per step, is the cost off the training thread.

The toys' steps take milliseconds, real RL steps 0.6 s to 20 minutes: the ratios here
overstate what a real run pays; the hooks' absolute µs is what carries over.
Full: 8 rounds (about 3.5 minutes on a 2-core VM). ``--quick``: one round of a few steps.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from types import ModuleType
from typing import Any

from _common import (
    ROOT,
    Receiver,
    Session,
    bench_parser,
    fmt,
    fmt_opt,
    machine_info,
    md_table,
    parse_bench_args,
    percentiles,
    pipeline,
    progress,
    publish,
    quiet_logging,
    rotated,
    start_receiver,
    text_table,
    thread_cpu_ns,
)

import async_tee

TESTS = ROOT / "tests"
HEAVY = ("torch", "transformers", "trl", "datasets", "tokenizers", "lightning", "pytest")
"""What ``tests/trainers/toys.py`` imports (pytest: its ``require``)."""
VARIANTS = ("off", "on")
WARM_STEPS = 1  # a run's first step: lazy initialisation, the first generation
VERL_GAP_S = 0.01
TORCH_THREADS = 1
THREADS = ("async-tee-worker", "async-tee-export")


@dataclass(frozen=True)
class Trainer:
    """One trainer: how it is run, its integration and the hooks timed."""

    name: str
    label: str
    integration: str  # async_tee.integrations.<module>
    plug_in: str
    hooks: tuple[str, ...]
    steps: int
    quick_steps: int
    needs: tuple[str, ...] = ()


TRAINERS = (
    Trainer(
        "grpo",
        "TRL GRPOTrainer",
        "transformers",
        "callbacks=[AsyncTeeCallback()]",
        ("on_train_begin", "on_step_begin", "on_log", "on_train_end"),
        steps=152,
        quick_steps=4,
    ),
    Trainer(
        "trainer",
        "transformers Trainer",
        "transformers",
        "callbacks=[AsyncTeeCallback()]",
        ("on_train_begin", "on_step_begin", "on_log", "on_train_end"),
        steps=402,
        quick_steps=4,
    ),
    Trainer(
        "lightning",
        "Lightning Trainer",
        "lightning",
        "Trainer(logger=[..., AsyncTeeLogger()])",
        ("log_hyperparams", "log_metrics", "finalize"),
        steps=1002,
        quick_steps=6,
    ),
    Trainer(
        "verl",
        "verl Tracking.log",
        "verl",
        'Tracking.logger["async_tee"] = AsyncTeeBackend()',
        ("log", "finish"),
        steps=500,
        quick_steps=5,
        needs=("verl",),
    ),
)
PER_STEP_HOOKS = {"on_step_begin", "on_log", "log_metrics", "log"}
"""The hooks a step calls; the others run once a train (start, or the end's flush)."""

# ------------------------------------------------------------------ timing


class Timeline:
    """A run's step times, and the time in the integration's hooks and tee calls per step."""

    def __init__(self) -> None:
        self.boundaries = 0
        self.step_ns: list[int] = []
        self.hook_ns: list[int] = []  # per step: every hook call in it
        self.tee_ns: list[int] = []  # per step: the tee calls inside those hooks
        self.calls: dict[str, list[tuple[int, int]]] = {}  # per hook: (hook ns, tee ns) a call
        self._start: int | None = None
        self._hook = 0
        self._tee = 0

    def boundary(self) -> None:
        """A step starts: the one before it (if any) ends."""
        now = time.perf_counter_ns()
        if self._start is not None:
            self.close(now - self._start)
        self._start, self._hook, self._tee = now, 0, 0
        self.boundaries += 1

    def close(self, step_ns: int) -> None:
        """A step of ``step_ns`` ends, with the hooks and tee calls since the last close."""
        self.step_ns.append(step_ns)
        self.hook_ns.append(self._hook)
        self.tee_ns.append(self._tee)
        self._hook = self._tee = 0

    def hook(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` timed as the hook ``name``."""
        calls = self.calls.setdefault(name, [])

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            tee_before = self._tee
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                ns = time.perf_counter_ns() - t0
                self._hook += ns
                calls.append((ns, self._tee - tee_before))

        return timed

    def tee(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (the tee call) timed."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self._tee += time.perf_counter_ns() - t0

        return timed


def plugged(trainer: Trainer, integration: Any, timeline: Timeline) -> Any:
    """``integration`` with its hooks timed (instance attributes shadow the methods)."""
    for name in trainer.hooks:
        setattr(integration, name, timeline.hook(name, getattr(integration, name)))
    return integration


@contextlib.contextmanager
def timed_tee(module: ModuleType, timeline: Timeline) -> Iterator[None]:
    """The integration module's ``tee_rl_metrics_to_otel`` timed, for the run."""
    original = module.tee_rl_metrics_to_otel
    setattr(module, "tee_rl_metrics_to_otel", timeline.tee(original))  # noqa: B010
    try:
        yield
    finally:
        setattr(module, "tee_rl_metrics_to_otel", original)  # noqa: B010


# ------------------------------------------------------------------ the trainers


def missing(names: Sequence[str]) -> list[str]:
    """The modules of ``names`` that cannot be found."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def toys() -> ModuleType:
    """``tests/trainers/toys.py`` (imports the heavy packages; HF offline, before the Hub)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    return importlib.import_module("trainers.toys")


def quiet_trainers() -> None:
    """The trainers' banners and tips off: stdout carries the report."""
    for name in ("lightning.pytorch", "lightning.fabric", "transformers", "trl"):
        logging.getLogger(name).setLevel(logging.WARNING)


def one_torch_thread() -> None:
    """torch's CPU ops on the training thread alone (``TORCH_THREADS``).

    With one thread a core, any other process on the machine stalls OpenMP's barrier: the
    toys' steps went from 4 and 16 ms to 110 and 200 ms for whole runs (seen on 2 cores),
    which no ratio survives. A real trainer's CPU side launches GPU kernels from one thread.
    """
    import torch

    torch.set_num_threads(TORCH_THREADS)


def wrapper_floor(calls: int = 20_000) -> dict[str, Any]:
    """What the timing itself adds to a hook call: an empty hook calling an empty tee, warm."""
    timeline = Timeline()
    tee = timeline.tee(lambda: None)
    hook = timeline.hook("empty", lambda: tee())
    for _ in range(calls):
        hook()
    timed = timeline.calls["empty"][calls // 10 :]
    return {"hook_us": _us([h for h, _ in timed]), "extra_us": _us([h - t for h, t in timed])}


def hf_run(trainer: Trainer, on: bool, steps: int, timeline: Timeline) -> None:
    """The GRPO or plain Trainer toy, a callback timing its steps (and the integration)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            timeline.boundary()

    callbacks = [StepTimer()]
    if on:
        from async_tee.integrations.transformers import AsyncTeeCallback

        callbacks.append(plugged(trainer, AsyncTeeCallback(), timeline))
    run = toys().run_grpo if trainer.name == "grpo" else toys().run_hf_trainer
    with tempfile.TemporaryDirectory(prefix="async-tee-bench-") as out:
        run(callbacks, Path(out), steps=steps)


def lightning_run(trainer: Trainer, on: bool, steps: int, timeline: Timeline) -> None:
    """The Lightning toy, a ``Callback`` timing its batches (and the logger)."""
    import lightning.pytorch as pl

    class StepTimer(pl.Callback):  # type: ignore[misc]
        def on_train_batch_start(self, *args: Any, **kwargs: Any) -> None:
            timeline.boundary()

    loggers = []
    if on:
        from async_tee.integrations.lightning import AsyncTeeLogger

        loggers.append(plugged(trainer, AsyncTeeLogger(), timeline))
    with tempfile.TemporaryDirectory(prefix="async-tee-bench-") as out:
        toys().run_lightning(loggers, Path(out), steps=steps, callbacks=[StepTimer()])


def verl_run(trainer: Trainer, on: bool, steps: int, timeline: Timeline, gap_s: float) -> None:
    """verl's ``Tracking`` (console, to /dev/null) logging verl's step dict, each call timed."""
    tracking_module = importlib.import_module("verl.utils.tracking")
    step_metrics = importlib.import_module("trainers.verl_toys").VERL_STEP_METRICS
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        tracking = tracking_module.Tracking(
            project_name="async_tee", experiment_name="bench", default_backend=["console"]
        )
        backend = None
        if on:  # as install() adds it, without patching Tracking for the off runs
            from async_tee.integrations.verl import BACKEND, AsyncTeeBackend

            backend = tracking.logger[BACKEND] = plugged(trainer, AsyncTeeBackend(), timeline)
        pc = time.perf_counter_ns
        for step in range(1, steps + 1):
            data = {**step_metrics, "training/global_step": step}
            t0 = pc()
            tracking.log(data=data, step=step)
            timeline.close(pc() - t0)
            timeline.boundaries += 1
            time.sleep(gap_s)
        tracking.finish()
        if backend is not None:  # install()'s finish() adds this: verl finishes its own only
            backend.finish()


# ------------------------------------------------------------------ runs


@dataclass
class Config:
    """The run's sizes."""

    quick: bool
    rounds: int
    steps: dict[str, int]
    verl_gap_s: float


@dataclass
class Run:
    """One run of one trainer, on or off."""

    trainer: str
    variant: str
    round_: int
    timeline: Timeline
    wall_s: float
    threads_cpu_ns: int | None = None
    session: dict[str, Any] = field(default_factory=dict)

    @property
    def measured(self) -> slice:
        """The steps measured: the first ``WARM_STEPS`` left out."""
        return slice(WARM_STEPS, None)


def _threads_cpu(running: Session) -> int | None:
    cpus = [thread_cpu_ns(t) for t in running.threads if t.name in THREADS and t.is_alive()]
    return None if not cpus or None in cpus else sum(c for c in cpus if c is not None)


def _session_figures() -> dict[str, Any]:
    stats = async_tee.stats()
    return {
        "enqueued": stats["enqueued"],
        "recorded": stats["recorded"],
        "dropped": stats["dropped"],
        "steps": {k: stats["steps"][k] for k in ("completed", "exported", "coalesced")},
        "exports": dict(stats["exports"]),
        "key_limit_skipped": stats["values_skipped"]["key_limit"],
    }


def run_once(
    trainer: Trainer, variant: str, round_: int, cfg: Config, receiver: Receiver | None
) -> Run:
    """One run: ``off`` bare; ``on`` in a fresh pipeline exporting to ``receiver``."""
    on = variant == "on"
    steps = cfg.steps[trainer.name]
    timeline = Timeline()
    module = importlib.import_module(f"async_tee.integrations.{trainer.integration}")

    def train() -> None:
        if trainer.name == "verl":
            verl_run(trainer, on, steps, timeline, cfg.verl_gap_s)
        elif trainer.name == "lightning":
            lightning_run(trainer, on, steps, timeline)
        else:
            hf_run(trainer, on, steps, timeline)

    started = time.perf_counter()
    if receiver is None or not on:
        train()
        return Run(trainer.name, variant, round_, timeline, time.perf_counter() - started)
    with pipeline(receiver.port) as running, timed_tee(module, timeline):
        cpu_before = _threads_cpu(running)
        train()
        async_tee.flush(5.0)
        cpu_after = _threads_cpu(running)
        session = _session_figures()
    session["shutdown_ok"] = running.info["shutdown_ok"]
    session["threads_left"] = running.info["threads_left"]
    threads = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    wall = time.perf_counter() - started
    return Run(trainer.name, variant, round_, timeline, wall, threads, session)


def run_trainer(trainer: Trainer, cfg: Config, receiver: Receiver) -> list[Run]:
    """A warm-up run, then per round one ``off`` and one ``on`` run, in rotated order."""
    run_once(trainer, "on", -1, Config(cfg.quick, 1, {trainer.name: 3}, 0.0), receiver)
    runs = []
    for round_ in range(cfg.rounds):
        for variant in rotated(VARIANTS, round_, cfg.rounds):
            run = run_once(trainer, variant, round_, cfg, receiver)
            runs.append(run)
            steps = run.timeline.step_ns[run.measured]
            p50 = percentiles(Counter(steps))["p50"] / 1000 if steps else float("nan")
            progress(
                f"[{round_ + 1}/{cfg.rounds}] {trainer.name:<9} {variant:<3}: "
                f"{run.timeline.boundaries} steps, p50 {p50:8.3f} ms, {run.wall_s:5.1f} s"
            )
    return runs


# ------------------------------------------------------------------ summaries


def _us(samples: Sequence[int]) -> dict[str, float] | None:
    """Percentiles and max in µs of nanosecond samples (None without samples)."""
    return percentiles(Counter(samples)) if samples else None


def _ms(samples: Sequence[int]) -> dict[str, float] | None:
    us = _us(samples)
    return None if us is None else {k: v / 1000 for k, v in us.items()}


def _ratio(on: float | None, off: float | None) -> float | None:
    return None if on is None or not off else on / off


def _hook_calls(runs: Sequence[Run]) -> dict[str, Any]:
    """Per hook method: calls, and the µs of the hook, of the tee in it, and of the rest."""
    out: dict[str, Any] = {}
    names = dict.fromkeys(name for run in runs for name in run.timeline.calls)
    for name in names:
        calls = [c for run in runs for c in run.timeline.calls.get(name, [])]
        out[name] = {
            "calls": len(calls),
            "per_step": name in PER_STEP_HOOKS,
            "hook_us": _us([h for h, _ in calls]),
            "tee_us": _us([t for _, t in calls]),
            "extra_us": _us([h - t for h, t in calls]),
        }
    return out


def summarise(trainer: Trainer, runs: Sequence[Run]) -> dict[str, Any]:
    """One trainer's figures: step times on and off, ratios, hooks, the session's counts."""
    by_variant = {v: [r for r in runs if r.variant == v] for v in VARIANTS}
    steps = {
        v: [ns for r in rs for ns in r.timeline.step_ns[r.measured]] for v, rs in by_variant.items()
    }
    step_ms = {v: _ms(s) for v, s in steps.items()}
    sums = {v: sum(s) for v, s in steps.items()}
    on_runs = by_variant["on"]
    hooks = [ns for r in on_runs for ns in r.timeline.hook_ns[r.measured]]
    tees = [ns for r in on_runs for ns in r.timeline.tee_ns[r.measured]]
    by_round = {}
    for round_ in sorted({r.round_ for r in runs}):
        pair = {r.variant: sum(r.timeline.step_ns[r.measured]) for r in runs if r.round_ == round_}
        by_round[round_] = _ratio(pair.get("on"), pair.get("off"))
    round_ratios = [x for x in by_round.values() if x is not None]
    measured_on = sum(len(r.timeline.step_ns[r.measured]) for r in on_runs)
    threads = [r.threads_cpu_ns for r in on_runs]
    return {
        "label": trainer.label,
        "plug_in": trainer.plug_in,
        "prefix": trainer.integration,
        "runs": [
            {
                "variant": r.variant,
                "round": r.round_,
                "steps_run": r.timeline.boundaries,
                "steps_measured": len(r.timeline.step_ns[r.measured]),
                "step_ms": _ms(r.timeline.step_ns[r.measured]),
                "hook_calls": {name: len(calls) for name, calls in r.timeline.calls.items()},
                "wall_s": r.wall_s,
                "session": r.session,
            }
            for r in runs
        ],
        "steps": {v: len(s) for v, s in steps.items()},
        "step_ms": step_ms,
        "sum_s": {v: s / 1e9 for v, s in sums.items()},
        "ratio": {
            "p50": _ratio(*((step_ms[v] or {}).get("p50") for v in ("on", "off"))),
            "sum": _ratio(sums["on"], sums["off"]),
            "sum_by_round": list(by_round.values()),
            "median_round_sum": median(round_ratios) if round_ratios else None,
        },
        "hook_us_per_step": _us(hooks),
        "tee_us_per_step": _us(tees),
        "extra_us_per_step": _us([h - t for h, t in zip(hooks, tees, strict=True)]),
        "hook_pct_of_step": 100 * sum(hooks) / sums["on"] if sums["on"] else None,
        "hook_calls": _hook_calls(on_runs),
        "threads_cpu_us_per_step": (
            None
            if None in threads or not measured_on
            else sum(t for t in threads if t is not None)
            / sum(r.timeline.boundaries for r in on_runs)
            / 1000
        ),
        "dicts_teed_per_step": (
            sum(r.session.get("enqueued", 0) for r in on_runs)
            / max(1, sum(r.timeline.boundaries for r in on_runs))
        ),
        "dropped": sum(r.session.get("dropped", 0) for r in on_runs),
        "steps_before_shutdown": {  # the last one is exported at shutdown
            k: sum(r.session["steps"][k] for r in on_runs if r.session)
            for k in ("completed", "exported", "coalesced")
        },
        "shutdown_ok": all(r.session.get("shutdown_ok") for r in on_runs),
    }


# ------------------------------------------------------------------ tables

TITLE = "The trainers' integrations: step time on and off"
STEP_HEADER = (
    "trainer",
    "steps off/on",
    "off p50 / p99 / max ms",
    "on p50 / p99 / max ms",
    "on/off p50",
    "on/off sum",
    "rounds' on/off sums",
)
HOOK_HEADER = (
    "trainer",
    "hooks µs/step p50 / p99 / p99.9 / max",
    "of which the tee p50 / p99 / p99.9 / max",
    "hook's extra p50 / max",
    "hooks % of step",
    "dicts teed/step",
    "worker+exporter CPU µs/step",
    "steps exported/completed",
    "dropped",
)
CALL_HEADER = ("trainer", "hook", "calls", "hook µs p50 / p99 / max", "tee µs p50 / p99 / max")


def _slash(figures: dict[str, float] | None, names: Sequence[str]) -> str:
    return "" if figures is None else " / ".join(fmt(figures[n]) for n in names)


def _loads(loads: Sequence[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in loads)


def _skipped(part: dict[str, Any]) -> str | None:
    return part.get("skipped")


def step_rows(trainers: dict[str, Any]) -> list[tuple[str, ...]]:
    """Step times on and off, per trainer."""
    rows: list[tuple[str, ...]] = []
    for name, t in trainers.items():
        if _skipped(t):
            rows.append((name, f"skipped: {t['skipped']}", "", "", "", "", ""))
            continue
        rounds = ", ".join(fmt_opt(x, ".3f", "n/a") for x in t["ratio"]["sum_by_round"])
        rows.append(
            (
                t["label"],
                f"{t['steps']['off']}/{t['steps']['on']}",
                _slash(t["step_ms"]["off"], ("p50", "p99", "max")),
                _slash(t["step_ms"]["on"], ("p50", "p99", "max")),
                fmt_opt(t["ratio"]["p50"], ".3f"),
                fmt_opt(t["ratio"]["sum"], ".3f"),
                rounds,
            )
        )
    return rows


def hook_rows(trainers: dict[str, Any]) -> list[tuple[str, ...]]:
    """The hooks' time on the training thread per step, and the tee's part of it."""
    return [
        (
            t["label"],
            _slash(t["hook_us_per_step"], ("p50", "p99", "p99.9", "max")),
            _slash(t["tee_us_per_step"], ("p50", "p99", "p99.9", "max")),
            _slash(t["extra_us_per_step"], ("p50", "max")),
            fmt_opt(t["hook_pct_of_step"], ".3f"),
            fmt_opt(t["dicts_teed_per_step"], ".2f"),
            fmt_opt(t["threads_cpu_us_per_step"], ".0f"),
            "{exported}/{completed}".format(**t["steps_before_shutdown"]),
            str(t["dropped"]),
        )
        for t in trainers.values()
        if not _skipped(t)
    ]


def call_rows(trainers: dict[str, Any]) -> list[tuple[str, ...]]:
    """Each hook per call (the once-a-train ones too: the end's flush waits for the worker)."""
    return [
        (
            t["label"],
            name + ("" if call["per_step"] else " (once)"),
            str(call["calls"]),
            _slash(call["hook_us"], ("p50", "p99", "max")),
            _slash(call["tee_us"], ("p50", "p99", "max")),
        )
        for t in trainers.values()
        if not _skipped(t)
        for name, call in t["hook_calls"].items()
    ]


def section(report: dict[str, Any]) -> list[str]:
    """The tables as markdown lines (no title)."""
    if _skipped(report):
        return [f"Skipped: {report['skipped']}."]
    cfg = report["config"]
    steps = ", ".join(f"{name} {n}" for name, n in cfg["steps"].items())
    trainers = report["trainers"]
    floor = report["wrapper_floor"]
    return [
        f"{cfg['rounds']} rounds per trainer of one run with the integration (`on`) and one "
        f"without (`off`), their order rotated per round, after a warm-up run; steps a run: "
        f"{steps} (each run's first left out, and the trainers' last: it has no next start). "
        "The toy trainers of `tests/trainers` on CPU (a one-layer Llama of hidden size 16 and "
        "a word tokenizer; Lightning: a linear regression), logging every step, torch on "
        f"{cfg['torch_threads']} thread; a step is timed from its start to the next one's "
        "(HF `on_step_begin`, Lightning `on_train_batch_start`), so the logging after it is "
        "inside. verl's step is one `Tracking.log` call of its 76-key GRPO dict (console "
        "backend, to /dev/null, against console + async_tee), "
        f"{cfg['verl_gap_s'] * 1000:g} ms apart (its `fit` needs GPUs). `on`: telemetry "
        "exporting over OTLP/HTTP to an `OtlpSink` in a child process (step export on, with "
        "its default 1 s minimum interval). Load average (1, 5, 15 min) before: "
        f"{_loads(report['load_before'])}, after: {_loads(report['load_after'])} (other "
        "processes on the machine).",
        "",
        "**These toy steps take milliseconds; real RL steps take 0.6 s to 20 minutes.** The "
        "ratios below overstate what a real run pays; what carries over is the hooks' "
        "absolute time (µs per step) against a real step's length.",
        "",
        *md_table(STEP_HEADER, step_rows(trainers)),
        "",
        "What an `on` step gains beyond its hooks (next table) is the other threads' work on "
        "the same cores and GIL: the worker mapping each dict, the exporting thread sending "
        "(their CPU per step in the next table), which a step of milliseconds meets often. A "
        "sum takes in a run's slow steps too, so the rounds' sums scatter more than the p50.",
        "",
        "Time inside the integration's hooks on the training thread per step (every hook "
        "call a step makes, wrapped in `perf_counter_ns`), and of it the "
        "`tee_rl_metrics_to_otel` calls the hooks make (timed inside them: the tee's own "
        "cost, of the same dict at the same moment); the hook's extra is the rest, the "
        f"timing's own {fmt((floor['extra_us'] or {}).get('p50'))} µs a call included (an "
        "empty hook calling an empty tee, warm). A hook called once a step runs with cold "
        "caches: slower than the same call in a tight loop. Hooks % of step: their sum over "
        "the `on` steps' sum. Worker + exporter CPU: those threads' CPU time over the `on` "
        "runs, per step (off the training thread, on the machine's cores). Steps exported: "
        "before shutdown (the last is exported at shutdown); with steps of milliseconds the "
        "1 s minimum interval folds them into about one export a second, where a real run's "
        "steps of a second or more are exported one by one (the cost of an export, off the "
        "training thread: `bench_export.py`).",
        "",
        *md_table(HOOK_HEADER, hook_rows(trainers)),
        "",
        "Per hook call (`on` runs; the once-a-train hooks too: the end's `flush` waits for "
        "the worker to record):",
        "",
        *md_table(CALL_HEADER, call_rows(trainers)),
    ]


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--rounds", type=int, default=None, help="on/off rounds per trainer")
    parser.add_argument(
        "--trainer",
        action="append",
        choices=[t.name for t in TRAINERS],
        default=None,
        help="only this trainer (repeatable)",
    )
    return parse_bench_args(parser, "integrations", argv)


def make_config(args: argparse.Namespace) -> Config:
    """Full: 8 rounds of ``Trainer.steps``; quick: 1 round of ``quick_steps``, verl unpaced."""
    return Config(
        quick=args.quick,
        rounds=args.rounds or (1 if args.quick else 8),
        steps={t.name: t.quick_steps if args.quick else t.steps for t in TRAINERS},
        verl_gap_s=0.0 if args.quick else VERL_GAP_S,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    cfg = make_config(args)
    report: dict[str, Any] = {
        "machine": machine_info(),
        "config": {
            "quick": cfg.quick,
            "rounds": cfg.rounds,
            "steps": cfg.steps,
            "warm_steps": WARM_STEPS,
            "verl_gap_s": cfg.verl_gap_s,
            "torch_threads": TORCH_THREADS,
        },
        "load_before": os.getloadavg(),  # the machine is shared: what else ran, 1/5/15 min
    }
    absent = missing(HEAVY)
    if absent:
        report["skipped"] = (
            f"the trainers' packages are missing ({', '.join(absent)}): "
            "`.ci/use-trainers-env VENV` gives a venv them"
        )
    else:
        quiet_logging()
        toys()  # offline before anything imports the Hub
        quiet_trainers()
        one_torch_thread()
        report["wrapper_floor"] = wrapper_floor()
        chosen = [t for t in TRAINERS if not args.trainer or t.name in args.trainer]
        report["trainers"] = {}
        with contextlib.ExitStack() as stack:
            receiver = start_receiver(stack)
            for trainer in chosen:
                lacking = missing(trainer.needs)
                if lacking:
                    report["trainers"][trainer.name] = {
                        "skipped": f"{', '.join(lacking)} missing (it needs Python < 3.13)"
                    }
                    continue
                runs = run_trainer(trainer, cfg, receiver)
                report["trainers"][trainer.name] = summarise(trainer, runs)
    report["load_after"] = os.getloadavg()
    report["duration_s"] = time.perf_counter() - started
    if _skipped(report):
        console = [f"Skipped: {report['skipped']}"]
    else:
        trainers = report["trainers"]
        console = [
            "Step time with the integrations off and on",
            *text_table(STEP_HEADER, step_rows(trainers)),
            "",
            "Hooks on the training thread",
            *text_table(HOOK_HEADER, hook_rows(trainers)),
        ]
    publish(args.out, report, TITLE, section(report), console)
    return 0


if __name__ == "__main__":
    sys.exit(main())

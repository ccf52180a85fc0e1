"""The integrations' benchmark: each trainer's on and off runs ran their steps, hooks timed.

``benchmarks/bench_integrations.py --quick`` runs in a child process, as ``run_all.py`` runs
it, on the real trainers (their heavy packages of .ci/trainers.txt: skipped without them, or
failing where CI requires them, as ``trainers.required`` says). No figure is judged for speed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import bench_integrations
import pytest
from trainers.required import must_import, require

SCRIPT = Path(bench_integrations.__file__)
PERCENTILES = {"p50", "p90", "p99", "p99.9", "max"}
PER_STEP = {  # each trainer's hooks a step calls, and how many calls each step makes at least
    "grpo": {"on_step_begin": 1, "on_log": 1},
    "trainer": {"on_step_begin": 1, "on_log": 1},
    "lightning": {"log_metrics": 1},
    "verl": {"log": 1},
}


@pytest.mark.slow
@pytest.mark.trainers
@pytest.mark.timeout(300)
def test_quick_run_times_every_trainer_on_and_off(tmp_path):
    for name in ("torch", "transformers", "trl", "datasets", "tokenizers", "lightning"):
        require(name)
    verl_present = must_import("verl") or importlib.util.find_spec("verl") is not None
    out = tmp_path / "integrations.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())

    assert "skipped" not in report
    assert report["config"]["quick"] is True
    assert report["wrapper_floor"]["hook_us"]["p50"] > 0
    rounds, steps = report["config"]["rounds"], report["config"]["steps"]
    trainers = report["trainers"]
    assert set(trainers) == set(PER_STEP)
    assert ("skipped" in trainers["verl"]) is not verl_present
    for name, trainer in trainers.items():
        if "skipped" in trainer:
            continue
        runs = trainer["runs"]
        assert sorted(run["variant"] for run in runs) == ["off"] * rounds + ["on"] * rounds
        # a step is timed to the next one's start: the last has none but verl's (one call)
        unmeasured = 1 + (name != "verl")
        for run in runs:
            assert run["steps_run"] == steps[name], (name, run)
            assert run["steps_measured"] == steps[name] - unmeasured
            assert set(run["step_ms"]) == PERCENTILES
            if run["variant"] == "off":
                assert run["hook_calls"] == {}, (name, run)
                assert run["session"] == {}, (name, run)
                continue
            for hook, at_least in PER_STEP[name].items():
                assert run["hook_calls"][hook] >= at_least * steps[name], (name, hook, run)
            session = run["session"]
            assert session["enqueued"] >= steps[name]
            assert session["dropped"] == 0
            assert session["shutdown_ok"] is True
            assert session["threads_left"] == []
        assert trainer["steps"] == {v: rounds * (steps[name] - unmeasured) for v in ("off", "on")}
        assert set(trainer["step_ms"]["off"]) == set(trainer["step_ms"]["on"]) == PERCENTILES
        assert trainer["ratio"]["p50"] > 0
        assert trainer["ratio"]["sum"] > 0
        assert len(trainer["ratio"]["sum_by_round"]) == rounds
        hooks, tee = trainer["hook_us_per_step"], trainer["tee_us_per_step"]
        assert 0 < tee["p50"] <= hooks["p50"]  # the tee is timed inside the hooks
        assert trainer["extra_us_per_step"]["max"] >= 0
        assert 0 < trainer["hook_pct_of_step"] < 100
        per_call = trainer["hook_calls"]
        assert set(PER_STEP[name]) <= {hook for hook, c in per_call.items() if c["per_step"]}
        assert trainer["dropped"] == 0
        # every step the on runs logged reached the worker as a step of its own
        assert trainer["steps_before_shutdown"]["completed"] == rounds * steps[name]
        assert trainer["shutdown_ok"] is True
    page = out.with_suffix(".md").read_text()
    assert "real RL steps take 0.6 s to 20 minutes" in page
    for trainer in trainers.values():
        assert trainer.get("label", "") in page


def test_without_the_trainers_packages_the_report_says_so_and_nothing_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_integrations, "HEAVY", ("torch", "no_such_trainer_package"))
    out = tmp_path / "integrations.json"
    assert bench_integrations.main(["--quick", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert "no_such_trainer_package" in report["skipped"]
    assert "trainers" not in report
    assert out.with_suffix(".md").read_text().count("Skipped: the trainers' packages") == 1

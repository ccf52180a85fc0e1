"""NeMo-RL's two GRPO loops through the seed's own two-argument tee call, over real OTLP.

Each loop shape runs in a process of its own (``replay_process.py``), 20 steps of at least
1.2 s with the real prefixes, keys, value types and call order, teeing with
``tee_rl_metrics_to_otel(metrics, prefix)`` as NeMo-RL's Logger does: no step is passed, so
async_tee numbers the steps itself, each ended by the ``timing/train`` dict. The receiver
must get every step as its own export, each gauge point equal to the value logged in that
step (absent when that step logged none, or nothing usable), and counters equal to the
logged deltas, although the sync loop logs its rollout keys twice a step.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from async_tee.sink import OtlpSink, ReceivedPoint

TESTS = Path(__file__).parents[1]
STEPS = 20
HELD = {"rl.step", "rl.step.time", "rl.setup.duration"}


def _run_both_shapes(sink: OtlpSink) -> dict[str, dict[str, Any]]:
    processes = {}
    for shape in ("sync", "async"):
        environ = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.http_endpoint,
            "OTEL_METRIC_EXPORT_INTERVAL": "600000",  # only step exports and the final one
            "OTEL_SERVICE_NAME": f"replay-{shape}",
            "ASYNC_TEE_RUN_ID": f"replay-{shape}",
        }
        processes[shape] = subprocess.Popen(
            [sys.executable, str(TESTS / "replay_process.py"), "--shape", shape],
            env=environ,
            stdout=subprocess.PIPE,
            text=True,
        )
    out = {}
    for shape, process in processes.items():
        stdout, _ = process.communicate(timeout=150)
        assert process.returncode == 0, stdout
        logged, delivered = (json.loads(line) for line in stdout.splitlines()[-2:])
        assert delivered == {"delivered": True}
        out[shape] = logged
    return out


def _exports(points: list[ReceivedPoint], service: str) -> list[dict[tuple[str, Any], Any]]:
    """The service's exports in arrival order, each ``{(name, attributes): value}``."""
    by_export: dict[int, dict[tuple[str, Any], Any]] = defaultdict(dict)
    for point in points:
        if point.resource.get("service.name") == service and point.name.startswith("rl."):
            attributes = frozenset(point.attributes.items())
            by_export[point.time_unix_nano][(point.name, attributes)] = point.value
    return [by_export[stamp] for stamp in sorted(by_export)]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_both_grpo_loops_through_the_two_argument_call_export_every_step_truthfully(sink):
    logged = _run_both_shapes(sink)
    points = sink.points()
    for shape, run in logged.items():
        exports = _exports(points, f"replay-{shape}")
        steps = [export[("rl.step", frozenset())] for export in exports]
        # Every step is its own export (the last one again in the export at shutdown).
        assert steps[:STEPS] == list(range(1, STEPS + 1)), (shape, steps)
        assert set(steps[STEPS:]) <= {STEPS}, (shape, steps)
        for export, step in zip(exports, steps, strict=True):
            expected = run["gauges"][str(int(step))]
            got = {
                name: value
                for (name, attributes), value in export.items()
                if not attributes and name not in HELD and (name, attributes)
            }
            # Exactly the gauges logged (and usable) in this step, with their values.
            usable = {
                name: value
                for name, value in expected.items()
                if value is not None and math.isfinite(value)
            }
            counters = set(run["counters"])
            assert {n: v for n, v in got.items() if n not in counters} == pytest.approx(usable), (
                shape,
                step,
            )
        by_step = {int(s): e for e, s in zip(exports, steps, strict=True)}
        reward: tuple[str, frozenset[Any]] = ("rl.reward.mean", frozenset())
        assert reward not in by_step[5]  # a string: skipped and counted, not the old value
        assert reward not in by_step[13]  # not logged: absent, not repeated from step 12
        assert by_step[9][reward] == pytest.approx(run["gauges"]["9"]["rl.reward.mean"])
        assert by_step[10][("rl.validation.accuracy", frozenset())] is not None
        assert ("rl.validation.accuracy", frozenset()) not in by_step[11]
        assert run["skipped"]["not_a_number"] >= 1
        # Counters: the deltas each once, although sync logs its rollout keys twice a step.
        last = exports[-1]
        for name, total in run["counters"].items():
            assert last[(name, frozenset())] == pytest.approx(total), (shape, name)

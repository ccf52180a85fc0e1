"""The integrations on the real trainers, on CPU: every key of every step at the receiver (§13).

Each test runs a real trainer (TRL's ``GRPOTrainer``, ``transformers.Trainer``, a Lightning
``Trainer``, verl's ``Tracking``) with its async_tee integration, which starts telemetry from
the environment: OTLP/HTTP to a real receiver on 127.0.0.1 (``OtlpSink``), a step export for
every step (``ASYNC_TEE_MIN_EXPORT_INTERVAL=0``: the toy steps take milliseconds, and the default
1 s would fold them, §9). A recorder beside the integration holds what the trainer logged; every
number of it must arrive, at its step, in the series §13 names, and the session must prove the
delivery (``shutdown_telemetry()`` is True).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from trainers.toys import run_grpo, run_hf_trainer, run_lightning

import async_tee
from async_tee._declare import trainers as trainer_keys
from async_tee._declare.prometheus_names import prometheus_label
from async_tee.catalog import series_catalog
from async_tee.config import run_id
from async_tee.integrations.lightning import AsyncTeeLogger
from async_tee.integrations.transformers import AsyncTeeCallback
from async_tee.sink import OtlpSink
from async_tee.vocabulary import as_scalar
from servers import query, run_stack

pytestmark = [pytest.mark.trainers, pytest.mark.timeout(300)]

Series = tuple[str, frozenset[tuple[str, str]]]
LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


@pytest.fixture
def exporting(sink: OtlpSink, monkeypatch: pytest.MonkeyPatch) -> OtlpSink:
    """The environment a user sets: OTLP to the sink; nothing of a launcher (one process)."""
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.http_endpoint)
    monkeypatch.setenv("ASYNC_TEE_MIN_EXPORT_INTERVAL", "0")
    monkeypatch.setenv("ASYNC_TEE_FLUSH_SIGNALS", "")
    for name in LAUNCHER:
        monkeypatch.delenv(name, raising=False)
    return sink


def series_of(trainer: trainer_keys.TrainerKeys, key: str) -> Series:
    """Where §13 records a trainer's key."""
    aliases = dict(trainer.aliases)
    if key in aliases:
        return (aliases[key], frozenset())
    phase = trainer.phase_prefix
    if phase and key.startswith(phase) and len(key) > len(phase):
        return ("rl.step.phase.duration", frozenset({("rl.step.phase", key[len(phase) :])}))
    return ("rl.logged.value", frozenset({("rl.trainer", trainer.prefix), ("rl.key", key)}))


def expected(
    trainer: trainer_keys.TrainerKeys, logged: Iterable[tuple[int, Mapping[str, Any]]]
) -> dict[Series, dict[int, float]]:
    """Each series' value at each step: the last number logged for it in that step."""
    out: dict[Series, dict[int, float]] = {}
    for step, metrics in logged:
        for key, raw in metrics.items():
            value = as_scalar(raw)
            if value is not None and math.isfinite(value):
                out.setdefault(series_of(trainer, key), {})[step] = value
    return out


def received(sink: OtlpSink, series: Series) -> dict[int, set[float]]:
    """Every value the receiver got for ``series``, by the step its export carried."""
    out: dict[int, set[float]] = {}
    for step, value in sink.by_step(series[0], dict(series[1])):
        assert step is not None, f"{series}: exported without its step"
        assert value is not None
        out.setdefault(int(step), set()).add(float(value))
    return out


def assert_every_step_arrived(
    sink: OtlpSink,
    trainer: trainer_keys.TrainerKeys,
    logged: list[tuple[int, dict[str, Any]]],
    finished_steps: int,
) -> dict[Series, dict[int, float]]:
    """Delivery proven, every logged number at its step, and the session's counts exact."""
    counts = async_tee.stats()
    assert async_tee.shutdown_telemetry(30.0) is True  # every request delivered: the evidence
    want = expected(trainer, logged)
    assert want
    for series, by_step in want.items():
        got = received(sink, series)
        assert set(got) == set(by_step), (series, sorted(got), sorted(by_step))
        for step, value in by_step.items():
            assert got[step] == {value}, (series, step)  # the last step's is repeated as is
    steps = {step for step, _ in logged}
    assert counts["enqueued"] == len(logged) + finished_steps
    assert counts["dropped"] == 0
    assert counts["values_skipped"]["key_limit"] == 0
    assert counts["values_skipped"]["stale_step"] == 0
    assert received(sink, ("rl.step.time", frozenset())).keys() == steps  # each step exported
    return want


def test_grpo_every_key_of_every_step_reaches_the_receiver_at_its_step(exporting, tmp_path):
    run = run_grpo([AsyncTeeCallback()], tmp_path, steps=3)
    steps = {step for step, _ in run.logged}
    assert steps == {1, 2, 3}
    want = assert_every_step_arrived(exporting, trainer_keys.TRANSFORMERS, run.logged, len(steps))
    # TRL's keys of a NeMo-RL meaning are in NeMo-RL's series; its own, as logged.
    names = {series[0] for series in want}
    assert {"rl.reward.mean", "rl.kl.divergence", "rl.policy.loss", "rl.entropy"} <= names
    assert {"rl.grad_norm", "rl.learning_rate", "rl.response.length.mean"} <= names
    logged_keys = {dict(s[1])["rl.key"] for s in want if s[0] == "rl.logged.value"}
    assert {"rewards/length_reward/mean", "rewards/cat_reward/mean", "reward_std"} <= logged_keys
    assert "train_runtime" in logged_keys  # the end of train's dict joins the last step


def test_a_plain_trainer_too(exporting, tmp_path):
    run = run_hf_trainer([AsyncTeeCallback()], tmp_path, steps=3)
    steps = {step for step, _ in run.logged}
    want = assert_every_step_arrived(exporting, trainer_keys.TRANSFORMERS, run.logged, len(steps))
    assert ("rl.policy.loss", frozenset()) in want


def test_lightning_every_key_of_every_step_reaches_the_receiver_at_its_step(exporting, tmp_path):
    run = run_lightning(AsyncTeeLogger(), tmp_path, steps=3)
    logged = run.recorder.steps
    assert len({step for step, _ in logged}) >= 3
    # one end-of-step marker: at finalize (the steps before end when the next one starts)
    want = assert_every_step_arrived(exporting, trainer_keys.LIGHTNING, logged, 1)
    names = {series[0] for series in want}
    assert {"rl.policy.loss", "rl.reward.mean", "rl.kl.divergence"} <= names
    assert (
        "rl.logged.value",
        frozenset({("rl.trainer", "lightning"), ("rl.key", "lr-SGD")}),
    ) in want


def test_verl_every_key_of_every_step_reaches_the_receiver_at_its_step(
    exporting, monkeypatch: pytest.MonkeyPatch
):
    """verl's real ``Tracking``, given async_tee's backend by ``install()``, logging the dicts
    its trainer's ``fit`` logs (validation at step 0, then steps 1 to 3)."""
    from trainers.required import require
    from trainers.verl_toys import run_verl_tracking, verl_fit_logs

    tracking = require("verl.utils.tracking").Tracking
    for name in ("__init__", "finish"):  # install() patches the class: undone after the test
        monkeypatch.setattr(tracking, name, getattr(tracking, name))
    from async_tee.integrations import verl

    assert verl.install() is True
    assert verl.install() is True  # idempotent: one backend, not two
    recorded = run_verl_tracking(verl_fit_logs(3))
    assert recorded.finished is False  # verl finishes only the backends it names...
    steps = {step for step, _ in recorded.steps}
    assert steps == {0, 1, 2, 3}
    # ...and async_tee's finish (flush) ran: the steps are recorded before shutdown
    assert async_tee.stats()["steps"]["completed"] == 4
    want = assert_every_step_arrived(exporting, trainer_keys.VERL, recorded.steps, 0)
    names = {series[0] for series in want}
    assert {"rl.reward.mean", "rl.kl.divergence", "rl.policy.loss", "rl.entropy"} <= names
    assert {"rl.grad_norm", "rl.learning_rate", "rl.throughput.tokens.per_gpu"} <= names
    assert {"rl.step.duration", "rl.step.phase.duration", "rl.response.length.mean"} <= names


def stored(web: int, name: str) -> dict[frozenset[tuple[str, str]], dict[float, float]]:
    """Every sample Prometheus holds of ``name``: by its labels, {timestamp: value}."""
    out: dict[frozenset[tuple[str, str]], dict[float, float]] = {}
    for series in query(web, f"{name}[1h]"):
        labels = frozenset(series["metric"].items())
        out[labels] = {float(ts): float(value) for ts, value in series["values"]}
    return out


@pytest.mark.slow
@pytest.mark.servers
def test_grpo_through_prometheus_3_every_key_of_every_step_is_stored_at_its_step(
    tmp_path, monkeypatch: pytest.MonkeyPatch
):
    """The same run on the path users run (OTLP into Prometheus 3, the stack's own config):
    each number logged is one sample, paired with ``rl_step`` by its timestamp."""
    for name in LAUNCHER:
        monkeypatch.delenv(name, raising=False)
    with run_stack("otlp", tmp_path) as running:
        for name, value in running.rank_environment().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("ASYNC_TEE_MIN_EXPORT_INTERVAL", "0")
        monkeypatch.setenv("ASYNC_TEE_FLUSH_SIGNALS", "")
        run = run_grpo([AsyncTeeCallback()], tmp_path / "run", steps=3)
        assert async_tee.shutdown_telemetry(30.0) is True
        want = expected(trainer_keys.TRANSFORMERS, run.logged)
        prometheus = {entry.name: entry.prometheus_name for entry in series_catalog()}
        (steps,) = stored(running.web, prometheus["rl.step"]).values()
        for (name, attributes), by_step in want.items():
            labels = {(prometheus_label(key), label) for key, label in attributes}
            held = [
                samples
                for found, samples in stored(running.web, prometheus[name]).items()
                if labels <= found
            ]
            assert len(held) == 1, (name, attributes, len(held))
            got: dict[int, set[float]] = {}
            for ts, sample in held[0].items():
                got.setdefault(int(steps[ts]), set()).add(sample)
            assert got == {step: {value} for step, value in by_step.items()}, (name, attributes)


LIGHTNING_DDP = """
import sys
from trainers.toys import _lightning_warnings, ToyModule, pl, torch
from async_tee.integrations.lightning import AsyncTeeLogger

if __name__ == "__main__":
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(24, 4), torch.randn(24, 1))
    trainer = pl.Trainer(
        max_steps=3, accelerator="cpu", devices=2, strategy=sys.argv[2], log_every_n_steps=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        logger=AsyncTeeLogger(), default_root_dir=sys.argv[1],
    )
    with _lightning_warnings():
        trainer.fit(ToyModule(), torch.utils.data.DataLoader(data, batch_size=4))
"""


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp"])
def test_lightning_ranks_started_without_a_launcher_export_as_their_own_rank_of_one_run(
    exporting, tmp_path, strategy
):
    """Lightning starts its ranks itself, with no launcher of the user's: ``ddp_spawn`` from a
    parent that does not train, ``ddp`` (its default) running the script as rank 0 and rank 1
    as its child. Each rank exports as the rank Lightning gave it, of 2, every step, and both
    under one run id: the process that started them."""
    script = tmp_path / "lightning_ddp.py"
    script.write_text(LIGHTNING_DDP)
    tests = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), strategy],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    step_of = {
        (point.resource.get("rl.rank"), point.time_unix_nano): point.value
        for point in exporting.points()
        if point.name == "rl.step"
    }
    steps: dict[Any, set[Any]] = {}
    for point in exporting.points():
        if point.name == "rl.policy.loss":
            rank = point.resource.get("rl.rank")
            steps.setdefault(rank, set()).add(step_of.get((rank, point.time_unix_nano)))
            assert point.resource["rl.world_size"] == 2
    assert steps == {0: {0, 1, 2}, 1: {0, 1, 2}}
    runs = {point.resource["rl.run.id"] for point in exporting.points()}
    assert len(runs) == 1, runs  # the process that started both ranks: one run
    (run,) = runs
    assert run != run_id(os.environ)  # not the test's (the script's parent)


RAY_VERL = """
import json, os, sys
import ray

ray.init(
    num_cpus=1, include_dashboard=False, log_to_driver=False,
    runtime_env={"worker_process_setup_hook": "async_tee.integrations.verl.install"},
)

@ray.remote
class TaskRunner:  # where verl's trainer makes its Tracking and logs each step
    def fit(self):
        from verl.utils.tracking import Tracking
        import async_tee
        tracking = Tracking("async_tee", "ray", default_backend=["console"])
        for step in (1, 2, 3):
            tracking.log({"critic/score/mean": step / 10, "timing_s/gen": 1.5}, step=step)
        tracking.finish()  # verl's end of fit: async_tee's backend delivers here
        return {"backends": sorted(tracking.logger), "stats": async_tee.stats()}

out = ray.get(TaskRunner.remote().fit.remote())
ray.shutdown()
print(json.dumps({"backends": out["backends"], "exports": out["stats"]["delivery"]}))
"""


@pytest.mark.slow
def test_verl_in_its_ray_actor_gets_the_backend_from_rays_setup_hook(exporting, tmp_path):
    """verl's trainer makes its ``Tracking`` in a Ray actor: ``install`` as Ray's worker setup
    hook (the README's command-line override) reaches it, and the actor's steps arrive."""
    from trainers.required import require

    require("verl.utils.tracking")
    require("ray")
    script = tmp_path / "ray_verl.py"
    script.write_text(RAY_VERL)
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["backends"] == ["async_tee", "console"]
    assert received(exporting, ("rl.reward.mean", frozenset())) == {
        1: {0.1},
        2: {0.2},
        3: {0.3},
    }

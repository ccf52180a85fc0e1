"""A trainer's keys: aliases into the rl.* series, phases, the rest passed through (§13)."""

from __future__ import annotations

import pytest
from helpers import collect

import async_tee
from async_tee._declare import trainers
from async_tee._declare.trainers import TRAINERS
from async_tee._settings import DEFAULT_TRAINER_KEYS as LOGGED_KEYS_PER_TRAINER
from async_tee.catalog import series_catalog

LOGGED = "rl.logged.value"


def logged(trainer: str, key: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return (LOGGED, frozenset({("rl.trainer", trainer), ("rl.key", key)}))


def plain(name: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return (name, frozenset())


def phase(name: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return ("rl.step.phase.duration", frozenset({("rl.step.phase", name)}))


@pytest.mark.parametrize("trainer", TRAINERS, ids=lambda t: t.prefix)
def test_every_alias_reaches_the_series_a_nemo_rl_key_of_its_meaning_feeds(
    trainer, provider, reader
):
    """Each alias alone in a step of its own: its value, in its series, at its step."""
    async_tee.start_telemetry(provider)
    by_name = {entry.name: entry for entry in series_catalog()}
    for step, (key, name) in enumerate(trainer.aliases, 1):
        value = step + 0.25
        async_tee.tee_rl_metrics_to_otel({key: value}, trainer.prefix, step, step_finished=True)
        assert async_tee.flush()
        points = collect(reader)
        assert points[plain(name)] == value, (key, name)
        assert points[plain("rl.step")] == step
        assert f"{trainer.prefix}:{key}" in by_name[name].logger_key.split(", ")
        # an alias's key is never passed through as well
        assert logged(trainer.prefix, key) not in points


def test_the_rest_passes_through_as_logged_and_verl_timings_are_phases(provider, reader):
    async_tee.start_telemetry(provider)
    trl = {
        "reward": 0.5,
        "reward_std": 0.125,
        "rewards/format_reward/mean": 0.75,
        "clip_ratio/low_mean": 0.0,
        "num_tokens": 4096.0,
        "epoch": 0.5,
        "note": "not a number",
    }
    async_tee.tee_rl_metrics_to_otel(trl, "transformers", 3)
    verl = {
        "critic/score/mean": 0.25,
        "timing_s/step": 12.5,
        "timing_s/gen": 7.0,
        "timing_s/update_actor": 4.0,
        "timing_per_token_ms/gen": 0.01,
        "actor/pg_clipfrac": 0.0625,
    }
    async_tee.tee_rl_metrics_to_otel(verl, "verl", 3, step_finished=True)
    assert async_tee.flush()
    points = collect(reader)
    assert points[plain("rl.reward.mean")] == 0.25  # the later dict of the step: verl's
    assert points[plain("rl.step.duration")] == 12.5
    assert points[phase("gen")] == 7.0
    assert points[phase("update_actor")] == 4.0
    passed = {key: value for key, value in points.items() if key[0] == LOGGED}
    assert passed == {
        logged("transformers", "reward_std"): 0.125,
        logged("transformers", "rewards/format_reward/mean"): 0.75,
        logged("transformers", "clip_ratio/low_mean"): 0.0,
        logged("transformers", "num_tokens"): 4096.0,
        logged("transformers", "epoch"): 0.5,
        logged("verl", "timing_per_token_ms/gen"): 0.01,
        logged("verl", "actor/pg_clipfrac"): 0.0625,
    }
    assert async_tee.stats()["values_skipped"]["not_a_number"] == 1


def test_keys_past_the_bound_are_counted_and_named_once(provider, reader, logs):
    async_tee.start_telemetry(provider)
    extra = 5
    keys = [f"custom/key_{i:03d}" for i in range(LOGGED_KEYS_PER_TRAINER + extra)]
    for step in (1, 2):  # the same keys again: the first ones stay, the rest stay out
        metrics = dict.fromkeys(keys, float(step))
        async_tee.tee_rl_metrics_to_otel(metrics, "lightning", step, step_finished=True)
        assert async_tee.flush()
    points = collect(reader)
    passed = sorted(dict(key[1])["rl.key"] for key in points if key[0] == LOGGED)
    assert passed == keys[:LOGGED_KEYS_PER_TRAINER]
    assert {points[logged("lightning", key)] for key in passed} == {2.0}
    assert async_tee.stats()["values_skipped"]["key_limit"] == 2 * extra
    said = [r for r in logs.records if "distinct keys" in r.getMessage() and r.levelno >= 30]
    assert len(said) == 1
    assert repr(keys[LOGGED_KEYS_PER_TRAINER]) in said[0].getMessage()


def test_another_trainers_bound_is_its_own(provider, reader):
    async_tee.start_telemetry(provider)
    full = {f"k{i}": 1.0 for i in range(LOGGED_KEYS_PER_TRAINER)}
    async_tee.tee_rl_metrics_to_otel(full, "lightning", 1)
    async_tee.tee_rl_metrics_to_otel({"mine": 2.0}, "verl", 1, step_finished=True)
    assert async_tee.flush()
    assert collect(reader)[logged("verl", "mine")] == 2.0
    assert async_tee.stats()["values_skipped"]["key_limit"] == 0


def test_a_gauge_of_a_finished_step_arriving_late_is_stale_not_recorded(provider, reader):
    async_tee.start_telemetry(provider)
    async_tee.tee_rl_metrics_to_otel({"loss": 1.0, "x": 1.0}, "transformers", 1)
    async_tee.tee_rl_metrics_to_otel({"loss": 2.0, "x": 2.0}, "transformers", 2)
    async_tee.tee_rl_metrics_to_otel({"loss": 9.0, "x": 9.0}, "transformers", 1)  # late
    assert async_tee.flush()
    assert async_tee.stats()["values_skipped"]["stale_step"] == 2


def test_an_alias_to_a_series_a_user_renamed_passes_its_key_through(provider, reader, monkeypatch):
    """A user's row took the reward key under another name: the alias reads nothing."""
    renamed = trainers.TrainerKeys("verl", (("critic/score/mean", "rl.not.declared"),))
    monkeypatch.setattr(trainers, "TRAINERS", (renamed,))
    monkeypatch.setattr("async_tee._worker.mapping.TRAINERS", (renamed,))
    async_tee.start_telemetry(provider)
    async_tee.tee_rl_metrics_to_otel({"critic/score/mean": 0.5}, "verl", 1, step_finished=True)
    assert async_tee.flush()
    assert collect(reader)[logged("verl", "critic/score/mean")] == 0.5


def test_the_trainers_prefixes_are_teed_whole_and_nothing_else_changed():
    from async_tee._worker.mapping import compile_plan
    from async_tee.vocabulary import efficiency_categories, teed_metrics

    plan = compile_plan(teed_metrics(), efficiency_categories())
    for trainer in TRAINERS:
        assert plan.snapshot_keys[trainer.prefix] is None  # every key is read: copied whole
        assert plan.trainers[trainer.prefix].read == trainer.read_by_alias
    assert plan.snapshot_keys["train"] is not None  # NeMo-RL's dicts: only the read keys


def test_the_bound_is_the_environments(provider, reader):
    """``ASYNC_TEE_TRAINER_KEYS`` sets how many keys a trainer passes through."""
    async_tee.start_telemetry(provider, environ={"ASYNC_TEE_TRAINER_KEYS": "2"})
    metrics = {"a": 1.0, "b": 2.0, "c": 3.0, "actor/pg_loss": 0.5}  # an alias: not counted
    async_tee.tee_rl_metrics_to_otel(metrics, "verl", 1, step_finished=True)
    assert async_tee.flush()
    points = collect(reader)
    assert {dict(k[1])["rl.key"] for k in points if k[0] == LOGGED} == {"a", "b"}
    assert async_tee.stats()["values_skipped"]["key_limit"] == 1

"""Replay of the ``Logger.log_metrics`` calls NeMo-RL's GRPO loops make, step by step.

Reproduces (with our own code, not NeMo-RL's) the order, prefixes, key names and value
*types* of every ``log_metrics(metrics, step, prefix, step_finished=...)`` call of
``nemo_rl/algorithms/grpo.py`` on branch ``rajsin/lens-with-goodput``, for a vLLM
async-engine run with ``enable_vllm_metrics_logger`` on, a Megatron policy (hence ``wd``),
the GRPO advantage estimator, no reward penalties, no dynamic sampling, no debug payload
metrics and no spec-decode-only keys -- the configuration ``/work/shared/fixtures/
grpo_step.json`` was recorded with. Steps are 1-based, as grpo.py logs ``step + 1``.

Before the loop (``setup_calls``), both shapes:

* ``timing/setup`` at step 0, 7 keys (grpo.py 1681-1683, ``setup()``; python floats).
* with ``val_at_start``: ``validation`` (2 keys) then ``timing/validation`` (1 key), step 0
  (sync: 2786-2787; async: 4508-4509). The sync initial validation refits the engine, so
  the first sync step then has no ``prepare_for_generation/transfer_and_update_weights``.

Sync ``grpo_train`` (2696-3900), per step:

1. ``train`` -- the rollout metrics alone, 22 keys (3063).
2. if validating: ``timing/validation`` (1 key) then ``validation`` (2 keys) (3471-3476;
   note the order is the reverse of the initial validation's).
3. ``train`` -- the full dict, 68 keys (3504-3573, logged at 3842): the rollout keys again
   (merged at 3568) minus ``per_worker_token_counts`` (deleted by
   ``print_performance_metrics``, algorithms/utils.py 891-892), plus the vLLM per-step deltas
   (``gen_step_metrics``, merged at 3540), ``generation_logger_metrics`` (a nested dict) and
   the sequence-level logprob-error metrics (3573).
4. ``performance`` -- 11 keys (3827, logged 3843-3845).
5. ``timing/train`` -- 18 keys (17 without a refit), ``step_finished=True`` (3847-3852).

``refit`` (3841) and the payload dict with prefix ``""`` (3838) are only logged when
non-empty: the default refit path returns ``{}`` (2426) and payload metrics need
``grpo.debug_payload_metrics``, so neither appears here.

Async ``async_grpo_train`` (4174-5660), per step:

1. if validating: ``timing/validation`` (1 key) then ``validation`` (2 keys) (5227-5230).
2. ``performance`` -- 12 keys (5546, logged 5597); ``training_worker_idle_time_ratio`` is
   the python int ``0`` whenever exposed generation exceeds 0.1 s (utils.py 753-757).
3. ``train`` -- 69 keys (5264-5328, plus ``buffer_size``/``avg_trajectory_age`` at 5489-5490,
   logged at 5598). Rollout metrics are aggregated over prompt groups
   (``aggregate_rollout_metrics``, 4132-4171): the histograms become lists of per-group
   lists, and ``trajectory_duration_s`` (+ ``/max``, ``/p95``) appear. No
   ``baseline_reward/*`` or ``advantages/sum`` (the sync-only helper at 2443).
4. ``""`` -- the efficiency dict, 18 ``efficiency/*`` keys (``print_efficiency_summary``,
   utils.py 976-1098; built at 5557-5584, logged at 5599), BEFORE the timing call. The
   collector-side thread categories are run-cumulative (its timer is never reset).
5. ``timing/train`` -- 20 keys (21 on the first step: ``init/total``, timed before the loop
   at 4565/4640, survives until the first ``timer.reset()``; 21/22 with validation),
   ``step_finished=True`` (5601-5606).

Value types: timer values (``timing/*``, the throughputs derived from them, and most of
the efficiency dict) are ``numpy.float64``; the ``train`` values are python ``float``/``int``
after grpo.py's aggregation (``np.sum(v).item()``), lists of ints (histograms),
``dict[int, int]`` (``per_worker_token_counts``, first sync ``train`` dict only) and the
nested ``generation_logger_metrics`` (``dict[str, dict[int, list]]``); the setup dict and
the validation dict are python floats. The ``vllm/*`` deltas are per-step python floats.
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

SHAPES = ("sync", "async")

PROMPTS_PER_STEP = 32
GENERATIONS_PER_PROMPT = 16
SAMPLES_PER_STEP = PROMPTS_PER_STEP * GENERATIONS_PER_PROMPT
MAX_NEW_TOKENS = 512
GENERATION_WORKERS = 4  # keys of ``per_worker_token_counts``
GENERATION_DP = 2  # dp ranks in ``generation_logger_metrics``
SYNC_GPUS = 8  # colocated: training and generation share them
ASYNC_TRAIN_GPUS = 8  # non-colocated async: separate training and generation GPUs
ASYNC_GEN_GPUS = 8
INIT_TOTAL_S = 182.4  # async ``init/total``: measured once, re-logged unchanged every step

SETUP_KEYS = (
    "vllm_init_time_s",
    "policy_init_time_s",
    "collective_init_time_s",
    "parallel_wall_time_s",
    "parallel_init_enabled",
    "total_setup_time_s",
    "other_setup_time_s",
)
VLLM_DELTA_KEYS = (
    "vllm/prompt_tokens",
    "vllm/generation_tokens",
    "vllm/prompt_length_mean",
    "vllm/generation_length_mean",
    "vllm/generations_ok",
    "vllm/generations_failed",
)
VLLM_COUNTER_KEYS = (
    "vllm/prompt_tokens",
    "vllm/generation_tokens",
    "vllm/generations_ok",
    "vllm/generations_failed",
)


@dataclasses.dataclass(frozen=True)
class Call:
    """One ``Logger.log_metrics(metrics, step, prefix, step_finished=...)`` call."""

    metrics: dict[str, Any]
    prefix: str
    step: int
    step_finished: bool = False


@dataclasses.dataclass
class _Batch:
    """One step's samples: what the rollout, reward and training metrics are built from."""

    prompt_lengths: list[int]
    gen_lengths: list[int]
    rewards: list[float]
    truncated: list[bool]

    @property
    def size(self) -> int:
        return len(self.gen_lengths)

    @property
    def total_lengths(self) -> list[int]:
        return [p + g for p, g in zip(self.prompt_lengths, self.gen_lengths, strict=True)]

    def group(self, index: int) -> _Batch:
        lo, hi = index * GENERATIONS_PER_PROMPT, (index + 1) * GENERATIONS_PER_PROMPT
        return _Batch(
            self.prompt_lengths[lo:hi],
            self.gen_lengths[lo:hi],
            self.rewards[lo:hi],
            self.truncated[lo:hi],
        )


def _rng_for(shape: str, step: int, rng: random.Random | None) -> random.Random:
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    return rng if rng is not None else random.Random(f"{shape}:{step}")


def _batch(step: int, rng: random.Random) -> _Batch:
    reward_p = 0.25 + 0.55 * (1 - math.exp(-step / 40))
    gen_mean = 220 + 60 * (1 - math.exp(-step / 80))
    prompts: list[int] = []
    gens: list[int] = []
    rewards: list[float] = []
    for _ in range(PROMPTS_PER_STEP):
        prompt = rng.randint(40, 160)
        group_p = min(1.0, max(0.0, rng.gauss(reward_p, 0.3)))
        for _ in range(GENERATIONS_PER_PROMPT):
            prompts.append(prompt)
            gens.append(max(8, min(MAX_NEW_TOKENS, int(rng.gauss(gen_mean, 110)))))
            rewards.append(1.0 if rng.random() < group_p else 0.0)
    return _Batch(prompts, gens, rewards, [g >= MAX_NEW_TOKENS for g in gens])


def _pct(values: Sequence[float | int], p: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(int(len(ordered) * p / 100), len(ordered) - 1)])


def _rollout_metrics(batch: _Batch, workers: Sequence[int]) -> dict[str, Any]:
    """A rollout's metrics dict, in the key order and types of the native rollout."""
    n = batch.size
    turns = [1] * n
    per_worker: dict[int, int] = {}
    for i, gen in enumerate(batch.gen_lengths):
        worker = workers[i % len(workers)]
        per_worker[worker] = per_worker.get(worker, 0) + gen
    return {
        "total_turns": sum(turns),
        "avg_turns_per_sample": sum(turns) / n,
        "max_turns_per_sample": max(turns),
        "turns_per_sample/p95": _pct(turns, 95),
        "turns_per_sample/p99": _pct(turns, 99),
        "natural_termination_rate": sum(not t for t in batch.truncated) / n,
        "truncation_rate": sum(batch.truncated) / n,
        "max_turns_reached_rate": sum(t >= 1 for t in turns) / n,
        "mean_total_tokens_per_sample": sum(batch.total_lengths) / n,
        "mean_gen_tokens_per_sample": sum(batch.gen_lengths) / n,
        "max_gen_tokens_per_sample": max(batch.gen_lengths),
        "mean_env_tokens_per_sample": sum(0 for _ in turns) / n,
        "max_gen_tokens_per_turn/max": max(batch.gen_lengths),
        "max_gen_tokens_per_turn/mean": sum(batch.gen_lengths) / n,
        "max_gen_tokens_per_turn/p95": _pct(batch.gen_lengths, 95),
        "mean_total_reward": sum(batch.rewards) / n,
        "max_total_reward": max(batch.rewards),
        "min_total_reward": min(batch.rewards),
        "per_worker_token_counts": per_worker,
        "histogram/gen_tokens_length": list(batch.gen_lengths),
        "histogram/input_tokens_length": list(batch.prompt_lengths),
        "histogram/total_tokens_length": batch.total_lengths,
    }


def _aggregate_groups(groups: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Async: combine per-prompt-group rollout dicts the way the async loop does."""
    by_key: dict[str, list[Any]] = {}
    for group in groups:
        for key, value in group.items():
            by_key.setdefault(key, []).append(value)
    out: dict[str, Any] = {}
    for key, values in by_key.items():
        is_min = key.endswith("/min") or (key.startswith("min_") and not key.endswith("_rate"))
        is_max = key.endswith("/max") or (key.startswith("max_") and not key.endswith("_rate"))
        if not isinstance(values[0], (int, float)):
            out[key] = values  # lists and dicts pass through as one entry per group
        elif is_min:
            out[key] = min(values)
        elif is_max:
            out[key] = max(values)
        elif key == "total_turns":
            out[key] = sum(values)
        elif key == "trajectory_duration_s":
            out[key] = sum(values) / len(values)
            out[f"{key}/max"] = max(values)
            out[f"{key}/p95"] = _pct(values, 95)
        else:
            out[key] = sum(values) / len(values)
    return out


def _vllm_deltas(batch: _Batch, rng: random.Random) -> dict[str, float]:
    """The engine's per-step counter deltas (and two means), as python floats."""
    failed = rng.choice((0, 0, 0, 0, 1, 2))
    return {
        "vllm/prompt_tokens": float(sum(batch.prompt_lengths)),
        "vllm/generation_tokens": float(sum(batch.gen_lengths) + failed * 37),
        "vllm/prompt_length_mean": sum(batch.prompt_lengths) / batch.size,
        "vllm/generation_length_mean": sum(batch.gen_lengths) / batch.size,
        "vllm/generations_ok": float(batch.size),
        "vllm/generations_failed": float(failed),
    }


def _generation_logger_metrics(batch: _Batch, rng: random.Random) -> dict[str, Any]:
    """vLLM's timeline dict: metric -> dp rank (int) -> samples over the step."""
    points = 6
    out: dict[str, dict[int, list[Any]]] = {
        "inflight_batch_sizes": {},
        "num_pending_samples": {},
        "kv_cache_usage_perc": {},
        "generation_tokens": {},
    }
    per_rank = sum(batch.gen_lengths) // GENERATION_DP
    for dp in range(GENERATION_DP):
        inflight = [0] + [max(0, 64 - rng.randint(0, 10) * i) for i in range(1, points)]
        out["inflight_batch_sizes"][dp] = inflight
        out["num_pending_samples"][dp] = [max(0, 192 - 96 * i) for i in range(points)]
        out["kv_cache_usage_perc"][dp] = [round(b / 64 * 0.6, 2) for b in inflight]
        out["generation_tokens"][dp] = [per_rank * i // (points - 1) for i in range(points)]
    return out


def _train_scalars(step: int, batch: _Batch, rng: random.Random) -> dict[str, Any]:
    """``all_mb_metrics`` after grpo.py's reduction: python floats, Megatron's key order."""
    progress = 1 - math.exp(-step / 60)
    probs_min = 0.75 + rng.uniform(0, 0.05)
    probs_max = 1.3 + rng.uniform(0, 0.05)
    return {
        "loss": -0.01 + rng.gauss(0, 0.005),
        "probs_ratio": 1.0 + rng.gauss(0, 0.0005),
        "probs_ratio_clamped": 1.0 + rng.gauss(0, 0.0002),
        "probs_ratio_min": probs_min,
        "probs_ratio_max": probs_max,
        "probs_ratio_clamped_min": max(0.8, probs_min),
        "probs_ratio_clamped_max": min(1.2, probs_max),
        "kl_penalty": 0.0005 + 0.003 * progress + abs(rng.gauss(0, 0.0001)),
        "token_mult_prob_error": 1.01 + abs(rng.gauss(0, 0.004)),
        "gen_kl_error": 0.0009 + abs(rng.gauss(0, 0.0001)),
        "policy_kl_error": 0.0009 + abs(rng.gauss(0, 0.0001)),
        "js_divergence_error": 0.0002 + abs(rng.gauss(0, 0.00003)),
        "sampling_importance_ratio": 1.0 + rng.gauss(0, 0.001),
        "num_valid_samples": float(batch.size),
        "approx_entropy": 0.45 - 0.15 * progress + rng.gauss(0, 0.01),
        "positive_nll_loss": 0.0,
        "lr": 5e-6 * min(1.0, step / 10),
        "wd": 0.01,
        "global_valid_seqs": float(batch.size),
        "global_valid_toks": float(sum(batch.gen_lengths)),
    }


def _seq_logprob_error_metrics(rng: random.Random) -> dict[str, Any]:
    """Sequence-level logprob error metrics; ``num_masked_seqs`` is renamed, so it ends last."""
    low, mean, high = 1.0 + rng.uniform(0, 0.003), 1.01 + rng.uniform(0, 0.005), 1.04
    high += rng.uniform(0, 0.02)
    return {
        "max_seq_mult_prob_error": high,
        "mean_seq_mult_prob_error": mean,
        "min_seq_mult_prob_error": low,
        "max_seq_mult_prob_error_after_mask": high,
        "mean_seq_mult_prob_error_after_mask": mean,
        "min_seq_mult_prob_error_after_mask": low,
        "masked_correct_pct": 0.0,
        "num_masked_seqs_by_logprob_error": 0,
    }


def _advantage_stats(batch: _Batch, rng: random.Random) -> tuple[float, float, float]:
    spread = 2.0 + rng.uniform(0, 1.5)
    return rng.gauss(0, 1e-7), spread, -spread


def _validation(step: int, rng: random.Random) -> tuple[dict[str, Any], dict[str, Any]]:
    """``validate()``'s two dicts: the metrics (python floats) and its timer's (np.float64)."""
    accuracy = float(np.float32(min(1.0, 0.3 + 0.5 * (1 - math.exp(-step / 50)))))
    accuracy = float(np.float32(accuracy + rng.uniform(-0.02, 0.02)))
    val_metrics = {"accuracy": accuracy, "avg_length": 250.0 + rng.uniform(-20, 20)}
    timings = {"total_validation_time": np.float64(30.0 + rng.uniform(0, 6))}
    return val_metrics, timings


def _performance(
    timing: dict[str, Any],
    metrics: dict[str, Any],
    per_worker: dict[int, int],
    *,
    is_async: bool,
) -> dict[str, Any]:
    """The ``performance`` dict; throughputs inherit np.float64 from the timer values."""
    out: dict[str, Any] = {}
    counts = [v for _, v in sorted(per_worker.items())]
    top = max(counts)
    out["average_token_imbalance"] = 1 - sum(v / top for v in counts) / len(counts)
    logprobs = timing.get("policy_and_reference_logprobs", 0)
    training = timing.get("policy_training", 0)
    total = timing["total_step_time"]
    if is_async:
        exposed = timing["exposed_generation"]
        generation = exposed + logprobs + training
        refit = timing["weight_sync"]
        out["training_worker_idle_time_ratio"] = (
            0 if exposed > 0.1 else exposed / (training + logprobs + exposed + refit)
        )
        total_gpus, train_gpus, gen_gpus = (
            ASYNC_TRAIN_GPUS + ASYNC_GEN_GPUS,
            ASYNC_TRAIN_GPUS,
            ASYNC_GEN_GPUS,
        )
    else:
        generation = timing["generation"]
        total_gpus = train_gpus = gen_gpus = SYNC_GPUS
    tokens = metrics["total_num_tokens"]
    samples_gpu = SAMPLES_PER_STEP / total / total_gpus
    tokens_gpu = tokens / total / total_gpus
    group = training + logprobs
    train_tok_gpu = tokens / group / train_gpus
    gen_tok_gpu = tokens / generation / gen_gpus
    out.update(
        {
            "samples_per_sec": samples_gpu * total_gpus,
            "tokens_per_sec": tokens_gpu * total_gpus,
            "samples_per_sec_per_gpu": samples_gpu,
            "tokens_per_sec_per_gpu": tokens_gpu,
            "policy_training_tokens_per_sec_per_gpu": tokens / training / train_gpus,
            "policy_and_reference_logprobs_tokens_per_sec_per_gpu": tokens / logprobs / train_gpus,
            "training_worker_group_tokens_per_sec_per_gpu": train_tok_gpu,
            "generation_tokens_per_sec_per_gpu": gen_tok_gpu,
            "training_worker_group_tokens_per_sec": train_tok_gpu * train_gpus,
            "generation_tokens_per_sec": gen_tok_gpu * gen_gpus,
        }
    )
    return out


def _logprob_and_training_timers(rng: random.Random) -> list[tuple[str, float]]:
    """Policy-side labels in the order their timers stop (nested ones first)."""
    logprobs = 2.5 + rng.uniform(0, 0.5)
    training = 6.0 + rng.uniform(0, 0.8)
    return [
        ("logprob_inference_prep", 0.2 + rng.uniform(0, 0.05)),
        ("get_logprobs/shard_data", 0.05 + rng.uniform(0, 0.01)),
        ("get_logprobs/submit_logprob_futures", 0.01),
        ("get_reference_policy_logprobs/shard_data", 0.05 + rng.uniform(0, 0.01)),
        ("get_reference_policy_logprobs/submit_reference_policy_logprob_futures", 0.01),
        ("policy_and_reference_logprobs", logprobs),
        ("advantage_calculation", 0.09 + rng.uniform(0, 0.02)),
        ("training_prep", 0.6 + rng.uniform(0, 0.1)),
        ("policy_training/sharding_data", 0.06 + rng.uniform(0, 0.01)),
        ("policy_training/submit_training_futures", 0.01),
        ("policy_training", training),
    ]


def _timing(stops: list[tuple[str, float]], total: float, valid_toks: float, gpus: int) -> Any:
    """Timer dict: labels in first-stop order, summed, np.float64; total last, then tok/s."""
    timing: dict[str, Any] = {}
    for label, seconds in stops:
        timing[label] = timing.get(label, np.float64(0.0)) + np.float64(round(seconds, 4))
    timing["total_step_time"] = np.float64(round(total, 4))
    timing["valid_tokens_per_sec_per_gpu"] = valid_toks / timing["total_step_time"] / gpus
    return timing


_SYNC_TOP_LEVEL = frozenset(
    {
        "data_processing",
        "prepare_for_generation/total",
        "generation",
        "reward_calculation",
        "logprob_inference_prep",
        "policy_and_reference_logprobs",
        "advantage_calculation",
        "training_prep",
        "policy_training",
    }
)
_ASYNC_TOP_LEVEL = _SYNC_TOP_LEVEL - {"prepare_for_generation/total", "generation"}


def _sync_step(step: int, rng: random.Random, validate: bool, after_validation: bool) -> list[Call]:
    batch = _batch(step, rng)
    calls: list[Call] = []
    rollout = _rollout_metrics(batch, range(GENERATION_WORKERS))
    calls.append(Call(rollout, "train", step))

    val_seconds = 0.0
    if validate:
        val_metrics, val_timings = _validation(step, rng)
        val_seconds = float(val_timings["total_validation_time"]) + 2.0
        calls.append(Call(val_timings, "timing/validation", step))
        calls.append(Call(val_metrics, "validation", step))

    n = batch.size
    groups = [batch.group(g).rewards for g in range(PROMPTS_PER_STEP)]
    baseline_pct_0 = 100 * sum(not any(g) for g in groups) / PROMPTS_PER_STEP
    baseline_pct_1 = 100 * sum(all(g) for g in groups) / PROMPTS_PER_STEP
    adv_mean, adv_max, adv_min = _advantage_stats(batch, rng)
    metrics: dict[str, Any] = {"num_mask_sample_filtered": 0}
    metrics["baseline_reward/pct_0"] = baseline_pct_0
    metrics["baseline_reward/pct_1"] = baseline_pct_1
    metrics["baseline_reward/pct_mixed"] = 100 - baseline_pct_0 - baseline_pct_1
    metrics["advantages/sum"] = rng.gauss(0, 2e-5)
    metrics["advantages/mean"] = adv_mean
    scalars = _train_scalars(step, batch, rng)
    metrics = {
        **metrics,
        "loss": scalars["loss"],
        "grad_norm": 0.25 + abs(rng.gauss(0, 0.05)),
        "reward": sum(batch.rewards) / n,
        "mean_prompt_length": sum(batch.prompt_lengths) / n,
        "total_num_tokens": sum(batch.total_lengths),
        "advantages/mean": adv_mean,
        "advantages/max": adv_max,
        "advantages/min": adv_min,
    }
    metrics.update(scalars)
    metrics.update(_vllm_deltas(batch, rng))  # gen_step_metrics (3540)
    metrics.update(rollout)
    metrics["generation_logger_metrics"] = _generation_logger_metrics(batch, rng)
    metrics.update(_seq_logprob_error_metrics(rng))

    generation = sum(batch.gen_lengths) / (11_000 + rng.uniform(0, 1000))
    stops: list[tuple[str, float]] = [("data_processing", 0.35 + rng.uniform(0, 0.1))]
    prepare = 0.3 + rng.uniform(0, 0.2)
    if not after_validation:  # the engine is stale after training: refit, timed
        transfer = 1.2 + rng.uniform(0, 0.3)
        stops.append(("prepare_for_generation/transfer_and_update_weights", transfer))
        prepare += transfer
    stops += [
        ("prepare_for_generation/total", prepare),
        ("generation", generation),
        ("reward_calculation", 0.5 + rng.uniform(0, 0.2)),
        ("data_processing", 0.05),
        *_logprob_and_training_timers(rng),
    ]
    top_level = sum(v for k, v in stops if k in _SYNC_TOP_LEVEL)
    total = top_level + 0.3 + val_seconds + rng.uniform(0, 0.1)
    timing = _timing(stops, total, metrics["global_valid_toks"], SYNC_GPUS)
    performance = _performance(timing, metrics, metrics["per_worker_token_counts"], is_async=False)
    del metrics["per_worker_token_counts"]  # print_performance_metrics drops it

    calls.append(Call(metrics, "train", step))
    calls.append(Call(performance, "performance", step))
    calls.append(Call(timing, "timing/train", step, step_finished=True))
    return calls


def _cumulative(step: int, rate: float, wobble: float) -> np.float64:
    """A collector-side category: run-cumulative (never reset), so it only grows."""
    return np.float64(round(rate * step + wobble * math.sqrt(step), 3))


def _efficiency(
    step: int, timing: dict[str, Any], rng: random.Random, validated: bool
) -> dict[str, Any]:
    """The async efficiency dict (prefix ``""``), in print_efficiency_summary's order."""
    wall = INIT_TOTAL_S + 5.0 + 25.5 * step + rng.uniform(0, 1)
    durations: dict[str, Any] = {
        "init/total": INIT_TOTAL_S,
        "idle/buffer_starvation": timing.get("idle/buffer_starvation", 0.0),
        "idle/refit_bubble": timing["idle/refit_bubble"],
        "idle/validation": timing["idle/validation"] if validated else 0.0,
        "idle/buffer_full_backoff": _cumulative(step, 30.0, 4.0),
        "idle/generation_limit_pause": _cumulative(step, 3.5, 1.0),
        "idle/refit_event_wait": _cumulative(step, 1.6, 0.5),
        "wasted/failed_trajectory": 0.0,
    }
    out: dict[str, Any] = {}
    for cat in ("init/total", "idle/buffer_starvation", "idle/refit_bubble", "idle/validation"):
        out[f"efficiency/{cat}_s"] = durations[cat]
        out[f"efficiency/{cat}_pct"] = durations[cat] / wall * 100
    threads = 0.0
    for cat in (
        "idle/buffer_full_backoff",
        "idle/generation_limit_pause",
        "idle/refit_event_wait",
        "wasted/failed_trajectory",
    ):
        threads += durations[cat]
        out[f"efficiency/{cat}_s"] = durations[cat]
    step_wall = timing["total_step_time"]
    waste = sum(
        durations[c] for c in ("idle/buffer_starvation", "idle/refit_bubble", "idle/validation")
    )
    waste = min(waste, step_wall)
    productive = max(0.0, step_wall - waste)
    out["efficiency/thread_seconds_total_s"] = threads
    out["efficiency/total_waste_s"] = waste
    out["efficiency/productive_time_s"] = productive
    out["efficiency/efficiency_pct"] = min(100.0, max(0.0, productive / step_wall * 100))
    out["efficiency/total_wall_time_s"] = wall
    out["efficiency/efficiency_pct_is_per_step"] = 1.0
    return out


def _async_step(step: int, rng: random.Random, validate: bool, first_step: bool) -> list[Call]:
    batch = _batch(step, rng)
    calls: list[Call] = []
    groups = []
    for g in range(PROMPTS_PER_STEP):
        group = _rollout_metrics(batch.group(g), [g % GENERATION_WORKERS])
        group["trajectory_duration_s"] = 8.0 + rng.uniform(0, 12)
        groups.append(group)
    rollout = _aggregate_groups(groups)

    n = batch.size
    adv_mean, adv_max, adv_min = _advantage_stats(batch, rng)
    scalars = _train_scalars(step, batch, rng)
    metrics: dict[str, Any] = {
        "loss": scalars["loss"],
        "reward": sum(batch.rewards) / n,
        "num_mask_sample_filtered": 0,
        "grad_norm": 0.25 + abs(rng.gauss(0, 0.05)),
        "mean_prompt_length": sum(batch.prompt_lengths) / n,
        "total_num_tokens": sum(batch.total_lengths),
        "advantages/mean": adv_mean,
        "advantages/max": adv_max,
        "advantages/min": adv_min,
    }
    metrics.update(scalars)
    metrics.update(rollout)
    metrics["generation_logger_metrics"] = _generation_logger_metrics(batch, rng)
    metrics.update(_seq_logprob_error_metrics(rng))
    metrics.update(_vllm_deltas(batch, rng))  # get_step_metrics (5328)

    sample_wait = 0.3 + rng.uniform(0, 2.5)
    refit_wait = 0.2 + rng.uniform(0, 1.0)
    weight_sync = 1.3 + rng.uniform(0, 0.4)
    bubble = refit_wait + weight_sync + 0.05
    overlong, mask_filter = 0.0004, 0.001 + rng.uniform(0, 0.001)
    stops: list[tuple[str, float]] = [("init/total", INIT_TOTAL_S)] if first_step else []
    stops += [
        ("exposed_generation", sample_wait),
        ("reward_calculation", 0.08 + rng.uniform(0, 0.05)),
        ("overlong_filter", overlong),
        ("mask_sample_filter", mask_filter),
        ("data_processing", overlong + mask_filter + 0.35 + rng.uniform(0, 0.1)),
        *_logprob_and_training_timers(rng),
        ("exposed_generation", refit_wait),
        ("weight_sync", weight_sync),
        ("idle/refit_bubble", bubble),  # holds the two above
    ]
    val_calls: list[Call] = []
    if validate:
        val_metrics, val_timings = _validation(step, rng)
        stops.append(("idle/validation", float(val_timings["total_validation_time"]) + 1.5))
        val_calls = [
            Call(val_timings, "timing/validation", step),
            Call(val_metrics, "validation", step),
        ]
    val_window = stops[-1][1] if validate else 0.0
    # The replay-buffer wait is top-level; the second exposed_generation is in the bubble.
    top_level = sample_wait + sum(v for k, v in stops if k in _ASYNC_TOP_LEVEL)
    top_level += bubble + val_window
    total = top_level + 0.3 + rng.uniform(0, 0.1)
    timing = _timing(stops, total, metrics["global_valid_toks"], ASYNC_TRAIN_GPUS)

    calls.extend(val_calls)
    metrics["buffer_size"] = PROMPTS_PER_STEP + rng.randint(0, PROMPTS_PER_STEP)
    metrics["avg_trajectory_age"] = step - (step - rng.choice((0.5, 0.75, 1.0)))  # float
    performance = _performance(
        timing, metrics, _merge_worker_counts(metrics["per_worker_token_counts"]), is_async=True
    )
    del metrics["per_worker_token_counts"]  # print_performance_metrics drops it
    efficiency = _efficiency(step, timing, rng, validate)

    calls.append(Call(performance, "performance", step))
    calls.append(Call(metrics, "train", step))
    calls.append(Call(efficiency, "", step))
    calls.append(Call(timing, "timing/train", step, step_finished=True))
    return calls


def _merge_worker_counts(per_group: Sequence[dict[int, int]]) -> dict[int, int]:
    merged: dict[int, int] = {}
    for counts in per_group:
        for worker, tokens in counts.items():
            merged[worker] = merged.get(worker, 0) + tokens
    return merged


def step_calls(
    shape: str,
    step: int,
    *,
    validate: bool = False,
    rng: random.Random | None = None,
    after_validation: bool = False,
    first_step: bool | None = None,
) -> list[Call]:
    """Every log_metrics call of one training step, in the order the loop makes them.

    Step numbers are 1-based, as grpo.py logs ``step + 1``. Validation dicts are included
    when ``validate`` is True, at the point in the step the real loop logs them.

    Args:
        shape: ``"sync"`` (``grpo_train``) or ``"async"`` (``async_grpo_train``).
        step: The 1-based step the calls carry.
        validate: Whether this is a validation step.
        rng: Source of the values; default a ``random.Random`` seeded by shape and step, so
            the same step always replays the same values and different steps differ.
        after_validation: Sync only: the previous step (or the initial validation) refitted
            the engine for validation, so this step does no timed refit and its
            ``timing/train`` lacks ``prepare_for_generation/transfer_and_update_weights``.
        first_step: Async only: the first step after the loop starts, whose
            ``timing/train`` still holds ``init/total``; default ``step == 1``.
    """
    r = _rng_for(shape, step, rng)
    if shape == "sync":
        return _sync_step(step, r, validate, after_validation)
    return _async_step(step, r, validate, step == 1 if first_step is None else first_step)


def setup_calls(
    shape: str = "sync", *, val_at_start: bool = True, rng: random.Random | None = None
) -> list[Call]:
    """What is logged once before the loop: ``timing/setup``, then the initial validation.

    Both loops log the same here (both at step 0): ``setup()``'s ``timing/setup`` and, with
    ``grpo.val_at_start``, ``validation`` then ``timing/validation``.
    """
    r = _rng_for(shape, 0, rng)
    vllm = 70.0 + r.uniform(0, 4)
    policy = 92.0 + r.uniform(0, 4)
    collective = 6.0 + r.uniform(0, 1)
    parallel = max(vllm, policy) + 0.8
    total = parallel + collective + 40.0 + r.uniform(0, 2)
    setup = {
        "vllm_init_time_s": vllm,
        "policy_init_time_s": policy,
        "collective_init_time_s": collective,
        "parallel_wall_time_s": parallel,
        "parallel_init_enabled": 1.0,
        "total_setup_time_s": total,
        "other_setup_time_s": total - parallel - collective,
    }
    calls = [Call(setup, "timing/setup", 0)]
    if val_at_start:
        val_metrics, val_timings = _validation(0, r)
        calls.append(Call(val_metrics, "validation", 0))
        calls.append(Call(val_timings, "timing/validation", 0))
    return calls


def replay(
    shape: str,
    steps: int,
    *,
    val_period: int = 0,
    val_at_start: bool = False,
    seed: int | None = None,
) -> list[Call]:
    """A whole run's calls: setup, then ``steps`` steps, validating every ``val_period``.

    With ``seed`` None each step uses its default per-step rng; otherwise one
    ``random.Random(seed)`` feeds the whole run.
    """
    rng = None if seed is None else random.Random(seed)
    calls = setup_calls(shape, val_at_start=val_at_start, rng=rng)
    validated = val_at_start
    for step in range(1, steps + 1):
        validate = val_period > 0 and step % val_period == 0
        calls += step_calls(shape, step, validate=validate, rng=rng, after_validation=validated)
        validated = validate
    return calls


def values_by_prefix_key(calls: Iterable[Call]) -> dict[tuple[str, str], list[tuple[int, Any]]]:
    """``(prefix, key) -> [(step, value), ...]`` over ``calls``, in call order."""
    out: dict[tuple[str, str], list[tuple[int, Any]]] = {}
    for call in calls:
        for key, value in call.metrics.items():
            out.setdefault((call.prefix, key), []).append((call.step, value))
    return out


def keys_by_prefix(calls: Iterable[Call]) -> dict[str, list[str]]:
    """Each prefix's keys over ``calls``, first-seen order, without repeats."""
    out: dict[str, list[str]] = {}
    for call in calls:
        seen = out.setdefault(call.prefix, [])
        seen.extend(k for k in call.metrics if k not in seen)
    return out


def _type_name(value: Any) -> str:
    if isinstance(value, list):
        inner = {_type_name(v) for v in value[:3]}
        return f"list[{'|'.join(sorted(inner))}]"
    if isinstance(value, dict):
        return "dict"
    return (
        type(value).__name__
        if type(value).__module__ == "builtins"
        else (f"{type(value).__module__}.{type(value).__name__}")
    )


def main() -> None:
    """Print per shape one step's calls (prefix, key count, step_finished)."""
    verbose = "-v" in sys.argv
    for shape in SHAPES:
        print(f"== {shape}: setup")
        for call in setup_calls(shape):
            print(f"   {call.prefix!r:22} step={call.step} keys={len(call.metrics)}")
        for validate in (False, True):
            print(f"== {shape}: step 2, validate={validate}")
            for call in step_calls(shape, 2, validate=validate):
                print(
                    f"   {call.prefix!r:22} step={call.step} keys={len(call.metrics):3} "
                    f"step_finished={call.step_finished}"
                )
                if verbose:
                    for key, value in call.metrics.items():
                        print(f"       {key} : {_type_name(value)}")


if __name__ == "__main__":
    main()

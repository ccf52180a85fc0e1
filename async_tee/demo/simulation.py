"""Owns the demo's simulated GRPO run: the values each of its ``log_metrics`` calls carries."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

__all__ = ["GrpoSimulation"]

_GPU_NODES, _GPUS_PER_NODE = 4, 8
_SAMPLES_PER_STEP = 512


class GrpoSimulation:
    """Values that evolve like a GRPO run: reward rising noisily, loss falling, lr schedule.

    Each method draws the next values of one dict a real run logs, from one seeded random
    source: the same seed and the same order of calls give the same values.

    Attributes:
        steps: Steps the run lasts (the schedules and trends are spread over them).
        rng: The seeded source of every random draw.
        cumulative: Running totals of the efficiency dict's cumulative keys.
        counter_sums: Per vLLM counter key, the sum of the deltas :meth:`rollout` returned.
    """

    def __init__(self, steps: int, seed: int) -> None:
        self.steps = steps
        self.rng = random.Random(seed)
        self.cumulative: dict[str, float] = {}
        self.counter_sums: dict[str, float] = {}

    def _noise(self, scale: float) -> float:
        return self.rng.gauss(0.0, scale)

    def _grow(self, key: str, amount: float) -> float:
        self.cumulative[key] = self.cumulative.get(key, 0.0) + amount
        return round(self.cumulative[key], 3)

    def setup(self) -> dict[str, Any]:
        """The ``timing/setup`` dict logged once before the first step."""
        vllm, policy = 70 + self.rng.uniform(0, 5), 92 + self.rng.uniform(0, 5)
        collective = 6 + self.rng.uniform(0, 1)
        total = max(vllm, policy) + collective + 40
        return {
            "vllm_init_time_s": round(vllm, 2),
            "policy_init_time_s": round(policy, 2),
            "collective_init_time_s": round(collective, 2),
            "parallel_wall_time_s": round(max(vllm, policy) + 0.8, 2),
            "parallel_init_enabled": 1.0,
            "total_setup_time_s": round(total, 2),
            "other_setup_time_s": round(total - max(vllm, policy) - collective, 2),
        }

    def learning_rate(self, step: int) -> float:
        """The learning rate at ``step``: linear warm-up, then cosine decay."""
        peak, warmup = 5e-6, max(1, self.steps // 10)
        if step < warmup:
            return peak * (step + 1) / warmup
        progress = (step - warmup) / max(1, self.steps - warmup)
        return 5e-7 + (peak - 5e-7) * 0.5 * (1 + math.cos(math.pi * progress))

    def rollout(self, step: int) -> dict[str, Any]:
        """The rollout half of ``step``'s ``train`` dict; adds its deltas to ``counter_sums``."""
        progress = (step + 1) / self.steps
        gen_mean = 240 + 40 * progress + self._noise(12)
        lengths = [max(8, int(self.rng.gauss(gen_mean, 80))) for _ in range(64)]
        prompt_mean = 96 + self._noise(4)
        failed = self.rng.choice((0, 0, 0, 1, 2))
        deltas = {
            "vllm/prompt_tokens": int(prompt_mean * _SAMPLES_PER_STEP),
            "vllm/generation_tokens": int(gen_mean * _SAMPLES_PER_STEP),
            "vllm/generations_ok": _SAMPLES_PER_STEP - failed,
            "vllm/generations_failed": failed,
        }
        for key, delta in deltas.items():
            self.counter_sums[key] = self.counter_sums.get(key, 0) + delta
        truncation = min(0.2, max(0.0, 0.04 + self._noise(0.01)))
        return {
            "total_turns": _SAMPLES_PER_STEP,
            "avg_turns_per_sample": 1.0,
            "natural_termination_rate": round(1 - truncation, 4),
            "truncation_rate": round(truncation, 4),
            "mean_total_tokens_per_sample": round(gen_mean + prompt_mean, 2),
            "mean_gen_tokens_per_sample": round(gen_mean, 2),
            "max_gen_tokens_per_sample": max(lengths),
            "histogram/gen_tokens_length": lengths,
            **deltas,
            "vllm/prompt_length_mean": round(prompt_mean, 2),
            "vllm/generation_length_mean": round(gen_mean, 2),
        }

    def train(self, step: int, rollout: Mapping[str, Any]) -> dict[str, Any]:
        """``step``'s full ``train`` dict: ``rollout`` plus the optimisation values."""
        progress = (step + 1) / self.steps
        reward = min(1.0, max(0.0, 0.2 + 0.6 * (1 - math.exp(-3 * progress)) + self._noise(0.03)))
        # A group whose samples all got one reward has no spread: its std is NaN, as in
        # real runs. It is not a teed key, so only the JSONL backend shows it (as null).
        advantage_std = math.nan if step % 7 == 3 else round(0.9 + self._noise(0.05), 4)
        return {
            **rollout,
            "loss": round(0.08 * math.exp(-2 * progress) + self._noise(0.004), 5),
            "reward": round(reward, 4),
            "kl_penalty": round(0.0005 + 0.004 * progress + abs(self._noise(0.0002)), 6),
            "critic/loss": round(0.25 * math.exp(-progress) + abs(self._noise(0.01)), 5),
            "approx_entropy": round(0.55 - 0.2 * progress + self._noise(0.01), 4),
            "grad_norm": round(abs(0.3 + self._noise(0.05)), 4),
            "lr": self.learning_rate(step),
            "advantages/mean": 0.0,
            "advantages/std": advantage_std,
            "probs_ratio": round(1 + self._noise(0.0005), 5),
            "num_valid_samples": float(_SAMPLES_PER_STEP),
            "generation_logger_metrics": {
                "kv_cache_usage_perc": {"0": [0.0, 0.41, 0.57, 0.31], "1": [0.0, 0.4, 0.56, 0.29]}
            },
        }

    def performance(self, step_seconds: float, rollout: Mapping[str, Any]) -> dict[str, Any]:
        """The ``performance`` dict: throughput of the step that produced ``rollout``."""
        tokens = rollout["vllm/prompt_tokens"] + rollout["vllm/generation_tokens"]
        seconds = 24.0 + self._noise(1.0)
        return {
            "samples_per_sec": round(_SAMPLES_PER_STEP / seconds, 3),
            "tokens_per_sec": round(tokens / seconds, 1),
            "samples_per_sec_per_gpu": round(_SAMPLES_PER_STEP / seconds / 8, 3),
            "tokens_per_sec_per_gpu": round(tokens / seconds / 8, 1),
            "generation_tokens_per_sec": round(rollout["vllm/generation_tokens"] / 11.6, 1),
            "simulated_step_seconds": step_seconds,
        }

    def efficiency(self, step: int, setup_total: float) -> dict[str, Any]:
        """The efficiency dict (logged without a prefix) for ``step``."""
        starvation = abs(self._noise(0.4))
        refit = 3.5 + abs(self._noise(0.5))
        validation = 6.0 if step % 5 == 4 else 0.0
        wall = 24.0 + abs(self._noise(1.0)) + validation
        failed = self._grow("failed", self.rng.choice((0.0, 0.0, 1.7)))
        backoff = self._grow("backoff", 40 + abs(self._noise(8)))
        waste = starvation + refit + validation
        productive = wall - waste
        return {
            "efficiency/init/total_s": setup_total,
            "efficiency/idle/buffer_starvation_s": round(starvation, 3),
            "efficiency/idle/refit_bubble_s": round(refit, 3),
            "efficiency/idle/validation_s": validation,
            "efficiency/idle/buffer_full_backoff_s": backoff,
            "efficiency/wasted/failed_trajectory_s": failed,
            "efficiency/idle/generation_limit_pause_s": self._grow("pause", 4 + self._noise(1)),
            "efficiency/idle/refit_event_wait_s": self._grow("refit_wait", 2 + self._noise(0.5)),
            "efficiency/idle/refit_bubble_pct": round(100 * refit / wall, 3),
            "efficiency/thread_seconds_total_s": round(backoff + failed, 3),
            "efficiency/total_waste_s": round(waste, 3),
            "efficiency/productive_time_s": round(productive, 3),
            "efficiency/total_wall_time_s": round(wall, 3),
            "efficiency/efficiency_pct": round(100 * productive / wall, 2),
            "efficiency/efficiency_pct_is_per_step": 1.0,
        }

    def timing(self) -> dict[str, Any]:
        """The ``timing/train`` dict that finishes a step."""
        generation = 11.6 + self._noise(0.8)
        training = 6.3 + self._noise(0.3)
        logprobs = 2.7 + self._noise(0.2)
        return {
            "total_step_time": round(generation + training + logprobs + 3.9, 3),
            "data_processing": 0.41,
            "prepare_for_generation/total": 1.92,
            "generation": round(generation, 3),
            "reward_calculation": 0.58,
            "policy_and_reference_logprobs": round(logprobs, 3),
            "advantage_calculation": 0.09,
            "policy_training": round(training, 3),
        }

    def gpus(self) -> dict[str, Any]:
        """One ``ray`` dict from the GPU monitor: utilisation and memory per GPU and node."""
        out: dict[str, Any] = {}
        for node in range(_GPU_NODES):
            for gpu in range(_GPUS_PER_NODE):
                out[f"node.{node}.gpu.{gpu}.util"] = round(min(100.0, 90 + self._noise(4)), 1)
                out[f"node.{node}.gpu.{gpu}.mem_gb"] = round(71 + self._noise(0.5), 2)
            out[f"node.{node}.mem_gb"] = round(412 + self._noise(3), 1)
        return out

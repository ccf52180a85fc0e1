"""verl's logging, as its trainer does it: what one PPO/GRPO step logs, and its real ``Tracking``.

``VERL_STEP_METRICS`` is one training step's dict as verl 0.9.1's default trainer builds it
(``trainer.use_v1=true``: ``verl/trainer/ppo/v1/trainer_base.py``, ``PPOTrainer.fit`` then
``logger.log(data=metrics, step=self.global_steps)``), for GRPO (``algorithm.adv_estimator=grpo``,
``actor.use_kl_loss=true``, no critic, a reference policy, ``trainer.balance_batch`` on), with
the value types its code gives them:

- ``step()``'s metrics pass verl's ``MetricsAggregator`` (``v1/utils.py``), which makes each a
  Python float: ``global_seqlen/*`` (``_balance_batch``), ``actor/entropy``, and the actor's
  update, renamed under ``actor/`` (``rename_dict``): ``pg_loss``, ``pg_clipfrac``, ``ppo_kl``,
  ``pg_clipfrac_lower`` (``core_algos``), ``kl_loss``, ``kl_coef`` (``workers/utils/losses.py``),
  ``loss``, ``grad_norm``, ``lr`` and ``perf/*_memory_*`` (``workers/engine_workers.py``; so
  ``actor/perf/...``), its ``mfu`` moved to ``perf/mfu/actor``;
- ``_compute_metrics`` adds ints ``training/global_step`` and ``training/epoch``, floats from
  ``compute_data_metrics`` (``critic/score|rewards|advantages|returns/*``, ``response_length*/*``,
  ``prompt_length/*``), ``compute_timing_metrics`` (``timing_s/<stage>``,
  ``timing_per_token_ms/<stage>``) and ``compute_throughout_metrics`` (``perf/total_num_tokens``
  an int, ``perf/time_per_step``, ``perf/throughput``) (``trainer/ppo/metric_utils.py``), and
  numpy scalars: ``num_turns/*`` (np.int32 min/max, np.float64 mean), ``training/num_turns/*``
  and ``training/off_policy/*`` (np.int64 min/max, np.float64 mean).

``VERL_VAL_METRICS`` is what ``fit`` logs at step 0 (``trainer.val_before_train``, the default):
``val-core|val-aux/<data source>/<variable>/<stat>@<n>`` (``_val_metrics_update``).
The legacy trainer (``trainer/ppo/ray_trainer.py``, ``use_v1=false``) logs the same families
from the same functions, unaggregated (its actor metrics come from ``reduce_metrics`` as numpy
floats), without ``training/num_turns/*`` and ``training/off_policy/*``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from trainers.required import require

VERL_STEP_METRICS: dict[str, Any] = {
    # step(): aggregated, Python floats
    "global_seqlen/min": 14210.0,
    "global_seqlen/max": 15872.0,
    "global_seqlen/minmax_diff": 1662.0,
    "global_seqlen/balanced_min": 15011.0,
    "global_seqlen/balanced_max": 15043.0,
    "global_seqlen/mean": 15027.0,
    "actor/entropy": 0.6123,
    "actor/pg_loss": -0.0042,
    "actor/pg_clipfrac": 0.0017,
    "actor/ppo_kl": 0.0003,
    "actor/pg_clipfrac_lower": 0.0,
    "actor/kl_loss": 0.0011,
    "actor/kl_coef": 0.001,
    "actor/loss": -0.0041,
    "actor/grad_norm": 0.1834,
    "actor/lr": 1e-06,
    "actor/perf/max_memory_allocated_gb": 41.27,
    "actor/perf/max_memory_reserved_gb": 52.75,
    "actor/perf/cpu_memory_used_gb": 118.4,
    "perf/mfu/actor": 0.312,
    # _compute_metrics
    "training/global_step": 1,
    "training/epoch": 0,
    "critic/score/mean": 0.4375,
    "critic/score/max": 1.0,
    "critic/score/min": 0.0,
    "critic/rewards/mean": 0.4375,
    "critic/rewards/max": 1.0,
    "critic/rewards/min": 0.0,
    "critic/advantages/mean": -0.0123,
    "critic/advantages/max": 1.7889,
    "critic/advantages/min": -1.7889,
    "critic/returns/mean": -0.0123,
    "critic/returns/max": 1.7889,
    "critic/returns/min": -1.7889,
    "response_length/mean": 231.6,
    "response_length/max": 1024.0,
    "response_length/min": 87.0,
    "response_length/clip_ratio": 0.0156,
    "response_length_non_aborted/mean": 231.6,
    "response_length_non_aborted/max": 1024.0,
    "response_length_non_aborted/min": 87.0,
    "response_length_non_aborted/clip_ratio": 0.0156,
    "response/aborted_ratio": 0.0,
    "prompt_length/mean": 104.3,
    "prompt_length/max": 201.0,
    "prompt_length/min": 61.0,
    "prompt_length/clip_ratio": 0.0,
    "num_turns/min": np.int32(2),
    "num_turns/max": np.int32(2),
    "num_turns/mean": np.float64(2.0),
    "timing_s/gen": 38.91,
    "timing_s/old_log_prob": 6.02,
    "timing_s/ref": 5.77,
    "timing_s/adv": 0.08,
    "timing_s/update_actor": 17.43,
    "timing_s/update_weights": 2.91,
    "timing_s/step": 71.35,
    "timing_per_token_ms/gen": 0.0328,
    "timing_per_token_ms/ref": 0.0048,
    "timing_per_token_ms/adv": 0.0001,
    "timing_per_token_ms/update_actor": 0.0145,
    "perf/total_num_tokens": 120216,
    "perf/time_per_step": 71.35,
    "perf/throughput": 210.6,
    "training/num_turns/mean": np.float64(2.0),
    "training/num_turns/max": np.int64(2),
    "training/num_turns/min": np.int64(2),
    "training/off_policy/trajectory_spans/mean": np.float64(1.0),
    "training/off_policy/trajectory_spans/max": np.int64(1),
    "training/off_policy/trajectory_spans/min": np.int64(1),
    "training/off_policy/trajectory_staleness/mean": np.float64(0.0),
    "training/off_policy/trajectory_staleness/max": np.int64(0),
    "training/off_policy/trajectory_staleness/min": np.int64(0),
    "training/off_policy/trajectory_staleness_worst/mean": np.float64(0.0),
    "training/off_policy/trajectory_staleness_worst/max": np.int64(0),
    "training/off_policy/trajectory_staleness_worst/min": np.int64(0),
}

VERL_VAL_METRICS: dict[str, Any] = {
    "val-core/openai/gsm8k/reward/mean@1": np.float64(0.3125),
    "val-aux/num_turns/min": np.int64(2),
    "val-aux/num_turns/max": np.int64(2),
    "val-aux/num_turns/mean": np.float64(2.0),
}


def verl_fit_logs(steps: int = 3) -> list[tuple[int, dict[str, Any]]]:
    """What ``fit`` logs over ``steps`` steps: validation at step 0, then steps 1 to ``steps``."""
    logs = [(0, dict(VERL_VAL_METRICS))]
    for step in range(1, steps + 1):
        logs.append((step, {**VERL_STEP_METRICS, "training/global_step": step}))
    return logs


class RecordingBackend:
    """A verl backend: what ``Tracking.log`` calls it with, and whether it was finished."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, dict[str, Any]]] = []
        self.finished = False

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.steps.append((step, dict(data)))

    def finish(self) -> None:
        self.finished = True


def run_verl_tracking(
    data_per_step: Iterable[tuple[int, Mapping[str, Any]]],
    backends: Mapping[str, Any] | None = None,
) -> RecordingBackend:
    """verl's real ``Tracking`` (the console backend) logging each ``(step, data)``, then finished.

    A ``RecordingBackend`` and ``backends`` are put into its instance's ``logger`` dict by name,
    the one place a backend outside its closed list is called from (``Tracking.log`` calls
    ``.log(data=..., step=...)`` on each; ``Tracking.finish`` finishes only the names it knows).
    """
    tracking_module = require("verl.utils.tracking")
    tracking = tracking_module.Tracking(
        project_name="async_tee", experiment_name="toy", default_backend=["console"]
    )
    recorder = RecordingBackend()
    tracking.logger["recording"] = recorder
    tracking.logger.update(backends or {})
    for step, data in data_per_step:
        tracking.log(data=dict(data), step=step)
    tracking.finish()
    return recorder

"""Hugging Face ``Trainer`` (and TRL's trainers on it): a ``TrainerCallback`` (§13).

::

    from async_tee.integrations.transformers import AsyncTeeCallback

    trainer = GRPOTrainer(..., callbacks=[AsyncTeeCallback()])

Each ``Trainer.log`` dict is teed under the prefix ``transformers`` at ``state.global_step``,
on every process (each its own rank: ``args.process_index`` of ``args.world_size``); the
step is finished when the next one begins or the train ends, so the evaluation a step logs
after its training values belongs to it. ``report_to`` is a closed list: this rides in
``callbacks``.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from async_tee._declare.trainers import TRANSFORMERS
from async_tee._handoff.caller import tee_rl_metrics_to_otel
from async_tee._reporting import warn_once
from async_tee.integrations._start import deliver, start_for

__all__ = ["AsyncTeeCallback"]

PREFIX = TRANSFORMERS.prefix


class AsyncTeeCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]
    """Tees every dict the ``Trainer`` logs; starts telemetry if nothing started it.

    Costs the training loop one tee call a log (a snapshot onto a queue) and, at a step's
    start after a logged one, an end-of-step marker. Never raises into training.
    """

    def __init__(self, flush_timeout_s: float = 10.0) -> None:
        """``flush_timeout_s``: how long the train's end waits to deliver what was teed."""
        self.flush_timeout_s = flush_timeout_s
        self._open_step: int | None = None  # the step logged and not yet finished

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Start telemetry (unless it runs) as this process's rank of the job."""
        try:
            start_for(PREFIX, args.process_index, args.local_process_index, args.world_size)
        except Exception:  # noqa: BLE001 - an args object without the fields
            warn_once("integrations:transformers:start", "async_tee: reading the rank failed")
            start_for(PREFIX)

    def on_log(
        self,
        args: Any,
        state: Any,
        control: Any,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        """Tee the dict at the step it was logged in."""
        if logs:
            step = getattr(state, "global_step", None)  # never raise into the Trainer
            tee_rl_metrics_to_otel(logs, PREFIX, step)
            self._open_step = step

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The step logged before this one is finished: its export need not wait."""
        if self._open_step is not None:
            self._finish()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Finish the last step and deliver what was teed (bounded by ``flush_timeout_s``)."""
        self._finish()
        deliver(PREFIX, self.flush_timeout_s)

    def _finish(self) -> None:
        step, self._open_step = self._open_step, None
        if step is not None:
            tee_rl_metrics_to_otel({}, PREFIX, step, step_finished=True)

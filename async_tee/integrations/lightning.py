"""Lightning: a ``Logger`` (docs/semantics.md §13).

::

    from async_tee.integrations.lightning import AsyncTeeLogger

    trainer = lightning.Trainer(logger=[CSVLogger("logs"), AsyncTeeLogger()])

Each ``log_metrics`` dict is teed under the prefix ``lightning`` at its step, on every rank
(Lightning's ``global_rank``); a step is finished when a later step's dict arrives or at
``finalize``, which also waits until the worker recorded it. Hyperparameters are not step
metrics: ``log_hyperparams`` takes nothing.
"""

from __future__ import annotations

import multiprocessing
import os
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only

from async_tee._declare.trainers import LIGHTNING
from async_tee._handoff.caller import tee_rl_metrics_to_otel
from async_tee.integrations._start import deliver, start_for

__all__ = ["AsyncTeeLogger"]

PREFIX = LIGHTNING.prefix


def _world_size() -> int | None:
    """The process group's size once Lightning's strategy made it, else None."""
    try:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    except Exception:  # noqa: BLE001 - a build without distributed support
        return None


def _started_local_ranks() -> bool:
    """Whether this process is rank 0 of Lightning's own ``ddp`` launcher (no torchrun).

    That launcher runs the script as local rank 0 and starts local ranks 1.. as its
    children: it sets ``LOCAL_RANK`` in its own environment at run time, where every other
    launcher sets it before the process starts (``/proc/self/environ``, the environment the
    process started with, lacks it). Without ``/proc``: ``LOCAL_RANK=0`` with no ``RANK``.
    A rank ``ddp_spawn`` started (by ``multiprocessing``) sets it at run time too, but is
    its parent's.
    """
    if os.environ.get("LOCAL_RANK") != "0" or "RANK" in os.environ:
        return False
    if multiprocessing.parent_process() is not None:
        return False
    try:
        with open("/proc/self/environ", "rb") as started:
            return not any(v.startswith(b"LOCAL_RANK=") for v in started.read().split(b"\0"))
    except OSError:
        return True


class AsyncTeeLogger(Logger):  # type: ignore[misc,unused-ignore]
    """Tees every dict Lightning logs; starts telemetry if nothing started it."""

    def __init__(self, flush_timeout_s: float = 10.0) -> None:
        """``flush_timeout_s``: how long ``finalize`` waits to deliver what was teed."""
        super().__init__()
        self.flush_timeout_s = flush_timeout_s
        self._started = False
        self._last_step: int | None = None

    @property
    def name(self) -> str:
        """The logger's name, as Lightning shows it."""
        return "async_tee"

    @property
    def version(self) -> str:
        """One version: the run's identity is the resource's (``rl.run.id``)."""
        return "0"

    def log_hyperparams(
        self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any
    ) -> None:
        """Not step metrics: nothing is teed."""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Tee one dict at its step (starting telemetry at the first, as this rank)."""
        if not self._started:
            self._started = True
            world_size = _world_size()
            launcher = world_size is not None and world_size > 1 and _started_local_ranks()
            start_for(PREFIX, getattr(rank_zero_only, "rank", None), None, world_size, launcher)
        tee_rl_metrics_to_otel(metrics, PREFIX, step)
        self._last_step = step

    def finalize(self, status: str) -> None:
        """Finish the last step and deliver what was teed (bounded by ``flush_timeout_s``)."""
        if self._last_step is not None:
            tee_rl_metrics_to_otel({}, PREFIX, self._last_step, step_finished=True)
            self._last_step = None
        deliver(PREFIX, self.flush_timeout_s)

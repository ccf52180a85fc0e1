"""verl: a ``Tracking`` backend, and ``install()`` to add it (docs/semantics.md §13).

verl's ``Tracking`` builds its backends from a closed list (``trainer.logger``), so a
backend of another library gets in by being added to every ``Tracking`` made, in the process
that makes it: verl's trainer runs in its TaskRunner Ray actor, so ``install`` is Ray's setup
hook there::

    python -m verl.trainer.main_ppo ... \
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=async_tee.integrations.verl.install

(or ``async_tee.integrations.verl.install()`` in a process that makes its own ``Tracking``).

Each ``Tracking.log(data, step)`` (verl's ``fit()`` logs one dict a step) is
teed under the prefix ``verl`` as that step's last dict.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from async_tee._declare.trainers import VERL
from async_tee._handoff.caller import tee_rl_metrics_to_otel
from async_tee._reporting import warn_once
from async_tee.integrations._start import deliver, start_for

__all__ = ["BACKEND", "AsyncTeeBackend", "install"]

PREFIX = VERL.prefix
BACKEND = "async_tee"
"""The name the backend has in a ``Tracking``'s ``logger`` dict."""


class AsyncTeeBackend:
    """What ``Tracking`` asks of a backend: ``log(data, step)`` and ``finish()``."""

    def __init__(self, flush_timeout_s: float = 10.0) -> None:
        """Start telemetry unless it runs (verl logs from its driver: one process)."""
        self.flush_timeout_s = flush_timeout_s
        start_for(PREFIX)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """Tee one step's dict; it is the step's last."""
        tee_rl_metrics_to_otel(data, PREFIX, step, step_finished=True)

    def finish(self) -> None:
        """Deliver what was teed (bounded by ``flush_timeout_s``): a Ray actor is killed."""
        deliver(PREFIX, self.flush_timeout_s)


def install() -> bool:
    """Add an :class:`AsyncTeeBackend` to every verl ``Tracking`` made from now on.

    Idempotent. Returns False (said once) when verl's ``Tracking`` cannot be imported or
    has no ``logger`` dict to add to; never raises.
    """
    try:
        from verl.utils import tracking
    except Exception:  # noqa: BLE001 - verl missing or failing to import
        warn_once("integrations:verl:import", "async_tee: verl.utils.tracking cannot be imported")
        return False
    cls = tracking.Tracking
    made, finished = cls.__init__, cls.finish
    if getattr(made, "_async_tee", False):
        return True

    @functools.wraps(made)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        backends = getattr(self, "logger", None)
        if isinstance(backends, dict):
            backends.setdefault(BACKEND, AsyncTeeBackend())
        else:
            warn_once("integrations:verl:shape", "async_tee: verl's Tracking has no logger dict")

    @functools.wraps(finished)
    def finish(self: Any, *args: Any, **kwargs: Any) -> Any:
        # verl finishes the backends it knows by name only: this one too
        result = finished(self, *args, **kwargs)
        backend = (getattr(self, "logger", None) or {}).get(BACKEND)
        if isinstance(backend, AsyncTeeBackend):
            backend.finish()
        return result

    __init__._async_tee = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[method-assign,unused-ignore]
    cls.finish = finish  # type: ignore[method-assign,unused-ignore]
    return True

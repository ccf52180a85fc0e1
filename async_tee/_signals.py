"""Flush on termination signals, so a job stopped with SIGTERM still delivers its last step.

Python's default SIGTERM ends the process at once: ``atexit`` never runs, and whatever the
worker and the exporter held is lost. torchrun, Slurm and Kubernetes stop jobs with
SIGTERM. A session started on the main thread installs :class:`SignalFlush` for the
signals ``ASYNC_TEE_FLUSH_SIGNALS`` names (``TERM`` by default), see docs/semantics.md §7:

- a signal left at its default disposition: on delivery, shut the session down (drain,
  complete the open step, export) within ``ASYNC_TEE_SHUTDOWN_TIMEOUT``, then restore the
  default and raise the signal again, so the process still dies of it, only later;
- a signal with a Python handler the application installed before: ours runs first
  (drain and export now, the session goes on), then theirs, which decides what happens;
- an ignored signal, or a handler installed outside Python: left alone.

A handler installed after ours replaces it, as Python does (Ray's ``ray.init`` installs one
that ends the process with ``sys.exit``). :meth:`SignalFlush.check`, run by the worker at each
completed step, notices, warns once naming the new handler, and moves the session's end to
the front of the exit hooks: a handler that exits through ``sys.exit`` runs ``atexit``, and
the session then shuts down before the hooks registered since (Ray's stops its processes
first). ``shutdown_telemetry`` restores what the session changed, where it still holds.
Installing and restoring run on the main thread (Python runs signal handlers there), and
nothing here raises into the interrupted code.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from async_tee._reporting import logger, warn_once

Handler = Callable[[float], object]


class SignalFlush:
    """The signal handlers one session installed, and what each replaced."""

    def __init__(self, shutdown: Handler, flush: Handler, timeout_s: float) -> None:
        """Prepare; :meth:`install` installs.

        Args:
            shutdown: Ends the session within a timeout (``shutdown_telemetry``).
            flush: Drains and exports now, keeping the session (for a chained handler).
            timeout_s: The budget each of them gets.
        """
        self._shutdown = shutdown
        self._flush = flush
        self._timeout_s = timeout_s
        self.previous: dict[int, Any] = {}
        self._handling = False
        self._displaced: set[int] = set()  # signals whose handler is no longer ours, warned
        self._exit_hook = False  # whether _at_exit is registered with atexit

    def install(self, names: tuple[str, ...]) -> None:
        """Install the handler for each named signal it may take over. Never raises."""
        if threading.current_thread() is not threading.main_thread():
            if names:
                logger.debug("async_tee: not on the main thread: no signal handler installed")
            return
        for name in names:
            try:
                signum = signal.Signals[f"SIG{name}"]
                previous = signal.getsignal(signum)
                if previous is signal.SIG_IGN or previous is None:
                    continue  # ignored on purpose, or a handler from outside Python: theirs
                signal.signal(signum, self._handle)
                self.previous[signum] = previous
            except Exception:  # noqa: BLE001 - a signal this platform lacks must not stop start
                warn_once(
                    f"signal:{name}", "async_tee: cannot handle SIG%s; not flushing on it", name
                )

    def check(self) -> None:
        """Notice a handler installed over ours (the worker, at a completed step). Never raises.

        The first time a signal's handler is no longer ours, warn once naming it, and
        register the session's end with ``atexit`` (again, so it runs before every exit hook
        registered so far: ``atexit`` runs the last registered first).
        """
        try:
            for signum in list(self.previous):
                if signum in self._displaced:
                    continue
                current = signal.getsignal(signum)
                if current == self._handle:
                    continue
                self._displaced.add(signum)
                warn_once(
                    f"signal:displaced:{signum}",
                    "async_tee: %s's handler was replaced after start_telemetry by %s: async_tee "
                    "no longer flushes when it arrives, only at exit if that handler exits "
                    "through sys.exit (start telemetry after the library that installs it, "
                    "e.g. after ray.init(), to keep async_tee's first)",
                    signal.Signals(signum).name,
                    _name(current),
                    traceback=False,
                )
                if self._exit_hook:
                    atexit.unregister(self._at_exit)
                atexit.register(self._at_exit)
                self._exit_hook = True
        except Exception:  # noqa: BLE001 - a check must not stop the worker
            warn_once("signal:check", "async_tee: could not check the signal handlers")

    def _at_exit(self) -> None:
        self._exit_hook = False  # atexit is running it: nothing to unregister any more
        self._shutdown(self._timeout_s)

    def restore(self) -> None:
        """Put back what :meth:`install` replaced, where ours is still installed."""
        if self._exit_hook:
            self._exit_hook = False
            atexit.unregister(self._at_exit)
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may; the handlers then pass straight through
        for signum, previous in list(self.previous.items()):
            try:
                if signal.getsignal(signum) == self._handle:
                    signal.signal(signum, previous)
            except Exception:  # noqa: BLE001 - restoring must not raise at shutdown
                warn_once("signal:restore", "async_tee: could not restore a signal handler")
            del self.previous[signum]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        previous = self.previous.get(signum, signal.SIG_DFL)
        chained = callable(previous)
        if not self._handling:  # a second signal during the flush goes straight through
            self._handling = True
            try:
                then = "the application's handler" if chained else "exiting"
                logger.info("async_tee: signal %d: flushing before %s", signum, then)
                (self._flush if chained else self._shutdown)(self._timeout_s)
            except Exception:  # noqa: BLE001 - the signal must still take its course
                warn_once("signal:flush", "async_tee: flushing on a signal failed")
            finally:
                self._handling = False
        if chained:
            previous(signum, frame)
            return
        # The default disposition: die of the signal, as the launcher expects.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _name(handler: object) -> str:
    """A handler as a warning names it: ``module.qualname``, or its repr."""
    qualname = getattr(handler, "__qualname__", None)
    module = getattr(handler, "__module__", None)
    if isinstance(qualname, str):
        return f"{module}.{qualname}" if isinstance(module, str) else qualname
    return repr(handler)

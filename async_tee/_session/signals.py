"""Deliver the last step when a termination signal stops the job (docs/semantics.md §7)."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Callable
from functools import partial
from types import FrameType
from typing import Any

from async_tee._reporting import logger, warn_once

Handler = Callable[[float], object]

MAIN_GRACE_S = 0.1
"""How long the signal thread waits for the main thread to start the handler itself before
responding in its place (the main thread is then inside a C call)."""

_STOP = b"\0"  # written to the pipe to end the signal thread: no signal has number 0


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
        self._responding = threading.Lock()  # one response at a time, main or signal thread
        # Deliveries, counted on both sides: the wake-up fd carries one byte per delivery,
        # the main thread runs the handler once per delivery (when it comes back).
        self._counted = threading.Condition()
        self._main_calls = 0  # handler calls the main thread has started
        self._bytes_read = 0  # deliveries of a handled signal the signal thread has read
        self._answered_upto = 0  # deliveries the signal thread responded to in its place
        self._pipe: tuple[int, int] | None = None  # (read, write) of the wake-up fd's pipe
        self._thread: threading.Thread | None = None
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
        if self.previous:
            self._watch()

    def _watch(self) -> None:
        """Point the wake-up fd at a pipe, and start the thread reading it (main thread)."""
        read = write = -1
        try:
            read, write = os.pipe()
            os.set_blocking(write, False)  # the C-level handler must never block on it
            theirs = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
            if theirs != -1:  # the application's (an asyncio loop's): theirs to keep
                signal.set_wakeup_fd(theirs)
                raise OSError("the wake-up fd is in use")
            self._pipe = (read, write)
            self._thread = threading.Thread(
                target=self._read_signals, name="async-tee-signals", daemon=True
            )
            self._thread.start()
        except Exception:  # noqa: BLE001 - the handler still runs on the main thread
            logger.debug("async_tee: no signal thread; handlers run on the main thread only")
            if self._pipe is None:
                for fd in (read, write):
                    if fd != -1:
                        os.close(fd)
            self._thread = None

    def after_fork_in_child(self) -> None:
        """Re-make the signal thread in a forked child (``fork`` keeps only the forking thread).

        The child inherits the wake-up fd, pointing at the parent's pipe, which nobody in
        the child reads: it gets a pipe and a thread of its own. Called after asyncio's own
        at-fork hook (Python 3.12+), which sets the wake-up fd to -1. Never raises.
        """
        self._responding = threading.Lock()  # the parent's thread may have held them
        self._counted = threading.Condition()
        self._main_calls = self._bytes_read = self._answered_upto = 0
        pipe = self._pipe
        if pipe is None:
            return
        self._pipe = self._thread = None
        try:
            if threading.current_thread() is threading.main_thread():
                signal.set_wakeup_fd(-1)
                for fd in pipe:
                    os.close(fd)
                self._watch()
        except Exception:  # noqa: BLE001 - a fork must never fail because of telemetry
            logger.debug("async_tee: no signal thread in the forked child")

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
        self._unwatch()
        for signum, previous in list(self.previous.items()):
            try:
                if signal.getsignal(signum) == self._handle:
                    signal.signal(signum, previous)
            except Exception:  # noqa: BLE001 - restoring must not raise at shutdown
                warn_once("signal:restore", "async_tee: could not restore a signal handler")
            del self.previous[signum]

    def _unwatch(self) -> None:
        """Give the wake-up fd back, end the signal thread, close the pipe (main thread)."""
        pipe, thread = self._pipe, self._thread
        if pipe is None:
            return
        self._pipe = self._thread = None
        try:
            current = signal.set_wakeup_fd(-1)
            if current not in (-1, pipe[1]):  # set by someone since: theirs stays
                signal.set_wakeup_fd(current)
            os.write(pipe[1], _STOP)
            if thread is not None:
                thread.join(1.0)
        except Exception:  # noqa: BLE001 - restoring must not raise at shutdown
            warn_once("signal:unwatch", "async_tee: could not stop the signal thread")
        finally:
            for fd in pipe:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _read_signals(self) -> None:
        """The signal thread: respond to a handled signal the main thread does not take up."""
        pipe = self._pipe
        if pipe is None:
            return
        while True:
            try:
                data = os.read(pipe[0], 64)
            except OSError:
                return
            if not data or _STOP in data:
                return
            for signum in data:
                if signum not in self.previous or signal.getsignal(signum) != self._handle:
                    continue  # a signal of someone else's handler (or ours replaced)
                with self._counted:
                    self._bytes_read += 1
                    delivery = self._bytes_read
                    if self._counted.wait_for(partial(self._main_reached, delivery), MAIN_GRACE_S):
                        continue  # the main thread runs the handler itself
                    self._answered_upto = delivery  # its handler, when it runs, need not
                chained = callable(self.previous.get(signum))
                try:
                    with self._responding:
                        self._respond(signum, chained, "the signal thread")
                    if not chained:
                        _die_of(signum)
                except Exception:  # noqa: BLE001 - this thread must not die of a response
                    warn_once("signal:thread", "async_tee: responding to a signal failed")

    def _main_reached(self, delivery: int) -> bool:
        return self._main_calls >= delivery

    def _respond(self, signum: int, chained: bool, where: str) -> None:
        """Drain and export (shut down, for the default disposition). Never raises."""
        try:
            then = "the application's handler" if chained else "exiting"
            logger.info("async_tee: signal %d: flushing before %s (%s)", signum, then, where)
            (self._flush if chained else self._shutdown)(self._timeout_s)
        except Exception:  # noqa: BLE001 - the signal must still take its course
            warn_once("signal:flush", "async_tee: flushing on a signal failed")

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        previous = self.previous.get(signum, signal.SIG_DFL)
        chained = callable(previous)
        if not self._handling:  # a second signal during the flush goes straight through
            self._handling = True
            with self._counted:
                self._main_calls += 1
                answered = self._main_calls <= self._answered_upto
                self._counted.notify_all()
            try:
                # The signal thread may be responding already: wait for it (bounded).
                if self._responding.acquire(timeout=self._timeout_s + 1.0):
                    try:
                        if not answered:
                            self._respond(signum, chained, "the main thread")
                    finally:
                        self._responding.release()
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


def _die_of(signum: int) -> None:
    """End the process of ``signum`` from any thread, as its default disposition would.

    ``signal.signal`` works on the main thread only, which is stuck: the default is put
    back at the C level (``signal(2)``), then the signal is sent again. Where that is not
    possible, the process exits with the status a shell reports for it (128 + signum).
    """
    try:
        import ctypes  # here only: the process is ending

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal.restype = ctypes.c_void_p
        libc.signal(signum, None)  # SIG_DFL
        os.kill(os.getpid(), signum)
    finally:
        os._exit(128 + signum)  # reached only if the signal did not end the process

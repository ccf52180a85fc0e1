"""Report a telemetry failure once at warning level, then at debug, and count it.

Telemetry failures are typically per-step and deterministic: a broken instrument fails the
same way on every step, so warning each time would fill a run's log with identical
tracebacks. The first failure per key is a warning (visible at default verbosity, with the
traceback when there is one); repeats go to debug. The set of keys is bounded.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("async_tee")

MAX_WARNED_KEYS = 1024
"""Distinct failure keys remembered; past this every failure is logged at debug."""

# Per process, not per session: a log should not repeat a warning because a session restarted.
_WARNED: set[str] = set()  # the keys that have warned once
_SATURATED = False  # whether the "too many distinct failures" warning was given


def warn_once(key: str, message: str, *args: object, traceback: bool = True) -> None:
    """Warn with a traceback the first time ``key`` fails, then stay quiet.

    Warning level once, so a permanently dead sink is visible at default verbosity; debug
    afterwards, so the repetition is still recoverable when someone is looking for it.
    ``message`` takes lazy ``%`` arguments. With ``traceback=False`` the warning is the
    message alone (a line that names its fix) and the traceback goes to debug. Never raises.
    """
    global _SATURATED
    try:
        exc_info = sys.exc_info()[0] is not None
        if key in _WARNED:
            logger.debug(message, *args, exc_info=exc_info)
            return
        if len(_WARNED) >= MAX_WARNED_KEYS:
            if not _SATURATED:
                _SATURATED = True
                logger.warning(
                    "async_tee: more than %d distinct telemetry failures; "
                    "further first occurrences are logged at debug level",
                    MAX_WARNED_KEYS,
                )
            logger.debug(message, *args, exc_info=exc_info)
            return
        _WARNED.add(key)
        logger.warning(message, *args, exc_info=exc_info and traceback)
        if exc_info and not traceback:
            logger.debug("async_tee: the traceback of the warning above", exc_info=exc_info)
    except Exception:  # noqa: BLE001 - a broken log handler must not reach training
        pass


def reset_warnings() -> None:
    """Forget which keys have warned (for tests and after a restart of telemetry)."""
    global _SATURATED
    _WARNED.clear()
    _SATURATED = False

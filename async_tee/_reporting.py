"""Report a telemetry failure: a warning once, then debug, and a count (docs/semantics.md §4)."""

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


SECRET_LOGGERS = ("async_tee",)
"""The loggers whose records may carry the endpoint or a header: async_tee's own (its OTLP
transports' errors are said there; no OTel SDK code sees them). A filter on each redacts a
session's secrets."""


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every secret replaced by ``***`` (the longest first)."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


class RedactSecrets(logging.Filter):
    """Rewrites a record's message and traceback text without the session's secrets."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
            clean = redact(message, self.secrets)
            if clean != message:
                record.msg, record.args = clean, ()
            if record.exc_info and not record.exc_text:
                record.exc_text = redact(
                    logging.Formatter().formatException(record.exc_info), self.secrets
                )
        except Exception:  # noqa: BLE001 - a filter must never stop a record
            pass
        return True


def redacting(secrets: tuple[str, ...]) -> RedactSecrets | None:
    """Install a redacting filter on :data:`SECRET_LOGGERS`; None when there is nothing to hide."""
    if not secrets:
        return None
    redactor = RedactSecrets(secrets)
    for name in SECRET_LOGGERS:
        logging.getLogger(name).addFilter(redactor)
    return redactor


def stop_redacting(redactor: RedactSecrets | None) -> None:
    """Remove what :func:`redacting` installed."""
    if redactor is not None:
        for name in SECRET_LOGGERS:
            logging.getLogger(name).removeFilter(redactor)

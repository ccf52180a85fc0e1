"""Tests for async_tee.reporting.warn_once: warning once, then debug, bounded, never raising."""

from __future__ import annotations

import logging

import pytest

from async_tee import _reporting as reporting
from async_tee._reporting import warn_once


def at(caplog, level):
    return [r for r in caplog.records if r.name == "async_tee" and r.levelno == level]


def test_warns_once_then_debug(logs):
    warn_once("k", "async_tee: thing %s failed (%d)", "x", 1)
    warn_once("k", "async_tee: thing %s failed (%d)", "x", 2)
    warn_once("k", "async_tee: thing %s failed (%d)", "x", 3)
    (warning,) = at(logs, logging.WARNING)
    assert warning.getMessage() == "async_tee: thing x failed (1)"
    assert [r.getMessage() for r in at(logs, logging.DEBUG)] == [
        "async_tee: thing x failed (2)",
        "async_tee: thing x failed (3)",
    ]


def test_distinct_keys_warn_separately(logs):
    warn_once("a", "first a")
    warn_once("b", "first b")
    warn_once("a", "again a")
    assert [r.getMessage() for r in at(logs, logging.WARNING)] == ["first a", "first b"]
    assert [r.getMessage() for r in at(logs, logging.DEBUG)] == ["again a"]


def test_message_formatting_is_lazy(logs):
    class Expensive:
        formatted = 0

        def __repr__(self):
            Expensive.formatted += 1
            return "Expensive()"

    logging.getLogger("async_tee").setLevel(logging.ERROR)
    warn_once("k", "value %r", Expensive())
    warn_once("k", "value %r", Expensive())
    assert Expensive.formatted == 0


def test_no_traceback_outside_an_except_block(logs):
    warn_once("k", "no exception here")
    (warning,) = at(logs, logging.WARNING)
    assert not warning.exc_info


def test_traceback_inside_an_except_block(logs):
    for attempt in range(2):
        try:
            raise KeyError(f"boom {attempt}")
        except KeyError:
            warn_once("k", "lookup failed")
    (warning,) = at(logs, logging.WARNING)
    assert warning.exc_info is not None
    assert warning.exc_info[0] is KeyError
    assert "boom 0" in str(warning.exc_info[1])
    # the repeat keeps its traceback too, at debug, for whoever is looking
    (debug,) = at(logs, logging.DEBUG)
    assert debug.exc_info[0] is KeyError
    assert "boom 1" in str(debug.exc_info[1])


def test_after_an_except_block_no_stale_traceback(logs):
    try:
        raise ValueError("handled")
    except ValueError:
        pass
    warn_once("k", "later, unrelated")
    (warning,) = at(logs, logging.WARNING)
    assert not warning.exc_info


def test_saturation(logs, monkeypatch):
    monkeypatch.setattr(reporting, "MAX_WARNED_KEYS", 3)
    for i in range(6):
        warn_once(f"key{i}", "failure %d", i)
    warn_once("key0", "failure again %d", 0)
    warnings = [r.getMessage() for r in at(logs, logging.WARNING)]
    assert warnings[:3] == ["failure 0", "failure 1", "failure 2"]
    assert len(warnings) == 4
    assert "more than 3 distinct telemetry failures" in warnings[3]
    assert [r.getMessage() for r in at(logs, logging.DEBUG)] == [
        "failure 3",
        "failure 4",
        "failure 5",
        "failure again 0",
    ]
    # the memory stays bounded: keys past the limit are not remembered
    assert len(reporting._WARNED) == 3


def test_saturation_warning_is_logged_once(logs, monkeypatch):
    monkeypatch.setattr(reporting, "MAX_WARNED_KEYS", 1)
    for i in range(50):
        warn_once(f"key{i}", "failure %d", i)
    assert len(at(logs, logging.WARNING)) == 2
    assert len(at(logs, logging.DEBUG)) == 49


def test_reset_warnings_forgets_keys_and_saturation(logs, monkeypatch):
    monkeypatch.setattr(reporting, "MAX_WARNED_KEYS", 1)
    warn_once("a", "a")
    warn_once("b", "b")
    reporting.reset_warnings()
    warn_once("a", "a again")
    warn_once("b", "b again")
    saturated = (
        "async_tee: more than 1 distinct telemetry failures; "
        "further first occurrences are logged at debug level"
    )
    assert [r.getMessage() for r in at(logs, logging.WARNING)] == [
        "a",
        saturated,
        "a again",
        saturated,
    ]


class BrokenHandler(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.calls = 0

    def emit(self, record):
        self.calls += 1
        raise RuntimeError("handler is broken")


@pytest.fixture
def broken_handler():
    handler = BrokenHandler()
    logger = logging.getLogger("async_tee")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(previous)


def test_broken_handler_does_not_make_warn_once_raise(broken_handler, monkeypatch):
    warn_once("k", "first")
    warn_once("k", "repeat")
    try:
        raise ValueError("inside except")
    except ValueError:
        warn_once("k2", "with traceback")
    monkeypatch.setattr(reporting, "MAX_WARNED_KEYS", 2)
    warn_once("k3", "past saturation")
    assert broken_handler.calls == 4  # the handler really was reached, each time
    # and the key still counts as warned: the next time is debug, not a second warning
    assert "k" in reporting._WARNED


def test_bad_format_arguments_do_not_raise(logs):
    warn_once("k", "needs a number %d", "not a number")
    warn_once("k", "too few %s %s", "one")

"""Helpers for tests of code that uses async_tee: reset its process-wide state.

A session's state dies with it (``shutdown_telemetry``); what outlives sessions are the
declarations, which are process-wide by design (made once, at import, in production), and
the warn-once memory. A test suite that starts and stops telemetry many times, or
declares its own rows, calls :func:`reset` between tests.
"""

from __future__ import annotations

from async_tee import _reporting
from async_tee._declare import shipped as _default_rows
from async_tee._declare.rows import DECLARATIONS
from async_tee._session import lifecycle as _telemetry


def reset(shutdown_timeout_s: float = 5.0) -> None:
    """Shut telemetry down and restore the shipped declarations, unfrozen.

    Ends the running session, drops every declared row but the shipped defaults, every
    registered metric group, the efficiency categories but the shipped ones, and the
    warn-once memory.
    """
    _telemetry.end_and_forget(shutdown_timeout_s)
    DECLARATIONS.reset()
    _default_rows.declare_defaults()
    _reporting.reset_warnings()

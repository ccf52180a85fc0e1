"""Test helpers: :func:`reset` async_tee's process-wide state (docs/semantics.md §7)."""

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

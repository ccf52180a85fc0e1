"""Helpers for tests of code that uses async_tee: reset its process-wide state.

Declarations, the registry's groups and telemetry are process-wide by design (once per
process in production). A test suite that starts and stops telemetry many times, or
declares its own rows, calls :func:`reset` between tests.
"""

from __future__ import annotations

import sys

from async_tee import mapping, metrics, registry, reporting, telemetry, vocabulary


def reset(shutdown_timeout_s: float = 5.0) -> None:
    """Shut telemetry down and restore the shipped declarations, unfrozen.

    Drops every registered metric group, every declared row but the shipped defaults,
    the registry's counts, the warn-once memory and the counter de-duplication state.
    """
    telemetry.shutdown_telemetry(shutdown_timeout_s)
    vocabulary._REGISTERED.clear()
    vocabulary._RECORDED.clear()
    vocabulary._DEFAULTS.clear()
    vocabulary._FROZEN = False
    mapping._CATEGORIES.clear()
    from async_tee import default_rows

    default_rows.declare_defaults()
    registry._GROUPS.clear()
    registry._INSTRUMENTS.clear()
    registry.COUNTS = registry.RegistryCounts()
    registry.set_max_attribute_sets(registry.DEFAULT_MAX_ATTRIBUTE_SETS)
    metrics._REGISTERED = False
    metrics._REGISTRATION_FAILED = False
    metrics._COUNTED_STEP.clear()
    metrics._TEE_ERRORS[0] = 0
    telemetry._SELF_GROUP_REGISTERED = False
    telemetry._LAST_WORKER = None
    reporting.reset_warnings()
    provider = sys.modules.get("async_tee.provider")
    if provider is not None:
        for result in provider.EXPORT_RESULTS:
            provider.EXPORT_RESULTS[result] = 0

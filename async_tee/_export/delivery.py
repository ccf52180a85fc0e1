"""Push exports counted by trigger and result: the evidence of delivery (docs/semantics.md §7)."""

from __future__ import annotations

TRIGGERS = ("step", "interval", "shutdown", "flush")
"""What starts an export: a completed step, the periodic interval, shutdown, a force flush."""


class ExportCounts:
    """Export attempts by trigger and result, written by the exporting thread (and worker).

    Each count is one integer slot written by one thread at a time and read by ``stats()``
    without a lock, like the worker's counts.
    """

    def __init__(self) -> None:
        self.by_trigger: dict[str, dict[str, int]] = {}
        self.collections = 0  # collections started by async_tee's readers: a new one each
        self.reset()

    def reset(self) -> None:
        """Zero every count (a new session, or a child after fork)."""
        self.by_trigger = {trigger: {"success": 0, "failure": 0} for trigger in TRIGGERS}
        self.collections = 0

    def add(self, trigger: str, ok: bool) -> None:
        """Count one export attempt."""
        self.by_trigger[trigger]["success" if ok else "failure"] += 1

    def totals(self) -> dict[str, int]:
        """``{"success": n, "failure": n}`` over every trigger."""
        return {
            result: sum(counts[result] for counts in self.by_trigger.values())
            for result in ("success", "failure")
        }

    def snapshot(self) -> dict[str, dict[str, int]]:
        """A copy of the counts by trigger, for ``stats()``."""
        return {trigger: dict(counts) for trigger, counts in self.by_trigger.items()}

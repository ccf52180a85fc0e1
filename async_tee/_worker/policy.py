"""When a completed step is exported: one frozen policy, handed to the clock, worker and reader.

Every rule of step-aligned export (docs/semantics.md §9) reads its numbers here:

- a step that said ``step_finished`` is complete once no dict of it arrived for
  :attr:`StepPolicy.settle_s` (the step clock, ``_steps``);
- a completed step is collected at once when :attr:`StepPolicy.min_interval_s` has
  passed since the last step export, on the trainer's timeline; else it waits, and a
  newer step folds it (the clock);
- the worker drains at least every :meth:`StepPolicy.trickle_interval_s` while dicts
  arrive, so each step that may be exported gets a drain of its own (``_worker``);
- the periodic export is a backstop: due one export interval after the last export,
  :attr:`StepPolicy.backstop_grace` of an interval later after a step export
  (:meth:`StepPolicy.backstop_due`, the exporting thread, ``_export``).

Standard library only; nothing here keeps state or reads a clock.
"""

from __future__ import annotations

import dataclasses
import math

STEP_SETTLE_S = 0.1
"""How long after a ``step_finished=True`` dict more dicts of that step may still arrive
(the Logger's efficiency dict follows the finishing call)."""

BACKSTOP_GRACE = 0.5
"""After a step export, the periodic export waits this share of its interval longer, so
steps exported about one interval apart do not cost two exports each: a step export is
sent when the worker drains it, a fraction of a second after the step."""


@dataclasses.dataclass(frozen=True)
class StepPolicy:
    """The numbers of step-aligned export.

    Attributes:
        min_interval_s: The least time between a step export and the export before it
            (``ASYNC_TEE_MIN_EXPORT_INTERVAL``).
        export_interval_s: The periodic export's interval (``OTEL_METRIC_EXPORT_INTERVAL``).
        settle_s: How long a finished step waits for late dicts of its own.
        backstop_grace: The share of an interval the backstop waits more after a step export.
    """

    min_interval_s: float = 1.0
    export_interval_s: float = 60.0
    settle_s: float = STEP_SETTLE_S
    backstop_grace: float = BACKSTOP_GRACE

    def trickle_interval_s(self, steps_exported: bool) -> float:
        """The worker's longest sleep while dicts arrive.

        Draining less often than steps may be exported would put several exportable
        steps in one drain, and all but the last two would be folded (one export in
        flight, one waiting). Without a reader driven by steps, nothing bounds it here.
        """
        return self.min_interval_s if steps_exported else math.inf

    def backstop_due(self, last_export_s: float, last_was_step: bool) -> float:
        """When the periodic export is due, given when the last export started and its kind."""
        grace = self.backstop_grace if last_was_step else 0.0
        return last_export_s + self.export_interval_s * (1.0 + grace)

    def next_collect_ns(self, last_collect_ns: int) -> int:
        """The earliest a step may complete and be collected, given the last collection."""
        return last_collect_ns + self.min_interval_ns

    def may_collect(self, at_ns: int, last_collect_ns: int) -> bool:
        """Whether a step completed at ``at_ns`` may be collected, given the last collection."""
        return at_ns >= self.next_collect_ns(last_collect_ns)

    @property
    def settle_ns(self) -> int:
        """:attr:`settle_s` in nanoseconds."""
        return int(self.settle_s * 1e9)

    @property
    def min_interval_ns(self) -> int:
        """:attr:`min_interval_s` in nanoseconds."""
        return int(self.min_interval_s * 1e9)


DEFAULT_POLICY = StepPolicy()
"""The policy of the default settings."""

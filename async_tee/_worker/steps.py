"""The step clock: when a step is complete, and when it is exported (docs/semantics.md §9)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from async_tee._declare.rows import STEP_TIMING_PREFIX
from async_tee._reporting import warn_once
from async_tee.vocabulary import as_scalar

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


class StepReader(Protocol):
    """What the clock needs of the exporter it drives (``_export/sender.OtlpSender``)."""

    def collect_step(self) -> bool:
        """Collect for a step export now; whether the collection succeeded."""


_OPEN, _FINISHED, _COMPLETED = "open", "finished", "completed"


class StepClock:
    """Tracks the newest step and drives step-aligned exports; one per session.

    Attributes:
        last: The last step completed (None before the first).
        completed: Steps completed.
        exported: Steps collected for an export of their own (the last one by the final
            export at shutdown).
        coalesced: Completed steps folded into a later export instead; with
            ``exported`` they add up to ``completed`` once the session ended.
        unusable: Steps that were not finite real numbers, treated as no step.
    """

    def __init__(
        self,
        record: Callable[[float, float], None],
        reader: StepReader | None = None,
        policy: StepPolicy = DEFAULT_POLICY,
        *,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        wall_s: Callable[[], float] = time.time,
        end_prefix: str = STEP_TIMING_PREFIX,
    ) -> None:
        """A clock before any step.

        Args:
            record: Records ``rl.step`` and ``rl.step.time`` for a completed step.
            reader: The reader to collect for at each completed step, if one is driven
                by steps.
            policy: The settle time and the least interval between step exports.
            monotonic_ns: The trainer's clock (the dicts' enqueue times are on it).
            wall_s: The wall clock ``rl.step.time`` is on.
            end_prefix: The prefix of the dict that ends a step numbered by the clock.
        """
        self._record = record
        self._reader = reader
        self._policy = policy
        self._now_ns = monotonic_ns
        self._wall_s = wall_s
        self._settle_ns = policy.settle_ns
        self._last_collect_ns = -(2**62)  # when the last step export's step completed
        self._step: float | None = None  # the newest step seen
        self._state = _COMPLETED
        self._last_ns = 0  # enqueue time of that step's newest dict
        self._completed_ns = 0  # when the last completed step completed (trainer's time)
        # When the last three completed steps ended (their newest dicts), for their cadence.
        self._ends: deque[int] = deque(maxlen=3)
        self._waiting = False  # a completed step not collected yet, and still clean
        self.last: float | None = None
        self.completed = 0
        self.exported = 0
        self.coalesced = 0
        self.unusable = 0
        self.end_prefix = end_prefix
        self.numbering = True  # until a dict carries a step of its own
        self._numbered = 1.0  # the open numbered step

    def usable(self, step: Any) -> float | None:
        """``step`` as a float, or None for no step (counted when one was given)."""
        if step is None:
            return None
        value = as_scalar(step)
        if value is None or not math.isfinite(value):
            self.unusable += 1
            warn_once("steps:unusable", "async_tee: a step that is not a number; taken as none")
            return None
        return value

    def step_of(self, raw_step: Any, prefix: str, finished: bool) -> tuple[float | None, bool]:
        """The step a teed dict (or marker) belongs to, and whether it ends that step.

        A dict that carries a step is that step's (:meth:`usable`), and ends it when it says
        ``step_finished``. Until the first dict that carries one, the session numbers the
        steps itself (the seed's two-argument call passes none): a dict with no step
        belongs to the open numbered step, 1 at first, and the step-ending dict
        (``end_prefix``, NeMo-RL's ``timing/train``, or a ``step_finished`` call) ends it,
        so the next dict starts the next one (docs/semantics.md §9).
        """
        if raw_step is not None:
            self.numbering = False
            return self.usable(raw_step), finished
        if not self.numbering:
            return None, False
        step = self._numbered
        if finished or prefix == self.end_prefix:
            self._numbered += 1
            return step, True
        return step, False

    @property
    def probing(self) -> bool:
        """Whether the first step the clock numbers is open: no step-ending dict seen yet."""
        return self.numbering and self._numbered == 1.0 and self._step is not None

    def stop_numbering(self) -> None:
        """The loop ends no step with a step-ending dict: take no-step dicts as no step.

        The first numbered step, never ended, is forgotten rather than completed.
        """
        self.numbering = False
        if self._step is not None and self.last is None:
            self._step, self._state = None, _COMPLETED
        warn_once(
            "steps:unmarked",
            "async_tee: dicts with no step and no step-ending %r dict; their steps are not "
            "numbered, so every export shows the latest values and no rl.step: pass step "
            "(and step_finished) to tee_rl_metrics_to_otel",
            self.end_prefix,
        )

    def is_stale(self, step: float | None) -> bool:
        """Whether a dict of ``step`` (after :meth:`before`) belongs to a finished past.

        Older than the open step, or the open step once it completed: its gauge values
        would be exported under a newer step, so they are skipped (docs/semantics.md §9).
        """
        current = self._step
        if step is None or current is None:
            return False
        return step < current or (step == current and self._state == _COMPLETED)

    def before(self, step: float | None, enqueued_ns: int) -> None:
        """A dict (or a bare end-of-step marker) of ``step`` (from :meth:`usable`) is next."""
        if step is None:
            return
        newer = self._step is None or step > self._step
        if newer:
            if self._state == _FINISHED:  # settled before this dict, if the worker was late
                self._complete(min(self._last_ns + self._settle_ns, enqueued_ns))
            elif self._step is not None and self._state != _COMPLETED:
                self._complete(enqueued_ns)
            # This dict dirties the tables: a waiting step is collected now or never. Now
            # means when the dict was logged, the trainer's time: the worker may be late.
            if self._waiting and not self._try_collect(enqueued_ns):
                self._waiting = False
                self.coalesced += 1
            self._step, self._state, self._last_ns = step, _OPEN, enqueued_ns
        elif step == self._step:
            self._last_ns = max(self._last_ns, enqueued_ns)

    def finished(self, step: float | None) -> None:
        """A dict of ``step`` said ``step_finished=True`` (called after ``before``)."""
        if self._state == _OPEN and step is not None and step == self._step:
            self._state = _FINISHED

    def tick(self, settle_now: bool = False) -> float | None:
        """After a drain: settle a finished step, collect a waiting one if allowed.

        Args:
            settle_now: A flush waits on this drain: a finished step is complete now,
                without waiting out the settle time (the caller has logged what it will).

        Returns:
            Seconds until the clock needs the worker again, or None.
        """
        now = self._now_ns()
        due: float | None = None
        if self._state == _FINISHED:
            settled_at = self._last_ns + self._settle_ns
            if settle_now:
                settled_at = min(settled_at, now)
            if settled_at <= now:
                self._complete(settled_at)
            elif self._reader is not None:
                # Settled before the interval allows its export, the step would only wait:
                # wake when it can be exported (a wake costs far more than this check; at 10
                # steps a second settling each would be 10 wakes a second for one export).
                next_collect_ns = self._policy.next_collect_ns(self._last_collect_ns)
                due = (max(settled_at, next_collect_ns) - now) / 1e9
            # With no reader to drive, completing only records rl.step: the next drain does.
        if self._waiting:
            # Collected as of when the interval allowed it, on the trainer's timeline, not
            # when this drain came: dated at the drain, each export would start the next
            # interval late, and a step one interval later would wait for a wake of its own.
            allowed_ns = self._policy.next_collect_ns(self._last_collect_ns)
            if allowed_ns <= now:
                self._try_collect(max(allowed_ns, self._completed_ns))
            else:
                wait = (allowed_ns - now) / 1e9
                due = wait if due is None else min(due, wait)
        return due

    def cadence(self) -> tuple[float, float] | None:
        """When the next step is expected to have ended and settled, and the step length.

        Steps come at a cadence: the next is expected to end one step length after the
        last one did, the step length being the shorter of the last two (one long step, a
        validation or a stall, does not push the expectation out), and to have settled
        ``2 * settle_s`` after that (a settle time's margin for a step ending a little
        late).

        Returns:
            ``(due_in_s, length_s)``: the seconds until then (negative once that time has
            passed without the step) and the step length; or None with no cadence to go by:
            fewer than three steps completed, or steps closer than half the least interval
            between step exports (the worker's own timer drains those, less than once a
            step).
        """
        ends = self._ends
        if len(ends) < 3:
            return None
        length = min(ends[1] - ends[0], ends[2] - ends[1])
        if length * 2 < self._policy.min_interval_ns:
            return None
        return (ends[2] + length + 2 * self._settle_ns - self._now_ns()) / 1e9, length / 1e9

    def close(self) -> None:
        """The session ends: complete the open step; the final export carries it."""
        carried = self._waiting
        if self._step is not None and self._state != _COMPLETED:
            self._complete(self._now_ns(), collect=False)
            carried = True
        if carried and self._reader is not None:
            self.exported += 1  # the final export carries it
        self._waiting = False

    def _complete(self, at_ns: int, collect: bool = True) -> None:
        """Complete the newest step, which ended at ``at_ns`` (monotonic, trainer's time)."""
        step = self._step
        assert step is not None  # only a step that was seen completes
        self._state = _COMPLETED
        self._completed_ns = at_ns
        self.completed += 1
        self.last = step
        self._ends.append(self._last_ns)
        wall = self._wall_s() - (self._now_ns() - self._last_ns) / 1e9
        try:
            self._record(step, wall)
        except Exception:  # noqa: BLE001 - never raise into the worker
            warn_once("steps:record", "async_tee: recording rl.step failed")
        if self._reader is None or not collect:
            return
        if self._waiting:  # the previous step never got its export
            self.coalesced += 1
        self._waiting = True
        self._try_collect(at_ns)

    def _try_collect(self, at_ns: int) -> bool:
        """Collect the waiting step if ``at_ns`` is far enough from the last step export."""
        reader = self._reader
        if reader is None or not self._policy.may_collect(at_ns, self._last_collect_ns):
            return False
        self._waiting = False
        self._last_collect_ns = at_ns
        if reader.collect_step():
            self.exported += 1
        return True

    def stats(self) -> dict[str, Any]:
        """The step counts as ``stats()["steps"]`` reports them."""
        return {
            "last": self.last,
            "completed": self.completed,
            "exported": self.exported,
            "coalesced": self.coalesced,
            "unusable": self.unusable,
        }

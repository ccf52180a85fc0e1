"""One telemetry session, owned by one object: the :class:`Pipeline`.

``start_telemetry`` creates a pipeline and ``shutdown_telemetry`` ends it. It holds
everything a session owns: the settings, the provider (and whether async_tee built it),
the meter and its instrument registry, the RL recorder, the hand-off queue and the worker,
the export results, the Prometheus servers, and so the threads. Nothing of a session
outlives it (docs/semantics.md §7); the declarations it reads belong to the process.

The data flows one way through it: the caller's snapshot (``_caller``) -> the queue
(``_handoff``) -> the worker (``_worker``) -> :meth:`Pipeline.process` -> the recorder
(``_recorder``: mapping, de-duplication) -> the registry (instruments) -> OTel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time
from typing import TYPE_CHECKING, Any

from async_tee import _caller, _series
from async_tee._caller import Snapshot
from async_tee._delivery import ExportCounts
from async_tee._handoff import DropOldestQueue
from async_tee._provider import BuiltProvider, ExporterState, build_meter_provider, close_servers
from async_tee._recorder import CountedSteps, RLRecorder
from async_tee._reporting import warn_once
from async_tee._rl_group import RL_METRIC_GROUP, ensure_metric_group_registered
from async_tee._signals import SignalFlush
from async_tee._steps import StepClock
from async_tee._version import __version__
from async_tee.config import Settings
from async_tee.registry import InstrumentRegistry, RegistryCounts, instrument_registry

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter, MeterProvider

    from async_tee._worker import Worker

FORK_PAUSE_S = 1.0
"""How long ``os.fork()`` waits for the worker to finish the batch in hand."""

SNAPSHOT_TTL_S = 0.02
"""How long the self-series' ``stats()`` snapshot serves a collection async_tee did not start
(a Prometheus scrape): one collection's callbacks run within ~2 ms; scrapes come seconds apart."""


class Pipeline:
    """A telemetry session: what ``start_telemetry`` returns and ``shutdown_telemetry`` ends.

    Attributes:
        settings: The effective configuration.
        meter_provider: The provider recorded into (None while disabled or on failure).
        owns_provider: Whether async_tee built the provider (and so shuts it down).
        meter: async_tee's meter on that provider.
        instruments: The meter's instrument registry (per-session counts).
        recorder: Maps and records snapshots (per-session counter de-duplication).
        queue: The hand-off queue the tee puts on while this session runs.
        worker: The worker draining it.
        steps: The step clock: completes steps, records ``rl.step``, drives step exports.
        signals: The termination-signal handlers it installed (docs/semantics.md §7).
        export_counts: Export attempts of the provider async_tee built, by trigger, result.
    """

    def __init__(self, settings: Settings, meter_provider: MeterProvider | None = None) -> None:
        """A session not started yet; :meth:`start` starts it."""
        self.settings = settings
        self.meter_provider = meter_provider
        self.owns_provider = False
        self.meter: Meter | None = None
        self.instruments: InstrumentRegistry | None = None
        self.recorder: RLRecorder | None = None
        self.queue: DropOldestQueue[Snapshot] | None = None
        self.worker: Worker | None = None
        self.steps: StepClock | None = None
        self.signals: SignalFlush | None = None
        self.export_counts = ExportCounts()
        self._built: BuiltProvider | None = None
        self._lag_values: dict[str, float] = {}
        self._snapshot: tuple[int, float, dict[str, Any]] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> bool:
        """Build or adopt the provider, create the instruments, start the worker.

        Returns:
            Whether the tee is live. False (warned once) leaves it a no-op.

        Raises:
            Exception: Whatever the SDK raises on a bad setting; ``start_telemetry``
                catches it and leaves the tee a no-op.
        """
        if self.meter_provider is None:
            self._built = build_meter_provider(self.settings, self.export_counts)
            self.meter_provider = self._built.provider
            self.owns_provider = True
        meter = self.meter_provider.get_meter("async_tee", __version__)
        self.meter = meter
        self.instruments = instrument_registry(meter)
        self.instruments.begin_session(self.settings.max_attribute_sets)
        self.instruments.create(_series.SELF_METRIC_GROUP)
        if not ensure_metric_group_registered():
            return False
        self.instruments.create(RL_METRIC_GROUP)
        self.recorder = RLRecorder.for_meter(meter)  # over this meter's registry, above
        self.steps = self._new_step_clock()
        return self._start_worker()

    def _new_step_clock(self) -> StepClock:
        reader = self._built.step_reader if self._built is not None else None
        return StepClock(self._record_step, reader)

    def _start_worker(self) -> bool:
        """Start a worker on a fresh queue and point the tee at it: from here it is live."""
        from async_tee._worker import Worker  # asyncio loads here, not at import async_tee

        queue: DropOldestQueue[Snapshot] = DropOldestQueue(self.settings.queue_size)
        worker = Worker(
            queue,
            self.process,
            self.settings.drain_interval_s,
            self.on_lag,
            self.after_drain,
            self.on_worker_death,
            trickle_interval_s=self._trickle_interval(),
        )
        queue.on_high_water = worker.wake
        if not worker.start():
            warn_once("worker:start", "async_tee: the worker did not start; the tee stays off")
            return False
        self.queue = queue
        self.worker = worker
        assert self.recorder is not None  # built before the worker
        _caller.attach(queue, self.recorder.read_keys)
        return True

    def _trickle_interval(self) -> float:
        """The worker's longest sleep while dicts arrive: steps may be exported this far apart.

        Draining less often than that would put several exportable steps in one drain,
        and all but the last two would be folded (one export in flight, one waiting).
        """
        reader = self._built.step_reader if self._built is not None else None
        if reader is None:
            return math.inf  # nothing exports per step: the worker's idle interval bounds it
        return self.settings.min_export_interval_s

    def detach(self) -> None:
        """Turn the tee off for this session (it stops enqueuing at once)."""
        if _caller.attached() is self.queue:
            _caller.attach(None)

    def shutdown(self, timeout_s: float) -> bool:
        """Drain, then shut down the provider async_tee built, all within ``timeout_s``.

        Half the budget at most goes to draining; the rest is the final export's.

        Returns:
            Whether everything was delivered (see ``shutdown_telemetry``).
        """
        self.detach()
        deadline = time.monotonic() + max(0.0, timeout_s)
        recorded = True
        if self.worker is not None:
            recorded = self.worker.stop(max(0.0, (deadline - time.monotonic()) / 2))
            if self.steps is not None and not self.worker.thread.is_alive():
                self.steps.close()  # the last step completes; the final export carries it
        return self._shutdown_provider(deadline) and recorded

    def _shutdown_provider(self, deadline: float) -> bool:
        """Shut down a provider async_tee built, within ``deadline`` even if the SDK is not."""
        provider = self.meter_provider
        if provider is None or not self.owns_provider:
            return True
        before = self.export_counts.totals()
        # Delivery needs evidence: the final export (made by provider.shutdown) succeeded. A
        # reader stuck in an earlier export never makes it, and then nothing was delivered.
        pushes = any(name in ("otlp", "console") for name in self.settings.exporters)
        outcome: list[bool] = []

        def run() -> None:
            try:
                remaining_ms = max(0.0, deadline - time.monotonic()) * 1000
                provider.shutdown(timeout_millis=remaining_ms)  # type: ignore[attr-defined]
                outcome.append(True)
            except Exception:  # noqa: BLE001 - the SDK's shutdown can raise
                warn_once("shutdown:provider", "async_tee: shutting down the MeterProvider failed")
                outcome.append(False)

        thread = threading.Thread(target=run, name="async-tee-shutdown", daemon=True)
        thread.start()
        thread.join(max(0.0, deadline - time.monotonic()))
        if self._built is not None:
            close_servers(self._built.servers)
        after = self.export_counts.totals()
        exported = not pushes or after["success"] > before["success"]
        # An exporter that never started delivered nothing, whatever the others did.
        every_one_started = all(state.started for state in self.exporters)
        return (
            bool(outcome and outcome[0])
            and exported
            and after["failure"] == before["failure"]
            and every_one_started
        )

    # ------------------------------------------------------------------ the worker's calls

    def process(self, snapshot: Snapshot) -> None:
        """Record one snapshot (the worker's callback); a teed one passes the step clock."""
        recorder, steps = self.recorder, self.steps
        assert recorder is not None
        assert steps is not None
        if len(snapshot) == 5:
            metrics, prefix, raw_step, finished, enqueued_ns = snapshot
            step = steps.usable(raw_step)  # a number or None, never an array to store
            steps.before(step, enqueued_ns)
            if metrics is not None:  # None: a bare end-of-step marker
                recorder.tee(metrics, prefix, step)
            if finished:
                steps.finished(step)
        else:
            recorder.record(snapshot[0], snapshot[1])

    def after_drain(self) -> float | None:
        """Let the step clock settle and export (the worker's callback after each drain).

        Returns:
            Seconds until the clock needs the worker again, or None.
        """
        return self.steps.tick() if self.steps is not None else None

    def on_worker_death(self) -> None:
        """The worker's loop ended unstopped: stop enqueuing into a queue nobody drains."""
        self.detach()
        warn_once(
            "worker:died",
            "async_tee: the worker stopped unexpectedly; the tee is off for this session "
            "(stats()['worker_died'], async_tee.worker.died)",
        )

    def _record_step(self, step: float, completed_at: float) -> None:
        """Record ``rl.step`` and ``rl.step.time`` for a step just completed."""
        assert self.recorder is not None
        self.recorder.record_step(step, completed_at)

    def on_lag(self, lag_ms: float) -> None:
        """Record one snapshot's enqueue-to-record lag (the worker's callback)."""
        if self.instruments is not None:
            self._lag_values[_series.LAG_KEY] = lag_ms
            self.instruments.record(_series.SELF_METRIC_GROUP, self._lag_values)

    # ------------------------------------------------------------------ reading it

    @property
    def is_exporting(self) -> bool:
        """Whether the tee is live and has somewhere to export.

        False before start, while disabled, on a rank ``ASYNC_TEE_EXPORT_RANKS`` leaves
        out, after shutdown, and when every exporter asked for failed to start (the tee
        still records then, so ``stats()`` counts on; nothing leaves the process).
        """
        live = self.queue is not None and _caller.attached() is self.queue
        exporters = self.exporters
        return live and (not exporters or any(state.started for state in exporters))

    @property
    def exporters(self) -> list[ExporterState]:
        """Each exporter async_tee was asked to build, and whether it started.

        Empty for a provider passed in, and for ``OTEL_METRICS_EXPORTER=none``.
        """
        return list(self._built.exporters) if self._built is not None else []

    @property
    def prometheus_address(self) -> tuple[str, int] | None:
        """``(host, port)`` the Prometheus exporter serves ``/metrics`` on, if it started.

        With port 0 this is the port the system chose.
        """
        for state in self.exporters:
            if state.name == "prometheus" and state.started:
                host, _, port = state.where.rpartition(":")
                return host, int(port)
        return None

    @property
    def threads(self) -> list[threading.Thread]:
        """The threads this session started: the worker, the provider's readers, servers."""
        found = [self.worker.thread] if self.worker is not None else []
        return found + (self._built.threads if self._built is not None else [])

    def flush_and_export(self, timeout_s: float) -> bool:
        """Record everything queued, then export it now, all within ``timeout_s``.

        The push exporters of a provider async_tee built export at once (bounded); a
        provider passed in is only recorded into. The session goes on.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        done = self.flush(timeout_s / 2)
        for reader in self._built.push_readers if self._built is not None else ():
            remaining_ms = max(0.0, deadline - time.monotonic()) * 1000
            done = reader.force_flush(remaining_ms) and done
        return done

    def flush(self, timeout_s: float) -> bool:
        """Wait until every snapshot put before this call is recorded (see ``flush``)."""
        return True if self.worker is None else self.worker.flush(timeout_s)

    async def aflush(self, timeout_s: float) -> bool:
        """``flush`` for a coroutine: awaits instead of blocking its loop."""
        return True if self.worker is None else await self.worker.aflush(timeout_s)

    def stats(self, lag_percentiles: bool = True) -> dict[str, Any]:
        """This session's figures (see ``async_tee.stats``); the lag sort is optional."""
        worker, queue, instruments = self.worker, self.queue, self.instruments
        counts = worker.counts if worker is not None else None
        # A dict whose snapshot failed on the caller's side was handed over and dropped.
        snapshot_failures = queue.caller_errors if queue is not None else 0
        enqueued = (queue.enqueued() if queue is not None else 0) + snapshot_failures
        dropped_by_reason = {
            "overflow": counts.overflow if counts else 0,
            "error": counts.errors if counts else 0,
            "shutdown": counts.shutdown if counts else 0,
            "snapshot": snapshot_failures,
        }
        dropped = sum(dropped_by_reason.values())
        recorded = counts.recorded if counts else 0
        lags = sorted(worker.lags_ms) if worker is not None and lag_percentiles else []

        def pick(q: float) -> float:  # nearest rank, as the demo and benchmarks report
            return lags[max(0, math.ceil(q * len(lags)) - 1)] if lags else 0.0

        rc = instruments.counts if instruments is not None else None
        return {
            "enqueued": enqueued,
            "recorded": recorded,
            "dropped": dropped,
            "pending": enqueued - recorded - dropped,
            "capacity": queue.capacity if queue is not None else 0,
            "dropped_by_reason": dropped_by_reason,
            "lag_ms": {
                "p50": pick(0.5),
                "p99": pick(0.99),
                "max": worker.max_lag_ms if worker is not None else 0.0,
                "samples": len(lags),
            },
            "values_skipped": {
                "non_finite": rc.non_finite if rc else 0,
                "rejected": rc.rejected if rc else 0,
                "cardinality": rc.cardinality if rc else 0,
            },
            "non_finite_by_series": dict(rc.non_finite_by_series) if rc else {},
            "errors": {
                "tee": queue.caller_errors if queue is not None else 0,
                "registry": rc.errors if rc else 0,
            },
            "exports": self.export_counts.totals(),
            "exports_by_trigger": self.export_counts.snapshot(),
            "steps": self._step_stats(),
            "exporting": self.is_exporting,
            "exporters": {state.name: state.as_dict() for state in self.exporters},
            "ranks": {
                **dataclasses.asdict(self.settings.ranks),
                "export_ranks": self.settings.export_ranks,
                "exports": self.settings.exports_from_this_rank,
            },
            "worker_died": int(worker is not None and worker.died),
            "export_thread_died": int(self._export_thread_died()),
        }

    def export_stats(self) -> dict[str, Any]:
        """``stats()`` as the ``async_tee.*`` callbacks read it: one snapshot per collection.

        A collection runs a dozen self-series callbacks in a row; each used to compute the
        whole ``stats()`` (~60 µs each, most of a collection's own cost). The snapshot is
        taken by the first and reused by the rest: until async_tee's reader starts its next
        collection, or for ``SNAPSHOT_TTL_S`` for a collection it did not start.
        """
        snapshot, collection = self._snapshot, self.export_counts.collections
        now = time.monotonic()
        if (
            snapshot is not None
            and snapshot[0] == collection
            and now - snapshot[1] < SNAPSHOT_TTL_S
        ):
            return snapshot[2]
        stats = self.stats(lag_percentiles=False)
        self._snapshot = (collection, now, stats)
        return stats

    def _export_thread_died(self) -> bool:
        """Whether an exporting thread ended while its session still runs (never expected)."""
        readers = self._built.push_readers if self._built is not None else []
        return any(not r.thread.is_alive() and not r.stopped for r in readers)

    def _step_stats(self) -> dict[str, Any]:
        steps = self.steps
        reader = self._built.step_reader if self._built is not None else None
        superseded = reader.superseded if reader is not None else 0
        return {
            "last": steps.last if steps is not None else None,
            "completed": steps.completed if steps is not None else 0,
            "exported": (steps.exported - superseded) if steps is not None else 0,
            "coalesced": (steps.coalesced + superseded) if steps is not None else 0,
            "unusable": steps.unusable if steps is not None else 0,
        }

    # ------------------------------------------------------------------ fork

    def before_fork(self) -> None:
        """Let the worker finish its batch, so the child inherits no lock it holds."""
        if self.worker is not None:
            self.worker.busy.acquire(timeout=FORK_PAUSE_S)

    def after_fork_in_parent(self) -> None:
        """Let the worker go on."""
        if self.worker is not None and self.worker.busy.locked():
            with contextlib.suppress(RuntimeError):
                self.worker.busy.release()

    def after_fork_in_child(self) -> None:
        """Go on as the child's own session: a fresh queue, worker, counts and step memory.

        Nothing of the parent's queue is replayed, and the parent's last values were
        dropped with the registry's tables, so the child exports only what it records.
        """
        _caller.attach(None)
        if self.worker is None or self.recorder is None or self.instruments is None:
            return
        self.instruments.counts = RegistryCounts()
        self.recorder.counted = CountedSteps()
        self.export_counts.reset()
        self._snapshot = None
        self.steps = self._new_step_clock()
        try:
            self._start_worker()
        except Exception:  # noqa: BLE001 - a fork must never fail because of telemetry
            warn_once("fork", "async_tee: could not restart the worker after fork")

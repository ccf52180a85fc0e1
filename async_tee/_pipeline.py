"""One telemetry session, owned by one object, opened whole: :meth:`Pipeline.open`.

``Pipeline.open`` either returns a running session with every part set (settings, provider,
meter and its instrument registry, the RL recorder, the step policy and clock, the
hand-off queue and the running worker, the export counts, the signal handlers) or raises,
leaving nothing running. A session that is off (disabled, a rank that does not export, a
failed start) is a :class:`DisabledSession`, and :data:`NO_SESSION` stands for "no session
yet". Nothing of a session outlives it (docs/semantics.md §7); the declarations it reads
belong to the process. ``_telemetry`` alone registers the running session and points the
tee at its queue; once shut down, by whatever path, a session is never handed out again.

The data flows one way through it: the caller's snapshot (``_caller``) -> the queue
(``_handoff``) -> the worker (``_worker``) -> ``Pipeline._process`` -> the recorder
(``_recorder``: the plans ``_mapping`` compiled, de-duplication) -> the registry -> OTel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from async_tee import _caller, _series
from async_tee._caller import Snapshot
from async_tee._declarations import OBSERVABLE_KINDS
from async_tee._delivery import TRIGGERS, ExportCounts
from async_tee._exporters import EXPORTER_KINDS, ExporterState, close_servers
from async_tee._handoff import DropOldestQueue
from async_tee._mapping import LEFT_OUT, READ_WHOLE, SKIP_REASONS, count_skipped, exact_str_keys
from async_tee._policy import StepPolicy
from async_tee._provider import BuiltProvider, build_meter_provider
from async_tee._recorder import CountedSteps, RLRecorder
from async_tee._reporting import RedactSecrets, redacting, stop_redacting, warn_once
from async_tee._rl_group import RL_METRIC_GROUP, ensure_metric_group_registered
from async_tee._settings import Settings
from async_tee._signals import SignalFlush
from async_tee._steps import StepClock
from async_tee._version import __version__
from async_tee.registry import InstrumentRegistry, RegistryCounts, instrument_registry

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter, MeterProvider

    from async_tee._worker import Worker

FORK_PAUSE_S = 1.0
"""How long ``os.fork()`` waits for the worker to finish the batch in hand."""

SNAPSHOT_TTL_S = 0.02
"""How long the self-series' ``stats()`` snapshot serves a collection async_tee did not start
(a Prometheus scrape): one collection's callbacks run together; scrapes come seconds apart."""


def _non_finite_zeros(instruments: InstrumentRegistry, bound: int) -> dict[str, int]:
    """A 0 for every series values are recorded into, up to ``bound`` of them.

    ``stats()`` and ``async_tee.non_finite{series}`` start from these, so each such series'
    count is exported at 0 from the first export and its first NaN is an increase
    (docs/semantics.md §6).
    """
    created = instruments.instruments(RL_METRIC_GROUP) or {}
    names = (s.spec.name for s in created.values() if s.spec.kind not in OBSERVABLE_KINDS)
    return dict.fromkeys(itertools.islice(dict.fromkeys(names), bound), 0)


def _ranks(settings: Settings) -> dict[str, Any]:
    return {
        **dataclasses.asdict(settings.ranks),
        "export_ranks": settings.export_ranks,
        "exports": settings.exports_from_this_rank,
    }


def _idle_stats(settings: Settings) -> dict[str, Any]:
    """``stats()`` of a session that recorded nothing: every figure zero."""
    return {
        "enqueued": 0,
        "recorded": 0,
        "dropped": 0,
        "pending": 0,
        "capacity": 0,
        "dropped_by_reason": {"overflow": 0, "error": 0, "shutdown": 0, "snapshot": 0},
        "lag_ms": {"p50": 0.0, "p99": 0.0, "max": 0.0, "samples": 0},
        "values_skipped": dict.fromkeys(SKIP_REASONS, 0),
        "non_finite_by_series": {},
        "errors": {"tee": 0, "registry": 0},
        "exports": {"success": 0, "failure": 0},
        "exports_by_trigger": {trigger: {"success": 0, "failure": 0} for trigger in TRIGGERS},
        "steps": {"last": None, "completed": 0, "exported": 0, "coalesced": 0, "unusable": 0},
        "exporting": False,
        "exporters": {},
        "ranks": _ranks(settings),
        "worker_died": 0,
        "export_thread_died": 0,
    }


class DisabledSession:
    """A session that is off: the tee stays a no-op, every figure is zero.

    What ``start_telemetry`` returns when telemetry is disabled, when
    ``ASYNC_TEE_EXPORT_RANKS`` leaves this rank out, or when starting failed (warned once).
    It has the reading side of a :class:`Pipeline`; flushing and shutting it down succeed
    at once, with nothing to do.
    """

    is_exporting = False
    meter: Meter | None = None
    meter_provider: MeterProvider | None = None
    prometheus_address: tuple[str, int] | None = None

    def __init__(self, settings: Settings) -> None:
        """A session that is off under ``settings``."""
        self.settings = settings

    @property
    def threads(self) -> list[threading.Thread]:
        """No thread runs."""
        return []

    @property
    def exporters(self) -> list[ExporterState]:
        """No exporter was built."""
        return []

    def stats(self, lag_percentiles: bool = True) -> dict[str, Any]:
        """Every figure zero; ``ranks`` says which rank this is and whether it exports."""
        return _idle_stats(self.settings)

    def flush(self, timeout_s: float) -> bool:
        """Nothing to record."""
        return True

    async def aflush(self, timeout_s: float) -> bool:
        """Nothing to record."""
        return True

    def flush_and_export(self, timeout_s: float) -> bool:
        """Nothing to export."""
        return True

    def shutdown(self, timeout_s: float) -> bool:
        """Nothing to deliver."""
        return True


NO_SESSION = DisabledSession(Settings())
"""What ``stats()`` reads before any session started."""


class Pipeline:
    """A running telemetry session: ``start_telemetry`` returns it, ``shutdown_telemetry`` ends it.

    Attributes:
        settings: The effective configuration.
        meter_provider: The provider recorded into.
        owns_provider: Whether async_tee built the provider (and so shuts it down).
        meter: async_tee's meter on that provider.
        instruments: The meter's instrument registry (per-session counts).
        recorder: Maps and records snapshots (per-session counter de-duplication).
        policy: When completed steps are exported.
        steps: The step clock: completes steps, records ``rl.step``, drives step exports.
        queue: The hand-off queue the tee puts on while this session runs.
        worker: The worker draining it.
        export_counts: Export attempts of the provider async_tee built, by trigger, result.
    """

    def __init__(
        self,
        settings: Settings,
        built: BuiltProvider,
        export_counts: ExportCounts,
        policy: StepPolicy,
    ) -> None:
        """Assemble a session over a provider; only :meth:`open` calls this.

        Raises:
            RuntimeError: The ``rl`` metric group could not be registered.
            Exception: Whatever the SDK raises creating the instruments.
        """
        self.settings = settings
        self.meter_provider: MeterProvider = built.provider
        self.owns_provider = built.owned
        self._built = built
        self.export_counts = export_counts
        self.policy = policy
        self.meter: Meter = self.meter_provider.get_meter("async_tee", __version__)
        self.instruments: InstrumentRegistry = instrument_registry(self.meter)
        self.instruments.begin_session(settings.max_attribute_sets)
        self.instruments.create(_series.SELF_METRIC_GROUP)
        if not ensure_metric_group_registered():
            raise RuntimeError("the rl metric group could not be registered (warned above)")
        self.instruments.create(RL_METRIC_GROUP)
        self._non_finite_zeros = _non_finite_zeros(self.instruments, settings.max_attribute_sets)
        if settings.encoder == "tables":
            self._use_tables(built)
        self.recorder = RLRecorder.for_meter(self.meter)  # over this meter's registry, above
        self._step_reader = built.step_reader
        self.steps = self._new_step_clock()
        self.queue, self.worker = self._new_worker()
        self._signals = SignalFlush(
            self.shutdown, self.flush_and_export, settings.shutdown_timeout_s
        )
        self._checked_at = 0  # the completed-step count at the last signal check
        self._redactor: RedactSecrets | None = None  # the filter hiding settings.secrets
        self._closed = False
        self._lag_values: dict[str, float] = {}
        self._snapshot: tuple[int, float, dict[str, Any]] | None = None

    def _use_tables(self, built: BuiltProvider) -> None:
        """OTLP exports built from the tables (``ASYNC_TEE_ENCODER=tables``), where they can be."""
        from async_tee._table_encode import TableEncoder  # the OTLP proto loads here

        resource = getattr(getattr(built.provider, "_sdk_config", None), "resource", None)
        for reader in built.push_readers:
            if reader.name == "otlp" and reader.takes_requests and resource is not None:
                reader.use_tables(
                    TableEncoder(
                        self.instruments,
                        (_series.SELF_METRIC_GROUP, RL_METRIC_GROUP),
                        resource,
                        "async_tee",
                        __version__,
                    )
                )

    @classmethod
    def open(cls, settings: Settings, meter_provider: MeterProvider | None = None) -> Pipeline:
        """Open a running session: build or adopt the provider, start the worker, the signals.

        The tee is not pointed at it yet: ``start_telemetry`` does that.

        Args:
            settings: The effective configuration.
            meter_provider: A provider to record into (yours to shut down); None builds one
                from ``settings``, which the session shuts down.

        Raises:
            RuntimeError: The worker did not start, or the ``rl`` group is unavailable.
            Exception: Whatever the SDK raises on a bad setting. Nothing is left running.
        """
        redactor = redacting(settings.secrets)  # before the SDK can log the endpoint
        counts = ExportCounts()
        policy = StepPolicy(
            min_interval_s=settings.min_export_interval_s,
            export_interval_s=settings.export_interval_ms / 1000.0,
        )
        try:
            if meter_provider is None:
                built = build_meter_provider(settings, policy, counts)
            else:
                built = BuiltProvider.adopted(meter_provider)
        except BaseException:
            stop_redacting(redactor)
            raise
        try:
            session = cls(settings, built, counts, policy)
            if not session.worker.start():
                raise RuntimeError("the worker did not start")
        except BaseException:
            if built.owned:
                with contextlib.suppress(Exception):
                    built.provider.shutdown(timeout_millis=1000)  # type: ignore[attr-defined]
                close_servers(built.started.servers)
            stop_redacting(redactor)
            raise
        session._redactor = redactor
        session._signals.install(settings.flush_signals)
        return session

    def _new_step_clock(self) -> StepClock:
        return StepClock(self.recorder.record_step, self._step_reader, self.policy)

    def _new_worker(self) -> tuple[DropOldestQueue[Snapshot], Worker]:
        """A fresh queue and a worker for it, not started."""
        from async_tee._worker import Worker  # asyncio loads here, not at import async_tee

        queue: DropOldestQueue[Snapshot] = DropOldestQueue(self.settings.queue_size)
        worker = Worker(
            queue,
            self._process,
            self.settings.drain_interval_s,
            self._on_lag,
            self._after_drain,
            self._on_worker_death,
            trickle_interval_s=self.policy.trickle_interval_s(self._step_reader is not None),
        )
        queue.on_high_water = worker.wake
        return queue, worker

    @property
    def snapshot_keys(self) -> Mapping[str | None, tuple[str, ...] | None]:
        """Every prefix the worker reads, with the keys the caller snapshots (``MappingPlan``)."""
        return self.recorder.plan.snapshot_keys

    @property
    def is_open(self) -> bool:
        """Whether the session has not been shut down."""
        return not self._closed

    # ------------------------------------------------------------------ lifecycle

    def _detach(self) -> None:
        """Turn the tee off if it points at this session (it stops enqueuing at once)."""
        if _caller.attached() is self.queue:
            _caller.attach(None)

    def shutdown(self, timeout_s: float) -> bool:
        """Stop teeing, drain, then shut down the provider async_tee built, within ``timeout_s``.

        Half the budget at most goes to draining; the rest is the final export's. The
        session is closed for good: ``start_telemetry`` then starts a new one. A second
        call returns True at once.

        Returns:
            Whether everything was delivered (see ``shutdown_telemetry``).
        """
        if self._closed:
            return True
        self._closed = True
        self._detach()
        deadline = time.monotonic() + max(0.0, timeout_s)
        recorded = self.worker.stop(max(0.0, (deadline - time.monotonic()) / 2))
        if not self.worker.thread.is_alive():
            self.steps.close()  # the last step completes; the final export carries it
        delivered = self._shutdown_provider(deadline) and recorded
        stop_redacting(self._redactor)
        self._signals.restore()  # what the session changed, where it still holds
        return delivered

    def release_signals(self) -> None:
        """Restore the signal handlers where ours hold (shutdown can't off the main thread)."""
        self._signals.restore()

    def _shutdown_provider(self, deadline: float) -> bool:
        """Shut down a provider async_tee built, within ``deadline`` even if the SDK is not."""
        built = self._built
        if not built.owned:
            return True
        provider = built.provider
        before = self.export_counts.totals()
        # Delivery needs evidence: the final export (made by provider.shutdown) succeeded. A
        # reader stuck in an earlier export never makes it, and then nothing was delivered.
        pushes = any(EXPORTER_KINDS[state.name].pushed for state in self.exporters)
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
        close_servers(built.started.servers)
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

    def _process(self, snapshot: Snapshot) -> None:
        """Record one snapshot (the worker's callback); a teed one passes the step clock."""
        if len(snapshot) == 5:
            metrics, prefix, raw_step, finished, enqueued_ns = snapshot
            steps = self.steps
            # A number or None, never an array to store; numbered here when no caller passes one.
            step, ends = steps.step_of(raw_step, prefix, finished)
            steps.before(step, enqueued_ns)
            if metrics is not None:  # None: a bare end-of-step marker
                metrics = _caller.as_dict(metrics)
                if _caller.LEFT_OUT in metrics:
                    count_skipped(self.recorder.skipped, LEFT_OUT, metrics.pop(_caller.LEFT_OUT))
                if prefix in READ_WHOLE:  # copied whole: keys as the caller made them
                    metrics = exact_str_keys(metrics)
                recorder = self.recorder
                recorder.probing = steps.probing
                recorder.tee(metrics, prefix, step, steps.is_stale(step))
                if recorder.unmarked:  # the loop ends no step with a step-ending dict
                    steps.stop_numbering()
                    recorder.probing = recorder.unmarked = False
            if ends:
                steps.finished(step)
        else:
            self.recorder.record(snapshot[0], snapshot[1])

    def _after_drain(self, flushing: bool = False) -> float | None:
        """Let the step clock settle and export; seconds until it needs the worker again.

        ``flushing``: a flush waits on this drain, which completes a finished step now. At
        each completed step the signal handlers are checked (one read each).
        """
        wait = self.steps.tick(settle_now=flushing)
        if self.steps.completed != self._checked_at:
            self._checked_at = self.steps.completed
            self._signals.check()
        return wait

    def _on_worker_death(self) -> None:
        """The worker's loop ended unstopped: stop enqueuing into a queue nobody drains."""
        self._detach()
        warn_once(
            "worker:died",
            "async_tee: the worker stopped unexpectedly; the tee is off for this session "
            "(stats()['worker_died'], async_tee.worker.died)",
        )

    def _on_lag(self, lag_ms: float) -> None:
        """Record one drain's enqueue-to-record lag."""
        self._lag_values[_series.LAG_KEY] = lag_ms
        self.instruments.record(_series.SELF_METRIC_GROUP, self._lag_values)

    # ------------------------------------------------------------------ reading it

    @property
    def is_exporting(self) -> bool:
        """Whether the tee is live and has somewhere to export.

        False after shutdown, when the worker died, when every exporter asked for failed
        to start, and while every one that started is failing (``FAILING_AFTER`` exports
        in a row failed): the tee still records then, so ``stats()`` counts on, but
        nothing leaves the process.
        """
        live = _caller.attached() is self.queue
        exporters = self.exporters
        failing = self._failing()
        return live and (
            not exporters or any(state.started and state.name not in failing for state in exporters)
        )

    def _exporter_states(self) -> dict[str, dict[str, str]]:
        """``stats()["exporters"]``: each one's state, ``failing`` with its last error."""
        states = {state.name: state.as_dict() for state in self.exporters}
        for name, error in self._failing().items():
            if name in states:
                states[name] = {**states[name], "state": "failing", "error": error}
        return states

    def _failing(self) -> dict[str, str]:
        """The exporters whose last exports all failed, with why the last one did."""
        return {
            reader.name: reader.last_error or "the exporter logged no reason"
            for reader in self._built.push_readers
            if reader.failing
        }

    @property
    def exporters(self) -> Sequence[ExporterState]:
        """Each exporter async_tee was asked to build, and whether it started.

        Empty for a provider passed in, and for ``OTEL_METRICS_EXPORTER=none``.
        """
        return self._built.exporters

    @property
    def prometheus_address(self) -> tuple[str, int] | None:
        """``(host, port)`` a pulled exporter (Prometheus) serves ``/metrics`` on, if it started.

        With port 0 this is the port the system chose.
        """
        for state in self.exporters:
            if not EXPORTER_KINDS[state.name].pushed and state.started:
                host, _, port = state.where.rpartition(":")
                return host, int(port)
        return None

    @property
    def threads(self) -> list[threading.Thread]:
        """The threads this session started: the worker, the provider's readers, servers."""
        return [self.worker.thread, *self._built.threads]

    def flush_and_export(self, timeout_s: float) -> bool:
        """Record everything queued, then export it now, all within ``timeout_s``.

        The push exporters of a provider async_tee built export at once (bounded); a
        provider passed in is only recorded into. The session goes on.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        done = self.flush(timeout_s / 2)
        for reader in self._built.push_readers:
            remaining_ms = max(0.0, deadline - time.monotonic()) * 1000
            done = reader.force_flush(remaining_ms) and done
        return done

    def flush(self, timeout_s: float) -> bool:
        """Wait until every snapshot put before this call is recorded (see ``flush``)."""
        return self.worker.flush(timeout_s)

    async def aflush(self, timeout_s: float) -> bool:
        """``flush`` for a coroutine: awaits instead of blocking its loop."""
        return await self.worker.aflush(timeout_s)

    def stats(self, lag_percentiles: bool = True) -> dict[str, Any]:
        """This session's figures (see ``async_tee.stats``); the lag sort is optional."""
        worker = self.worker
        lags = sorted(worker.lags_ms) if lag_percentiles else []

        def pick(q: float) -> float:  # nearest rank, as the demo and benchmarks report
            return lags[max(0, math.ceil(q * len(lags)) - 1)] if lags else 0.0

        return {
            **self._counts(),
            "lag_ms": {
                "p50": pick(0.5),
                "p99": pick(0.99),
                "max": worker.max_lag_ms,
                "samples": len(lags),
            },
            "exporting": self.is_exporting,
            "exporters": self._exporter_states(),
            "ranks": _ranks(self.settings),
        }

    def _counts(self) -> dict[str, Any]:
        """The counts of ``stats()``: what the ``async_tee.*`` series read."""
        worker, queue = self.worker, self.queue
        counts = worker.counts
        # A dict whose snapshot failed on the caller's side was handed over and dropped.
        snapshot_failures = queue.caller_errors
        enqueued = queue.enqueued() + snapshot_failures
        dropped_by_reason = {
            "overflow": counts.overflow,
            "error": counts.errors,
            "shutdown": counts.shutdown,
            "snapshot": snapshot_failures,
        }
        if worker.abandoned:  # shut down with the worker stuck: nothing pending will be recorded
            dropped_by_reason["shutdown"] += (
                enqueued - counts.recorded - sum(dropped_by_reason.values())
            )
        dropped = sum(dropped_by_reason.values())
        rc: RegistryCounts = self.instruments.counts
        return {
            "enqueued": enqueued,
            "recorded": counts.recorded,
            "dropped": dropped,
            "pending": enqueued - counts.recorded - dropped,
            "capacity": queue.capacity,
            "dropped_by_reason": dropped_by_reason,
            "values_skipped": {
                **dict.fromkeys(SKIP_REASONS, 0),
                **self.recorder.skipped,
                "non_finite": rc.non_finite,
                "rejected": rc.rejected,
                "cardinality": rc.cardinality,
            },
            "non_finite_by_series": {**self._non_finite_zeros, **rc.non_finite_by_series},
            "errors": {"tee": queue.caller_errors, "registry": rc.errors},
            "exports": self.export_counts.totals(),
            "exports_by_trigger": self.export_counts.snapshot(),
            "steps": self.steps.stats(),
            "worker_died": int(worker.died),
            "export_thread_died": int(self._export_thread_died()),
        }

    def export_stats(self) -> dict[str, Any]:
        """``stats()`` as the ``async_tee.*`` callbacks read it: one snapshot per collection.

        A collection runs a dozen self-series callbacks in a row; the snapshot is taken by
        the first and reused by the rest, until async_tee's reader starts its next
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
        stats = self._counts()  # the series read no lag, exporter state or rank
        self._snapshot = (collection, now, stats)
        return stats

    def _export_thread_died(self) -> bool:
        """Whether an exporting thread ended while its session still runs (never expected)."""
        readers = self._built.push_readers
        return any(not r.thread.is_alive() and not r.stopped for r in readers)

    # ------------------------------------------------------------------ fork (_telemetry's hooks)

    def _before_fork(self) -> None:
        """Let the worker finish its batch, so the child inherits no lock it holds."""
        self.worker.busy.acquire(timeout=FORK_PAUSE_S)

    def _after_fork_in_parent(self) -> None:
        """Let the worker go on."""
        if self.worker.busy.locked():
            with contextlib.suppress(RuntimeError):
                self.worker.busy.release()

    def _after_fork_in_child(self) -> bool:
        """Go on as the child's own session: a fresh queue, worker, counts and step memory.

        Nothing of the parent's queue is replayed, and the parent's last values were
        dropped with the registry's tables, so the child exports only what it records.

        Returns:
            Whether the child's worker runs (then ``_telemetry`` points the tee at it).
        """
        if self._closed:
            return False
        self.instruments.counts = RegistryCounts()
        self.recorder.counted = CountedSteps()
        self.recorder.skipped = {}
        self.export_counts.reset()
        self._snapshot = None
        self.steps = self._new_step_clock()
        self._signals.after_fork_in_child()
        try:
            self.queue, self.worker = self._new_worker()
            return self.worker.start()
        except Exception:  # noqa: BLE001 - a fork must never fail because of telemetry
            warn_once("fork", "async_tee: could not restart the worker after fork")
            return False

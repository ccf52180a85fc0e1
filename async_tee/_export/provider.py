"""The ``MeterProvider`` built from ``Settings``, and its exports (docs/semantics.md §7, §9)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any, cast

from async_tee._declare.groups import RL_METRIC_GROUP
from async_tee._declare.series import SELF_METRIC_GROUP
from async_tee._export.delivery import ExportCounts
from async_tee._export.exporters import EXPORTER_KINDS, ExporterState, Started, close_servers
from async_tee._reporting import logger, warn_once
from async_tee._settings import Settings
from async_tee._version import __version__
from async_tee._worker.steps import StepPolicy

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter, MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader

    from async_tee._export.reader import ExportingReader
    from async_tee._tables.registry import InstrumentRegistry


SCOPE = "async_tee"
"""The instrumentation scope (meter name) async_tee records under, and exports as."""


class Exports:
    """A session's provider and what async_tee started for it; the health of its exports.

    For a provider passed in (``owned`` False, any API provider) there are no readers,
    servers or exporters: it is yours. One async_tee built is the SDK's, and its push
    exports are counted into :attr:`counts` by trigger and result: the evidence behind
    "delivered" (docs/semantics.md §7).
    """

    def __init__(
        self,
        provider: MeterProvider,
        readers: list[MetricReader],
        started: Started,
        exporters: list[ExporterState],
        counts: ExportCounts,
        policy: StepPolicy,
        owned: bool = True,
    ) -> None:
        self.provider = provider
        self.policy = policy
        self.readers = readers
        self.started = started
        self.exporters = exporters
        self.counts = counts
        self.owned = owned

    @classmethod
    def adopted(cls, provider: MeterProvider, settings: Settings) -> Exports:
        """A provider passed in: async_tee records into it and starts nothing of its own."""
        return cls(provider, [], Started(), [], ExportCounts(), step_policy(settings), owned=False)

    def meter(self) -> Meter:
        """async_tee's meter on the provider."""
        return self.provider.get_meter(SCOPE, __version__)

    @property
    def threads(self) -> list[threading.Thread]:
        """The threads the provider's readers and servers run on."""
        readers = [getattr(reader, "thread", None) for reader in self.readers]
        found = [t for t in readers if isinstance(t, threading.Thread)]
        return found + self.started.threads

    @property
    def push_readers(self) -> list[ExportingReader]:
        """The readers with an exporting thread of async_tee's (OTLP, console)."""
        return [
            cast("ExportingReader", reader)
            for reader in self.readers
            if getattr(reader, "step_aligned", None) is not None
        ]

    @property
    def step_reader(self) -> ExportingReader | None:
        """The reader the worker drives at step boundaries, if any (OTLP, step export on)."""
        return next((reader for reader in self.push_readers if reader.step_aligned), None)

    def use_tables(self, instruments: InstrumentRegistry) -> None:
        """Build OTLP exports from async_tee's own tables where they can (``ASYNC_TEE_ENCODER``)."""
        from async_tee._export.table_encode import TableEncoder  # the OTLP proto loads here

        resource = getattr(getattr(self.provider, "_sdk_config", None), "resource", None)
        for reader in self.push_readers:
            if reader.name == "otlp" and reader.takes_requests and resource is not None:
                reader.use_tables(
                    TableEncoder(
                        instruments,
                        (SELF_METRIC_GROUP, RL_METRIC_GROUP),
                        resource,
                        SCOPE,
                        __version__,
                    )
                )

    def failing(self) -> dict[str, str]:
        """The exporters whose last exports all failed, with why the last one did."""
        return {
            reader.name: reader.last_error or "the exporter logged no reason"
            for reader in self.push_readers
            if reader.failing
        }

    @property
    def working(self) -> bool:
        """Whether something can leave the process.

        True with no exporter asked for (a provider of yours), or one that started and is
        not failing (``FAILING_AFTER`` exports in a row failed).
        """
        failing = self.failing()
        return not self.exporters or any(
            state.started and state.name not in failing for state in self.exporters
        )

    def states(self) -> dict[str, dict[str, str]]:
        """``stats()["exporters"]``: each one's state, ``failing`` with its last error."""
        states = {state.name: state.as_dict() for state in self.exporters}
        for name, error in self.failing().items():
            if name in states:
                states[name] = {**states[name], "state": "failing", "error": error}
        return states

    @property
    def prometheus_address(self) -> tuple[str, int] | None:
        """``(host, port)`` a pulled exporter (Prometheus) serves ``/metrics`` on, if it started."""
        for state in self.exporters:
            if not EXPORTER_KINDS[state.name].pushed and state.started:
                host, _, port = state.where.rpartition(":")
                return host, int(port)
        return None

    def figures(self) -> dict[str, Any]:
        """The exports' part of ``stats()``: attempts by result and trigger, a dead thread."""
        readers = self.push_readers
        return {
            "exports": self.counts.totals(),
            "exports_by_trigger": self.counts.snapshot(),
            "export_thread_died": int(
                any(not r.thread.is_alive() and not r.stopped for r in readers)
            ),
        }

    def export_now(self, deadline: float) -> bool:
        """Export what is recorded now on every push reader, by ``deadline`` (monotonic)."""
        done = True
        for reader in self.push_readers:
            remaining_ms = max(0.0, deadline - time.monotonic()) * 1000
            done = reader.force_flush(remaining_ms) and done
        return done

    def shutdown(self, deadline: float) -> bool:
        """Shut down a provider async_tee built by ``deadline`` (monotonic), even if the SDK is not.

        Returns:
            Whether delivery has evidence: the final export (made by the provider's shutdown)
            succeeded, no export failed meanwhile, and every exporter asked for started. A
            reader stuck in an earlier export never makes it, and then nothing was delivered.
        """
        if not self.owned:
            return True
        provider = self.provider
        before = self.counts.totals()
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
        close_servers(self.started.servers)
        after = self.counts.totals()
        exported = not pushes or after["success"] > before["success"]
        every_one_started = all(state.started for state in self.exporters)
        return (
            bool(outcome and outcome[0])
            and exported
            and after["failure"] == before["failure"]
            and every_one_started
        )

    def after_fork_in_child(self) -> None:
        """The child's own counts, and its own exporting threads (``fork`` kept none)."""
        self.counts.reset()
        for reader in self.push_readers:
            reader.after_fork_in_child()

    def close_unopened(self) -> None:
        """A session that failed to open: shut down what was built here at once."""
        if self.owned:
            with contextlib.suppress(Exception):
                self.provider.shutdown(timeout_millis=1000)  # type: ignore[attr-defined]
            close_servers(self.started.servers)


def _readers(
    settings: Settings,
    policy: StepPolicy,
    counts: ExportCounts,
    started: Started,
    exporters: list[ExporterState],
) -> list[MetricReader]:
    from async_tee._export.reader import ExportingReader

    readers: list[MetricReader] = []
    for name in settings.exporters:
        kind = EXPORTER_KINDS.get(name)
        if kind is None:  # "none"
            continue
        reader, state = kind.build(settings, started)
        if reader is not None and kind.pushed:
            reader = ExportingReader(
                reader,
                policy=policy,
                timeout_s=settings.export_timeout_ms / 1000.0,
                counts=counts,
                step_aligned=kind.step_export and settings.step_export,
                name=name,
            )
        exporters.append(state)
        if reader is not None:
            readers.append(reader)
    return readers


def step_policy(settings: Settings) -> StepPolicy:
    """The step-export numbers ``settings`` give."""
    return StepPolicy(
        min_interval_s=settings.min_export_interval_s,
        export_interval_s=settings.export_interval_ms / 1000.0,
    )


def build_exports(settings: Settings) -> Exports:
    """Build a provider with the readers ``settings`` name, or none for ``none``.

    Every push export's result is counted into the exports' ``counts``, by trigger.

    Raises:
        Exception: Whatever the SDK raises on a bad setting; the session's ``open``
            closes what was started and raises it on.
    """
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create(dict(settings.resource_attributes))
    policy = step_policy(settings)
    counts = ExportCounts()
    started = Started()
    exporters: list[ExporterState] = []
    try:
        readers = _readers(settings, policy, counts, started, exporters)
        logger.debug("async_tee: built %d metric reader(s)", len(readers))
        provider = MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=False)
    except BaseException:
        close_servers(started.servers)  # no server outlives a provider that was never built
        raise
    return Exports(provider, readers, started, exporters, counts, policy)

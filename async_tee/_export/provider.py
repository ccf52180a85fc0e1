"""The ``MeterProvider`` built from ``Settings``, and its exports (docs/semantics.md §7, §9)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any

from async_tee._declare.groups import RL_METRIC_GROUP
from async_tee._declare.series import SELF_METRIC_GROUP
from async_tee._export.delivery import Backlog, ExportCounts
from async_tee._export.exporters import EXPORTER_KINDS, ExporterState, Started, close_servers
from async_tee._reporting import logger, warn_once
from async_tee._settings import Settings
from async_tee._version import __version__
from async_tee._worker.steps import StepPolicy

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter, MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource

    from async_tee._export.sender import OtlpSender
    from async_tee._tables.registry import InstrumentRegistry


SCOPE = "async_tee"
"""The instrumentation scope (meter name) async_tee records under, and exports as."""


class Exports:
    """A session's provider and what async_tee started for it; the health of its exports.

    For a provider passed in (``owned`` False, any API provider) there are no readers,
    servers or exporters: it is yours. One async_tee built is the SDK's, holding the SDK's
    readers (Prometheus, the console); OTLP is async_tee's own (:attr:`sender`): its requests
    are built from the tables, queued and delivered in order, each send counted into
    :attr:`counts` by trigger and result: the evidence behind "delivered" (docs/semantics.md §7).
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
        sender: OtlpSender | None = None,
        resource: Resource | None = None,
    ) -> None:
        self.provider = provider
        self.policy = policy
        self.readers = readers
        self.started = started
        self.exporters = exporters
        self.counts = counts
        self.owned = owned
        self.sender = sender
        self.resource = resource

    @classmethod
    def adopted(cls, provider: MeterProvider, settings: Settings) -> Exports:
        """A provider passed in: async_tee records into it and starts nothing of its own."""
        return cls(provider, [], Started(), [], ExportCounts(), step_policy(settings), owned=False)

    def meter(self) -> Meter:
        """async_tee's meter on the provider."""
        return self.provider.get_meter(SCOPE, __version__)

    @property
    def threads(self) -> list[threading.Thread]:
        """The threads async_tee started for the exports: the exporting thread, the servers'."""
        sender = [self.sender.thread] if self.sender is not None else []
        return sender + self.started.threads

    @property
    def step_reader(self) -> OtlpSender | None:
        """What the worker drives at step boundaries, if anything (OTLP, step export on)."""
        sender = self.sender
        return sender if sender is not None and sender.step_aligned else None

    def use_tables(self, instruments: InstrumentRegistry) -> None:
        """Build OTLP's requests from the session's tables."""
        from async_tee._export.encode import TableEncoder  # the OTLP proto loads here

        if self.sender is not None and self.resource is not None:
            self.sender.use_tables(
                TableEncoder(
                    instruments,
                    (SELF_METRIC_GROUP, RL_METRIC_GROUP),
                    self.resource,
                    SCOPE,
                    __version__,
                )
            )

    def failing(self) -> dict[str, str]:
        """The exporters whose last sends all failed, with why the last one did."""
        sender = self.sender
        if sender is None or not sender.failing:
            return {}
        return {sender.name: sender.last_error or "the transport gave no reason"}

    @property
    def working(self) -> bool:
        """Whether something can leave the process.

        True with no exporter asked for (a provider of yours), or one that started and is
        not failing (``FAILING_AFTER`` sends in a row failed).
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
        """``(host, port)`` a scraped exporter (Prometheus) serves ``/metrics`` on, if started."""
        for state in self.exporters:
            if EXPORTER_KINDS[state.name].serves and state.started:
                host, _, port = state.where.rpartition(":")
                return host, int(port)
        return None

    def figures(self) -> dict[str, Any]:
        """The exports' part of ``stats()``: sends by result and trigger, the backlog."""
        sender = self.sender
        return {
            "exports": self.counts.totals(),
            "exports_by_trigger": self.counts.snapshot(),
            "delivery": sender.backlog.figures() if sender is not None else idle_delivery(),
            "export_thread_died": int(
                sender is not None and not sender.thread.is_alive() and not sender.stopped
            ),
        }

    def export_now(self, deadline: float) -> bool:
        """Export what is recorded now and wait for its delivery, by ``deadline`` (monotonic).

        The SDK's readers (the console) are flushed too; only OTLP's answer is evidence.
        """
        sender = self.sender
        if sender is None:
            return True
        return sender.force_flush(max(0.0, deadline - time.monotonic()))

    def shutdown(self, deadline: float) -> bool:
        """Shut down what async_tee built by ``deadline`` (monotonic), even if the SDK is not.

        Returns:
            Whether delivery has evidence: every OTLP request of the session (the final one
            included) was delivered, the provider's shutdown returned in time without
            raising, and every exporter asked for started.
        """
        if not self.owned:
            return True
        provider = self.provider
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
        delivered = self.sender.shutdown(deadline) if self.sender is not None else True
        thread.join(max(0.0, deadline - time.monotonic()))
        close_servers(self.started.servers)
        every_one_started = all(state.started for state in self.exporters)
        return bool(outcome and outcome[0]) and delivered and every_one_started

    def after_fork_in_child(self) -> None:
        """The child's own counts, and its own exporting thread (``fork`` kept none)."""
        self.counts.reset()
        if self.sender is not None:
            self.sender.after_fork_in_child()

    def close_unopened(self) -> None:
        """A session that failed to open: shut down what was built here at once."""
        if self.owned:
            if self.sender is not None:
                self.sender.shutdown(time.monotonic() + 1.0)
            with contextlib.suppress(Exception):
                self.provider.shutdown(timeout_millis=1000)  # type: ignore[attr-defined]
            close_servers(self.started.servers)


def idle_delivery() -> dict[str, Any]:
    """``stats()["delivery"]`` with no OTLP exporter: nothing queued, nothing delivered."""
    return Backlog(0).figures()


def _build(
    settings: Settings,
    policy: StepPolicy,
    counts: ExportCounts,
    started: Started,
    exporters: list[ExporterState],
) -> tuple[list[MetricReader], OtlpSender | None]:
    """The SDK's readers and async_tee's OTLP sender ``settings`` name."""
    from async_tee._export.sender import OtlpSender

    readers: list[MetricReader] = []
    sender: OtlpSender | None = None
    for name in settings.exporters:
        kind = EXPORTER_KINDS.get(name)
        if kind is None:  # "none"
            continue
        built, state = kind.build(settings, started)
        exporters.append(state)
        if built is None:
            continue
        if kind.pushed:
            transport, make_transport = built
            sender = OtlpSender(
                transport,
                make_transport,
                policy=policy,
                timeout_s=settings.otlp_timeout_s,
                collect_timeout_s=settings.export_timeout_ms / 1000.0,
                counts=counts,
                max_bytes=settings.export_backlog_bytes,
                step_aligned=kind.step_export and settings.step_export,
                name=name,
            )
        else:
            readers.append(built)
    return readers, sender


def step_policy(settings: Settings) -> StepPolicy:
    """The step-export numbers ``settings`` give."""
    return StepPolicy(
        min_interval_s=settings.min_export_interval_s,
        export_interval_s=settings.export_interval_ms / 1000.0,
    )


def build_exports(settings: Settings) -> Exports:
    """Build a provider with the readers ``settings`` name, or none for ``none``.

    Every OTLP send's result is counted into the exports' ``counts``, by trigger.

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
    sender = None
    try:
        readers, sender = _build(settings, policy, counts, started, exporters)
        logger.debug("async_tee: built %d SDK metric reader(s)", len(readers))
        provider = MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=False)
    except BaseException:
        close_servers(started.servers)  # no server outlives a provider that was never built
        if sender is not None:
            sender.shutdown(time.monotonic())
        raise
    return Exports(provider, readers, started, exporters, counts, policy, True, sender, resource)

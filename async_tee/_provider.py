"""Build an OpenTelemetry ``MeterProvider`` from ``Settings`` (the standard ``OTEL_*`` variables).

Imported only when a session opens: this is where the SDK is loaded. Each exporter the
settings name is built by its row of ``_exporters.EXPORTER_KINDS``; a pushed one runs on an
:class:`~async_tee._export.ExportingReader`, driven by completed steps too when its row
says so. The provider is built with ``shutdown_on_exit=False``: the SDK's own exit hook can
delay exit against a stalled collector, so async_tee registers its own, bounded one.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, cast

from async_tee._exporters import EXPORTER_KINDS, ExporterState, Started, close_servers
from async_tee._policy import StepPolicy
from async_tee._reporting import logger
from async_tee._settings import Settings

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader

    from async_tee._delivery import ExportCounts
    from async_tee._export import ExportingReader


@dataclasses.dataclass
class BuiltProvider:
    """A session's provider, with what async_tee started for it: readers, servers, exporters.

    For a provider passed in (``owned`` False, any API provider) all three are empty: it
    is yours. One async_tee built is the SDK's.
    """

    provider: MeterProvider
    readers: list[MetricReader]
    started: Started
    exporters: list[ExporterState] = dataclasses.field(default_factory=list)
    owned: bool = True

    @classmethod
    def adopted(cls, provider: MeterProvider) -> BuiltProvider:
        """A provider passed in: async_tee records into it and starts nothing of its own."""
        return cls(provider, [], Started(), owned=False)

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


def _readers(
    settings: Settings,
    policy: StepPolicy,
    counts: ExportCounts,
    started: Started,
    exporters: list[ExporterState],
) -> list[MetricReader]:
    from async_tee._export import ExportingReader

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


def build_meter_provider(
    settings: Settings, policy: StepPolicy, counts: ExportCounts
) -> BuiltProvider:
    """Build a provider with the readers ``settings`` name, or none for ``none``.

    Every push export's result is counted into ``counts``, by trigger.

    Raises:
        Exception: Whatever the SDK raises on a bad setting; the session's ``open``
            closes what was started and raises it on.
    """
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create(dict(settings.resource_attributes))
    started = Started()
    exporters: list[ExporterState] = []
    try:
        readers = _readers(settings, policy, counts, started, exporters)
        logger.debug("async_tee: built %d metric reader(s)", len(readers))
        provider = MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=False)
    except BaseException:
        close_servers(started.servers)  # no server outlives a provider that was never built
        raise
    return BuiltProvider(provider, readers, started, exporters)

"""The exporting reader's own rules, on the real ``ExportingReader`` with an exporter that blocks
until released (an event, not a sleep), as the OTel SDK tests its reader."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

from async_tee._export.delivery import ExportCounts
from async_tee._worker.steps import StepPolicy


class BlockingExporter(MetricExporter):
    """Each export blocks until released: an export in flight, as long as the test wants."""

    def __init__(self) -> None:
        super().__init__(preferred_temporality={}, preferred_aggregation={})
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.exports = 0

    def export(
        self, metrics_data: Any, timeout_millis: float = 10_000, **_: Any
    ) -> MetricExportResult:
        self.exports += 1
        self.entered.release()
        self.release.wait(10)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **_: Any) -> None:
        self.release.set()


@pytest.fixture
def blocking_reader():
    from async_tee._export.reader import ExportingReader

    exporter = BlockingExporter()
    counts = ExportCounts()
    reader = ExportingReader(
        exporter,
        policy=StepPolicy(export_interval_s=3600.0),
        timeout_s=10.0,
        counts=counts,
        step_aligned=True,
    )
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    provider.get_meter("t").create_gauge("g").set(1.0)
    yield reader, exporter, counts
    exporter.release.set()
    provider.shutdown(timeout_millis=10_000)


def test_a_newer_step_replaces_the_export_waiting_behind_the_one_in_flight(blocking_reader):
    reader, exporter, counts = blocking_reader
    assert reader.collect_step()  # step 1: taken by the exporting thread, in flight
    assert exporter.entered.acquire(timeout=10)
    assert reader.collect_step()  # step 2: waits behind it
    assert reader.collect_step()  # step 3: replaces step 2
    assert reader.collect_step()  # step 4: replaces step 3
    assert reader.replaced == 2
    exporter.release.set()
    assert exporter.entered.acquire(timeout=10)  # step 4's export started
    assert exporter.exports == 2  # steps 1 and 4: one export pending at most
    assert counts.by_trigger["step"]["failure"] == 0

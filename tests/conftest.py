"""Shared fixtures: a clean async_tee per test, real SDK readers, a real OTLP sink."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import load_calls, own_threads
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from async_tee import testing
from async_tee.sink import OtlpSink

# No test reaches the Hugging Face Hub (there is no network): huggingface_hub reads these once,
# when first imported, so they are set before any test module imports transformers or trl.
for _name in ("HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_PROGRESS_BARS"):
    os.environ.setdefault(_name, "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Build the real servers (servers/build, once per machine) before a test that runs them."""
    if any(item.get_closest_marker("servers") for item in items):
        import servers

        if servers.go_found() and not servers.built():
            try:
                servers.build_servers()
            except (OSError, subprocess.CalledProcessError) as exc:  # their tests say so
                print(f"servers/build failed: {exc}", file=sys.stderr)


@pytest.fixture(autouse=True)
def clean_async_tee() -> Iterator[None]:
    """Every test starts with shipped declarations and no telemetry, and leaks no thread."""
    testing.reset()
    yield
    testing.reset()
    leaked = own_threads()
    assert not leaked, f"leaked threads: {leaked}"


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every record async_tee logs, debug included."""
    caplog.set_level(logging.DEBUG, logger="async_tee")
    return caplog


@pytest.fixture
def calls() -> list[dict[str, Any]]:
    return load_calls()


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def provider(reader: InMemoryMetricReader) -> Iterator[MeterProvider]:
    mp = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    yield mp
    testing.reset()
    mp.shutdown()


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink() as s:
        yield s

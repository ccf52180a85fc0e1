"""The demo: a simulated GRPO run through ``Logger``, exported over OTLP (docs/semantics.md §1)."""

from __future__ import annotations

from async_tee.demo.report import render_result
from async_tee.demo.runner import DemoResult, ReceivedSeries, run

__all__ = ["DemoResult", "ReceivedSeries", "render_result", "run"]

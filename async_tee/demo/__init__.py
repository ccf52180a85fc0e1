"""The demo: a simulated GRPO run, logged through ``Logger`` and exported over real OTLP.

``async-tee demo`` runs it. :mod:`~async_tee.demo.runner` makes the calls and gathers what
the sink received; :mod:`~async_tee.demo.simulation` makes the values,
:mod:`~async_tee.demo.timing` times each call, :mod:`~async_tee.demo.report` renders it.
"""

from __future__ import annotations

from async_tee.demo.report import render_result
from async_tee.demo.runner import DemoResult, ReceivedSeries, run

__all__ = ["DemoResult", "ReceivedSeries", "render_result", "run"]

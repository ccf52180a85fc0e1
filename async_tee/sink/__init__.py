"""A real OTLP metrics receiver (gRPC and HTTP) on 127.0.0.1, and its decoded points.

What the test suite, the demo and ``async-tee sink`` export to: :class:`OtlpSink` in
:mod:`~async_tee.sink.receiver`, the decoding of each request into
:class:`ReceivedPoint` rows in :mod:`~async_tee.sink.points`. Needs ``grpcio`` and
``opentelemetry-proto`` (installed with the OTLP exporter).
"""

from __future__ import annotations

from async_tee.sink.points import ReceivedPoint, received_points
from async_tee.sink.receiver import OtlpSink, black_hole

__all__ = ["OtlpSink", "ReceivedPoint", "black_hole", "received_points"]

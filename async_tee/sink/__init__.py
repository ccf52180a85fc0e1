"""A real OTLP metrics receiver (gRPC and HTTP) on 127.0.0.1, and the points it decodes.

Needs ``grpcio`` and ``opentelemetry-proto`` (installed with the OTLP exporter).
"""

from __future__ import annotations

from async_tee.sink.points import ReceivedPoint, received_points
from async_tee.sink.receiver import OtlpSink, black_hole

__all__ = ["OtlpSink", "ReceivedPoint", "black_hole", "received_points"]

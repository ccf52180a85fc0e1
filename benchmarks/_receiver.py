"""A real OTLP receiver in its own process, for the benchmarks (``_common.Receiver``).

Usage: ``python benchmarks/_receiver.py [--stall]``. Starts an ``OtlpSink`` on ephemeral
gRPC and HTTP ports, prints them on stdout (one line: gRPC, then HTTP), optionally stalls
every export, and runs
until its stdin closes (the benchmark closes it, or dies). Running the receiver in another
process keeps its decoding work off the benchmark's GIL.
"""

from __future__ import annotations

import sys

from async_tee.sink import OtlpSink


def main() -> int:
    sink = OtlpSink(grpc_port=0, http_port=0, max_points=10_000).start()
    if "--stall" in sys.argv[1:]:
        sink.stall()
    print(sink.grpc_port, sink.http_port, flush=True)
    try:
        sys.stdin.read()  # returns at EOF: the benchmark closed the pipe or exited
    finally:
        sink.close(timeout_s=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Probe: what ``zip(..., strict=False)`` in the tee costs the caller, without editing the package.

Usage: ``python benchmarks/probe_tee_variants.py [--calls N] [--pace-ms MS]``

Times, interleaved in a random order call by call (so drift hits every variant alike), with
the real pipeline running against an ``OtlpSink`` in another process:

- ``tee_kw``: ``async_tee.tee_rl_metrics_to_otel``'s source with ``strict=False`` passed
  to its ``zip`` call (as before commit fd41f65);
- ``tee_no_kw``: the same source without the keyword (as shipped since fd41f65; what
  ``strict=False`` means is the default, so behaviour and the atomic sequence draw are
  the same);
- ``floor_fn``: a function doing ``deque.append(dict(d))``, the floor with the same call
  overhead as the tee.

Both tee variants are compiled from the installed source against the module's own
globals, so they feed the real queue exactly as the shipped function does.

``zip`` only has a keyword path through ``zip_new``'s ``PyArg_ParseTupleAndKeywords``; the
probe shows what that costs at trainer pace, where caches are cold, and back to back.
"""

from __future__ import annotations

import argparse
import inspect
import random
import sys
import textwrap
import types
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

# Run as a script, this file's directory is on sys.path.
from _blocks import wait_until
from _common import Receiver, load_train_dict, otlp_environ

import async_tee
from async_tee import metrics, testing


def tee_variant(strict_keyword: bool) -> Callable[..., None]:
    """The installed tee's source, with or without ``strict=False``, in the module's globals."""
    source = textwrap.dedent(inspect.getsource(metrics.tee_rl_metrics_to_otel))
    plain = source.replace(", strict=False", "")
    call = "zip((snapshot,), queue.counter)"
    if call not in plain:
        raise SystemExit(f"the tee no longer calls {call}: update this probe")
    if strict_keyword:
        plain = plain.replace(call, call[:-1] + ", strict=False)")
    namespace: dict[str, Any] = {}
    exec(compile(plain, "<tee variant>", "exec"), dict(vars(metrics)), namespace)
    compiled = namespace["tee_rl_metrics_to_otel"]
    name = "tee_kw" if strict_keyword else "tee_no_kw"
    return types.FunctionType(compiled.__code__, vars(metrics), name, compiled.__defaults__)


def floor_function() -> Callable[..., None]:
    append = deque(maxlen=1024).append

    def floor_fn(d: dict[str, Any], prefix: str, step: int) -> None:
        append(dict(d))

    return floor_fn


def run(
    variants: dict[str, Callable[..., None]], d: dict[str, Any], calls: int, pace_ns: int
) -> dict[str, list[int]]:
    """Each call picks the next variant from a shuffled round; returns samples by name."""
    samples: dict[str, list[int]] = {name: [] for name in variants}
    items = list(variants.items())
    order: list[tuple[str, Callable[..., None]]] = []
    pc = perf_counter_ns
    deadline = pc()
    for step in range(calls):
        if not order:
            order = random.sample(items, len(items))
        name, fn = order.pop()
        if pace_ns:
            deadline = wait_until(deadline + pace_ns)
        t0 = pc()
        fn(d, "train", step)
        t1 = pc()
        samples[name].append(t1 - t0)
    return samples


def summary(values: list[int]) -> str:
    values = sorted(values)
    n = len(values)
    picks = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)]
    cells = [f"{label}={values[min(n - 1, int(q * n))] / 1000:8.3f}" for label, q in picks]
    return f"n={n:>7} " + " ".join(cells) + f" max={values[-1] / 1000:9.1f} µs"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=12_000)
    parser.add_argument("--pace-ms", type=float, default=2.0, help="0: back to back")
    args = parser.parse_args()
    d = load_train_dict()
    receiver = Receiver()
    try:
        async_tee.start_telemetry(environ=otlp_environ(receiver.port))
        variants = {
            "tee_kw": tee_variant(strict_keyword=True),
            "tee_no_kw": tee_variant(strict_keyword=False),
            "floor_fn": floor_function(),
        }
        run(variants, d, 600, 0)  # warm-up
        samples = run(variants, d, args.calls, int(args.pace_ms * 1e6))
        print(f"pace {args.pace_ms} ms, real pipeline, interleaved call by call:")
        for name, values in samples.items():
            print(f"  {name:<10} {summary(values)}")
        print(f"  dropped by the queue: {async_tee.stats()['dropped']}")
    finally:
        testing.reset(2.0)
        receiver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

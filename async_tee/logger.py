"""``Logger``, the fan-out a trainer logs through (backends, then the tee), and ``JsonlBackend``.

Your own logger tees by calling ``tee_rl_metrics_to_otel`` last (docs/semantics.md §1).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol, runtime_checkable

from async_tee import metrics as _metrics
from async_tee._reporting import warn_once
from async_tee.vocabulary import as_scalar

__all__ = ["Backend", "JsonlBackend", "Logger"]

MAX_REPR_CHARS = 200
"""Longest ``repr`` a ``JsonlBackend`` line keeps for a value JSON cannot hold."""

_MAX_DEPTH = 32  # nested containers deeper than this (or cyclic) are written as repr


@runtime_checkable
class Backend(Protocol):
    """Anything ``Logger`` can fan a dict out to: one ``log_metrics`` method.

    W&B-, TensorBoard- or MLflow-style loggers plug in through a small adapter with this
    method. It runs on the caller's thread; whatever it raises reaches the caller.
    """

    def log_metrics(
        self,
        metrics: dict[str, Any],
        step: int,
        prefix: str = "",
        step_metric: str | None = None,
        step_finished: bool = False,
    ) -> None:
        """Log one dict of metrics for ``step`` under ``prefix``."""


class Logger:
    """Fans each metrics dict out to its backends in order, then tees it into OTel.

    Safe to call from any thread and from inside a running event loop, as long as the
    backends are. The tee runs last, after every backend accepted the dict, exactly as in
    the original; it only snapshots and enqueues, and never raises.

    If a backend raises, its exception propagates unchanged, the later backends are not
    called and the dict is not teed: the exception is the user's to handle, and the tee
    mirrors what was logged, so a call that failed (and is perhaps retried) is not
    mirrored before it succeeds.
    """

    def __init__(self, backends: Iterable[Backend] = (), *, tee: bool = True) -> None:
        """Build a logger.

        Args:
            backends: Called in this order on every ``log_metrics``.
            tee: Whether to tee each dict into OTel after the backends (a no-op until
                ``async_tee.start_telemetry``).
        """
        self.backends: tuple[Backend, ...] = tuple(backends)
        self.tee = tee

    def log_metrics(
        self,
        metrics: dict[str, Any],
        step: int,
        prefix: str = "",
        step_metric: str | None = None,
        step_finished: bool = False,
    ) -> None:
        """Hand ``metrics`` to every backend in order, then tee it into OTel.

        Args:
            metrics: The dict to log. Backends see this very object; the tee copies it,
                so mutating it after the call does not change what is exported.
            step: The training step.
            prefix: Namespace of the dict (``train``, ``timing/train``, ``""``, ...).
            step_metric: Name of a custom step axis, passed to the backends.
            step_finished: True on the last call of a step, passed to the backends.

        Raises:
            Exception: Whatever a backend raises, unchanged; the tee itself never raises.
        """
        for backend in self.backends:
            backend.log_metrics(
                metrics, step, prefix, step_metric=step_metric, step_finished=step_finished
            )
        if self.tee:
            self._tee(metrics, prefix, step, step_finished)

    def _tee(self, metrics: Mapping[str, Any], prefix: str, step: int, finished: bool) -> None:
        """The tee call, after the fan-out, for every prefix (teed or not). Never raises."""
        try:
            _metrics.tee_rl_metrics_to_otel(metrics, prefix, step, step_finished=finished)
        except Exception:  # noqa: BLE001 - the tee's contract; guarded in case it is swapped
            warn_once("logger:tee", "async_tee: the tee raised; dict not mirrored")


class JsonlBackend:
    """A ``Backend`` that appends one JSON line per ``log_metrics`` call to a file.

    Each line is ``{"step", "prefix", "step_metric", "step_finished", "time",
    "metrics", "non_finite"}``: ``time`` in Unix seconds; ``metrics`` made JSON-safe
    (NaN and infinities become ``null`` and their key paths, ``/``-joined, are listed in
    ``non_finite`` so a diverged loss stays visible; numpy/torch-like scalars become
    numbers; nested dicts, lists and tuples are converted recursively, dict keys to
    strings; anything else becomes its ``repr``, cut to ``MAX_REPR_CHARS``). The file is
    opened on the first call (parent directories created), in append mode, line-buffered.

    Thread-safe: concurrent calls write whole lines, never interleaved. Usable as a
    context manager; ``close`` is idempotent, and logging after it raises ``RuntimeError``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Remember where to write; nothing is opened until the first call."""
        self.path = Path(path)
        self._file: IO[str] | None = None
        self._closed = False
        self._lock = threading.Lock()

    def log_metrics(
        self,
        metrics: dict[str, Any],
        step: int,
        prefix: str = "",
        step_metric: str | None = None,
        step_finished: bool = False,
    ) -> None:
        """Append one line for this call.

        Raises:
            RuntimeError: The backend was closed.
            OSError: The file cannot be opened or written.
        """
        non_finite: list[str] = []
        record = {
            "step": _json_safe(step, "step", [], 0),
            "prefix": prefix,
            "step_metric": step_metric,
            "step_finished": bool(step_finished),
            "time": time.time(),
            "metrics": _json_safe(metrics, "", non_finite, 0),
            "non_finite": non_finite,
        }
        line = json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n"
        with self._lock:
            if self._closed:
                raise RuntimeError(f"JsonlBackend({str(self.path)!r}) is closed")
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", buffering=1, encoding="utf-8")
            self._file.write(line)

    def close(self) -> None:
        """Close the file (if it was opened). Idempotent."""
        with self._lock:
            self._closed = True
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> JsonlBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _join(path: str, key: object) -> str:
    return f"{path}/{key}" if path else str(key)


def _json_safe(value: Any, path: str, non_finite: list[str], depth: int) -> Any:
    """Convert ``value`` to something ``json.dumps(allow_nan=False)`` accepts."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)  # IntEnum and other subclasses write as plain numbers
    if isinstance(value, float):
        return _finite(float(value), path, non_finite)
    if depth < _MAX_DEPTH:
        if isinstance(value, Mapping):
            return {
                str(key): _json_safe(item, _join(path, key), non_finite, depth + 1)
                for key, item in value.items()
            }
        if isinstance(value, (list, tuple)):
            return [
                _json_safe(item, _join(path, index), non_finite, depth + 1)
                for index, item in enumerate(value)
            ]
    if _dtype_kind(value) == "b" and getattr(value, "shape", None) == ():
        return bool(value)  # numpy's boolean scalar: a flag, written as one
    scalar = as_scalar(value)
    if scalar is not None:
        if _dtype_kind(value) in ("i", "u"):
            return _integer(value, scalar)  # numpy.int64 and friends stay integers
        return _finite(scalar, path, non_finite)
    return _bounded_repr(value)


def _integer(value: Any, scalar: float) -> int:
    try:
        return int(value)  # exact, where the float would round past 2**53
    except Exception:  # noqa: BLE001 - a foreign object's __int__ may raise anything
        return int(scalar)


def _dtype_kind(value: Any) -> str | None:
    try:
        kind = getattr(getattr(value, "dtype", None), "kind", None)
    except Exception:  # noqa: BLE001 - a foreign object's attributes may raise anything
        return None
    return kind if isinstance(kind, str) else None


def _finite(value: float, path: str, non_finite: list[str]) -> float | None:
    if math.isfinite(value):
        return value
    non_finite.append(path)
    return None


def _bounded_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a foreign object's __repr__ may raise anything
        text = f"<{type(value).__name__} object (repr failed)>"
    if len(text) > MAX_REPR_CHARS:
        text = text[: MAX_REPR_CHARS - 3] + "..."
    return text

"""Logger: fan-out order, error semantics, the tee after the backends; JsonlBackend lines."""

from __future__ import annotations

import asyncio
import json
import math
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from helpers import collect

import async_tee
from async_tee import metrics
from async_tee.logger import MAX_REPR_CHARS, Backend, JsonlBackend, Logger


class Recording:
    """A backend that records its calls and what async_tee had enqueued when called."""

    def __init__(self, name: str, order: list[str]) -> None:
        self.name = name
        self.order = order
        self.calls: list[tuple[Any, ...]] = []
        self.enqueued_seen: list[int] = []

    def log_metrics(self, metrics, step, prefix="", step_metric=None, step_finished=False):
        self.order.append(self.name)
        self.enqueued_seen.append(async_tee.stats()["enqueued"])
        self.calls.append((metrics, step, prefix, step_metric, step_finished))


class Boom(Exception):
    pass


class Raising:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def log_metrics(self, metrics, step, prefix="", step_metric=None, step_finished=False):
        raise self.error


def test_backends_run_in_order_then_the_tee(provider, reader, calls):
    async_tee.start_telemetry(provider)
    order: list[str] = []
    first, second = Recording("first", order), Recording("second", order)
    logger = Logger([first, second])
    train = next(c for c in calls if c["prefix"] == "train" and "reward" in c["metrics"])
    logger.log_metrics(train["metrics"], 42, "train", step_metric="s", step_finished=True)
    logger.log_metrics({"reward": 0.9}, 43, "train")
    assert order == ["first", "second", "first", "second"]
    # Both backends of the first call ran before anything was enqueued: the tee runs last.
    assert first.enqueued_seen == [0, 1]
    assert second.enqueued_seen == [0, 1]
    assert async_tee.stats()["enqueued"] == 2
    metrics_seen, step, prefix, step_metric, finished = first.calls[0]
    assert metrics_seen is train["metrics"]  # backends see the caller's dict itself
    assert (step, prefix, step_metric, finished) == (42, "train", "s", True)
    assert second.calls[1][3:] == (None, False)
    assert async_tee.shutdown_telemetry(5)  # completes step 43: exports show a step once complete
    assert collect(reader)[("rl.reward.mean", frozenset())] == 0.9


def test_the_tee_receives_the_step_so_counters_count_once_per_step(provider, reader):
    async_tee.start_telemetry(provider)
    logger = Logger()
    rollout = {"vllm/prompt_tokens": 400}
    logger.log_metrics(rollout, 7, "train")
    logger.log_metrics({**rollout, "loss": 0.1}, 7, "train")  # the same delta, merged
    logger.log_metrics(rollout, 8, "train")
    assert async_tee.shutdown_telemetry(5)  # completes step 8
    assert collect(reader)[("rl.vllm.prompt_tokens", frozenset())] == 800


def test_a_raising_backend_propagates_its_exception_and_stops_the_call(provider, reader):
    async_tee.start_telemetry(provider)
    order: list[str] = []
    before, after = Recording("before", order), Recording("after", order)
    error = Boom("disk full")
    logger = Logger([before, Raising(error), after])
    with pytest.raises(Boom) as caught:
        logger.log_metrics({"reward": 0.5}, 1, "train")
    assert caught.value is error  # unchanged, not wrapped
    assert order == ["before"]  # later backends are not called
    assert async_tee.stats()["enqueued"] == 0  # and the dict is not teed
    assert async_tee.flush()
    assert ("rl.reward.mean", frozenset()) not in collect(reader)


def test_keyboard_interrupt_in_a_backend_propagates(provider):
    async_tee.start_telemetry(provider)
    logger = Logger([Raising(KeyboardInterrupt())])
    with pytest.raises(KeyboardInterrupt):
        logger.log_metrics({"reward": 0.5}, 1, "train")
    assert async_tee.stats()["enqueued"] == 0


class HostileMapping(Mapping[str, Any]):
    """A mapping the tee cannot copy: every read raises."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("no reads")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("no iteration")

    def __len__(self) -> int:
        raise RuntimeError("no len")


def test_a_failure_inside_the_tee_never_reaches_the_caller(provider):
    async_tee.start_telemetry(provider)
    order: list[str] = []
    backend = Recording("only", order)
    Logger([backend]).log_metrics(HostileMapping(), 1, "train")  # type: ignore[arg-type]
    assert order == ["only"]
    assert async_tee.stats()["errors"]["tee"] == 1


def test_a_raising_tee_is_contained_by_the_logger(monkeypatch, caplog):
    def broken(*_args: Any) -> None:
        raise ValueError("tee bug")

    monkeypatch.setattr(metrics, "tee_rl_metrics_to_otel", broken)
    order: list[str] = []
    backend = Recording("only", order)
    Logger([backend]).log_metrics({"reward": 1.0}, 1, "train")
    assert order == ["only"]
    assert "the tee raised" in caplog.text


def test_tee_false_only_fans_out(provider):
    async_tee.start_telemetry(provider)
    order: list[str] = []
    Logger([Recording("only", order)], tee=False).log_metrics({"reward": 1.0}, 1, "train")
    assert order == ["only"]
    assert async_tee.stats()["enqueued"] == 0


def test_without_telemetry_the_logger_is_just_a_fan_out():
    order: list[str] = []
    Logger([Recording("a", order), Recording("b", order)]).log_metrics({"reward": 1}, 0)
    assert order == ["a", "b"]


def test_logging_from_inside_a_running_event_loop(provider, reader):
    async_tee.start_telemetry(provider)
    logger = Logger()

    async def driver() -> None:
        logger.log_metrics({"efficiency/efficiency_pct": 91.0}, 3, "")

    asyncio.run(driver())
    assert async_tee.flush()
    points = collect(reader)
    assert any(name == "rl.efficiency.pct" and value == 91.0 for (name, _), value in points.items())


def test_the_backend_protocol_is_structural(tmp_path):
    assert isinstance(JsonlBackend(tmp_path / "m.jsonl"), Backend)
    assert isinstance(Recording("x", []), Backend)
    assert not isinstance(object(), Backend)


# ---------------------------------------------------------------- JsonlBackend


def read_lines(path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


class FakeScalar:
    """A numpy-like 0-d scalar without numpy: dtype, shape and __float__."""

    class dtype:
        kind = "f"

    shape = ()

    def __float__(self) -> float:
        return 2.5


class Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_jsonl_line_shape_and_json_safe_values(tmp_path):
    path = tmp_path / "deep" / "dir" / "metrics.jsonl"
    backend = JsonlBackend(path)
    assert not path.exists()  # opened lazily
    before = time.time()
    with backend:
        backend.log_metrics(
            {
                "loss": math.nan,
                "grad_norm": math.inf,
                "neg": -math.inf,
                "reward": 0.5,
                "count": 3,
                "flag": True,
                "none": None,
                "name": "run-1",
                "scalar": FakeScalar(),
                "nested": {"a": {"b": [1.0, math.nan, (2, 3)]}, 7: "int key"},
                "object": object(),
                "long": "x" * 10 + "",
                "big": list(range(3)),
                "huge_repr": type("Huge", (), {"__repr__": lambda self: "h" * 5000})(),
                "unprintable": Unprintable(),
            },
            12,
            "train",
            step_metric="train/step",
            step_finished=True,
        )
    (line,) = read_lines(path)
    assert set(line) == {
        "step",
        "prefix",
        "step_metric",
        "step_finished",
        "time",
        "metrics",
        "non_finite",
    }
    assert (line["step"], line["prefix"], line["step_metric"], line["step_finished"]) == (
        12,
        "train",
        "train/step",
        True,
    )
    assert before <= line["time"] <= time.time()
    m = line["metrics"]
    assert m["loss"] is None
    assert m["grad_norm"] is None
    assert m["neg"] is None
    assert line["non_finite"] == ["loss", "grad_norm", "neg", "nested/a/b/1"]
    assert (m["reward"], m["count"], m["flag"], m["none"], m["name"]) == (
        0.5,
        3,
        True,
        None,
        "run-1",
    )
    assert m["scalar"] == 2.5
    assert m["nested"] == {"a": {"b": [1.0, None, [2, 3]]}, "7": "int key"}
    assert m["object"].startswith("<object object at")
    assert m["big"] == [0, 1, 2]
    assert len(m["huge_repr"]) == MAX_REPR_CHARS
    assert m["huge_repr"].endswith("...")
    assert "repr failed" in m["unprintable"]


def test_jsonl_numpy_scalars_keep_their_kind(tmp_path):
    np = pytest.importorskip("numpy")
    path = tmp_path / "m.jsonl"
    with JsonlBackend(path) as backend:
        backend.log_metrics(
            {
                "f64": np.float64(0.25),
                "f32": np.float32(0.5),
                "i64": np.int64(2**62 + 1),
                "nan32": np.float32("nan"),
                "flag": np.bool_(True),
                "zero_d": np.array(1.5),
                "array": np.arange(4),
            },
            np.int64(5),
        )
    (line,) = read_lines(path)
    m = line["metrics"]
    assert line["step"] == 5
    assert m["f64"] == 0.25
    assert m["f32"] == 0.5
    assert m["i64"] == 2**62 + 1  # exact, not rounded through a float
    assert m["nan32"] is None
    assert line["non_finite"] == ["nan32"]
    assert m["flag"] is True
    assert m["zero_d"] == 1.5
    assert m["array"] == "array([0, 1, 2, 3])"


def test_jsonl_cyclic_dict_is_bounded(tmp_path):
    cyclic: dict[str, Any] = {"x": 1}
    cyclic["self"] = cyclic
    path = tmp_path / "m.jsonl"
    with JsonlBackend(path) as backend:
        backend.log_metrics(cyclic, 0)
    (line,) = read_lines(path)
    assert line["metrics"]["x"] == 1


def test_jsonl_appends_and_close_is_idempotent(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"earlier": true}\n', encoding="utf-8")
    backend = JsonlBackend(path)
    backend.log_metrics({"a": 1}, 0)
    backend.log_metrics({"a": 2}, 1)
    backend.close()
    backend.close()
    lines = read_lines(path)
    assert [line.get("step") for line in lines] == [None, 0, 1]
    with pytest.raises(RuntimeError, match="closed"):
        backend.log_metrics({"a": 3}, 2)


def test_jsonl_lines_are_not_interleaved_across_8_threads(tmp_path):
    path = tmp_path / "m.jsonl"
    threads_n, per_thread = 8, 150
    barrier = threading.Barrier(threads_n)
    payload = "p" * 4000  # long lines: an unguarded write would split them
    backend = JsonlBackend(path)

    def write(index: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            backend.log_metrics({"thread": index, "i": i, "payload": payload}, i, "train")

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=write, args=(n,)) for n in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(old)
        backend.close()
    lines = read_lines(path)  # every line parses: none was torn or interleaved
    assert len(lines) == threads_n * per_thread
    seen: dict[int, list[int]] = {}
    for line in lines:
        assert line["metrics"]["payload"] == payload
        seen.setdefault(line["metrics"]["thread"], []).append(line["metrics"]["i"])
    assert seen == {n: list(range(per_thread)) for n in range(threads_n)}


def test_jsonl_backend_through_the_logger_with_the_fixture(tmp_path, calls):
    path = tmp_path / "m.jsonl"
    with JsonlBackend(path) as backend:
        logger = Logger([backend])
        for call in calls:
            logger.log_metrics(
                call["metrics"],
                call["step"],
                call["prefix"],
                step_metric=call.get("step_metric"),
                step_finished=call.get("step_finished", False),
            )
    lines = read_lines(path)
    assert [(line["step"], line["prefix"]) for line in lines] == [
        (call["step"], call["prefix"]) for call in calls
    ]
    assert lines[-1]["step_metric"] == "ray/ray_step"
    assert [line["metrics"] for line in lines] == [call["metrics"] for call in calls]

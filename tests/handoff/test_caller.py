"""What the caller's snapshot keeps: the read keys, as plain strings, whichever it walks.

The caller runs against a real hand-off queue; the snapshot is read back off it.
"""

from __future__ import annotations

from typing import Any

import pytest

from async_tee._handoff import caller as _caller
from async_tee._handoff.queue import DropOldestQueue

READ = tuple(f"row_{i}" for i in range(3_000))  # a declaration with thousands of rows


class Key(str):
    """A str subclass key, as some loggers build them."""


@pytest.fixture
def queue():
    queue: DropOldestQueue[Any] = DropOldestQueue(8)
    _caller.attach(queue, {"train": ("reward", "loss", *READ), "timing/train": None})
    yield queue
    _caller.attach(None)


def _snapshot(queue: DropOldestQueue[Any]) -> dict[Any, Any]:
    ((item, _seq),) = queue.pop_batch(8)
    return _caller.as_dict(item[0])


@pytest.mark.parametrize("size", [2, 5_000], ids=["dict smaller than the keys", "keys smaller"])
def test_a_snapshot_keeps_exactly_the_read_keys_as_plain_strings(queue, size):
    metrics: dict[Any, Any] = {f"unread_{i}": [0.0] * 8 for i in range(size - 2)}
    metrics[Key("reward")] = 1.0
    metrics["row_7"] = 2.0
    _caller.tee_rl_metrics_to_otel(metrics, "train", 1)
    snapshot = _snapshot(queue)
    assert snapshot == {"reward": 1.0, "row_7": 2.0}
    assert {type(key) for key in snapshot} == {str}  # the declared key objects, not the caller's


def test_a_dict_read_whole_is_copied_whole(queue):
    _caller.tee_rl_metrics_to_otel({"a": 1.0, "b": 2.0}, "timing/train", 1)
    assert _snapshot(queue) == {"a": 1.0, "b": 2.0}


def test_a_prefix_not_read_enqueues_nothing(queue):
    _caller.tee_rl_metrics_to_otel({"reward": 1.0}, "ray", 1)
    assert queue.pop_batch(8) == []

"""What the caller's snapshot keeps: the read keys, as plain strings, whichever it walks.

The caller runs against a real hand-off queue; the snapshot is read back off it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


SMALL = ("a", "b", "c", "d", "e", "f")


@settings(max_examples=300, deadline=None, database=None)
@given(
    shapes=st.lists(
        st.tuples(st.sets(st.sampled_from(SMALL)), st.integers(0, 8)), min_size=1, max_size=12
    )
)
def test_a_dict_of_the_last_shape_or_another_snapshots_exactly_its_read_keys(shapes):
    """Whatever the order of shapes a prefix's dicts come in (a trainer logs ``train`` twice a
    step with other keys), a key that came or went in between is never missed nor kept."""
    queue: DropOldestQueue[Any] = DropOldestQueue(64)
    _caller.attach(queue, {"train": SMALL})
    try:
        for step, (present, unread) in enumerate(shapes):
            metrics: dict[str, Any] = {key: float(step) for key in sorted(present)}
            metrics.update({f"unread_{i}": [step] for i in range(unread)})
            _caller.tee_rl_metrics_to_otel(metrics, "train", step)
            assert _snapshot(queue) == {key: float(step) for key in present}, (step, present)
    finally:
        _caller.attach(None)


def test_the_shapes_kept_for_a_prefix_are_bounded():
    queue: DropOldestQueue[Any] = DropOldestQueue(64)
    _caller.attach(queue, {"train": SMALL})
    try:
        # A new length every call, each at least the read keys' (a smaller dict is walked).
        for unread in range(len(SMALL), len(SMALL) + 3 * _caller._SHAPES_PER_PREFIX):
            metrics: dict[str, Any] = {"a": 1.0, "b": 2.0}
            metrics.update({f"unread_{i}": 0.0 for i in range(unread)})
            _caller.tee_rl_metrics_to_otel(metrics, "train", unread)
            assert _snapshot(queue) == {"a": 1.0, "b": 2.0}
            shapes = _caller._SNAPSHOT_KEYS["train"][3]  # type: ignore[index]
            assert 0 < len(shapes) <= _caller._SHAPES_PER_PREFIX
    finally:
        _caller.attach(None)


def test_a_dict_subclass_is_read_without_being_changed():
    """A ``defaultdict`` is read without indexing a key it lacks, which would add the key to
    the trainer's dict."""
    queue: DropOldestQueue[Any] = DropOldestQueue(8)
    _caller.attach(queue, {"train": SMALL})
    try:
        unread = {f"unread_{i}": 0.0 for i in range(8)}
        _caller.tee_rl_metrics_to_otel({"a": 1.0, "b": 2.0, **unread}, "train", 1)
        assert _snapshot(queue) == {"a": 1.0, "b": 2.0}  # its shape: a and b
        metrics: defaultdict[str, float] = defaultdict(float, {"a": 4.0, **unread})
        _caller.tee_rl_metrics_to_otel(metrics, "train", 2)
        assert _snapshot(queue) == {"a": 4.0}
        assert dict(metrics) == {"a": 4.0, **unread}  # no "b" added
    finally:
        _caller.attach(None)

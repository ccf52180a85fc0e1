"""The backlog's accounting under any sequence of requests and answers (hypothesis).

Whatever happens, every request made is delivered, dropped for one counted reason, or still
queued; what is delivered leaves in the order it was made; the bytes held are the bytes of the
requests still queued; past the bound only the oldest waiting requests go.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from async_tee._export.delivery import Backlog, Request

# put a request of this many bytes | send the oldest, answered so
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(1, 40)),
        st.tuples(st.just("send"), st.sampled_from(["delivered", "retry", "refused", "aborted"])),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(steps=_STEPS, bound=st.integers(1, 120))
def test_every_request_is_delivered_dropped_or_queued_in_order(steps, bound):
    backlog = Backlog(bound)
    made: list[Request] = []
    delivered: list[int] = []
    overflowed: list[int] = []
    for action, arg in steps:
        if action == "put":
            request = backlog.new(b"x" * arg, points=arg, trigger="step")
            made.append(request)
            dropped = backlog.put(request)
        elif backlog.waiting:
            request = backlog.take()
            dropped = []
            if arg == "delivered":
                backlog.delivered_one(request)
                delivered.append(request.seq)
            elif arg == "retry":
                dropped = backlog.again(request)
            elif arg == "refused":
                backlog.refused(request, "http_400")
            else:
                backlog.put_back(request)
        else:
            continue
        overflowed += [r.seq for r in dropped]
        queued = list(backlog.waiting)
        # the bytes held are the queued requests' bytes, within the bound (one may be over it)
        assert backlog.bytes == sum(len(r.data) for r in queued)
        assert backlog.bytes <= bound or len(queued) == 1
        # oldest first
        assert [r.seq for r in queued] == sorted(r.seq for r in queued)
        # every request made is in exactly one place
        counted = backlog.delivered + sum(backlog.dropped.values()) + len(backlog)
        assert counted == len(made)
    assert delivered == sorted(delivered)  # delivered in the order made
    assert backlog.dropped["overflow"] == len(overflowed)
    # an overflow takes the oldest waiting: none newer than a request still queued
    still = {r.seq for r in backlog.waiting}
    assert all(seq < min(still) for seq in overflowed) if still else True
    assert backlog.refused_by_reason.get("http_400", 0) == backlog.dropped["refused"]
    assert backlog.delivered_points == sum(len(r.data) for r in made if r.seq in delivered)


def test_drop_all_counts_what_the_shutdown_left_with_the_one_in_flight():
    backlog = Backlog(1000)
    for size in (3, 4, 5):
        backlog.put(backlog.new(b"x" * size, size, "step"))
    in_flight = backlog.take()
    left = backlog.drop_all("shutdown")
    assert [r.seq for r in left] == [in_flight.seq, 2, 3]
    assert backlog.dropped["shutdown"] == 3
    assert backlog.dropped_points["shutdown"] == 12
    assert (backlog.bytes, len(backlog)) == (0, 0)


def test_a_flush_learns_the_fate_of_its_own_request():
    backlog = Backlog(10)
    first = backlog.new(b"x" * 6, 1, "flush")
    backlog.watched[first.seq] = None
    backlog.put(first)
    second = backlog.new(b"x" * 6, 1, "step")
    backlog.watched[second.seq] = None
    backlog.put(second)  # over the bound: the first (oldest) goes
    assert backlog.watched == {first.seq: False, second.seq: None}
    backlog.delivered_one(backlog.take())
    assert backlog.watched == {first.seq: False, second.seq: True}

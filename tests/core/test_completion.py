"""Messages waiting for their AETH (mrc.core.send.completion): deadlines, the LAST's resend on a
doubling backoff up to `max_rto`, and outcomes leaving the queue (docs/DESIGN.md §2)."""

from __future__ import annotations

import pytest

from mrc.core.send.completion import AwaitingAeth
from mrc.core.send.records import OutMessage, new_message

T0 = 1.0


def _msg(msn: int) -> OutMessage:
    return new_message(msn, memoryview(bytes(4096)), 0x1000, 7, None, 1024)


def test_an_overdue_aeth_is_asked_for_again_on_a_doubling_backoff_up_to_the_cap() -> None:
    waiting = AwaitingAeth(max_interval=0.020)
    msg = _msg(1)
    waiting.add(msg, T0, 0.004)
    assert len(waiting) == 1 and waiting.deadline() == pytest.approx(1.004)
    assert waiting.due(1.0039) == []
    # Due: the LAST is resent now, the next ask after twice the interval.
    assert waiting.due(1.004) == [msg]
    assert msg.completion_interval == 0.008 and waiting.deadline() == pytest.approx(1.012)
    assert waiting.due(1.011) == []
    assert waiting.due(1.012) == [msg]
    assert msg.completion_interval == 0.016 and waiting.deadline() == pytest.approx(1.028)
    # 0.032 would pass the cap: the interval stays at max_interval from here on.
    assert waiting.due(1.030) == [msg]
    assert msg.completion_interval == 0.020 and waiting.deadline() == pytest.approx(1.050)
    assert waiting.due(1.050) == [msg]
    assert msg.completion_interval == 0.020


def test_only_the_overdue_are_due_and_the_earliest_deadline_follows_the_queue() -> None:
    waiting = AwaitingAeth(max_interval=0.100)
    a, b, c = _msg(1), _msg(2), _msg(3)
    waiting.add(a, T0, 0.010)  # due 1.010
    waiting.add(b, T0 + 0.002, 0.004)  # due 1.006: the earliest, though added later
    waiting.add(c, T0 + 0.003, 0.010)  # due 1.013
    assert waiting.deadline() == pytest.approx(1.006)
    assert waiting.due(1.007) == [b]
    assert waiting.deadline() == pytest.approx(1.010)  # b's next ask is 1.015
    assert waiting.due(1.013) == [a, c]
    assert waiting.deadline() == pytest.approx(1.015)


def test_outcomes_leave_the_queue_from_its_front_and_are_never_asked_for() -> None:
    waiting = AwaitingAeth(max_interval=0.100)
    a, b, c = _msg(1), _msg(2), _msg(3)
    for msg in (a, b, c):
        waiting.add(msg, T0, 0.010)
    # b's AETH came first (a NAK travels alone): it is settled but waits behind a.
    b.settle(0)
    waiting.settle()
    assert len(waiting) == 3
    assert waiting.due(1.010) == [a, c]
    # a's and c's came: everything leaves, nothing is due, no deadline is left.
    a.settle(0)
    c.settle(0)
    waiting.settle()
    assert len(waiting) == 0 and waiting.deadline() is None
    assert waiting.due(2.0) == []

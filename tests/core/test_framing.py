"""`cut_flowcell`: the next flowcell's packets as runs, one per message (mrc.core.send.framing)."""

from __future__ import annotations

from collections import deque

from mrc.core.send.framing import cut_flowcell
from mrc.core.send.records import OutMessage, new_message

MTU = 1024


def _msgs(*specs: tuple[int, int | None]) -> deque[OutMessage]:
    """Messages of (length, immediate), MSNs from 1."""
    return deque(
        new_message(msn, memoryview(bytes(length)), 0x1000 * msn, 7, imm, MTU)
        for msn, (length, imm) in enumerate(specs, start=1)
    )


def test_a_large_write_is_one_run_up_to_the_limit() -> None:
    pending = _msgs((20 * MTU, None))
    (msg,) = pending
    assert cut_flowcell(pending, 100, 8, MTU) == ([(msg, 0, 8)], 8, 0)
    assert (msg.sent, msg.first_psn, msg.last_psn) == (8, 100, -1)
    assert cut_flowcell(pending, 108, 16, MTU) == ([(msg, 8, 12)], 12, 0)
    assert (msg.sent, msg.last_psn, len(pending)) == (20, 119, 0)


def test_small_writes_of_one_size_are_a_run_each() -> None:
    pending = _msgs(*[(MTU, None)] * 5)
    a, b, c, d, e = pending
    runs, n, late = cut_flowcell(pending, 0xFFFFFE, 4, MTU)
    assert (runs, n, late) == ([(a, 0, 1), (b, 0, 1), (c, 0, 1), (d, 0, 1)], 4, 0)
    # PSNs wrap at 2^24 (docs/WIRE.md §2).
    assert [(m.first_psn, m.last_psn) for m in (a, b, c, d)] == [
        (0xFFFFFE, 0xFFFFFE), (0xFFFFFF, 0xFFFFFF), (0, 0), (1, 1)
    ]  # fmt: skip
    assert list(pending) == [e]


def test_a_full_last_imm_is_late_and_a_short_last_ends_the_flowcell() -> None:
    pending = _msgs((3 * MTU, 9), (2 * MTU + 10, None), (MTU, None))
    a, b, c = pending
    # A's LAST_IMM carries a full payload and ImmDt: 4 bytes longer than the FIRST, it
    # leaves in the second batch (bit 2). B's 10-byte LAST ends the flowcell.
    assert cut_flowcell(pending, 0, 8, MTU) == ([(a, 0, 3), (b, 0, 3)], 6, 0b100)
    assert list(pending) == [c] and (b.first_psn, b.last_psn) == (3, 5)


def test_after_a_first_full_last_imm_the_others_are_late() -> None:
    pending = _msgs((MTU, 1), (2 * MTU, None), (MTU, 2))
    a, b, c = pending
    # An ONLY_IMM first: B's FIRST and full LAST are 4 bytes shorter, C's ONLY_IMM is not.
    assert cut_flowcell(pending, 0, 8, MTU) == ([(a, 0, 1), (b, 0, 2), (c, 0, 1)], 4, 0b0110)


def test_a_short_last_imm_longer_than_the_first_waits_for_the_next_flowcell() -> None:
    pending = _msgs((2 * MTU - 2, 9), (MTU, None))
    a, b = pending
    # 1022 bytes and ImmDt: 2 bytes longer than the FIRST, too long for its batch's end.
    assert cut_flowcell(pending, 0, 8, MTU) == ([(a, 0, 1)], 1, 0)
    assert cut_flowcell(pending, 1, 8, MTU) == ([(a, 1, 1)], 1, 0)
    assert list(pending) == [b] and (a.first_psn, a.last_psn) == (0, 1)


def test_a_limit_of_one_takes_one_packet() -> None:
    pending = _msgs((3 * MTU, None))
    (msg,) = pending
    assert cut_flowcell(pending, 0, 1, MTU) == ([(msg, 0, 1)], 1, 0)

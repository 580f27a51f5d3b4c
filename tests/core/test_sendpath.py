"""`cut_flowcell`: the next flowcell's packets as runs, one per message (sendpath.py)."""

from __future__ import annotations

from collections import deque

from mrc.core.records import OutMessage, new_message
from mrc.core.sendpath import HEADER, cut_flowcell, packet_size

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
    runs, n = cut_flowcell(pending, 100, MTU + HEADER, 8, MTU)
    assert (runs, n) == ([(msg, 0, 8)], 8)
    assert (msg.sent, msg.first_psn, msg.last_psn) == (8, 100, -1)
    runs, n = cut_flowcell(pending, 108, MTU + HEADER, 16, MTU)
    assert (runs, n) == ([(msg, 8, 12)], 12)
    assert (msg.sent, msg.last_psn, len(pending)) == (20, 119, 0)


def test_small_writes_of_one_size_are_a_run_each() -> None:
    pending = _msgs(*[(MTU, None)] * 5)
    a, b, c, d, e = pending
    runs, n = cut_flowcell(pending, 0xFFFFFE, MTU + HEADER, 4, MTU)
    assert (runs, n) == ([(a, 0, 1), (b, 0, 1), (c, 0, 1), (d, 0, 1)], 4)
    # PSNs wrap at 2^24 (docs/WIRE.md §2).
    assert [(m.first_psn, m.last_psn) for m in (a, b, c, d)] == [
        (0xFFFFFE, 0xFFFFFE), (0xFFFFFF, 0xFFFFFF), (0, 0), (1, 1)
    ]  # fmt: skip
    assert list(pending) == [e]


def test_a_full_last_imm_starts_the_next_flowcell_and_a_short_last_ends_this_one() -> None:
    pending = _msgs((3 * MTU, 9), (2 * MTU + 10, None), (MTU, None))
    a, b, c = pending
    full = packet_size(a, 0, MTU)
    # A's LAST_IMM carries a full payload and ImmDt: 4 bytes longer than its FIRST.
    runs, n = cut_flowcell(pending, 0, full, 8, MTU)
    assert (runs, n) == ([(a, 0, 2)], 2)
    runs, n = cut_flowcell(pending, 2, packet_size(a, 2, MTU), 8, MTU)
    assert (runs, n) == ([(a, 2, 1), (b, 0, 1)], 2)  # B's FIRST is shorter: it ends the cell
    runs, n = cut_flowcell(pending, 4, full, 8, MTU)
    assert (runs, n) == ([(b, 1, 2)], 2)  # B's 10-byte LAST ends it
    assert list(pending) == [c] and (b.first_psn, b.last_psn) == (3, 5)


def test_size_zero_takes_one_packet() -> None:
    pending = _msgs((3 * MTU, None))
    (msg,) = pending
    assert cut_flowcell(pending, 0, 0, 1, MTU) == ([(msg, 0, 1)], 1)

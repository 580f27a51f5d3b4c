"""The sender's send log (mrc.core.send.sendlog): each transmission's record, found by PSN in a
ring and by plane in send order; a resend takes over its PSN; acknowledged PSNs leave the ring
(docs/DESIGN.md §6, §11)."""

from __future__ import annotations

from mrc.core.send.records import OutMessage, new_message
from mrc.core.send.sendlog import SendLog

MTU = 1024
WINDOW = 128  # a ring of 256 slots
PSN0 = (1 << 24) - 2  # the flowcell's PSNs wrap (docs/WIRE.md §2)


def _msg(length: int) -> OutMessage:
    return new_message(1, memoryview(bytes(length)), 0x1000, 7, None, MTU)


def test_a_flowcell_is_the_record_of_each_of_its_psns_and_a_resend_takes_one_over() -> None:
    log = SendLog(MTU, WINDOW)
    msg = _msg(4 * MTU - 100)
    cell = log.add([(msg, 0, 4)], 4, PSN0, ev=0x11, plane=1, now=1.0, tx_ts=5, rtx=False)
    assert (cell.psn, cell.n, cell.seq, cell.size, cell.last, cell.open_bytes) == (
        PSN0, 4, 1, MTU, MTU - 100, 4 * MTU - 100
    )  # fmt: skip
    psns = [PSN0, PSN0 + 1, 0, 1]
    assert [log.records.get(p) for p in psns] == [cell] * 4 and len(log.records) == 4
    assert [p for p, _ in sorted(log.records.items())] == [0, 1, PSN0, PSN0 + 1]
    # PSNs the flowcell does not cover find nothing.
    assert log.records.get(2) is None and log.records.get(PSN0 - 1) is None
    # Packet 2 (PSN 0) resent on plane 0: its own record, the next in send order.
    resend = log.add([(msg, 2, 1)], 1, 0, ev=0x22, plane=0, now=1.01, tx_ts=6, rtx=True)
    assert (resend.seq, resend.rtx, resend.length(0)) == (2, True, MTU)
    assert log.records.get(0) is resend and len(log.records) == 4
    assert (list(log.by_plane[1]), list(log.by_plane[0])) == ([cell], [resend])
    assert log.seq == 2


def test_acknowledged_psns_leave_the_ring_and_a_later_psn_reuses_a_slot() -> None:
    log = SendLog(MTU, WINDOW)
    msg = _msg(8 * MTU)
    cell = log.add([(msg, 0, 4)], 4, PSN0, ev=0x11, plane=1, now=1.0, tx_ts=5, rtx=False)
    resend = log.add([(msg, 2, 1)], 1, 0, ev=0x22, plane=0, now=1.01, tx_ts=6, rtx=True)
    # All four of the flowcell's PSNs acknowledged: PSN 0 is the resend's, not taken here.
    assert log.records.take(cell, 0b1111) == 0b1011
    assert len(log.records) == 1 and log.records.get(PSN0) is None
    assert log.records.take(resend, 0b1) == 0b1 and len(log.records) == 0
    # 256 PSNs later the slot of PSN0 holds another record; PSN0 still finds nothing.
    later = log.add([(msg, 4, 4)], 4, (PSN0 + 256) % (1 << 24), 0x11, 1, 1.1, 7, rtx=False)
    assert log.records.slots[PSN0 & log.records.mask] is later
    assert log.records.get(PSN0) is None and log.records.get((PSN0 + 256) % (1 << 24)) is later
    # The plane FIFO keeps finished records until its readers pass them.
    assert list(log.by_plane[1]) == [cell, later]

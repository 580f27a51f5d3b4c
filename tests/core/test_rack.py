"""RACK per EV (mrc.core.loss.rack, RFC 8985; docs/DESIGN.md §6): a packet is lost once one sent
later on its EV was delivered and a reordering window passed; only first transmissions move
an EV's evidence; the highest send seqs acknowledged tell a dead path from a stalled peer."""

from __future__ import annotations

import pytest

from mrc.core.config import SessionConfig
from mrc.core.loss.rack import Rack
from mrc.core.paths.evs import make_ev
from mrc.core.paths.planes import PlaneTable
from mrc.core.send.records import SentCell, new_cell, new_message
from mrc.core.timers import Timer, TimerTable

MTU = 1024
T0 = 1.0
CONFIG = SessionConfig(plane_mask=0b11, payload_mtu=MTU, reorder_min=0.001)
EV = make_ev(0, 5)
OTHER = make_ev(1, 9)


class Story:
    def __init__(self) -> None:
        self.timers = TimerTable()
        self.rack = Rack(CONFIG, PlaneTable(CONFIG), self.timers)
        self.msg = new_message(1, memoryview(bytes(64 * MTU)), 0x1000, 7, None, MTU)
        self.seq = 0

    def send(self, ev: int, at: float, n: int = 4, *, rtx: bool = False, late: int = 0) -> SentCell:
        """A flowcell of `n` packets (a resend: one) leaves on `ev` at `at`."""
        self.seq += 1
        cell = new_cell(
            [(self.msg, 0, n)], n, 100 * self.seq, MTU, ev, 0, at, self.seq, 0, rtx, late
        )  # fmt: skip
        self.rack.sent(cell)
        return cell

    def deliver(self, cell: SentCell, mask: int, now: float) -> bool:
        """The packets of `cell` in `mask` are acknowledged at `now`, as the sender takes them;
        RACK's turn with the one that left last."""
        cell.acked |= mask
        cell.open -= mask.bit_count()
        return self.rack.acked(cell, cell.sent_last(mask), now)


def test_an_older_flowcell_is_lost_a_reordering_window_after_a_later_one_arrived() -> None:
    s = Story()
    a, b, c = s.send(EV, T0), s.send(EV, T0 + 0.0025), s.send(EV, T0 + 0.003)
    assert s.rack.lost(EV, T0 + 0.010) == []  # nothing delivered yet: no evidence
    # C arrives at 1.010, its last packet 7 ms after it left.
    assert s.deliver(c, 0b1111, T0 + 0.010)
    # A's deadline: sent 1.000 + C's 7 ms + the reordering window (1 ms) = 1.008, passed.
    # B's is 1.0025 + 8 ms = 1.0105: REORDER is armed for it and its EV waits.
    assert s.rack.lost(EV, T0 + 0.010) == [(a, 0b1111)]
    assert s.timers.get(Timer.REORDER) == pytest.approx(T0 + 0.0105)
    assert s.rack.pending() == {EV} and s.rack.pending() == set()
    assert s.rack.lost(EV, T0 + 0.0104) == []
    assert s.rack.lost(EV, T0 + 0.0106) == [(b, 0b1111)]
    # A judged flowcell is not judged again; C itself is the latest: nothing of it is owed.
    b.lose(0b1111)
    assert s.rack.lost(EV, T0 + 0.020) == []


def test_inside_a_flowcell_only_packets_that_left_before_the_latest_delivered_are_judged() -> None:
    s = Story()
    cell = s.send(EV, T0, 8)
    assert s.deliver(cell, 0b10_0000, T0 + 0.004)  # packet 5 arrived
    assert s.rack.lost(EV, T0 + 0.010) == [(cell, 0b0001_1111)]
    # Sent as two GSO batches (packets 1, 3, 5, 7 in the second): packet 5 left after all of
    # the first batch and after 1 and 3 of its own.
    s2 = Story()
    split = s2.send(EV, T0, 8, late=0b1010_1010)
    assert s2.deliver(split, 0b10_0000, T0 + 0.004)
    assert s2.rack.lost(EV, T0 + 0.010) == [(split, 0b0101_1111)]


def test_a_resend_acknowledged_moves_no_evidence_but_counts_as_acknowledged_later() -> None:
    s = Story()
    first = s.send(EV, T0)
    resend = s.send(EV, T0 + 0.001, 1, rtx=True)
    # Its acknowledgement may be for the original copy (RFC 8985 §6.2): no RTT, no loss.
    assert not s.deliver(resend, 0b1, T0 + 0.005)
    assert s.rack.lost(EV, T0 + 0.050) == []
    assert s.rack.top_seq == resend.seq
    assert not s.rack.acked_elsewhere(first)  # the later packet was on its own EV


def test_acknowledged_elsewhere_tells_a_dead_path_from_a_stalled_peer() -> None:
    s = Story()
    old, mine, theirs = s.send(EV, T0), s.send(OTHER, T0 + 0.001), s.send(EV, T0 + 0.002)
    assert not s.rack.acked_elsewhere(old)
    # Only EV's own later flowcell arrived: the peer answers, but not on another EV.
    assert s.deliver(theirs, 0b1111, T0 + 0.010)
    assert not s.rack.acked_elsewhere(old)
    assert s.rack.acked_elsewhere(mine)  # OTHER's flowcell was sent before it
    # OTHER's arrives: for EV's old flowcell the peer answers elsewhere too.
    assert s.deliver(mine, 0b1111, T0 + 0.011)
    assert s.rack.acked_elsewhere(old)

"""Pulls that find nothing new (docs/DESIGN.md §11, "A pull that finds nothing new"): most
output pulls of a small message's flush come after its one send, or on a wake-up that brought
only an acknowledgement. They answer nothing and arm nothing new, and they must still not hide
what comes after them: a duplicate arriving later gets its answer, a plane whose flight empties
loses its RTO, and the session's one deadline is the earliest of its timers. Stories in the
simulator with explicit time, on one plane.
"""

from __future__ import annotations

from typing import Any

import pytest

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished, ImmediateReceived, WriteCompleted
from mrc.core.session import Session
from mrc.core.timers import Timer, TimerTable
from mrc.sim import Host, LinkParams, Network
from mrc.wire.bth import Opcode

LINK = LinkParams(rate_bps=1e9, latency=10e-6)
T0 = 0.001


class Story:
    """`a` writes into `b`'s 4 KiB region over two planes; handshake done at T0. Every datagram
    `b` receives is kept as (time, plane, bytes)."""

    def __init__(self) -> None:
        self.net = Network(seed=7)
        self.a, self.b = self.net.pair(2, LINK)
        self.region = self.b.regions.register(bytearray(4096))
        self.src = self.a.regions.register(bytearray(b"q" * 4096))
        cfg = SessionConfig(plane_mask=0b11, payload_mtu=1024, initial_psn=500)
        self.b.listen(cfg, accept=lambda _: b"")
        self.sa: Session = self.a.connect(self.b, cfg)
        self.net.drive(T0)
        assert self.a.events_of(ConnectionEstablished)
        self.sb: Session = self.b.session()
        self.to_b: list[tuple[float, int, bytes]] = []
        self.b.on_receive = self._keep

    def _keep(self, host: Host, plane: int, batch: list[tuple[Any, object, int]]) -> None:
        self.to_b.extend((self.net.now, plane, bytes(d)) for d, _, _ in batch)


def test_a_pull_after_the_answer_sends_nothing_and_a_later_duplicate_is_answered() -> None:
    s = Story()
    # A 2 KiB WRITE_WITH_IMM: a FIRST and a LAST of 1 KiB each.
    msn = s.sa.post_write(s.src, 0, 2048, s.region.base_va, s.region.rkey, 3)
    s.a.flush(s.sa)
    s.net.drive(T0 + 0.001)
    assert s.a.events_of(WriteCompleted) == [WriteCompleted(msn=msn, status=0)]
    first = [(plane, d) for _, plane, d in s.to_b if d[0] == Opcode.WRITE_FIRST]
    assert len(first) == 1
    plane, datagram = first[0]
    # The responder answered at once; pulled again (twice, later) it has nothing to say.
    now = T0 + 0.002
    assert s.sb.datagrams_to_send(now) == []
    assert s.sb.datagrams_to_send(now) == []
    # The FIRST again (a resend that crossed the ACK): a duplicate, which asks for an answer
    # at once (docs/DESIGN.md §6): its SACK goes at the next pull, though nothing was placed
    # and no ACK is due.
    s.sb.receive_datagrams(plane, [(datagram, 0)], now)
    answers = [Opcode(tx.data[0]) for tx in s.sb.datagrams_to_send(now)]
    assert answers == [Opcode.RELIABILITY_SACK]
    assert s.sb.stats.drops_by_reason["duplicate"] == 1
    assert len(s.b.events_of(ImmediateReceived)) == 1
    # And the pull after that is empty again.
    assert s.sb.datagrams_to_send(now) == []


def test_an_rto_is_armed_only_while_its_plane_has_a_packet_in_flight() -> None:
    s = Story()
    s.sa.post_write(s.src, 0, 64, s.region.base_va, s.region.rkey, None)
    s.a.flush(s.sa)
    # One packet out, on one plane: that plane alone has its RETRANSMIT, and the session's
    # deadline is the earliest of all its timers.
    armed = [p for p in (0, 1) if s.sa.timers.get(Timer.RETRANSMIT, p) is not None]
    assert len(armed) == 1
    deadlines = [t for t in s.sa.timers._deadlines.values()]
    assert s.sa.get_timer() == min(deadlines)
    # Acknowledged 21 µs later: the RTO goes with it, and later pulls arm none again.
    s.net.drive(T0 + 0.001)
    assert s.sa.sender is not None and s.sa.sender.idle
    assert [p for p in (0, 1) if s.sa.timers.get(Timer.RETRANSMIT, p) is not None] == []
    s.sa.datagrams_to_send(T0 + 0.002)
    assert [p for p in (0, 1) if s.sa.timers.get(Timer.RETRANSMIT, p) is not None] == []


def test_the_next_deadline_is_the_earliest_one_left() -> None:
    t = TimerTable()
    assert t.next_deadline() is None
    t.set(Timer.RETRANSMIT, 0.5, 0)
    t.set(Timer.COMPLETION, 0.25)
    t.set(Timer.RETRANSMIT, 0.75, 1)
    assert t.next_deadline() == pytest.approx(0.25)
    t.cancel(Timer.COMPLETION)
    assert t.next_deadline() == pytest.approx(0.5)
    t.set(Timer.RETRANSMIT, 1.0, 0)  # moved later
    assert t.next_deadline() == pytest.approx(0.75)
    t.cancel(Timer.RETRANSMIT, 1)
    t.cancel(Timer.RETRANSMIT, 0)
    assert t.next_deadline() is None

"""What an expired RTO may conclude (docs/DESIGN.md §6): the evidence about planes and paths.

Pure functions over the sender's send records and plane table. A plane is one FIFO at the peer
(one socket), so a later packet acknowledged on the same plane proves older ones lost; a plane
silent while the peer answers elsewhere is dead; silence everywhere is a stalled peer, probed
with one resend for the whole connection (`StallProbe`); an RTO that fires long after it was
due with nothing read since is a stall of this process, not of the network (`fired_late`).
The sender (`sender.py`) decides what to resend and which EVs to signal; this module only
weighs the evidence, and arms each plane's RETRANSMIT timer (`arm_rtos`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from .paths import Plane
from .records import ACKED, INFLIGHT, SentPacket
from .timers import Timer, TimerTable

#: (top send seq acknowledged on a plane, its EV, top seq acknowledged on any other EV).
PlaneAcks = tuple[int, int, int]


def acked_on_plane(fifo: deque[SentPacket], after: int) -> PlaneAcks | None:
    """This plane's packets acknowledged after send seq `after`; None when there are none."""
    top = top_ev = second = 0
    for rec in fifo:
        if rec.state == ACKED and rec.seq > after:
            if rec.seq > top:
                if rec.ev != top_ev:
                    second = top
                top, top_ev = rec.seq, rec.ev
            elif rec.seq > second and rec.ev != top_ev:
                second = rec.seq
    return (top, top_ev, second) if top else None


def acked_later(rec: SentPacket, here: PlaneAcks | None) -> bool:
    """A packet sent after `rec` on another EV of its plane was acknowledged."""
    if here is None:
        return False
    top, top_ev, second = here
    return (top if top_ev != rec.ev else second) > rec.seq


def peer_alive(
    fifos: Mapping[int, deque[SentPacket]],
    planes: Mapping[int, Plane],
    plane: int,
    *,
    after: float,
    last_progress: float,
    now: float,
) -> bool | float:
    """Does the peer answer on other planes while `plane` is silent? True: something was
    acknowledged after `after` (resends included) and within this plane's RTO, or no other
    plane is owed anything. False: another plane has a packet out longer than its RTO
    without backoff (a stalled peer). Else the time to ask again: when another plane's
    answer is expected, or due."""
    # An answer older than an RTO proves nothing about now: a peer that stopped right after
    # it (descheduled, stopped) leaves every plane silent, and its other planes' packets
    # overdue, which the loop below sees.
    if last_progress > after and now - last_progress < planes[plane].rtt.rto:
        return True
    due_at: float | None = None
    stalled = False
    for other, fifo in fifos.items():
        if other == plane:
            continue
        rec = next((r for r in fifo if r.state == INFLIGHT), None)
        if rec is None:
            continue
        rtt = planes[other].rtt
        due = rec.sent_at + rtt.rto
        if now >= due:
            stalled = True
            continue
        # Look again when its answer is expected, and at the latest when it is due.
        expected = rec.sent_at + (rtt.srtt or 0.0)
        wake = expected if expected > now else due
        if due_at is None or wake < due_at:
            due_at = wake
    if stalled:
        return False
    return True if due_at is None else due_at


def fired_late(due: float | None, planes: Mapping[int, Plane], now: float, rto: float) -> bool:
    """The RTO armed for `due` runs more than half an RTO after it, and nothing arrived from
    the peer on any plane since `due`: this process was not running (descheduled, stopped,
    a long garbage collection) while its acknowledgements may wait unread in its sockets. The
    silence is ours, not the network's; judge only after the driver has read them."""
    if due is None or now - due <= rto / 2:
        return False
    return all(pl.heard_at < due for pl in planes.values())


class StallProbe:
    """One resend for the whole connection while nothing sent later is acknowledged anywhere
    (the peer, or every path, stalled): the RTO of the plane holding the connection's oldest
    packet in flight resends it, at most once per RTO of that plane (RFC 6298 §5.4 for one
    connection; the tail probe of RFC 8985 §7); the other planes only back off. A resend per
    plane would only queue copies behind originals a stalled peer has not read yet."""

    def __init__(self) -> None:
        #: No other probe before this: the last one has had no RTO yet to be answered.
        self.until = 0.0

    def take(self, fifos: Mapping[int, deque[SentPacket]], plane: int, now: float) -> bool:
        """May `plane`'s expiry at `now` send the probe? Call `sent` if it does."""
        if now < self.until:
            return False
        best: SentPacket | None = None
        best_plane: int | None = None
        for p, fifo in fifos.items():
            rec = next((r for r in fifo if r.state == INFLIGHT), None)
            if rec is not None and (best is None or rec.seq < best.seq):
                best, best_plane = rec, p
        return best_plane == plane

    def sent(self, now: float, rto: float) -> None:
        self.until = now + rto


def arm_rtos(
    timers: TimerTable,
    fifos: Mapping[int, deque[SentPacket]],
    planes: Mapping[int, Plane],
    holds: Mapping[int, float],
    armed: dict[int, float],
) -> None:
    """Each plane's RETRANSMIT is due an RTO after its oldest packet in flight (never before
    the plane's hold), and cancelled when it has none; `armed` keeps each plane's deadline,
    for `fired_late`. Records that left the network are dropped from the front of each
    plane's FIFO here."""
    for plane, fifo in fifos.items():
        while fifo and fifo[0].state != INFLIGHT:
            fifo.popleft()
        if fifo:
            due = max(fifo[0].sent_at + planes[plane].rtt.current, holds.get(plane, 0.0))
            timers.set(Timer.RETRANSMIT, due, plane)
            armed[plane] = due
        else:
            timers.cancel(Timer.RETRANSMIT, plane)
            armed.pop(plane, None)

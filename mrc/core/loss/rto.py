"""What an expired RTO may conclude (docs/DESIGN.md §6): the evidence about planes and paths.

Functions over the sender's send records and plane table, and the state of its RETRANSMIT
timers (`RtoTimers`). A plane is one FIFO at the peer (one socket), so a later packet
acknowledged on the same plane proves older ones lost; a plane silent while the peer answers
elsewhere is dead; silence everywhere is a stalled peer, probed with one resend for the whole
connection; an RTO that fires long after it was due with nothing read since is a stall of
this process, not of the network. The sender (`sender.py`) decides what to resend and which
EVs to signal; this module only weighs the evidence and arms the timers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from enum import Enum

from ..paths.planes import Plane, RttEstimator
from ..send.records import SentCell
from ..timers import Timer, TimerTable

#: (top send seq acknowledged on a plane, its EV, top seq acknowledged on any other EV).
PlaneAcks = tuple[int, int, int]


class Expiry(Enum):
    """What an expired RTO of a plane concludes (`RtoTimers.judge`)."""

    HELD = "held"  # no judgement yet: the timer was put off (a hold)
    LOST = "lost"  # a later packet on the plane was acknowledged: its overdue packets are lost
    SILENT = "silent"  # the plane is silent while the peer answers elsewhere: lost, dead paths
    STALL_PROBE = "stall_probe"  # nothing later acknowledged anywhere: the one stall probe
    BACKED_OFF = "backed_off"  # the same, but the probe is another plane's to send


def acked_on_plane(fifo: deque[SentCell], after: int) -> PlaneAcks | None:
    """This plane's flowcells with packets acknowledged sent after send seq `after`; None
    when there are none."""
    top = top_ev = second = 0
    for rec in fifo:
        # A resend acknowledged may be its original arriving elsewhere (Karn): no evidence.
        if rec.acked and rec.seq > after and not rec.rtx:
            if rec.seq > top:
                if rec.ev != top_ev:
                    second = top
                top, top_ev = rec.seq, rec.ev
            elif rec.seq > second and rec.ev != top_ev:
                second = rec.seq
    return (top, top_ev, second) if top else None


def acked_later(rec: SentCell, here: PlaneAcks | None) -> bool:
    """A flowcell sent after `rec` on another EV of its plane had packets acknowledged."""
    if here is None:
        return False
    top, top_ev, second = here
    return (top if top_ev != rec.ev else second) > rec.seq


def peer_alive(
    fifos: Mapping[int, deque[SentCell]],
    planes: Mapping[int, Plane],
    plane: int,
    *,
    after: float,
    last_progress: float,
    top_seq: int,
    now: float,
) -> bool | float:
    """Does the peer answer on other planes while `plane` is silent? True: something was
    acknowledged after `after` (resends included) and within this plane's RTO, or no other
    plane is owed anything. False: another plane has a packet out longer than its RTO
    without backoff, and nothing sent after that packet was acknowledged (`top_seq`, the
    latest send seq acknowledged anywhere, is older): a stalled peer (planes that never
    answered do not count). Else the time to ask again: when another plane's answer is
    expected, or due."""
    # An answer older than an RTO proves nothing about now: a peer that stopped right after
    # it (descheduled, stopped) leaves every plane silent, and its other planes' packets
    # overdue, which the loop below sees.
    if last_progress > after and now - last_progress < planes[plane].rtt.rto:
        return True
    due_at: float | None = None
    stalled = False
    for other, fifo in fifos.items():
        # A plane that never answered anything says nothing about the peer: it may be as
        # dead as this one (a peer address no one listens on, from the start).
        if other == plane or not planes[other].proven_at:
            continue
        rec = next((r for r in fifo if r.open), None)
        if rec is None:
            continue
        rtt = planes[other].rtt
        due = rec.sent_at + rtt.rto
        if now >= due:
            # Overdue, but the peer answered something sent after it: that plane lost it
            # too (two planes' flowcells lost in one fault), which says nothing of a stall.
            # Taken for a stall, each such plane would leave the others to the stall probe:
            # one packet freed per backed-off RTO (docs/DESIGN.md §6).
            if top_seq <= rec.seq:
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


class RtoTimers:
    """The RETRANSMIT timers of one sender: per plane the hold (no RTO before it: the plane's
    acknowledgements were still flowing, or the peer's other answers are still due) and the
    deadline last armed, and the connection's stall probe."""

    def __init__(self) -> None:
        self.holds: dict[int, float] = {}
        #: Per plane, the deadline its RETRANSMIT timer was last armed for.
        self.armed: dict[int, float] = {}
        #: No stall probe before this: the last one has had no RTO yet to be answered.
        self.probe_until = 0.0
        #: The first acknowledgement after a silence longer than the minimum RTO (a stall):
        #: a plane's own silence counts from here, as the peer may still be reading its other
        #: planes' sockets first.
        self.resumed_at = 0.0

    def progress(
        self, now: float, last_progress: float, min_rto: float, planes: Mapping[int, Plane]
    ) -> None:
        """Something was newly acknowledged at `now`, the last time before at `last_progress`.
        After a silence longer than the minimum RTO the peer answers again: the backoff and
        holds of that silence end (each plane judges again an RTO from now, `judge`). Kept,
        they would space the next judgements by the backed-off RTO, and after an outage that
        lost a whole window each would free only what one stall probe brings back."""
        if now - last_progress > min_rto:
            self.resumed_at = now
            self.holds.clear()
            for pl in planes.values():
                pl.rtt.backoff = 0

    def hold(self, plane: int, until: float) -> None:
        self.holds[plane] = until

    def arm(
        self, timers: TimerTable, fifos: dict[int, deque[SentCell]], planes: dict[int, Plane]
    ) -> None:
        """Each plane's RETRANSMIT is due an RTO after its oldest packet in flight (never
        before the plane's hold), and cancelled when it has none. Records that left the
        network are dropped from the front of each plane's FIFO here. (Once per output pull:
        `dict`, not `Mapping`, so compiled the loops are the dict's own.)"""
        holds, armed = self.holds, self.armed
        for plane, fifo in fifos.items():
            while fifo and not fifo[0].open:
                fifo.popleft()
            if fifo:
                due = max(fifo[0].sent_at + planes[plane].rtt.current, holds.get(plane, 0.0))
                timers.set(Timer.RETRANSMIT, due, plane)
                armed[plane] = due
            elif plane in armed:
                # Only a plane armed here has a RETRANSMIT to cancel: most planes of a small
                # message's pull have nothing in flight, and stay so.
                timers.cancel(Timer.RETRANSMIT, plane)
                del armed[plane]

    def judge(
        self, plane: int, oldest: SentCell, fifos: Mapping[int, deque[SentCell]],
        planes: Mapping[int, Plane], *, top_seq: int, last_progress: float,
        reorder_min: float, now: float,
    ) -> tuple[Expiry, PlaneAcks | None]:  # fmt: skip
        """The verdict on `plane`'s expired RTO, whose oldest open flowcell is `oldest`
        (`top_seq`: the latest send seq acknowledged anywhere); with this plane's
        acknowledgements after it (`acked_on_plane`), for the sender to blame paths by."""
        pl = planes[plane]
        est = pl.rtt
        if self.fired_late(plane, planes, now):
            # A stall of ours: read what waits before judging (docs/DESIGN.md §6).
            self.hold(plane, now + reorder_min)
            return Expiry.HELD, None
        # A plane is one FIFO at the peer (one socket), so a later packet on this plane
        # acknowledged says the old ones are not merely queued: they are lost, and so are
        # their paths. Later packets acknowledged only on other planes say that only once
        # this plane has been silent for an RTO and the peer shows it is alive elsewhere;
        # while this plane's acknowledgements still flow it lags (the peer drains its
        # planes' sockets in turn, and one can fall behind by more than an RTO), so wait.
        # Nothing sent later acknowledged: the peer stalled, or our window did; resend
        # only the connection's oldest, as RFC 6298 §5.4 does, back off, and blame no path.
        here = acked_on_plane(fifos[plane], oldest.seq)
        if here is not None:
            return Expiry.LOST, here
        later_elsewhere = top_seq > oldest.seq
        # Compared as deadlines: a hold re-armed at `acked_at + rto` must find it passed.
        # Silent since its last acknowledgement, or since the peer's stall ended if later.
        quiet_until = max(pl.acked_at, self.resumed_at) + est.rto
        if later_elsewhere and now >= quiet_until:
            alive = peer_alive(fifos, planes, plane, after=pl.acked_at + est.rto / 2,
                               last_progress=last_progress, top_seq=top_seq, now=now)
            if isinstance(alive, float):
                self.hold(plane, alive)  # the other planes' answers are still due
                return Expiry.HELD, None
            if alive:
                return Expiry.SILENT, None
        elif later_elsewhere:
            self.hold(plane, quiet_until)  # lagging: wait
            return Expiry.HELD, None
        if now < last_progress + est.rto:
            self.hold(plane, last_progress + est.rto)  # the window, not the peer
            return Expiry.HELD, None
        if self.stall_expiry(fifos, plane, est, now):
            return Expiry.STALL_PROBE, None
        return Expiry.BACKED_OFF, None

    def fired_late(self, plane: int, planes: Mapping[int, Plane], now: float) -> bool:
        """`plane`'s RTO runs more than half an RTO after the deadline it was armed for, and
        nothing arrived from the peer on any plane since: this process was not running
        (descheduled, stopped, a long garbage collection) while acknowledgements may wait
        unread in its sockets. The silence is ours, not the network's: judge only after the
        driver has read them."""
        due = self.armed.get(plane)
        if due is None or now - due <= planes[plane].rtt.rto / 2:
            return False
        return all(pl.heard_at < due for pl in planes.values())

    def stall_expiry(
        self, fifos: Mapping[int, deque[SentCell]], plane: int, rtt: RttEstimator, now: float
    ) -> bool:
        """`plane`'s RTO expired with nothing sent later acknowledged anywhere (the peer, or
        every path, stalled): back off, and restart the timer from now (RFC 6298 §5.5-5.6;
        from the oldest's send time an old packet would expire again at once for every
        backoff step). True when this expiry sends the stall probe: one resend for the whole
        connection, by the plane holding its oldest packet in flight, at most once per RTO
        of that plane (RFC 6298 §5.4 for one connection; the tail probe of RFC 8985 §7). A
        resend per plane would only queue copies behind originals a stalled peer has not
        read yet."""
        probe = now >= self.probe_until and _oldest_plane(fifos) == plane
        rtt.backoff = min(rtt.backoff + 1, 16)
        if probe:
            self.probe_until = now + rtt.current
        self.holds[plane] = now + rtt.current
        return probe


def _oldest_plane(fifos: Mapping[int, deque[SentCell]]) -> int | None:
    """The plane holding the connection's oldest packet in flight (lowest send seq)."""
    best: SentCell | None = None
    best_plane: int | None = None
    for plane, fifo in fifos.items():
        rec = next((r for r in fifo if r.open), None)
        if rec is not None and (best is None or rec.seq < best.seq):
            best, best_plane = rec, plane
    return best_plane

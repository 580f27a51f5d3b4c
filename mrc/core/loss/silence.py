"""A plane suspected silent while the peer answers on the others (docs/DESIGN.md §6).

A failure nothing reports (a blackhole, a dead switch) leaves a plane's flowcells in flight
until its RTO says the plane is dead, 12-30 ms on loopback planes whose SRTT is about 5 ms.
Meanwhile they stay in congestion control's window; once the window shrinks (NSCC's quick
adapt falls back to the bytes achieved) the dead plane's bytes hold all of it and every plane
stops. The RTO cannot be cut to fit: on a busy host one plane's acknowledgements lag the
others' by up to about 10 ms beyond its SRTT, as the peer drains its sockets in turn, which
a dead plane also looks like at first.

So a suspicion that costs nothing when wrong: a plane whose oldest flowcell in flight is late
by more than a reordering window beyond the plane's SRTT (¼ SRTT, at least `reorder_min`),
silent itself for that window, while another plane has had a packet sent no earlier answered
(RACK's evidence, RFC 8985 §6.2, across planes) and either went on being acknowledged after
this one fell silent or has nothing left in flight, is suspected. While suspected it takes no
new flowcell (evchoice.py) and its bytes in flight do not count against CC's window
(inflight.py), so the other planes go on at the full window, and the plane monitor probes it
(planes.py: an answer ends the probing; each unanswered one retires the EV it went on, and
three take it DOWN once its EVs are at their floor). Nothing is resent and no EV is blamed
on suspicion alone: its flowcells stay in flight until the RTO (rto.py), the probes, the
peer's port announcements or a PSN window they close (sender.py `_resend_silent`) judge
them. A stalled peer, or our own stall, leaves every plane quiet alike and suspects none. A
plane that never answered anything has no SRTT of its own and is expected at the largest SRTT
of the planes that answer (a peer port closed from the start is suspected a reordering window
after the first answer elsewhere, and the plane monitor takes it DOWN on its probes).

One case gives no evidence at all: the window shrank to what one plane has out and that
plane died just after, so no other plane owes or answers anything while data waits. The
sender asks `tail_probe` only then (data waiting, the window full): two SRTTs on (RACK's
tail loss probe, RFC 8985 §7) it resends one packet of it on another plane, whose answer is
the evidence. An idle tail (one message in flight, nothing waiting) stays the RTO's: a
general tail probe cost a CPython ping-pong beside CPU hogs hundreds of spurious resends
(docs/DESIGN.md §6).

Holds `SilentPlanes`: the planes suspected; `judge`, which ends suspicions (the plane
answered something, an acknowledgement or a probe, or four RTOs of it passed, doubling while
it stays silent) and finds new ones, with the time to look again; and `tail_probe`. And
`closed_on_silent`: whether a PSN window closed on one plane's packet has found it dead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Final

from ..paths.planes import Plane
from ..send.records import SentCell

#: A plane suspected again without answering in between is left alone up to 2^this RTOs.
MAX_BACKOFF: Final = 4
#: A first suspicion lasts this many of the plane's RTOs, unless the plane answers.
SUSPECT_RTOS: Final = 4


class SilentPlanes:
    def __init__(self, reorder_min: float) -> None:
        self.reorder_min = reorder_min
        #: Per suspected plane, when the suspicion ends at the latest.
        self.until: dict[int, float] = {}
        #: Per plane, suspicions in a row without an acknowledgement in between, and when
        #: the last one began.
        self._strikes: dict[int, int] = {}
        self._since: dict[int, float] = {}
        #: Per plane, when its tail was last probed (tail_probe).
        self._probed: dict[int, float] = {}

    def judge(
        self, fifos: dict[int, deque[SentCell]], planes: dict[int, Plane], now: float,
        resumed_at: float = 0.0,
    ) -> tuple[list[int], float | None]:  # fmt: skip
        """Update the suspicions at `now`: the planes newly suspected, and when to look
        again: the earliest time another plane with a flowcell out may be suspected or a
        suspicion ends (None: nothing to wait for). `resumed_at`:
        the first acknowledgement after a stall of the peer (rto.py's `RtoTimers.resumed_at`)."""
        until = self.until
        if until:
            for plane in [p for p, t in until.items()
                          if t <= now or _answered(planes[p], self._since[p])]:  # fmt: skip
                del until[plane]
        wake: float | None = None
        new: list[int] = []
        for plane, fifo in fifos.items():
            if plane in until or not fifo:
                continue
            rec = _first_open(fifo)
            pl = planes[plane]
            srtt = pl.rtt.srtt
            if rec is None:
                continue  # nothing out
            if srtt is None:
                # A plane that never answered has no RTT of its own: expect its answers
                # when the planes that answer answer (the slowest of them), or it would
                # wait for the initial RTO, round after round (docs/DESIGN.md §6).
                srtt = _answering_srtt(planes) if pl.never_answered else None
                if srtt is None:
                    continue  # nothing known to expect
            # Silent since its last answer: an acknowledgement, or a probe answered.
            sent, quiet = rec.sent_at, max(pl.acked_at, pl.proven_at)
            reorder = max(self.reorder_min, srtt / 4)
            # Only a plane not itself suspected speaks for the peer: a suspected plane is
            # idle because it gets nothing new, and two lagging planes must not suspect
            # each other until no plane is left to send on.
            # (Loops, not `any` over a generator: this runs for every plane at every pull.)
            spoken = False
            for n, q in planes.items():
                if (
                    n != plane
                    and n not in until
                    and q.answered_sent_at >= sent
                    and (q.acked_at > quiet + reorder or not _open(fifos.get(n)))
                ):
                    spoken = True
                    break
            if not spoken:
                continue
            if resumed_at > quiet:
                # Silent since before the peer's stall ended: a peer catching up reads its
                # planes' backlogs in turn, one maybe several SRTTs after the others. Its
                # silence counts from the end of the stall, for an RTO, as rto.py counts it.
                due = max(sent, resumed_at) + pl.rtt.rto
            else:
                due = max(sent + srtt, quiet) + reorder
            if now >= due:
                self._suspect(plane, pl, now)
                new.append(plane)
            elif wake is None or due < wake:
                wake = due
        for end in until.values():
            # New flowcells may go there again then: a pull must come even if nothing else
            # does (the other planes may have nothing in flight to bring one).
            if wake is None or end < wake:
                wake = end
        return new, wake

    def tail_probe(
        self, fifos: dict[int, deque[SentCell]], planes: dict[int, Plane], now: float,
        resumed_at: float = 0.0,
    ) -> tuple[SentCell | None, float | None]:  # fmt: skip
        """The window holds one plane's flowcells only and no other plane owes anything:
        no answer can bring evidence about that plane (a window shrunk to the bytes sent on
        a plane that died just after). RACK's tail loss probe (RFC 8985 §7), two SRTTs and a
        reordering window after the plane's oldest left or last answered: the oldest open
        flowcell to probe with, once per silence (on another plane; its answer is the
        evidence `judge` needs), else when to look again. A stalled peer leaves every plane
        owing, which this never probes; the RTO's stall probe (rto.py) is for that."""
        held: int | None = None
        for plane, fifo in fifos.items():
            if _open(fifo):
                if held is not None:
                    return None, None  # more than one plane owes: judge's case, or a stall
                held = plane
        if held is None or held in self.until:
            return None, None
        pl = planes[held]
        srtt = pl.rtt.srtt
        rec = _first_open(fifos[held])
        if rec is None or srtt is None or self._probed.get(held, -1.0) >= pl.acked_at:
            return None, None  # already probed since it last answered
        quiet = max(pl.acked_at, resumed_at)
        due = max(rec.sent_at + srtt, quiet) + srtt + max(self.reorder_min, srtt / 4)
        if now < due:
            return None, due
        self._probed[held] = now
        return rec, None

    def _suspect(self, plane: int, pl: Plane, now: float) -> None:
        strikes = self._strikes.get(plane, 0)
        if _answered(pl, self._since.get(plane, 0.0)):
            strikes = 0  # it answered since it was last suspected
        self._strikes[plane] = min(strikes + 1, MAX_BACKOFF)
        self._since[plane] = now
        # Long enough for the plane monitor's probes (10 ms apart) to judge it: ended
        # early by any answer, and a dead plane must not get new flowcells in between.
        self.until[plane] = now + pl.rtt.rto * (SUSPECT_RTOS << strikes)


def closed_on_silent(
    held: SentCell,
    fifos: Mapping[int, deque[SentCell]],
    planes: Mapping[int, Plane],
    reorder_min: float,
    now: float,
) -> tuple[bool, float | None]:
    """The PSN window is closed on `held`'s open packet: is its plane dead to us? (True, None)
    if so; else (False, when to look again, or None when an answer will bring the next look).

    A closed window leaves every plane waiting for that plane's RTO, which on a busy host is
    several times the RTT an idle window sees (its SRTT carries our own queues). Once every
    other plane has had all it carried answered, packets sent after `held` among them, the
    peer has nothing else to read, and a plane that only lags is read then. Silent for a
    reordering window past the last answer, it is dead to us (RACK's evidence across planes,
    RFC 8985 §6.2): the sender resends what it holds on the others and restarts its cap, and
    blames no path (but the EVs of a plane that answered later flowcells on its other EVs:
    only those paths are dead). If it only lagged longer, the copies are duplicates the peer
    drops, sent while the closed window left the other planes idle anyway; a dead plane's EVs
    are retired by its unanswered probes (planes.py). docs/NOTES.md §6 has the measurements."""
    plane = held.plane
    last = 0.0
    later = False
    for other, fifo in fifos.items():
        if other != plane:
            if _open(fifo):
                return False, None  # the peer still owes there: its answer brings a pull
            pl = planes[other]
            last = max(last, pl.acked_at)
            later = later or pl.answered_sent_at > held.sent_at
    if not later:
        return False, None  # nothing sent after it was answered: tail_probe's case
    srtt = planes[plane].rtt.srtt or 0.0
    due = max(last, planes[plane].acked_at) + max(reorder_min, srtt / 4)
    return (True, None) if now >= due else (False, due)


def _answering_srtt(planes: dict[int, Plane]) -> float | None:
    """The largest SRTT of the planes that have one; None when no plane has answered."""
    best: float | None = None
    for pl in planes.values():
        srtt = pl.rtt.srtt
        if srtt is not None and (best is None or srtt > best):
            best = srtt
    return best


def _answered(pl: Plane, since: float) -> bool:
    """`pl` answered something since `since`: data acknowledged, or a probe answered."""
    return pl.acked_at > since or pl.proven_at > since


def _first_open(fifo: deque[SentCell]) -> SentCell | None:
    """The oldest flowcell of this FIFO still in flight."""
    for rec in fifo:
        if rec.open:
            return rec
    return None


def _open(fifo: deque[SentCell] | None) -> bool:
    """A flowcell of this FIFO is still in flight."""
    return fifo is not None and _first_open(fifo) is not None

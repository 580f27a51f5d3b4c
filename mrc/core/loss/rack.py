"""Loss inference per EV, RACK-style (RFC 8985; docs/DESIGN.md §6).

An EV is one path and a path is a FIFO, so a packet is lost when a packet sent later on the
same EV has been acknowledged and a reordering window (¼ of the plane's SRTT, at least
`reorder_min`) has passed. This module keeps, per EV, the send records (flowcells, whose
packets leave in PSN order, or as two GSO batches each in PSN order: `SentCell.late`) in send
order and the latest first transmission known delivered; it also remembers the highest send
sequence number acknowledged and the highest on any other EV, which tell a dead path from a
stalled peer.

It only judges: the sender declares the packets it returns lost, retires their EVs and resends
them; the REORDER timer is armed here and routed back by the session.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..config import SessionConfig
from ..paths.planes import PlaneTable, ev_plane
from ..send.records import SentCell
from ..timers import Timer, TimerTable


@dataclass(slots=True)
class _Delivered:
    """The most recently sent packet of one EV known delivered (its flowcell's send seq and
    its index there), and how long it took."""

    seq: int
    index: int
    rtt: float


class Rack:
    def __init__(self, config: SessionConfig, paths: PlaneTable, timers: TimerTable) -> None:
        self.config = config
        self.paths = paths
        self.timers = timers
        self._fifo: dict[int, deque[SentCell]] = {}
        self._delivered: dict[int, _Delivered] = {}
        self._pending: set[int] = set()  # EVs waiting for their reordering window
        #: The highest send seq acknowledged, and its EV; the highest on any other EV.
        self.top_seq = 0
        self._top_ev = self._second_seq = 0

    def sent(self, cell: SentCell) -> None:
        """`cell` (a flowcell or a resend) just left on its EV: the newest of that EV's FIFO."""
        fifo = self._fifo.get(cell.ev)
        if fifo is None:
            fifo = self._fifo[cell.ev] = deque()
        fifo.append(cell)

    def acked(self, cell: SentCell, index: int, now: float) -> bool:
        """Packets of `cell` were acknowledged, `index` the one of them that left last. True
        if that advanced its EV's RACK state (a first transmission: RFC 8985 §6.2, an ACK of a
        resent PSN may be for the original copy)."""
        seq = cell.seq
        if seq > self.top_seq:
            if cell.ev != self._top_ev:
                self._second_seq = self.top_seq
                self._top_ev = cell.ev
            self.top_seq = seq
        elif seq > self._second_seq and cell.ev != self._top_ev:
            self._second_seq = seq
        if cell.rtx:
            return False
        latest = self._delivered.get(cell.ev)
        if latest is None:
            self._delivered[cell.ev] = _Delivered(seq, index, max(0.0, now - cell.sent_at))
        elif seq > latest.seq or (seq == latest.seq and cell.sent_after(index, latest.index)):
            # Updated in place: a flowcell's packets are acknowledged one SACK after another.
            latest.seq, latest.index, latest.rtt = seq, index, max(0.0, now - cell.sent_at)
        return True

    def acked_elsewhere(self, cell: SentCell) -> bool:
        """A packet sent after `cell` on another EV was acknowledged."""
        later = self.top_seq if self._top_ev != cell.ev else self._second_seq
        return later > cell.seq

    def lost(self, ev: int, now: float) -> list[tuple[SentCell, int]]:
        """The packets of `ev` lost by now, oldest first, as (flowcell, mask of its packets);
        arms REORDER for the rest."""
        fifo = self._fifo.get(ev)
        latest = self._delivered.get(ev)
        out: list[tuple[SentCell, int]] = []
        if not fifo or latest is None:
            return out
        srtt = self.paths.planes[ev_plane(ev)].rtt.srtt
        reo = max(self.config.reorder_min, (srtt or 0.0) / 4)
        while fifo:
            cell = fifo[0]
            if not cell.open:
                fifo.popleft()
                continue
            if cell.seq > latest.seq:
                break
            mask = cell.open_mask()
            if cell.seq == latest.seq:
                # The latest delivered is in this flowcell: only the packets that left
                # before it are judged.
                mask &= cell.sent_before(latest.index)
                if not mask:
                    break
            deadline = cell.sent_at + latest.rtt + reo
            if deadline > now:
                self._pending.add(ev)
                current = self.timers.get(Timer.REORDER)
                if current is None or deadline < current:
                    self.timers.set(Timer.REORDER, deadline)
                break
            out.append((cell, mask))
            if cell.seq == latest.seq:
                break  # its later packets are not judged yet
            fifo.popleft()
        return out

    def pending(self) -> set[int]:
        """The EVs the REORDER timer was armed for (handed over once)."""
        pending, self._pending = self._pending, set()
        return pending

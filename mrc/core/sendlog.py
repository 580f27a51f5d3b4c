"""Send records of one sender: one `SentPacket` per transmission of a packet.

Holds the records of the packets not yet acknowledged, by PSN (`records`); each plane's
records in send order (`by_plane`, for that plane's RTO, docs/DESIGN.md §6); and the session-wide
send sequence that orders packets sent at the same `now`. Adding a record also hands it to
RACK's per-EV FIFO and counts it against its EV.

What becomes of a record (acknowledged, lost, resent) is the sender's business; a flowcell's
records are added in one call, since one is built per packet on the hottest path.
"""

from __future__ import annotations

from collections import deque

from .evs import EvTable
from .rack import Rack
from .records import OutMessage, SentPacket
from .sendpath import CellPacket


class SendLog:
    def __init__(self, payload_mtu: int, rack: Rack, evs: EvTable) -> None:
        self.mtu = payload_mtu
        self.rack = rack
        self.evs = evs
        self.records: dict[int, SentPacket] = {}
        self.by_plane: dict[int, deque[SentPacket]] = {}
        self.seq = 0

    def plane(self, plane: int) -> deque[SentPacket]:
        """`plane`'s records in send order (acknowledged ones are dropped lazily)."""
        fifo = self.by_plane.get(plane)
        if fifo is None:
            fifo = self.by_plane[plane] = deque()
        return fifo

    def add(
        self,
        msg: OutMessage,
        index: int,
        psn: int,
        ev: int,
        plane: int,
        now: float,
        tx_ts: int,
        *,
        rtx: bool,
    ) -> None:
        """The record of one transmission of packet `index` of `msg`."""
        mtu = self.mtu
        length = mtu if index < msg.npkts - 1 else len(msg.src) - index * mtu
        self.seq += 1
        # Positional, in SentPacket's field order:
        # psn, msg, index, length, ev, plane, sent_at, seq, tx_ts, rtx.
        rec = SentPacket(psn, msg, index, length, ev, plane, now, self.seq, tx_ts, rtx)
        self.records[psn] = rec
        self.evs.count_sent(ev, rtx)
        self.rack.sent(rec)
        self.plane(plane).append(rec)

    def add_cell(
        self, cell: list[CellPacket], ev: int, plane: int, now: float, tx_ts: int
    ) -> None:
        """`add` for the first transmissions of one flowcell, all on `ev`: the per-EV and
        per-plane lookups are done once per cell instead of once per packet."""
        mtu = self.mtu
        records = self.records
        by_ev = self.rack.fifo(ev)
        by_plane = self.plane(plane)
        seq = self.seq
        for msg, index, psn in cell:
            length = mtu if index < msg.npkts - 1 else len(msg.src) - index * mtu
            seq += 1
            rec = SentPacket(psn, msg, index, length, ev, plane, now, seq, tx_ts, False)
            records[psn] = rec
            by_ev.append(rec)
            by_plane.append(rec)
        self.seq = seq
        self.evs.count_sent(ev, False, len(cell))

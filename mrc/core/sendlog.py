"""Send records of one sender: one `SentCell` per flowcell transmission (docs/DESIGN.md §11).

Holds, by PSN, the record that holds each packet not yet acknowledged (`records`: every PSN of
a flowcell maps to the flowcell's one record, or to its resend's); each plane's records in send
order (`by_plane`, for that plane's RTO, docs/DESIGN.md §6); and the session-wide send sequence
that orders flowcells sent at the same `now`. Adding a record also hands it to RACK's per-EV
FIFO and counts it against its EV.

What becomes of a record (acknowledged, lost, resent) is the sender's business.
"""

from __future__ import annotations

from collections import deque

from .evs import EvTable
from .rack import Rack
from .records import CellPacket, SentCell, new_cell


class SendLog:
    def __init__(self, payload_mtu: int, rack: Rack, evs: EvTable) -> None:
        self.mtu = payload_mtu
        self.rack = rack
        self.evs = evs
        self.records: dict[int, SentCell] = {}
        self.by_plane: dict[int, deque[SentCell]] = {}
        self.seq = 0

    def plane(self, plane: int) -> deque[SentCell]:
        """`plane`'s records in send order (finished ones are dropped lazily)."""
        fifo = self.by_plane.get(plane)
        if fifo is None:
            fifo = self.by_plane[plane] = deque()
        return fifo

    def add(
        self, packets: list[CellPacket], ev: int, plane: int, now: float, tx_ts: int, *, rtx: bool
    ) -> SentCell:
        """The record of one transmission of `packets` (a flowcell, or one resent packet)."""
        self.seq += 1
        cell = new_cell(packets, self.mtu, ev, plane, now, self.seq, tx_ts, rtx)
        records = self.records
        for _, _, psn in packets:
            records[psn] = cell
        self.evs.count_sent(ev, rtx, len(packets))
        self.rack.fifo(ev).append(cell)
        self.plane(plane).append(cell)
        return cell

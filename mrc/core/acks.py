"""Acknowledged packets in the sender's send records (docs/DESIGN.md §6).

Holds `AckLedger`: it marks the packets an acknowledgement covers in their flowcell records,
takes them out of the in-flight accounts, counts their bytes, starts the completion wait of
every message whose packets are all in (completion.py), hands each flowcell touched to RACK
once, and turns what first transmissions it saw into one RTT, goodput and plane-cap sample
per plane per acknowledgement (Karn's rule). Which PSNs an acknowledgement covers (the SACK
scoreboard, cumulative PSNs, AETH), loss inference and progress toward the RTO are the
sender's (sender.py).
"""

from __future__ import annotations

from typing import Final

from ..wire.bth import PSN_MOD
from .balance import PlaneBalance
from .cc import CongestionControl
from .completion import AwaitingAeth
from .inflight import InFlight
from .paths import PathTable
from .rack import Rack
from .records import SentCell
from .stats import SessionStats

PSN_MASK: Final = PSN_MOD - 1


class AckLedger:
    def __init__(
        self, records: dict[int, SentCell], flight: InFlight, rack: Rack, paths: PathTable,
        awaiting_aeth: AwaitingAeth, stats: SessionStats, balance: PlaneBalance,
        cc: CongestionControl,
    ) -> None:  # fmt: skip
        #: The record of every packet not yet acknowledged, by PSN (sendlog.py's).
        self.records = records
        self.flight = flight
        self.rack = rack
        self.paths = paths
        self.awaiting_aeth = awaiting_aeth
        self.stats = stats
        self.balance = balance
        self.cc = cc
        #: Per plane, the age of the oldest first transmission the current ACK covers.
        self._ages: dict[int, float] = {}
        #: Per plane, payload bytes of first transmissions the current ACK covers.
        self._acked_bytes: dict[int, int] = {}

    def ack(self, psns: list[int], now: float, touched: set[int]) -> int:
        """The packets `psns` (in PSN order) arrived, cumulatively or by SACK bits: mark them
        in their records, count their bytes, and hand each flowcell touched to RACK once (one
        call per SACK: the hottest loop of the receive path, so its lookups are hoisted).
        Returns the payload bytes newly acknowledged."""
        records = self.records  # compiled, get and del are C calls (a bound pop would not be)
        by_plane = self.flight.by_plane
        acked = left = top = cell_bytes = 0
        interval = -1.0
        cell: SentCell | None = None
        for psn in psns:
            rec = records.get(psn)
            if rec is None:
                continue
            del records[psn]
            i = (psn - rec.psn) & PSN_MASK
            bit = 1 << i
            packets = rec.packets
            length = rec.size if i < len(packets) - 1 else rec.last
            if not rec.lost & bit:
                rec.open -= 1
                rec.open_bytes -= length
                left += length
                by_plane[rec.plane] -= length
            rec.acked |= bit
            acked += length
            if rec is not cell:
                if cell is not None:
                    self._cell_acked(cell, top, cell_bytes, now, touched)
                cell, top, cell_bytes = rec, i, 0
            elif i > top:
                top = i
            cell_bytes += length
            msg = packets[i][0]
            msg.acked += 1
            if msg.acked == msg.npkts and msg.status is None:
                if interval < 0:  # once per call: many small messages complete in one SACK
                    interval = max(pl.rtt.current for pl in self.paths.planes.values())
                self.awaiting_aeth.add(msg, now, interval)
        if cell is not None:
            self._cell_acked(cell, top, cell_bytes, now, touched)
        if acked:
            self.flight.left(left)
            self.stats.bytes_acked += acked
        return acked

    def _cell_acked(
        self, cell: SentCell, top: int, acked: int, now: float, touched: set[int]
    ) -> None:
        """`acked` bytes of `cell`, up to its packet `top`, were acknowledged: RACK's turn, and
        the plane's RTT and goodput sample (first transmissions only: Karn, RFC 8985 §6.2)."""
        if self.rack.acked(cell, top, now):
            age = now - cell.sent_at
            plane = cell.plane
            if age > self._ages.get(plane, -1.0):
                self._ages[plane] = age
            self._acked_bytes[plane] = self._acked_bytes.get(plane, 0) + acked
            touched.add(cell.ev)
            pl = self.paths.planes[plane]
            if cell.sent_at > pl.answered_sent_at:
                # Every flowcell acknowledged, not only the one a SACK names as its trigger
                # (a coalesced SACK covers many planes): silence.py weighs planes by it.
                pl.answered_sent_at = cell.sent_at

    def sample_rtts(self, now: float) -> None:
        """One RTT sample per plane per acknowledgement: the longest a first transmission
        it newly acknowledged took (Karn's rule: never a retransmitted PSN). The RTO has to
        cover the slowest acknowledgement, not the freshest: a receive batch acknowledges
        packets that waited in the peer's socket queue together with ones that did not."""
        if self._ages:
            planes = self.paths.planes
            for plane, age in self._ages.items():
                pl = planes[plane]
                pl.rtt.sample(max(0.0, age))
                pl.acked_at = now
                acked = self._acked_bytes.get(plane, 0)
                self.balance.on_acked(plane, acked, age, now)
                self.cc.on_plane_sample(
                    plane, age, acked=acked, inflight=self.flight.by_plane[plane], now=now
                )
            self._ages.clear()
            self._acked_bytes.clear()

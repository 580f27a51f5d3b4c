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

from ...wire.bth import PSN_MOD
from ..cc.control import CongestionControl
from ..loss.rack import Rack
from ..paths.balance import PlaneBalance
from ..paths.planes import PlaneTable
from ..stats import SessionStats
from .completion import AwaitingAeth
from .inflight import InFlight
from .records import OutMessage, SentCell
from .sendlog import PsnRecords

PSN_MASK: Final = PSN_MOD - 1


class AckLedger:
    def __init__(
        self, records: PsnRecords, flight: InFlight, rack: Rack, paths: PlaneTable,
        awaiting_aeth: AwaitingAeth, stats: SessionStats, balance: PlaneBalance,
        cc: CongestionControl,
    ) -> None:  # fmt: skip
        #: The record of every packet not yet acknowledged, by PSN (sendlog.py's ring).
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
        # The current `ack_bits`/`ack_range` call's totals (payload bytes acknowledged, and
        # of those the bytes still in flight) and the completion interval once computed.
        self._acked = 0
        self._left = 0
        self._interval = -1.0

    def ack_range(self, first: int, count: int, now: float, touched: set[int]) -> int:
        """The `count` PSNs from `first` arrived (a cumulative acknowledgement, or the PSNs of
        a message an AETH acknowledged): `ack_bits` for a run of PSNs."""
        records = self.records
        slots, smask = records.slots, records.mask
        self._acked = self._left = 0
        self._interval = -1.0
        k = 0
        while k < count:
            psn = (first + k) & PSN_MASK
            rec = slots[psn & smask]
            if rec is not None:
                i = (psn - rec.psn) & PSN_MASK
                # A slot reused by a later PSN: this one was acknowledged long ago.
                if i < rec.n:
                    span = min(rec.n - i, count - k)
                    want = ((1 << span) - 1) << i
                    if self._ack_cell(rec, want, now, touched) == want:
                        k += span  # the record's PSNs in range, all taken at once
                        continue
            # A PSN of that record resent elsewhere has its own record: go on one at a time.
            k += 1
        return self._finish()

    def ack_bits(self, base: int, bits: int, now: float, touched: set[int]) -> int:
        """The PSNs `base + k` for every bit k of `bits` (bit 0 first) arrived: mark them in
        their records, a flowcell at a time, count their bytes, and hand each flowcell touched
        to RACK. PSNs without a record (acknowledged already) are skipped. The hottest loop
        of the receive path: a record's packets are taken with integer masks, and its
        accounts (in flight, per plane, acknowledged bytes) change once per record. Returns
        the payload bytes newly acknowledged."""
        records = self.records
        slots, smask = records.slots, records.mask
        self._acked = self._left = 0
        self._interval = -1.0
        while bits:
            low = bits & -bits
            k = low.bit_length() - 1
            psn = (base + k) & PSN_MASK
            rec = slots[psn & smask]
            i = 0 if rec is None else (psn - rec.psn) & PSN_MASK
            if rec is None or i >= rec.n:
                bits ^= low  # acknowledged already (its slot empty, or reused by a later PSN)
                continue
            want = ((bits >> k) & ((1 << (rec.n - i)) - 1)) << i
            taken = self._ack_cell(rec, want, now, touched)
            bits &= ~((taken >> i) << k)  # the rest of `want` belongs to resends' records
        return self._finish()

    def _ack_cell(self, rec: SentCell, want: int, now: float, touched: set[int]) -> int:
        """Take the packets of `rec` in `want` (a mask of its packets) whose current record
        it is; returns the mask taken (never empty: the lowest bit of `want` is one)."""
        records = self.records
        slots, smask = records.slots, records.mask
        first = rec.psn
        taken = 0
        j = (want & -want).bit_length() - 1
        w = want >> j
        while w:
            if w & 1:
                slot = (first + j) & smask
                if slots[slot] is rec:
                    slots[slot] = None
                    taken |= 1 << j
            w >>= 1
            j += 1
        # Each message counts its packets taken, a run (a message's packets) at a time.
        shift = 0
        for msg, _, count in rec.runs:
            got = (taken >> shift) & ((1 << count) - 1)
            if got:
                self._msg_acked(msg, got.bit_count(), now)
            shift += count
        n = rec.n
        last_bit = 1 << (n - 1)
        size = rec.size
        extra = rec.last - size  # the last packet's length differs from the others'
        count = taken.bit_count()
        self.records.count -= count
        acked = count * size + (extra if taken & last_bit else 0)
        fresh = taken & ~rec.lost
        if fresh:
            opened = fresh.bit_count()
            left = opened * size + (extra if fresh & last_bit else 0)
            rec.open -= opened
            rec.open_bytes -= left
            self.flight.by_plane[rec.plane] -= left
            self._left += left
        rec.acked |= taken
        self._acked += acked
        self._cell_acked(rec, rec.sent_last(taken), acked, now, touched)
        return taken

    def _msg_acked(self, msg: OutMessage, count: int, now: float) -> None:
        """`count` more packets of `msg` arrived: once all have, its completion wait starts."""
        msg.acked += count
        if msg.acked == msg.npkts and msg.status is None:
            if self._interval < 0:  # once per call: many small messages complete in one SACK
                self._interval = max(pl.rtt.current for pl in self.paths.planes.values())
            self.awaiting_aeth.add(msg, now, self._interval)

    def _finish(self) -> int:
        acked = self._acked
        if acked:
            self.flight.left(self._left)
            self.stats.bytes_acked += acked
        return acked

    def _cell_acked(
        self, cell: SentCell, top: int, acked: int, now: float, touched: set[int]
    ) -> None:
        """`acked` bytes of `cell` were acknowledged, `top` the one of its packets that left
        last: RACK's turn, and the plane's RTT and goodput sample (first transmissions only:
        Karn, RFC 8985 §6.2)."""
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

"""Send records of one sender: one `SentCell` per flowcell transmission (docs/DESIGN.md §11).

Holds, by PSN, the record that holds each packet not yet acknowledged (`records`, a
`PsnRecords` ring: every PSN of a flowcell maps to the flowcell's one record, or to its
resend's); each plane's records in send order (`by_plane`, for that plane's RTO,
docs/DESIGN.md §6); and the session-wide send sequence that orders flowcells sent at the same
`now`. Adding a record also hands it to RACK's per-EV FIFO and counts it against its EV.

What becomes of a record (acknowledged, lost, resent) is the sender's business.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Final

from ...wire.bth import PSN_MOD
from ..loss.rack import Rack
from ..paths.evs import EvTable
from .records import CellRun, SentCell, new_cell

PSN_MASK: Final = PSN_MOD - 1


class PsnRecords:
    """The current record of each PSN not yet acknowledged, in a ring of `slots` indexed by
    PSN modulo a power of two above the PSN window.

    Every such PSN lies in [una, next_psn), which the window keeps shorter than the ring, so
    each slot holds the record of at most one of them: a lookup is a list index, not a hash.
    A slot of an acknowledged PSN is None. `get` also checks that the record covers the PSN
    asked for, so a PSN outside the window (a late or bogus one) finds nothing. The
    acknowledgement path (acks.py) reads and clears `slots` directly and keeps `count`.
    """

    def __init__(self, window: int) -> None:
        size = 1 << window.bit_length()  # > window: a flowcell is never longer than it
        self.slots: list[SentCell | None] = [None] * size
        self.mask = size - 1
        #: PSNs that have a record.
        self.count = 0

    def get(self, psn: int) -> SentCell | None:
        rec = self.slots[psn & self.mask]
        if rec is not None and (psn - rec.psn) & PSN_MASK < rec.n:
            return rec
        return None

    def __getitem__(self, psn: int) -> SentCell:
        rec = self.get(psn)
        if rec is None:
            raise KeyError(psn)
        return rec

    def __len__(self) -> int:
        return self.count

    def items(self) -> Iterator[tuple[int, SentCell]]:
        """(PSN, record) of every PSN that has one, in slot order (reports and tests)."""
        mask = self.mask
        for slot, rec in enumerate(self.slots):
            if rec is not None:
                yield (rec.psn + ((slot - rec.psn) & mask)) & PSN_MASK, rec

    def values(self) -> Iterator[SentCell]:
        for _, rec in self.items():
            yield rec


class SendLog:
    def __init__(self, payload_mtu: int, window: int, rack: Rack, evs: EvTable) -> None:
        self.mtu = payload_mtu
        self.rack = rack
        self.evs = evs
        self.records = PsnRecords(window)
        self.by_plane: dict[int, deque[SentCell]] = {}
        self.seq = 0

    def plane(self, plane: int) -> deque[SentCell]:
        """`plane`'s records in send order (finished ones are dropped lazily)."""
        fifo = self.by_plane.get(plane)
        if fifo is None:
            fifo = self.by_plane[plane] = deque()
        return fifo

    def add(
        self, runs: list[CellRun], n: int, psn: int, ev: int, plane: int, now: float, tx_ts: int,
        *, rtx: bool, late: int = 0,
    ) -> SentCell:  # fmt: skip
        """The record of one transmission of the `n` packets of `runs` (a flowcell, or one
        resent packet), PSNs from `psn`; `late`: those that left in a second GSO batch."""
        self.seq += 1
        cell = new_cell(runs, n, psn, self.mtu, ev, plane, now, self.seq, tx_ts, rtx)
        cell.late = late
        records = self.records
        slots, mask = records.slots, records.mask
        added = 0
        for k in range(n):
            slot = (psn + k) & mask
            if slots[slot] is None:
                added += 1
            slots[slot] = cell
        records.count += added
        self.evs.count_sent(ev, rtx, n)
        self.rack.fifo(ev).append(cell)
        self.plane(plane).append(cell)
        return cell

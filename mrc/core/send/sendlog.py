"""The sender's send log: the record of every transmission not yet done with, found by PSN and
by plane (docs/DESIGN.md §6, §11).

Holds, by PSN, the record that holds each packet not yet acknowledged (`records`, a
`PsnRecords` ring: every PSN of a flowcell maps to the flowcell's one record, or to its
resend's); each plane's records in send order (`by_plane`, for that plane's RTO and silence
judgements, docs/DESIGN.md §6); and the session-wide send sequence that orders flowcells sent
at the same `now`. A record enters with `add` and leaves the PSN ring with `take` as its packets
are acknowledged; the plane FIFOs drop finished records lazily (their readers skip them).

What becomes of a record (acknowledged, lost, resent), and the other books a transmission
enters (RACK's per-EV FIFOs, the EV table's counts, bytes in flight), are the sender's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Final

from ...wire.bth import PSN_MOD
from .records import CellRun, SentCell, new_cell

PSN_MASK: Final = PSN_MOD - 1


class PsnRecords:
    """The current record of each PSN not yet acknowledged, in a ring of `slots` indexed by
    PSN modulo a power of two above the PSN window.

    Every such PSN lies in [una, next_psn), which the window keeps shorter than the ring, so
    each slot holds the record of at most one of them: a lookup is a list index, not a hash.
    A slot of an acknowledged PSN is None. `get` also checks that the record covers the PSN
    asked for, so a PSN outside the window (a late or bogus one) finds nothing. Slots are
    written only by `put` and `take`; the sender's hot loops read `slots` and `mask` directly.
    """

    def __init__(self, window: int) -> None:
        size = 1 << window.bit_length()  # > window: a flowcell is never longer than it
        self.slots: list[SentCell | None] = [None] * size
        self.mask = size - 1
        #: PSNs that have a record.
        self.count = 0

    def put(self, cell: SentCell) -> None:
        """`cell` is now the record of each of its PSNs (a resend takes over its PSN)."""
        slots, mask, psn = self.slots, self.mask, cell.psn
        added = 0
        for k in range(cell.n):
            slot = (psn + k) & mask
            if slots[slot] is None:
                added += 1
            slots[slot] = cell
        self.count += added

    def take(self, cell: SentCell, want: int) -> int:
        """Clear the PSNs of `cell` in `want` (a mask of its packets, not 0) whose record it
        still is (the others were resent: their resends hold them); returns the mask cleared."""
        slots, smask, first = self.slots, self.mask, cell.psn
        taken = 0
        j = (want & -want).bit_length() - 1
        w = want >> j
        while w:
            if w & 1:
                slot = (first + j) & smask
                if slots[slot] is cell:
                    slots[slot] = None
                    taken |= 1 << j
            w >>= 1
            j += 1
        self.count -= taken.bit_count()
        return taken

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
    def __init__(self, payload_mtu: int, window: int) -> None:
        self.mtu = payload_mtu
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
        resent packet), PSNs from `psn`, the next in send order; `late`: those that left in a
        second GSO batch."""
        self.seq += 1
        cell = new_cell(runs, n, psn, self.mtu, ev, plane, now, self.seq, tx_ts, rtx, late)
        self.records.put(cell)
        self.plane(plane).append(cell)
        return cell

"""EVs in the IPv6 flow label (docs/WIRE.md §3): what a connection that agreed on it in CM does
to its packets on the way out and on the way in.

Data packets are framed without EVXH (sendpath.py) and the receiver's fast path places them
with the EV taken from the label (receiver.py). This module holds the rest: control packets,
built with an EVXH like everywhere else, lose it on the way out (`strip_control`), and a packet
that arrived without one gets its EV back from its datagram's label (`restore_ev`): the plane
in the EV's top byte is the plane it arrived on, the selector is the label.

The label itself is io's business: it sets every datagram's flow label from its `Transmit`'s
EV, and hands a received label to the core in bits 8-27 of the traffic word that carries the
TOS byte in bits 0-7 (`LABEL_SHIFT`).
"""

from __future__ import annotations

from typing import Final

from ...wire.bth import CM_OPCODES
from ...wire.packet import Packet
from ..transmit import Transmit

#: A received flow label sits above the TOS byte in the traffic word io passes in.
LABEL_SHIFT: Final = 8
LABEL_MASK: Final = 0xFFFFF
_EVX: Final = 0x01  # BTH.EVX as a bit of byte 4
_CM: Final = frozenset(op.value for op in CM_OPCODES)


def strip_control(out: list[Transmit]) -> None:
    """Take the EVXH out of every single-packet transmit of `out` that has one, in place (its
    EV still rides along in the `Transmit`, for io's flow label)."""
    for i, tx in enumerate(out):
        data = tx.data
        if tx.segment_size is None and len(data) >= 16 and data[4] & _EVX:
            head = bytes((data[0], data[1], data[2], data[3], data[4] & ~_EVX))
            out[i] = Transmit(tx.plane, tx.addr, head + data[5:12] + data[16:], tx.ev)


def restore_ev(pkt: Packet, data: bytes | memoryview, plane: int, word: int) -> bool:
    """Give `pkt`, decoded from `data` that arrived on `plane` without an EVXH, the EV its
    datagram's flow label names (`word` is the traffic word io passed in). False when it has
    neither: no EV of a flow-label connection has selector 0, so label 0 names none (the caller
    counts the drop)."""
    if not data[4] & _EVX and data[0] not in _CM:
        label = word >> LABEL_SHIFT & LABEL_MASK
        if not label:
            return False
        pkt.ev = plane << 24 | label  # type: ignore[union-attr]
    return True

"""The one SACK reader: what a RELIABILITY_SACK means to the plane monitor and the sender.

`on_sack` takes a SACK's fields (docs/WIRE.md §4: BTH.PSN, SETH, CC_STATE, PORTSTATE) and hands
them on — a probe's answer and the peer's port mask to the plane monitor, the rest to the
sender — for every SACK, however it was read. `take_sack` reads the two layouts the receiver
sends on an EVXH connection (BTH EVXH SETH CC_STATE, with or without PORTSTATE) with one unpack,
and `on_decoded` a SACK the strict decoder read (every other layout, and a flow-label
connection's); anything `take_sack` does not recognise, including every SACK the decoder would
refuse, it leaves untouched for the decoder: the same rules, not a second set. The session
decides when to try it (a plaintext datagram on an established connection); what a SACK means
for sending is the sender's (sender.py).
"""

from __future__ import annotations

from typing import Final

from ...wire.ack import SackMark
from ...wire.bth import EVX_BIT, PSN_MOD, Opcode
from ...wire.fast import SACK_LAYOUT, SACK_LAYOUT_PS
from ...wire.packet import SackPacket
from ..paths.health import PlaneMonitor
from .sender import Sender

_SACK_OP: Final = Opcode.RELIABILITY_SACK.value
_SIZE: Final = SACK_LAYOUT.size
_SIZE_PS: Final = SACK_LAYOUT_PS.size
# Bound once: compiled, a method called by name is looked up at every call.
_UNPACK: Final = SACK_LAYOUT.unpack_from
_UNPACK_PS: Final = SACK_LAYOUT_PS.unpack_from
_PSN_MASK: Final = PSN_MOD - 1
_PR: Final = 0x02  # SETH flags: PR, PS
_PS: Final = 0x01


def take_sack(
    data: bytes | memoryview, p_key: int, sender: Sender, planes: PlaneMonitor, now: float
) -> bool:
    """Act on `data` if it is a SACK in the common layout for P_Key `p_key`: True once done,
    False (nothing changed) for anything else."""
    n = len(data)
    port_state = -1
    if n == _SIZE:
        (op, b1, pk, w4, w8, _ev, first, ack_off, entropy, _sp, _dp, _cack, _cc, _mpr,
         sack_off, bitmap, echo, half, word) = _UNPACK(data)  # fmt: skip
    elif n == _SIZE_PS:
        (op, b1, pk, w4, w8, _ev, first, ack_off, entropy, _sp, _dp, _cack, _cc, _mpr,
         sack_off, bitmap, echo, half, word, port_state) = _UNPACK_PS(data)  # fmt: skip
    else:
        return False
    m = (first >> 5) & 3
    if (
        op != _SACK_OP
        or b1 & 0x0F  # TVer
        or not w4 & EVX_BIT
        or pk != p_key
        or m == 3  # not a mark: the decoder names it
        or bool(first & _PS) != (port_state >= 0)  # the decoder counts the length
    ):
        return False
    on_sack(
        sender, planes, w8 & _PSN_MASK, ack_off, sack_off, bitmap, m, bool(first & _PR),
        entropy, echo, bool(half & 0x8000), (word >> 24) & 0x7F, port_state, now,
    )  # fmt: skip
    return True


def on_decoded(pkt: SackPacket, sender: Sender, planes: PlaneMonitor, now: float) -> None:
    """A SACK the decoder read: `on_sack` with its fields."""
    seth, cc = pkt.seth, pkt.cc
    ports = pkt.port_state
    on_sack(
        sender, planes, pkt.cack_psn, seth.ack_psn_offset, seth.sack_offset, seth.sack_bitmap,
        int(seth.m), seth.pr, seth.entropy, cc.tx_timestamp, cc.valid, cc.rcv_cwnd_pen,
        -1 if ports is None else ports, now,
    )  # fmt: skip


def on_sack(
    sender: Sender, planes: PlaneMonitor, cack_psn: int, ack_psn_offset: int, sack_offset: int,
    sack_bitmap: int, m: int, pr: bool, entropy: int, echo: int, valid: bool, pen: int,
    port_state: int, now: float,
) -> None:  # fmt: skip
    """One SACK as its fields (`port_state` -1 when it has no PORTSTATE): a probe's answer
    (PR) and the peer's ports to the plane monitor, then the rest to the sender."""
    if pr:
        planes.on_answer(ack_psn_offset & 0xFFFF, m == SackMark.NONE, now)
    if port_state >= 0:
        planes.peer_ports(port_state, now, cack_psn)
    sender.on_sack_fields(
        cack_psn, ack_psn_offset, sack_offset, sack_bitmap, m, pr, entropy, echo, valid, pen,
        now,
    )  # fmt: skip

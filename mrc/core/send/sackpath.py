"""The sender's byte path for SACKs: the common RELIABILITY_SACK taken straight from its bytes.

Every SACK the receiver sends on an EVXH connection has one of two layouts (docs/WIRE.md §4):
BTH EVXH SETH CC_STATE, or the same plus PORTSTATE. `take_sack` reads either with one unpack
and hands the fields to the plane monitor and the sender, as decoding it (`decode_packet`)
and the session's SACK handler would, without the packet, SETH and CC_STATE records (on an
interpreted build of the wire records, about 3 µs a SACK). Anything else, including every SACK
the strict decoder would refuse, is left untouched for the decoder: the same rules, not a
second set. The session decides when to try it (a plaintext datagram on an established
connection); what a SACK means is the sender's (sender.py).
"""

from __future__ import annotations

from typing import Final

from ...wire.bth import EVX_BIT, PSN_MOD, Opcode
from ...wire.fast import SACK_LAYOUT, SACK_LAYOUT_PS
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
    cack_psn = w8 & _PSN_MASK
    pr = bool(first & _PR)
    if pr:
        planes.on_answer(ack_off & 0xFFFF, m == 0, now)
    if port_state >= 0:
        planes.peer_ports(port_state, now, cack_psn)
    sender.on_sack_fields(
        cack_psn, ack_off, sack_off, bitmap, m, pr, entropy, echo, bool(half & 0x8000),
        (word >> 24) & 0x7F, now,
    )  # fmt: skip
    return True

"""The sender's byte path for ACKNOWLEDGEs: the common one taken straight from its bytes.

Once the responder answers a small message with its ACK alone (docs/DESIGN.md §6), every small
message's round trip brings one ACKNOWLEDGE, and decoding it (`decode_packet`: the BTH, EVXH
and AETH records, then the packet's) cost more than the rest of its handling. Every ACK the
receiver sends on an EVXH connection has one layout (docs/WIRE.md §4): BTH EVXH AETH, 20
bytes. `take_ack` reads it with one unpack and hands its fields to the sender, as the
session's ACKNOWLEDGE handler would; anything else, including every ACK the strict decoder
would refuse (a TVer, an MSN over 16 bits, another length), is left untouched for the decoder:
the same rules, not a second set. The session decides when to try it (a plaintext datagram on
an established connection); what an ACK means is the sender's (sender.py).
"""

from __future__ import annotations

import struct
from typing import Final

from ...wire.bth import EVX_BIT, PSN_MOD, Opcode
from .sender import Sender

_ACK_OP: Final = Opcode.ACKNOWLEDGE.value
#: BTH (opcode, TVer byte, P_Key, EVX | DestQP, PSN word), EVXH, AETH (syndrome 8 | MSN 24).
ACK_LAYOUT: Final = struct.Struct(">BBHIIII")
_SIZE: Final = ACK_LAYOUT.size
# Bound once: compiled, a method called by name is looked up at every call.
_UNPACK: Final = ACK_LAYOUT.unpack_from
_PSN_MASK: Final = PSN_MOD - 1


def take_ack(data: bytes | memoryview, p_key: int, sender: Sender, now: float) -> bool:
    """Act on `data` if it is an ACKNOWLEDGE in the common layout for P_Key `p_key`: True once
    done, False (nothing changed) for anything else."""
    if len(data) != _SIZE:
        return False
    op, b1, pk, w4, w8, _ev, aeth = _UNPACK(data)
    msn = aeth & 0xFFFFFF
    if op != _ACK_OP or b1 & 0x0F or not w4 & EVX_BIT or pk != p_key or msn >> 16:
        return False
    sender.on_acknowledge_fields(w8 & _PSN_MASK, aeth >> 24, msn, now)
    return True

"""The Base Transport Header (docs/WIRE.md §2), the EV extension header (§3) and their constants.

Holds `Opcode` and the opcode families, `BTH` (12 bytes, every packet) and `EVXH` (4 bytes, the
entropy value), plus the well-known QPNs, the RoCE port and the PSN/MSN moduli. Which headers
follow a BTH is `mrc.wire.packet`'s business; what the fields mean to a connection is
`mrc.core`'s.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final, Self

from mrc.wire._codec import Buffer, FixedHeader, check_bits, need
from mrc.wire.errors import DecodeError

CM_LISTEN_QPN: Final = 0x1  # CM_REQUEST goes here (§2)
ENDPOINT_QPN: Final = 0x2  # connectionless endpoint messages (§4)
ROCE_PORT: Final = 4791  # default UDP destination port (§1)
PSN_MOD: Final = 1 << 24
PSN_MASK: Final = PSN_MOD - 1
PSN_HALF: Final = PSN_MOD >> 1
MSN_MOD: Final = 1 << 16


def psn_serial(d: int) -> int:
    """A PSN difference modulo 2^24 as a signed number (serial-number arithmetic)."""
    d &= PSN_MASK
    return d - PSN_MOD if d >= PSN_HALF else d


class Opcode(IntEnum):
    """BTH opcodes (docs/WIRE.md §2 table)."""

    WRITE_FIRST = 0xC6
    WRITE_MIDDLE = 0xC7
    WRITE_LAST = 0xC8
    WRITE_LAST_IMM = 0xC9
    WRITE_ONLY = 0xCA
    WRITE_ONLY_IMM = 0xCB
    ACKNOWLEDGE = 0xD1
    ENDPOINT_REQUEST = 0xD8
    ENDPOINT_RESPONSE = 0xD9
    RELIABILITY_SACK = 0xDC
    RELIABILITY_NACK = 0xDD
    RELIABILITY_PROBE = 0xDE
    CM_REQUEST = 0xE0
    CM_REPLY = 0xE1
    CM_REJECT = 0xE2
    CM_DISCONNECT = 0xE3


DATA_OPCODES: Final = frozenset(
    {
        Opcode.WRITE_FIRST,
        Opcode.WRITE_MIDDLE,
        Opcode.WRITE_LAST,
        Opcode.WRITE_LAST_IMM,
        Opcode.WRITE_ONLY,
        Opcode.WRITE_ONLY_IMM,
    }
)
IMM_OPCODES: Final = frozenset({Opcode.WRITE_LAST_IMM, Opcode.WRITE_ONLY_IMM})
LAST_OPCODES: Final = frozenset(
    {Opcode.WRITE_LAST, Opcode.WRITE_LAST_IMM, Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_IMM}
)
FIRST_OPCODES: Final = frozenset({Opcode.WRITE_FIRST, Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_IMM})
CM_OPCODES: Final = frozenset(
    {Opcode.CM_REQUEST, Opcode.CM_REPLY, Opcode.CM_REJECT, Opcode.CM_DISCONNECT}
)

# int -> Opcode without the cost of calling the enum.
OPCODE_BY_VALUE: Final[dict[int, Opcode]] = {op.value: op for op in Opcode}

# byte 0 opcode | byte 1 SE M PadCnt TVer | bytes 2-3 P_Key | bytes 4-7 F B rsvd EVX + DestQP |
# bytes 8-11 A R RTX TS rsvd + PSN
BTH_STRUCT: Final = struct.Struct(">BBHII")
BTH_SIZE: Final = 12
EVXH_STRUCT: Final = struct.Struct(">I")
EVXH_SIZE: Final = 4

# Bits of the 32-bit words at BTH bytes 4 and 8.
F_BIT: Final = 1 << 31
B_BIT: Final = 1 << 30
EVX_BIT: Final = 1 << 24
A_BIT: Final = 1 << 31
R_BIT: Final = 1 << 30
RTX_BIT: Final = 1 << 29
TS_BIT: Final = 1 << 28
MASK24: Final = 0xFFFFFF


@dataclass(frozen=True, slots=True)
class BTH(FixedHeader):
    """Base Transport Header, 12 bytes (docs/WIRE.md §2).

    `a` asks for an ACKNOWLEDGE, `rtx` marks a retransmission, `ts` says a TSETH follows and
    `evx` says an EVXH follows. `se`, `m`, `pad_cnt`, `fecn`, `becn` and `r` are sent as 0 and
    ignored on receipt; they are kept only so a decoded header re-encodes to the same bytes.
    """

    opcode: Opcode
    dest_qp: int
    psn: int
    a: bool = False
    rtx: bool = False
    ts: bool = False
    evx: bool = False
    p_key: int = 0xFFFF
    se: bool = False
    m: bool = False
    pad_cnt: int = 0
    fecn: bool = False
    becn: bool = False
    r: bool = False

    def _layout(self) -> struct.Struct:
        return BTH_STRUCT

    def _values(self) -> tuple[int, ...]:
        b1 = (
            (0x80 if self.se else 0)
            | (0x40 if self.m else 0)
            | (check_bits("pad_cnt", self.pad_cnt, 2) << 4)
        )
        w4 = (
            (F_BIT if self.fecn else 0)
            | (B_BIT if self.becn else 0)
            | (EVX_BIT if self.evx else 0)
            | check_bits("dest_qp", self.dest_qp, 24)
        )
        w8 = (
            (A_BIT if self.a else 0)
            | (R_BIT if self.r else 0)
            | (RTX_BIT if self.rtx else 0)
            | (TS_BIT if self.ts else 0)
            | check_bits("psn", self.psn, 24)
        )
        return (int(self.opcode), b1, check_bits("p_key", self.p_key, 16), w4, w8)

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 12, "BTH")
        op, b1, p_key, w4, w8 = BTH_STRUCT.unpack_from(buf, offset)
        opcode = OPCODE_BY_VALUE.get(op)
        if opcode is None:
            raise DecodeError("opcode", f"unknown opcode 0x{op:02X}")
        if b1 & 0x0F:
            raise DecodeError("tver", f"transport version {b1 & 0x0F}, expected 0")
        return cls(
            opcode=opcode,
            dest_qp=w4 & MASK24,
            psn=w8 & MASK24,
            a=bool(w8 & A_BIT),
            rtx=bool(w8 & RTX_BIT),
            ts=bool(w8 & TS_BIT),
            evx=bool(w4 & EVX_BIT),
            p_key=p_key,
            se=bool(b1 & 0x80),
            m=bool(b1 & 0x40),
            pad_cnt=(b1 >> 4) & 0x3,
            fecn=bool(w4 & F_BIT),
            becn=bool(w4 & B_BIT),
            r=bool(w8 & R_BIT),
        )


@dataclass(frozen=True, slots=True)
class EVXH(FixedHeader):
    """Entropy-value extension header, 4 bytes [ours] (docs/WIRE.md §3): `plane 8 | selector 24`."""

    ev: int

    def _layout(self) -> struct.Struct:
        return EVXH_STRUCT

    def _values(self) -> tuple[int, ...]:
        return (check_bits("ev", self.ev, 32),)

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 4, "EVXH")
        return cls(EVXH_STRUCT.unpack_from(buf, offset)[0])

"""Acknowledgement headers (docs/WIRE.md §4): SETH, CC_STATE, PORTSTATE, NETH and AETH.

Holds the header dataclasses and their enums (`SackMark`, `NackReason`). Building SACK bitmaps,
reacting to NACK reasons and completing messages on an AETH are `mrc.core`'s job.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final, Self

from mrc.wire._codec import Buffer, FixedHeader, check_bits, check_signed, need
from mrc.wire.errors import DecodeError

# 0 type 4 | next 5 | m 2 | flags 5, 2 ack_psn_offset, 4 entropy, 8 spdcid, 10 dpdcid,
# 12 rsvd 8 | cack_psn 24, 16 cc_type 4 | cc_flags 4, 17 mpr, 18 sack_offset, 20 sack_bitmap
SETH_STRUCT: Final = struct.Struct(">HhIHHIBBhQ")
SETH_SIZE: Final = 28
# tx_timestamp 16 | V 1 | ooo_count 15 | restore_cwnd 1 | rcv_cwnd_pen 7 | rcvd_bytes 24
CCSTATE_STRUCT: Final = struct.Struct(">HHI")
CCSTATE_SIZE: Final = 8
PORTSTATE_STRUCT: Final = struct.Struct(">I")
PORTSTATE_SIZE: Final = 4
# type 4 | next 5 | rsvd 7, nack_reason, vendor, entropy, spdcid, dpdcid, rsvd 8 | nack_psn 24,
# cc_type 4 | cc_flags 4, rsvd 8, tx_timestamp 16
NETH_STRUCT: Final = struct.Struct(">HBBIHHIBxH")
NETH_SIZE: Final = 20
AETH_STRUCT: Final = struct.Struct(">I")  # syndrome 8 | MSN 24
AETH_SIZE: Final = 4

_PR_FLAG: Final = 0x02  # SETH flags: rsvd 3 | PR 1 | PS 1 [ours]
_PS_FLAG: Final = 0x01
_MASK24: Final = 0xFFFFFF


class SackMark(IntEnum):
    """SETH `m` field: what the sender should do with the triggering EV."""

    NONE = 0
    SKIP_ONCE = 1
    ALWAYS_SKIP = 2


class NackReason(IntEnum):
    """NETH `nack_reason` codes (docs/WIRE.md §4 table)."""

    TRIMMED = 0x01
    TRIMMED_LASTHOP = 0x02
    NO_BITMAP = 0x06
    NO_PKT_BUFFER = 0x07
    NO_RESOURCE = 0x0A
    PSN_OOR_WINDOW = 0x0B
    UNEXP_EVENT = 0x19
    BAD_RKEY = 0x80
    OUT_OF_BOUNDS = 0x81


class Syndrome(IntEnum):
    """AETH syndromes as IBTA defines them (docs/WIRE.md §4): bits 7-5 say ACK (000), RNR NAK
    (001) or NAK (011, its code in bits 4-0). `mrc` sends ACK and NAK_REMOTE_ACCESS."""

    #: An ACK whose credit count is "invalid": what MRC peers and `mrc` send for success.
    ACK = 0x1F
    NAK_PSN_SEQUENCE = 0x60
    NAK_INVALID_REQUEST = 0x61
    #: A message failed by BAD_RKEY or OUT_OF_BOUNDS (the NETH reason says which).
    NAK_REMOTE_ACCESS = 0x62
    NAK_REMOTE_OPERATIONAL = 0x63


def syndrome_ok(syndrome: int) -> bool:
    """Any ACK syndrome (0x00-0x1F, whatever its credit count) means the message arrived."""
    return syndrome >> 5 == 0


_SACK_MARKS: Final = {m.value: m for m in SackMark}
_NACK_REASONS: Final = {r.value: r for r in NackReason}


@dataclass(frozen=True, slots=True)
class SETH(FixedHeader):
    """SACK extension header, 28 bytes (type 1).

    `ack_psn_offset` is the triggering PSN - `cack_psn`, or the answered probe_id when `pr` is
    set. Bit i of `sack_bitmap` (i = 0 is the most significant bit) covers PSN
    `cack_psn + sack_offset + i`. `ps` says a PORTSTATE follows the CC_STATE. `mpr` is in units of
    128 PSNs. `type`/`next` are sent as 0 and ignored, like cc_flags; spdcid and dpdcid are
    kept as they came (0 from `mrc`).
    """

    ack_psn_offset: int
    entropy: int
    cack_psn: int
    sack_offset: int
    sack_bitmap: int
    m: SackMark = SackMark.NONE
    pr: bool = False
    ps: bool = False
    mpr: int = 8
    cc_type: int = 0
    spdcid: int = 0
    dpdcid: int = 0

    def _layout(self) -> struct.Struct:
        return SETH_STRUCT

    def _values(self) -> tuple[int, ...]:
        first = (
            (check_bits("m", int(self.m), 2) << 5)
            | (_PR_FLAG if self.pr else 0)
            | (_PS_FLAG if self.ps else 0)
        )
        return (
            first,
            check_signed("ack_psn_offset", self.ack_psn_offset, 16),
            check_bits("entropy", self.entropy, 32),
            check_bits("spdcid", self.spdcid, 16),
            check_bits("dpdcid", self.dpdcid, 16),
            check_bits("cack_psn", self.cack_psn, 24),
            check_bits("cc_type", self.cc_type, 4) << 4,
            check_bits("mpr", self.mpr, 8),
            check_signed("sack_offset", self.sack_offset, 16),
            check_bits("sack_bitmap", self.sack_bitmap, 64),
        )

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 28, "SETH")
        (first, ack_off, entropy, spdcid, dpdcid, cack, cc, mpr, sack_off, bitmap) = (
            SETH_STRUCT.unpack_from(buf, offset)
        )
        m = _SACK_MARKS.get((first >> 5) & 0x3)
        if m is None:
            raise DecodeError("m", "SACK mark 3 must not occur")
        return cls(
            ack_psn_offset=ack_off,
            entropy=entropy,
            cack_psn=cack & _MASK24,
            sack_offset=sack_off,
            sack_bitmap=bitmap,
            m=m,
            pr=bool(first & _PR_FLAG),
            ps=bool(first & _PS_FLAG),
            mpr=mpr,
            cc_type=cc >> 4,
            spdcid=spdcid,
            dpdcid=dpdcid,
        )


@dataclass(frozen=True, slots=True)
class CCState(FixedHeader):
    """Congestion-control state carried in every SACK, 8 bytes.

    `valid` is the V bit: `tx_timestamp` echoes a TSETH. `rcv_cwnd_pen` 0 … 127 is the
    receiver's push-back; `rcvd_bytes` counts payload bytes received, modulo 2^24.
    """

    tx_timestamp: int = 0
    valid: bool = False
    ooo_count: int = 0
    restore_cwnd: bool = False
    rcv_cwnd_pen: int = 0
    rcvd_bytes: int = 0

    def _layout(self) -> struct.Struct:
        return CCSTATE_STRUCT

    def _values(self) -> tuple[int, ...]:
        half = (0x8000 if self.valid else 0) | check_bits("ooo_count", self.ooo_count, 15)
        word = (
            (0x80000000 if self.restore_cwnd else 0)
            | (check_bits("rcv_cwnd_pen", self.rcv_cwnd_pen, 7) << 24)
            | check_bits("rcvd_bytes", self.rcvd_bytes, 24)
        )
        return (check_bits("tx_timestamp", self.tx_timestamp, 16), half, word)

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 8, "CC_STATE")
        ts, half, word = CCSTATE_STRUCT.unpack_from(buf, offset)
        return cls(
            tx_timestamp=ts,
            valid=bool(half & 0x8000),
            ooo_count=half & 0x7FFF,
            restore_cwnd=bool(word & 0x80000000),
            rcv_cwnd_pen=(word >> 24) & 0x7F,
            rcvd_bytes=word & _MASK24,
        )


@dataclass(frozen=True, slots=True)
class PortState(FixedHeader):
    """PORTSTATE, 4 bytes [ours]: plane p can receive iff bit `1 << p` of `mask` is set."""

    mask: int

    def _layout(self) -> struct.Struct:
        return PORTSTATE_STRUCT

    def _values(self) -> tuple[int, ...]:
        return (check_bits("mask", self.mask, 32),)

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 4, "PORTSTATE")
        return cls(PORTSTATE_STRUCT.unpack_from(buf, offset)[0])


@dataclass(frozen=True, slots=True)
class NETH(FixedHeader):
    """NACK extension header, 20 bytes. `entropy` is the EV the NACKed packet came on; vendor,
    spdcid and dpdcid are kept as they came (0 from `mrc`)."""

    nack_reason: NackReason
    entropy: int
    nack_psn: int
    tx_timestamp: int = 0
    vendor: int = 0
    cc_type: int = 0
    spdcid: int = 0
    dpdcid: int = 0

    def _layout(self) -> struct.Struct:
        return NETH_STRUCT

    def _values(self) -> tuple[int, ...]:
        return (
            0,
            check_bits("nack_reason", int(self.nack_reason), 8),
            check_bits("vendor", self.vendor, 8),
            check_bits("entropy", self.entropy, 32),
            check_bits("spdcid", self.spdcid, 16),
            check_bits("dpdcid", self.dpdcid, 16),
            check_bits("nack_psn", self.nack_psn, 24),
            check_bits("cc_type", self.cc_type, 4) << 4,
            check_bits("tx_timestamp", self.tx_timestamp, 16),
        )

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 20, "NETH")
        _first, reason, vendor, entropy, spdcid, dpdcid, psn, cc, ts = NETH_STRUCT.unpack_from(
            buf, offset
        )
        nack_reason = _NACK_REASONS.get(reason)
        if nack_reason is None:
            raise DecodeError("nack_reason", f"unknown NACK reason 0x{reason:02X}")
        return cls(
            nack_reason=nack_reason,
            entropy=entropy,
            nack_psn=psn & _MASK24,
            tx_timestamp=ts,
            vendor=vendor,
            cc_type=cc >> 4,
            spdcid=spdcid,
            dpdcid=dpdcid,
        )


@dataclass(frozen=True, slots=True)
class AETH(FixedHeader):
    """ACK extension header, 4 bytes: the IBTA `syndrome` (`Syndrome`, `syndrome_ok`) and the
    MSN, 24 bits on the wire: the 16-bit MSN zero-extended.
    """

    syndrome: int
    msn: int

    def _layout(self) -> struct.Struct:
        return AETH_STRUCT

    def _values(self) -> tuple[int, ...]:
        return ((check_bits("syndrome", self.syndrome, 8) << 24) | check_bits("msn", self.msn, 16),)

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 4, "AETH")
        (word,) = AETH_STRUCT.unpack_from(buf, offset)
        msn = word & _MASK24
        if msn >> 16:
            raise DecodeError("msn", f"MSN 0x{msn:06X} does not fit in 16 bits")
        return cls(syndrome=word >> 24, msn=msn)

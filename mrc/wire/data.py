"""Data-packet headers after the BTH (docs/WIRE.md §3): METH, TSETH, RETH and ImmDt.

Each is a frozen dataclass with a fixed size. The combined layouts used on the hot path, and the
payload, live in `mrc.wire.packet`; whether a VA/R_Key is acceptable is `mrc.core`'s question.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, Self

from mrc.wire._codec import Buffer, FixedHeader, check_bits, need
from mrc.wire.errors import DecodeError

METH_STRUCT: Final = struct.Struct(">HH")  # RQMSN 16 | MSN 16
METH_SIZE: Final = 4
TSETH_STRUCT: Final = struct.Struct(">HH")  # tx_timestamp 16 | TSR 1 | rsvd 11 | ftype 4
TSETH_SIZE: Final = 4
RETH_STRUCT: Final = struct.Struct(">QII")  # VA 64 | R_Key 32 | DMA_length 32
RETH_SIZE: Final = 16
IMMDT_STRUCT: Final = struct.Struct(">I")
IMMDT_SIZE: Final = 4

MAX_DMA_LENGTH: Final = 1 << 31  # §3: DMA_length is 1 … 2^31


def dma_length_ok(dma_length: int) -> bool:
    """Whether `dma_length` is a legal message length (1 … 2^31)."""
    return 1 <= dma_length <= MAX_DMA_LENGTH


@dataclass(frozen=True, slots=True)
class METH(FixedHeader):
    """Message extension header, 4 bytes: the oldest incomplete MSN and this WRITE's MSN."""

    rqmsn: int
    msn: int

    def _layout(self) -> struct.Struct:
        return METH_STRUCT

    def _values(self) -> tuple[int, ...]:
        return (check_bits("rqmsn", self.rqmsn, 16), check_bits("msn", self.msn, 16))

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 4, "METH")
        rqmsn, msn = METH_STRUCT.unpack_from(buf, offset)
        return cls(rqmsn, msn)


@dataclass(frozen=True, slots=True)
class TSETH(FixedHeader):
    """Timestamp extension header, 4 bytes: the sender's clock in µs modulo 2^16, then TSR 1 |
    rsvd 11 | ftype 4: TSR and rsvd sent as 0 and ignored, `ftype` kept (0 from `mrc`)."""

    tx_timestamp: int
    ftype: int = 0

    def _layout(self) -> struct.Struct:
        return TSETH_STRUCT

    def _values(self) -> tuple[int, ...]:
        ts = check_bits("tx_timestamp", self.tx_timestamp, 16)
        return (ts, check_bits("ftype", self.ftype, 4))

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 4, "TSETH")
        ts, last = TSETH_STRUCT.unpack_from(buf, offset)
        return cls(ts, last & 0x000F)


@dataclass(frozen=True, slots=True)
class RETH(FixedHeader):
    """RDMA extended transport header, 16 bytes.

    `va` is where this packet's first payload byte goes; `dma_length` is the whole message's
    length.
    """

    va: int
    rkey: int
    dma_length: int

    def _layout(self) -> struct.Struct:
        return RETH_STRUCT

    def _values(self) -> tuple[int, ...]:
        if not dma_length_ok(self.dma_length):
            raise ValueError(f"dma_length={self.dma_length} outside 1 … 2^31")
        return (check_bits("va", self.va, 64), check_bits("rkey", self.rkey, 32), self.dma_length)

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 16, "RETH")
        va, rkey, dma_length = RETH_STRUCT.unpack_from(buf, offset)
        if not dma_length_ok(dma_length):
            raise DecodeError("dma_length", f"{dma_length} outside 1 … 2^31")
        return cls(va, rkey, dma_length)


@dataclass(frozen=True, slots=True)
class ImmDt(FixedHeader):
    """Immediate data, 4 bytes, only on `*_IMM` opcodes."""

    imm: int

    def _layout(self) -> struct.Struct:
        return IMMDT_STRUCT

    def _values(self) -> tuple[int, ...]:
        return (check_bits("imm", self.imm, 32),)

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 4, "ImmDt")
        return cls(IMMDT_STRUCT.unpack_from(buf, offset)[0])

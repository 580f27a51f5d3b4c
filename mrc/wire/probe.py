"""Probe and endpoint headers (docs/WIRE.md §4): PETH, ERTH and EETH.

PETH rides on RELIABILITY_PROBE (an EV liveness probe inside a connection); ERTH/EETH ride on
ENDPOINT_REQUEST/RESPONSE (plane status and reverse-EV probes). Scheduling probes and judging
their answers is `mrc.core`'s job.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Self

from mrc.wire._codec import Buffer, FixedHeader, check_bits, check_type_next, need
from mrc.wire.errors import DecodeError

PETH_TYPE = 3
ERTH_TYPE = 4
EETH_TYPE = 5

# type 4 | next 5 | rsvd 7, vendor, rsvd 8, probe_id, rsvd 16, spdcid, dpdcid (sent as 0),
# tx_timestamp, TSR 1 | rsvd 11 | ftype 4 (sent as 0)
PETH_STRUCT = struct.Struct(">HBxH6xH2x")
# type 4 | next 5 | rsvd 5 | op 2, rsvd 8, vendor, port_status_mask, probe_id, rsvd 16,
# tx_timestamp, TSR 1 | rsvd 11 | ftype 4 (sent as 0)
ENDPOINT_STRUCT = struct.Struct(">HxBIH2xH2x")


class EndpointOp(IntEnum):
    """ERTH/EETH operation."""

    PORT_STATUS = 0
    EV_PROBE = 1


_ENDPOINT_OPS = {op.value: op for op in EndpointOp}


@dataclass(frozen=True, slots=True)
class PETH(FixedHeader):
    """Probe extension header, 16 bytes (type 3); answered by a SACK with PR = 1."""

    probe_id: int
    tx_timestamp: int = 0
    vendor: int = 0

    SIZE: ClassVar[int] = 16
    _STRUCT: ClassVar[struct.Struct] = PETH_STRUCT

    def _values(self) -> tuple[int, ...]:
        return (
            PETH_TYPE << 12,
            check_bits("vendor", self.vendor, 8),
            check_bits("probe_id", self.probe_id, 16),
            check_bits("tx_timestamp", self.tx_timestamp, 16),
        )

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 16, "PETH")
        first, vendor, probe_id, ts = PETH_STRUCT.unpack_from(buf, offset)
        check_type_next(first, PETH_TYPE, "PETH")
        return cls(probe_id=probe_id, tx_timestamp=ts, vendor=vendor)


@dataclass(frozen=True, slots=True)
class _EndpointHeader(FixedHeader):
    """Fields shared by ERTH and EETH, 16 bytes each."""

    op: EndpointOp
    port_status_mask: int = 0
    probe_id: int = 0
    tx_timestamp: int = 0
    vendor: int = 0

    SIZE: ClassVar[int] = 16
    TYPE: ClassVar[int]
    _STRUCT: ClassVar[struct.Struct] = ENDPOINT_STRUCT

    def _values(self) -> tuple[int, ...]:
        return (
            (self.TYPE << 12) | check_bits("op", int(self.op), 2),
            check_bits("vendor", self.vendor, 8),
            check_bits("port_status_mask", self.port_status_mask, 32),
            check_bits("probe_id", self.probe_id, 16),
            check_bits("tx_timestamp", self.tx_timestamp, 16),
        )

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        name = cls.__name__
        need(buf, offset, 16, name)
        first, vendor, mask, probe_id, ts = ENDPOINT_STRUCT.unpack_from(buf, offset)
        check_type_next(first, cls.TYPE, name)
        op = _ENDPOINT_OPS.get(first & 0x3)
        if op is None:
            raise DecodeError("op", f"unknown endpoint op {first & 0x3}")
        return cls(op=op, port_status_mask=mask, probe_id=probe_id, tx_timestamp=ts, vendor=vendor)


@dataclass(frozen=True, slots=True)
class ERTH(_EndpointHeader):
    """Endpoint request header (type 4), on ENDPOINT_REQUEST."""

    TYPE: ClassVar[int] = ERTH_TYPE


@dataclass(frozen=True, slots=True)
class EETH(_EndpointHeader):
    """Endpoint response header (type 5), on ENDPOINT_RESPONSE: echoes probe_id and
    tx_timestamp and carries the responder's own port_status_mask."""

    TYPE: ClassVar[int] = EETH_TYPE

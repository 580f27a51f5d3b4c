"""Probe and endpoint headers (docs/WIRE.md §4): PETH, ERTH and EETH.

PETH rides on RELIABILITY_PROBE (an EV liveness probe inside a connection); ERTH/EETH ride on
ENDPOINT_REQUEST/RESPONSE (plane status and reverse-EV probes). An endpoint request's probe id
is not in these headers: it travels in BTH.PSN, as other MRC implementations carry it, and the
response echoes it there (`EndpointPacket.probe_id`). `type`/`next` and reserved fields are sent
as 0 and ignored on receipt; fields `mrc` does not use (vendor, spdcid, dpdcid, ftype) are kept
as they came. Scheduling probes and judging their answers is `mrc.core`'s job.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final, Self

from mrc.wire._codec import Buffer, FixedHeader, check_bits, need
from mrc.wire.errors import DecodeError

# type 4 | next 5 | rsvd 7, vendor, rsvd 8, probe_id, rsvd 16, spdcid, dpdcid, tx_timestamp,
# TSR 1 | rsvd 11 | ftype 4
PETH_STRUCT: Final = struct.Struct(">HBxH2xHHHH")
PETH_SIZE: Final = 16
# type 4 | next 5 | rsvd 5 | op 2, rsvd 8, vendor, port_status_mask, rsvd 32, tx_timestamp,
# TSR 1 | rsvd 11 | ftype 4
ERTH_STRUCT: Final = struct.Struct(">HxBI4xHH")
ERTH_SIZE: Final = 16
# type 4 | next 5 | rsvd 5 | op 2, rsvd 16, 24 bytes MRC reserves (ours: port_status_mask in the
# first 4), tx_timestamp, rsvd 16, rsvd 32
EETH_STRUCT: Final = struct.Struct(">H2xI20xH6x")
EETH_SIZE: Final = 36

_FTYPE: Final = 0x000F


class EndpointOp(IntEnum):
    """ERTH/EETH operation."""

    PORT_STATUS = 0
    EV_PROBE = 1


_ENDPOINT_OPS: Final = {op.value: op for op in EndpointOp}


def _op(first: int) -> EndpointOp:
    op = _ENDPOINT_OPS.get(first & 0x3)
    if op is None:
        raise DecodeError("op", f"unknown endpoint op {first & 0x3}")
    return op


@dataclass(frozen=True, slots=True)
class PETH(FixedHeader):
    """Probe extension header, 16 bytes; answered by a SACK with PR = 1."""

    probe_id: int
    tx_timestamp: int = 0
    vendor: int = 0
    spdcid: int = 0
    dpdcid: int = 0
    ftype: int = 0

    def _layout(self) -> struct.Struct:
        return PETH_STRUCT

    def _values(self) -> tuple[int, ...]:
        return (
            0,
            check_bits("vendor", self.vendor, 8),
            check_bits("probe_id", self.probe_id, 16),
            check_bits("spdcid", self.spdcid, 16),
            check_bits("dpdcid", self.dpdcid, 16),
            check_bits("tx_timestamp", self.tx_timestamp, 16),
            check_bits("ftype", self.ftype, 4),
        )

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 16, "PETH")
        _first, vendor, probe_id, spdcid, dpdcid, ts, last = PETH_STRUCT.unpack_from(buf, offset)
        return cls(probe_id=probe_id, tx_timestamp=ts, vendor=vendor, spdcid=spdcid,
                   dpdcid=dpdcid, ftype=last & _FTYPE)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ERTH(FixedHeader):
    """Endpoint request header, 16 bytes, on ENDPOINT_REQUEST: the sender's receivable planes
    (`port_status_mask`) and its timestamp."""

    op: EndpointOp
    port_status_mask: int = 0
    tx_timestamp: int = 0
    vendor: int = 0
    ftype: int = 0

    def _layout(self) -> struct.Struct:
        return ERTH_STRUCT

    def _values(self) -> tuple[int, ...]:
        return (
            check_bits("op", int(self.op), 2),
            check_bits("vendor", self.vendor, 8),
            check_bits("port_status_mask", self.port_status_mask, 32),
            check_bits("tx_timestamp", self.tx_timestamp, 16),
            check_bits("ftype", self.ftype, 4),
        )

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 16, "ERTH")
        first, vendor, mask, ts, last = ERTH_STRUCT.unpack_from(buf, offset)
        return cls(op=_op(first), port_status_mask=mask, tx_timestamp=ts, vendor=vendor,
                   ftype=last & _FTYPE)  # fmt: skip


@dataclass(frozen=True, slots=True)
class EETH(FixedHeader):
    """Endpoint response header, 36 bytes (MRC's size), on ENDPOINT_RESPONSE: echoes the
    request's op and timestamp and carries the responder's own `port_status_mask` [ours, in
    bytes MRC reserves]."""

    op: EndpointOp
    port_status_mask: int = 0
    tx_timestamp: int = 0

    def _layout(self) -> struct.Struct:
        return EETH_STRUCT

    def _values(self) -> tuple[int, ...]:
        return (
            check_bits("op", int(self.op), 2),
            check_bits("port_status_mask", self.port_status_mask, 32),
            check_bits("tx_timestamp", self.tx_timestamp, 16),
        )

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 36, "EETH")
        first, mask, ts = EETH_STRUCT.unpack_from(buf, offset)
        return cls(op=_op(first), port_status_mask=mask, tx_timestamp=ts)

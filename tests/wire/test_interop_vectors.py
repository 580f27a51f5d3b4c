"""Control packets as other MRC implementations build them (docs/WIRE.md §4, revision 1.1).

Written byte by byte from the published layouts, not from `mrc`'s encoders: every reliability
header's `type`/`next` is 0, reserved bits are 0, the EV rides outside the packet (no EVXH:
BTH.EVX = 0), the RTT echo has no V bit, an ACK's syndrome is IBTA's 0x1F, EETH is 36 bytes and
an endpoint probe id sits in BTH.PSN. Each must decode with every field right and re-encode to
the same bytes.
"""

from __future__ import annotations

import pytest

from mrc.wire.ack import AETH, NETH, SETH, CCState, NackReason, SackMark, Syndrome, syndrome_ok
from mrc.wire.bth import Opcode
from mrc.wire.packet import (
    AckPacket,
    DataPacket,
    EndpointPacket,
    NackPacket,
    Packet,
    ProbePacket,
    SackPacket,
    decode_packet,
)
from mrc.wire.probe import EETH, ERTH, PETH, EndpointOp


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace("|", " "))


VECTORS: list[tuple[str, str, Packet]] = [
    (
        "sack: PSN 0x105 arrived CE-marked, 0x100 missing, spdcid/dpdcid set, no V bit",
        "dc 00 ffff | 00 000010 | 00 000100"  # BTH: SACK, EVX 0, DestQP 0x10, PSN = cack_psn
        " | 0020 0005 | 01000007 | 0011 0022"  # type 0 next 0 m SKIP_ONCE; offset 5; cids
        " | 00 000100 | 00 08 0000 | 0400000000000000"  # cack; cc_type, mpr 8; block; bit 5
        " | 4321 0001 | 00005000",  # CC_STATE: echo 0x4321, V 0, ooo 1; rcvd_bytes
        SackPacket(
            dest_qp=0x10, cack_psn=0x100, ev=0,
            seth=SETH(ack_psn_offset=5, entropy=0x01000007, cack_psn=0x100, sack_offset=0,
                      sack_bitmap=1 << 58, m=SackMark.SKIP_ONCE, mpr=8, spdcid=0x11,
                      dpdcid=0x22),
            cc=CCState(tx_timestamp=0x4321, valid=False, ooo_count=1, rcvd_bytes=0x5000),
            port_state=None, evx=False,
        ),
    ),
    (
        "sack answering a reliability probe (PR), cumulative only",
        "dc 00 8001 | 00 abcdef | 00 fffffe"
        " | 0002 0bad | 02000009 | 0000 0000"  # m NONE, PR; probe id 0x0BAD; entropy
        " | 00 fffffe | 00 10 ffc0 | ffffffffffffffff"  # mpr 16, block starts 64 before
        " | 0000 0000 | 00000000",
        SackPacket(
            dest_qp=0xABCDEF, cack_psn=0xFFFFFE, ev=0,
            seth=SETH(ack_psn_offset=0x0BAD, entropy=0x02000009, cack_psn=0xFFFFFE,
                      sack_offset=-64, sack_bitmap=(1 << 64) - 1, pr=True, mpr=16),
            cc=CCState(), port_state=None, p_key=0x8001, evx=False,
        ),
    ),
    (
        "nack: trimmed at the last hop, vendor byte set",
        "dd 00 ffff | 00 000010 | 00 000123"
        " | 0000 02 5a | 01000007 | 0001 0002 | 00 000123 | 00 00 beef",
        NackPacket(
            dest_qp=0x10, psn=0x123, ev=0,
            neth=NETH(NackReason.TRIMMED_LASTHOP, entropy=0x01000007, nack_psn=0x123,
                      tx_timestamp=0xBEEF, vendor=0x5A, spdcid=1, dpdcid=2),
            evx=False,
        ),
    ),
    (
        "acknowledge: IBTA ACK, credit count invalid",
        "d1 00 ffff | 00 000010 | 00 000200 | 1f 000007",
        AckPacket(dest_qp=0x10, psn=0x200, ev=0, aeth=AETH(Syndrome.ACK, 7), evx=False),
    ),
    (
        "acknowledge: NAK remote access error",
        "d1 00 ffff | 00 000010 | 00 000200 | 62 000008",
        AckPacket(dest_qp=0x10, psn=0x200, ev=0, aeth=AETH(Syndrome.NAK_REMOTE_ACCESS, 8),
                  evx=False),
    ),
    (
        "reliability probe with cids and ftype",
        "de 00 ffff | 00 000010 | 00 000300"
        " | 0000 00 00 | 1234 0000 | 0003 0004 | 0042 0007",
        ProbePacket(dest_qp=0x10, psn=0x300, ev=0,
                    peth=PETH(probe_id=0x1234, tx_timestamp=0x42, spdcid=3, dpdcid=4, ftype=7),
                    evx=False),
    ),
    (
        "endpoint request: EV_PROBE, probe id 0x77 in BTH.PSN",
        "d8 00 ffff | 00 000002 | 00 000077"
        " | 0001 00 00 | 0000000f | 00000000 | 0555 0000",
        EndpointPacket(Opcode.ENDPOINT_REQUEST, dest_qp=0x2, ev=0,
                       header=ERTH(EndpointOp.EV_PROBE, port_status_mask=0xF, tx_timestamp=0x555),
                       probe_id=0x77, evx=False),
    ),
    (
        "endpoint response: 36-byte EETH echoing probe id and timestamp",
        "d9 00 ffff | 00 000002 | 00 000077"
        " | 0001 0000 | 00000003" + " 00" * 20 + " | 0555 0000 | 00000000",
        EndpointPacket(Opcode.ENDPOINT_RESPONSE, dest_qp=0x2, ev=0,
                       header=EETH(EndpointOp.EV_PROBE, port_status_mask=0x3, tx_timestamp=0x555),
                       probe_id=0x77, evx=False),
    ),
    (
        "write middle whose TSETH carries ftype 3",
        "c7 00 ffff | 01 000010 | 10 000123 | 01000007"  # BTH: MIDDLE, EVX, TS | PSN; EVXH
        " | 0001 0002 | 4321 0003"  # METH; TSETH: timestamp, TSR 0, ftype 3
        " | 0000000000001000 | 00000007 | 00002000 | 61 62 63 64",  # RETH; 4 payload bytes
        DataPacket(Opcode.WRITE_MIDDLE, dest_qp=0x10, psn=0x123, ev=0x01000007, a=False, rtx=False,
                   rqmsn=1, msn=2, tx_timestamp=0x4321, va=0x1000, rkey=7, dma_length=0x2000,
                   imm=None, payload=b"abcd", ftype=3),
    ),
    (
        "endpoint request with an EVXH (as mrc sends on IPv4 and loopback)",
        "d8 00 ffff | 01 000044 | 00 000000 | 03000001"
        " | 0000 00 00 | 00000001 | 00000000 | 0000 0000",
        EndpointPacket(Opcode.ENDPOINT_REQUEST, dest_qp=0x44, ev=0x03000001,
                       header=ERTH(EndpointOp.PORT_STATUS, port_status_mask=1)),
    ),
]


@pytest.mark.parametrize(("wire", "record"), [(h(w), r) for _, w, r in VECTORS],
                         ids=[name for name, _, _ in VECTORS])  # fmt: skip
def test_decodes_every_field_and_reencodes_byte_for_byte(wire: bytes, record: Packet) -> None:
    assert decode_packet(wire) == record
    assert record.encode() == wire


def test_ibta_syndromes_read_as_outcomes() -> None:
    assert all(syndrome_ok(s) for s in range(0x20))  # any ACK credit count
    assert not any(syndrome_ok(s) for s in (0x20, 0x3F, 0x60, 0x61, 0x62, 0x63))

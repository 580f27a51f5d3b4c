"""The hot-path encoders write exactly the bytes of the checked records (docs/WIRE.md §2–§4).

`encode_sack` against `SackPacket.encode()`, and the raw layouts `DATA_HEADER` /
`DATA_HEADER_IMM` against `encode_data_header`, over a table of ordinary and edge values; and
`data_headers`, which the receiver reads a whole GRO read's headers with, against the bytes.
"""

from __future__ import annotations

import pytest

from mrc.wire.ack import SETH, CCState, SackMark
from mrc.wire.bth import A_BIT, EVX_BIT, RTX_BIT, TS_BIT, Opcode
from mrc.wire.packet import (
    DATA_HEADER,
    DATA_HEADER_IMM,
    SackPacket,
    decode_packet,
    encode_data_header,
    encode_sack,
)

SACKS = [
    # dest_qp, cack, ev, offset, entropy, sack_offset, bitmap, m, pr, mpr, ts, valid, ooo, rcvd, ps
    (0x10, 0, 0, 0, 0, 0, 0, SackMark.NONE, False, 8, 0, False, 0, 0, None),
    (0xABCDEF, 0xFFFFFF, 0xFFFFFFFF, -0x8000, 0x01000007, 0x7FFF, (1 << 64) - 1,
     SackMark.SKIP_ONCE, False, 255, 0xFFFF, True, 0x7FFF, 0xFFFFFF, 0xFFFFFFFF),
    (77, 1000, 0x02000005, 5, 123456, -3, (1 << 63) | 5, SackMark.ALWAYS_SKIP, True, 1, 1234,
     True, 12, 99999, 0b1011),
]  # fmt: skip


@pytest.mark.parametrize("evx", [True, False])
@pytest.mark.parametrize("row", SACKS)
def test_encode_sack_writes_the_records_bytes(row: tuple, evx: bool) -> None:  # type: ignore[type-arg]
    (qp, cack, ev, off, entropy, soff, bitmap, m, pr, mpr, ts, valid, ooo, rcvd, ps) = row
    record = SackPacket(
        dest_qp=qp,
        cack_psn=cack,
        ev=ev,
        seth=SETH(
            ack_psn_offset=off,
            entropy=entropy,
            cack_psn=cack,
            sack_offset=soff,
            sack_bitmap=bitmap,
            m=m,
            pr=pr,
            ps=ps is not None,
            mpr=mpr,
        ),
        cc=CCState(tx_timestamp=ts, valid=valid, ooo_count=ooo, rcvd_bytes=rcvd),
        port_state=ps,
        p_key=0x8001,
        evx=evx,
    )
    if not evx:
        record.ev = 0  # the EV rides outside the packet (the flow label)
    fast = encode_sack(
        dest_qp=qp,
        cack_psn=cack,
        ev=ev,
        ack_psn_offset=off,
        entropy=entropy,
        sack_offset=soff,
        sack_bitmap=bitmap,
        m=m,
        pr=pr,
        mpr=mpr,
        tx_timestamp=ts,
        valid=valid,
        ooo_count=ooo,
        rcvd_bytes=rcvd,
        port_state=ps,
        p_key=0x8001,
        evx=evx,
    )
    assert fast == record.encode()
    assert decode_packet(fast) == record


@pytest.mark.parametrize(
    "bad",
    [
        {"dest_qp": 1 << 24},
        {"cack_psn": -1},
        {"ack_psn_offset": 0x8000},
        {"sack_offset": -0x8001},
        {"sack_bitmap": 1 << 64},
        {"m": 4},
        {"ooo_count": 1 << 15},
        {"rcvd_bytes": 1 << 24},
        {"entropy": 1 << 32},
        {"port_state": -1},
    ],
)
def test_encode_sack_refuses_what_does_not_fit(bad: dict[str, int]) -> None:
    fields = {
        "dest_qp": 1,
        "cack_psn": 2,
        "ev": 3,
        "ack_psn_offset": 0,
        "entropy": 4,
        "sack_offset": 0,
        "sack_bitmap": 0,
        "port_state": 1,
    }
    fields.update(bad)
    with pytest.raises(ValueError):
        encode_sack(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("opcode", "imm", "a", "rtx"),
    [
        (Opcode.WRITE_FIRST, None, False, False),
        (Opcode.WRITE_MIDDLE, None, False, True),
        (Opcode.WRITE_LAST, None, True, False),
        (Opcode.WRITE_LAST_IMM, 0xFFFFFFFF, True, True),
        (Opcode.WRITE_ONLY, None, True, False),
        (Opcode.WRITE_ONLY_IMM, 0, True, False),
    ],
)
def test_data_header_layouts_write_encode_data_headers_bytes(
    opcode: Opcode, imm: int | None, a: bool, rtx: bool
) -> None:
    fields = {
        "dest_qp": 0xFEDCBA,
        "psn": 0xFFFFFF,
        "ev": 0x03FFFFFF,
        "rqmsn": 0xFFFF,
        "msn": 7,
        "va": (1 << 64) - 4097,
        "rkey": 0xDEADBEEF,
        "dma_length": 1 << 31,
        "tx_timestamp": 0xFFFF,
        "p_key": 0x7FFF,
    }
    expected = encode_data_header(opcode=opcode, a=a, rtx=rtx, imm=imm, **fields)
    w8 = TS_BIT | (A_BIT if a else 0) | (RTX_BIT if rtx else 0) | fields["psn"]
    values = [
        opcode,
        0,
        fields["p_key"],
        EVX_BIT | fields["dest_qp"],
        w8,
        fields["ev"],
        fields["rqmsn"],
        fields["msn"],
        fields["tx_timestamp"],
        fields["va"],
        fields["rkey"],
        fields["dma_length"],
    ]
    if imm is None:
        assert DATA_HEADER.pack(*values) == expected
    else:
        assert DATA_HEADER_IMM.pack(*values, imm) == expected


def test_the_opcode_literals_are_the_opcodes() -> None:
    from mrc.wire import fast

    assert [fast.OP_FIRST, fast.OP_MIDDLE, fast.OP_LAST, fast.OP_LAST_IMM] == [
        Opcode.WRITE_FIRST, Opcode.WRITE_MIDDLE, Opcode.WRITE_LAST, Opcode.WRITE_LAST_IMM
    ]
    assert [fast.OP_ONLY, fast.OP_ONLY_IMM] == [Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_IMM]


def test_data_headers_read_each_datagram_header_of_a_read() -> None:
    """Three datagrams 4140 bytes apart (the last one short): one unpack gives each header's
    `DATA_HEADER_IMM` values, the same as unpacking each on its own, edge values included."""
    from mrc.wire.fast import data_headers

    seg = 4096 + 44
    rows = [  # opcode, psn, va, rkey, dma_length, imm
        (Opcode.WRITE_FIRST, 0, 0, 0, 8193, None),
        (Opcode.WRITE_MIDDLE, 0xFFFFFF, (1 << 64) - 1, 0xFFFFFFFF, 1 << 31, None),
        (Opcode.WRITE_LAST_IMM, 5, 1 << 63, 1, 4097, 0xFEEDFACE),
    ]
    read = bytearray()
    for op, psn, va, rkey, dma, imm in rows:
        hdr = encode_data_header(
            opcode=op, dest_qp=0xABCDEF, psn=psn, ev=0xFFFFFFFF, rqmsn=0xFFFF, msn=0x8001,
            va=va, rkey=rkey, dma_length=dma, imm=imm, tx_timestamp=0xBEEF, p_key=0x8000,
            a=imm is not None, rtx=False,
        )  # fmt: skip
        read += hdr + (bytes(range(256)) * 17)[: seg - len(hdr)]
    del read[2 * seg + 100 :]  # the last datagram of a GRO read may be short
    fields = data_headers(seg, 3).unpack_from(memoryview(read), 0)
    assert len(fields) == 3 * 13
    for k, (op, psn, va, rkey, dma, imm) in enumerate(rows):
        got = fields[13 * k : 13 * k + 13]
        assert got == DATA_HEADER_IMM.unpack_from(read, k * seg)
        assert (got[0], got[2], got[3], got[4] & 0xFFFFFF) == (op, 0x8000, EVX_BIT | 0xABCDEF, psn)
        assert (got[5], got[6], got[7], got[8]) == (0xFFFFFFFF, 0xFFFF, 0x8001, 0xBEEF)
        assert (got[9], got[10], got[11]) == (va, rkey, dma)
        assert got[12] == (imm if imm is not None else 0x00010203)  # else the payload's start
    assert data_headers(seg, 3) is data_headers(seg, 3)  # one layout per (size, count)


def test_data_headers_keeps_a_bounded_number_of_layouts() -> None:
    from mrc.wire import fast

    for seg in range(44, 44 + 2 * 256):
        fast.data_headers(seg, 2)
    assert 0 < len(fast._headers_cache) <= 256
    for seg, count in ((43, 2), (4140, 0), (4140, 256)):
        with pytest.raises(ValueError, match="data_headers"):
            fast.data_headers(seg, count)


@pytest.mark.parametrize("evx", [True, False])
@pytest.mark.parametrize("ts", [True, False])
def test_bth_peek_reads_opcode_evx_destqp_and_ts_as_the_decoder_does(evx: bool, ts: bool) -> None:
    """A golden BTH (bytes written out by hand from docs/WIRE.md §2) and the strict decoder
    agree with `BTH_PEEK` on what the secured gate sorts full packets by."""
    from mrc.wire.bth import BTH
    from mrc.wire.fast import BTH_PEEK

    golden = bytes(
        [
            *(0xC7, 0x00, 0x7F, 0xFF),  # WRITE_MIDDLE, flags 0, P_Key 0x7FFF
            *(0x01 if evx else 0x00, 0xAB, 0xCD, 0xEF),  # EVX (bit 24), DestQP 0xABCDEF
            *(0x10 if ts else 0x00, 0x12, 0x34, 0x56),  # TS (bit 28), PSN 0x123456
        ]
    )
    op, w4, b8 = BTH_PEEK.unpack_from(golden, 0)
    bth = BTH.decode(golden)
    assert op == bth.opcode == Opcode.WRITE_MIDDLE
    assert w4 & 0xFFFFFF == bth.dest_qp == 0xABCDEF
    assert bool(w4 & EVX_BIT) == bth.evx == evx
    assert bool(b8 << 24 & TS_BIT) == bth.ts == ts

"""Hypothesis round-trips: decode(encode(x)) == x for every header and every packet kind."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from test_headers import SIZES  # the same directory, on sys.path under pytest

from mrc.wire import (
    AETH,
    BTH,
    CM_OPCODES,
    CMH,
    DATA_OPCODES,
    EETH,
    ERTH,
    EVXH,
    IMM_OPCODES,
    MAX_PRIVATE_DATA,
    METH,
    NETH,
    PETH,
    RETH,
    SETH,
    TSETH,
    AckPacket,
    CCState,
    CmPacket,
    DataPacket,
    DecodeError,
    EndpointOp,
    EndpointPacket,
    ImmDt,
    KeyBlock,
    NackPacket,
    NackReason,
    Opcode,
    PortState,
    ProbePacket,
    SackMark,
    SackPacket,
    Trailer,
    data_header_size,
    decode_packet,
    encode_data_header,
    peek_dest_qp,
    peek_opcode,
)


def bits(n: int) -> st.SearchStrategy[int]:
    return st.integers(0, (1 << n) - 1)


def signed(n: int) -> st.SearchStrategy[int]:
    return st.integers(-(1 << (n - 1)), (1 << (n - 1)) - 1)


u8, u16, u24, u32, u64 = bits(8), bits(16), bits(24), bits(32), bits(64)
dma_lengths = st.integers(1, 1 << 31)

bths = st.builds(
    BTH,
    opcode=st.sampled_from(Opcode),
    dest_qp=u24,
    psn=u24,
    a=st.booleans(),
    rtx=st.booleans(),
    ts=st.booleans(),
    evx=st.booleans(),
    p_key=u16,
    se=st.booleans(),
    m=st.booleans(),
    pad_cnt=bits(2),
    fecn=st.booleans(),
    becn=st.booleans(),
    r=st.booleans(),
)
seths = st.builds(
    SETH,
    ack_psn_offset=signed(16),
    entropy=u32,
    cack_psn=u24,
    sack_offset=signed(16),
    sack_bitmap=u64,
    m=st.sampled_from(SackMark),
    pr=st.booleans(),
    ps=st.booleans(),
    mpr=u8,
    cc_type=bits(4),
    spdcid=u16,
    dpdcid=u16,
)
ccs = st.builds(
    CCState,
    tx_timestamp=u16,
    valid=st.booleans(),
    ooo_count=bits(15),
    restore_cwnd=st.booleans(),
    rcv_cwnd_pen=bits(7),
    rcvd_bytes=u24,
)
neths = st.builds(
    NETH,
    nack_reason=st.sampled_from(NackReason),
    entropy=u32,
    nack_psn=u24,
    tx_timestamp=u16,
    vendor=u8,
    cc_type=bits(4),
    spdcid=u16,
    dpdcid=u16,
)
aeths = st.builds(AETH, syndrome=u8, msn=u16)
peths = st.builds(PETH, probe_id=u16, tx_timestamp=u16, vendor=u8, spdcid=u16, dpdcid=u16,
                  ftype=bits(4))  # fmt: skip
endpoint_fields: dict[str, Any] = dict(
    op=st.sampled_from(EndpointOp), port_status_mask=u32, tx_timestamp=u16
)
erths = st.builds(ERTH, **endpoint_fields, vendor=u8, ftype=bits(4))
eeths = st.builds(EETH, **endpoint_fields)
cmhs = st.builds(
    CMH,
    local_qpn=u24,
    remote_qpn=u24,
    initial_psn=u24,
    mpr=u8,
    payload_mtu=u16,
    plane_count=u8,
    ev_per_plane=u8,
    plane_mask=u32,
    max_imm=u16,
    security=u8,
    nonce=st.binary(min_size=16, max_size=16),
    connection_id=u64,
    plane=u8,
    reject_reason=u16,
    private_data_len=st.integers(0, MAX_PRIVATE_DATA),
    version=u8,
    flags=u16,
)
key_blocks = st.builds(
    KeyBlock,
    ephemeral=st.binary(min_size=32, max_size=32),
    static=st.binary(min_size=32, max_size=32),
)

HEADERS = st.one_of(
    bths,
    st.builds(EVXH, ev=u32),
    st.builds(METH, rqmsn=u16, msn=u16),
    st.builds(TSETH, tx_timestamp=u16),
    st.builds(RETH, va=u64, rkey=u32, dma_length=dma_lengths),
    st.builds(ImmDt, imm=u32),
    seths,
    ccs,
    st.builds(PortState, mask=u32),
    neths,
    aeths,
    peths,
    erths,
    eeths,
    cmhs,
    key_blocks,
    st.builds(Trailer, tx_counter=u64, tag=st.binary(min_size=16, max_size=16)),
)


@given(HEADERS, st.integers(0, 7))
def test_header_roundtrip(header: Any, pad: int) -> None:
    cls = type(header)
    wire = header.encode()
    assert len(wire) == SIZES[cls]
    assert cls.decode(wire) == header
    buf = bytearray(pad + SIZES[cls])
    assert header.encode_into(buf, pad) == pad + SIZES[cls]
    assert cls.decode(memoryview(buf), pad) == header


@st.composite
def data_packets(draw: st.DrawFn) -> DataPacket:
    opcode = draw(st.sampled_from(sorted(DATA_OPCODES)))
    return DataPacket(
        opcode=opcode,
        dest_qp=draw(u24),
        psn=draw(u24),
        ev=draw(u32),
        a=draw(st.booleans()),
        rtx=draw(st.booleans()),
        rqmsn=draw(u16),
        msn=draw(u16),
        tx_timestamp=draw(st.none() | u16),
        va=draw(u64),
        rkey=draw(u32),
        dma_length=draw(dma_lengths),
        imm=draw(u32) if opcode in IMM_OPCODES else None,
        payload=draw(st.binary(min_size=1, max_size=64)),
        p_key=draw(u16),
    )


@st.composite
def sack_packets(draw: st.DrawFn) -> SackPacket:
    seth = draw(seths)
    return SackPacket(
        dest_qp=draw(u24),
        cack_psn=draw(u24),
        ev=draw(u32),
        seth=seth,
        cc=draw(ccs),
        port_state=draw(u32) if seth.ps else None,
        p_key=draw(u16),
    )


@st.composite
def endpoint_packets(draw: st.DrawFn) -> EndpointPacket:
    opcode = draw(st.sampled_from([Opcode.ENDPOINT_REQUEST, Opcode.ENDPOINT_RESPONSE]))
    header = draw(erths if opcode is Opcode.ENDPOINT_REQUEST else eeths)
    return EndpointPacket(opcode, dest_qp=draw(u24), ev=draw(u32), header=header, p_key=draw(u16),
                          probe_id=draw(u16))  # fmt: skip


@st.composite
def cm_packets(draw: st.DrawFn) -> CmPacket:
    cmh = draw(cmhs)
    return CmPacket(
        opcode=draw(st.sampled_from(sorted(CM_OPCODES))),
        dest_qp=draw(u24),
        cmh=cmh,
        key_block=draw(key_blocks) if cmh.security else None,
        private_data=draw(st.binary(min_size=cmh.private_data_len, max_size=cmh.private_data_len)),
        p_key=draw(u16),
    )


PACKETS = st.one_of(
    data_packets(),
    sack_packets(),
    st.builds(NackPacket, dest_qp=u24, psn=u24, ev=u32, neth=neths, p_key=u16),
    st.builds(AckPacket, dest_qp=u24, psn=u24, ev=u32, aeth=aeths, p_key=u16),
    st.builds(ProbePacket, dest_qp=u24, psn=u24, ev=u32, peth=peths, p_key=u16),
    endpoint_packets(),
    cm_packets(),
)


@given(PACKETS)
def test_packet_roundtrip(packet: Any) -> None:
    wire = packet.encode()
    decoded = decode_packet(wire)
    assert type(decoded) is type(packet)
    assert decoded == packet
    assert decoded.encode() == wire
    assert peek_dest_qp(wire) == packet.dest_qp
    assert peek_opcode(wire) == wire[0]


def fast_header(packet: DataPacket) -> bytes:
    """The sender's one-call header encoder, fed from a decoded record."""
    return encode_data_header(
        opcode=packet.opcode,
        dest_qp=packet.dest_qp,
        psn=packet.psn,
        ev=packet.ev,
        a=packet.a,
        rtx=packet.rtx,
        rqmsn=packet.rqmsn,
        msn=packet.msn,
        va=packet.va,
        rkey=packet.rkey,
        dma_length=packet.dma_length,
        tx_timestamp=packet.tx_timestamp,
        imm=packet.imm,
        p_key=packet.p_key,
    )


@given(data_packets())
def test_data_fast_path_agrees(packet: DataPacket) -> None:
    header = fast_header(packet)
    assert len(header) == data_header_size(packet.opcode, packet.tx_timestamp is not None)
    assert header + bytes(packet.payload) == packet.encode()
    bth = BTH.decode(header)
    assert (bth.opcode, bth.dest_qp, bth.psn, bth.a, bth.rtx, bth.evx) == (
        packet.opcode,
        packet.dest_qp,
        packet.psn,
        packet.a,
        packet.rtx,
        True,
    )
    assert bth.ts == (packet.tx_timestamp is not None)


def _decode_or_fail_cleanly(data: bytes) -> None:
    try:
        packet = decode_packet(data)
    except DecodeError:
        return
    # Whatever decodes is a valid record: it re-encodes and decodes to itself.
    assert decode_packet(packet.encode()) == packet


@given(st.binary(max_size=160))
def test_random_bytes_raise_only_decode_error(data: bytes) -> None:
    _decode_or_fail_cleanly(data)


@given(PACKETS, st.lists(st.tuples(st.integers(0, 400), u8), min_size=1, max_size=4))
def test_mutated_packets_raise_only_decode_error(packet: Any, edits: list[tuple[int, int]]) -> None:
    wire = bytearray(packet.encode())
    for index, value in edits:
        wire[index % len(wire)] = value
    _decode_or_fail_cleanly(bytes(wire))


@given(PACKETS, st.integers(0, 400))
def test_cut_packets_raise_only_decode_error(packet: Any, cut: int) -> None:
    wire = packet.encode()
    _decode_or_fail_cleanly(wire[: cut % len(wire)])

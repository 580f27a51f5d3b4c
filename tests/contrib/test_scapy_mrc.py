"""The scapy layers (mrc.contrib.scapy_mrc) against the codecs (mrc.wire), both ways.

For every opcode and header variant (with and without EVXH and TSETH, the two `*_IMM` data
opcodes, SACK with and without PORTSTATE, every CM opcode with and without a key block, the
endpoint probe id in BTH.PSN): the encoder's bytes dissect in scapy into exactly the expected
layers with every field equal to the record, and the same layers built in scapy encode to the
encoder's bytes and decode with `decode_packet` to the record. `expected` spells out, per
record, which scapy field holds which record field (docs/WIRE.md §2–§6); hypothesis then
repeats both directions on random records.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

scapy_mrc = pytest.importorskip("mrc.contrib.scapy_mrc")

from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.packet import Raw  # noqa: E402

from mrc.wire import (  # noqa: E402
    AETH,
    CMH,
    EETH,
    ERTH,
    NETH,
    PETH,
    SETH,
    AckPacket,
    CCState,
    CmPacket,
    DataPacket,
    EndpointOp,
    EndpointPacket,
    KeyBlock,
    NackPacket,
    NackReason,
    Opcode,
    Packet,
    ProbePacket,
    SackMark,
    SackPacket,
    decode_packet,
)

L: Any = scapy_mrc
Layers = list[tuple[Any, dict[str, Any]]]


def bth(op: Opcode, dest_qp: int, psn: int, *, evx: bool, p_key: int = 0xFFFF, a: bool = False,
        rtx: bool = False, ts: bool = False) -> dict[str, Any]:  # fmt: skip
    fields = {"opcode": op.value, "dest_qp": dest_qp, "evx": int(evx), "ts": int(ts),
              "a": int(a), "rtx": int(rtx), "p_key": p_key}  # fmt: skip
    if op in (Opcode.ENDPOINT_REQUEST, Opcode.ENDPOINT_RESPONSE):
        fields.update(psn_rsvd=0, probe_id=psn)
    else:
        fields["psn"] = psn
    return fields


def seth_fields(s: SETH) -> dict[str, Any]:
    return {"type": 0, "next": 0, "m": int(s.m), "pr": int(s.pr), "ps": int(s.ps),
            "ack_psn_offset": s.ack_psn_offset, "entropy": s.entropy, "spdcid": s.spdcid,
            "dpdcid": s.dpdcid, "cack_psn": s.cack_psn, "cc_type": s.cc_type, "cc_flags": 0,
            "mpr": s.mpr, "sack_offset": s.sack_offset, "sack_bitmap": s.sack_bitmap}  # fmt: skip


def expected(p: Packet, evx: bool = True) -> Layers:
    """The scapy layers, in order, that hold record `p`, with the value of every field."""
    if isinstance(p, DataPacket):
        ts = p.tx_timestamp is not None
        out: Layers = [(L.MRC_BTH, bth(p.opcode, p.dest_qp, p.psn, evx=evx, p_key=p.p_key,
                                       a=p.a, rtx=p.rtx, ts=ts))]  # fmt: skip
        if evx:
            out.append((L.MRC_EVXH, {"ev": p.ev}))
        out.append((L.MRC_METH, {"rqmsn": p.rqmsn, "msn": p.msn}))
        if ts:
            out.append((L.MRC_TSETH, {"tx_timestamp": p.tx_timestamp, "tsr": 0,
                                      "ftype": p.ftype}))  # fmt: skip
        out.append((L.MRC_RETH, {"va": p.va, "rkey": p.rkey, "dma_length": p.dma_length}))
        if p.imm is not None:
            out.append((L.MRC_ImmDt, {"imm": p.imm}))
        return [*out, (Raw, {"load": bytes(p.payload)})]
    if isinstance(p, CmPacket):
        c = p.cmh
        out = [
            (L.MRC_BTH, bth(p.opcode, p.dest_qp, 0, evx=False, p_key=p.p_key)),
            (L.MRC_CMH, {"version": c.version, "plane": c.plane, "flags": c.flags,
                         "local_qpn": c.local_qpn, "remote_qpn": c.remote_qpn,
                         "initial_psn": c.initial_psn, "mpr": c.mpr,
                         "payload_mtu": c.payload_mtu, "plane_count": c.plane_count,
                         "ev_per_plane": c.ev_per_plane, "plane_mask": c.plane_mask,
                         "max_imm": c.max_imm, "security": c.security, "nonce": c.nonce,
                         "reject_reason": c.reject_reason,
                         "private_data_len": c.private_data_len,
                         "connection_id": c.connection_id}),
        ]  # fmt: skip
        if p.key_block is not None:
            out.append((L.MRC_KeyBlock, {"ephemeral": p.key_block.ephemeral,
                                         "static": p.key_block.static}))  # fmt: skip
        return out + ([(Raw, {"load": p.private_data})] if p.private_data else [])
    evx = p.evx
    if isinstance(p, SackPacket):
        out = [(L.MRC_BTH, bth(Opcode.RELIABILITY_SACK, p.dest_qp, p.cack_psn, evx=evx,
                               p_key=p.p_key))]  # fmt: skip
        tail: Layers = [
            (L.MRC_SETH, seth_fields(p.seth)),
            (L.MRC_CCState, {"tx_timestamp": p.cc.tx_timestamp, "v": int(p.cc.valid),
                             "ooo_count": p.cc.ooo_count,
                             "restore_cwnd": int(p.cc.restore_cwnd),
                             "rcv_cwnd_pen": p.cc.rcv_cwnd_pen,
                             "rcvd_bytes": p.cc.rcvd_bytes}),
        ]  # fmt: skip
        if p.port_state is not None:
            tail.append((L.MRC_PortState, {"port_state_mask": p.port_state}))
    elif isinstance(p, NackPacket):
        n = p.neth
        out = [(L.MRC_BTH, bth(Opcode.RELIABILITY_NACK, p.dest_qp, p.psn, evx=evx,
                               p_key=p.p_key))]  # fmt: skip
        tail = [(L.MRC_NETH, {"type": 0, "next": 0, "nack_reason": int(n.nack_reason),
                              "vendor": n.vendor, "entropy": n.entropy, "spdcid": n.spdcid,
                              "dpdcid": n.dpdcid, "nack_psn": n.nack_psn,
                              "cc_type": n.cc_type, "tx_timestamp": n.tx_timestamp})]  # fmt: skip
    elif isinstance(p, AckPacket):
        out = [(L.MRC_BTH, bth(Opcode.ACKNOWLEDGE, p.dest_qp, p.psn, evx=evx, p_key=p.p_key))]
        tail = [(L.MRC_AETH, {"syndrome": p.aeth.syndrome, "msn": p.aeth.msn})]
    elif isinstance(p, ProbePacket):
        q = p.peth
        out = [(L.MRC_BTH, bth(Opcode.RELIABILITY_PROBE, p.dest_qp, p.psn, evx=evx,
                               p_key=p.p_key))]  # fmt: skip
        tail = [(L.MRC_PETH, {"type": 0, "next": 0, "vendor": q.vendor, "probe_id": q.probe_id,
                              "spdcid": q.spdcid, "dpdcid": q.dpdcid,
                              "tx_timestamp": q.tx_timestamp, "tsr": 0,
                              "ftype": q.ftype})]  # fmt: skip
    else:
        assert isinstance(p, EndpointPacket)
        out = [(L.MRC_BTH, bth(p.opcode, p.dest_qp, p.probe_id, evx=evx, p_key=p.p_key))]
        hd = p.header
        if isinstance(hd, ERTH):
            tail = [(L.MRC_ERTH, {"type": 0, "next": 0, "op": int(hd.op), "vendor": hd.vendor,
                                  "port_status_mask": hd.port_status_mask,
                                  "tx_timestamp": hd.tx_timestamp, "ftype": hd.ftype})]  # fmt: skip
        else:
            tail = [(L.MRC_EETH, {"type": 0, "next": 0, "op": int(hd.op),
                                  "port_status_mask": hd.port_status_mask,
                                  "tx_timestamp": hd.tx_timestamp})]  # fmt: skip
    if evx:
        out.append((L.MRC_EVXH, {"ev": p.ev}))
    return out + tail


def build(layers: Layers) -> Any:
    """The scapy packet made of `layers`, every field set as given."""
    pkt = None
    for cls, fields in layers:
        layer = cls(**fields)
        pkt = layer if pkt is None else pkt / layer
    return pkt


def check_dissected(wire: bytes, layers: Layers) -> None:
    pkt = L.MRC_BTH(wire)
    got = []
    layer = pkt
    while layer:
        got.append(type(layer))
        layer = layer.payload
    assert got == [cls for cls, _ in layers]
    for cls, fields in layers:
        values = {name: pkt[cls].getfieldval(name) for name in fields}
        assert values == fields, cls.__name__


def same_record(a: Packet, b: Packet) -> None:
    assert type(a) is type(b)
    if isinstance(a, DataPacket) and isinstance(b, DataPacket):
        a.payload, b.payload = bytes(a.payload), bytes(b.payload)
    assert a == b


def data(op: Opcode, *, ts: int | None, imm: int | None = None, **kw: Any) -> DataPacket:
    f: dict[str, Any] = dict(dest_qp=0x123456, psn=0xABCDEF, ev=0x01000007, a=True, rtx=False,
                             rqmsn=5, msn=6, va=0x1122334455667788, rkey=0xDEADBEEF,
                             dma_length=100, payload=b"\x5a" * 100)  # fmt: skip
    f.update(kw)
    return DataPacket(opcode=op, tx_timestamp=ts, imm=imm, **f)


SETH_A = SETH(ack_psn_offset=5, entropy=0x01000007, cack_psn=0x100, sack_offset=0,
              sack_bitmap=1 << 58, m=SackMark.SKIP_ONCE, ps=True)  # fmt: skip
SETH_B = SETH(ack_psn_offset=-3, entropy=0x02000009, cack_psn=0xFFFFFE, sack_offset=-64,
              sack_bitmap=(1 << 64) - 1, pr=True, mpr=255, cc_type=3, spdcid=0x11,
              dpdcid=0x22, m=SackMark.ALWAYS_SKIP)  # fmt: skip
CC = CCState(tx_timestamp=0x4321, valid=True, ooo_count=0x7FFF, restore_cwnd=True,
             rcv_cwnd_pen=127, rcvd_bytes=0xABCDEF)  # fmt: skip


def cmh(security: int, private: int, **kw: Any) -> CMH:
    f: dict[str, Any] = dict(local_qpn=0xABCDEF, remote_qpn=0x10, initial_psn=0xFFFFFF, mpr=8,
                             payload_mtu=4096, plane_count=4, ev_per_plane=16, plane_mask=0xF,
                             max_imm=64, nonce=bytes(range(15)) + b"\0", connection_id=2**64 - 1,
                             plane=2)  # fmt: skip
    f.update(kw)
    return CMH(security=security, private_data_len=private, **f)


KEYS = KeyBlock(ephemeral=b"\x11" * 31 + b"\0", static=b"\x22" * 32)

RECORDS: list[tuple[str, Packet]] = [
    *[(f"{op.name}-ts", data(op, ts=0x4321, imm=0x99 if "IMM" in op.name else None))
      for op in Opcode if op.name.startswith("WRITE")],
    *[(f"{op.name}-nots", data(op, ts=None, imm=0 if "IMM" in op.name else None, rtx=True,
                                a=False)) for op in Opcode if op.name.startswith("WRITE")],
    ("ack", AckPacket(dest_qp=0x10, psn=0x100, ev=0x01000002, aeth=AETH(0x1F, 0xFFFF))),
    ("ack-nak-noevx", AckPacket(0x10, 7, 0, AETH(0x62, 3), p_key=0x8001, evx=False)),
    ("sack-ps", SackPacket(0x10, 0x100, 0x02000001, SETH_A, CC, 0xF)),
    ("sack-plain", SackPacket(0x10, 0xFFFFFE, 0x02000001, SETH_B, CCState(), None)),
    ("sack-noevx", SackPacket(0xABCDEF, 0xFFFFFE, 0, SETH_B, CC, None, evx=False)),
    *[(f"nack-{r.name}", NackPacket(0x20, 0x42, 0x03000004,
                                    NETH(r, 0x03000004, 0x42, 0x1234, vendor=9, cc_type=1,
                                         spdcid=5, dpdcid=6)))
      for r in NackReason],
    ("nack-noevx", NackPacket(0x20, 0x42, 0, NETH(NackReason.TRIMMED, 7, 0x42), evx=False)),
    ("probe", ProbePacket(0x30, 0x999, 0x01000003,
                          PETH(0xBEEF, 0x1234, vendor=3, spdcid=1, dpdcid=2, ftype=5))),
    ("probe-noevx", ProbePacket(0x30, 0x999, 0, PETH(1), evx=False)),
    ("ep-request-status", EndpointPacket(Opcode.ENDPOINT_REQUEST, 0x40, 0x01000001,
                                         ERTH(EndpointOp.PORT_STATUS, 0xF, 0x55))),
    ("ep-request-probe", EndpointPacket(Opcode.ENDPOINT_REQUEST, 0x40, 0x02000005,
                                        ERTH(EndpointOp.EV_PROBE, 0x3, 0xFFFF, vendor=1,
                                             ftype=0xA), probe_id=0xBEEF)),
    ("ep-response", EndpointPacket(Opcode.ENDPOINT_RESPONSE, 0x40, 0x02000005,
                                   EETH(EndpointOp.EV_PROBE, 0xFFFFFFFF, 0xBEEF),
                                   probe_id=0xFFFF)),
    ("ep-response-noevx", EndpointPacket(Opcode.ENDPOINT_RESPONSE, 0x40, 0,
                                         EETH(EndpointOp.PORT_STATUS), probe_id=1, evx=False)),
    *[(f"{op.name}-{sec}", CmPacket(op, 0x1 if op is Opcode.CM_REQUEST else 0x77,
                                    cmh(sec, 5 if op in (Opcode.CM_REQUEST, Opcode.CM_REPLY)
                                        else 0, reject_reason=6 * (op is Opcode.CM_REJECT)),
                                    KEYS if sec else None,
                                    b"hello" if op in (Opcode.CM_REQUEST, Opcode.CM_REPLY)
                                    else b""))
      for op in Opcode if op.name.startswith("CM_") for sec in (0, 2)],
]  # fmt: skip


def test_every_opcode_is_covered() -> None:
    ops = {getattr(r, "opcode", None) or type(r).__name__ for _, r in RECORDS}
    assert {Opcode(o) for o in ops if isinstance(o, int)} | {
        Opcode.ACKNOWLEDGE, Opcode.RELIABILITY_SACK, Opcode.RELIABILITY_NACK,
        Opcode.RELIABILITY_PROBE} == set(Opcode)  # fmt: skip
    assert {"AckPacket", "SackPacket", "NackPacket", "ProbePacket"} <= ops


@pytest.mark.parametrize("record", [r for _, r in RECORDS], ids=[n for n, _ in RECORDS])
def test_encoder_bytes_dissect_field_for_field(record: Packet) -> None:
    check_dissected(record.encode(), expected(record))


@pytest.mark.parametrize("record", [r for _, r in RECORDS], ids=[n for n, _ in RECORDS])
def test_scapy_built_packets_decode_to_the_record(record: Packet) -> None:
    wire = bytes(build(expected(record)))
    assert wire == record.encode()
    same_record(decode_packet(wire), record)


def test_data_without_evxh_both_ways() -> None:
    # No encoder writes a data packet without EVXH (others do): scapy builds it, mrc reads ev 0.
    for op in (Opcode.WRITE_FIRST, Opcode.WRITE_LAST_IMM):
        record = data(op, ts=0x10, imm=7 if op is Opcode.WRITE_LAST_IMM else None, ev=0)
        layers = expected(record, evx=False)
        wire = bytes(build(layers))
        assert len(wire) == 36 + (4 if record.imm is not None else 0) + 100
        same_record(decode_packet(wire), record)
        check_dissected(wire, layers)


def test_known_bytes_of_docs_example() -> None:
    # The WRITE_ONLY_IMM example of docs/WIRE.md §3, built in scapy with the implied fields
    # (EVX, TS) left to the layers.
    pkt = (L.MRC_BTH(opcode=Opcode.WRITE_ONLY_IMM, dest_qp=0x123456, psn=0xABCDEF, a=1)
           / L.MRC_EVXH(ev=0x01000007) / L.MRC_METH(rqmsn=5, msn=6)
           / L.MRC_TSETH(tx_timestamp=0x4321)
           / L.MRC_RETH(va=0x1122334455667788, rkey=0xDEADBEEF, dma_length=100)
           / L.MRC_ImmDt(imm=0x99))  # fmt: skip
    assert bytes(pkt).hex() == (
        "cb00ffff0112345690abcdef01000007000500064321000011223344556677"
        "88deadbeef0000006400000099"
    )


def test_implied_fields_when_building() -> None:
    sack = bytes(L.MRC_BTH(dest_qp=0x10, psn=0x100) / L.MRC_EVXH(ev=2)
                 / L.MRC_SETH(cack_psn=0x100) / L.MRC_CCState() / L.MRC_PortState(
                     port_state_mask=0xF))  # fmt: skip
    rec = decode_packet(sack)
    assert isinstance(rec, SackPacket)
    assert (rec.ev, rec.evx, rec.seth.ps, rec.port_state) == (2, True, True, 0xF)
    cm = bytes(L.MRC_BTH(dest_qp=1) / L.MRC_CMH(security=1) / L.MRC_KeyBlock() / b"abc")
    rec_cm = decode_packet(cm)
    assert isinstance(rec_cm, CmPacket)
    assert rec_cm.opcode is Opcode.CM_REQUEST
    assert (rec_cm.cmh.private_data_len, rec_cm.private_data) == (3, b"abc")
    only = decode_packet(bytes(L.MRC_BTH() / L.MRC_METH() / L.MRC_RETH() / b"x"))
    assert isinstance(only, DataPacket)
    assert (only.opcode, only.ev, only.tx_timestamp) == (Opcode.WRITE_ONLY, 0, None)


def test_bound_to_udp_4791_both_ways_and_ahead_of_roce() -> None:
    roce = pytest.importorskip("scapy.contrib.roce")
    record = RECORDS[0][1]
    pkt = IP(bytes(IP(dst="127.0.0.1") / UDP() / L.MRC_BTH(record.encode())))
    assert (pkt[UDP].sport, pkt[UDP].dport) == (4791, 4791)
    assert pkt.haslayer(L.MRC_RETH)
    back = IP(bytes(IP() / UDP(sport=4791, dport=50000) / record.encode()))
    assert back[L.MRC_BTH].psn == 0xABCDEF
    # A datagram that cannot be MRC (an IBTA RC opcode) stays RoCE's.
    rc_bytes = bytes.fromhex("0a00ffff00000010800000010000000000000000")
    rc = IP(bytes(IP() / UDP(dport=4791) / rc_bytes))
    assert type(rc[UDP].payload) is roce.BTH
    # RoCE's BTH still reads the 12 bytes the two share.
    theirs = roce.BTH(record.encode())
    assert (theirs.opcode, theirs.dqpn, theirs.psn, theirs.ackreq) == (0xC6, 0x123456, 0xABCDEF, 1)


def test_malformed_bytes_dissect_as_far_as_they_go() -> None:
    wire = RECORDS[-1][1].encode()
    for cut in (1, 11, 12, 40, 75):
        # Below UDP, scapy keeps what does not dissect as Raw: the bytes all survive.
        datagram = bytes(IP() / UDP(dport=4791) / wire[:cut])
        pkt = IP(datagram)
        assert bytes(pkt) == datagram
        assert pkt.haslayer(L.MRC_BTH) == (cut >= 12)
        assert pkt.haslayer(L.MRC_CMH) == (cut >= 76)
    fields = L.layer_fields(L.MRC_BTH(RECORDS[0][1].encode()))
    assert [name for name, _ in fields] == [
        "MRC BTH", "MRC EVXH", "MRC METH", "MRC TSETH", "MRC RETH", "payload"]  # fmt: skip
    assert fields[0][1]["psn"] == 0xABCDEF and fields[-1][1] == {"length": 100}


# --- properties ----------------------------------------------------------------------------

u8, u16, u24, u32, u64 = (st.integers(0, (1 << n) - 1) for n in (8, 16, 24, 32, 64))
s16 = st.integers(-(1 << 15), (1 << 15) - 1)

datas = st.builds(
    lambda op, ts, imm, **kw: DataPacket(opcode=op, tx_timestamp=ts,
                                         imm=imm if op.name.endswith("IMM") else None, **kw),
    op=st.sampled_from([op for op in Opcode if op.name.startswith("WRITE")]),
    ts=st.none() | u16, imm=u32, dest_qp=u24, psn=u24, ev=u32, a=st.booleans(),
    rtx=st.booleans(), rqmsn=u16, msn=u16, va=u64, rkey=u32,
    dma_length=st.integers(1, 1 << 31), payload=st.binary(min_size=1, max_size=40),
    p_key=u16,
)  # fmt: skip
seths = st.builds(SETH, ack_psn_offset=s16, entropy=u32, cack_psn=u24, sack_offset=s16,
                  sack_bitmap=u64, m=st.sampled_from(SackMark), pr=st.booleans(),
                  ps=st.just(False), mpr=u8, cc_type=st.integers(0, 15), spdcid=u16,
                  dpdcid=u16)  # fmt: skip
ccs = st.builds(CCState, tx_timestamp=u16, valid=st.booleans(), ooo_count=st.integers(0, 0x7FFF),
                restore_cwnd=st.booleans(), rcv_cwnd_pen=st.integers(0, 127), rcvd_bytes=u24)


@st.composite
def sacks(draw: st.DrawFn) -> SackPacket:
    seth = draw(seths)
    port = draw(st.none() | u32)
    seth = dataclasses.replace(seth, ps=port is not None)
    evx = draw(st.booleans())
    return SackPacket(draw(u24), seth.cack_psn, draw(u32) if evx else 0, seth, draw(ccs), port,
                      draw(u16), evx)  # fmt: skip


nacks = st.builds(NackPacket, dest_qp=u24, psn=u24, ev=u32,
                  neth=st.builds(NETH, nack_reason=st.sampled_from(NackReason), entropy=u32,
                                 nack_psn=u24, tx_timestamp=u16, vendor=u8,
                                 cc_type=st.integers(0, 15), spdcid=u16, dpdcid=u16))  # fmt: skip
endpoints = st.one_of(
    st.builds(EndpointPacket, opcode=st.just(Opcode.ENDPOINT_REQUEST), dest_qp=u24, ev=u32,
              header=st.builds(ERTH, op=st.sampled_from(EndpointOp), port_status_mask=u32,
                               tx_timestamp=u16, vendor=u8, ftype=st.integers(0, 15)),
              probe_id=u16),
    st.builds(EndpointPacket, opcode=st.just(Opcode.ENDPOINT_RESPONSE), dest_qp=u24, ev=u32,
              header=st.builds(EETH, op=st.sampled_from(EndpointOp), port_status_mask=u32,
                               tx_timestamp=u16), probe_id=u16),
)  # fmt: skip


@st.composite
def cms(draw: st.DrawFn) -> CmPacket:
    private = draw(st.binary(max_size=256))
    security = draw(st.integers(0, 255))
    c = CMH(local_qpn=draw(u24), remote_qpn=draw(u24), initial_psn=draw(u24), mpr=draw(u8),
            payload_mtu=draw(u16), plane_count=draw(u8), ev_per_plane=draw(u8),
            plane_mask=draw(u32), max_imm=draw(u16), security=security,
            nonce=draw(st.binary(min_size=16, max_size=16)), connection_id=draw(u64),
            plane=draw(u8), reject_reason=draw(u16), private_data_len=len(private),
            version=draw(u8), flags=draw(u16))  # fmt: skip
    keys = (KeyBlock(draw(st.binary(min_size=32, max_size=32)),
                     draw(st.binary(min_size=32, max_size=32))) if security else None)  # fmt: skip
    op = draw(st.sampled_from([o for o in Opcode if o.name.startswith("CM_")]))
    return CmPacket(op, draw(u24), c, keys, private, draw(u16))


@settings(max_examples=150, deadline=None)
@given(st.one_of(datas, sacks(), nacks, endpoints, cms()))
def test_property_both_ways(record: Packet) -> None:
    wire = record.encode()
    layers = expected(record)
    check_dissected(wire, layers)
    assert bytes(build(layers)) == wire
    same_record(decode_packet(wire), record)


# --- the golden vectors of tests/wire ------------------------------------------------------


def _load(name: str) -> Any:
    """A test module of tests/wire by path (its own imports resolve from there)."""
    import importlib.util
    import sys
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "wire"
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(f"_golden_{name}", folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(folder))


_PACKET_TABLE, _INTEROP = _load("test_packet"), _load("test_interop_vectors")
_GOLDEN: list[tuple[str, Packet, bytes]] = [
    *[(f"golden-{i}", record, wire) for i, (record, wire) in enumerate(_PACKET_TABLE.GOLDEN)],
    *[(desc, record, _INTEROP.h(text)) for desc, text, record in _INTEROP.VECTORS],
]


@pytest.mark.parametrize(("record", "wire"), [(r, w) for _, r, w in _GOLDEN],
                         ids=[n for n, _, _ in _GOLDEN])  # fmt: skip
def test_golden_vectors_both_ways(record: Packet, wire: bytes) -> None:
    # Bytes written from the published layouts (tests/wire), not by any encoder here.
    check_dissected(wire, expected(record))
    assert bytes(build(expected(record))) == wire


def test_a_control_packet_with_24_bytes_more_ends_in_a_trailer() -> None:
    ack = AckPacket(dest_qp=0x10, psn=0x100, ev=2, aeth=AETH(0x1F, 7)).encode()
    pkt = L.MRC_BTH(ack + bytes(range(24)))
    assert pkt[L.MRC_Trailer].tx_counter == 0x0001020304050607
    assert pkt[L.MRC_Trailer].tag == bytes(range(8, 24))
    disconnect = dict(RECORDS)["CM_DISCONNECT-0"].encode()
    assert L.MRC_BTH(disconnect + bytes(24)).haslayer(L.MRC_Trailer)
    reply = dict(RECORDS)["CM_REPLY-2"].encode()  # private data, then the trailer: left Raw
    assert not L.MRC_BTH(reply + bytes(24)).haslayer(L.MRC_Trailer)
    assert not L.MRC_BTH(ack + bytes(23)).haslayer(L.MRC_Trailer)

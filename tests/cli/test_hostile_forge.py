"""The hostile harness's offline parts: checksums, what the sniffed flow learns, and every
attack's datagrams decoded back with `mrc.wire` (no sockets, no root).

The flow is fed a connection as the sniffer would see it: a REQUEST on 4 planes, the REPLY, a
FIRST and ten MIDDLE packets of a 32-packet message (payload MTU 256) and a SACK.
"""

from __future__ import annotations

import random
import socket

import pytest
from scapy.layers.inet import IP, UDP

from mrc.wire import (
    CM_LISTEN_QPN,
    CMH,
    SETH,
    CCState,
    CmPacket,
    DataPacket,
    EndpointPacket,
    KeyBlock,
    NackPacket,
    Opcode,
    ProbePacket,
    SackPacket,
    decode_packet,
    encode_data_header,
)
from tools.hostile.attacks import KINDS, Forgery, Mix, Scope
from tools.hostile.flow import Flow
from tools.hostile.rawnet import MARK_TTL, Seen, ipv4_udp, ones_add, ones_sum

SERVER = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
CLIENT = [("127.0.0.6", 40001), ("127.0.0.7", 40002), ("127.0.0.8", 40003), ("127.0.0.9", 40004)]
PORT = 4791
SERVER_QPN, CLIENT_QPN = 0x123456, 0x00ABCD
MTU, PACKETS, BASE_VA, RKEY = 256, 32, 0x7F00_0000_0000, 0xDEADBEEF
TRAILER = 24


def reference_sum(data: bytes) -> int:
    """RFC 1071 the slow way: 16-bit big-endian words, end-around carry."""
    if len(data) % 2:
        data += b"\0"
    total = 0
    for i in range(0, len(data), 2):
        total += (data[i] << 8) | data[i + 1]
        total = (total & 0xFFFF) + (total >> 16)
    return total


def test_ones_sum_matches_the_word_by_word_sum() -> None:
    rng = random.Random(3)
    for n in [0, 1, 2, 3, 12, 13, 40, 4096, 4097, 4160, *(rng.randrange(9000) for _ in range(50))]:
        data = rng.randbytes(n)
        assert ones_sum(data) == reference_sum(data), n
    assert ones_sum(b"\xff\xff") == 0xFFFF and ones_sum(b"\0\0\0") == 0
    a, b = rng.randbytes(100), rng.randbytes(37)
    assert ones_add(ones_sum(a), ones_sum(b)) == ones_sum(a + b)


def test_spoofed_packet_checksums_verified_by_scapy() -> None:
    rng = random.Random(4)
    src, dst = socket.inet_aton("127.0.0.6"), socket.inet_aton("127.0.0.2")
    for n in (0, 1, 57, 4136, 4161):
        payload = rng.randbytes(n)
        pkt = ipv4_udp(src, 40001, dst, PORT, payload, ident=n)
        parsed = IP(pkt)
        assert parsed.src == "127.0.0.6" and parsed.dst == "127.0.0.2" and parsed.ttl == MARK_TTL
        assert parsed.tos == 2 and parsed.flags == "DF" and parsed.len == len(pkt)
        assert parsed[UDP].sport == 40001 and parsed[UDP].dport == PORT
        assert bytes(parsed[UDP].payload) == payload
        # scapy recomputes both checksums from scratch when they are deleted.
        fresh = parsed.copy()
        del fresh.chksum
        del fresh[UDP].chksum
        again = IP(bytes(fresh))
        assert (parsed.chksum, parsed[UDP].chksum) == (again.chksum, again[UDP].chksum), n
        # A known payload sum gives the same bytes.
        known = ipv4_udp(src, 40001, dst, PORT, payload, payload_sum=ones_sum(payload), ident=n)
        assert known == pkt


def _cmh(**kw: object) -> CMH:
    base: dict[str, object] = dict(
        local_qpn=CLIENT_QPN, remote_qpn=0, initial_psn=90, mpr=8, payload_mtu=MTU,
        plane_count=4, ev_per_plane=16, plane_mask=0xF, max_imm=0, security=0,
        nonce=b"N" * 16, connection_id=77,
    )  # fmt: skip
    base.update(kw)
    return CMH(**base)  # type: ignore[arg-type]


def _data(psn: int, opcode: Opcode, secured: bool) -> bytes:
    header = encode_data_header(
        opcode=opcode, dest_qp=SERVER_QPN, psn=psn, ev=(psn % 4) << 24 | psn, a=False,
        rtx=False, rqmsn=5, msn=7, va=BASE_VA + (psn - 100) * MTU, rkey=RKEY,
        dma_length=PACKETS * MTU, tx_timestamp=psn,
    )  # fmt: skip
    return header + bytes([psn % 256]) * MTU + (b"T" * TRAILER if secured else b"")


def sniffed(secured: bool) -> list[Seen]:
    """The datagrams of one connection as they crossed lo, in order."""
    tail = b"T" * TRAILER if secured else b""
    out = []
    level = 2 if secured else 0
    keys = KeyBlock(b"E" * 32, b"S" * 32) if secured else None
    request = CmPacket(
        Opcode.CM_REQUEST, CM_LISTEN_QPN, _cmh(private_data_len=5, security=level), keys, b"bench"
    ).encode()
    for p in range(4):
        out.append(Seen(*CLIENT[p], SERVER[p], PORT, request))
    reply_cmh = _cmh(local_qpn=SERVER_QPN, remote_qpn=CLIENT_QPN, security=level)
    reply = CmPacket(Opcode.CM_REPLY, CLIENT_QPN, reply_cmh, keys, b"").encode()
    out.append(Seen(SERVER[0], PORT, *CLIENT[0], reply + tail))
    for psn in range(100, 111):
        op = Opcode.WRITE_FIRST if psn == 100 else Opcode.WRITE_MIDDLE
        out.append(Seen(*CLIENT[psn % 4], SERVER[psn % 4], PORT, _data(psn, op, secured)))
    seth = SETH(ack_psn_offset=0, entropy=5, cack_psn=105, sack_offset=0, sack_bitmap=1 << 63)
    sack = SackPacket(CLIENT_QPN, 105, 5, seth, CCState(), None).encode()
    out.append(Seen(SERVER[1], PORT, *CLIENT[1], sack + tail))
    return out


def live_flow(secured: bool) -> Flow:
    flow = Flow(SERVER, PORT, secured, rng=random.Random(9))
    flow.feed(sniffed(secured))
    return flow


@pytest.mark.parametrize("secured", [False, True])
def test_flow_learns_the_connection(secured: bool) -> None:
    flow = live_flow(secured)
    assert flow.ready and flow.connections == 1
    assert (flow.server_qpn, flow.client_qpn) == (SERVER_QPN, CLIENT_QPN)
    assert flow.client == {p: CLIENT[p] for p in range(4)}
    assert flow.latest is not None and flow.latest.psn == 110
    assert flow.payload_mtu == MTU and flow.window == 8 * 128
    assert flow.left_in_message() == PACKETS - 1 - 10
    assert sum(len(flow.pools[(True, p)]) for p in range(4)) == 4 + 11
    assert [len(flow.pools[(False, p)]) for p in range(4)] == [1, 1, 0, 0]
    # An older PSN (a retransmission) does not move the newest one back.
    flow.feed([Seen(*CLIENT[0], SERVER[0], PORT, _data(103, Opcode.WRITE_MIDDLE, secured))])
    assert flow.latest.psn == 110
    # A new client's REQUEST (another nonce) starts over: nothing to aim at until its REPLY.
    other = CmPacket(Opcode.CM_REQUEST, CM_LISTEN_QPN, _cmh(nonce=b"M" * 16), None, b"").encode()
    flow.feed([Seen("127.0.0.6", 50000, SERVER[0], PORT, other)])
    assert not flow.ready and flow.connections == 2 and flow.server_qpn is None


def _decoded(f: Forgery, secured: bool) -> object:
    """The forgery decoded as the receiver would, trailer (when it has one) stripped."""
    data = f.payload
    for cut in ((TRAILER, 0) if secured else (0,)):
        try:
            return decode_packet(data[: len(data) - cut])
        except Exception:
            continue
    raise AssertionError(f"{f.kind} does not decode: {data[:16].hex()}")


def _forge(kind: str, secured: bool, n: int = 300) -> list[Forgery]:
    flow = live_flow(secured)
    gen = KINDS[kind][0](Scope(flow, [0, 1, 2, 3], random.Random(kind)))
    out = [next(gen) for _ in range(n)]
    for f in out:
        assert f.psum is None or f.psum == ones_sum(f.payload), kind
        ends = {(CLIENT[p], (SERVER[p], PORT)) for p in range(4)}
        assert (f.src, f.dst) in ends or (f.dst, f.src) in ends, (kind, f.src, f.dst)
    return out


@pytest.mark.parametrize("secured", [False, True])
def test_forged_data_is_the_next_packet_with_another_payload(secured: bool) -> None:
    psns = set()
    for f in _forge("forged_data", secured):
        pkt = _decoded(f, secured)
        assert isinstance(pkt, DataPacket) and pkt.opcode is Opcode.WRITE_MIDDLE
        assert f.dst[1] == PORT and pkt.dest_qp == SERVER_QPN and pkt.rkey == RKEY
        # Ahead of the sender inside its message, in the far half of what is left of it
        # (PSN 111..131): PSN 120..130, never the LAST (131).
        assert 120 <= pkt.psn <= 130
        assert pkt.va == BASE_VA + (pkt.psn - 100) * MTU and pkt.msn == 7
        assert pkt.dma_length == PACKETS * MTU
        assert len(f.payload) in ((40 + MTU, 40 + MTU + TRAILER) if secured else (40 + MTU,))
        psns.add(pkt.psn)
    assert len(psns) == 11


def test_damaged_genuine_packets() -> None:
    genuine = {s.payload for s in sniffed(False)}
    for f in _forge("replay", False):
        assert f.payload in genuine
    for f in _forge("bitflip", False):
        flips = min(
            sum(bin(a ^ b).count("1") for a, b in zip(f.payload, g, strict=True))
            for g in genuine
            if len(g) == len(f.payload)
        )
        assert 1 <= flips <= 8
    for f in _forge("truncate", False):
        assert any(g.startswith(f.payload) and len(f.payload) < len(g) for g in genuine)
    for f in _forge("extend", False):
        assert any(f.payload.startswith(g) and 1 <= len(f.payload) - len(g) <= 300 for g in genuine)
    assert all(len(f.payload) <= 1500 for f in _forge("noise", False))


def test_forged_control_packets() -> None:
    for f in _forge("forged_sack", True):
        pkt = _decoded(f, True)
        assert isinstance(pkt, SackPacket) and pkt.dest_qp == CLIENT_QPN and f.src[1] == PORT
        assert 0 <= (pkt.cack_psn - 110) % (1 << 24) < 1024  # PSNs the sender never sent
    bitmaps = [_decoded(f, False).seth.sack_bitmap for f in _forge("forged_sack", False)]  # type: ignore[attr-defined]
    assert bitmaps.count((1 << 64) - 1) > 150
    reasons = set()
    for f in _forge("forged_nack", False):
        pkt = _decoded(f, False)
        assert isinstance(pkt, NackPacket) and pkt.dest_qp == CLIENT_QPN
        reasons.add(pkt.neth.nack_reason)
    assert len(reasons) == 9
    for f in _forge("forged_probe", False):
        pkt = _decoded(f, False)
        assert isinstance(pkt, ProbePacket) and pkt.dest_qp == SERVER_QPN and f.dst[1] == PORT
    masks = set()
    for f in _forge("forged_endpoint", False):
        pkt = _decoded(f, False)
        assert isinstance(pkt, EndpointPacket) and pkt.opcode is Opcode.ENDPOINT_REQUEST
        assert pkt.dest_qp == (SERVER_QPN if f.dst[1] == PORT else CLIENT_QPN)
        masks.add(pkt.header.port_status_mask)
    assert 0 in masks
    for f in _forge("forged_trim", True):
        pkt = _decoded(f, False)  # a trim has no trailer
        assert isinstance(pkt, DataPacket) and 1 <= len(pkt.payload) <= 64


def test_forged_cm_packets() -> None:
    keys, levels, impersonations = set(), set(), 0
    for f in _forge("forged_cm_request", True):
        pkt = _decoded(f, False)  # a REQUEST has no trailer
        assert isinstance(pkt, CmPacket) and pkt.opcode is Opcode.CM_REQUEST
        assert pkt.dest_qp == CM_LISTEN_QPN and pkt.cmh.nonce != b"N" * 16
        levels.add(pkt.cmh.security)
        if pkt.key_block is not None:
            assert pkt.key_block.ephemeral != b"E" * 32
            if pkt.key_block.static == b"S" * 32:
                impersonations += 1  # the genuine client's public key, not its private one
            else:
                keys.add(pkt.key_block.static)
    assert len(keys) > 150 and impersonations > 30 and levels == {0, 1, 2}
    for f in _forge("forged_cm_disconnect", False):
        pkt = _decoded(f, False)
        assert isinstance(pkt, CmPacket) and pkt.opcode is Opcode.CM_DISCONNECT
        to_server = f.dst[1] == PORT
        assert pkt.dest_qp == (SERVER_QPN if to_server else CLIENT_QPN)
        assert pkt.cmh.local_qpn == (CLIENT_QPN if to_server else SERVER_QPN)
    nonces = set()
    for f in _forge("forged_cm_reject", False):
        pkt = _decoded(f, False)
        assert isinstance(pkt, CmPacket) and pkt.opcode is Opcode.CM_REJECT
        assert pkt.dest_qp == CLIENT_QPN and 1 <= pkt.cmh.reject_reason <= 6
        nonces.add(pkt.cmh.nonce)
    assert b"N" * 16 in nonces and len(nonces) > 50


def test_mix_uses_every_kind_by_weight() -> None:
    flow = live_flow(True)
    mix = Mix(Scope(flow, [0, 1, 2, 3], random.Random(1)), list(KINDS))
    kinds = [mix.next().kind for _ in range(20_000)]
    total = sum(w for _, w in KINDS.values())
    for kind, (_, weight) in KINDS.items():
        assert abs(kinds.count(kind) / 20_000 - weight / total) < 0.02, kind
    with pytest.raises(ValueError, match="unknown attack kind"):
        Mix(Scope(flow, [0], random.Random(1)), ["forged_data", "nope"])


def test_attacks_on_one_plane_stay_on_it() -> None:
    flow = live_flow(False)
    mix = Mix(Scope(flow, [2], random.Random(1)), list(KINDS))
    for _ in range(3000):
        f = mix.next()
        if f.kind == "junk_to_plane":  # from another port of the client's address there
            assert f.src[0] == CLIENT[2][0] and f.src != CLIENT[2]
            assert f.dst == (SERVER[2], PORT)
            continue
        assert {f.src, f.dst} == {CLIENT[2], (SERVER[2], PORT)}, f.kind

"""The hostile harness's connection-management attacks of issue 35, offline: what each kind
builds from a sniffed flow (tools/hostile/attacks.py). What the server does with them is told
in tests/core/test_cm_hardening.py (virtual time) and by a run's figures (make hostile)."""

from __future__ import annotations

import random

from test_hostile_forge import CLIENT, CLIENT_QPN, PORT, SERVER, SERVER_QPN, live_flow

from mrc.wire.bth import CM_LISTEN_QPN, Opcode
from mrc.wire.cm import split_request
from mrc.wire.errors import DecodeError
from mrc.wire.packet import CmPacket, decode_packet
from mrc.wire.trailer import TRAILER_SIZE
from tools.hostile.attacks import KINDS, Forgery, Scope


def forge(kind: str, n: int = 200) -> list[Forgery]:
    flow = live_flow(True)
    gen = KINDS[kind][0](Scope(flow, [0, 1, 2, 3], random.Random(kind)))
    return [next(gen) for _ in range(n)]


def test_forged_requests_claim_the_listed_key_in_the_sealed_form() -> None:
    nonces = set()
    for f in forge("forged_cm_request_listed"):
        parts = split_request(f.payload)  # the sealed form of revision 1.2: 12 + n + 16 bytes
        assert parts.is_sealed and parts.key_block is not None
        assert parts.key_block.static == b"S" * 32  # the genuine client's public key
        assert parts.key_block.ephemeral != b"E" * 32
        assert f.dst in {(SERVER[p], PORT) for p in range(4)} and f.src in CLIENT
        nonces.add(parts.cmh.nonce)
    assert len(nonces) == 200 and b"N" * 16 not in nonces


def test_replayed_requests_are_genuine_bytes() -> None:
    flow = live_flow(True)
    genuine = flow.request_raw
    assert genuine and genuine[0] == Opcode.CM_REQUEST
    assert {f.payload for f in forge("replayed_cm_request")} == {genuine}


def test_junk_names_the_server_qpn_from_another_port() -> None:
    for f in forge("junk_to_plane"):
        assert 12 <= len(f.payload) <= 40
        assert int.from_bytes(f.payload[5:8], "big") == SERVER_QPN
        plane = next(p for p in range(4) if f.dst == (SERVER[p], PORT))
        assert f.src[0] == CLIENT[plane][0] and f.src != CLIENT[plane]


def test_forged_replies_name_the_client() -> None:
    for f in forge("forged_cm_reply"):
        # A random trailer follows half of them, as on a secured connection.
        try:
            pkt = decode_packet(f.payload)
        except DecodeError:
            pkt = decode_packet(f.payload[: -TRAILER_SIZE])
        assert isinstance(pkt, CmPacket) and pkt.opcode is Opcode.CM_REPLY
        assert pkt.dest_qp == CLIENT_QPN == pkt.cmh.remote_qpn != CM_LISTEN_QPN

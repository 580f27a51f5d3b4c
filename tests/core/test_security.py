"""Secured connections as stories in virtual time (docs/WIRE.md §5-§7, docs/DESIGN.md §6):
who may connect, and what forged, replayed, flipped or trimmed packets can and cannot do."""

from __future__ import annotations

import random
import struct
from collections import Counter
from dataclasses import dataclass, replace

import pytest

from mrc.core.config import SessionConfig
from mrc.core.endpoint import Endpoint
from mrc.core.events import ConnectionClosed, ConnectionEstablished, PathRetired, WriteCompleted
from mrc.core.memory import Region, RegionTable
from mrc.core.secure.handshake import Identity
from mrc.core.session import Session
from mrc.sim import Host, LinkParams, Network
from mrc.wire.bth import DATA_OPCODES, Opcode
from mrc.wire.cm import CMH, CMH_SIZE, KeyBlock
from mrc.wire.packet import CmPacket, decode_packet, encode_data_header, encode_sack

MTU = 4096
REPLY = struct.Struct(">QI")  # the responder's region: base VA, R_Key
A_KEY, B_KEY, M_KEY = b"\x0a" * 32, b"\x0b" * 32, b"\x0c" * 32
A_PUB, B_PUB, M_PUB = (Identity(k).public_key for k in (A_KEY, B_KEY, M_KEY))
DATA = frozenset(op.value for op in DATA_OPCODES)
MIDDLE = Opcode.WRITE_MIDDLE.value
TOS_ECT0 = 0b10


@dataclass
class Pair:
    net: Network
    a: Host
    b: Host
    src: Region
    dst: Region
    session: Session

    @property
    def sender(self) -> Session:
        return self.session

    @property
    def responder(self) -> Session:
        return self.b.session()

    def deliver(self, host: Host, plane: int, data: bytes, tos: int = TOS_ECT0) -> None:
        """Hand one datagram to `host` now, from its peer's address, and pull its outputs."""
        peer = "a" if host is self.b else "b"
        for s in host.endpoint.receive_datagrams(plane, [(data, peer, tos)], self.net.now):
            host.flush(s)

    def drive(self, seconds: float) -> None:
        self.net.drive(self.net.now + seconds)


def secured(
    level: str = "auth",
    *,
    planes: int = 2,
    b_allows: tuple[bytes, ...] = (A_PUB,),
    a_expects: bytes | None = B_PUB,
    a_psk: bytes | None = None,
    b_psk: bytes | None = None,
    size: int = 1 << 20,
    b_level: str | None = None,
    **config: object,
) -> Pair:
    """`a` connects to `b` with `level`; each has its own key, `b` accepts `b_allows`."""
    net = Network(seed=3)
    a, b = net.pair(planes, LinkParams(rate_bps=10e9, latency=10e-6, queue_bytes=8 << 20))
    a.endpoint.identity = Identity(A_KEY, [], a_psk, entropy=random.Random(1).randbytes)
    b.endpoint.identity = Identity(B_KEY, b_allows, b_psk, entropy=random.Random(2).randbytes)
    src = a.regions.register(bytearray(bytes(range(251)) * (size // 251 + 1))[:size])
    dst = b.regions.register(bytearray(size))
    cfg = SessionConfig(plane_mask=(1 << planes) - 1, security=level, **config)  # type: ignore[arg-type]
    answer = REPLY.pack(dst.base_va, dst.rkey)
    b.listen(replace(cfg, security=b_level or level), accept=lambda _: answer)
    s = a.endpoint.connect(cfg, {p: "b" for p in range(planes)}, b"", net.now, peer_key=a_expects)
    a.flush(s)
    net.drive(0.001)
    return Pair(net, a, b, src, dst, s)


def established(p: Pair) -> bool:
    return bool(p.a.events_of(ConnectionEstablished))


def write(p: Pair, offset: int, length: int) -> int:
    msn = p.session.post_write(p.src, offset, length, p.dst.base_va + offset, p.dst.rkey)
    p.a.flush(p.session)
    return msn


def finish(p: Pair, count: int) -> None:
    assert p.net.drive_until(lambda: len(p.a.events_of(WriteCompleted)) >= count, timeout=10.0)


def forged_middle(p: Pair, psn: int, payload: bytes) -> bytes:
    """A WRITE_MIDDLE an on-path attacker can build: right QP, PSN, R_Key, VA; no keys."""
    header = encode_data_header(
        opcode=Opcode.WRITE_MIDDLE, dest_qp=p.responder.qpn, psn=psn, ev=5, a=False, rtx=False,
        rqmsn=0, msn=0, va=p.dst.base_va + MTU, rkey=p.dst.rkey, dma_length=4 * MTU,
        tx_timestamp=77,
    )  # fmt: skip
    return header + payload


# -- who may connect ---------------------------------------------------------------------------


def test_a_listed_peer_connects_and_each_side_learns_the_others_key() -> None:
    p = secured("encrypt")
    assert established(p) and p.b.events_of(ConnectionEstablished)
    assert (p.sender.peer_static_key, p.responder.peer_static_key) == (B_PUB, A_PUB)


def test_an_unlisted_requester_is_rejected_with_nothing_but_the_reason() -> None:
    replies: list[bytes] = []
    # An unauthenticated REJECT is a hint (docs/WIRE.md §7): a keeps trying (a new round, new
    # nonce) until its sends are used up, then names the reason it heard.
    p = secured(b_allows=(M_PUB,), cm_attempts=2, cm_retry=0.01)
    assert p.a.events_of(ConnectionClosed) == []
    p.drive(1.0)
    assert p.a.events_of(ConnectionClosed) == [ConnectionClosed(reason="rejected: unknown peer")]
    assert p.b.endpoint.sessions == {} and p.b.endpoint.drops["rejected_unknown_peer"] == 4
    # What a REJECT says: the REQUEST's own nonce and parameters, no key, no private data.
    net = Network(seed=3)
    a, b = net.pair(1, LinkParams(latency=10e-6))
    b.endpoint.identity = Identity(B_KEY, [M_PUB])
    a.endpoint.identity = Identity(A_KEY)
    a.on_receive = lambda _h, _p, batch: replies.extend(bytes(d) for d, *_ in batch)
    b.listen(SessionConfig(security="auth"), accept=lambda _: b"secret")
    a.connect(b, SessionConfig(security="auth"))
    net.drive(0.001)
    (reject,) = replies
    pkt = decode_packet(reject)
    assert isinstance(pkt, CmPacket) and pkt.opcode is Opcode.CM_REJECT
    assert (pkt.cmh.security, pkt.key_block, pkt.private_data) == (0, None, b"")
    assert B_PUB not in reject and len(reject) == 12 + CMH_SIZE


def test_a_responder_with_another_key_is_not_accepted() -> None:
    # a seals its REQUEST to M's key (revision 1.2): b cannot open it and does not answer.
    p = secured(a_expects=M_PUB, cm_attempts=2, cm_retry=0.01)
    p.drive(1.0)
    assert not established(p)
    assert p.b.endpoint.drops["cm_auth"] == 4 and p.b.endpoint.sessions == {}
    assert p.a.events_of(ConnectionClosed) == [ConnectionClosed(reason="no answer")]


def test_different_security_levels_are_refused() -> None:
    p = secured("auth", b_level="encrypt", cm_attempts=2, cm_retry=0.01)
    p.drive(1.0)
    assert p.a.events_of(ConnectionClosed) == [ConnectionClosed(reason="rejected: security policy")]


def test_a_pre_shared_key_must_match() -> None:
    assert established(secured(a_psk=b"p" * 32, b_psk=b"p" * 32))
    p = secured(a_psk=b"p" * 32, b_psk=b"q" * 32, cm_attempts=2, cm_retry=0.01)
    p.drive(1.0)
    # The REQUEST's seal does not open under a key mixed with another PSK: no answer.
    assert not established(p) and p.b.endpoint.drops["cm_auth"] == 4


def test_a_secured_config_needs_an_identity() -> None:
    ep = Endpoint(rng=random.Random(1))
    with pytest.raises(Exception, match="needs an identity"):
        ep.listen(SessionConfig(security="auth"))
    with pytest.raises(Exception, match="needs an identity"):
        ep.connect(SessionConfig(security="encrypt"), {0: "b"}, b"", 0.0)


def test_the_reply_is_resent_byte_identical_with_counter_zero() -> None:
    seen: list[bytes] = []
    net = Network(seed=3)
    a, b = net.pair(2, LinkParams(latency=10e-6))
    a.endpoint.identity = Identity(A_KEY)
    b.endpoint.identity = Identity(B_KEY)
    a.on_receive = b.on_receive = lambda _h, _p, batch: seen.extend(bytes(d) for d, *_ in batch)
    b.listen(SessionConfig(plane_mask=0b11, security="auth"), accept=lambda _: b"va and rkey")
    a.connect(b, SessionConfig(plane_mask=0b11, security="auth"))
    net.drive(0.001)
    replies = [d for d in seen if d[0] == Opcode.CM_REPLY]
    assert len(replies) == 2 and replies[0] == replies[1]  # one per plane the REQUEST came on
    assert replies[0][-24:-16] == bytes(8) and b"va and rkey" not in replies[0]
    # The second copy is ignored by the requester; anything else with REPLY's opcode is a
    # counted drop.
    assert a.session().stats.drops_by_reason == Counter()
    forged = bytearray(replies[0])
    forged[-1] ^= 1
    (session,) = a.endpoint.receive_datagrams(1, [(bytes(forged), "b", 0)], net.now)
    assert session.stats.drops_by_reason == Counter(cm_unexpected_reply=1)
    # A retry of the REQUEST (the same nonce) gets the same bytes once more.
    request = next(d for d in seen if d[0] == Opcode.CM_REQUEST)
    (session,) = b.endpoint.receive_datagrams(0, [(request, "a", 0)], net.now)
    assert [tx.data for tx in session.datagrams_to_send(net.now)] == [replies[0]]


def test_a_request_flood_costs_at_most_the_token_bucket_in_key_agreements() -> None:
    ep = Endpoint(
        rng=random.Random(1),
        regions=RegionTable(random.Random(1)),
        identity=Identity(B_KEY, [A_PUB]),
        handshake_rate=10.0,
        handshake_burst=3,
    )
    ep.listen(SessionConfig(security="auth"))

    def request(nonce: int, static: bytes) -> bytes:
        cmh = CMH(
            local_qpn=100 + nonce, remote_qpn=0, initial_psn=1, mpr=8, payload_mtu=MTU,
            plane_count=1, ev_per_plane=16, plane_mask=1, max_imm=16, security=1,
            nonce=nonce.to_bytes(16, "big"), connection_id=nonce, plane=0,
        )  # fmt: skip
        keys = KeyBlock(ephemeral=Identity(bytes([nonce]) * 32).public_key, static=static)
        pkt = CmPacket(Opcode.CM_REQUEST, 1, cmh, keys, b"")
        # What a forger without A's key can put where the seal goes: 12 + 16 bytes of noise.
        return pkt.encode() + bytes([nonce]) * 28

    # Unlisted keys are refused first, before any X25519 work and without spending tokens.
    ep.receive_datagrams(0, [(request(i, M_PUB), "m", 0) for i in range(1, 6)], 0.0)
    assert ep.drops == Counter(rejected_unknown_peer=5)
    # A listed key (anyone can copy a public key): three openings fail, the rest dropped.
    ep.receive_datagrams(0, [(request(i, A_PUB), "m", 0) for i in range(10, 20)], 0.0)
    assert ep.drops["cm_auth"] == 3 and ep.drops["handshake_rate_limited"] == 7
    ep.receive_datagrams(0, [(request(i, A_PUB), "m", 0) for i in range(20, 25)], 0.1)
    assert ep.drops["cm_auth"] == 4 and ep.drops["handshake_rate_limited"] == 11
    # None left anything behind, and only the unlisted keys' REJECTs were sent.
    assert ep.sessions == {} and len(ep.datagrams_to_send()) == 5


# -- forged and replayed packets ------------------------------------------------------------------


@pytest.mark.parametrize("level", ["none", "auth", "encrypt"])
def test_a_forged_write_in_the_window_places_nothing(level: str) -> None:
    p = secured(level)
    rx = p.responder.receiver
    assert rx is not None
    psn = (rx.cack + 1) & 0xFFFFFF
    evil = b"\xee" * MTU
    bare = forged_middle(p, psn, evil)
    p.deliver(p.b, 0, bare)
    p.deliver(p.b, 1, bare + struct.pack(">Q", 1 << 40) + b"\x00" * 16)  # a made-up trailer
    placed = p.responder.stats.bytes_placed
    drops = p.responder.stats.drops_by_reason
    if level == "none":
        assert placed == MTU and bytes(p.dst.view[MTU : 2 * MTU]) == evil  # the threat
        return
    assert placed == 0 and bytes(p.dst.view) == bytes(len(p.dst.view))
    # Without a trailer the packet reads as trimmed (a hint: a NACK at most); with a wrong
    # tag it is an `auth` drop, and its huge counter did not move the window.
    assert (p.responder.stats.trimmed_received, drops["auth"]) == (1, 1)
    protection = p.responder.channel.protection if p.responder.channel else None
    assert protection is not None and protection.replay.top < 100
    write(p, 0, 8 * MTU)
    finish(p, 1)
    assert bytes(p.dst.view[: 8 * MTU]) == bytes(p.src.view[: 8 * MTU])


@pytest.mark.parametrize("level", ["auth", "encrypt"])
def test_a_replayed_packet_is_dropped_as_replay_or_as_too_old(level: str) -> None:
    p = secured(level, mpr=1, size=4 << 20)  # a 512-counter window
    seen: list[bytes] = []
    p.b.on_receive = lambda _h, _p, batch: seen.extend(bytes(d) for d, *_ in batch)
    write(p, 0, 8 * MTU)
    finish(p, 1)
    first = next(d for d in seen if d[0] in DATA)
    placed = p.responder.stats.bytes_placed
    p.deliver(p.b, 0, first)
    assert p.responder.stats.drops_by_reason["replay"] == 1
    write(p, 8 * MTU, 600 * MTU)  # 600 more counters: `first` falls out of the window
    finish(p, 2)
    p.deliver(p.b, 1, first)
    assert p.responder.stats.drops_by_reason["replay_window"] == 1
    assert p.responder.stats.bytes_placed == placed + 600 * MTU
    assert bytes(p.dst.view[: 608 * MTU]) == bytes(p.src.view[: 608 * MTU])


def _eat_first_middle(p: Pair, plane: int = 0) -> list[bytes]:
    eaten: list[bytes] = []

    def eat(data: bytes) -> bool:
        if not eaten and data[0] == MIDDLE:
            eaten.append(bytes(data))
            return True
        return False

    p.a.links[plane].params.drop_if = eat
    return eaten


@pytest.mark.parametrize("level", ["auth", "encrypt"])
def test_a_bit_flip_anywhere_is_never_placed_and_mostly_an_auth_drop(level: str) -> None:
    p = secured(level)
    eaten = _eat_first_middle(p)
    write(p, 0, 16 * MTU)
    assert p.net.drive_until(lambda: bool(eaten), timeout=1.0)
    (genuine,) = eaten
    rx = p.responder
    placed = rx.stats.bytes_placed
    content = bytes(p.dst.view)
    other: dict[int, str] = {}

    def drops() -> Counter[str]:
        # The session's drops and the endpoint's (a DestQP flip never reaches the session).
        return rx.stats.drops_by_reason + p.b.endpoint.drops

    for bit in range(len(genuine) * 8):
        flipped = bytearray(genuine)
        flipped[bit // 8] ^= 1 << (bit % 8)
        before = drops()
        trimmed = rx.stats.trimmed_received
        p.deliver(p.b, 0, bytes(flipped))
        assert rx.stats.bytes_placed == placed
        new = drops() - before
        if rx.stats.trimmed_received != trimmed:
            new["trimmed"] += 1
        assert sum(new.values()) == 1, (bit, new)
        if new["auth"] != 1:
            (other[bit],) = new
    assert bytes(p.dst.view) == content
    # Every flip fails the tag, except a few that are dropped before it is checked: a flip of
    # the DestQP sends the packet to no session; a flip in the counter may name a counter the
    # window has already seen (a replay); with `encrypt`, a flip of the EVX or TS flag makes
    # the headers end 4 bytes earlier, and the payload longer than the connection's MTU.
    n = len(genuine)
    where = {why: {bit // 8 for bit in other if other[bit] == why} for why in other.values()}
    assert where.pop("unknown_qp") == {5, 6, 7}
    assert where.pop("replay", set()) <= set(range(n - 24, n - 16))
    assert where.pop("bad_length", set()) <= ({4, 8} if level == "encrypt" else set())
    assert where == {}
    # The genuine packet itself is still new and is placed.
    p.deliver(p.b, 0, genuine)
    assert rx.stats.bytes_placed == placed + MTU
    finish(p, 1)
    assert bytes(p.dst.view[: 16 * MTU]) == bytes(p.src.view[: 16 * MTU])


def _stall_data(p: Pair) -> list[bytes]:
    """Eat every data packet `a` sends from now on; returns them (in send order)."""
    eaten: list[bytes] = []

    def eat(data: bytes) -> bool:
        if data[0] in DATA:
            eaten.append(bytes(data))
            return True
        return False

    for link in p.a.links.values():
        link.params.drop_if = eat
    return eaten


@pytest.mark.parametrize("level", ["none", "auth"])
def test_a_forged_sack_acknowledges_nothing(level: str) -> None:
    p = secured(level)
    eaten = _stall_data(p)
    write(p, 0, 32 * MTU)
    sender = p.sender.sender
    assert sender is not None and len(eaten) == 32
    una, nxt = sender.una, sender.next_psn
    entropy = sender.inflight[una].ev

    def sack(cack: int) -> bytes:
        return encode_sack(
            dest_qp=p.session.qpn, cack_psn=cack & 0xFFFFFF, ev=5, ack_psn_offset=-1,
            entropy=entropy, sack_offset=0, sack_bitmap=0,
        )  # fmt: skip

    p.deliver(p.a, 0, sack(nxt))  # "everything you sent arrived"
    p.deliver(p.a, 1, sack(nxt + 100))  # and what you never sent
    acked = p.sender.stats.bytes_acked
    if level == "none":
        assert acked == 32 * MTU  # the threat
        return
    assert acked == 0 and (sender.una, sender.next_psn) == (una, nxt)
    assert p.sender.stats.drops_by_reason["auth"] == 2


@pytest.mark.parametrize("level", ["none", "auth"])
def test_a_forged_sack_cannot_retire_an_ev(level: str) -> None:
    p = secured(level, ev_per_plane=4)  # 32 packets in flight: several per EV
    _stall_data(p)
    write(p, 0, 64 * MTU)
    sender = p.sender.sender
    assert sender is not None
    by_ev: dict[int, list[int]] = {}
    for psn, rec in sorted(sender.inflight.items()):
        by_ev.setdefault(rec.ev, []).append(psn)
    ev, (_, p2, *_) = next((ev, psns) for ev, psns in by_ev.items() if len(psns) >= 2)
    cack = sender.una
    block = p2 & ~63
    # "p2 (sent after p1 on the same EV) arrived": RACK would then take p1 for lost and
    # blame its path (docs/DESIGN.md §6).
    forged = encode_sack(
        dest_qp=p.session.qpn, cack_psn=cack, ev=5, ack_psn_offset=p2 - cack, entropy=ev,
        sack_offset=block - cack, sack_bitmap=1 << (63 - (p2 - block)),
    )  # fmt: skip
    p.deliver(p.a, 0, forged)
    p.drive(0.003)  # past the reordering window, before any RTO
    retired = [e for e in p.a.events_of(PathRetired) if e.ev == ev]
    if level == "none":
        assert retired  # the threat
        return
    assert retired == [] and p.a.events_of(PathRetired) == []
    assert p.sender.stats.drops_by_reason["auth"] == 1 and p.sender.stats.bytes_acked == 0


def test_a_forged_trim_causes_at_most_one_early_retransmission_per_send_record() -> None:
    p = secured("auth")
    eaten = _eat_first_middle(p)
    write(p, 0, 16 * MTU)
    assert p.net.drive_until(lambda: bool(eaten), timeout=1.0)
    (genuine,) = eaten
    trim = genuine[:64]  # what a switch keeps: the headers and a little payload, no trailer
    rx = p.responder.stats
    for _ in range(5):
        p.deliver(p.b, 1, trim, tos=11 << 2 | TOS_ECT0)
    # docs/WIRE.md §5: a trimmed packet cannot authenticate; one that is in the window and
    # not yet received gets its NACK (authenticated, from the real peer), once per (PSN,
    # tx_timestamp): the copies are counted, not answered (revision 1.2)...
    assert (rx.trimmed_received, rx.nacks_sent) == (5, 1)
    assert rx.drops_by_reason["trimmed_repeat"] == 4
    p.drive(0.0002)
    # ...but the sender acts on one TRIMMED NACK per send record: one early resend.
    assert p.sender.stats.retransmits_by_cause["nack_trimmed"] == 1
    finish(p, 1)
    # Once the resend arrived, a trim of that PSN is stale: no NACK at all.
    p.deliver(p.b, 1, trim, tos=11 << 2 | TOS_ECT0)
    assert rx.nacks_sent == 1 and rx.drops_by_reason["trimmed_stale"] == 1
    assert p.sender.stats.retransmits == 1
    assert rx.bytes_placed == 16 * MTU
    assert bytes(p.dst.view[: 16 * MTU]) == bytes(p.src.view[: 16 * MTU])


def test_a_forged_disconnect_is_ignored_and_a_genuine_one_closes() -> None:
    p = secured("auth")
    cmh = CMH(
        local_qpn=p.session.qpn, remote_qpn=p.responder.qpn, initial_psn=0, mpr=8,
        payload_mtu=MTU, plane_count=2, ev_per_plane=16, plane_mask=3, max_imm=16, security=0,
        nonce=bytes(16), connection_id=p.session.connection_id,
    )  # fmt: skip
    forged = CmPacket(Opcode.CM_DISCONNECT, p.responder.qpn, cmh, None, b"").encode()
    p.deliver(p.b, 0, forged)
    p.deliver(p.b, 0, forged + struct.pack(">Q", 999) + bytes(16))
    assert not p.responder.is_closed
    # The bare one's last 24 bytes read as a trailer too: its "counter" (zeros of the CMH)
    # was used already (a replay); the other's made-up tag fails.
    assert p.responder.stats.drops_by_reason == Counter(replay=1, auth=1)
    p.session.close(p.net.now)
    p.a.flush(p.session)
    p.drive(0.001)
    assert p.b.events_of(ConnectionClosed) == [ConnectionClosed(reason="disconnect")]


@pytest.mark.parametrize("level", ["auth", "encrypt"])
def test_a_secured_connection_with_evs_in_the_flow_label(level: str) -> None:
    # Agreed in CM like the rest (the flags are in the transcript); control packets lose their
    # EVXH before they are sealed, data is framed without it: every tag still verifies.
    p = secured(level, ev_encoding="flowlabel", size=8 << 20)
    # The hosts' sockets pass labels on from now (what arrived before had none: counted).
    p.a.flowlabel = p.b.flowlabel = True
    assert p.session.config.ev_encoding == p.responder.config.ev_encoding == "flowlabel"
    before = (+p.session.stats.drops_by_reason, +p.responder.stats.drops_by_reason)
    for k in range(8):
        write(p, k << 20, 1 << 20)
    finish(p, 8)
    assert bytes(p.dst.view) == bytes(p.src.view)
    assert (+p.session.stats.drops_by_reason, +p.responder.stats.drops_by_reason) == before


def test_a_secured_connection_ignores_connectionless_endpoint_messages() -> None:
    # QPN 0x2 messages carry no trailer: only unsecured connections take them.
    from mrc.wire.bth import ENDPOINT_QPN
    from mrc.wire.packet import EndpointPacket
    from mrc.wire.probe import ERTH, EndpointOp

    p = secured("auth")
    status = EndpointPacket(
        opcode=Opcode.ENDPOINT_REQUEST, dest_qp=ENDPOINT_QPN, ev=0,
        header=ERTH(op=EndpointOp.PORT_STATUS, port_status_mask=0b01),
    ).encode()  # fmt: skip
    p.deliver(p.a, 0, status)
    assert p.a.endpoint.drops["endpoint_qpn"] == 1
    assert p.session.paths.usable(1)

"""Connection management against hostile senders, as stories in virtual time (docs/WIRE.md
§6-§7 revision 1.2, docs/DESIGN.md §8): forged and replayed REQUESTs, junk on a plane, forged
REPLYs and REJECTs. Each story is one an attacker could play against the code before
revision 1.2 and won."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mrc.core.cm import build_reject, request_head, with_plane
from mrc.core.config import SessionConfig
from mrc.core.endpoint import Endpoint
from mrc.core.events import ConnectionClosed, ConnectionEstablished
from mrc.core.memory import RegionTable
from mrc.core.secure.handshake import Identity, request_key
from mrc.sim import Host, LinkParams, Network
from mrc.wire.bth import Opcode
from mrc.wire.cm import KeyBlock, RejectReason, split_request, tai64n

A_KEY, B_KEY, M_KEY = b"\x0a" * 32, b"\x0b" * 32, b"\x0c" * 32
A_PUB, B_PUB, M_PUB = (Identity(k).public_key for k in (A_KEY, B_KEY, M_KEY))
CFG = SessionConfig(plane_mask=0b11, security="auth")
#: Wall-clock seconds (a time stamp of some forgeries: they fail before it is read).
T0 = 1_800_000_000.0


def forged_request(i: int, *, claimed: bytes = A_PUB, cfg: SessionConfig = CFG) -> bytes:
    """The best REQUEST M can make while claiming `claimed`: a fresh ephemeral, a real seal,
    but with its own static key in the second DH (it does not hold `claimed`'s)."""
    eph = X25519PrivateKey.from_private_bytes(bytes([i % 251 + 1]) * 31 + bytes([i // 251 + 1]))
    keys = KeyBlock(eph.public_key().public_bytes_raw(), claimed)
    nonce = i.to_bytes(16, "big")
    head = request_head(cfg, local_qpn=0x100 + i, initial_psn=1, nonce=nonce, connection_id=i,
                        private_data_len=0, key_block=keys)  # fmt: skip
    s_r = X25519PublicKey.from_public_bytes(B_PUB)
    dh_e = eph.exchange(s_r)
    dh_s = X25519PrivateKey.from_private_bytes(M_KEY).exchange(s_r)
    k_req = request_key(dh_e, dh_s, None, nonce, head)
    return head + AESGCM(k_req).encrypt(bytes(12), tai64n(int(T0) + 1, i), head)


def pair(*, planes: int = 2, accept_log: list[bytes] | None = None, **cfg: object) -> tuple[
    Network, Host, Host
]:  # fmt: skip
    """a (key A) and b (key B, which lists only A); b listens; nobody has connected yet."""
    net = Network(seed=5)
    a, b = net.pair(planes, LinkParams(latency=10e-6))
    # (Virtual time: a's REQUESTs are stamped with `now` as their wall clock.)
    a.endpoint.identity = Identity(A_KEY, [B_PUB], entropy=random.Random(1).randbytes)
    b.endpoint.identity = Identity(B_KEY, [A_PUB], entropy=random.Random(2).randbytes)
    config = replace(CFG, plane_mask=(1 << planes) - 1, **cfg)  # type: ignore[arg-type]

    def accept(private: bytes) -> bytes:
        if accept_log is not None:
            accept_log.append(private)
        return b"ok"

    b.listen(config, accept=accept)
    return net, a, b


def flood(b: Host, requests: list[bytes], now: float) -> None:
    """Hand `requests` to b on plane 0 from M's address, in batches, and flush what it sends."""
    for i in range(0, len(requests), 256):
        batch = [(r, "m", 0) for r in requests[i : i + 256]]
        for s in b.endpoint.receive_datagrams(0, batch, now):
            b.flush(s)


def test_64_forged_requests_naming_a_listed_key_do_not_stop_the_genuine_peer() -> None:
    net, a, b = pair()
    flood(b, [forged_request(i) for i in range(64)], 0.0)
    # Every one failed its seal after two X25519 operations: no session, no answer.
    assert b.endpoint.drops == Counter(cm_auth=64)
    assert b.endpoint.sessions == {} and b.endpoint.datagrams_to_send() == []
    s = a.connect(b, CFG)
    # The bucket (burst 64) is empty at t = 0: the first REQUEST is dropped, its retry at
    # 0.1 s gets a token.
    assert net.drive_until(lambda: bool(a.events_of(ConnectionEstablished)), timeout=1.0)
    assert 0.1 <= net.now < 0.11 and s.peer_static_key == B_PUB
    assert b.endpoint.drops["handshake_rate_limited"] == 2  # both planes' first copies
    assert [se.peer_static_key for se in b.endpoint.sessions.values()] == [A_PUB]


def test_10000_forged_requests_naming_a_listed_key_do_not_stop_the_genuine_peer() -> None:
    net, a, b = pair()
    flood(b, [forged_request(i) for i in range(10_000)], 0.0)
    # The token bucket bounds the X25519 work; nothing is kept, nothing answered.
    assert b.endpoint.drops == Counter(cm_auth=64, handshake_rate_limited=9_936)
    assert b.endpoint.sessions == {} and b.endpoint.datagrams_to_send() == []
    a.connect(b, CFG)
    assert net.drive_until(lambda: bool(a.events_of(ConnectionEstablished)), timeout=1.0)
    assert net.now < 0.11 and len(b.endpoint.sessions) == 1


def test_a_forged_request_raises_no_event_runs_no_accept_and_leaves_no_state() -> None:
    accepted: list[bytes] = []
    ep = Endpoint(rng=random.Random(1), regions=RegionTable(random.Random(1)),
                  identity=Identity(B_KEY, [A_PUB]))  # fmt: skip

    def accept(private: bytes) -> bytes:
        accepted.append(private)
        return b"region"

    ep.listen(CFG, accept=accept)
    touched = ep.receive_datagrams(0, [(forged_request(7), "m", 0)], 0.0)
    assert touched == [] and accepted == [] and ep.sessions == {}
    assert ep.datagrams_to_send() == [] and ep.drops == Counter(cm_auth=1)
    # Nothing of it was remembered either: the genuine peer's REQUEST with the same nonce
    # is a new one, not "a copy".
    assert ep._by_nonce == {} and ep._half_open == {}


def test_a_replayed_request_is_dropped_without_an_answer() -> None:
    seen: list[bytes] = []
    net, a, b = pair(planes=1)
    b.on_receive = lambda _h, _p, batch: seen.extend(bytes(d) for d, *_ in batch)
    s = a.connect(b, replace(CFG, plane_mask=1), b"first")
    net.drive(0.001)
    assert a.events_of(ConnectionEstablished)
    (request,) = [d for d in seen if d[0] == Opcode.CM_REQUEST]
    # While b holds the connection, the same bytes are a copy: the same REPLY, nothing new.
    (rs,) = b.endpoint.sessions.values()
    assert b.endpoint.receive_datagrams(0, [(request, "m", 0)], net.now) == [rs]
    s.close(net.now)
    a.flush(s)
    net.drive(net.now + 0.001)
    assert rs.is_closed
    b.endpoint.discard(rs)
    # Once it is gone, the REQUEST replayed (from anywhere) is refused: its timestamp was
    # accepted before.
    assert b.endpoint.receive_datagrams(0, [(request, "m", 0)], net.now) == []
    assert b.endpoint.drops["cm_replay"] == 1
    assert b.endpoint.sessions == {} and b.endpoint.datagrams_to_send() == []
    assert [e.private_data for e in b.events_of(ConnectionEstablished)] == [b"first"]


def test_a_request_stamped_more_than_10_s_before_the_newest_is_refused() -> None:
    net, a, b = pair(planes=1)
    a.connect(b, replace(CFG, plane_mask=1))
    net.drive(0.001)
    assert len(b.events_of(ConnectionEstablished)) == 1
    # A requester with A's key whose clock says 11 s earlier (a restored snapshot, say; a
    # REQUEST recorded long ago cannot be given a new nonce: the seal covers it).
    late = Endpoint(rng=random.Random(9), regions=RegionTable(random.Random(9)),
                    identity=Identity(A_KEY, [B_PUB]))  # fmt: skip
    s = late.connect(replace(CFG, plane_mask=1), {0: "b"}, b"", net.now, wall=net.now - 11)
    (tx,) = s.datagrams_to_send(net.now)
    assert b.endpoint.receive_datagrams(0, [(tx.data, "a", 0)], net.now) == []
    assert b.endpoint.drops["cm_replay"] == 1 and len(b.endpoint.sessions) == 1
    # 9 s earlier is within the rule: accepted.
    ok = Endpoint(rng=random.Random(8), regions=RegionTable(random.Random(8)),
                  identity=Identity(A_KEY, [B_PUB]))  # fmt: skip
    s = ok.connect(replace(CFG, plane_mask=1), {0: "b"}, b"", net.now, wall=net.now - 9)
    (tx,) = s.datagrams_to_send(net.now)
    assert len(b.endpoint.receive_datagrams(0, [(tx.data, "a", 0)], net.now)) == 1


def test_the_sealed_request_carries_its_private_data_encrypted() -> None:
    seen: list[bytes] = []
    accepted: list[bytes] = []
    net, a, b = pair(planes=1, accept_log=accepted)
    b.on_receive = lambda _h, _p, batch: seen.extend(bytes(d) for d, *_ in batch)
    a.connect(b, replace(CFG, plane_mask=1), b"base va and rkey")
    net.drive(0.001)
    (request,) = [d for d in seen if d[0] == Opcode.CM_REQUEST]
    parts = split_request(request)
    assert parts.is_sealed and parts.cmh.private_data_len == 16
    assert len(parts.rest) == 12 + 16 + 16 and b"base va" not in request
    assert accepted == [b"base va and rkey"]


def test_a_junk_datagram_does_not_move_a_planes_address() -> None:
    """Plane 1 eats a's REQUEST copy, so b has no plane-1 address yet. A 12-byte datagram
    naming b's QPN from M's address on plane 1 used to become that address for good."""
    net, a, b = pair()
    eaten: list[bytes] = []

    def eat_request(data: bytes) -> bool:
        if data[0] == Opcode.CM_REQUEST and not eaten:
            eaten.append(data)
            return True
        return False

    a.links[1].params.drop_if = eat_request
    a.connect(b, CFG)
    net.drive(0.00002)  # the REQUEST is in, a's first authenticated packets are not yet
    rs = b.session()
    assert set(rs.peer_addrs) == {0}
    junk = bytes([Opcode.ACKNOWLEDGE, 0, 0xFF, 0xFF, 0]) + rs.qpn.to_bytes(3, "big") + bytes(4)
    b.endpoint.receive_datagrams(1, [(junk, "m", 0)], net.now)
    assert set(rs.peer_addrs) == {0}
    # A forged copy of the REQUEST (its nonce, other bytes) teaches nothing either.
    forged = bytearray(with_plane(eaten[0], 1))
    forged[-1] ^= 1
    b.endpoint.receive_datagrams(1, [(bytes(forged), "m", 0)], net.now)
    assert set(rs.peer_addrs) == {0} and b.endpoint.drops["cm_copy_mismatch"] == 1
    # a's authenticated traffic on plane 1 does.
    assert net.drive_until(lambda: rs.peer_addrs.get(1) == "a", timeout=1.0)
    assert "m" not in rs.peer_addrs.values()


def test_an_unsecured_plane_address_comes_only_from_a_matching_request_copy() -> None:
    net = Network(seed=5)
    a, b = net.pair(2, LinkParams(latency=10e-6))
    eaten: list[bytes] = []

    def eat_request(data: bytes) -> bool:
        if data[0] == Opcode.CM_REQUEST and not eaten:
            eaten.append(data)
            return True
        return False

    a.links[1].params.drop_if = eat_request
    b.listen(SessionConfig(plane_mask=0b11))
    a.connect(b, SessionConfig(plane_mask=0b11))
    net.drive(0.01)
    rs = b.session()
    assert a.events_of(ConnectionEstablished) and set(rs.peer_addrs) == {0}
    # a's traffic on plane 1 proves nothing on an unsecured connection: no address from it.
    assert rs.plane_state(1) == "down"
    junk = bytes([Opcode.ACKNOWLEDGE, 0, 0xFF, 0xFF, 0]) + rs.qpn.to_bytes(3, "big") + bytes(4)
    b.endpoint.receive_datagrams(1, [(junk, "m", 0)], net.now)
    assert set(rs.peer_addrs) == {0}
    # The copy itself, late (a retry), does.
    for s in b.endpoint.receive_datagrams(1, [(eaten[0], "a", 0)], net.now):
        b.flush(s)
    assert rs.peer_addrs == {0: "a", 1: "a"} and rs.plane_state(1) == "up"


def test_forged_replies_do_not_use_up_the_checks_of_a_later_round() -> None:
    """16 forged REPLYs before the genuine one used to exhaust the requester's budget for
    good (`cm_reply_flood`); the budget now starts again at every send."""
    net, a, b = pair(planes=1)
    # b's REPLY is held back until a's second send (a link that eats b's first REPLY).
    held: list[bytes] = []

    def hold_first_reply(data: bytes) -> bool:
        if data[0] == Opcode.CM_REPLY and not held:
            held.append(data)
            return True
        return False

    b.links[0].params.drop_if = hold_first_reply
    s = a.connect(b, replace(CFG, plane_mask=1))
    net.drive(0.001)
    assert held and not a.events_of(ConnectionEstablished)
    bad = bytearray(held[0])
    bad[-1] ^= 1
    for _ in range(17):
        a.endpoint.receive_datagrams(0, [(bytes(bad), "m", 0)], net.now)
    assert s.stats.drops_by_reason["cm_reply_flood"] == 1
    # The retry at 0.1 s: b sends its REPLY bytes again, and a checks them.
    assert net.drive_until(lambda: bool(a.events_of(ConnectionEstablished)), timeout=1.0)
    assert net.now < 0.11


def test_an_unauthenticated_reject_is_only_a_hint_on_a_secured_attempt() -> None:
    net, a, b = pair(planes=1)
    requests: list[bytes] = []
    b.on_receive = lambda _h, _p, batch: requests.extend(
        bytes(d) for d, *_ in batch if d[0] == Opcode.CM_REQUEST
    )
    lost: list[bytes] = []
    blocked = [True]

    def block(data: bytes) -> bool:
        if blocked[0]:
            lost.append(bytes(data))
        return blocked[0]

    a.links[0].params.drop_if = block
    s = a.connect(b, replace(CFG, plane_mask=1))
    # An on-path M read the REQUEST's nonce on the wire and answers first with a REJECT.
    first = split_request(lost[0]).cmh
    reject = build_reject(first, RejectReason.UNKNOWN_PEER)
    a.endpoint.receive_datagrams(0, [(reject, "m", 0)], net.now)
    assert not s.is_closed and s.stats.drops_by_reason["cm_reject_hint"] == 1
    blocked[0] = False
    assert net.drive_until(lambda: bool(a.events_of(ConnectionEstablished)), timeout=1.0)
    # The REJECT made the next send a new round: a new nonce, answered.
    assert [split_request(r).cmh.nonce != first.nonce for r in requests] == [True]
    assert a.events_of(ConnectionClosed) == []


def test_a_resources_reject_is_retried_with_backoff() -> None:
    net = Network(seed=5)
    a, b = net.pair(1, LinkParams(latency=10e-6))
    answers = iter([None, None, b"ok"])
    b.listen(SessionConfig(), accept=lambda _pd: next(answers))
    a.connect(b, SessionConfig(cm_retry=0.1))
    assert net.drive_until(lambda: bool(a.events_of(ConnectionEstablished)), timeout=1.0)
    # REQUESTs at 0, 0.1 and 0.3 s (each a new round, after a RESOURCES REJECT).
    assert 0.3 <= net.now < 0.31 and b.endpoint.drops["rejected_resources"] == 2


def test_half_open_connections_are_kept_per_key_and_the_newest_evicts_the_oldest() -> None:
    ep = Endpoint(rng=random.Random(1), regions=RegionTable(random.Random(1)),
                  identity=Identity(B_KEY, [A_PUB, M_PUB]))  # fmt: skip
    ep.listen(replace(CFG, plane_mask=1))

    def request(key: bytes, second: float) -> bytes:
        r = Endpoint(rng=random.Random(int(second)), regions=RegionTable(random.Random(1)),
                     identity=Identity(key, [B_PUB]))  # fmt: skip
        s = r.connect(replace(CFG, plane_mask=1), {0: "b"}, b"", 0.0, wall=T0 + second)
        (tx,) = s.datagrams_to_send(0.0)
        return tx.data

    first = ep.receive_datagrams(0, [(request(A_KEY, 0), "a", 0)], 0.0)
    for i in range(1, 16):
        ep.receive_datagrams(0, [(request(A_KEY, i), "a", 0)], 0.0)
    assert len(ep.sessions) == 16 and all(s.half_open for s in ep.sessions.values())
    # A's seventeenth closes A's oldest (it says so to A's address) ...
    touched = ep.receive_datagrams(0, [(request(A_KEY, 16), "a", 0)], 0.0)
    assert first[0] in touched and first[0].is_closed and ep.drops["half_open_evicted"] == 1
    sent = first[0].datagrams_to_send(0.0)  # (its REPLY was never pulled: no flush here)
    assert [t.data[0] for t in sent] == [Opcode.CM_REPLY, Opcode.CM_DISCONNECT]
    # ... and another key holder is not affected by A's: there is no table they share.
    (m,) = ep.receive_datagrams(0, [(request(M_KEY, 0), "m", 0)], 0.0)
    assert m.half_open and m.peer_static_key == M_PUB and ep.drops["half_open_evicted"] == 1


def test_unproven_requests_are_bounded_per_source_host_and_in_all() -> None:
    """Unsecured REQUESTs prove nothing: 16 half-open per source host (the newest evicts the
    oldest), 64 in all (then REJECT resources)."""
    ep = Endpoint(rng=random.Random(1), regions=RegionTable(random.Random(1)))
    ep.listen(SessionConfig())

    def request(i: int) -> bytes:
        r = Endpoint(rng=random.Random(i), regions=RegionTable(random.Random(i)))
        s = r.connect(SessionConfig(), {0: "b"}, b"", 0.0)
        (tx,) = s.datagrams_to_send(0.0)
        return tx.data

    for i in range(17):
        ep.receive_datagrams(0, [(request(i), ("10.0.0.1", 1000 + i), 0)], 0.0)
    live = [s for s in ep.sessions.values() if not s.is_closed]
    assert len(live) == 16 and ep.drops["half_open_evicted"] == 1
    for i in range(17, 17 + 48):
        ep.receive_datagrams(0, [(request(i), (f"10.0.1.{i}", 1000), 0)], 0.0)
    assert sum(not s.is_closed for s in ep.sessions.values()) == 64
    assert ep.drops["rejected_resources"] == 0
    ep.receive_datagrams(0, [(request(99), ("10.0.2.1", 1000), 0)], 0.0)
    assert ep.drops["rejected_resources"] == 1
    assert sum(not s.is_closed for s in ep.sessions.values()) == 64

"""The CM handshake (docs/WIRE.md §6) and the connection's end, as stories in virtual time."""

from __future__ import annotations

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionClosed, ConnectionEstablished
from mrc.core.memory import RegionTable
from mrc.sim import LinkParams, Network
from mrc.wire.bth import Opcode
from mrc.wire.cm import RejectReason
from mrc.wire.packet import CmPacket, decode_packet


def test_requester_and_responder_agree_on_the_smaller_values_and_exchange_private_data() -> None:
    net = Network(seed=1)
    a, b = net.pair(4, LinkParams(latency=10e-6))
    b.listen(
        SessionConfig(plane_mask=0b0111, payload_mtu=4096, mpr=4, ev_per_plane=8),
        accept=lambda pd: b"reply:" + pd,
    )
    a.connect(
        b, SessionConfig(plane_mask=0b1111, payload_mtu=8192, mpr=8, ev_per_plane=16), b"hello"
    )
    net.drive(0.001)
    (ea,) = a.events_of(ConnectionEstablished)
    (eb,) = b.events_of(ConnectionEstablished)
    assert (ea.private_data, eb.private_data) == (b"reply:hello", b"hello")
    for e in (ea, eb):
        assert (e.payload_mtu, e.mpr, e.ev_per_plane, e.plane_mask) == (4096, 4, 8, 0b0111)
    assert ea.connection_id == eb.connection_id
    assert ea.peer_qpn == b.session().qpn and eb.peer_qpn == a.session().qpn


def test_a_request_without_a_listener_is_rejected() -> None:
    net = Network(seed=1)
    a, b = net.pair(2, LinkParams(latency=10e-6))
    a.connect(b, SessionConfig(plane_mask=0b11))
    net.drive(0.001)
    assert a.events_of(ConnectionClosed) == [ConnectionClosed(reason="rejected: no listener")]
    # One REJECT per REQUEST copy; the first ends the attempt, the second is ignored.
    assert b.endpoint.drops["rejected_no_listener"] == 2


def test_the_application_may_refuse_a_request() -> None:
    net = Network(seed=1)
    a, b = net.pair(1, LinkParams(latency=10e-6))
    b.listen(SessionConfig(), accept=lambda pd: None)
    a.connect(b, SessionConfig(cm_attempts=3))
    net.drive(0.001)
    # RESOURCES means "later": a tries again on its backoff, then gives up naming it.
    assert a.events_of(ConnectionClosed) == []
    net.drive(1.0)
    assert a.events_of(ConnectionClosed) == [ConnectionClosed(reason="rejected: resources")]
    assert b.endpoint.sessions == {} and b.endpoint.drops["rejected_resources"] == 3


def test_a_lost_request_copy_leaves_its_plane_waiting_for_a_copy() -> None:
    """Plane 1 eats the first REQUEST copy; b connects on plane 0's copy alone. On an
    unsecured connection nothing but a copy of the REQUEST may teach b a's plane-1 address
    (docs/DESIGN.md §8): a's PORT_STATUS on plane 1 does not, a later copy does."""
    net = Network(seed=1)
    a, b = net.pair(2, LinkParams(latency=10e-6))
    eaten: list[bytes] = []

    def eat_first_request(data: bytes) -> bool:
        if data[0] == Opcode.CM_REQUEST and not eaten:
            eaten.append(data)
            return True
        return False

    a.links[1].params.drop_if = eat_first_request
    b.listen(SessionConfig(plane_mask=0b11))
    a.connect(b, SessionConfig(plane_mask=0b11))
    net.drive(0.001)
    assert len(eaten) == 1
    pkt = decode_packet(eaten[0])
    assert isinstance(pkt, CmPacket) and pkt.cmh.plane == 1
    assert a.events_of(ConnectionEstablished) and b.events_of(ConnectionEstablished)
    assert b.session().plane_state(1) == "down" and set(b.session().peer_addrs) == {0}
    for s in b.endpoint.receive_datagrams(1, [(eaten[0], "a", 0)], net.now):
        b.flush(s)
    assert b.session().plane_state(1) == "up"
    assert set(b.session().peer_addrs) == {0, 1}


def test_no_answer_ends_the_attempt_after_its_retries() -> None:
    net = Network(seed=1)
    a, b = net.pair(1, LinkParams(latency=10e-6))
    net.set_link(a, 0, False, at=0.0, notify=False)
    a.connect(b, SessionConfig(cm_retry=0.1, cm_attempts=3))
    net.drive(10.0)
    # REQUESTs at 0, 0.1 and 0.3; the third interval (0.4 s) ends it at t = 0.7.
    (closed,) = [(round(t, 6), e) for t, _, e in a.events if isinstance(e, ConnectionClosed)]
    assert closed == (0.7, ConnectionClosed(reason="no answer"))


def test_disconnect_closes_both_sides() -> None:
    net = Network(seed=1)
    a, b = net.pair(2, LinkParams(latency=10e-6))
    b.listen(SessionConfig(plane_mask=0b11))
    s = a.connect(b, SessionConfig(plane_mask=0b11))
    net.drive(0.001)
    net.at(0.002, lambda: (s.close(net.now), a.flush(s)))
    net.drive(0.003)
    assert a.events_of(ConnectionClosed) == [ConnectionClosed(reason="closed")]
    assert b.events_of(ConnectionClosed) == [ConnectionClosed(reason="disconnect")]


def test_a_peer_that_vanishes_is_given_up_after_ten_rtos_and_five_seconds() -> None:
    net = Network(seed=1)
    a, b = net.pair(2, LinkParams(latency=10e-6))
    dst = b.regions.register(bytearray(1 << 16))
    src = a.regions.register(bytearray(1 << 16))
    b.listen(SessionConfig(plane_mask=0b11))
    s = a.connect(b, SessionConfig(plane_mask=0b11))
    net.drive(0.001)
    # t = 0.002: both cables go silent, then a posts a WRITE that can never be acknowledged.
    net.set_link(a, 0, False, at=0.002, notify=False)
    net.set_link(a, 1, False, at=0.002, notify=False)
    net.at(0.003, lambda: (s.post_write(src, 0, 4096, dst.base_va, dst.rkey), a.flush(s)))
    net.drive(60.0)
    closes = [(t, e) for t, _, e in a.events if isinstance(e, ConnectionClosed)]
    assert [e for _, e in closes] == [ConnectionClosed(reason="retry limit")]
    assert closes[0][0] >= 0.003 + 5.0


def test_reject_reasons_for_version_and_security() -> None:
    import random
    from dataclasses import replace

    from mrc.core import cm
    from mrc.core.endpoint import Endpoint

    ep = Endpoint(rng=random.Random(1), regions=RegionTable(random.Random(1)))
    ep.listen(SessionConfig())
    good = decode_packet(
        cm.build_request(
            SessionConfig(),
            plane=0,
            local_qpn=77,
            initial_psn=5,
            nonce=b"n" * 16,
            connection_id=9,
            private_data=b"",
        )
    )
    assert isinstance(good, CmPacket)
    for field, value, reason in [
        ("version", 2, RejectReason.VERSION),
        ("security", 1, RejectReason.SECURITY_POLICY),
        ("plane_mask", 0b10, RejectReason.BAD_PARAMETERS),
    ]:
        cmh = replace(good.cmh, **{field: value})
        key_block = None
        if field == "security":
            from mrc.wire.cm import KeyBlock

            key_block = KeyBlock(ephemeral=b"e" * 32, static=b"s" * 32)
        data = replace(good, cmh=cmh, key_block=key_block).encode()
        assert ep.receive_datagrams(0, [(data, "peer", 0)], 0.0) == []
        (reject,) = ep.datagrams_to_send()
        pkt = decode_packet(reject.data)
        assert isinstance(pkt, CmPacket) and pkt.opcode is Opcode.CM_REJECT
        assert (pkt.dest_qp, pkt.cmh.reject_reason, pkt.cmh.nonce) == (77, reason, b"n" * 16)


def test_where_evs_ride_is_agreed_in_the_cmh_flags() -> None:
    """docs/WIRE.md §3, §6: the flow label only when both sides offer it; the source port
    only when both say so (a side that does not would filter the other's ports)."""
    from dataclasses import replace

    from mrc.core import cm
    from mrc.wire.cm import CM_FLAG_EV_FLOWLABEL, CM_FLAG_EV_SPORT

    base = SessionConfig(plane_mask=0b11)
    agreed: dict[tuple[str, str], str | RejectReason] = {}
    for req in ("evxh", "flowlabel", "udp"):
        for resp in ("evxh", "flowlabel", "udp"):
            request = cm._cmh(replace(base, ev_encoding=req), plane=0, local_qpn=5,
                              remote_qpn=0, initial_psn=0, nonce=bytes(16),
                              connection_id=1)  # fmt: skip
            out = cm.negotiate(replace(base, ev_encoding=resp), request)
            agreed[req, resp] = out if isinstance(out, RejectReason) else out.ev_encoding
            assert request.flags == {"evxh": 0, "flowlabel": CM_FLAG_EV_FLOWLABEL,
                                     "udp": CM_FLAG_EV_SPORT}[req]  # fmt: skip
    bad = RejectReason.BAD_PARAMETERS
    assert agreed == {
        ("evxh", "evxh"): "evxh", ("evxh", "flowlabel"): "evxh", ("evxh", "udp"): bad,
        ("flowlabel", "evxh"): "evxh", ("flowlabel", "flowlabel"): "flowlabel",
        ("flowlabel", "udp"): bad,
        ("udp", "evxh"): bad, ("udp", "flowlabel"): bad, ("udp", "udp"): "udp",
    }  # fmt: skip
    # A REPLY may not add what the requester did not offer, nor drop the source port.
    reply = cm._cmh(replace(base, ev_encoding="flowlabel"), plane=0xFF, local_qpn=6,
                    remote_qpn=5, initial_psn=0, nonce=bytes(16), connection_id=1)  # fmt: skip
    assert cm.adopt_reply(base, reply) is None
    assert cm.adopt_reply(replace(base, ev_encoding="flowlabel"), reply) is not None
    plain = replace(reply, flags=0)
    assert cm.adopt_reply(replace(base, ev_encoding="udp"), plain) is None

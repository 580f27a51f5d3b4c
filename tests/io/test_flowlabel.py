"""EVs in the IPv6 flow label (docs/DESIGN.md §4): plane sockets set a label per datagram and
per GSO batch, a node made with `ev_encoding="flowlabel"` puts every datagram's EV there, and
IPv4 planes are refused with one line. On ::1, read back with IPV6_FLOWINFO."""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import threading
from collections.abc import Iterator

import pytest
from loopback import ipv6_loopback
from node_pair import move_one_write, recorder

from mrc.core.config import SessionConfig
from mrc.core.events import Event
from mrc.core.session import Session
from mrc.io.loop import new_event_loop
from mrc.io.planes import IPV6_FLOWINFO_SEND, PlaneSocket
from mrc.node import Node, NodeError
from mrc.wire.bth import Opcode
from mrc.wire.packet import SackPacket, decode_packet, peek_opcode

IPV6_FLOWINFO = 11
SACK = Opcode.RELIABILITY_SACK.value


pytestmark = pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback")


def listener() -> socket.socket:
    r = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    r.bind(("::1", 0))
    r.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO, 1)
    r.settimeout(2)
    return r


def label_of(anc: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in anc:
        if level == socket.IPPROTO_IPV6 and kind == IPV6_FLOWINFO:
            return int(struct.unpack("!I", data[:4])[0]) & 0xFFFFF
    return None


def test_a_plane_socket_sets_the_label_of_each_datagram_and_gso_batch() -> None:
    r = listener()
    s = PlaneSocket(0, "::1", flowlabel=True)
    try:
        dst = r.getsockname()
        assert s.send(b"one", dst, label=0x12345) is None
        # A GSO batch of three: every segment carries the batch's label; only 20 bits count.
        assert s.send(b"x" * 3000, dst, 1000, label=0xABCDE | 0x0F00000) is None
        got = [r.recvmsg(4096, 256) for _ in range(4)]
        assert [label_of(anc) for _, anc, _, _ in got] == [0x12345] + [0xABCDE] * 3
        assert [len(d) for d, _, _, _ in got] == [3, 1000, 1000, 1000]
    finally:
        s.close()
        r.close()


def test_ipv4_planes_cannot_carry_a_flow_label() -> None:
    with pytest.raises(OSError):
        PlaneSocket(0, "127.0.0.2", flowlabel=True)
    loop = new_event_loop()
    try:
        with pytest.raises(NodeError, match=r"^EVs in the flow label need IPv6 on every plane; "
                                            r"plane 0 is 127\.0\.0\.2$"):  # fmt: skip
            Node(loop, ["127.0.0.2"], 0, ev_encoding="flowlabel")
        with pytest.raises(NodeError, match="unknown EV encoding 'sport'"):
            Node(loop, ["::1"], 0, ev_encoding="sport")
    finally:
        loop.close()


class LabelTap:
    """A relay on ::1 between a client and a server that forwards each datagram with the flow
    label it came with, and notes (flow label, EVXH EV or None) of every non-CM datagram the
    client sends (CM packets, opcodes 0xE0 and up, carry no EV) and the entropy of every SACK
    the server sends."""

    def __init__(self, server: tuple[str, int]) -> None:
        self.front = listener()
        self.back = listener()
        for sock in (self.front, self.back):
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO_SEND, 1)
        self.server = server
        self.seen: list[tuple[int | None, int | None]] = []
        self.sack_entropy: list[int] = []
        self.ops: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client = None
        while not self._stop.is_set():
            ready, _, _ = select.select([self.front, self.back], [], [], 0.05)
            for sock in ready:
                data, anc, _, addr = sock.recvmsg(70000, 256)
                label = label_of(anc) or 0
                if sock is self.front:
                    client = addr
                    if len(data) >= 16 and peek_opcode(data) < 0xE0:
                        ev = struct.unpack_from("!I", data, 12)[0] if data[4] & 0x01 else None
                        self.seen.append((label_of(anc), ev))
                        self.ops.append(data[0])
                    self.back.sendto(data, (*self.server, label, 0))
                elif client is not None:
                    pkt = decode_packet(data) if peek_opcode(data) == SACK else None
                    if isinstance(pkt, SackPacket) and not pkt.seth.pr:
                        self.sack_entropy.append(pkt.seth.entropy)
                    self.front.sendto(data, (client[0], client[1], label, 0))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.front.close()
        self.back.close()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = new_event_loop()
    yield loop
    loop.close()


def test_a_flowlabel_node_puts_every_datagrams_ev_in_its_label(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a = Node(loop, ["::1"], 0, serve=True)
    events: list[Event] = []
    b = Node(loop, ["::1"], 0, ev_encoding="flowlabel", on_event=recorder(events))
    tap = LabelTap(("::1", a.port))
    try:
        move_one_write(loop, a, b, events, SessionConfig(plane_mask=0b1),
                       ("::1", tap.front.getsockname()[1]), 4 << 20)  # fmt: skip
    finally:
        tap.close()
    # Every data and control datagram of the client named its EV in the flow label too.
    assert len(tap.seen) >= 1024
    assert all(ev is not None and label == ev & 0xFFFFF for label, ev in tap.seen), tap.seen[:5]
    assert len({ev for _, ev in tap.seen}) >= 16  # sprayed over the plane's EVs


def test_two_flowlabel_nodes_agree_and_leave_the_evxh_out(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Both sides want EVs in the flow label: they agree in CM, no datagram but CM carries an
    EVXH, every label is its EV's, and the server, reading labels with IPV6_FLOWINFO, echoes
    the client's EVs in its SACKs."""
    config = SessionConfig(plane_mask=0b1, ev_encoding="flowlabel")
    a = Node(loop, ["::1"], 0, serve=True, ev_encoding="flowlabel")
    events: list[Event] = []
    b = Node(loop, ["::1"], 0, ev_encoding="flowlabel", on_event=recorder(events))
    tap = LabelTap(("::1", a.port))

    def agreed(session: Session) -> None:
        assert session.config.ev_encoding == "flowlabel"

    try:
        session = move_one_write(loop, a, b, events, config, ("::1", tap.front.getsockname()[1]),
                                 4 << 20, check=agreed)  # fmt: skip
        ours = set(session.paths.evs.by_ev)
    finally:
        tap.close()
    assert len(tap.seen) >= 1024
    assert all(ev is None for _, ev in tap.seen)  # no EVXH after the handshake
    assert all(label is not None for label, _ in tap.seen)
    # Data goes out on our EVs; answers to the server's probes take the probed (its) EV.
    labels = {lab for op, (lab, _) in zip(tap.ops, tap.seen, strict=True) if op < 0xD0}
    assert len(labels) >= 16 and labels <= {ev & 0xFFFFF for ev in ours}
    assert tap.sack_entropy and set(tap.sack_entropy) <= ours

"""EVs that pick the UDP source port (docs/DESIGN.md §4, `ev_encoding = "udp"`): a plane socket
with a pool sends from one port per pool socket, a node made with `ev_encoding="udp"` sends each
EV's datagrams from the port it picks and its CM packets from the plane socket, and two such
nodes move data through a tap that sees the ports (on 127.0.0.x)."""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from node_pair import move_one_write, recorder

from mrc.core.config import SessionConfig
from mrc.core.events import Event
from mrc.core.session import Session
from mrc.io.loop import new_event_loop
from mrc.io.planes import PlaneSocket
from mrc.node import Node, NodeError
from mrc.node.host import SPORT_POOL


def test_a_pool_socket_sends_from_a_port_of_its_own() -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.2", 0))
    rx.settimeout(2)
    s = PlaneSocket(0, "127.0.0.6", pool=4)
    try:
        assert len(s.pool) == 4
        for i, via in enumerate(s.pool):
            assert s.send(bytes([i]), rx.getsockname(), via=via) is None
        s.send(b"main", rx.getsockname())
        got = [rx.recvfrom(64) for _ in range(5)]
        ports = [addr[1] for _, addr in got]
        assert len(set(ports)) == 5 and ports[-1] == s.local_addr[1]
        assert {addr[0] for _, addr in got} == {"127.0.0.6"}
        assert s.packets_sent == 5  # counted on the plane
    finally:
        s.close()
        rx.close()
    assert all(p.fileno() == -1 for p in s.pool)


class PortTap:
    """A relay between a client and a server that notes (source port, EVXH EV) of every non-CM
    datagram the client sends, and sends the server's answers to the client's plane socket
    (the address its CM packets came from)."""

    def __init__(self, server: tuple[str, int]) -> None:
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.20", 0))
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.bind(("127.0.0.21", 0))
        self.server = server
        self.seen: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client: Any = None
        while not self._stop.is_set():
            ready, _, _ = select.select([self.front, self.back], [], [], 0.05)
            for sock in ready:
                data, addr = sock.recvfrom(70000)
                if sock is self.front:
                    if data[0] >= 0xE0:
                        client = addr  # CM: the plane socket
                    elif len(data) >= 16 and data[4] & 0x01:
                        self.seen.append((addr[1], struct.unpack_from("!I", data, 12)[0]))
                    self.back.sendto(data, self.server)
                elif client is not None:
                    self.front.sendto(data, client)

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


def test_two_udp_nodes_spread_their_evs_over_source_ports(loop: asyncio.AbstractEventLoop) -> None:
    # An EV per packet and a small window: the Python relay must not be the bottleneck (a
    # burst of 1 MiB flowcells overruns it, and the test would measure its drops).
    config = SessionConfig(plane_mask=0b1, ev_encoding="udp", ev_per_plane=128, flowcell=1,
                           max_inflight=32)  # fmt: skip
    a = Node(loop, ["127.0.0.2"], 0, serve=True, ev_encoding="udp")
    events: list[Event] = []
    b = Node(loop, ["127.0.0.6"], 0, ev_encoding="udp", on_event=recorder(events))
    tap = PortTap(("127.0.0.2", a.port))
    pool_ports = {p.getsockname()[1] for p in b.planes[0].pool}
    assert len(pool_ports) == SPORT_POOL

    def agreed(session: Session) -> None:
        assert session.config.ev_encoding == "udp"

    try:
        move_one_write(loop, a, b, events, config, ("127.0.0.20", tap.front.getsockname()[1]),
                       2 << 20, check=agreed)  # fmt: skip
    finally:
        tap.close()
    # Every EV always left from the one port it picks; the data used most of the pool.
    port_of: dict[int, set[int]] = {}
    for port, ev in tap.seen:
        port_of.setdefault(ev, set()).add(port)
    assert all(len(ports) == 1 and ports <= pool_ports for ports in port_of.values())
    assert len({p for ports in port_of.values() for p in ports}) >= SPORT_POOL // 2


def test_an_unknown_encoding_is_one_line() -> None:
    loop = new_event_loop()
    try:
        with pytest.raises(NodeError, match="unknown EV encoding 'sport'"):
            Node(loop, ["127.0.0.2"], 0, ev_encoding="sport")
    finally:
        loop.close()

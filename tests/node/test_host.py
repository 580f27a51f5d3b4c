"""The host layer on real loopback sockets: binding, its one-line errors, and two nodes moving a
WRITE between them through the core."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished, Event, ImmediateReceived, WriteCompleted
from mrc.core.session import Session
from mrc.io.loop import new_event_loop
from mrc.node import Node, NodeError, bind_planes, resolve_peer

A = ["127.0.0.2", "127.0.0.3"]
B = ["127.0.0.6", "127.0.0.7"]


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = new_event_loop()
    yield loop
    loop.close()


def test_a_port_in_use_is_one_line_naming_the_plane() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.3", 0))
        port = taken.getsockname()[1]
        with pytest.raises(NodeError) as err:
            bind_planes(["127.0.0.2", "127.0.0.3"], port)
    assert str(err.value).startswith(f"cannot bind 127.0.0.3 port {port} (plane 1): ")
    assert "\n" not in str(err.value)
    # plane 0 was bound before plane 1 failed, and is closed again: the port is free.
    bind_planes(["127.0.0.2"], port)[0].close()


def test_an_unknown_interface_and_an_unresolvable_name_are_one_line() -> None:
    with pytest.raises(NodeError, match=r"cannot bind plane 0 to interface 'nosuch0': "):
        bind_planes(["127.0.0.2"], 0, interfaces=["nosuch0"])
    with pytest.raises(NodeError, match=r"cannot resolve 'no.such.host.invalid' \(plane 1\)"):
        resolve_peer(["127.0.0.2", "no.such.host.invalid"], 4791)


def test_two_nodes_move_a_write_with_an_immediate(loop: asyncio.AbstractEventLoop) -> None:
    events: dict[str, list[Event]] = {"a": [], "b": []}
    config = SessionConfig(plane_mask=0b11)
    a = Node(loop, A, 0, serve=True, on_event=lambda s, e: events["a"].append(e))
    b = Node(loop, B, 0, on_event=lambda s, e: events["b"].append(e))
    try:
        dst = a.regions.register(bytearray(1 << 20))
        payload = bytes(range(256)) * 4096
        src = b.regions.register(bytearray(payload))
        a.listen(config, lambda private: b"ok")
        a.start()
        b.start()
        peers = resolve_peer(A, a.port)
        session: Session = b.connect(config, peers, b"hello")

        async def until(cond: object, timeout: float = 5.0) -> None:
            end = loop.time() + timeout
            while not cond():  # type: ignore[operator]
                assert loop.time() < end, "timed out"
                await asyncio.sleep(0.002)

        loop.run_until_complete(
            until(lambda: any(isinstance(e, ConnectionEstablished) for e in events["b"]))
        )
        session.post_write(src, 0, len(payload), dst.base_va, dst.rkey, imm=7)
        b.flush(session)
        loop.run_until_complete(
            until(lambda: any(isinstance(e, ImmediateReceived) for e in events["a"]))
        )
        loop.run_until_complete(
            until(lambda: any(isinstance(e, WriteCompleted) for e in events["b"]))
        )
        assert bytes(dst.view) == payload
        assert [e.status for e in events["b"] if isinstance(e, WriteCompleted)] == [0]
        assert [e.imm for e in events["a"] if isinstance(e, ImmediateReceived)] == [7]
        assert a.plane_paths == {} and b.peer_path_counts(peers) == {0: 1, 1: 1}
    finally:
        b.close()
        a.close()
    assert a.closed and b.closed


def test_port_0_gives_every_plane_the_same_free_port() -> None:
    # A peer names one port for all planes (resolve_peer): a server bound with port 0 must not
    # end up on a different ephemeral port per plane.
    planes = bind_planes([*A, "127.0.0.4", "127.0.0.5"], 0)
    try:
        ports = {s.local_addr[1] for s in planes.values()}
        assert len(ports) == 1 and ports != {0}
    finally:
        for s in planes.values():
            s.close()

"""The receiver's window edge across the 2^24 PSN wrap on real loopback sockets: both sides
start a few hundred PSNs before the wrap, so the window straddles it for thousands of packets."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace

import pytest

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished, Event, WriteCompleted
from mrc.io.loop import new_event_loop
from mrc.node import Node, resolve_peer

A = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
B = ["127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"]
PSN_SPACE = 1 << 24


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = new_event_loop()
    yield loop
    loop.close()


def test_a_transfer_across_the_psn_wrap_places_every_byte(
    loop: asyncio.AbstractEventLoop,
) -> None:
    events: dict[str, list[Event]] = {"a": [], "b": []}
    base = SessionConfig(plane_mask=0b1111)
    size = 32 << 20  # 8192 packets of 4 KiB: the wrap comes after the first 300
    a = Node(loop, A, 0, serve=True, on_event=lambda s, e: events["a"].append(e))
    b = Node(loop, B, 0, on_event=lambda s, e: events["b"].append(e))
    try:
        dst = a.regions.register(bytearray(size))
        payload = bytes(i * 7 % 251 for i in range(1 << 16)) * (size >> 16)
        src = b.regions.register(bytearray(payload))
        a.listen(replace(base, initial_psn=PSN_SPACE - 700), lambda private: b"ok")
        a.start()
        b.start()
        peers = resolve_peer(A, a.port)
        session = b.connect(replace(base, initial_psn=PSN_SPACE - 300), peers, b"")

        async def until(cond: object, timeout: float = 20.0) -> None:
            end = loop.time() + timeout
            while not cond():  # type: ignore[operator]
                assert loop.time() < end, "timed out"
                await asyncio.sleep(0.002)

        loop.run_until_complete(
            until(lambda: any(isinstance(e, ConnectionEstablished) for e in events["b"]))
        )
        assert session.initial_psn == PSN_SPACE - 300
        # 1 MiB WRITEs, all posted at once: the MPR window is full across the wrap.
        for k in range(size >> 20):
            session.post_write(src, k << 20, 1 << 20, dst.base_va + (k << 20), dst.rkey)
        b.flush(session)
        loop.run_until_complete(
            until(lambda: sum(isinstance(e, WriteCompleted) for e in events["b"]) == size >> 20)
        )
        assert [e.status for e in events["b"] if isinstance(e, WriteCompleted)] == [0] * 32
        assert bytes(dst.view) == payload
        # The sender's next PSN wrapped: 8192 packets after PSN_SPACE - 300.
        sender = session.sender
        assert sender is not None
        assert sender.next_psn == (PSN_SPACE - 300 + size // 4096) % PSN_SPACE
        (responder,) = a.endpoint.sessions.values()
        assert responder.receiver is not None
        assert responder.receiver.cack == sender.next_psn  # the window's edge moved past the wrap
    finally:
        b.close()
        a.close()

"""Forged REQUESTs naming a listed key, on real loopback sockets (docs/WIRE.md §7 revision 1.2):
a listener that got 64 of them still lets the genuine peer in at once, and answers none."""

from __future__ import annotations

import asyncio
import random
import socket

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from mrc.core.cm import request_head
from mrc.core.config import SessionConfig
from mrc.core.endpoint import Endpoint
from mrc.core.events import ConnectionEstablished, Event
from mrc.core.secure.handshake import Identity
from mrc.core.session import Session
from mrc.io.loop import new_event_loop
from mrc.node import Node, resolve_peer
from mrc.wire.cm import KeyBlock

SERVER, CLIENT, ATTACKER = "127.0.0.2", "127.0.0.6", "127.0.0.9"
SERVER_KEY, CLIENT_KEY = b"\x0a" * 32, b"\x0b" * 32
SERVER_PUB, CLIENT_PUB = Identity(SERVER_KEY).public_key, Identity(CLIENT_KEY).public_key
CONFIG = SessionConfig(plane_mask=0b1, security="auth")


def forged(i: int) -> bytes:
    """A REQUEST that claims the client's (listed) key; its seal is noise."""
    eph = X25519PrivateKey.from_private_bytes(bytes([i + 1]) * 32).public_key().public_bytes_raw()
    head = request_head(CONFIG, local_qpn=0x100 + i, initial_psn=1, nonce=i.to_bytes(16, "big"),
                        connection_id=i, private_data_len=0,
                        key_block=KeyBlock(eph, CLIENT_PUB))  # fmt: skip
    return head + bytes([i]) * 28


def test_forged_requests_on_loopback_do_not_stop_the_genuine_peer() -> None:
    loop = new_event_loop()
    nodes: list[Node] = []
    attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s_ep = Endpoint(rng=random.Random(), identity=Identity(SERVER_KEY, [CLIENT_PUB]),
                        ids=random.SystemRandom())  # fmt: skip
        server_events: list[Event] = []
        server = Node(loop, [SERVER], 0, serve=True, rng=s_ep.rng, endpoint=s_ep,
                      on_event=lambda _s, e: server_events.append(e))  # fmt: skip
        nodes.append(server)
        server.start()
        server.listen(CONFIG, lambda _pd: b"ok")
        attacker.bind((ATTACKER, 0))
        attacker.setblocking(False)
        for i in range(64):
            attacker.sendto(forged(i), (SERVER, server.port))

        async def settle() -> None:
            deadline = loop.time() + 2.0
            while s_ep.drops["cm_auth"] < 64 and loop.time() < deadline:
                await asyncio.sleep(0.005)

        loop.run_until_complete(settle())
        assert s_ep.drops["cm_auth"] == 64 and s_ep.sessions == {} and server_events == []
        # The genuine client: its first REQUEST may meet an empty token bucket (64 at once),
        # its retry 0.1 s later does not.
        c_ep = Endpoint(rng=random.Random(), identity=Identity(CLIENT_KEY, [SERVER_PUB]),
                        ids=random.SystemRandom())  # fmt: skip
        client_events: list[Event] = []
        client = Node(loop, [CLIENT], 0, rng=c_ep.rng, endpoint=c_ep,
                      on_event=lambda _s, e: client_events.append(e))  # fmt: skip
        nodes.append(client)
        client.start()
        start = loop.time()
        session: Session = client.connect(CONFIG, resolve_peer([SERVER], server.port), b"")

        async def established() -> None:
            while not any(isinstance(e, ConnectionEstablished) for e in client_events):
                assert loop.time() - start < 1.0, "not established within 1 s"
                await asyncio.sleep(0.002)

        loop.run_until_complete(established())
        assert session.peer_static_key == SERVER_PUB
        (accepted,) = s_ep.sessions.values()
        assert accepted.peer_static_key == CLIENT_PUB
        # The attacker's address was never answered: nothing came back to its socket.
        try:
            attacker.recvfrom(2048)
            answered = True
        except BlockingIOError:
            answered = False
        assert not answered
    finally:
        attacker.close()
        for node in nodes:
            node.close()
        loop.close()

"""A secured transfer on real loopback sockets between two processes, rekeying every 256
packets: every byte lands, and no epoch change stalls the receiver (docs/WIRE.md §7)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import struct
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from mrc.core.config import SessionConfig
from mrc.core.endpoint import Endpoint
from mrc.core.events import ConnectionEstablished, Event, WriteCompleted
from mrc.core.secure.handshake import Identity
from mrc.io.loop import new_event_loop
from mrc.node import Node, resolve_peer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SERVER = ["127.0.0.2", "127.0.0.3"]
CLIENT = ["127.0.0.6", "127.0.0.7"]
SERVER_KEY, CLIENT_KEY = b"\x0a" * 32, b"\x0b" * 32
REGION = struct.Struct(">QI")
MiB = 1 << 20


def completed(events: list[Event]) -> int:
    return sum(isinstance(e, WriteCompleted) for e in events)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = new_event_loop()
    yield loop
    loop.close()


def _receiver(level: str, shift: int, size: int, skip: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    # The peer spies on PacketProtection.open by assignment, which compiled callers bind past:
    # it runs pure Python (the sender under test here runs whichever build is installed).
    env["MRC_PURE"] = "1"
    args = [level, str(shift), str(size), str(skip)]
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "secure_peer.py"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


@pytest.mark.parametrize("level", ["auth", "encrypt"])
def test_rekeys_every_256_packets_on_loopback_without_a_stall(
    loop: asyncio.AbstractEventLoop, level: str
) -> None:
    size, shift = 64 * MiB, 8
    warmup = 16 * MiB  # judged from there on: see secure_peer.py
    peer = _receiver(level, shift, size, warmup // 4096)
    node: Node | None = None
    try:
        assert peer.stdout is not None
        port = json.loads(peer.stdout.readline())["port"]
        identity = Identity(CLIENT_KEY, [Identity(SERVER_KEY).public_key])
        endpoint = Endpoint(rng=random.Random(), identity=identity)
        events: list[Event] = []
        node = Node(loop, CLIENT, 0, rng=endpoint.rng, endpoint=endpoint,
                    on_event=lambda s, e: events.append(e))  # fmt: skip
        node.start()
        config = SessionConfig(plane_mask=0b11, security=level, rekey_shift=shift)
        session = node.connect(config, resolve_peer(SERVER, port), b"")
        payload = random.Random(7).randbytes(size)
        src = node.regions.register(bytearray(payload))

        async def until(cond: Any, timeout: float = 60.0) -> None:
            end = loop.time() + timeout
            while not cond():
                assert loop.time() < end, "timed out"
                await asyncio.sleep(0.002)

        loop.run_until_complete(
            until(lambda: any(isinstance(e, ConnectionEstablished) for e in events))
        )
        (est,) = [e for e in events if isinstance(e, ConnectionEstablished)]
        va, rkey = REGION.unpack(est.private_data)
        for lo, hi in ((0, warmup), (warmup, size)):
            for off in range(lo, hi, MiB):
                session.post_write(src, off, MiB, va + off, rkey)
            node.flush(session)
            loop.run_until_complete(until(lambda n=hi // MiB: completed(events) == n))
        assert all(e.status == 0 for e in events if isinstance(e, WriteCompleted))
        assert session.channel is not None
        sent_epochs = session.channel.protection.tx_counter >> shift
        session.close(node.now())
        node.flush(session)
        out, err = peer.communicate(timeout=30)
    finally:
        if node is not None:
            node.close()
        if peer.poll() is None:
            peer.kill()
            peer.wait()
    result = json.loads(out.splitlines()[-1])
    assert result["bytes_placed"] == size and result["drops"].get("auth", 0) == 0, (result, err)
    assert result["content"] == payload[::4096].hex()
    assert sent_epochs >= 64 and result["epoch_changes"] >= 45
    # At every change of the newest epoch after the warm-up, and for the 8 packets after it,
    # the receiver never went 10 ms without verifying a packet.
    summary = {k: v for k, v in result.items() if k != "content"}
    assert result["worst_gap_at_change"] < 0.010, summary

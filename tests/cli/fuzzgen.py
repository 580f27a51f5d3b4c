"""Fuzz datagrams for `mrc bench -s`: real packets captured from the core, then mutated.

`capture()` runs two core endpoints against each other in memory (no sockets) through a
handshake, WRITEs with and without immediates, probes and a disconnect, and keeps every
datagram either side produced. `open_live_session` makes a real (single-plane) bench connection
to a server so that junk can be aimed at a QPN that exists there. `mutations(packets, n, seed)`
yields n datagrams: bit flips, truncations, extensions, opcode swaps, random DestQP / PSN /
R_Key / VA, and pure noise.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator

from mrc.cli.bench.proto import BenchRequest, RegionRef
from mrc.core.config import SessionConfig
from mrc.core.endpoint import Endpoint
from mrc.core.events import ConnectionEstablished
from mrc.core.memory import RegionTable
from mrc.core.session import Session
from mrc.core.transmit import Transmit

OPCODES = [
    0xC6,
    0xC7,
    0xC8,
    0xC9,
    0xCA,
    0xCB,
    0xD1,
    0xD8,
    0xD9,
    0xDC,
    0xDD,
    0xDE,
    0xE0,
    0xE1,
    0xE2,
    0xE3,
    0x00,
    0x64,
    0xFF,
]


def capture(seed: int = 11) -> list[bytes]:
    ra, rb = random.Random(seed), random.Random(seed + 1)
    a = Endpoint(rng=ra, regions=RegionTable(ra))
    b = Endpoint(rng=rb, regions=RegionTable(rb))
    config = SessionConfig(plane_mask=0b1111)
    b.listen(config, lambda pd: b"not a bench reply")
    dst = b.regions.register(bytearray(1 << 20))
    src = a.regions.register(bytearray(random.Random(seed).randbytes(200_000)))
    now = 0.0
    out: list[bytes] = []
    addr_a = {p: ("a", p) for p in range(4)}
    addr_b = {p: ("b", p) for p in range(4)}
    session = a.connect(config, addr_b, b"not a bench request", now)

    def deliver(txs: list[Transmit], to: Endpoint, frm: dict[int, tuple[str, int]]) -> None:
        for tx in txs:
            seg = tx.segment_size or len(tx.data)
            for i in range(0, len(tx.data), seg):
                d = tx.data[i : i + seg]
                out.append(bytes(d))
                to.receive_datagrams(tx.plane, [(d, frm[tx.plane], 0)], now)

    def pump(rounds: int) -> None:
        nonlocal now
        for _ in range(rounds):
            for ep, other, frm in ((a, b, addr_a), (b, a, addr_b)):
                deliver(ep.datagrams_to_send(), other, frm)
                for s in list(ep.sessions.values()):
                    timer = s.get_timer()
                    if timer is not None and timer <= now:
                        s.handle_timer(now)
                    deliver(s.datagrams_to_send(now), other, frm)
                    while s.next_event() is not None:
                        pass
            now += 0.0005

    pump(20)
    assert isinstance(session, Session) and not session.is_closed
    session.post_write(src, 0, 200_000, dst.base_va, dst.rkey, imm=3)
    session.post_write(src, 5, 3000, dst.base_va + 4096, dst.rkey)
    session.post_write(src, 0, 100, dst.base_va, dst.rkey ^ 1, imm=4)  # BAD_RKEY: a NACK
    pump(200)
    session.close(now)
    pump(5)
    return out


def mutations(packets: list[bytes], n: int, seed: int = 5) -> Iterator[bytes]:
    rng = random.Random(seed)
    for _ in range(n):
        kind = rng.randrange(10)
        if kind == 0:
            yield rng.randbytes(rng.randrange(0, 1500))
            continue
        pkt = bytearray(rng.choice(packets))
        if kind == 1:  # bit flips
            for _ in range(rng.randrange(1, 9)):
                if pkt:
                    i = rng.randrange(len(pkt) * 8)
                    pkt[i // 8] ^= 1 << (i % 8)
        elif kind == 2:  # truncation
            del pkt[rng.randrange(len(pkt) + 1) :]
        elif kind == 3:  # extension
            pkt += rng.randbytes(rng.randrange(1, 300))
        elif kind == 4 and pkt:  # opcode swap
            pkt[0] = rng.choice(OPCODES)
        elif kind == 5 and len(pkt) >= 8:  # random DestQP
            pkt[5:8] = rng.randbytes(3)
        elif kind == 6 and len(pkt) >= 12:  # random PSN
            pkt[9:12] = rng.randbytes(3)
        elif kind in (7, 8) and len(pkt) > 20:  # random R_Key / VA / lengths in the headers
            width = rng.choice((4, 8))
            off = rng.randrange(12, max(13, min(len(pkt), 60) - width))
            pkt[off : off + width] = rng.randbytes(width)
        else:  # a mix
            if pkt:
                pkt[0] = rng.choice(OPCODES)
            if len(pkt) > 4:
                pkt[rng.randrange(len(pkt))] = rng.randrange(256)
        yield bytes(pkt)


def open_live_session(
    server: tuple[str, int], host: str = "127.0.0.50"
) -> tuple[int, socket.socket]:
    """Handshake with a bench server on one plane; returns (the server's QPN, our socket)."""
    rng = random.Random()
    ep = Endpoint(rng=rng, regions=RegionTable(rng))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    sock.settimeout(0.05)
    req = BenchRequest(
        cookie=rng.getrandbits(64),
        msg_size=1 << 20,
        total_bytes=1 << 20,
        results=RegionRef(1 << 20, 1, 1 << 16),
    ).encode()
    session = ep.connect(SessionConfig(plane_mask=1), {0: server}, req, time.monotonic())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        now = time.monotonic()
        timer = session.get_timer()
        if timer is not None and timer <= now:
            session.handle_timer(now)
        for tx in session.datagrams_to_send(now):
            sock.sendto(tx.data, tx.addr)  # type: ignore[arg-type]
        while (ev := session.next_event()) is not None:
            if isinstance(ev, ConnectionEstablished):
                return session.peer_qpn, sock
        try:
            data, addr = sock.recvfrom(65536)
        except (TimeoutError, ConnectionRefusedError):
            continue
        ep.receive_datagrams(0, [(data, addr, 0)], time.monotonic())
    sock.close()
    raise RuntimeError("no handshake with the bench server")

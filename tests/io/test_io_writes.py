"""The real core on real sockets: two IoEndpoints on loopback planes, WRITEs and their outcomes."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from mrc.core.config import SessionConfig
from mrc.core.endpoint import Endpoint
from mrc.core.events import (
    ConnectionEstablished,
    Event,
    ImmediateReceived,
    WriteCompleted,
)
from mrc.core.memory import RegionTable
from mrc.core.session import Session
from mrc.io.endpoint import IoEndpoint
from mrc.io.planes import PlaneSocket

#: The one outcome of every access error (docs/WIRE.md §4): a peer cannot tell them apart.
REMOTE_ACCESS_ERROR = 0x62


@dataclass
class Side:
    io: IoEndpoint[Session]
    events: list[tuple[Session, Event]] = field(default_factory=list)

    def of(self, kind: type[Event]) -> list[Event]:
        return [e for _, e in self.events if isinstance(e, kind)]


@dataclass
class Pair:
    loop: asyncio.AbstractEventLoop
    a: Side
    b: Side
    session: Session

    def run_until(self, cond: Callable[[], bool], timeout: float = 5.0) -> None:
        async def wait() -> None:
            end = self.loop.time() + timeout
            while not cond():
                assert self.loop.time() < end, "timed out"
                await asyncio.sleep(0.002)

        self.loop.run_until_complete(wait())


def _side(loop: asyncio.AbstractEventLoop, hosts: list[str], seed: int) -> Side:
    rng = random.Random(seed)
    core = Endpoint(rng=rng, regions=RegionTable(rng))
    planes = {p: PlaneSocket(p, h, 0) for p, h in enumerate(hosts)}
    events: list[tuple[Session, Event]] = []
    side = Side(IoEndpoint(loop, core, planes, lambda s, e: events.append((s, e))), events)
    side.io.start()
    return side


@pytest.fixture
def pair() -> Iterator[Pair]:
    loop = asyncio.new_event_loop()
    config = SessionConfig(plane_mask=0b11)
    a = _side(loop, ["127.0.0.6", "127.0.0.7"], 1)
    b = _side(loop, ["127.0.0.2", "127.0.0.3"], 2)
    b.io.listen(config, lambda pd: b"reply:" + pd)
    peers = {p: s.local_addr for p, s in b.io.planes.items()}
    session = a.io.connect(config, peers, b"hello", connect_sockets=True)
    p = Pair(loop, a, b, session)
    try:
        p.run_until(lambda: bool(a.of(ConnectionEstablished)) and bool(b.of(ConnectionEstablished)))
        (est,) = a.of(ConnectionEstablished)
        assert isinstance(est, ConnectionEstablished) and est.private_data == b"reply:hello"
        yield p
    finally:
        a.io.close()
        b.io.close()
        loop.close()


def test_write_with_imm_lands_and_completes(pair: Pair) -> None:
    regions_a = pair.a.io.core.regions  # type: ignore[attr-defined]
    regions_b = pair.b.io.core.regions  # type: ignore[attr-defined]
    src = regions_a.register(bytearray(random.Random(3).randbytes(300_000)))
    dst = regions_b.register(bytearray(400_000))
    msn = pair.session.post_write(src, 0, 300_000, dst.base_va + 1000, dst.rkey, imm=77)
    pair.a.io.flush(pair.session)
    pair.run_until(lambda: bool(pair.a.of(WriteCompleted)) and bool(pair.b.of(ImmediateReceived)))
    assert pair.a.of(WriteCompleted) == [WriteCompleted(msn=msn, status=0)]
    assert [e.imm for e in pair.b.of(ImmediateReceived)] == [77]  # type: ignore[attr-defined]
    assert bytes(dst.view[1000:301_000]) == bytes(src.view)
    assert bytes(dst.view[:1000]) == bytes(1000) and bytes(dst.view[301_000:]) == bytes(99_000)


@pytest.mark.parametrize(
    ("mutate", "status"),
    [
        (lambda va, rkey, size: (va, rkey ^ 0x5A5A5A5A), REMOTE_ACCESS_ERROR),
        (lambda va, rkey, size: (va + size - 4096, rkey), REMOTE_ACCESS_ERROR),
        (lambda va, rkey, size: (va - 4096, rkey), REMOTE_ACCESS_ERROR),
    ],
    ids=["wrong-rkey", "past-the-end", "before-the-start"],
)
def test_bad_rkey_or_bounds_complete_with_error_and_write_nothing(
    pair: Pair, mutate: Callable[[int, int, int], tuple[int, int]], status: int
) -> None:
    regions_a = pair.a.io.core.regions  # type: ignore[attr-defined]
    regions_b = pair.b.io.core.regions  # type: ignore[attr-defined]
    src = regions_a.register(bytearray(b"\xab" * 40_000))
    dst = regions_b.register(bytearray(64 << 10))
    va, rkey = mutate(dst.base_va, dst.rkey, dst.size)
    bad = pair.session.post_write(src, 0, 40_000, va, rkey, imm=1)
    good = pair.session.post_write(src, 0, 1000, dst.base_va, dst.rkey)  # the QP keeps going
    pair.a.io.flush(pair.session)
    pair.run_until(lambda: len(pair.a.of(WriteCompleted)) == 2)
    assert pair.a.of(WriteCompleted) == [
        WriteCompleted(msn=bad, status=status),
        WriteCompleted(msn=good, status=0),
    ]
    assert bytes(dst.view[1000:]) == bytes(len(dst.view) - 1000)  # nothing else written
    assert bytes(dst.view[:1000]) == b"\xab" * 1000
    assert pair.b.of(ImmediateReceived) == []  # a failed message raises no immediate

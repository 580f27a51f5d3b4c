"""A two-host story harness: a writer `a`, a responder `b`, regions on both, WRITEs posted once
the handshake completes, and checks that every byte landed exactly once where it belongs."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished, Event, ImmediateReceived, WriteCompleted
from mrc.core.memory import Region
from mrc.core.session import Session
from mrc.sim import Host, LinkParams, Network

REPLY = struct.Struct(">QI")  # the responder's region: base VA, R_Key


def pattern(n: int, seed: int = 7) -> bytes:
    """Bytes that differ at every offset inside a 64 KiB period and between seeds."""
    block = bytes((i * 131 + seed * 17 + (i >> 8) * 29) & 0xFF for i in range(65536))
    return (block * (n // len(block) + 1))[:n]


@dataclass
class Transfer:
    net: Network
    a: Host
    b: Host
    src: bytes
    dst: bytearray
    src_region: Region
    dst_region: Region
    #: (offset, length, imm) per message, in posting order.
    messages: list[tuple[int, int, int | None]]
    session: Session | None = None
    posted: list[int] = field(default_factory=list)

    @property
    def completions(self) -> list[WriteCompleted]:
        return self.a.events_of(WriteCompleted)

    @property
    def immediates(self) -> list[ImmediateReceived]:
        return self.b.events_of(ImmediateReceived)

    def post_on_established(self, host: Host, session: Session, event: Event) -> None:
        """The writer's connection handler: every message posted once the handshake is done."""
        if isinstance(event, ConnectionEstablished):
            va, rkey = REPLY.unpack(event.private_data)
            for offset, length, imm in self.messages:
                self.posted.append(
                    session.post_write(self.src_region, offset, length, va + offset, rkey, imm)
                )

    def done(self) -> bool:
        return len(self.completions) == len(self.messages)

    def run(self, timeout: float = 30.0) -> None:
        assert self.net.drive_until(self.done, timeout=timeout), (
            f"only {len(self.completions)}/{len(self.messages)} WRITEs completed by "
            f"t={self.net.now:.4f}"
        )

    def assert_placed_exactly_once(self) -> None:
        """Every byte arrived at its own address, once: the content matches and the receiver
        placed exactly as many bytes as were written."""
        total = sum(length for _, length, _ in self.messages)
        covered = bytearray(len(self.dst))
        for offset, length, _ in self.messages:
            covered[offset : offset + length] = self.src[offset : offset + length]
        assert self.dst == covered
        assert self.b.session().stats.bytes_placed == total


def make_transfer(
    *,
    messages: list[tuple[int, int, int | None]],
    size: int,
    planes: int = 4,
    params: LinkParams | None = None,
    config: SessionConfig | None = None,
    seed: int = 1,
    build: Callable[[Network, Host, Host], None] | None = None,
) -> Transfer:
    net = Network(seed=seed)
    link = params or LinkParams(rate_bps=10e9, latency=20e-6, queue_bytes=8 << 20)
    a, b = net.pair(planes, link)
    if build is not None:
        build(net, a, b)
    src = pattern(size)
    dst = bytearray(size)
    t = Transfer(
        net, a, b, src, dst, a.regions.register(bytearray(src)), b.regions.register(dst), messages
    )
    cfg = config or SessionConfig(plane_mask=(1 << planes) - 1, flowcell=1)
    b.listen(cfg, accept=lambda _pd: REPLY.pack(t.dst_region.base_va, t.dst_region.rkey))
    t.session = a.connect(b, cfg, on_event=t.post_on_established)
    return t


def chunks(size: int, msg: int, *, imm: bool = True) -> list[tuple[int, int, int | None]]:
    return [
        (off, min(msg, size - off), (i if imm else None))
        for i, off in enumerate(range(0, size, msg))
    ]

"""What one side of an `mrc bench` test sets up before it runs: parameters, regions, sockets.

Holds `TestParams`, `TestSetup` (the regions registered before the handshake, so their keys can
travel in the private data, and released after the test), `IntervalSample`, `bind_planes` (one
`PlaneSocket` per address, bind errors turned into `BenchError`) and `BenchError` itself. The
test logic is `bench_roles`; the wire agreement `bench_proto`.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from mrc.core.memory import Region, RegionTable
from mrc.io.planes import PlaneSocket

from .bench_proto import RESULTS_BYTES, Pattern, RegionRef


class BenchError(Exception):
    """An expected failure: one line on stderr, exit status 1."""


WRITER = "sender"
RECEIVER = "receiver"
STATUS_NAMES = {0x80: "BAD_RKEY", 0x81: "OUT_OF_BOUNDS"}


@dataclass(frozen=True, slots=True)
class TestParams:
    msg_size: int
    duration: float = 0.0
    total_bytes: int = 0
    verify: bool = False
    seed: int = 0
    interval: float = 1.0
    #: (plane, seconds after the start): blackholes the writer's io applies.
    injects: tuple[tuple[int, float], ...] = ()


@dataclass(eq=False)
class TestSetup:
    """The regions one side registers for a test."""

    role: str
    params: TestParams
    slots: int
    regions: RegionTable
    inbox: Region
    outbox: Region
    data: Region | None = None
    source: Region | None = None
    pattern: Pattern | None = None

    @classmethod
    def allocate(cls, regions: RegionTable, role: str, params: TestParams, slots: int) -> TestSetup:
        pattern = Pattern(params.seed, params.msg_size) if params.verify else None
        inbox = regions.register(bytearray(RESULTS_BYTES))
        outbox = regions.register(bytearray(RESULTS_BYTES))
        setup = cls(role, params, slots, regions, inbox, outbox, pattern=pattern)
        if role == RECEIVER:
            setup.data = regions.register(bytearray(slots * params.msg_size))
        elif pattern is not None:
            setup.source = regions.register(pattern.stream, prefault_pages=False)
        else:
            setup.source = regions.register(bytearray(params.msg_size))
        return setup

    def ref(self, region: Region | None) -> RegionRef:
        return (
            RegionRef() if region is None else RegionRef(region.base_va, region.rkey, region.size)
        )

    def release(self) -> None:
        for region in (self.inbox, self.outbox, self.data, self.source):
            if region is not None and self.regions.lookup(region.rkey) is region:
                self.regions.deregister(region)


@dataclass(slots=True)
class IntervalSample:
    start: float
    end: float
    bytes: int
    retransmits: int
    #: (plane, bytes, packets) on the wire in this interval, this side's direction.
    planes: list[tuple[int, int, int]] = field(default_factory=list)


def bind_planes(hosts: list[str], port: int) -> dict[int, PlaneSocket]:
    planes: dict[int, PlaneSocket] = {}
    try:
        for i, host in enumerate(hosts):
            try:
                planes[i] = PlaneSocket(i, host, port, gro=True)
            except socket.gaierror as exc:
                raise BenchError(f"cannot resolve {host!r} (plane {i}): {exc.strerror}") from None
            except OSError as exc:
                reason = exc.strerror or str(exc)
                raise BenchError(f"cannot bind {host} port {port} (plane {i}): {reason}") from None
    except BaseException:
        for s in planes.values():
            s.close()
        raise
    return planes

"""What one side of an `mrc bench` test sets up before it runs: parameters and regions.

Holds `TestParams`, `TestSetup` (the regions registered before the handshake, so their keys can
travel in the private data, and released after the test), `IntervalSample`, `BenchError`, and
`record_paths` (path counts in the report). Sockets, SRv6 paths and MTU checks are the host
layer's (`mrc.node`); the test logic is `stream`'s; the wire agreement `proto`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mrc.core.memory import Region, RegionTable
from mrc.wire.ack import Syndrome, syndrome_ok

from .proto import RESULTS_BYTES, Pattern, RegionRef


class BenchError(Exception):
    """An expected failure: one line on stderr, exit status 1."""


WRITER = "sender"
RECEIVER = "receiver"
#: A failed WRITE's status by name, for `write_errors`: the NACK reason when one said which
#: remote access error it was, else the AETH's NAK syndrome (docs/WIRE.md §4).
STATUS_NAMES = {0x80: "BAD_RKEY", 0x81: "OUT_OF_BOUNDS"} | {
    s.value: s.name for s in Syndrome if not syndrome_ok(s.value)
}


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

    @classmethod
    def latency(cls, regions: RegionTable, msg_size: int) -> TestSetup:
        """Regions of one latency side: the results inbox/outbox, one slot the peer writes into
        (`data`) and one this side writes from (`source`; zeros, never changed, so a message can
        be posted again while the last one is still unacknowledged)."""
        setup = cls.allocate(regions, RECEIVER, TestParams(msg_size=msg_size), 1)
        setup.source = regions.register(bytearray(msg_size))
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
    #: The writer's congestion window at the end of the interval (bytes; iperf3's snd_cwnd).
    snd_cwnd: int | None = None
    #: The writer's payload bytes in flight and NSCC's cap (None: uncapped) by plane, at the end.
    in_flight: dict[int, tuple[int, int | None]] = field(default_factory=dict)


def record_paths(
    test_start: dict[str, Any],
    rows: list[dict[str, Any]],
    paths_file: str | None,
    counts: Mapping[int, int],
) -> None:
    """`start.test_start.paths` (the file) and a `paths` count on each plane row."""
    test_start["paths"] = paths_file
    for row in rows:
        plane = row.get("plane")
        if isinstance(plane, int):
            row["paths"] = counts.get(plane, 1)

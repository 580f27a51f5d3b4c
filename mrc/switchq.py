"""The switch egress queue's decisions, written once: ECN marking, trimming, tail drop.

Holds `QueuePolicy` (a port's queue size, ECN threshold, trimming, trim size, room for trimmed
headers and the DSCP it gives them), `Verdict`, `decide(...)`, the trimmed DSCPs and `is_data`.
Both switches of the project take their enqueue decision here: the simulator's ports
(`mrc.sim.fabric.Port`, `mrc.sim.link.Link`) and the `mrc switch` relay
(`mrc.io.switch_queue.EgressPort`). Pure: no clock, no queue of its own.

Why here, `mrc.switchq` ("switch queue"), a module of its own at the top of the package: it is a
model of a switch's egress queue, not protocol, so it is no part of `mrc.core` (an endpoint
never queues or trims anyone's packets); and it must sit below both switches that use it,
`mrc.sim` and `mrc.io`, which know nothing of each other. It imports nothing of mrc. It runs
interpreted (mypyc compiles mrc/wire, mrc/core and mrc/io): a decision costs about 190 ns more than
compiled, well under 1% of a simulator run, which makes one per packet per hop.

The rules, at enqueue, in this order (docs/WIRE.md §5, docs/DESIGN.md §5):

1. A packet that already carries a trimmed DSCP (11 or 21: trimmed at an earlier hop) goes to
   the priority queue as it is, never marked, never trimmed again.
2. A packet that fits the data queue is queued; if more than `ecn_threshold` bytes wait ahead of
   it and it is ECN-capable (ECT(0) or ECT(1)), it is marked CE.
3. A packet that does not fit is trimmed if trimming is on, it is longer than `trim_size` and
   the caller says it may be trimmed (the relay: an MRC data packet; the simulator, which
   forwards by metadata and never parses mrc bytes: any packet): its first `trim_size` bytes
   keep their ECN bits, take `trimmed_dscp` and join the priority queue.
4. Anything else that does not fit is tail-dropped; a header the priority queue has no room
   for is dropped too (`DROPPED_PRIORITY`).

What it leaves to its callers: measuring occupancy (how many bytes wait in each queue at this
instant: the simulator from its link's schedule, the relay from its token bucket), holding the
packets, serving the priority queue first, and counting.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

__all__ = [
    "ACCEPTED",
    "DSCP_TRIMMED",
    "DSCP_TRIMMED_LASTHOP",
    "MIN_TRIM_SIZE",
    "TRIMMED_DSCPS",
    "QueuePolicy",
    "Verdict",
    "decide",
    "is_data",
]

#: DSCPs of a trimmed packet (docs/WIRE.md §5 [ours: the Cumulus defaults]): 21 where the
#: port faces the destination host, 11 elsewhere.
DSCP_TRIMMED: Final = 11
DSCP_TRIMMED_LASTHOP: Final = 21
TRIMMED_DSCPS: Final = frozenset((DSCP_TRIMMED, DSCP_TRIMMED_LASTHOP))
#: Every data header, ImmDt included, must survive a trim (docs/WIRE.md §5).
MIN_TRIM_SIZE: Final = 44

_ECN_MASK: Final = 0x03
_CE: Final = 0x03
#: BTH opcodes of MRC data packets, WRITE_FIRST … WRITE_ONLY_IMM (docs/WIRE.md §2).
_FIRST_DATA: Final = 0xC6
_LAST_DATA: Final = 0xCB


def is_data(packet: bytes | bytearray | memoryview) -> bool:
    """Is this UDP payload an MRC data packet (BTH opcode 0xC6–0xCB in byte 0)?"""
    return len(packet) > 0 and _FIRST_DATA <= packet[0] <= _LAST_DATA


class Verdict(Enum):
    """What a port does with an offered packet."""

    QUEUED = "queued"
    MARKED = "marked"  # queued with CE set
    TRIMMED = "trimmed"  # its head queued at priority
    PRIORITY = "priority"  # arrived trimmed already, queued at priority
    DROPPED_QUEUE = "dropped_queue"
    DROPPED_PRIORITY = "dropped_priority"


#: Verdicts that put something in a queue.
ACCEPTED: Final = frozenset((Verdict.QUEUED, Verdict.MARKED, Verdict.TRIMMED, Verdict.PRIORITY))


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """One egress port's queueing parameters (bytes are UDP payload bytes)."""

    queue_bytes: int
    #: Mark CE on an ECN-capable packet enqueued while more than this many bytes wait;
    #: None never marks.
    ecn_threshold: int | None = None
    trim: bool = False
    trim_size: int = 64
    #: Room of the priority queue (trimmed headers).
    priority_bytes: int | None = None
    #: The DSCP a packet trimmed here takes (DSCP_TRIMMED_LASTHOP on a port facing a host).
    trimmed_dscp: int = DSCP_TRIMMED

    def __post_init__(self) -> None:
        if self.queue_bytes <= 0:
            raise ValueError("queue_bytes must be positive")
        if self.trim and self.trim_size < MIN_TRIM_SIZE:
            raise ValueError(f"trim_size must be at least {MIN_TRIM_SIZE} (docs/WIRE.md §5)")

    @property
    def priority_room(self) -> int:
        return self.queue_bytes if self.priority_bytes is None else self.priority_bytes


def decide(
    policy: QueuePolicy,
    data_queued: float,
    priority_queued: float,
    size: int,
    tos: int,
    trimmable: bool,
) -> tuple[Verdict, int, int]:
    """The verdict for a packet of `size` bytes and TOS byte `tos` offered while
    `data_queued` / `priority_queued` bytes wait, and the TOS and size it is queued with
    (the size shrinks to `trim_size` when trimmed). The rules are in the module docstring."""
    if tos >> 2 in TRIMMED_DSCPS:
        if priority_queued + size > policy.priority_room:
            return Verdict.DROPPED_PRIORITY, tos, size
        return Verdict.PRIORITY, tos, size
    if data_queued + size <= policy.queue_bytes:
        threshold = policy.ecn_threshold
        if threshold is not None and data_queued > threshold and tos & _ECN_MASK in (1, 2):
            return Verdict.MARKED, tos | _CE, size
        return Verdict.QUEUED, tos, size
    head = policy.trim_size
    if not policy.trim or size <= head or not trimmable:
        return Verdict.DROPPED_QUEUE, tos, size
    if priority_queued + head > policy.priority_room:
        return Verdict.DROPPED_PRIORITY, tos, size
    return Verdict.TRIMMED, policy.trimmed_dscp << 2 | tos & _ECN_MASK, head

"""Counters a session keeps for `mrc bench -J` and the daemon's metrics (docs/DESIGN.md §10).

Plain mutable records, updated by the sender and receiver, read by io/, sim/ and the CLI.
Nothing here decides anything.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class PlaneStats:
    packets_sent: int = 0
    bytes_sent: int = 0
    packets_received: int = 0
    bytes_received: int = 0
    retransmits: int = 0


@dataclass(slots=True)
class SessionStats:
    planes: dict[int, PlaneStats] = field(default_factory=dict)
    #: rack, rto, plane_down, nack_trimmed, nack_other, local, completion (a LAST resent to
    #: fetch its AETH), tail_probe (silence.py), silent (a window closed on a silent plane:
    #: sender.py).
    retransmits_by_cause: Counter[str] = field(default_factory=Counter)
    #: Receiver drops, one key per reason (docs/DESIGN.md §6: every drop is counted by reason).
    drops_by_reason: Counter[str] = field(default_factory=Counter)
    trimmed_received: int = 0
    #: Data packets a local queue refused (ENOBUFS: they never left the host), resent.
    local_drops: int = 0
    nacks_sent: int = 0
    nacks_received: int = 0
    probes_sent: int = 0
    probes_answered: int = 0
    #: Payload bytes placed into our regions by the peer (new placements only).
    bytes_placed: int = 0
    #: Payload bytes of ours the peer acknowledged (cumulative).
    bytes_acked: int = 0
    messages_completed: int = 0
    first_placed_at: float | None = None
    last_placed_at: float | None = None
    #: Longest gap between two new placements at the receiver (docs/DESIGN.md §10).
    longest_stall_seconds: float = 0.0
    #: When that gap began (the placement before it), on the session's clock.
    longest_stall_from: float | None = None

    def plane(self, plane: int) -> PlaneStats:
        ps = self.planes.get(plane)
        if ps is None:
            ps = self.planes[plane] = PlaneStats()
        return ps

    @property
    def longest_stall_at(self) -> float | None:
        """Seconds after the first placement that the longest stall began; None without one."""
        if self.longest_stall_from is None or self.first_placed_at is None:
            return None
        return round(self.longest_stall_from - self.first_placed_at, 6)

    @property
    def retransmits(self) -> int:
        return sum(self.retransmits_by_cause.values())

"""The sender's bytes in flight, in all and by plane, and how many new packets fit now.

The sender tells it what enters the network (a flowcell, a resend: `add`) and what leaves it
(acknowledged or declared lost: `remove`, or `left` for a batch of acknowledgements already
taken off their planes); counts are per flowcell, never per packet. The room for new packets
is the smallest of the PSN window, the packet cap, CC's window and, per plane, NSCC's plane cap
(planeq.py); one packet always fits alone. Which packets those are is the sender's business.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sized
from typing import Final

from ...wire.bth import PSN_MOD
from ..cc.control import CongestionControl
from ..config import SessionConfig

PSN_MASK: Final = PSN_MOD - 1


class InFlight:
    def __init__(
        self, config: SessionConfig, cc: CongestionControl, records: Sized, planes: Iterable[int],
        uncounted: Collection[int] = frozenset(),
    ) -> None:  # fmt: skip
        self.config = config
        self.cc = cc
        #: The sender's records by PSN: their number is the packets not yet acknowledged.
        self.records = records
        self.bytes = 0
        #: Payload bytes in flight by plane.
        self.by_plane: dict[int, int] = dict.fromkeys(planes, 0)
        #: Planes suspected silent (silence.py, which keeps the collection current): their
        #: bytes do not hold CC's window.
        self.uncounted = uncounted

    def planes_now(self) -> dict[int, int]:
        """Payload bytes in flight by plane (reports)."""
        return dict(self.by_plane)

    def add(self, plane: int, length: int) -> None:
        """`length` bytes went out on `plane` (a flowcell or a resend)."""
        self.bytes += length
        self.by_plane[plane] += length

    def remove(self, plane: int, length: int) -> None:
        """`length` bytes in flight on `plane` left the network (acknowledged or lost)."""
        self.bytes -= length
        self.by_plane[plane] -= length

    def left(self, length: int) -> None:
        """`length` bytes in flight left the network, already taken off their planes' counts
        (`by_plane`): the sender's batched acknowledgements."""
        self.bytes -= length

    def room(self, next_psn: int, una: int) -> int:
        """How many more new packets the PSN window, the packet cap and CC let go now."""
        config = self.config
        room = min(
            config.window - ((next_psn - una) & PSN_MASK),
            (config.max_inflight or config.window) - len(self.records),
        )
        if room <= 0:
            return 0
        inflight = self.bytes
        for plane in self.uncounted:
            inflight -= self.by_plane[plane]
        if inflight <= 0:
            return room
        return min(room, int((self.cc.window - inflight) // config.payload_mtu))

    def plane_room(self, plane: int, room: int) -> int:
        """`room`, narrowed to what `plane`'s own cap (NSCC's plane queue guard) lets go."""
        cap = self.cc.plane_window(plane)
        if cap is None:
            return room
        used = self.by_plane[plane]
        fits = int((cap - used) // self.config.payload_mtu)
        if fits <= 0 and not used:
            fits = 1
        return min(room, fits)

"""The sender's bytes in flight, in all and by plane, and how many new packets fit now.

Counted from the send records (`records`, PSN → `SentPacket`): new PSNs lazily, up to the
`next_psn` each call names (each is a first transmission, and nothing is acknowledged or lost
within one output pull, so the per-packet send path stays free of it); resends and records
leaving the network (acknowledged or declared lost) at once. The room for new packets is the
smallest of the PSN window, the packet cap, CC's window and, per plane, NSCC's plane cap
(planeq.py); one packet always fits alone. Which packets those are is the sender's business.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..wire.bth import PSN_MOD
from .cc import CongestionControl
from .config import SessionConfig
from .records import SentPacket

PSN_MASK = PSN_MOD - 1


class InFlight:
    def __init__(
        self,
        config: SessionConfig,
        cc: CongestionControl,
        records: dict[int, SentPacket],
        initial_psn: int,
        planes: Iterable[int],
    ) -> None:
        self.config = config
        self.cc = cc
        self.records = records
        self._bytes = 0
        self._counted = initial_psn  # new PSNs counted up to here
        #: Payload bytes in flight by plane.
        self.by_plane: dict[int, int] = dict.fromkeys(planes, 0)

    def total(self, next_psn: int) -> int:
        """Payload bytes in the network, counting the PSNs sent since the last call."""
        psn = self._counted
        if psn != next_psn:
            records, by_plane = self.records, self.by_plane
            while psn != next_psn:
                rec = records[psn]
                self._bytes += rec.length
                by_plane[rec.plane] += rec.length
                psn = (psn + 1) & PSN_MASK
            self._counted = psn
        return self._bytes

    def planes_now(self, next_psn: int) -> dict[int, int]:
        """Payload bytes in flight by plane, the PSNs sent up to `next_psn` counted (reports)."""
        self.total(next_psn)
        return dict(self.by_plane)

    def add(self, plane: int, length: int) -> None:
        """A resend went out on `plane`."""
        self._bytes += length
        self.by_plane[plane] += length

    def remove(self, rec: SentPacket, next_psn: int) -> None:
        """An INFLIGHT record left the network (acknowledged or declared lost)."""
        self._bytes = self.total(next_psn) - rec.length
        self.by_plane[rec.plane] -= rec.length

    def left(self, length: int) -> None:
        """`length` bytes of INFLIGHT records left the network, already taken off their
        planes' counts (`by_plane`) after a call to `total`: the sender's batched acks."""
        self._bytes -= length

    def room(self, next_psn: int, una: int) -> int:
        """How many more new packets the PSN window, the packet cap and CC let go now."""
        config = self.config
        room = min(
            config.window - ((next_psn - una) & PSN_MASK),
            (config.max_inflight or config.window) - len(self.records),
        )
        if room <= 0:
            return 0
        inflight = self.total(next_psn)
        if not inflight:
            return room
        return min(room, int((self.cc.window - inflight) // config.payload_mtu))

    def plane_room(self, plane: int, room: int, next_psn: int) -> int:
        """`room`, narrowed to what `plane`'s own cap (NSCC's plane queue guard) lets go."""
        cap = self.cc.plane_window(plane)
        if cap is None:
            return room
        self.total(next_psn)
        used = self.by_plane[plane]
        fits = int((cap - used) // self.config.payload_mtu)
        if fits <= 0 and not used:
            fits = 1
        return min(room, fits)

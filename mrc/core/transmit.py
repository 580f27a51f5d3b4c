"""`Transmit`: one datagram (or one GSO batch) the core asks io/ or sim/ to send.

A frozen value that names the plane, the peer address on that plane and the EV, like quinn's
`Transmit`. The core picks all three; the caller only sends `data` on the plane's socket.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

#: A peer address as the I/O layer knows it (e.g. ("127.0.0.2", 4791)); opaque to the core.
Addr = Hashable


@dataclass(frozen=True, slots=True)
class Transmit:
    plane: int
    addr: Addr
    data: bytes
    #: The EV the packet(s) carry (docs/WIRE.md §3 EVXH); 0 for CM packets.
    ev: int = 0
    #: Set when `data` holds several packets of this size back to back (UDP GSO,
    #: docs/DESIGN.md §11).
    segment_size: int | None = None

    # Written out (records.OutMessage says why): one per GSO batch and per control packet.
    def __init__(
        self, plane: int, addr: Addr, data: bytes, ev: int = 0, segment_size: int | None = None
    ) -> None:
        object.__setattr__(self, "plane", plane)
        object.__setattr__(self, "addr", addr)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "ev", ev)
        object.__setattr__(self, "segment_size", segment_size)

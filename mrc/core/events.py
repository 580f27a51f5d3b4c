"""Events a session reports to its application, pulled with `Session.next_event()`.

Frozen dataclasses named in the past tense (docs/DESIGN.md §3). This module holds only the event
types; the session decides when to raise them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    """Base class of every session event."""


@dataclass(frozen=True, slots=True)
class ConnectionEstablished(Event):
    """The CM handshake finished (requester: REPLY received; responder: REPLY sent)."""

    peer_qpn: int
    #: The peer's private data (docs/WIRE.md §6), e.g. the base address and R_Key of its region.
    private_data: bytes
    payload_mtu: int
    mpr: int
    ev_per_plane: int
    plane_mask: int
    connection_id: int


@dataclass(frozen=True, slots=True)
class ConnectionClosed(Event):
    """The connection ended; no more events follow except already queued ones."""

    #: Why: "disconnect" (peer), "closed" (local), "rejected: <reason>", "retry limit", …
    reason: str


@dataclass(frozen=True, slots=True)
class WriteCompleted(Event):
    """A posted WRITE finished; raised in MSN order (docs/DESIGN.md §2 step 7)."""

    msn: int
    #: 0 = ok, otherwise the AETH syndrome (0x80 BAD_RKEY, 0x81 OUT_OF_BOUNDS).
    status: int

    # Written out, as for the other per-message values (records.OutMessage): compiled, the
    # frozen `__init__` dataclasses generates stays interpreted, ~0.45 µs of every message.
    def __init__(self, msn: int, status: int) -> None:
        object.__setattr__(self, "msn", msn)
        object.__setattr__(self, "status", status)


@dataclass(frozen=True, slots=True)
class ImmediateReceived(Event):
    """A WRITE_WITH_IMM arrived complete; raised in MSN order at the responder."""

    msn: int
    imm: int
    #: The message's target as its packets named it: R_Key, the VA of its first byte and its
    #: length, so a host serving several applications can tell whose region it landed in.
    rkey: int = 0
    va: int = 0
    length: int = 0

    def __init__(self, msn: int, imm: int, rkey: int = 0, va: int = 0, length: int = 0) -> None:
        object.__setattr__(self, "msn", msn)
        object.__setattr__(self, "imm", imm)
        object.__setattr__(self, "rkey", rkey)
        object.__setattr__(self, "va", va)
        object.__setattr__(self, "length", length)


@dataclass(frozen=True, slots=True)
class PathRetired(Event):
    """An EV was taken out of the rotation (ASSUMED_BAD)."""

    ev: int
    plane: int
    reason: str


@dataclass(frozen=True, slots=True)
class PathRestored(Event):
    """A retired EV answered its probes and is back in the rotation."""

    ev: int
    plane: int


@dataclass(frozen=True, slots=True)
class PlaneDown(Event):
    """A plane left the rotation: local error, unanswered probes, or the peer announced it down."""

    plane: int
    reason: str


@dataclass(frozen=True, slots=True)
class PlaneUp(Event):
    """A plane came back into the rotation."""

    plane: int


@dataclass(frozen=True, slots=True)
class PortStateChanged(Event):
    """We announced to the peer that we can (`up`) or cannot receive on a plane (PORTSTATE and
    PORT_STATUS, docs/DESIGN.md §4): our link went down or came back, or the plane fell silent both
    ways to our EV_PROBEs."""

    plane: int
    up: bool

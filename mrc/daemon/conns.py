"""What the daemon keeps per MRC connection, and what two daemons say in CM private data.

Holds `Hello` (the private data of a daemon's REQUEST and REPLY, docs/DAEMON.md: who is calling,
what the connection is for, and for a mail connection the handle of the mailbox region the
responder set aside for it), `Connection` (one QP as the daemon sees it: peer, owner, state, the
WRITEs posted and not yet completed in MSN order), `WriteRecord`, `PeerTotals` (counters of the
connections to a peer that have closed, so metrics never go backwards) and `write_status`, the
AETH syndrome as the control protocol's status string.

What it leaves to others: opening and closing sessions and routing their events (`service`),
the messages carried on mail connections (`mailbox`).
"""

from __future__ import annotations

import asyncio
import struct
from collections import Counter, deque
from dataclasses import dataclass, field

from mrc.core.session import Session
from mrc.core.stats import PlaneStats, SessionStats

__all__ = [
    "APP",
    "MAIL",
    "Connection",
    "Hello",
    "PeerTotals",
    "WriteRecord",
    "write_status",
]

APP = "app"
MAIL = "mail"
_KINDS = (APP, MAIL)
_MAGIC = b"MRCd"
_VERSION = 1
_HEAD = struct.Struct(">4sBBQB")  # magic, version, kind, token, host length
_MAILBOX = struct.Struct(">QII")  # va, rkey, length


@dataclass(frozen=True, slots=True)
class Hello:
    """A daemon's CM private data."""

    kind: str
    host: str
    #: Chosen by the requester, echoed by the responder: ties the REPLY's mailbox to this QP.
    token: int
    #: (va, rkey, length) of the mailbox region the responder set aside for a mail connection.
    mailbox: tuple[int, int, int] | None = None

    def encode(self) -> bytes:
        host = self.host.encode()
        out = _HEAD.pack(_MAGIC, _VERSION, _KINDS.index(self.kind), self.token, len(host)) + host
        if self.mailbox is not None:
            out += _MAILBOX.pack(*self.mailbox)
        return out

    @classmethod
    def decode(cls, data: bytes) -> Hello | None:
        """None for anything that is not a well-formed hello of this version."""
        if len(data) < _HEAD.size:
            return None
        magic, version, kind, token, n = _HEAD.unpack_from(data)
        if magic != _MAGIC or version != _VERSION or kind >= len(_KINDS):
            return None
        end = _HEAD.size + n
        rest = len(data) - end
        if rest not in (0, _MAILBOX.size):
            return None
        try:
            host = data[_HEAD.size : end].decode()
        except UnicodeDecodeError:
            return None
        mailbox = _MAILBOX.unpack_from(data, end) if rest else None
        return cls(_KINDS[kind], host, token, mailbox)


def write_status(syndrome: int) -> str:
    """A completion status as the client sees it: 0 (the core's "any IBTA ACK") is "ok"; every
    NAK a responder can send for a WRITE (0x62 remote access error, mrc's BAD_RKEY and
    OUT_OF_BOUNDS, or another peer's code) is "remote_access_error"."""
    return "ok" if syndrome >> 5 == 0 else "remote_access_error"


@dataclass(slots=True)
class WriteRecord:
    id: int
    msn: int
    length: int
    #: The local region the bytes are read from (daemon region id; -1 for the daemon's own).
    region: int


@dataclass(eq=False)
class Connection:
    id: int
    peer: str
    kind: str
    #: "requester" (we connected) or "responder" (the peer did).
    role: str
    #: The control client that owns it (requester APP connections), else None.
    owner: int | None
    session: Session | None
    created: float
    state: str = "connecting"
    close_reason: str = ""
    outstanding: deque[WriteRecord] = field(default_factory=deque)
    #: Resolved once the handshake finished; its exception says why it did not.
    established: asyncio.Future[None] | None = None
    #: The peer's mailbox (va, rkey, length) on a requester MAIL connection.
    peer_mailbox: tuple[int, int, int] | None = None
    #: The daemon region set aside as this responder MAIL connection's mailbox.
    mailbox_region: int | None = None
    #: Status given to writes still outstanding when the connection ends (our own doing:
    #: "cancelled"; the peer's or the network's: "connection_lost").
    fail_status: str = "connection_lost"
    mrc_connection_id: int = 0
    #: The token of our hello (requester), which the peer's REPLY must echo.
    token: int = 0
    #: Why we closed it ourselves, which then replaces the core's plain "closed".
    local_reason: str = ""
    writes_posted: int = 0
    bytes_posted: int = 0
    writes_failed: int = 0
    immediates: int = 0

    @property
    def live(self) -> bool:
        return self.session is not None and not self.session.is_closed


@dataclass(slots=True)
class PeerTotals:
    """Counters of a peer's closed connections, added to the live ones' at scrape time."""

    planes: dict[int, PlaneStats] = field(default_factory=dict)
    retransmits_by_cause: Counter[str] = field(default_factory=Counter)
    drops_by_reason: Counter[str] = field(default_factory=Counter)
    connections_closed: int = 0

    def fold(self, stats: SessionStats) -> None:
        for plane, ps in stats.planes.items():
            mine = self.planes.setdefault(plane, PlaneStats())
            mine.packets_sent += ps.packets_sent
            mine.bytes_sent += ps.bytes_sent
            mine.packets_received += ps.packets_received
            mine.bytes_received += ps.bytes_received
            mine.retransmits += ps.retransmits
        self.retransmits_by_cause.update(stats.retransmits_by_cause)
        self.drops_by_reason.update(stats.drops_by_reason)
        self.connections_closed += 1

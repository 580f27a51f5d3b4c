"""What a session's two phases share: where the session is in its life (`SessionState`,
`Lifecycle`) and the interface each phase implements (`Phase`).

A session is a handshake (`Connecting`, connecting.py: the requester's REQUESTs until a REPLY
or REJECT) and then an established connection (`Established`, established.py), each an object
built whole when its phase begins; the `Session` (session.py) holds the current one and hands
it every input. A responder has no handshake phase: its REQUEST was answered by the endpoint,
so it starts established (half-open until the requester is heard from).

`Phase` says what each phase answers and what a phase that cannot do something answers: a
handshake has no WRITEs to post, no planes to report and nothing to sample. Closing is the
`Lifecycle`'s: both phases and the session hold the same one, so whichever ends the session
ends it for all, once.
"""

from __future__ import annotations

from collections import deque
from enum import Enum
from typing import Any

from .errors import LocalProtocolError
from .events import ConnectionClosed, Event
from .memory import Region
from .sink import CcRow
from .timers import Timer, TimerTable
from .transmit import Addr, Transmit


class SessionState(Enum):
    CONNECTING = "connecting"  # requester: REQUEST sent, waiting for REPLY/REJECT
    ESTABLISHED = "established"
    CLOSED = "closed"


class Lifecycle:
    """The state of one session and how it ended: shared by the session and its phases."""

    def __init__(self, events: deque[Event], timers: TimerTable, established: bool) -> None:
        self.state = SessionState.ESTABLISHED if established else SessionState.CONNECTING
        self.close_reason = ""
        self._events = events
        self._timers = timers

    @property
    def closed(self) -> bool:
        return self.state is SessionState.CLOSED

    def establish(self) -> None:
        """The handshake is over (requester: a REPLY was adopted)."""
        if self.state is SessionState.CONNECTING:
            self.state = SessionState.ESTABLISHED

    def close(self, reason: str) -> None:
        """End the session at once: no timer runs any more, `ConnectionClosed` is raised."""
        if self.state is SessionState.CLOSED:
            return
        self.state = SessionState.CLOSED
        self.close_reason = reason
        self._timers.clear()
        self._events.append(ConnectionClosed(reason=reason))


class Phase:
    """One phase of a session. The session passes each input to its current phase and pulls
    the phase's outputs; the defaults here are what a phase without a connection answers."""

    def __init__(
        self, life: Lifecycle, *, qpn: int, out: list[Transmit], peer_addrs: dict[int, Addr]
    ) -> None:
        self.life = life
        self.qpn = qpn
        #: CM packets and probes waiting for the next pull (drained by `datagrams`).
        self.out = out
        self.peer_addrs = peer_addrs

    # -- inputs -------------------------------------------------------------------------------

    def receive_span(
        self, plane: int, buf: memoryview, at: int, end: int, seg: int, tos: int, now: float,
        slot: bool = False,
    ) -> int:  # fmt: skip
        """`Session.receive_span`: the offset of the first datagram not taken. `slot`: `buf` is
        a receive slot of io's ring (the same view at every drain that reads into it), so
        views of it may be kept from read to read (`PacketProtection.open_at`)."""
        raise NotImplementedError

    def on_timer(self, timer: Timer, plane: int | None, now: float) -> None:
        """A timer of this phase expired."""

    def post_write(
        self, region: Region, offset: int, length: int, remote_va: int, rkey: int,
        imm: int | None,
    ) -> int:  # fmt: skip
        raise LocalProtocolError(f"cannot post a WRITE on a {self.life.state.value} session")

    def plane_status(self, plane: int, up: bool, now: float) -> None:
        """A local plane went down or came back (nothing to do before establishment)."""

    def transmit_failed(self, tx: Transmit, now: float) -> None:
        """A local queue refused `tx` (only data packets are resent, after establishment)."""

    def learn_addr(self, plane: int, addr: Addr, now: float) -> None:
        """The peer was seen on `plane` at `addr`."""

    def close(self, now: float) -> None:
        """The user closes the session."""
        self.life.close("closed")

    # -- outputs and reports ----------------------------------------------------------------

    def datagrams(self, now: float, limit: int | None) -> list[Transmit]:
        """`Session.datagrams_to_send`."""
        out = self.out[:]
        self.out.clear()
        return out

    @property
    def idle(self) -> bool:
        """Every posted WRITE has completed."""
        return True

    def ev_stats(self, now: float) -> list[dict[str, Any]]:
        return []

    def plane_state(self, plane: int) -> str:
        return "absent"

    def cc_rows(self) -> list[CcRow]:
        """One congestion sample per plane for the trace (sink.py)."""
        return []

    # -- helpers ------------------------------------------------------------------------------

    def cm_send(self, plane: int, data: bytes) -> None:
        if plane in self.peer_addrs:
            self.out.append(Transmit(plane=plane, addr=self.peer_addrs[plane], data=data))

"""What a session tells its trace: the `TraceSink` protocol, and `TraceLog`, which hands each
accepted session a sink of its own.

aioquic's QuicLogger is the model: the connection pushes to the trace it was handed when it
was built and never hands itself over; the trace holds no session. A session gets its sink
from whoever builds it (`Endpoint.connect(..., trace=sink)`, `Endpoint.listen(..., trace=log)`)
and passes it to the parts it builds: the EV table (timeline), the plane monitor (plane and
port changes) and the sender (retransmits, RTT samples), the last two only while the sink
`recording`. Samples of the congestion state and of the drop counters go out when the owner
asks the session for them (`Session.sample_trace`), at the pace the sink says (`cc_due`).

This module only states the protocol; `mrc.core.trace.TraceCollector` is the implementation
the bench uses. Nothing here imports the session.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from .paths.evs import EvRecord, EvWatcher

#: One congestion sample of a plane: (plane, window in bytes, bytes in flight, bytes sent).
CcRow = tuple[int, float, int, int]


class TraceSink(EvWatcher, Protocol):
    """The trace of one session, as the session and its parts push to it."""

    #: Plane, port, retransmit, RTT, cc and drop records are wanted (else the EV timeline only).
    recording: bool

    def evs_started(self, evs: Sequence[EvRecord], now: float) -> None:
        """The connection is established with these EVs: the timeline starts."""

    def plane(self, plane: int, up: bool, reason: str, now: float) -> None:
        """The plane became usable for data or stopped being usable."""

    def port(self, plane: int, up: bool, now: float) -> None:
        """The peer announced it can (or cannot) receive on `plane`."""

    def retransmit(self, psn: int, ev: int, plane: int, cause: str, now: float) -> None:
        """`psn` is sent again on `ev` of `plane` for `cause`."""

    def rtt(self, plane: int, ev: int, rtt: float, now: float) -> None:
        """An RTT sample of `plane` measured on `ev`."""

    def cc_due(self, now: float) -> bool:
        """Whether a congestion sample is wanted at `now`."""

    def sample(
        self,
        now: float,
        drops: Mapping[str, int] | None = None,
        cc: Sequence[CcRow] | None = None,
    ) -> None:
        """What is due at `now`: the drop counters as they stand (the sink records what grew)
        and, when `cc_due`, one congestion row per plane."""


class TraceLog(Protocol):
    """Hands each session a listener accepts its own trace (aioquic's `QuicLogger`)."""

    def start_trace(self, qpn: int) -> TraceSink:
        """The sink of the session that gets QPN `qpn`."""

"""`Flusher`: the one output-pull loop that io/ and sim/ both run after every input.

docs/DESIGN.md §3: after each input the caller pulls a session's outputs in a fixed order —
transmits, then the one timer deadline, then events — and feeds back what happened to the
transmits (a local queue refused one, a plane's link is gone). This module holds that loop once,
so real sockets and the simulator cannot drift apart. What it leaves to its `OutputSink`: putting
bytes on a socket or a simulated link, arming the session's single timer, and handing events to
the application. It reads no clock: `clock` is the caller's (io's monotonic clock, sim's virtual
time), read once per flush round.

The loop, per session:
1. pull new data in rounds of `pull` packets (control packets and resends are never held back)
   and send each round before framing the next: a window framed in one pull left the wire idle
   until its last packet was framed. Every round of one flush sees the same `now`.
2. a transmit the sink REFUSED whole (ENOBUFS from a full qdisc; a full simulated host queue)
   goes back to the core (`transmit_failed`), which resends its packets on another plane; the
   flush then pulls once more (once: if that fails too, the next input pulls again).
3. a PLANE_DOWN result (ENETUNREACH …) is reported once as `plane_status(plane, False)`; a later
   successful send on that plane reports it up again.
4. arm the timer, deliver the events: all the session has queued, in one `deliver` call (a
   batch of acknowledgements completes many small WRITEs at once; the application's handler
   chain then runs once for them, not once each). An event handler may call back into the
   session and flush it again: that request is folded into the running flush instead of
   recursing.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import Final, Generic, Protocol, TypeVar

from .events import Event
from .transmit import Transmit

__all__ = ["FlushSession", "Flusher", "OutputSink", "SendResult"]

#: Flush passes at most before the loop gives up on a session that keeps producing output
#: without new input (a bug, not a load: each pass needs an event or a fed-back result).
MAX_PASSES: Final = 1000
#: Pull rounds per pass at most (a bound, not a budget: an empty round ends the pass).
MAX_ROUNDS: Final = 1000


class SendResult(IntEnum):
    SENT = 0
    #: A local queue refused the whole transmit; none of its packets left the host.
    REFUSED = 1
    #: The plane's local link or route is gone (a send error such as ENETUNREACH).
    PLANE_DOWN = 2


class FlushSession(Protocol):
    """What the loop needs from a core `Session`."""

    @property
    def is_closed(self) -> bool: ...

    def datagrams_to_send(self, now: float, limit: int | None = None) -> list[Transmit]: ...

    def get_timer(self) -> float | None: ...

    def next_event(self) -> Event | None: ...

    def plane_status(self, plane: int, up: bool, now: float) -> None: ...

    def transmit_failed(self, tx: Transmit, now: float) -> None: ...


S = TypeVar("S", bound=FlushSession)
S_contra = TypeVar("S_contra", bound=FlushSession, contravariant=True)


class OutputSink(Protocol[S_contra]):
    """Where a flush puts a session's outputs."""

    def send(self, tx: Transmit, now: float) -> SendResult: ...

    def arm(self, session: S_contra, deadline: float | None, now: float) -> None: ...

    def deliver(self, session: S_contra, events: list[Event], now: float) -> None: ...


class Flusher(Generic[S]):
    """Runs the pull loop for any number of sessions over one sink."""

    def __init__(self, sink: OutputSink[S], clock: Callable[[], float], pull: int = 64) -> None:
        self.sink = sink
        self.clock = clock
        #: New data packets pulled from a session per round.
        self.pull = pull
        self._flushing: set[int] = set()
        self._again: set[int] = set()
        #: (session key, plane) reported down and not yet up again.
        self._down: set[tuple[int, int]] = set()

    def flush(self, session: S) -> None:
        """Pull everything `session` has to give now. Re-entrant calls are folded in."""
        key = id(session)
        if key in self._flushing:
            self._again.add(key)
            return
        self._flushing.add(key)
        refused_once = False
        try:
            for _ in range(MAX_PASSES):
                self._again.discard(key)
                if self._pass(session, key, refused_once):
                    refused_once = True
                if key not in self._again:
                    return
            raise RuntimeError("session kept producing output without new input")
        finally:
            self._flushing.discard(key)

    def forget(self, session: S) -> None:
        """Drop what the loop remembers about a session that is gone."""
        key = id(session)
        self._down.difference_update([k for k in self._down if k[0] == key])

    def _pass(self, session: S, key: int, refused_once: bool) -> bool:
        """One pass; True if a transmit was refused in it. A pass that sends without a
        plane reported down and meets no send error allocates nothing but the core's lists
        (the common case: one small message's wake-up)."""
        sink = self.sink
        known = self._down
        down: set[int] | None = None
        up: set[int] | None = None
        refused = False
        news = False  # a plane newly down in this pass
        now = self.clock()
        for _ in range(MAX_ROUNDS):
            txs = session.datagrams_to_send(now, self.pull)
            if not txs:
                break
            for tx in txs:
                result = sink.send(tx, now)
                if result is SendResult.SENT:
                    if known and (key, tx.plane) in known:
                        if up is None:
                            up = set()
                        up.add(tx.plane)
                elif result is SendResult.PLANE_DOWN:
                    if down is None:
                        down = set()
                    down.add(tx.plane)
                    news = news or (key, tx.plane) not in known
                else:
                    session.transmit_failed(tx, now)
                    refused = True
            if refused or news:
                break  # tell the core first; the next pass pulls the rest
        if refused and not refused_once:
            self._again.add(key)
        if up is not None:
            for plane in up if down is None else up - down:
                known.discard((key, plane))
                session.plane_status(plane, True, now)
                self._again.add(key)
        if down is not None:
            for plane in down:
                if (key, plane) not in known:
                    known.add((key, plane))
                    session.plane_status(plane, False, now)
                    self._again.add(key)
        sink.arm(session, session.get_timer(), now)
        # Events a handler raises without a flush go out right after the batch it handled.
        while (first := session.next_event()) is not None:
            events = [first]
            while (event := session.next_event()) is not None:
                events.append(event)
            sink.deliver(session, events, now)
        return refused

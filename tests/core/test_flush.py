"""The one output-pull loop (`mrc.core.flush`) told as stories with a scripted session and sink.

The session hands out prepared transmits and events; the sink answers each send with a scripted
result. The stories check what io/ and sim/ both rely on: the order of outputs, what is fed back
to the core, and that a flush requested from inside an event handler is folded in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from mrc.core.events import Event, PlaneDown, WriteCompleted
from mrc.core.flush import Flusher, SendResult
from mrc.core.transmit import Transmit


@dataclass
class Script:
    """A stand-in session: each pull returns the next prepared round (limit recorded)."""

    rounds: deque[list[Transmit]] = field(default_factory=deque)
    events: deque[Event] = field(default_factory=deque)
    timer: float | None = None
    closed: bool = False
    log: list[str] = field(default_factory=list)

    @property
    def is_closed(self) -> bool:
        return self.closed

    def datagrams_to_send(self, now: float, limit: int | None = None) -> list[Transmit]:
        self.log.append(f"pull@{now:g}/{limit}")
        return self.rounds.popleft() if self.rounds else []

    def get_timer(self) -> float | None:
        self.log.append("timer")
        return self.timer

    def next_event(self) -> Event | None:
        return self.events.popleft() if self.events else None

    def plane_status(self, plane: int, up: bool, now: float) -> None:
        self.log.append(f"plane {plane} {'up' if up else 'down'}")

    def transmit_failed(self, tx: Transmit, now: float) -> None:
        self.log.append(f"refused {tx.data!r}")


@dataclass
class Sink:
    results: dict[bytes, SendResult] = field(default_factory=dict)
    sent: list[bytes] = field(default_factory=list)
    armed: list[float | None] = field(default_factory=list)
    delivered: list[Event] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    flusher: Flusher[Script] | None = None
    reflush_on_event: bool = False
    #: Called once per `deliver`, as an application's handler would run.
    handler: Callable[[], None] | None = None

    def send(self, tx: Transmit, now: float) -> SendResult:
        self.sent.append(tx.data)
        return self.results.get(tx.data, SendResult.SENT)

    def arm(self, session: Script, deadline: float | None, now: float) -> None:
        self.armed.append(deadline)

    def deliver(self, session: Script, events: list[Event], now: float) -> None:
        self.delivered += events
        self.batches.append(len(events))
        if self.handler is not None:
            self.handler()
        if self.reflush_on_event and self.flusher is not None:
            self.flusher.flush(session)  # what an application's handler does


def tx(data: bytes, plane: int = 0) -> Transmit:
    return Transmit(plane=plane, addr="peer", data=data)


@pytest.fixture
def rig() -> tuple[Script, Sink, Flusher[Script]]:
    session, sink = Script(), Sink()
    flusher = Flusher(sink, clock=lambda: 1.5, pull=4)
    sink.flusher = flusher
    return session, sink, flusher


def test_transmits_then_timer_then_events_with_one_now(
    rig: tuple[Script, Sink, Flusher[Script]],
) -> None:
    session, sink, flusher = rig
    session.rounds.extend([[tx(b"a"), tx(b"b")], [tx(b"c")]])
    session.events.append(WriteCompleted(msn=0, status=0))
    session.timer = 2.0
    flusher.flush(session)
    assert sink.sent == [b"a", b"b", b"c"]
    assert session.log == ["pull@1.5/4", "pull@1.5/4", "pull@1.5/4", "timer"]
    assert sink.armed == [2.0]
    assert sink.delivered == [WriteCompleted(msn=0, status=0)]


def test_queued_events_go_to_the_sink_in_one_batch_and_later_ones_follow_it(
    rig: tuple[Script, Sink, Flusher[Script]],
) -> None:
    session, sink, flusher = rig
    done = [WriteCompleted(msn=m, status=0) for m in range(3)]
    session.events.extend(done)
    late = PlaneDown(plane=0, reason="raised by the handler")

    def handler() -> None:
        # The handler raises one more event without asking for a flush: it is delivered in
        # the same pass, right after the batch that was running.
        if len(sink.batches) == 1:
            session.events.append(late)

    sink.handler = handler
    flusher.flush(session)
    assert sink.batches == [3, 1]
    assert sink.delivered == [*done, late]
    assert sink.armed == [None]


def test_a_refused_transmit_goes_back_to_the_core_and_is_pulled_once_more(
    rig: tuple[Script, Sink, Flusher[Script]],
) -> None:
    session, sink, flusher = rig
    sink.results[b"a"] = SendResult.REFUSED
    sink.results[b"r1"] = SendResult.REFUSED
    # Round 1 is refused: the pass stops pulling, the core hears of it, a second pass pulls the
    # resend, which is refused too: no third pass (the next input pulls again).
    session.rounds.extend([[tx(b"a"), tx(b"b")], [tx(b"r1")], [tx(b"never")]])
    flusher.flush(session)
    assert sink.sent == [b"a", b"b", b"r1"]
    assert [e for e in session.log if e.startswith("refused")] == ["refused b'a'", "refused b'r1'"]
    assert list(session.rounds) == [[tx(b"never")]]


def test_a_plane_down_is_reported_once_and_up_again_after_a_good_send(
    rig: tuple[Script, Sink, Flusher[Script]],
) -> None:
    session, sink, flusher = rig
    sink.results[b"d1"] = SendResult.PLANE_DOWN
    sink.results[b"d2"] = SendResult.PLANE_DOWN
    session.rounds.extend([[tx(b"d1", plane=2)], [tx(b"d2", plane=2)]])
    flusher.flush(session)
    flusher.flush(session)
    assert [e for e in session.log if e.startswith("plane")] == ["plane 2 down"]
    session.rounds.append([tx(b"ok", plane=2)])
    flusher.flush(session)
    assert [e for e in session.log if e.startswith("plane")] == ["plane 2 down", "plane 2 up"]


def test_a_flush_asked_for_by_an_event_handler_is_folded_into_the_running_one(
    rig: tuple[Script, Sink, Flusher[Script]],
) -> None:
    session, sink, flusher = rig
    sink.reflush_on_event = True
    session.events.append(PlaneDown(plane=1, reason="test"))
    session.rounds.extend([[tx(b"first")], [], [tx(b"posted by the handler")]])
    flusher.flush(session)
    # One pass sends `first`, delivers the event (whose handler asks for a flush: folded), and a
    # second pass picks up what the handler posted; no recursion.
    assert sink.sent == [b"first", b"posted by the handler"]
    assert sink.armed == [None, None]


def test_a_session_that_never_stops_producing_output_is_an_error(
    rig: tuple[Script, Sink, Flusher[Script]],
) -> None:
    _, sink, flusher = rig
    sink.reflush_on_event = True

    class Endless(Script):
        """One event every pass, whose handler asks for another flush: a loop without input."""

        fresh = False

        def get_timer(self) -> float | None:
            self.fresh = True
            return None

        def next_event(self) -> Event | None:
            event, self.fresh = (WriteCompleted(msn=1, status=0) if self.fresh else None), False
            return event

    endless = Endless()
    with pytest.raises(RuntimeError, match="kept producing output"):
        flusher.flush(endless)

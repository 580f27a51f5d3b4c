"""IoEndpoint against a scripted fake core: batching, flush order, the one timer, faults."""

from __future__ import annotations

import asyncio
import errno
import select
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import pytest
from counting import CountingReads

from mrc.core.config import SessionConfig
from mrc.core.events import Event, PlaneUp
from mrc.core.sink import TraceLog, TraceSink
from mrc.core.transmit import Transmit
from mrc.io.endpoint import IoEndpoint
from mrc.io.loop import new_event_loop
from mrc.io.planes import PlaneSocket


@dataclass(eq=False)
class FakeSession:
    peer: tuple[str, int]
    outbox: list[Transmit] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    deadline: float | None = None
    timer_calls: list[float] = field(default_factory=list)
    status: list[tuple[int, bool]] = field(default_factory=list)
    refused: list[Transmit] = field(default_factory=list)
    pulls: int = 0
    received: list[tuple[int, list[bytes]]] = field(default_factory=list)
    closed: bool = False

    @property
    def is_closed(self) -> bool:
        return self.closed

    def datagrams_to_send(self, now: float, limit: int | None = None) -> list[Transmit]:
        self.pulls += 1
        out, self.outbox = self.outbox, []
        return out

    def get_timer(self) -> float | None:
        return self.deadline

    def next_event(self) -> Event | None:
        return self.events.pop(0) if self.events else None

    def handle_timer(self, now: float) -> None:
        self.timer_calls.append(now)
        self.deadline = None

    def plane_status(self, plane: int, up: bool, now: float) -> None:
        self.status.append((plane, up))

    def transmit_failed(self, tx: Transmit, now: float) -> None:
        self.refused.append(tx)
        self.outbox.append(Transmit(tx.plane, tx.addr, b"again:" + tx.data))


class FakeCore:
    def __init__(self) -> None:
        self.session: FakeSession | None = None
        self.calls: list[tuple[int, int]] = []
        self.drops: Counter[str] = Counter()
        self.sessions: dict[int, FakeSession] = {}
        self.discarded: list[FakeSession] = []
        self.endpoint_out: list[Transmit] = []

    def receive_datagrams(
        self, plane: int, datagrams: Sequence[tuple[bytes | memoryview, Hashable, int]], now: float
    ) -> list[FakeSession]:
        self.calls.append((plane, len(datagrams)))
        if self.session is None:
            return []
        self.session.received.append((plane, [bytes(d) for d, _, _ in datagrams]))
        # echo each datagram back on the same plane
        for d, addr, _ in datagrams:
            self.session.outbox.append(Transmit(plane, addr, b"echo:" + bytes(d)))
        return [self.session]

    def receive_reads(
        self, plane: int, reads: Sequence[tuple[memoryview, Hashable, int, int, int]], now: float
    ) -> list[FakeSession]:
        """io hands over whole reads; this fake cuts them into datagrams as the core would."""
        datagrams = []
        for buf, addr, tos, seg, nbytes in reads:
            step = seg or nbytes
            datagrams += [
                (buf[i : min(i + step, nbytes)], addr, tos) for i in range(0, nbytes, step)
            ]
        return self.receive_datagrams(plane, datagrams, now)

    def datagrams_to_send(self) -> list[Transmit]:
        out, self.endpoint_out = self.endpoint_out, []
        return out

    def listen(
        self,
        config: SessionConfig,
        accept: Callable[[bytes], bytes | None],
        *,
        trace: TraceLog | None = None,
    ) -> None:
        pass

    def connect(
        self,
        config: SessionConfig,
        peer_addrs: dict[int, Hashable],
        private_data: bytes,
        now: float,
        *,
        peer_key: bytes | None = None,
        trace: TraceSink | None = None,
        wall: float | None = None,
    ) -> FakeSession:
        addr = peer_addrs[0]
        assert isinstance(addr, tuple)
        self.session = FakeSession(addr)
        self.sessions[1] = self.session
        for plane, a in peer_addrs.items():
            self.session.outbox.append(Transmit(plane, a, b"hello"))
        return self.session

    def discard(self, session: FakeSession) -> None:
        self.discarded.append(session)
        self.sessions = {k: v for k, v in self.sessions.items() if v is not session}


def run(loop: asyncio.AbstractEventLoop, until: Callable[[], bool], timeout: float = 2.0) -> None:
    async def waiter() -> None:
        end = loop.time() + timeout
        while not until():
            assert loop.time() < end, "timed out"
            await asyncio.sleep(0.001)

    loop.run_until_complete(waiter())


def make(
    n: int = 2, on_event: Callable[[FakeSession, Event], None] | None = None
) -> tuple[asyncio.AbstractEventLoop, FakeCore, IoEndpoint[FakeSession], list[PlaneSocket]]:
    loop = asyncio.new_event_loop()
    core = FakeCore()
    planes = {p: PlaneSocket(p, f"127.0.0.{2 + p}", 0) for p in range(n)}
    peers = [PlaneSocket(p, f"127.0.0.{10 + p}", 0) for p in range(n)]
    io: IoEndpoint[FakeSession] = IoEndpoint(loop, core, planes, on_event)
    io.start()
    return loop, core, io, peers


def test_batches_go_to_the_core_once_per_plane_and_outputs_are_flushed() -> None:
    events: list[Event] = []
    loop, core, io, peers = make(on_event=lambda s, e: events.append(e))
    try:
        session = io.connect(
            SessionConfig(plane_mask=3), {p: s.local_addr for p, s in enumerate(peers)}, b""
        )
        for peer in peers:
            run(loop, lambda peer=peer: bool(peer.drain(8)))  # "hello" arrived on each plane
        session.events.append(PlaneUp(1))
        for i in range(10):
            peers[0].send(bytes([i]), io.planes[0].local_addr)
        run(loop, lambda: sum(len(d) for _, d in session.received) == 10)
        assert all(plane == 0 for plane, _ in core.calls)
        assert len(core.calls) < 10  # batched, not one call per datagram
        echoes: list[bytes] = []
        run(
            loop,
            lambda: echoes.extend(bytes(d) for d, _, _ in peers[0].drain(64)) or len(echoes) == 10,
        )
        assert echoes == [b"echo:" + bytes([i]) for i in range(10)]
        assert events == [PlaneUp(1)]
    finally:
        io.close()
        loop.close()
        for p in peers:
            p.close()


def test_one_timer_per_session_rearmed_and_fired() -> None:
    loop, _core, io, peers = make(1)
    try:
        session = io.connect(SessionConfig(), {0: peers[0].local_addr}, b"")
        now = io.now()
        session.deadline = now + 10.0
        io.flush(session)
        session.deadline = now + 0.01  # moved earlier: the old handle is replaced
        io.flush(session)
        io.flush(session)  # unchanged deadline: same handle kept
        assert len(io._timers) == 1
        run(loop, lambda: bool(session.timer_calls))
        assert len(session.timer_calls) == 1 and session.timer_calls[0] >= now + 0.01
        assert io._timers == {}
    finally:
        io.close()
        loop.close()
        peers[0].close()


def test_reentrant_flush_from_on_event() -> None:
    seen: list[Event] = []

    def on_event(s: FakeSession, e: Event) -> None:
        seen.append(e)
        if len(seen) == 1:  # the application reacts by queueing more output
            s.outbox.append(Transmit(0, peers[0].local_addr, b"reaction"))
            s.events.append(PlaneUp(7))
            io.flush(s)

    loop, _core, io, peers = make(1, on_event)
    try:
        session = io.connect(SessionConfig(), {0: peers[0].local_addr}, b"")
        session.events.append(PlaneUp(0))
        io.flush(session)
        assert seen == [PlaneUp(0), PlaneUp(7)]
        got: list[bytes] = []
        run(
            loop,
            lambda: got.extend(bytes(d) for d, _, _ in peers[0].drain(8)) or b"reaction" in got,
        )
    finally:
        io.close()
        loop.close()
        peers[0].close()


def test_inject_plane_down_is_a_silent_blackhole() -> None:
    loop, _core, io, peers = make(2)
    try:
        session = io.connect(
            SessionConfig(plane_mask=3), {0: peers[0].local_addr, 1: peers[1].local_addr}, b""
        )
        io.inject_plane_down(1, io.now())
        for _i in range(5):
            session.outbox.append(Transmit(1, peers[1].local_addr, b"lost"))
            session.outbox.append(Transmit(0, peers[0].local_addr, b"kept"))
        session.outbox.append(Transmit(1, peers[1].local_addr, b"x" * 40, segment_size=10))
        io.flush(session)
        assert io.counters["injected_plane_down"] == 9
        assert session.status == []  # the core is NOT told
        got: list[bytes] = []
        run(
            loop,
            lambda: (
                got.extend(bytes(d) for d, _, _ in peers[0].drain(64)) or got.count(b"kept") == 5
            ),
        )
        assert peers[1].drain(64) == [] or all(
            bytes(d) == b"hello" for d, _, _ in peers[1].drain(64)
        )
    finally:
        io.close()
        loop.close()
        for p in peers:
            p.close()


def test_send_errors_become_plane_status_and_recover() -> None:
    loop, _core, io, peers = make(1)
    try:
        session = io.connect(SessionConfig(), {0: peers[0].local_addr}, b"")
        sock = io.planes[0]
        real = sock.sock

        class Down:
            def sendto(self, data: bytes, addr: object) -> int:
                raise OSError(errno.ENETUNREACH, "down")

            def recvmsg(self, *args: object) -> object:
                raise BlockingIOError(errno.EAGAIN, "no ICMP error queued: the link is down")

        sock.sock = Down()  # type: ignore[assignment]
        session.outbox.append(Transmit(0, peers[0].local_addr, b"a"))
        session.outbox.append(Transmit(0, peers[0].local_addr, b"b"))
        io.flush(session)
        assert session.status == [(0, False)]  # reported once
        sock.sock = real
        session.outbox.append(Transmit(0, peers[0].local_addr, b"c"))
        io.flush(session)
        assert session.status == [(0, False), (0, True)]
    finally:
        io.close()
        loop.close()
        peers[0].close()


def test_a_transmit_a_full_queue_refuses_goes_back_to_the_core_which_is_pulled_once_more() -> (
    None
):
    loop, _core, io, peers = make(1)
    try:
        session = io.connect(SessionConfig(), {0: peers[0].local_addr}, b"")
        sock = io.planes[0]
        real = sock.sock

        class Full:
            def sendto(self, data: bytes, addr: object) -> int:
                raise OSError(errno.ENOBUFS, "qdisc full")

            def sendmsg(self, *args: object) -> int:
                raise OSError(errno.ENOBUFS, "qdisc full")

        sock.sock = Full()  # type: ignore[assignment]
        batch = Transmit(0, peers[0].local_addr, b"x" * 40, segment_size=10)
        session.outbox.append(batch)
        pulls = session.pulls
        io.flush(session)
        # The core heard of the batch once; its resend (refused too) waits for the next
        # input instead of spinning: two pulls in all, and no plane went DOWN.
        assert session.refused[0] is batch
        assert [t.data for t in session.refused] == [b"x" * 40, b"again:" + b"x" * 40]
        assert session.pulls - pulls == 2
        assert session.status == []
        assert sock.counters["local_drop_enobufs"] == 2
        sock.sock = real
        io.flush(session)  # the queue drained: the pending resend leaves
        got: list[bytes] = []
        run(loop, lambda: got.extend(bytes(d) for d, _, _ in peers[0].drain(8)) or (
            b"again:again:" + b"x" * 40 in got
        ))
    finally:
        io.close()
        loop.close()
        peers[0].close()


def test_a_flush_pulls_in_rounds_and_sends_each_round_before_framing_the_next() -> None:
    loop, _core, io, peers = make(1)
    try:
        session = io.connect(SessionConfig(), {0: peers[0].local_addr}, b"")
        io.flush(session)  # the handshake's own datagram
        sock = io.planes[0]
        # The core has 5 transmits for a pull without a limit; with `limit` it hands over
        # `limit` per pull, as a sender framing whole flowcells would.
        waiting = [Transmit(0, peers[0].local_addr, bytes([i])) for i in range(5)]
        pulls: list[tuple[float, int | None, int]] = []

        def datagrams_to_send(now: float, limit: int | None = None) -> list[Transmit]:
            pulls.append((now, limit, sock.packets_sent))
            n = len(waiting) if limit is None else limit
            out = waiting[:n]
            del waiting[:n]
            return out

        session.datagrams_to_send = datagrams_to_send  # type: ignore[method-assign]
        io.pull = 2
        sent0 = sock.packets_sent
        io.flush(session)
        # Rounds of 2, 2, 1, then the empty pull that ends the flush; each round was on the
        # wire before the next pull, and all of them are one instant to the core.
        assert [(limit, sent - sent0) for _, limit, sent in pulls] == [
            (2, 0), (2, 2), (2, 4), (2, 5)
        ]
        assert len({now for now, _, _ in pulls}) == 1
        got: list[bytes] = []
        run(loop, lambda: got.extend(bytes(d) for d, _, _ in peers[0].drain(8)) or len(got) >= 6)
        assert got == [b"hello"] + [bytes([i]) for i in range(5)]
    finally:
        io.close()
        loop.close()
        peers[0].close()


def test_a_plane_going_down_mid_flush_is_told_before_the_next_round() -> None:
    loop, _core, io, peers = make(2)
    try:
        session = io.connect(SessionConfig(plane_mask=3),
                             {p: s.local_addr for p, s in enumerate(peers)}, b"")
        io.flush(session)
        sock = io.planes[0]

        class Down:
            def sendto(self, data: bytes, addr: object) -> int:
                raise OSError(errno.ENETUNREACH, "down")

            def recvmsg(self, *args: object) -> object:
                raise BlockingIOError(errno.EAGAIN, "no ICMP error queued")

        real, sock.sock = sock.sock, Down()  # type: ignore[assignment]
        rounds = [[Transmit(p, peers[p].local_addr, b"x")] for p in (0, 1)]
        seen: list[list[tuple[int, bool]]] = []

        def datagrams_to_send(now: float, limit: int | None = None) -> list[Transmit]:
            seen.append(list(session.status))
            return rounds.pop(0) if rounds else []

        session.datagrams_to_send = datagrams_to_send  # type: ignore[method-assign]
        io.flush(session)
        # The second round was pulled only after the core heard plane 0 is down.
        assert seen == [[], [(0, False)], [(0, False)]]
        sock.sock = real
    finally:
        io.close()
        loop.close()
        for p in peers:
            p.close()


def test_what_arrives_on_a_drained_plane_during_a_wake_up_is_read_before_the_flush() -> None:
    """A SACK sent together with one just read, but on a plane already drained, must not
    wait for the next wake-up: RACK would meanwhile take the packets it acknowledges for
    lost, because a later packet of their EV was acknowledged by the other."""
    loop, core, io, peers = make(2)
    try:
        session = io.connect(SessionConfig(plane_mask=3),
                             {p: s.local_addr for p, s in enumerate(peers)}, b"")
        io.flush(session)
        order: list[object] = []
        receive = core.receive_datagrams

        def receive_datagrams(
            plane: int, datagrams: Sequence[tuple[bytes | memoryview, Hashable, int]], now: float
        ) -> list[FakeSession]:
            order.append((plane, [bytes(d) for d, _, _ in datagrams]))
            if plane == 1 and len(order) == 2:
                peers[0].send(b"late", io.planes[0].local_addr)  # plane 0 was drained
                select.select([io.planes[0].fileno()], [], [], 1.0)
            return receive(plane, datagrams, now)

        core.receive_datagrams = receive_datagrams  # type: ignore[method-assign]
        pull = session.datagrams_to_send

        def datagrams_to_send(now: float, limit: int | None = None) -> list[Transmit]:
            order.append("flush")
            return pull(now, limit)

        session.datagrams_to_send = datagrams_to_send  # type: ignore[method-assign]
        for p, peer in enumerate(peers):
            peer.send(b"first", io.planes[p].local_addr)
        run(loop, lambda: all(_readable(s) for s in io.planes.values()))
        io._drain_start = 0
        io._on_readable(0)
        assert order[:4] == [(0, [b"first"]), (1, [b"first"]), (0, [b"late"]), "flush"]
    finally:
        io.close()
        loop.close()
        for p in peers:
            p.close()


def test_a_wake_up_for_one_datagram_reads_once_and_the_next_pass_reads_the_rest() -> None:
    """A plane whose last drain took one datagram is read once in a wake-up's first pass (no
    read that finds it empty: a syscall and a raised BlockingIOError); what came with it is
    read by the second pass, before the flush."""
    loop, _core, io, peers = make(1)
    try:
        session = io.connect(SessionConfig(plane_mask=1), {0: peers[0].local_addr}, b"")
        io.flush(session)
        sock = io.planes[0]
        counting = CountingReads(sock.sock)
        sock.sock = counting  # type: ignore[assignment]
        peers[0].send(b"one", sock.local_addr)
        # (select, not `run`: the loop would read it with its own callback)
        assert select.select([sock.fileno()], [], [], 1.0)[0]
        sock.drained = 1  # (the last drain took one datagram)
        io._on_readable(0)
        assert session.received[-1] == (0, [b"one"])
        assert (counting.reads, counting.empty) == (1, 0)
        # Two at once: the first pass reads one, its poll finds the other, the second pass
        # reads it (then the socket is empty), and the session is flushed once for both.
        for d in (b"two", b"three"):
            peers[0].send(d, sock.local_addr)
        assert select.select([sock.fileno()], [], [], 1.0)[0]
        pulls = session.pulls
        io._on_readable(0)
        assert session.received[-2:] == [(0, [b"two"]), (0, [b"three"])]
        assert (counting.reads, counting.empty) == (4, 1)
        assert session.pulls == pulls + 2  # one flush: the pull of both echoes, an empty one
    finally:
        io.close()
        loop.close()
        for p in peers:
            p.close()


def test_closed_session_is_discarded_and_close_cleans_up() -> None:
    loop, core, io, peers = make(1)
    try:
        session = io.connect(SessionConfig(), {0: peers[0].local_addr}, b"")
        session.deadline = io.now() + 100
        io.flush(session)
        session.closed = True
        session.deadline = None
        io.flush(session)
        assert core.discarded == [session]
        session2 = io.connect(SessionConfig(), {0: peers[0].local_addr}, b"")
        session2.deadline = io.now() + 100
        io.flush(session2)
        io.close()
        assert io._timers == {} and io.closed
        assert all(s.sock.fileno() == -1 for s in io.planes.values())
        io.close()  # idempotent
    finally:
        loop.close()
        peers[0].close()


def test_core_exception_is_counted_not_raised() -> None:
    loop, core, io, peers = make(1)
    errors: list[str] = []
    io.on_error = errors.append
    try:

        def boom(*args: object) -> list[FakeSession]:
            raise ValueError("bad")

        core.receive_datagrams = boom  # type: ignore[method-assign]
        peers[0].send(b"junk", io.planes[0].local_addr)
        run(loop, lambda: bool(errors))
        assert io.counters["internal_error_ValueError"] == 1
        assert errors[0].startswith("internal error in receive on plane 0")
        assert io.internal_errors == 1 and io.first_internal_error == errors[0]
    finally:
        io.close()
        loop.close()
        peers[0].close()


def test_gso_transmit_through_the_endpoint_arrives_as_datagrams() -> None:
    loop, _core, io, peers = make(1)
    try:
        session = io.connect(SessionConfig(), {0: peers[0].local_addr}, b"")
        batch = b"".join(bytes([i]) * 1200 for i in range(5)) + b"\x09" * 77
        session.outbox.append(Transmit(0, peers[0].local_addr, batch, ev=3, segment_size=1200))
        io.flush(session)
        got: list[bytes] = []
        run(loop, lambda: got.extend(bytes(d) for d, _, _ in peers[0].drain(64)) or len(got) >= 7)
        assert got == [b"hello"] + [bytes([i]) * 1200 for i in range(5)] + [b"\x09" * 77]
        assert io.planes[0].packets_sent == 7
    finally:
        io.close()
        loop.close()
        peers[0].close()


def test_each_wake_up_drains_the_planes_from_the_next_one_on() -> None:
    """With data waiting on every plane at each wake-up, the plane drained first rotates: a
    fixed order made what arrives during a wake-up wait one more on the first plane only,
    which read as a queue of that plane's own and capped it."""
    loop, core, io, peers = make(3)
    try:
        io.connect(SessionConfig(plane_mask=7), {p: s.local_addr for p, s in enumerate(peers)},
                   b"")
        firsts = []
        for wake in range(6):
            for p, peer in enumerate(peers):
                peer.send(bytes([wake, p]), io.planes[p].local_addr)
            core.calls.clear()
            # Loopback delivers at once; then one wake-up, as the loop would run it.
            run(loop, lambda: all(_readable(s) for s in io.planes.values()))
            io._on_readable(0)
            assert sorted(plane for plane, _ in core.calls) == [0, 1, 2]
            firsts.append(core.calls[0][0])
        assert firsts == [0, 1, 2, 0, 1, 2]
    finally:
        io.close()
        loop.close()
        for p in peers:
            p.close()


def test_a_wake_up_reads_only_the_planes_with_something_waiting() -> None:
    """One datagram on one of four planes: that plane is read once, and no other plane is read
    at all (an empty socket's read is a syscall and a raised BlockingIOError; a small
    message's round trip paid seven of them a wake-up). Nor is any error queue looked at."""
    loop, core, io, peers = make(4)
    try:
        io.connect(SessionConfig(plane_mask=15),
                   {p: s.local_addr for p, s in enumerate(peers)}, b"")
        core.calls.clear()
        peers[2].send(b"one", io.planes[2].local_addr)
        assert select.select([io.planes[2].fileno()], [], [], 1.0)[0]  # without running the loop
        drains = {p: s.drains for p, s in io.planes.items()}
        looks = {p: s.error_checks for p, s in io.planes.items()}
        io._on_readable(2)
        assert core.calls == [(2, 1)]
        assert {p: s.drains - drains[p] for p, s in io.planes.items()} == {0: 0, 1: 0, 2: 1, 3: 0}
        assert all(s.error_checks == looks[p] for p, s in io.planes.items())
    finally:
        io.close()
        loop.close()
        for p in peers:
            p.close()


def _readable(sock: PlaneSocket) -> bool:
    return bool(select.select([sock.fileno()], [], [], 0)[0])


@pytest.mark.parametrize("loop_name", ["uvloop", "asyncio"])
def test_an_icmp_error_on_a_plane_socket_does_not_make_it_deaf(loop_name: str) -> None:
    """An ICMP error (here: port unreachable for an answer to a peer that went away) queues on
    the plane socket and raises EPOLLERR. libuv's poll handle stops watching a socket for good
    on EPOLLERR (uvloop closes its reader), so io must watch it again: the next datagram from
    anyone must still be read."""
    loop = new_event_loop() if loop_name == "uvloop" else asyncio.new_event_loop()
    if loop_name == "uvloop" and "uvloop" not in type(loop).__module__:
        loop.close()
        pytest.skip("uvloop is not installed")
    core = FakeCore()
    plane = PlaneSocket(0, "127.0.0.2", 0)
    io: IoEndpoint[FakeSession] = IoEndpoint(loop, core, {0: plane})
    io.start()
    gone = PlaneSocket(0, "127.0.0.10", 0)
    late = PlaneSocket(0, "127.0.0.11", 0)
    try:
        session = io.connect(SessionConfig(plane_mask=1), {0: gone.local_addr}, b"")
        run(loop, lambda: bool(gone.drain(8)))
        gone_addr = gone.local_addr
        gone.close()  # the echo of the next datagram goes to a closed port: ICMP unreachable
        io.planes[0].send(b"x", gone_addr)  # and so does this, right away
        loop.run_until_complete(asyncio.sleep(0.05))  # the ICMP error arrives and is seen
        for i in range(3):
            late.send(bytes([i]), plane.local_addr)
        run(loop, lambda: sum(len(d) for _, d in session.received) >= 3, timeout=2.0)
        assert [d for _, ds in session.received for d in ds][-3:] == [b"\x00", b"\x01", b"\x02"]
    finally:
        io.close()
        late.close()
        loop.close()


def test_an_icmp_error_read_in_another_planes_wake_up_does_not_make_its_plane_deaf() -> None:
    """One wake-up drains every plane. When plane 0's callback runs first in a loop iteration
    whose poll also reported plane 1's EPOLLERR, plane 0's drain reads plane 1's ICMP error;
    plane 1's own callback then finds nothing new, yet libuv has stopped watching plane 1.
    io must watch again every plane whose error any drain read (a compiled build, being
    faster, met this under a replay flood: the server went deaf mid-transfer)."""
    loop = new_event_loop()
    if "uvloop" not in type(loop).__module__:
        loop.close()
        pytest.skip("uvloop is not installed")
    core = FakeCore()
    planes = {p: PlaneSocket(p, f"127.0.0.{2 + p}", 0) for p in range(2)}
    io: IoEndpoint[FakeSession] = IoEndpoint(loop, core, planes)
    io.start()
    peer = PlaneSocket(0, "127.0.0.10", 0)
    gone = PlaneSocket(1, "127.0.0.11", 0)
    late = PlaneSocket(1, "127.0.0.12", 0)
    try:
        session = io.connect(SessionConfig(plane_mask=3), {0: peer.local_addr}, b"")
        session.outbox.clear()
        gone_addr = gone.local_addr
        gone.close()
        # Before the loop polls: plane 0 becomes readable, then plane 1 gets its ICMP error.
        peer.send(b"a", planes[0].local_addr)
        planes[1].send(b"x", gone_addr)
        time.sleep(0.02)
        assert _readable(planes[0]) and _readable(planes[1])
        loop.run_until_complete(asyncio.sleep(0.05))  # the poll reports both in one iteration
        assert planes[1].error_events == 1
        late.send(b"b", planes[1].local_addr)
        run(loop, lambda: any(p == 1 for p, _ in session.received), timeout=1.0)
        assert session.received == [(0, [b"a"]), (1, [b"b"])]
    finally:
        io.close()
        for s in (peer, late):
            s.close()
        loop.close()

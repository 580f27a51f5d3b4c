"""`IoEndpoint`: runs a sans-I/O core endpoint on real plane sockets and an asyncio loop.

Holds the glue of docs/DESIGN.md §3 on real sockets: a reader per plane socket that drains a
batch and hands it to the core in one call, the "flush" that pulls a session's outputs after
every input (transmits, then its ONE timer handle, then its events; the loop itself is
`mrc.core.flush`), send-error reporting as plane status, ICMP unreachable errors passed up
(`on_unreachable`), the lab blackhole fault (`inject_plane_down`), the choice of an SRv6 path
socket by a transmit's EV when a `PathSockets` is given (`mrc.io.srv6`) and clean shutdown. It
decides nothing about the protocol (that is `mrc.core`) nor about what an application does with
events (the bench, the daemon); it only moves bytes, deadlines and events between them.

Time: the core is given `now()` (time.monotonic, high resolution) rather than `loop.time()`,
because uvloop's loop clock ticks in milliseconds, which is too coarse for RTT samples on
loopback. Deadlines are turned into `loop.call_later` delays, so either loop works.
"""

from __future__ import annotations

import asyncio
import logging
import select
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from mrc.core.config import SessionConfig
from mrc.core.events import Event
from mrc.core.flush import Flusher, FlushSession, SendResult
from mrc.core.sink import TraceLog, TraceSink
from mrc.core.transmit import Transmit

from .planes import LOCAL_DROP_ERRNOS, PLANE_DOWN_ERRNOS, PlaneSocket, SockAddr
from .srv6 import PathSockets

__all__ = ["CoreEndpoint", "CoreSession", "Fault", "IoEndpoint"]

log = logging.getLogger("mrc.io")

#: The first CM opcode (docs/WIRE.md §2): CM packets never leave from a pool socket.
_CM_FIRST = 0xE0
#: Drain passes over the planes per wake-up. The second reads what arrived while the first
#: was processed: a SACK sent together with one just read, but on a plane drained before it
#: came, would otherwise wait for the next wake-up, and RACK would meanwhile take the packets
#: it acknowledges for lost (their EV sent later packets that the other SACK acknowledged).
_DRAIN_PASSES = 2


class CoreSession(FlushSession, Protocol):
    """What io/ needs from a core `Session`: the flush loop's needs, and its timer."""

    def handle_timer(self, now: float) -> None: ...


S = TypeVar("S", bound=CoreSession)


class CoreEndpoint(Protocol[S]):
    """What io/ needs from a core `Endpoint`."""

    def receive_reads(
        self, plane: int, reads: Sequence[tuple[memoryview, Hashable, int, int, int]], now: float
    ) -> list[S]: ...

    def datagrams_to_send(self) -> list[Transmit]: ...

    def listen(
        self,
        config: SessionConfig,
        accept: Callable[[bytes], bytes | None],
        *,
        trace: TraceLog | None = None,
    ) -> None: ...

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
    ) -> S: ...

    def discard(self, session: S) -> None: ...


@dataclass(frozen=True, slots=True)
class Fault:
    """A lab fault this io applies: from `at` (the `now()` clock) on, sends on `plane` vanish."""

    plane: int
    at: float
    kind: str = "plane-down"


class IoEndpoint(Generic[S]):
    """A core endpoint bound to plane sockets and driven by an event loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        core: CoreEndpoint[S],
        planes: Mapping[int, PlaneSocket],
        on_event: Callable[[S, Event], None] | None = None,
        *,
        on_events: Callable[[S, list[Event]], None] | None = None,
        batch: int = 64,
        pull: int = 64,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[str], None] | None = None,
        paths: PathSockets | None = None,
        on_unreachable: Callable[[int, SockAddr, float], Iterable[S]] | None = None,
    ) -> None:
        self.loop = loop
        self.core = core
        self.planes: dict[int, PlaneSocket] = dict(planes)
        self.on_event = on_event
        #: Takes a flush's events in one call (then `on_event` is not called): a handler that
        #: loops itself saves a call chain per event when acknowledgements complete many
        #: small WRITEs at once.
        self.on_events = on_events
        self.batch = batch
        self.now = clock
        self.on_error = on_error
        #: Told (plane, destination, now) of each hard ICMP error (port, host or network
        #: unreachable) a plane socket read about a datagram of ours; returns the sessions it
        #: gave the news to, which io flushes (docs/DESIGN.md §4). None: counted only.
        self.on_unreachable = on_unreachable
        #: SRv6 path sockets (closed with this endpoint); None = every plane is direct. Paths
        #: that fail to open on first use are reported from its `errors` (`_path_errors`).
        self.paths = paths
        #: io-level drops and incidents: injected blackhole drops, sends to planes we lack, …
        self.counters: Counter[str] = Counter()
        self.faults: list[Fault] = []
        #: Exceptions the core raised into io (bugs, never expected): how many, and the first.
        self.internal_errors = 0
        self.first_internal_error: str | None = None
        self._blackhole: dict[int, float] = {}
        self._timers: dict[int, tuple[float, asyncio.TimerHandle]] = {}
        self._flusher: Flusher[S] = Flusher(self, clock, pull)
        self._readers: list[int] = []
        #: Every plane socket, polled without waiting at each drain pass (`_ready`); None
        #: until `start`.
        self._poll: select.poll | None = None
        self._plane_of: dict[int, int] = {}
        #: The plane whose socket the next wake-up drains first (they take turns).
        self._drain_start = 0
        #: Each plane's `error_events` when io last looked (see `_on_readable`).
        self._errors_seen: dict[int, int] = {}
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Register a reader for every plane socket."""
        poll = select.poll()
        for plane, sock in self.planes.items():
            fd = sock.fileno()
            self.loop.add_reader(fd, self._on_readable, plane)
            self._readers.append(fd)
            poll.register(fd, select.POLLIN)
            self._plane_of[fd] = plane
        self._poll = poll

    def close(self) -> None:
        """Remove readers, cancel every timer, close the sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for fd in self._readers:
            self.loop.remove_reader(fd)
        self._readers.clear()
        self._poll = None
        self._plane_of.clear()
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self.paths is not None:
            self.paths.close()
        for sock in self.planes.values():
            sock.close()

    @property
    def pull(self) -> int:
        """New data packets pulled from a session per round of a flush."""
        return self._flusher.pull

    @pull.setter
    def pull(self, value: int) -> None:
        self._flusher.pull = value

    @property
    def closed(self) -> bool:
        return self._closed

    # -- user calls -------------------------------------------------------------------------

    def listen(
        self,
        config: SessionConfig,
        accept: Callable[[bytes], bytes | None],
        *,
        trace: TraceLog | None = None,
    ) -> None:
        """Accept connections; `trace` starts each accepted session's trace (mrc.core.sink)."""
        self.core.listen(config, accept, trace=trace)

    def connect(
        self,
        config: SessionConfig,
        peer_addrs: Mapping[int, SockAddr],
        private_data: bytes,
        *,
        connect_sockets: bool = False,
        peer_key: bytes | None = None,
        trace: TraceSink | None = None,
    ) -> S:
        """Start a connection; with `connect_sockets`, fix each plane socket to its peer;
        `peer_key` is the responder static key a secured connection seals its REQUEST to and
        accepts (None: the identity's allowlist decides, mrc.core.endpoint); `trace` receives
        the session's trace records (mrc.core.sink).

        Connecting is faster (no address lookup per send) and lets ICMP errors from the peer show
        up as ECONNREFUSED, but only suits an endpoint that talks to that one peer. A plane that
        sends on SRv6 path sockets stays unconnected (its peer may be reachable only via SIDs).
        """
        if connect_sockets:
            for plane, addr in peer_addrs.items():
                sock = self.planes.get(plane)
                if sock is None:
                    continue
                if self.paths is not None and self.paths.source_routed(sock, addr):
                    self._path_errors(self.paths)
                    continue
                if sock.pool:
                    continue  # the peer's pool sends from many ports: do not filter them
                sock.connect(addr)
        addrs: dict[int, Hashable] = {p: a for p, a in peer_addrs.items()}
        # The wall clock for a secured REQUEST's timestamp (docs/WIRE.md §7).
        session = self.core.connect(
            config, addrs, private_data, self.now(), peer_key=peer_key, trace=trace,
            wall=time.time(),
        )  # fmt: skip
        self.flush(session)
        return session

    def inject_plane_down(self, plane: int, at: float) -> Fault:
        """From `at` (the `now()` clock) on, silently drop (and count) all our sends on `plane`.

        A blackhole, not a send error: the core is told nothing and must notice by itself.
        """
        fault = Fault(plane, at)
        self.faults.append(fault)
        prev = self._blackhole.get(plane)
        self._blackhole[plane] = at if prev is None else min(prev, at)
        return fault

    def flush(self, session: S) -> None:
        """Pull the session's outputs: send its transmits, re-arm its timer, deliver its events
        (the one loop of `mrc.core.flush`, shared with the simulator).

        Safe to call from inside `on_event` (the request is folded into the running flush).
        """
        if self._closed:
            return
        self._flusher.flush(session)
        if session.is_closed and id(session) not in self._timers:
            self._forget(session, id(session))

    # -- the flush loop's sink ----------------------------------------------------------------

    def send(self, tx: Transmit, now: float) -> SendResult:
        if self._closed:
            return SendResult.SENT
        err = self._send(tx, now)
        if err is None:
            return SendResult.SENT
        if err in PLANE_DOWN_ERRNOS:
            return SendResult.PLANE_DOWN
        if err in LOCAL_DROP_ERRNOS:
            # A full qdisc or socket buffer: the core resends these packets elsewhere.
            return SendResult.REFUSED
        return SendResult.SENT

    def arm(self, session: S, deadline: float | None, now: float) -> None:
        self._arm(session, id(session), deadline, now)

    def deliver(self, session: S, events: list[Event], now: float) -> None:
        if self.on_events is not None:
            self.on_events(session, events)
        elif self.on_event is not None:
            for event in events:
                self.on_event(session, event)

    # -- internals --------------------------------------------------------------------------

    def _send(self, tx: Transmit, now: float) -> int | None:
        sock = self.planes.get(tx.plane)
        if sock is None:
            self.counters["no_socket"] += 1
            return None
        at = self._blackhole.get(tx.plane)
        if at is not None and now >= at:
            seg = tx.segment_size
            self.counters["injected_plane_down"] += -(-len(tx.data) // seg) if seg else 1
            return None
        addr = cast(SockAddr, tx.addr)
        paths = self.paths
        if paths is not None:
            via = paths.via(sock, addr, tx.ev)
            if paths.errors:
                self._path_errors(paths)
            return sock.send(tx.data, addr, tx.segment_size, via)
        if sock.flowlabel:
            # The EV's low 20 bits in the flow label: what ECMP switches hash on.
            return sock.send(tx.data, addr, tx.segment_size, label=tx.ev)
        pool = sock.pool
        if pool and tx.data[0] < _CM_FIRST:
            # The EV picks the source port (CM packets keep the plane socket's: the peer
            # answers where they came from).
            return sock.send(tx.data, addr, tx.segment_size, pool[tx.ev % len(pool)])
        return sock.send(tx.data, addr, tx.segment_size)

    def _arm(self, session: S, key: int, deadline: float | None, now: float) -> None:
        """Arm the loop's one timer of `session` for `deadline`, only when it moved earlier
        (or nothing is armed; None cancels). A handle that fires before the deadline is
        kept: its wake-up finds nothing due and re-arms (`_on_timer`). Each message moves
        the RTO and completion deadlines later, and a cancelled and re-made loop timer per
        wake-up cost more than one early wake-up per RTO (docs/DESIGN.md §11)."""
        current = self._timers.get(key)
        if current is not None:
            if deadline is not None and current[0] <= deadline:
                return
            current[1].cancel()
            del self._timers[key]
        if deadline is None:
            return
        handle = self.loop.call_later(max(0.0, deadline - now), self._on_timer, session)
        self._timers[key] = (deadline, handle)

    def _on_timer(self, session: S) -> None:
        key = id(session)
        self._timers.pop(key, None)
        if self._closed:
            return
        # Read everything that already arrived first: on a busy host a due timer can run
        # before the reader callbacks (uvloop runs timers before polling), and an ACK
        # waiting in a socket must never lose to an RTO. One batch per plane is not enough:
        # after a 10 ms stall hundreds of SACKs wait, and the RTO would fire on the oldest
        # packets whose acknowledgements sit unread (every such resend arrived twice).
        for _ in range(64):
            if not self._receive_all():
                break
        if self._closed or session.is_closed:
            return
        try:
            deadline = session.get_timer()
            now = self.now()
            if deadline is not None and deadline <= now:
                session.handle_timer(now)
            self.flush(session)
        except Exception as exc:
            self._internal_error("timer", exc)

    def _on_readable(self, plane: int) -> None:
        self._receive_all(plane)
        if self._closed:
            return
        # An error was read: an ICMP error queued under IP_RECVERR, or pinned on a connected
        # socket, raises EPOLLERR, and libuv's poll handle stops watching a socket for good
        # on EPOLLERR (uvloop closes our reader after its callback). Watch it again, or the
        # plane goes deaf after one ICMP error. Every plane whose error any drain read since
        # the last look, not only this one: a wake-up drains all planes, so another plane's
        # callback (or a timer's drain) may read this plane's error in the very iteration
        # whose poll reported it, and this plane's own callback then finds nothing new.
        seen = self._errors_seen
        for p, sock in self.planes.items():
            if sock.error_events != seen.get(p, 0):
                seen[p] = sock.error_events
                self.loop.call_soon(self._watch_again, p)

    def _watch_again(self, plane: int) -> None:
        if self._closed:
            return
        sock = self.planes[plane]
        sock.take_errors()
        self.counters["reader_rearmed"] += 1
        self.loop.remove_reader(sock.fileno())
        self.loop.add_reader(sock.fileno(), self._on_readable, plane)
        if sock.unreachable:
            touched: dict[int, S] = {}
            self._report_unreachable(plane, self.now(), touched)
            try:
                for session in touched.values():
                    self.flush(session)
            except Exception as exc:
                self._internal_error("flush after an ICMP error", exc)

    def _report_unreachable(self, plane: int, now: float, touched: dict[int, S]) -> None:
        """Hand the core what plane `plane`'s socket read of ICMP errors saying a destination
        cannot be reached (`on_unreachable`); the sessions told join `touched`."""
        addrs = self.planes[plane].take_unreachable()
        self.counters["icmp_unreachable"] += len(addrs)
        report = self.on_unreachable
        if report is None:
            return
        try:
            for addr in addrs:
                for session in report(plane, addr, now):
                    touched.setdefault(id(session), session)
        except Exception as exc:
            self._internal_error(f"unreachable on plane {plane}", exc)

    def _receive_all(self, woken: int | None = None) -> bool:
        """Drain every plane socket (a second pass for what came meanwhile), hand each batch
        to the core, then flush each touched session once: SACKs from all planes are seen
        before the sender acts on any of them, and the flush cost is paid once per wake-up.
        True when a plane filled its batch, so more may be waiting.

        Only planes with something to read are read, and only those the poll showed an ICMP
        error queued (POLLERR) have their error queue looked at (`_ready`). Before `start`
        there is no poll: every plane is read, and the error queue of the plane whose
        readiness woke us (`woken`).

        Each wake-up starts one plane later: what arrives while the batches are processed
        waits for the next wake-up only on planes already drained, so a fixed order would
        add that wait to the first plane's every RTT, and the plane queue guard would take
        it for a queue of that plane's own (planeq.py)."""
        if self._closed:
            return False
        full = False
        order = list(self.planes)
        if order:
            start = self._drain_start % len(order)
            self._drain_start = start + 1
            order = order[start:] + order[:start]
        touched: dict[int, S] = {}
        for pass_ in range(_DRAIN_PASSES):
            now = self.now()
            got = False
            ready, errs = self._ready(order)
            for plane in ready:
                sock = self.planes[plane]
                # A plane whose last drain took one datagram is read once in the first pass:
                # the next pass's poll says whether more came (PlaneSocket.drain_reads).
                once = pass_ == 0 and sock.drained <= 1 and self._poll is not None
                batch = sock.drain_reads(self.batch, errors=False, once=once)
                if not batch:
                    continue
                got = True
                if sock.drained >= self.batch:
                    full = True
                try:
                    for session in self.core.receive_reads(plane, batch, now):
                        touched.setdefault(id(session), session)
                except Exception as exc:
                    self._internal_error(f"receive on plane {plane}", exc)
            for plane in errs:
                self.planes[plane].check_errors()
            if woken is not None and self._poll is None:
                self.planes[woken].check_errors()
                errs = [*errs, woken]
            woken = None
            for plane in ready if not errs else [*ready, *errs]:
                if self.planes[plane].unreachable:  # an ICMP error a read or a send found
                    self._report_unreachable(plane, now, touched)
            if not got:
                break
        try:
            for session in touched.values():
                self.flush(session)
            self._send_endpoint_transmits(now)
        except Exception as exc:
            self._internal_error("flush after receive", exc)
        return full

    def _ready(self, order: list[int]) -> tuple[list[int], list[int]]:
        """The planes of `order` whose socket holds a datagram or an error, and those among
        them with an ICMP error queued (POLLERR), found with one poll that does not wait: an
        empty socket's read, or a look into an empty error queue, costs a syscall and a
        raised exception, and a wake-up that read one datagram paid that on every other plane
        twice (a small message's round trip, about a tenth of its CPU)."""
        poll = self._poll
        if poll is None:
            return order, []
        ready = poll.poll(0)
        if not ready:
            return [], []
        plane_of = self._plane_of
        errs = [plane_of[fd] for fd, ev in ready if ev & select.POLLERR and fd in plane_of]
        if len(ready) == 1:
            plane = plane_of.get(ready[0][0])
            return ([] if plane is None else [plane]), errs
        found = {plane_of.get(fd) for fd, _ in ready}
        return [p for p in order if p in found], errs

    def _send_endpoint_transmits(self, now: float) -> None:
        for tx in self.core.datagrams_to_send():
            self._send(tx, now)

    def _forget(self, session: S, key: int) -> None:
        handle = self._timers.pop(key, None)
        if handle is not None:
            handle[1].cancel()
        self._flusher.forget(session)
        sessions: Any = getattr(self.core, "sessions", None)
        if sessions is None or session in sessions.values():
            self.core.discard(session)

    def _path_errors(self, paths: PathSockets) -> None:
        for message in paths.take_errors():
            self.counters["path_open_error"] += 1
            if self.on_error is not None:
                self.on_error(message)
            else:
                log.error("%s", message)

    def _internal_error(self, where: str, exc: Exception) -> None:
        """A bug surfaced in the core: counted, kept (the first one), and reported. io goes on
        serving the other sessions, but every program on top must treat this as a failure."""
        name = type(exc).__name__
        self.counters["internal_error_" + name] += 1
        self.internal_errors += 1
        message = f"internal error in {where}: {name}: {exc}"
        if self.first_internal_error is None:
            self.first_internal_error = message
        if self.on_error is not None:
            self.on_error(message)
        else:
            log.error("%s", message)

    def send_totals(self) -> dict[int, tuple[int, int]]:
        """(packets, bytes) sent per plane socket, as the kernel accepted them."""
        return {p: (s.packets_sent, s.bytes_sent) for p, s in self.planes.items()}

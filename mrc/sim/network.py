"""A deterministic discrete-event network that drives core `Endpoint`s and `Session`s.

Virtual time only: every input reaches the core with the simulated `now`, and the same
pull-outputs loop as io/ runs after it (datagrams, timer, events). Hosts have one link per
plane; a link direction has a rate, a latency, a finite queue (tail drop), an optional ECN
threshold, seeded loss, reordering and duplication, queue-delay statistics, and up/down
schedules. A packet in flight is a small tuple, `InFlight` (payload, source host name,
destination address, EV, IP TOS byte): what a switch may look at instead of parsing mrc bytes.
Nothing here reads a clock, opens a socket or consumes randomness from anywhere but the
network's own seeded `random.Random`.

At fabric scale, `Network(trains=True)` moves every GSO batch as one event per hop (packet
trains, link.py) and `read_every` lets a host read its arrivals in batches, as a NIC's interrupt
moderation would; `events` counts what the loop processed.

What it holds: `Host` (a link end, link.LinkEnd: it gathers each instant's arrivals into receive
batches) and `Network` (the event loop a link runs in, link.EventLoop), and `flap_schedule`.
What it leaves to others: links, their queues and the packet tuples (link.py; queue decisions
are the shared model's, mrc.switchq), protocol behaviour (mrc.core), switches, trimming and Clos
fabrics (fabric.py: its switch ports are `Link`s with a priority queue), fabric shapes
(topology.py), and application logic: the event handler a host is built with (`on_event`) or
a connection is made with (`Host.connect`), and the `on_receive` taps tests and experiments
attach.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any, ClassVar, Protocol

from ..core.config import SessionConfig
from ..core.endpoint import AcceptFn, Endpoint
from ..core.events import Event
from ..core.flush import Flusher, SendResult
from ..core.memory import RegionTable
from ..core.session import Session
from ..core.sink import TraceLog, TraceSink
from ..core.transmit import Addr, Transmit
from .link import TOS_ECT0, Delivery, EventLoop, InFlight, Link, LinkParams

EventHook = Callable[["Host", Session, Event], None]
ReceiveHook = Callable[["Host", int, list[Delivery]], None]


class Forwarder(Protocol):
    """A switch as the network keeps it (fabric.Switch, registered by topology.build): its
    name and its egress ports, which `Network.links` walks."""

    @property
    def name(self) -> str: ...

    @property
    def ports(self) -> Mapping[str, Link]: ...


class Host:
    """One simulated machine: a core Endpoint and one link per plane.

    `on_event` is the application's handler of every event of the host's sessions, given when
    the host is built (`Network.add_host`, `Network.pair`, `topology.build` pass it on); a
    connection's own handler is given to `connect`."""

    #: A link end (link.LinkEnd) that reads its arrivals in receive batches.
    is_host: ClassVar[bool] = True

    def __init__(self, net: Network, name: str, on_event: EventHook | None = None) -> None:
        self.net = net
        self.name = name
        self.regions = RegionTable(net.rng)
        self.endpoint = Endpoint(rng=net.rng, regions=self.regions)
        self.links: dict[int, Link] = {}
        #: Every event any of this host's sessions raised: (time, session, event).
        self.events: list[tuple[float, Session, Event]] = []
        #: Takes every event of every session of this host, after it is recorded in `events`.
        self.on_event = on_event
        #: The handlers sessions were connected with (`connect`): each takes its session's.
        self._session_hooks: dict[Session, EventHook] = {}
        #: Sees every receive batch before the endpoint does: (host, plane, datagrams).
        self.on_receive: ReceiveHook | None = None
        #: Its sockets read flow labels (io's `flowlabel`): each arrival's EV label goes to the
        #: core in bits 8-27 of the traffic word, as io passes it (docs/WIRE.md §3).
        self.flowlabel = False
        #: While set, arrivals wait here until the host resumes (a stalled receiver).
        self.paused_until: float | None = None
        self._backlog: list[tuple[int, Delivery]] = []
        #: Planes whose arrivals are held until a time (a socket read late), and what waits.
        self._lagging: dict[int, float] = {}
        self._held: dict[int, list[Delivery]] = {}
        self._timer_at: dict[int, float] = {}
        #: Receive coalescing (`Network.read_every`): arrivals not yet read, the last read.
        self._unread: dict[int, list[Delivery]] = {}
        #: This instant's arrivals by plane, read once every event of the instant is in.
        self._arrived: dict[int, list[Delivery]] = {}
        self._last_read = float("-inf")
        self._flusher: Flusher[Session] = Flusher(self, lambda: net.now)

    # -- application calls -----------------------------------------------------------------

    def listen(
        self, config: SessionConfig, accept: AcceptFn | None = None, *,
        trace: TraceLog | None = None,
    ) -> None:  # fmt: skip
        self.endpoint.listen(config, accept, trace=trace)

    def connect(
        self, peer: Host, config: SessionConfig, private_data: bytes = b"", *,
        trace: TraceSink | None = None, on_event: EventHook | None = None,
    ) -> Session:  # fmt: skip
        """A connection to `peer`; `on_event` takes its events from the first (after the
        host's own handler, when it has one)."""
        addrs = {p: peer.name for p in config.planes}
        session = self.endpoint.connect(config, addrs, private_data, self.net.now, trace=trace)
        if on_event is not None:
            self._session_hooks[session] = on_event
        self.flush(session)
        return session

    def session(self) -> Session:
        """The only session of this host (convenience for two-host tests)."""
        (s,) = self.endpoint.sessions.values()
        return s

    def events_of(self, kind: type[Event]) -> list[Any]:
        return [e for _, _, e in self.events if isinstance(e, kind)]

    # -- driving -----------------------------------------------------------------------------

    def flush(self, session: Session) -> None:
        """Pull every output of `session` after an input: the one loop io/ runs too
        (`mrc.core.flush`, docs/DESIGN.md §3)."""
        self._flusher.flush(session)

    # -- the flush loop's sink ---------------------------------------------------------------

    def send(self, tx: Transmit, now: float) -> SendResult:
        return SendResult.SENT if self._send(tx) else SendResult.REFUSED

    def arm(self, session: Session, deadline: float | None, now: float) -> None:
        if deadline is not None and self._timer_at.get(session.qpn) != deadline:
            self._timer_at[session.qpn] = deadline
            self.net.push(deadline, "timer", (self, session))

    def deliver(self, session: Session, events: list[Event], now: float) -> None:
        hook = self.on_event
        own = self._session_hooks.get(session) if self._session_hooks else None
        for event in events:
            self.events.append((now, session, event))
            if hook is not None:
                hook(self, session, event)
            if own is not None:
                own(self, session, event)
            if hook is not None or own is not None:
                # The hook may have posted WRITEs without flushing: pull once more.
                self._flusher.flush(session)

    def _flush_endpoint(self) -> None:
        for t in self.endpoint.datagrams_to_send():
            self._send(t)

    def inject(
        self, plane: int, peer: Addr, data: bytes, *, ev: int = 0, tos: int = TOS_ECT0
    ) -> None:
        """Send one raw datagram on `plane` now, as if the core had (tests and experiments)."""
        link = self.links.get(plane)
        if link is None:
            self.net.counters["no_link"] += 1
            return
        if self.net.trains:
            link.carry(self.net, [(data, self.name, peer, ev, tos)], [self.net.now])
        else:
            link.send(self.net, (data, self.name, peer, ev, tos))

    def _send(self, t: Transmit) -> bool:
        """Hand `t` to the host's link on its plane. False: the link's queue refused it whole,
        as a full qdisc refuses a GSO batch (ENOBUFS), so none of it was sent."""
        link = self.links.get(t.plane)
        if link is None:
            self.net.counters["no_link"] += 1
            return True
        net, name, addr, ev = self.net, self.name, t.addr, t.ev
        size = t.segment_size
        if link.queued_bytes(net.now) + len(t.data) > link.params.queue_bytes:
            link.counters["refused_local"] += -(-len(t.data) // size) if size else 1
            return False
        if net.trains:
            data = t.data
            if size and size < len(data):
                pkts = [
                    (data[off : off + size], name, addr, ev, TOS_ECT0)
                    for off in range(0, len(data), size)
                ]
            else:
                pkts = [(data, name, addr, ev, TOS_ECT0)]
            link.carry(net, pkts, [net.now] * len(pkts))
        elif size:
            for off in range(0, len(t.data), size):
                link.send(net, (t.data[off : off + size], name, addr, ev, TOS_ECT0))
        else:
            link.send(net, (t.data, name, addr, ev, TOS_ECT0))
        return True

    # -- the far end of its links (link.LinkEnd) ---------------------------------------------

    def receive(self, net: EventLoop, link: Link, pkt: InFlight) -> None:
        """A packet reached this host: it joins this instant's receive batch on its plane."""
        tos = pkt[4] | (pkt[3] & 0xFFFFF) << 8 if self.flowlabel else pkt[4]
        self._batch(link.plane).append((pkt[0], pkt[1], tos))

    def receive_train(
        self, net: EventLoop, link: Link, pkts: list[InFlight], times: list[float]
    ) -> None:
        """A back-to-back run of a train is in (its last packet arrived): it joins this
        instant's receive batch on its plane, as GRO would hand it over."""
        batch = self._batch(link.plane)
        if self.flowlabel:
            batch.extend((p[0], p[1], p[4] | (p[3] & 0xFFFFF) << 8) for p in pkts)
        else:
            batch.extend((p[0], p[1], p[4]) for p in pkts)

    def _batch(self, plane: int) -> list[Delivery]:
        """This instant's batch on `plane`; the first arrival of an instant tells the network
        to have this host read once the instant's events are all in."""
        planes = self._arrived
        if not planes:
            self.net._ready.append(self)
        batch = planes.get(plane)
        if batch is None:
            batch = planes[plane] = []
        return batch

    def _read_instant(self) -> None:
        batches, self._arrived = self._arrived, {}
        self._arrivals(batches)

    def _arrivals(self, batches: dict[int, list[Delivery]]) -> None:
        """This instant's arrivals: read at once, or, with `Network.read_every`, at the next
        read at most that long after the previous one (a NIC's interrupt moderation)."""
        every = self.net.read_every
        now = self.net.now
        if not every or (not self._unread and now - self._last_read >= every):
            self._last_read = now
            self._deliver(batches)
            return
        if not self._unread:
            self.net.push(self._last_read + every, "read", self)
        for plane, batch in batches.items():
            self._unread.setdefault(plane, []).extend(batch)

    def _read(self) -> None:
        batches, self._unread = self._unread, {}
        self._last_read = self.net.now
        if batches:
            self._deliver(batches)

    def _deliver(self, batches: dict[int, list[Delivery]]) -> None:
        """One wake-up: every plane's batch goes in before any output is pulled, as io/
        drains all its sockets before acting (docs/DESIGN.md §3)."""
        now = self.net.now
        if self.paused_until is not None:
            for plane, batch in batches.items():
                self._backlog.extend((plane, d) for d in batch)
            return
        touched: dict[int, Session] = {}
        for plane, batch in batches.items():
            if plane in self._lagging:
                self._held.setdefault(plane, []).extend(batch)
                continue
            if self.on_receive is not None:
                self.on_receive(self, plane, batch)
            for session in self.endpoint.receive_datagrams(plane, batch, now):
                touched[session.qpn] = session
        self._flush_endpoint()
        for session in touched.values():
            self.flush(session)

    def _on_timer(self, session: Session) -> None:
        deadline = session.get_timer()
        if deadline is None or deadline > self.net.now:
            return
        self._timer_at.pop(session.qpn, None)
        session.handle_timer(self.net.now)
        self.flush(session)

    def plane_status(self, plane: int, up: bool) -> None:
        """Tell every session about a local link change (like a send error in io/)."""
        for session in list(self.endpoint.sessions.values()):
            session.plane_status(plane, up, self.net.now)
            self.flush(session)

    def lag(self, plane: int, seconds: float) -> None:
        """Arrivals on `plane` wait `seconds`, then come in at once and in order, while the
        other planes go on: a receiver that reads one plane's socket late."""
        until = self.net.now + seconds
        self._lagging[plane] = until
        self.net.at(until, lambda: self._release(plane))

    def _release(self, plane: int) -> None:
        self._lagging.pop(plane, None)
        held = self._held.pop(plane, [])
        if held:
            self._deliver({plane: held})

    def pause(self, seconds: float) -> None:
        """Stop processing anything (arrivals wait, timers wait) for `seconds`."""
        self.paused_until = self.net.now + seconds
        self.net.push(self.paused_until, "resume", self)

    def _resume(self) -> None:
        self.paused_until = None
        backlog, self._backlog = self._backlog, []
        by_plane: dict[int, list[Delivery]] = {}
        for plane, datagram in backlog:
            by_plane.setdefault(plane, []).append(datagram)
        self._deliver(by_plane)
        for session in list(self.endpoint.sessions.values()):
            self._on_timer(session)


def flap_schedule(start: float, period: float, count: int) -> Iterator[tuple[float, bool]]:
    """(time, up) pairs of a flap: down for half a period, then up, `count` times."""
    for i in range(count):
        t = start + i * period
        yield t, False
        yield t + period / 2, True


class Network:
    """The simulator: hosts, links, one event heap, one seeded RNG.

    `trains=True` moves every GSO batch as one event per hop (link.py): the mode for fabrics
    of hundreds of hosts and more. Links' `duplicate` and `reorder` are per-packet effects and
    are not applied to trains.
    """

    def __init__(self, seed: int = 0, *, trains: bool = False, read_every: float = 0.0) -> None:
        self.trains = trains
        #: Hosts read arrivals at most this often (seconds; 0: each instant's at once): a
        #: read batches what came since the last, and one SACK answers each 64-PSN block of
        #: a batch (docs/DESIGN.md §6).
        self.read_every = read_every
        self.rng = random.Random(seed)
        self.now = 0.0
        self.hosts: dict[str, Host] = {}
        #: Switches of fabrics built on this network (topology.build registers them).
        self.switches: dict[str, Forwarder] = {}
        self.counters: Counter[str] = Counter()
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()
        #: Hosts with arrivals in this instant, in the order their first one came.
        self._ready: list[Host] = []
        #: Events taken off the heap so far (speed measurements: events per second).
        self.events = 0

    # -- building ------------------------------------------------------------------------------

    def add_host(self, name: str, on_event: EventHook | None = None) -> Host:
        """A host named `name`, built with its event handler (`Host`)."""
        host = self.hosts[name] = Host(self, name, on_event)
        return host

    def link(self, a: Host, b: Host, plane: int, params: LinkParams | None = None) -> None:
        """A full-duplex cable between `a` and `b` on `plane` (same parameters both ways)."""
        p = params or LinkParams()
        if p.trim:
            raise ValueError("trimming needs a switch port (mrc.sim.fabric)")
        ab = a.links[plane] = Link(a, b, plane, replace(p))
        ba = b.links[plane] = Link(b, a, plane, replace(p))
        ab.reverse, ba.reverse = ba, ab

    def pair(
        self, planes: int = 4, params: LinkParams | None = None, *,
        handlers: Mapping[str, EventHook] | None = None,
    ) -> tuple[Host, Host]:  # fmt: skip
        """Two hosts "a" and "b" joined by `planes` direct planes; `handlers` holds the event
        handler each is built with, by name (a host not named has none)."""
        on = handlers or {}
        a, b = self.add_host("a", on.get("a")), self.add_host("b", on.get("b"))
        for plane in range(planes):
            self.link(a, b, plane, params)
        return a, b

    # -- schedules -------------------------------------------------------------------------

    def at(self, t: float, action: Callable[[], None]) -> None:
        """Run `action` at simulated time `t`."""
        self.push(t, "call", action)

    def set_link(self, host: Host, plane: int, up: bool, *, at: float, notify: bool = True) -> None:
        """Take both directions of `host`'s plane link down or up at time `at`.

        `notify` = both ends see it locally (a cable pull: carrier loss, ENETUNREACH), as io/
        reports it; without it the link is a silent blackhole found only by the protocol.
        In a fabric the far end is a switch, so only `host` hears of it.
        """
        self.set_cable(host.links[plane], up, at=at, notify=notify)

    def set_cable(self, link: Link, up: bool, *, at: float, notify: bool = True) -> None:
        """Take both directions of `link`'s cable down or up at time `at`; with `notify`,
        each end that is a host is told (`Host.plane_status`), as in `set_link`."""

        def change() -> None:
            ends = [link] if link.reverse is None else [link, link.reverse]
            for direction in ends:
                direction._set_up(self, up)
            if notify:
                for end in (link.src, link.dst):
                    if isinstance(end, Host):
                        end.plane_status(link.plane, up)

        self.at(at, change)

    def flap(
        self,
        host: Host,
        plane: int,
        *,
        start: float,
        period: float,
        count: int,
        notify: bool = True,
    ) -> None:
        """Down for half a period, up for half a period, `count` times."""
        for at, up in flap_schedule(start, period, count):
            self.set_link(host, plane, up, at=at, notify=notify)

    # -- the event loop ----------------------------------------------------------------------

    def push(self, t: float, kind: str, payload: Any) -> None:
        """Schedule an event of `kind` at `t`, never before `now` (link.EventLoop)."""
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), kind, payload))

    def step(self) -> bool:
        """Process everything due at the next event time; False when nothing is left."""
        heap = self._heap
        if not heap:
            return False
        t, _, kind, payload = heapq.heappop(heap)
        self.now = t
        self.events += 1
        if kind == "train" and (not heap or heap[0][0] != t):
            # The common case at scale: a train alone at its instant reaching a switch.
            link = payload[0]
            dst = link.dst
            if link.up and not isinstance(dst, Host):
                link.counters["delivered"] += len(payload[1])
                dst.receive_train(self, link, payload[1], payload[2])
                return True
        others = []
        while True:
            if kind == "arrive":
                link, pkt = payload
                if not link.up:
                    link.counters["dropped_down"] += 1
                else:
                    link.counters["delivered"] += 1
                    link.dst.receive(self, link, pkt)
            elif kind == "train":
                link, pkts, times = payload
                if not link.up:
                    link.counters["dropped_down"] += len(pkts)
                else:
                    link.counters["delivered"] += len(pkts)
                    link.dst.receive_train(self, link, pkts, times)
            elif kind == "port":
                payload._wake(self)
            else:
                others.append((kind, payload))
            if not heap or heap[0][0] != t:
                break
            _, _, kind, payload = heapq.heappop(heap)
            self.events += 1
        # Hosts read this instant's arrivals once they are all in (Host.receive).
        ready = self._ready
        if ready:
            self._ready = []
            for host in ready:
                host._read_instant()
        for kind, payload in others:
            if kind == "timer":
                host, session = payload
                if host.paused_until is None:
                    host._on_timer(session)
            elif kind == "call":
                payload()
            elif kind == "read":
                payload._read()
            elif kind == "resume":
                payload._resume()
        return True

    def drive(self, until: float, *, max_steps: int = 10_000_000) -> None:
        """Run until simulated time `until` (or the network goes quiet)."""
        for _ in range(max_steps):
            if not self._heap or self._heap[0][0] > until:
                self.now = max(self.now, until)
                return
            self.step()
        raise RuntimeError(f"drive({until}) did not finish within {max_steps} steps")

    def drive_until(
        self, done: Callable[[], bool], *, timeout: float, max_steps: int = 10_000_000
    ) -> bool:
        """Run until `done()` holds or `timeout` simulated seconds pass; returns done()."""
        deadline = self.now + timeout
        for _ in range(max_steps):
            if done():
                return True
            if not self._heap or self._heap[0][0] > deadline:
                return done()
            self.step()
        raise RuntimeError(f"drive_until did not finish within {max_steps} steps")

    def drive_bounded(self, max_steps: int = 100) -> int:
        """Take at most `max_steps` steps; returns how many were taken."""
        for i in range(max_steps):
            if not self.step():
                return i
        return max_steps

    def links(self) -> Iterator[Link]:
        """Every link direction: hosts' own links first, then switch ports."""
        for host in self.hosts.values():
            yield from host.links.values()
        for switch in self.switches.values():
            yield from switch.ports.values()

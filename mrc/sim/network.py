"""A deterministic discrete-event network that drives core `Endpoint`s and `Session`s.

Virtual time only: every input reaches the core with the simulated `now`, and the same
pull-outputs loop as io/ runs after it (datagrams, timer, events). Hosts have one link per
plane; a link direction has a rate, a latency, a finite queue (tail drop), seeded loss,
reordering and duplication, and up/down schedules. Nothing here reads a clock, opens a socket
or consumes randomness from anywhere but the network's own seeded `random.Random`.

What it leaves to others: protocol behaviour (mrc.core), switches and Clos fabrics (added in
their own module), and application logic (tests and experiments attach `on_event` callbacks).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.config import SessionConfig
from ..core.endpoint import AcceptFn, Endpoint
from ..core.events import Event
from ..core.memory import RegionTable
from ..core.session import Session
from ..core.transmit import Transmit

#: TOS byte of a packet nobody marked: ECT(0), as every mrc packet is sent (WIRE.md §1).
TOS_ECT0 = 0x02

EventHook = Callable[["Host", Session, Event], None]


@dataclass(slots=True)
class LinkParams:
    rate_bps: float = 10e9
    latency: float = 10e-6
    queue_bytes: int = 1 << 20
    loss: float = 0.0
    duplicate: float = 0.0
    #: Probability a packet is held back by up to `reorder_delay` extra seconds.
    reorder: float = 0.0
    reorder_delay: float = 100e-6
    #: Drops every packet for which it returns True (targeted losses in tests).
    drop_if: Callable[[bytes], bool] | None = None


@dataclass(slots=True)
class Link:
    """One direction of a plane's cable, from `src` to `dst`."""

    src: Host
    dst: Host
    plane: int
    params: LinkParams
    up: bool = True
    busy_until: float = 0.0
    counters: Counter[str] = field(default_factory=Counter)

    def queued_bytes(self, now: float) -> float:
        return max(0.0, self.busy_until - now) * self.params.rate_bps / 8


class Host:
    """One simulated machine: a core Endpoint and one link per plane."""

    def __init__(self, net: Network, name: str) -> None:
        self.net = net
        self.name = name
        self.regions = RegionTable(net.rng)
        self.endpoint = Endpoint(rng=net.rng, regions=self.regions)
        self.links: dict[int, Link] = {}
        #: Every event any of this host's sessions raised: (time, session, event).
        self.events: list[tuple[float, Session, Event]] = []
        self.on_event: EventHook | None = None
        #: While set, arrivals wait here until the host resumes (a stalled receiver).
        self.paused_until: float | None = None
        self._backlog: list[tuple[int, bytes, int]] = []
        self._timer_at: dict[int, float] = {}

    # -- application calls -----------------------------------------------------------------

    def listen(self, config: SessionConfig, accept: AcceptFn | None = None) -> None:
        self.endpoint.listen(config, accept)

    def connect(self, peer: Host, config: SessionConfig, private_data: bytes = b"") -> Session:
        addrs = {p: peer.name for p in config.planes}
        session = self.endpoint.connect(config, addrs, private_data, self.net.now)
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
        """Pull every output of `session` after an input, as io/ does (DESIGN.md §3)."""
        now = self.net.now
        for _ in range(1000):
            for t in session.datagrams_to_send(now):
                self._send(t)
            deadline = session.get_timer()
            if deadline is not None and self._timer_at.get(session.qpn) != deadline:
                self._timer_at[session.qpn] = deadline
                self.net._push(deadline, "timer", (self, session))
            event = session.next_event()
            if event is None:
                return
            while event is not None:
                self.events.append((now, session, event))
                if self.on_event is not None:
                    self.on_event(self, session, event)
                event = session.next_event()
        raise RuntimeError("session kept producing output without new input")

    def _flush_endpoint(self) -> None:
        for t in self.endpoint.datagrams_to_send():
            self._send(t)

    def _send(self, t: Transmit) -> None:
        link = self.links.get(t.plane)
        if link is None:
            self.net.counters["no_link"] += 1
            return
        if t.segment_size:
            size = t.segment_size
            for off in range(0, len(t.data), size):
                self.net._transmit(link, t.data[off : off + size])
        else:
            self.net._transmit(link, t.data)

    def _deliver(self, plane: int, batch: list[tuple[bytes, int]]) -> None:
        now = self.net.now
        if self.paused_until is not None:
            self._backlog.extend((plane, d, tos) for d, tos in batch)
            return
        peer = self.links[plane].dst.name
        touched = self.endpoint.receive_datagrams(plane, [(d, peer, tos) for d, tos in batch], now)
        self._flush_endpoint()
        for session in touched:
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

    def pause(self, seconds: float) -> None:
        """Stop processing anything (arrivals wait, timers wait) for `seconds`."""
        self.paused_until = self.net.now + seconds
        self.net._push(self.paused_until, "resume", self)

    def _resume(self) -> None:
        self.paused_until = None
        backlog, self._backlog = self._backlog, []
        by_plane: dict[int, list[tuple[bytes, int]]] = {}
        for plane, data, tos in backlog:
            by_plane.setdefault(plane, []).append((data, tos))
        for plane, batch in by_plane.items():
            self._deliver(plane, batch)
        for session in list(self.endpoint.sessions.values()):
            self._on_timer(session)


class Network:
    """The simulator: hosts, links, one event heap, one seeded RNG."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.now = 0.0
        self.hosts: dict[str, Host] = {}
        self.counters: Counter[str] = Counter()
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()

    # -- building ------------------------------------------------------------------------------

    def add_host(self, name: str) -> Host:
        host = self.hosts[name] = Host(self, name)
        return host

    def link(self, a: Host, b: Host, plane: int, params: LinkParams | None = None) -> None:
        """A full-duplex cable between `a` and `b` on `plane` (same parameters both ways)."""
        p = params or LinkParams()
        a.links[plane] = Link(a, b, plane, replace(p))
        b.links[plane] = Link(b, a, plane, replace(p))

    def pair(self, planes: int = 4, params: LinkParams | None = None) -> tuple[Host, Host]:
        """Two hosts "a" and "b" joined by `planes` direct planes."""
        a, b = self.add_host("a"), self.add_host("b")
        for plane in range(planes):
            self.link(a, b, plane, params)
        return a, b

    # -- schedules -------------------------------------------------------------------------

    def at(self, t: float, action: Callable[[], None]) -> None:
        """Run `action` at simulated time `t`."""
        self._push(t, "call", action)

    def set_link(self, host: Host, plane: int, up: bool, *, at: float, notify: bool = True) -> None:
        """Take both directions of `host`'s plane link down or up at time `at`.

        `notify` = both ends see it locally (a cable pull: carrier loss, ENETUNREACH), as io/
        reports it; without it the link is a silent blackhole found only by the protocol.
        """

        def change() -> None:
            link = host.links[plane]
            back = link.dst.links[plane]
            link.up = back.up = up
            if notify:
                host.plane_status(plane, up)
                link.dst.plane_status(plane, up)

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
        for i in range(count):
            t = start + i * period
            self.set_link(host, plane, False, at=t, notify=notify)
            self.set_link(host, plane, True, at=t + period / 2, notify=notify)

    # -- the event loop ----------------------------------------------------------------------

    def _push(self, t: float, kind: str, payload: Any) -> None:
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), kind, payload))

    def _transmit(self, link: Link, data: bytes) -> None:
        p = link.params
        c = link.counters
        c["sent"] += 1
        if not link.up:
            c["dropped_down"] += 1
            return
        if p.drop_if is not None and p.drop_if(data):
            c["dropped_filter"] += 1
            return
        if p.loss and self.rng.random() < p.loss:
            c["dropped_loss"] += 1
            return
        if link.queued_bytes(self.now) + len(data) > p.queue_bytes:
            c["dropped_queue"] += 1
            return
        start = max(self.now, link.busy_until)
        link.busy_until = start + len(data) * 8 / p.rate_bps
        arrival = link.busy_until + p.latency
        if p.reorder and self.rng.random() < p.reorder:
            arrival += self.rng.random() * p.reorder_delay
            c["reordered"] += 1
        self._push(arrival, "arrive", (link, data))
        if p.duplicate and self.rng.random() < p.duplicate:
            c["duplicated"] += 1
            self._push(arrival + self.rng.random() * p.reorder_delay, "arrive", (link, data))

    def step(self) -> bool:
        """Process everything due at the next event time; False when nothing is left."""
        if not self._heap:
            return False
        t = self._heap[0][0]
        self.now = t
        batches: dict[tuple[str, int], list[tuple[bytes, int]]] = {}
        hosts: dict[tuple[str, int], Host] = {}
        others = []
        while self._heap and self._heap[0][0] == t:
            _, _, kind, payload = heapq.heappop(self._heap)
            if kind == "arrive":
                link, data = payload
                if not link.up:
                    link.counters["dropped_down"] += 1
                    continue
                link.counters["delivered"] += 1
                key = (link.dst.name, link.plane)
                batches.setdefault(key, []).append((data, TOS_ECT0))
                hosts[key] = link.dst
            else:
                others.append((kind, payload))
        for key, batch in batches.items():
            hosts[key]._deliver(key[1], batch)
        for kind, payload in others:
            if kind == "timer":
                host, session = payload
                if host.paused_until is None:
                    host._on_timer(session)
            elif kind == "call":
                payload()
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
        for host in self.hosts.values():
            yield from host.links.values()

"""Switches and a two-tier multi-plane Clos fabric for the simulator (docs/DESIGN.md §4, §5).

What it holds: `Port`, a switch's egress direction (a `Link` with a finite data queue, ECN
marking at enqueue, trimming into a priority queue that goes ahead of queued data, tail drop and
per-port counters; the enqueue decisions are the shared queue model's, mrc.switchq, which
`mrc switch` follows too); `Switch`, a link end (link.LinkEnd) which forwards by the metadata a
packet carries (destination host and EV), never by parsing mrc bytes; and `Clos`, a built fabric
of `planes` independent planes of tier-0 (one per rack) and tier-1 switches over hosts
`h0..hN`, with its routes and its switch and link failures.

Routing is static and source-chosen, like the kernel SRv6 fabric: a tier-0 switch delivers
same-rack traffic straight down; anything else goes up to tier-1 number `route = selector mod
tier1`, where the EV is `plane 8 | selector 24` (docs/WIRE.md §3, docs/DESIGN.md §4); a
tier-1 switch sends it down to the destination rack's tier-0, which sends it down to the host.

What it leaves to others: the protocol (mrc.core), links and train queues (link.py), the
event loop, hosts' own links and direct cables (network.py), building fabrics (topology.py:
`build`, `clos`), and experiments (tests attach counters and hooks).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from ..core.transmit import Addr
from ..switchq import Verdict, decide
from .link import EventLoop, InFlight, Link
from .network import Host, Network, flap_schedule

SELECTOR_MASK = 0xFFFFFF

#: A queued packet and when it was enqueued.
_Queued = tuple[float, InFlight]


@dataclass(slots=True, eq=False)
class Port(Link):
    """A switch's egress toward one neighbour: data queue, priority queue, one wire.

    Occupancy (`queued_bytes`, ECN and overflow decisions) counts everything accepted and not
    yet sent, both queues and the rest of the packet on the wire. Trimmed headers (DSCP 11 or
    21) travel in the priority queue, which has its own `queue_bytes` of room and goes first.
    Counters: `sent` (offered), `forwarded` / `forwarded_bytes`, `ce_marked`, `trimmed`,
    `priority` (packets queued at priority), `dropped_queue`, `dropped_down` (cable or switch
    down), `delivered` (reached the far end); queueing delay in `stats` (network.QueueStats).
    """

    #: The egress toward the destination host: trimmed packets get DSCP 21, not 11.
    last_hop: bool = False
    #: False while the switch that owns this port is down.
    node_up: bool = True
    waiting: deque[_Queued] = field(default_factory=deque)
    urgent: deque[_Queued] = field(default_factory=deque)
    urgent_bytes: int = 0
    #: When the packet now on the wire has left.
    tx_end: float = 0.0
    #: An end-of-transmission event is scheduled.
    wake_pending: bool = False

    def send(self, net: EventLoop, pkt: InFlight) -> None:
        """Enqueue at `net.now`: ECN mark, or trim to the priority queue, or tail drop."""
        if not self.node_up:
            self.counters["sent"] += 1
            self.counters["dropped_down"] += 1
            return
        data = pkt[0]
        if not self._admit(net, data):
            return
        p = self.params
        now = net.now
        backlog = self.busy_until - now
        if backlog < 0.0:
            backlog = 0.0
        size = len(data)
        # The simulator forwards by metadata and never parses mrc bytes: any packet may be
        # trimmed (mrc.switchq).
        verdict, tos, new_size = decide(
            self.policy(), backlog * p.rate_bps / 8, self.urgent_bytes, size, pkt[4], True
        )
        if verdict is Verdict.DROPPED_QUEUE or verdict is Verdict.DROPPED_PRIORITY:
            self.counters[verdict.value] += 1
            return
        if verdict is Verdict.TRIMMED:
            size = new_size
            data = data[:size]
            self.counters["trimmed"] += 1
        elif verdict is Verdict.MARKED:
            self.counters["ce_marked"] += 1
        if tos != pkt[4] or data is not pkt[0]:
            pkt = (data, pkt[1], pkt[2], pkt[3], tos)
        urgent = verdict is Verdict.TRIMMED or verdict is Verdict.PRIORITY
        if urgent:
            self.counters["priority"] += 1
        self._account(now, size, backlog)
        self.busy_until = now + backlog + size * 8 / p.rate_bps
        if self.tx_end <= now and not self.waiting and not self.urgent:
            self._start(net, pkt, 0.0)
            return
        if urgent:
            self.urgent.append((now, pkt))
            self.urgent_bytes += size
        else:
            self.waiting.append((now, pkt))
        if not self.wake_pending:
            self.wake_pending = True
            net.push(self.tx_end, "port", self)

    def _start(self, net: EventLoop, pkt: InFlight, waited: float) -> None:
        p = self.params
        s = self.stats
        s.delay_sum += waited
        s.samples += 1
        if waited > s.delay_max:
            s.delay_max = waited
        self.tx_end = net.now + len(pkt[0]) * 8 / p.rate_bps
        self._launch(net, pkt, self.tx_end + p.latency)

    def _wake(self, net: EventLoop) -> None:
        """The packet on the wire has left: start the next, priority first."""
        now = net.now
        if self.tx_end > now:  # another packet started since this was scheduled
            net.push(self.tx_end, "port", self)
            return
        if self.urgent:
            enqueued, pkt = self.urgent.popleft()
            self.urgent_bytes -= len(pkt[0])
        elif self.waiting:
            enqueued, pkt = self.waiting.popleft()
        else:
            self.wake_pending = False
            return
        self._start(net, pkt, now - enqueued)
        if self.urgent or self.waiting:
            net.push(self.tx_end, "port", self)
        else:
            self.wake_pending = False

    def _flush(self, net: EventLoop) -> None:
        """Drop everything still queued (the packet on the wire is already gone)."""
        n = len(self.waiting) + len(self.urgent)
        if n:
            self.counters["dropped_down"] += n
            self.waiting.clear()
            self.urgent.clear()
            self.urgent_bytes = 0
        now = net.now
        self._integrate(now)
        self.busy_until = max(now, self.tx_end)
        if self.trainq is not None:
            self.counters["dropped_down"] += self.trainq.drop_all(now)
            self.busy_until = now

    def carry(self, net: EventLoop, pkts: list[InFlight], times: list[float]) -> None:
        """Train mode (link.py); a port of a switch that is down drops the train."""
        if not self.node_up:
            self.counters["sent"] += len(pkts)
            self.counters["dropped_down"] += len(pkts)
            return
        Link.carry(self, net, pkts, times)

    def _set_up(self, net: EventLoop, up: bool) -> None:
        self.up = up
        if not up:
            self._flush(net)


@dataclass(slots=True, eq=False)
class Switch:
    """A switch of one plane. `down` maps a destination host name to the egress toward it;
    anything else goes up, to `uplinks[selector // route_div mod len(uplinks)]`
    (docs/DESIGN.md §4)."""

    #: A link end (link.LinkEnd) that forwards each train as it comes.
    is_host: ClassVar[bool] = False

    name: str
    plane: int
    #: 0 (top of rack), 1 (spine, or a pod's aggregation switch), 2 (a fat tree's core).
    tier: int
    #: The rack of a tier-0 switch, the route number of a tier-1 switch.
    index: int
    up: bool = True
    #: The uplink is `uplinks[(selector // route_div) mod len(uplinks)]`: tiers above the first
    #: read the selector's higher digits, so a 3-tier fabric's paths are all distinct
    #: (topology.py).
    route_div: int = 1
    #: Egress ports by neighbour name.
    ports: dict[str, Port] = field(default_factory=dict)
    down: dict[Addr, Port] = field(default_factory=dict)
    uplinks: list[Port] = field(default_factory=list)
    #: Packets this switch could not route: `dropped_misrouted` (EV of another plane),
    #: `dropped_no_route` (unknown destination and no uplink).
    counters: Counter[str] = field(default_factory=Counter)

    def receive(self, net: EventLoop, link: Link, pkt: InFlight) -> None:
        """A packet arrived on `link`: pick the egress port by destination and EV."""
        ev = pkt[3]
        # EV 0 is what CM packets carry on every plane: the plane's default route.
        if ev and ev >> 24 != self.plane:
            self.counters["dropped_misrouted"] += 1
            return
        port = self.down.get(pkt[2])
        if port is None:
            uplinks = self.uplinks
            if not uplinks:
                self.counters["dropped_no_route"] += 1
                return
            port = uplinks[(ev & SELECTOR_MASK) // self.route_div % len(uplinks)]
        port.send(net, pkt)

    def receive_train(
        self, net: EventLoop, link: Link, pkts: list[InFlight], times: list[float]
    ) -> None:
        """A train arrived on `link` (link.py): one destination and EV, so one egress."""
        head = pkts[0]
        ev = head[3]
        if ev and ev >> 24 != self.plane:
            self.counters["dropped_misrouted"] += len(pkts)
            return
        port = self.down.get(head[2])
        if port is None:
            uplinks = self.uplinks
            if not uplinks:
                self.counters["dropped_no_route"] += len(pkts)
                return
            port = uplinks[(ev & SELECTOR_MASK) // self.route_div % len(uplinks)]
        q = port.trainq
        if q is not None and port.node_up:
            q.send(port, net, port.policy(), pkts, times)  # Port.carry's common case, inline
        else:
            port.carry(net, pkts, times)


@dataclass(slots=True, eq=False)
class Clos:
    """A built two-tier fabric: `planes` independent planes, each with one tier-0 switch per
    rack and `paths_per_plane` tier-1 switches; every host has one link per plane."""

    net: Network
    hosts: list[Host]
    #: tier0[plane][rack], tier1[plane][route].
    tier0: list[list[Switch]]
    tier1: list[list[Switch]]
    rack_of: dict[str, int]

    @property
    def planes(self) -> int:
        return len(self.tier0)

    @property
    def racks(self) -> int:
        return len(self.tier0[0])

    @property
    def paths_per_plane(self) -> int:
        """Routes between two racks of a plane (= tier-1 switches per plane)."""
        return len(self.tier1[0])

    @property
    def plane_paths(self) -> tuple[int, ...]:
        """Paths of each plane, by plane number (what `SessionConfig.plane_paths` wants)."""
        return (self.paths_per_plane,) * self.planes

    def rack(self, rack: int) -> list[Host]:
        return [h for h in self.hosts if self.rack_of[h.name] == rack]

    # -- EVs and routes ------------------------------------------------------------------------

    def route_of(self, ev: int) -> int:
        """The tier-1 switch number an EV's packets cross between racks (docs/DESIGN.md §4)."""
        return (ev & SELECTOR_MASK) % self.paths_per_plane

    def tier1_of(self, ev: int) -> Switch:
        """The tier-1 switch an EV's packets cross between racks (plane = ev >> 24)."""
        return self.tier1[ev >> 24 & 0xFF][self.route_of(ev)]

    # -- links -----------------------------------------------------------------------------

    def link(self, a: Host | Switch, b: Host | Switch) -> Link:
        """The direction a → b of the cable between two neighbours."""
        if isinstance(a, Host):
            if not isinstance(b, Switch):
                raise ValueError(f"{a.name} and {b.name} are not neighbours")
            link = a.links.get(b.plane)
            if link is None or link.dst is not b:
                raise ValueError(f"{a.name} and {b.name} are not neighbours")
            return link
        port = a.ports.get(b.name)
        if port is None:
            raise ValueError(f"{a.name} and {b.name} are not neighbours")
        return port

    def switches(self) -> Iterator[Switch]:
        for plane in range(self.planes):
            yield from self.tier0[plane]
            yield from self.tier1[plane]

    def ports(self) -> Iterator[Port]:
        for switch in self.switches():
            yield from switch.ports.values()

    # -- failures ----------------------------------------------------------------------------

    def set_link(
        self, a: Host | Switch, b: Host | Switch, up: bool, *, at: float, notify: bool = True
    ) -> None:
        """Both directions of the cable a–b down or up at `at`. Only a host end is ever told
        (and only with `notify`): a failure between switches is silent (docs/DESIGN.md §4)."""
        self.net.set_cable(self.link(a, b), up, at=at, notify=notify)

    def flap(
        self,
        a: Host | Switch,
        b: Host | Switch,
        *,
        start: float,
        period: float,
        count: int,
        notify: bool = True,
    ) -> None:
        """The cable a–b down for half a period, up for half a period, `count` times."""
        for at, up in flap_schedule(start, period, count):
            self.set_link(a, b, up, at=at, notify=notify)

    def set_switch(self, switch: Switch, up: bool, *, at: float, notify: bool = False) -> None:
        """A whole switch down or up at `at`: while down, every port drops what it is given
        and what it had queued (`dropped_down`). With `notify`, hosts cabled to it are told
        (their link lost carrier); without it the failure is silent."""

        def change() -> None:
            switch.up = up
            for port in switch.ports.values():
                port.node_up = up
                if not up:
                    port._flush(self.net)
            if notify:
                for port in switch.ports.values():
                    if isinstance(port.dst, Host):
                        port.dst.plane_status(switch.plane, up)

        self.net.at(at, change)

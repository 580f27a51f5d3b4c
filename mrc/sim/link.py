"""One direction of a cable in the simulator: `Link`, its queue (per packet or in trains), and
the two protocols it needs from above.

What it holds: `LinkParams` (rate, latency, queue size, loss, duplication, reordering, targeted
drops, ECN threshold, trimming), `QueueStats` (queueing delay and time-weighted backlog),
`Link` (a FIFO egress queue and the wire: per-packet `send`, and `carry` for packet trains),
`TrainQueue` (a link direction's FIFO schedule in train mode), the packet tuples `InFlight` and
`Delivery`, and the TOS/ECN constants. A link knows what it delivers to and what it runs in only
by the protocols it owns: `LinkEnd`, something with a `receive` method (a host, network.Host, or
a switch, fabric.Switch), and `EventLoop`, the simulated time, seeded random numbers and event
heap it schedules arrivals on (network.Network). Queue decisions (tail drop, ECN marking,
trimming) are the shared queue model's (mrc.switchq).

Packet trains (docs/DESIGN.md §5). At fabric scale (1,024 hosts × 8 planes) one heap event per
packet per hop is too many for CPython, so a network built with `Network(trains=True)` moves
each GSO batch (a flowcell: the packets of one `Transmit`, one EV, one destination) as a train:
one event per hop, carrying the packets and the time each one arrives. Each hop still decides
and times every packet on its own, in FIFO order: packet i arrives at `times[i]`, waits for
what is ahead of it, is marked, trimmed or dropped by the shared queue model
(`mrc.switchq.decide`) against the bytes waiting at `times[i]`, and leaves when its last bit is
sent. What the train costs in fidelity: a train reserves its place in a port's FIFO when its
head arrives, so a packet of another train that would have slipped in between two of its packets
queues behind it instead (same rates, same throughput; a few packet times of reordering between
trains). Trimmed headers go at priority the moment they arrive (a 64-byte header steals 5 ns at
100 Gbit/s, not modelled), and a host receives a whole train in one receive batch when its last
packet has arrived, as GRO would hand it over. Time-weighted queue statistics (`QueueStats.area`)
are only kept by the per-packet model.

With `control_first` (set by `topology.build` for a `FabricSpec(control_priority=True)`), a
packet that is not MRC data (a SACK, NACK or CM packet: `switchq.is_data` false) also goes to
the priority lane, unmarked and never trimmed, as htsim's switch queues serve their header-only
control packets first and its NIC sends control ahead of data.

What it leaves to others: hosts and the event loop (network.py), switch ports with a priority
queue and trimming (fabric.py), fabric shapes (topology.py).
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, ClassVar, Protocol

from ..core.transmit import Addr
from ..switchq import (
    DSCP_TRIMMED,
    DSCP_TRIMMED_LASTHOP,
    QueuePolicy,
    Verdict,
    decide,
    is_data,
)

#: TOS byte of a packet nobody marked: ECT(0), as every mrc packet is sent (docs/WIRE.md §1).
TOS_ECT0 = 0x02
#: The ECN field (low 2 bits of the TOS byte): Not-ECT 0, ECT(1) 1, ECT(0) 2, CE 3 (RFC 3168).
ECN_MASK = 0x03
ECN_CE = 0x03

#: A packet in flight: (UDP payload, source host name, destination address, EV, TOS byte).
InFlight = tuple[bytes, str, Addr, int, int]
#: What a host's endpoint receives: (UDP payload, source address, TOS byte).
Delivery = tuple[bytes, Addr, int]


class EventLoop(Protocol):
    """What a link needs of the event loop it runs in (network.Network): the simulated time,
    the network's seeded random numbers, and a place on its event heap."""

    now: float
    rng: random.Random

    def push(self, t: float, kind: str, payload: Any) -> None:
        """Schedule an event of `kind` at `t` (never before `now`)."""
        ...


class LinkEnd(Protocol):
    """What a link delivers to: a host (network.Host) or a switch (fabric.Switch). The event
    loop hands it each packet, or each train, that reaches the far end of a link that is up."""

    #: A host reads what arrives in receive batches, each back-to-back run of a train as one
    #: (GRO); a switch forwards each train as it comes (`TrainQueue.send`).
    is_host: ClassVar[bool]

    def receive(self, net: EventLoop, link: Link, pkt: InFlight) -> None: ...

    def receive_train(
        self, net: EventLoop, link: Link, pkts: list[InFlight], times: list[float]
    ) -> None: ...


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
    #: Mark CE on an ECN-capable packet enqueued while more than this many bytes wait
    #: (None: never mark). Not-ECT packets are never marked (docs/WIRE.md §1).
    ecn_threshold: int | None = None
    #: Trim instead of dropping when the queue is full (switch ports only, fabric.py).
    trim: bool = False
    #: Bytes of UDP payload a trimmed packet keeps (docs/WIRE.md §5).
    trim_size: int = 64


@dataclass(slots=True)
class QueueStats:
    """Queueing at one link direction since `since`, for congestion-control experiments.

    The backlog is measured in seconds of transmission work (bytes × 8 / rate): the delay a
    packet enqueued at that instant would wait before its first bit leaves.
    """

    since: float = 0.0
    #: ∫ backlog dt over [since, last] (seconds²).
    area: float = 0.0
    last: float = 0.0
    #: Per packet: time from enqueue to the start of its transmission.
    delay_sum: float = 0.0
    delay_max: float = 0.0
    samples: int = 0
    #: The most bytes ever queued (the new packet included).
    max_bytes: float = 0.0

    def mean_delay(self) -> float:
        """Mean queueing delay per transmitted packet."""
        return self.delay_sum / self.samples if self.samples else 0.0


def _backlog_area(busy_until: float, t0: float, t1: float) -> float:
    """∫ max(0, busy_until - t) dt over [t0, t1]: the backlog drains linearly between enqueues."""
    if busy_until <= t0:
        return 0.0
    end = t1 if t1 < busy_until else busy_until
    return (2 * busy_until - t0 - end) * 0.5 * (end - t0)


@dataclass(slots=True, eq=False)
class Link:
    """One direction of a cable, from `src` to `dst`: a FIFO egress queue and the wire.

    Hosts' links (and direct cables between hosts) are plain `Link`s; a switch's egress ports
    are `fabric.Port`s, which add a priority queue for trimmed packets.
    """

    src: LinkEnd
    dst: LinkEnd
    plane: int
    params: LinkParams
    up: bool = True
    #: When everything accepted so far will have left (the backlog, as total work).
    busy_until: float = 0.0
    counters: Counter[str] = field(default_factory=Counter)
    #: The other direction of the same cable.
    reverse: Link | None = None
    stats: QueueStats = field(default_factory=QueueStats)
    #: The FIFO schedule in train mode (`TrainQueue`), made on first use unless built with one.
    trainq: TrainQueue | None = None
    _policy: QueuePolicy | None = None
    _policy_key: tuple[int, int | None, bool, int] | None = None

    def queued_bytes(self, now: float) -> float:
        return max(0.0, self.busy_until - now) * self.params.rate_bps / 8

    def mean_queue_delay(self, now: float) -> float:
        """Time-weighted mean queueing delay (seconds) since the last `reset_stats`."""
        s = self.stats
        span = now - s.since
        if span <= 0:
            return 0.0
        return (s.area + _backlog_area(self.busy_until, s.last, now)) / span

    def mean_queue_bytes(self, now: float) -> float:
        """Time-weighted mean queue depth (bytes) since the last `reset_stats`."""
        return self.mean_queue_delay(now) * self.params.rate_bps / 8

    def reset_stats(self, now: float) -> None:
        """Start a new measurement window at `now` (e.g. after a warm-up)."""
        self.stats = QueueStats(since=now, last=now)

    # -- the data path (called by the event loop) --------------------------------------------------

    def policy(self) -> QueuePolicy:
        """The shared queue model's parameters (mrc.switchq), from `params` as they are
        now (tests change a port's rate or size after building a fabric)."""
        p = self.params
        key = (p.queue_bytes, p.ecn_threshold, p.trim, p.trim_size)
        if self._policy is None or key != self._policy_key:
            last_hop = getattr(self, "last_hop", False)
            self._policy_key = key
            self._policy = QueuePolicy(
                queue_bytes=p.queue_bytes,
                ecn_threshold=p.ecn_threshold,
                trim=p.trim,
                trim_size=p.trim_size,
                trimmed_dscp=DSCP_TRIMMED_LASTHOP if last_hop else DSCP_TRIMMED,
            )
        return self._policy

    def carry(self, net: EventLoop, pkts: list[InFlight], times: list[float]) -> None:
        """Train mode (module docstring): queue `pkts`, arriving at `times`, and put what
        leaves on the wire as one event; a host gets it when its last packet is in."""
        q = self.trainq
        if q is None:
            q = self.trainq = TrainQueue(self.dst.is_host)
        q.send(self, net, self.policy(), pkts, times)

    def _admit(self, net: EventLoop, data: bytes) -> bool:
        """Link state, targeted drops and seeded loss, before any queueing decision."""
        p = self.params
        c = self.counters
        c["sent"] += 1
        if not self.up:
            c["dropped_down"] += 1
            return False
        if p.drop_if is not None and p.drop_if(data):
            c["dropped_filter"] += 1
            return False
        if p.loss and net.rng.random() < p.loss:
            c["dropped_loss"] += 1
            return False
        return True

    def _integrate(self, now: float) -> None:
        """Bring the time-weighted statistics up to `now` (before `busy_until` changes)."""
        s = self.stats
        s.area += _backlog_area(self.busy_until, s.last, now)
        s.last = now

    def _account(self, now: float, size: int, backlog: float) -> None:
        """Statistics for an accepted packet; `backlog` is the work ahead of it (seconds)."""
        self._integrate(now)
        s = self.stats
        queued = backlog * self.params.rate_bps / 8 + size
        if queued > s.max_bytes:
            s.max_bytes = queued

    def _launch(self, net: EventLoop, pkt: InFlight, arrival: float) -> None:
        """Put a packet whose last bit leaves at `arrival - latency` on the wire."""
        p = self.params
        c = self.counters
        c["forwarded"] += 1
        c["forwarded_bytes"] += len(pkt[0])
        if p.reorder and net.rng.random() < p.reorder:
            arrival += net.rng.random() * p.reorder_delay
            c["reordered"] += 1
        net.push(arrival, "arrive", (self, pkt))
        if p.duplicate and net.rng.random() < p.duplicate:
            c["duplicated"] += 1
            net.push(arrival + net.rng.random() * p.reorder_delay, "arrive", (self, pkt))

    def send(self, net: EventLoop, pkt: InFlight) -> None:
        """Enqueue `pkt` at `net.now`: tail drop, ECN marking at enqueue, FIFO service."""
        data = pkt[0]
        if not self._admit(net, data):
            return
        p = self.params
        now = net.now
        backlog = self.busy_until - now
        if backlog < 0.0:
            backlog = 0.0
        size = len(data)
        # A host's link has no priority queue: whatever decide() accepts waits in the FIFO.
        verdict, tos, _ = decide(self.policy(), backlog * p.rate_bps / 8, 0.0, size, pkt[4], False)
        if verdict is Verdict.DROPPED_QUEUE or verdict is Verdict.DROPPED_PRIORITY:
            self.counters["dropped_queue"] += 1
            return
        if verdict is Verdict.MARKED:
            pkt = (data, pkt[1], pkt[2], pkt[3], tos)
            self.counters["ce_marked"] += 1
        self._account(now, size, backlog)
        s = self.stats
        s.delay_sum += backlog
        s.samples += 1
        if backlog > s.delay_max:
            s.delay_max = backlog
        self.busy_until = now + backlog + size * 8 / p.rate_bps
        self._launch(net, pkt, self.busy_until + p.latency)

    def _set_up(self, net: EventLoop, up: bool) -> None:
        """Cable state; what is already on the wire is dropped on arrival while down."""
        self.up = up


# -- train mode ------------------------------------------------------------------------------------

_QUEUED, _MARKED = Verdict.QUEUED, Verdict.MARKED
_TRIMMED, _PRIORITY = Verdict.TRIMMED, Verdict.PRIORITY


class TrainQueue:
    """One link direction's FIFO in train mode: when its data backlog ends, what it holds."""

    __slots__ = ("busy_until", "control_first", "held", "held_bytes", "prio_busy", "to_host")

    def __init__(self, to_host: bool, control_first: bool = False) -> None:
        #: The far end is a host (it reads whole runs of packets), not a switch.
        self.to_host = to_host
        #: Packets that are not MRC data go in the priority lane (module docstring).
        self.control_first = control_first
        #: When the last accepted data packet's last bit leaves.
        self.busy_until = 0.0
        #: When the last trimmed header at priority has left.
        self.prio_busy = 0.0
        #: Accepted data packets not yet sent: (end of transmission, arrival, size), in FIFO
        #: order, so ends ascend.
        self.held: deque[tuple[float, float, int]] = deque()
        self.held_bytes = 0

    def waiting(self, t: float) -> int:
        """Data bytes that have arrived by `t` and are not yet sent (the one on the wire
        counted whole). `carry` inlines the common case (nothing reserved beyond `t`)."""
        held = self.held
        while held and held[0][0] <= t:
            self.held_bytes -= held.popleft()[2]
        queued = self.held_bytes
        # Packets reserved by a train whose tail has not arrived yet are not in the queue.
        for _end, arrival, size in reversed(held):
            if arrival <= t:
                break
            queued -= size
        return queued

    def carry(
        self,
        link: Link,
        net: EventLoop,
        policy: QueuePolicy,
        pkts: list[InFlight],
        times: list[float],
    ) -> tuple[list[InFlight], list[float]]:
        """Queue each packet at its arrival time; return what leaves and when its last bit
        reaches the far end (after the link's latency)."""
        p = link.params
        rate = p.rate_bps / 8
        latency = p.latency
        # Plain links (no loss, no filter, up) skip `_admit`'s checks packet by packet.
        plain = link.up and p.drop_if is None and not p.loss
        held = self.held
        # The schedule in locals for the loop (written back below): this runs per packet per hop.
        busy, prio_busy, held_bytes = self.busy_until, self.prio_busy, self.held_bytes
        stats = link.stats
        max_bytes, delay_max = stats.max_bytes, stats.delay_max
        out: list[InFlight] = []
        out_times: list[float] = []
        sent = forwarded = forwarded_bytes = 0
        waited_sum = 0.0
        control_first = self.control_first
        for pkt, t in zip(pkts, times, strict=True):
            if plain:
                sent += 1
            elif not link._admit(net, pkt[0]):
                continue
            tos = pkt[4]
            size = len(pkt[0])
            while held and held[0][0] <= t:
                held_bytes -= held.popleft()[2]
            if control_first and not is_data(pkt[0]):
                # Control ahead of data: its own lane, with the trimmed headers' room.
                urgent = (prio_busy - t) * rate if prio_busy > t else 0.0
                fits = urgent + size <= policy.priority_room
                verdict = _PRIORITY if fits else Verdict.DROPPED_PRIORITY
                new_tos, new_size = tos, size
            else:
                waiting = held_bytes
                if held and held[-1][1] > t:
                    self.held_bytes = held_bytes
                    waiting = self.waiting(t)
                verdict, new_tos, new_size = decide(
                    policy,
                    waiting,
                    (prio_busy - t) * rate if prio_busy > t else 0.0,
                    size,
                    tos,
                    True,
                )
            if verdict is not _QUEUED:
                c = link.counters
                if verdict is _MARKED:
                    c["ce_marked"] += 1
                elif verdict is _TRIMMED or verdict is _PRIORITY:
                    c["trimmed"] += verdict is _TRIMMED
                    c["priority"] += 1
                else:
                    c[verdict.value] += 1
                    continue
                if new_size != size or new_tos != tos:
                    pkt = (pkt[0][:new_size], pkt[1], pkt[2], pkt[3], new_tos)
            if verdict is _TRIMMED or verdict is _PRIORITY:
                start = t if t > prio_busy else prio_busy
                end = prio_busy = start + new_size / rate
            else:
                start = t if t > busy else busy
                end = busy = start + size / rate
                held.append((end, t, size))
                held_bytes += size
                if held_bytes > max_bytes:
                    max_bytes = held_bytes
            waited = start - t
            waited_sum += waited
            if waited > delay_max:
                delay_max = waited
            forwarded += 1
            forwarded_bytes += new_size
            out.append(pkt)
            out_times.append(end + latency)
        self.busy_until, self.prio_busy, self.held_bytes = busy, prio_busy, held_bytes
        stats.max_bytes, stats.delay_max = max_bytes, delay_max
        c = link.counters
        if sent:
            c["sent"] += sent
        if forwarded:
            c["forwarded"] += forwarded
            c["forwarded_bytes"] += forwarded_bytes
            stats.delay_sum += waited_sum
            stats.samples += forwarded
        # Busy-until of the per-packet model too: `queued_bytes` and host back-pressure read it.
        if busy > link.busy_until:
            link.busy_until = busy
        return out, out_times

    def send(
        self,
        link: Link,
        net: EventLoop,
        policy: QueuePolicy,
        pkts: list[InFlight],
        times: list[float],
    ) -> None:
        """`carry`, then put what leaves on the wire: one event toward a switch; toward a
        host, one per back-to-back run, when its last packet is in."""
        out, out_times = self.carry(link, net, policy, pkts, times)
        if len(out) == 1:
            net.push(out_times[0], "train", (link, out, out_times))
            return
        if not out:
            return
        if any(b < a for a, b in pairwise(out_times)):
            # Trimmed headers overtook queued data: keep the train in arrival order.
            order = sorted(range(len(out)), key=out_times.__getitem__)
            out = [out[i] for i in order]
            out_times = [out_times[i] for i in order]
        if not self.to_host:
            net.push(out_times[0], "train", (link, out, out_times))
            return
        # A host reads each back-to-back run in one batch once its last packet is in (GRO);
        # a packet that came later than line rate allows starts a new batch.
        per_byte = 8 / link.params.rate_bps
        first = 0
        for k in range(1, len(out) + 1):
            if k == len(out) or out_times[k] - out_times[k - 1] > 1.5 * len(out[k][0]) * per_byte:
                net.push(out_times[k - 1], "train", (link, out[first:k], out_times[first:k]))
                first = k

    def drop_all(self, now: float) -> int:
        """Forget what is queued (a port going down); returns how many packets that was."""
        held = self.held
        while held and held[0][0] <= now:
            held.popleft()
        n = len(held)
        held.clear()
        self.held_bytes = 0
        self.busy_until = now
        return n

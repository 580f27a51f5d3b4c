"""One direction of a cable in the simulator: `Link`, its parameters and queue statistics.

What it holds: `LinkParams` (rate, latency, queue size, loss, duplication, reordering, targeted
drops, ECN threshold, trimming), `QueueStats` (queueing delay and time-weighted backlog),
`Link` (a FIFO egress queue and the wire: per-packet `send`, and `carry` for packet trains,
trains.py), the packet tuples `InFlight` and `Datagram`, and the TOS/ECN constants. Queue
decisions (tail drop, ECN marking) are the shared queue model's (mrc.core.switchq).

What it leaves to others: hosts and the event loop (network.py), switch ports with a priority
queue and trimming (fabric.py), the train schedule (trains.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core.switchq import (
    DSCP_TRIMMED,
    DSCP_TRIMMED_LASTHOP,
    QueuePolicy,
    Verdict,
    decide,
)
from ..core.transmit import Addr
from .trains import TrainQueue

if TYPE_CHECKING:
    from .fabric import Switch
    from .network import Host, Network

#: TOS byte of a packet nobody marked: ECT(0), as every mrc packet is sent (docs/WIRE.md §1).
TOS_ECT0 = 0x02
#: The ECN field (low 2 bits of the TOS byte): Not-ECT 0, ECT(1) 1, ECT(0) 2, CE 3 (RFC 3168).
ECN_MASK = 0x03
ECN_CE = 0x03

#: A packet in flight: (UDP payload, source host name, destination address, EV, TOS byte).
InFlight = tuple[bytes, str, Addr, int, int]
#: What a host's endpoint receives: (UDP payload, source address, TOS byte).
Datagram = tuple[bytes, Addr, int]


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

    src: Host | Switch
    dst: Host | Switch
    plane: int
    params: LinkParams
    up: bool = True
    #: When everything accepted so far will have left (the backlog, as total work).
    busy_until: float = 0.0
    counters: Counter[str] = field(default_factory=Counter)
    #: The other direction of the same cable.
    reverse: Link | None = None
    stats: QueueStats = field(default_factory=QueueStats)
    #: The FIFO schedule in train mode (trains.py), made on first use.
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

    # -- the data path (called by Network) ---------------------------------------------------

    def policy(self) -> QueuePolicy:
        """The shared queue model's parameters (mrc.core.switchq), from `params` as they are
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

    def carry(self, net: Network, pkts: list[InFlight], times: list[float]) -> None:
        """Train mode (trains.py): queue `pkts`, arriving at `times`, and put what leaves on
        the wire as one event; a host gets it when its last packet is in."""
        q = self.trainq
        if q is None:
            from .network import Host  # a host is built on links: imported at first use

            q = self.trainq = TrainQueue(isinstance(self.dst, Host))
        q.send(self, net, self.policy(), pkts, times)

    def _admit(self, net: Network, data: bytes) -> bool:
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

    def _launch(self, net: Network, pkt: InFlight, arrival: float) -> None:
        """Put a packet whose last bit leaves at `arrival - latency` on the wire."""
        p = self.params
        c = self.counters
        c["forwarded"] += 1
        c["forwarded_bytes"] += len(pkt[0])
        if p.reorder and net.rng.random() < p.reorder:
            arrival += net.rng.random() * p.reorder_delay
            c["reordered"] += 1
        net._push(arrival, "arrive", (self, pkt))
        if p.duplicate and net.rng.random() < p.duplicate:
            c["duplicated"] += 1
            net._push(arrival + net.rng.random() * p.reorder_delay, "arrive", (self, pkt))

    def send(self, net: Network, pkt: InFlight) -> None:
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

    def _set_up(self, net: Network, up: bool) -> None:
        """Cable state; what is already on the wire is dropped on arrival while down."""
        self.up = up

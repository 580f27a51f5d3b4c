"""Packet trains: a flowcell crosses a link or a switch port as one event (docs/DESIGN.md §5).

At fabric scale (1,024 hosts × 8 planes) one heap event per packet per hop is too many for
CPython, so a network built with `Network(trains=True)` moves each GSO batch (a flowcell: the
packets of one `Transmit`, one EV, one destination) as a train: one event per hop, carrying the
packets and the time each one arrives. Each hop still decides and times every packet on its
own, in FIFO order: packet i arrives at `times[i]`, waits for what is ahead of it, is marked,
trimmed or dropped by the shared queue model (`mrc.core.switchq.decide`) against the bytes
waiting at `times[i]`, and leaves when its last bit is sent. What the train costs in fidelity:
a train reserves its place in a port's FIFO when its head arrives, so a packet of another train
that would have slipped in between two of its packets queues behind it instead (same rates,
same throughput; a few packet times of reordering between trains). Trimmed headers go at
priority the moment they arrive (a 64-byte header steals 5 ns at 100 Gbit/s, not modelled), and
a host receives a whole train in one receive batch when its last packet has arrived, as GRO
would hand it over.

With `control_first` (set by `topology.build` for a `FabricSpec(control_priority=True)`), a
packet that is not MRC data (a SACK, NACK or CM packet: `switchq.is_data` false) also goes to
the priority lane, unmarked and never trimmed, as htsim's switch queues serve their header-only
control packets first and its NIC sends control ahead of data.

Holds `TrainQueue` (one link direction's FIFO schedule in train mode) and the event payload
type `Train`. What it leaves to others: links, ports and switches (network.py, fabric.py) call
it; the event loop (network.py) delivers trains to hosts; time-weighted queue statistics
(`QueueStats.area`) are only kept by the per-packet model.
"""

from __future__ import annotations

from collections import deque
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from ..core.switchq import QueuePolicy, Verdict, decide, is_data

if TYPE_CHECKING:
    from .link import Datagram, InFlight, Link
    from .network import Host, Network

_QUEUED, _MARKED = Verdict.QUEUED, Verdict.MARKED
_TRIMMED, _PRIORITY = Verdict.TRIMMED, Verdict.PRIORITY

#: A train in flight: the link it is on, its packets, and when each one arrives at the far end.
Train = tuple["Link", list["InFlight"], list[float]]


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
        net: Network,
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
        net: Network,
        policy: QueuePolicy,
        pkts: list[InFlight],
        times: list[float],
    ) -> None:
        """`carry`, then put what leaves on the wire: one event toward a switch; toward a
        host, one per back-to-back run, when its last packet is in."""
        out, out_times = self.carry(link, net, policy, pkts, times)
        if len(out) == 1:
            net._push(out_times[0], "train", (link, out, out_times))
            return
        if not out:
            return
        if any(b < a for a, b in pairwise(out_times)):
            # Trimmed headers overtook queued data: keep the train in arrival order.
            order = sorted(range(len(out)), key=out_times.__getitem__)
            out = [out[i] for i in order]
            out_times = [out_times[i] for i in order]
        if not self.to_host:
            net._push(out_times[0], "train", (link, out, out_times))
            return
        # A host reads each back-to-back run in one batch once its last packet is in (GRO);
        # a packet that came later than line rate allows starts a new batch.
        per_byte = 8 / link.params.rate_bps
        first = 0
        for k in range(1, len(out) + 1):
            if k == len(out) or out_times[k] - out_times[k - 1] > 1.5 * len(out[k][0]) * per_byte:
                net._push(out_times[k - 1], "train", (link, out[first:k], out_times[first:k]))
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


def arrive(
    net: Network, train: Train, batches: dict[str, dict[int, list[Datagram]]], hosts: dict[str, Any]
) -> None:
    """A train reached the far end of its link: a switch forwards it, a host gets its packets
    in this instant's receive batch (`batches`, `hosts`: the event loop's, by host name)."""
    link, pkts, times = train
    n = len(pkts)
    if not link.up:
        link.counters["dropped_down"] += n
        return
    link.counters["delivered"] += n
    q = link.trainq
    if q is None or not q.to_host:
        link.dst.receive_train(net, link, pkts, times)  # type: ignore[union-attr]
        return
    dst: Host = link.dst  # type: ignore[assignment]
    planes = batches.get(dst.name)
    if planes is None:
        planes = batches[dst.name] = {}
        hosts[dst.name] = dst
    batch = planes.setdefault(link.plane, [])
    if dst.flowlabel:
        batch.extend((p[0], p[1], p[4] | (p[3] & 0xFFFFF) << 8) for p in pkts)
    else:
        batch.extend((p[0], p[1], p[4]) for p in pkts)

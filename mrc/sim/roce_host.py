"""Hosts that run the RoCE-like baseline (roce.py) inside the simulator's Network.

What it holds: `RoceHost`, a `Host` whose arrivals and timers go to RoCE queue pairs instead of
the mrc Endpoint (the event loop calls the same `_deliver` and `_on_timer` it calls for mrc
hosts, so fabrics, failures and statistics are shared); `RoceNetwork`, a `Network` whose
`add_host` makes RoceHosts (so `topology.clos` builds a RoCE fabric unchanged); and
`connect_roce`, which sets up one connection out of band between two hosts on one plane with
one EV, the connection's ECMP hash.

What it leaves to others: the transport itself (roce.py), forwarding (network.py, fabric.py),
and experiments (mrc.experiments.paper_*).
"""

from __future__ import annotations

from collections import Counter

from .link import Delivery
from .network import EventHook, Host, Network
from .roce import DATA, HEADER, RoceDecodeError, RoceParams, RoceReceiver, RoceSender, decode

RoceQp = RoceSender | RoceReceiver


class RoceHost(Host):
    """A simulated machine whose NIC speaks the RoCE baseline on each of its plane links."""

    def __init__(self, net: Network, name: str, on_event: EventHook | None = None) -> None:
        super().__init__(net, name, on_event)
        self.qps: dict[int, RoceQp] = {}
        #: Where each QP sends: (plane, peer host name, EV).
        self.routes: dict[int, tuple[int, str, int]] = {}
        #: Datagrams this host could not use: `roce_malformed`, `roce_no_qp`, `roce_wrong_kind`.
        self.roce_counters: Counter[str] = Counter()
        self._roce_timer_at: dict[int, float] = {}

    def add_qp(self, qp: RoceQp, plane: int, peer: str, ev: int) -> None:
        if qp.qpn in self.qps:
            raise ValueError(f"{self.name}: QPN {qp.qpn} is taken")
        self.qps[qp.qpn] = qp
        self.routes[qp.qpn] = (plane, peer, ev)

    def next_qpn(self) -> int:
        return len(self.qps) + 1

    # -- the loop's entry points (network.Network.step) --------------------------------------

    def _deliver(self, batches: dict[int, list[Delivery]]) -> None:
        now = self.net.now
        touched: dict[int, RoceQp] = {}
        counters = self.roce_counters
        for batch in batches.values():
            for data, _src, tos in batch:
                try:
                    kind, flags, qpn, psn = decode(data)
                except RoceDecodeError:
                    counters["roce_malformed"] += 1
                    continue
                qp = self.qps.get(qpn)
                if qp is None:
                    counters["roce_no_qp"] += 1
                    continue
                if isinstance(qp, RoceReceiver):
                    if kind != DATA:
                        counters["roce_wrong_kind"] += 1
                        continue
                    qp.receive_data(flags, psn, len(data) - HEADER, tos, now)
                elif kind == DATA:
                    counters["roce_wrong_kind"] += 1
                    continue
                else:
                    qp.receive(kind, psn, now)
                touched[qpn] = qp
        for qp in touched.values():
            self.pump(qp)

    def _on_timer(self, session: object) -> None:
        # The loop hands back what `pump` armed: one of this host's QPs.
        if not isinstance(session, (RoceSender, RoceReceiver)):
            return
        qp = session
        deadline = qp.get_timer()
        if deadline is None or deadline > self.net.now:
            return
        self._roce_timer_at.pop(qp.qpn, None)
        qp.handle_timer(self.net.now)
        self.pump(qp)

    def plane_status(self, plane: int, up: bool) -> None:
        # An RC QP is bound to its port: a link change is not something it can act on.
        self.roce_counters["plane_up" if up else "plane_down"] += 1

    def pump(self, qp: RoceQp) -> None:
        """Send what `qp` has queued on its link, then arm its next timer."""
        plane, peer, ev = self.routes[qp.qpn]
        link = self.links.get(plane)
        out = qp.datagrams_to_send()
        if link is None:
            self.net.counters["no_link"] += len(out)
        else:
            for data, tos in out:
                link.send(self.net, (data, self.name, peer, ev, tos))
        deadline = qp.get_timer()
        if deadline is not None and self._roce_timer_at.get(qp.qpn) != deadline:
            self._roce_timer_at[qp.qpn] = deadline
            self.net.push(deadline, "timer", (self, qp))


class RoceNetwork(Network):
    """A Network whose hosts run the RoCE baseline (fabric builders call `add_host`)."""

    def add_host(self, name: str, on_event: EventHook | None = None) -> Host:
        host = self.hosts[name] = RoceHost(self, name, on_event)
        return host


def connect_roce(
    a: RoceHost, b: RoceHost, size: int, params: RoceParams, *, plane: int, ev: int
) -> tuple[RoceSender, RoceReceiver]:
    """A connection from `a` to `b` carrying `size` bytes on `plane` with EV `ev` (its path),
    set up out of band and started at once."""
    now = a.net.now
    sq, rq = a.next_qpn(), b.next_qpn()
    sender = RoceSender(sq, rq, size, params, now)
    receiver = RoceReceiver(rq, sq, params)
    a.add_qp(sender, plane, b.name, ev)
    b.add_qp(receiver, plane, a.name, ev)
    sender.handle_timer(now)
    a.pump(sender)
    return sender, receiver

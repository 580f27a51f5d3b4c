"""Incast with a victim flow: congestion control and trimming at the receiver's last hop.

Seven senders in rack 0 of a two-plane Clos each WRITE to one receiver in rack 1, whose two
host links (one per plane) are the bottleneck: every plane is congested at the same last-hop
port, where switching EVs cannot help and only the senders' windows can. Meanwhile a victim
flow runs from another host of rack 0 to another host of rack 1, sharing the fabric links but
not the bottleneck port; all eight senders run the row's congestion control. One run per row
— `nscc` or `none`, with switches that trim or that tail-drop — reports the numbers of issue
6: aggregate goodput against the bottleneck, mean and p99 queueing delay at the bottleneck
ports against NSCC's target, retransmissions, trims, drops, EVs retired (sum of
`times_retired`), planes down, and the victim's rate against its rate alone.
`python -m mrc.experiments.incast [-J]` prints them side by side.

The fabric is built to UEC's reference scale (100 Gbit/s links, about 10 µs base RTT), with
queues of 1 × BDP where switches trim and 5 × BDP where they drop (htsim's sizing,
docs/WIRE.md §5) and ECN marking above half of NSCC's target queue on every switch
port, the last hop included (NSCC needs the mark where the queue is; MRC's fabrics leave it off
there and rely on trimming). It leaves protocol behaviour to mrc.core and forwarding to the
simulator (mrc.sim); transfers and patterns come from scenarios.py.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.cc.control import Nscc
from ..core.config import SessionConfig
from ..core.events import ConnectionEstablished, Event, PlaneDown, WriteCompleted
from ..core.memory import Region
from ..core.session import Session
from ..sim.fabric import Clos, Port
from ..sim.link import LinkParams
from ..sim.network import Host, Network
from ..sim.topology import clos
from .scenarios import _REPLY, MiB, Transfer, _config, pattern

RATE = 100e9  # every link, bit/s
LATENCY = 1e-6  # every link
PLANES = 2
SENDERS = 7
#: The fabric's base RTT: four hops each way, a full data packet out, a SACK back.
BASE_RTT = 8 * LATENCY + 4 * (4096 + 100) * 8 / RATE + 4 * 100 * 8 / RATE
#: Bytes a plane's bottleneck port holds in one base RTT.
BDP = RATE / 8 * BASE_RTT
#: NSCC's target queueing delay on a trimming fabric; switches mark ECN above half of it.
TARGET = 0.75 * BASE_RTT
ECN_THRESHOLD = int(TARGET / 2 * RATE / 8)
#: Queueing delay is sampled this often at the bottleneck ports (for its p99).
SAMPLE_EVERY = 0.5e-6

ROWS = (("nscc", True), ("nscc", False), ("none", True), ("none", False))


@dataclass
class IncastOutcome:
    cc: str
    trim: bool
    completed: bool
    intact: bool
    #: First byte placed at the receiver to the last WRITE completed.
    seconds: float
    goodput_bps: float
    bottleneck_bps: float
    #: NSCC's target queueing delay (cc_target × base RTT) and the bottleneck ports' delay:
    #: mean and p99 of samples every 0.5 µs over `seconds`, both planes pooled.
    target: float
    queue_mean: float
    queue_p99: float
    retransmits: dict[str, int]
    trims: int
    drops: int
    #: Sum of `times_retired` over every EV of every incast sender.
    evs_retired: int
    planes_down: int
    victim_bps: float
    victim_alone_bps: float
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def row(self) -> str:
        return self.cc + ("+trim" if self.trim else "")

    @property
    def goodput_share(self) -> float:
        return self.goodput_bps / self.bottleneck_bps

    @property
    def victim_share(self) -> float:
        return self.victim_bps / self.victim_alone_bps if self.victim_alone_bps else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "row": self.row,
            **self.__dict__,
            "goodput_share": round(self.goodput_share, 4),
            "victim_share": round(self.victim_share, 4),
        }


class _IncastSender:
    """`size` bytes from `host` into its own slot of the receiver's region, in WRITEs of
    `msg` bytes, once connected; the slot index travels in the REQUEST's private data."""

    def __init__(
        self, index: int, host: Host, rx: Host, config: SessionConfig, size: int, msg: int
    ) -> None:
        self.host, self.size = host, size
        self.src = pattern(size, seed=index + 1)
        region: Region = host.regions.register(bytearray(self.src))
        self.pending = math.ceil(size / msg)
        self.done_at: float | None = None

        def on_event(h: Host, session: Session, event: Event) -> None:
            if isinstance(event, ConnectionEstablished):
                va, rkey = _REPLY.unpack(event.private_data)
                for off in range(0, size, msg):
                    session.post_write(region, off, min(msg, size - off), va + off, rkey)
            elif isinstance(event, WriteCompleted):
                self.pending -= 1
                if not self.pending:
                    self.done_at = h.net.now

        self.session = host.connect(rx, config, private_data=bytes([index]), on_event=on_event)


def _fabric(net: Network, trim: bool) -> Clos:
    queue = int(BDP if trim else 5 * BDP)
    link = LinkParams(rate_bps=RATE, latency=LATENCY, queue_bytes=queue)
    fab = clos(
        net, planes=PLANES, racks=2, hosts_per_rack=SENDERS + 1, tier1=4, host_link=link,
        fabric_link=link, ecn_threshold=ECN_THRESHOLD, trim=trim,
    )  # fmt: skip
    for host in fab.hosts:
        # A host's own NIC queues what its sender hands it (a real one pushes back instead
        # of dropping): the switches' queues are the subject here.
        for nic in host.links.values():
            nic.params = replace(nic.params, queue_bytes=1 << 30)
    return fab


def _cc_config(cc: str, fab: Clos) -> SessionConfig:
    # NSCC knows the fabric (UEC's base_rtt and line rate); loss inference and the RTO are
    # scaled to a 10 µs fabric instead of real sockets' milliseconds.
    config = _config(
        "bitmap", PLANES, cc=cc, max_inflight=None, plane_paths=fab.plane_paths,
        cc_plane_rate=RATE, cc_base_rtt=BASE_RTT,
    )  # fmt: skip
    return replace(config, min_rto=100e-6, reorder_min=20e-6).validate()


def _victim(net: Network, fab: Clos, cc: str, size: int) -> Transfer:
    a, b = fab.hosts[SENDERS], fab.hosts[SENDERS + 2]
    return Transfer(net, a, b, _cc_config(cc, fab), size, MiB)


def victim_alone(cc: str, *, trim: bool = True, size: int = 16 * MiB, seed: int = 1) -> float:
    """The victim's rate (bit/s) on the same fabric with no incast."""
    net = Network(seed)
    fab = _fabric(net, trim)
    v = _victim(net, fab, cc, size)
    net.drive_until(v.done, timeout=1.0)
    b = next(iter(v.b.endpoint.sessions.values())).stats
    if b.first_placed_at is None or b.last_placed_at is None:
        return 0.0
    return b.bytes_placed * 8 / (b.last_placed_at - b.first_placed_at)


def incast(
    cc: str,
    *,
    trim: bool,
    size: int = 2 * MiB,
    msg: int = 256 << 10,
    victim_size: int = 16 * MiB,
    victim_alone_bps: float | None = None,
    seed: int = 1,
) -> IncastOutcome:
    """Seven senders write `size` bytes each to h8 while h7 writes `victim_size` to h9."""
    net = Network(seed)
    fab = _fabric(net, trim)
    rx = fab.hosts[SENDERS + 1]
    dst = bytearray(SENDERS * size)
    dst_region = rx.regions.register(dst)
    config = _cc_config(cc, fab)
    rx.listen(
        config,
        accept=lambda pd: _REPLY.pack(dst_region.base_va + pd[0] * size, dst_region.rkey),
    )
    victim = _victim(net, fab, cc, victim_size)
    victim.sample_every(SAMPLE_EVERY * 10, until=1.0)
    senders = [_IncastSender(i, fab.hosts[i], rx, config, size, msg) for i in range(SENDERS)]
    # Rack 1's tier-0 of each plane, toward the receiver.
    bottleneck: list[Port] = [t0[1].down[rx.name] for t0 in fab.tier0]
    samples: list[tuple[float, float]] = []

    def done() -> bool:
        return all(s.done_at is not None for s in senders)

    def sample() -> None:
        now = net.now
        samples.extend((now, p.queued_bytes(now) * 8 / p.params.rate_bps) for p in bottleneck)
        if not done():
            net.at(now + SAMPLE_EVERY, sample)

    net.at(0.0, sample)
    completed = net.drive_until(done, timeout=0.5)
    end = net.now
    rx_sessions = list(rx.endpoint.sessions.values())
    starts = [s.stats.first_placed_at for s in rx_sessions if s.stats.first_placed_at is not None]
    start = min(starts, default=0.0)
    seconds = end - start
    placed_bytes = sum(s.stats.bytes_placed for s in rx_sessions)
    expected = b"".join(s.src for s in senders)
    retransmits: dict[str, int] = {}
    for s in senders:
        for cause, n in s.session.stats.retransmits_by_cause.items():
            retransmits[cause] = retransmits.get(cause, 0) + n
    targets = [s.session.cc.p.target for s in senders if isinstance(s.session.cc, Nscc)]
    delays = sorted(d for t, d in samples if start <= t <= end)
    return IncastOutcome(
        cc=cc,
        trim=trim,
        completed=completed,
        intact=completed and bytes(dst) == expected and placed_bytes == len(expected),
        seconds=round(seconds, 9),
        goodput_bps=placed_bytes * 8 / seconds if seconds > 0 else 0.0,
        bottleneck_bps=sum(p.params.rate_bps for p in bottleneck),
        target=sum(targets) / len(targets) if targets else TARGET,
        queue_mean=sum(delays) / len(delays) if delays else 0.0,
        queue_p99=delays[int(0.99 * (len(delays) - 1))] if delays else 0.0,
        retransmits=retransmits,
        trims=sum(p.counters["trimmed"] for p in fab.ports()),
        drops=sum(p.counters["dropped_queue"] for p in fab.ports()),
        evs_retired=sum(
            r.times_retired for s in senders for r in s.session.paths.evs.by_ev.values()
        ),
        planes_down=sum(len(s.host.events_of(PlaneDown)) for s in senders),
        victim_bps=victim.rate(start, min(end, victim.done_at or end)),
        victim_alone_bps=(
            victim_alone(cc, trim=trim, size=victim_size, seed=seed)
            if victim_alone_bps is None
            else victim_alone_bps
        ),
        detail={
            "bottleneck_trims": sum(p.counters["trimmed"] for p in bottleneck),
            "bottleneck_ce": sum(p.counters["ce_marked"] for p in bottleneck),
            "victim_retransmits": dict(victim.session.stats.retransmits_by_cause),
            "cwnd": [round(s.session.cc.cwnd) for s in senders],
        },
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mrc.experiments.incast",
        description="7-to-1 incast with a victim flow under each congestion control, with and "
        "without trimming.",
    )
    ap.add_argument("-J", "--json", action="store_true", help="one JSON document")
    args = ap.parse_args(argv)
    alone = {cc: victim_alone(cc) for cc in dict(ROWS)}
    rows = [incast(cc, trim=trim, victim_alone_bps=alone[cc]) for cc, trim in ROWS]
    if args.json:
        json.dump({"results": [r.as_dict() for r in rows]}, sys.stdout, indent=2, default=str)
        print()
        return 0
    us = 1e6
    print(
        f"{'row':<11}{'ok':>3}{'goodput':>9}{'q mean':>8}{'q p99':>8}{'target':>8}"
        f"{'rtx':>6}{'trims':>7}{'drops':>7}{'retired':>8}{'down':>5}{'victim':>8}"
    )
    print(f"{'':<11}{'':>3}{'/bneck':>9}{'µs':>8}{'µs':>8}{'µs':>8}{'':>6}{'':>7}{'':>7}"
          f"{'':>8}{'':>5}{'/alone':>8}")  # fmt: skip
    for r in rows:
        print(
            f"{r.row:<11}{'y' if r.intact else 'N':>3}{r.goodput_share:>9.3f}"
            f"{r.queue_mean * us:>8.2f}{r.queue_p99 * us:>8.2f}{r.target * us:>8.2f}"
            f"{sum(r.retransmits.values()):>6}{r.trims:>7}{r.drops:>7}{r.evs_retired:>8}"
            f"{r.planes_down:>5}{r.victim_share:>8.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

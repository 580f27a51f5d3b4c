"""The multipath scenarios of the MRC paper at simulator scale, runnable by name and policy.

Each scenario builds a network (a direct pair or a two-tier Clos, mrc.sim.topology.clos),
moves a verified transfer from one host to another with a chosen spray policy, injects its fault
on a fixed schedule, and returns an `Outcome` of plain numbers: completion time, goodput,
retired and restored EVs, planes down, the longest time without newly placed bytes, and what
the scenario itself measures. Tests assert on these numbers; `python -m
mrc.experiments.scenarios` prints them side by side for the spray policies (docs/DESIGN.md §4,
issue «Adaptive multipath»).

It leaves protocol behaviour to mrc.core and packet forwarding to the simulator (mrc.sim).
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

from ..core.config import SessionConfig
from ..core.events import (
    ConnectionEstablished,
    Event,
    PathRestored,
    PathRetired,
    PlaneDown,
    WriteCompleted,
)
from ..core.memory import Region
from ..core.paths.spray import spray_names
from ..core.session import Session
from ..core.sink import TraceSink
from ..sim.fabric import Clos
from ..sim.link import Delivery, LinkParams
from ..sim.network import Host, Network
from ..sim.topology import clos

MiB = 1 << 20
_REPLY = struct.Struct(">QI")  # the responder's region: base VA, R_Key
_BTH_FLAGS, _PSN = 8, 9  # byte offsets in the BTH (docs/WIRE.md §2)


def pattern(n: int, seed: int = 7) -> bytes:
    """Bytes that differ at every offset inside a 64 KiB period."""
    block = bytes((i * 131 + seed * 17 + (i >> 8) * 29) & 0xFF for i in range(65536))
    return (block * (n // len(block) + 1))[:n]


def packet_ev(data: bytes) -> int:
    """The EV a datagram carries in its EVXH (0 without one; docs/WIRE.md §3)."""
    if len(data) >= 16 and data[4] & 1:
        return int.from_bytes(data[12:16], "big")
    return 0


@dataclass
class Outcome:
    scenario: str
    spray: str
    completed: bool
    seconds: float
    goodput_bps: float
    intact: bool
    retired: int
    restored: int
    planes_down: list[tuple[float, int, str]]
    longest_stall: float
    retransmits: dict[str, int]
    probes_sent: int
    data_packets: int
    #: What the scenario itself measures (fault times, shares, latencies).
    detail: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


class Transfer:
    """`size` bytes from `a` to `b` in WRITEs of `msg` bytes, posted once connected; `b`
    listens with `listen` (default: `config`); `trace` receives `a`'s session's records. The
    session hands its events to the transfer, which it is connected with."""

    def __init__(
        self, net: Network, a: Host, b: Host, config: SessionConfig, size: int, msg: int,
        listen: SessionConfig | None = None, trace: TraceSink | None = None,
    ) -> None:  # fmt: skip
        self.net, self.a, self.b, self.size = net, a, b, size
        self.src = pattern(size)
        self.dst = bytearray(size)
        src_region: Region = a.regions.register(bytearray(self.src))
        dst_region: Region = b.regions.register(self.dst)
        self.messages = [(off, min(msg, size - off)) for off in range(0, size, msg)]
        self.completed = 0
        self.done_at: float | None = None
        self.started_at = net.now
        #: (time, bytes placed at b) every `sample` seconds while the transfer runs.
        self.progress: list[tuple[float, int]] = []
        b.listen(listen or config,
                 accept=lambda _pd: _REPLY.pack(dst_region.base_va, dst_region.rkey))  # fmt: skip

        def on_event(host: Host, session: Session, event: Event) -> None:
            if isinstance(event, ConnectionEstablished):
                va, rkey = _REPLY.unpack(event.private_data)
                for i, (off, length) in enumerate(self.messages):
                    session.post_write(src_region, off, length, va + off, rkey, imm=i)
            elif isinstance(event, WriteCompleted):
                self.completed += 1
                if self.completed == len(self.messages):
                    self.done_at = self.net.now

        self.session = a.connect(b, config, trace=trace, on_event=on_event)

    def done(self) -> bool:
        return self.done_at is not None

    def sample_every(self, interval: float, until: float) -> None:
        def tick() -> None:
            sessions = list(self.b.endpoint.sessions.values())
            placed = sessions[0].stats.bytes_placed if sessions else 0
            self.progress.append((self.net.now, placed))
            if self.net.now + interval <= until and not self.done():
                self.net.at(self.net.now + interval, tick)

        self.net.at(self.net.now + interval, tick)

    def rate(self, t0: float, t1: float) -> float:
        """Goodput (bits/s) placed at b between t0 and t1, from the progress samples."""
        pts = [(t, b) for t, b in self.progress if t0 <= t <= t1]
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return 0.0
        return (pts[-1][1] - pts[0][1]) * 8 / (pts[-1][0] - pts[0][0])

    def outcome(self, scenario: str, spray: str, detail: dict[str, Any]) -> Outcome:
        a = self.session
        b = next(iter(self.b.endpoint.sessions.values()))
        end = self.done_at if self.done_at is not None else self.net.now
        seconds = end - self.started_at
        return Outcome(
            scenario=scenario,
            spray=spray,
            completed=self.done(),
            seconds=round(seconds, 6),
            goodput_bps=round(b.stats.bytes_placed * 8 / seconds, 1) if seconds else 0.0,
            intact=bytes(self.dst) == self.src and b.stats.bytes_placed == self.size,
            retired=len(self.a.events_of(PathRetired)),
            restored=len(self.a.events_of(PathRestored)),
            planes_down=[
                (round(t, 6), e.plane, e.reason)
                for t, s, e in self.a.events
                if s is a and isinstance(e, PlaneDown)
            ],
            longest_stall=round(b.stats.longest_stall_seconds, 6),
            retransmits=dict(a.stats.retransmits_by_cause),
            probes_sent=a.stats.probes_sent,
            data_packets=sum(ps.packets_sent for ps in a.stats.planes.values()),
            detail=detail,
        )


def _config(spray: str, planes: int = 4, **kw: Any) -> SessionConfig:
    # A fixed window stands in for congestion control here: 64 packets keep four 1 Gbit/s
    # planes busy with well under a millisecond of queue (incast.py runs NSCC).
    kw.setdefault("max_inflight", 64)
    kw.setdefault("cc", "none")
    # Simulated hosts answer at once: no userspace turnaround floors NSCC's base RTT.
    kw.setdefault("cc_min_base_rtt", 0.0)
    # The models count packets: an EV per packet, MRC's rule (docs/DESIGN.md §11).
    kw.setdefault("flowcell", 1)
    return SessionConfig(plane_mask=(1 << planes) - 1, spray=spray, min_rto=0.002, **kw)


def _clos(net: Network, rate: float, **kw: Any) -> Clos:
    link = LinkParams(rate_bps=rate, latency=2e-6, queue_bytes=4 << 20)
    return clos(net, planes=4, racks=2, hosts_per_rack=1, tier1=4, host_link=link,
                fabric_link=kw.pop("fabric_link", link), **kw)  # fmt: skip


# -- scenarios ------------------------------------------------------------------------------


def ev_loss(spray: str, *, loss: float = 0.2, seed: int = 1, size: int = 32 * MiB) -> Outcome:
    """20 % loss on one EV of plane 1 (every packet that EV carries, probes too)."""
    net = Network(seed)
    a, b = net.pair(4, LinkParams(rate_bps=1e9, latency=5e-6, queue_bytes=8 << 20))
    victim: list[int] = []
    dropped: list[float] = []

    def drop(data: bytes) -> bool:
        if not victim and loss and 0xC6 <= data[0] <= 0xCB:
            victim.append(packet_ev(data))  # the first EV that carries data on plane 1
        if victim and packet_ev(data) == victim[0] and net.rng.random() < loss:
            dropped.append(net.now)
            return True
        return False

    a.links[1].params.drop_if = drop
    t = Transfer(net, a, b, _config(spray), size, MiB)
    t.net.drive_until(t.done, timeout=10)
    net.drive(net.now + 0.2)
    retired = [(ts, e) for ts, _, e in a.events if isinstance(e, PathRetired)]
    mine = [round(ts, 6) for ts, e in retired if victim and e.ev == victim[0]]
    evs = t.session.paths.evs
    return t.outcome(
        "ev_loss",
        spray,
        {
            "victim": victim[0] if victim else None,
            "first_drop": dropped[0] if dropped else None,
            "victim_retired_at": mine,
            "other_retired": [e.ev for _, e in retired if not victim or e.ev != victim[0]],
            "victim_times_retired": evs.by_ev[victim[0]].times_retired if victim else 0,
            "plane1_active": len(evs.planes[1].active),
        },
    )


def tier1_failure(
    spray: str, *, seed: int = 1, size: int = 24 * MiB, die: float = 0.010, back: float = 0.3
) -> Outcome:
    """Tier-1 switch #2 of plane 1 dies at `die` and returns at `back` (silently)."""
    net = Network(seed)
    fab = _clos(net, 1e9)
    h0, h1 = fab.hosts
    cfg = _config(spray, plane_paths=fab.plane_paths)
    dead = fab.tier1[1][2]
    fab.set_switch(dead, False, at=die)
    fab.set_switch(dead, True, at=back)
    t = Transfer(net, h0, h1, cfg, size, MiB)
    rto: list[float] = []
    through: list[int] = []

    def at_death() -> None:
        rto.append(t.session.paths.planes[1].rtt.current)
        through.extend(
            r.ev for r in t.session.paths.evs.planes[1].active if fab.tier1_of(r.ev) is dead
        )

    net.at(die, at_death)
    net.drive_until(t.done, timeout=10)
    net.drive(max(net.now, back) + 2.5)
    retired = {e.ev: ts for ts, _, e in h0.events if isinstance(e, PathRetired)}
    restored = {e.ev: ts for ts, _, e in h0.events if isinstance(e, PathRestored)}
    evs = t.session.paths.evs
    return t.outcome(
        "tier1_failure",
        spray,
        {
            "rto_at_death": rto[0],
            "through_dead": through,
            "retire_after": {ev: round(retired[ev] - die, 6) for ev in through if ev in retired},
            "restore_after": {
                ev: round(restored[ev] - back, 6) for ev in retired if ev in restored
            },
            "still_retired": [ev for ev, r in evs.by_ev.items() if r.state.value == "assumed_bad"],
            "other_paths_retired": [ev for ev in retired if fab.tier1_of(ev) is not dead],
        },
    )


def host_link_down(
    spray: str, *, seed: int = 1, size: int = 32 * MiB, fail: float = 0.030
) -> Outcome:
    """The receiver's own link to plane 2 goes down at `fail` (it sees carrier loss)."""
    net = Network(seed)
    fab = _clos(net, 1e9)
    h0, h1 = fab.hosts
    t = Transfer(net, h0, h1, _config(spray, plane_paths=fab.plane_paths), size, MiB)
    net.set_link(h1, 2, False, at=fail, notify=True)
    t.sample_every(0.001, 10)
    sent2: list[tuple[float, int]] = []

    def watch() -> None:
        sent2.append((net.now, t.session.stats.plane(2).packets_sent))
        if net.now < fail + 0.02:
            net.at(net.now + 10e-6, watch)

    net.at(fail, watch)
    net.drive_until(t.done, timeout=10)
    last_change = max((ts for (ts, n), (_, m) in pairwise(sent2) if m != n), default=fail)
    srtt = t.session.paths.planes[0].rtt.srtt or 0.0
    end = t.done_at or net.now
    return t.outcome(
        "host_link_down",
        spray,
        {
            "fail": fail,
            "srtt": srtt,
            "stopped_after": round(last_change + 10e-6 - fail, 6),
            "rate_before": t.rate(0.005, fail),
            "rate_after": t.rate(fail + 0.005, end),
        },
    )


def flap(
    spray: str,
    *,
    seed: int = 1,
    size: int = 56 * MiB,
    start: float = 0.05,
    period: float = 0.05,
    count: int = 40,
) -> Outcome:
    """The tier-0(rack 0)–tier-1 #1 link of plane 0 flaps every `period` for `count` times."""
    net = Network(seed)
    fab = _clos(net, 50e6)
    h0, h1 = fab.hosts
    cfg = _config(spray, plane_paths=fab.plane_paths, max_inflight=12)
    fab.flap(fab.tier0[0][0], fab.tier1[0][1], start=start, period=period, count=count)
    t = Transfer(net, h0, h1, cfg, size, MiB)
    net.drive_until(t.done, timeout=30)
    return t.outcome("flap", spray, {"flap_until": start + period * count, "done_at": t.done_at})


def receiver_stall(spray: str, *, seed: int = 1, size: int = 32 * MiB) -> Outcome:
    """The receiver does nothing at all for 50 ms mid-transfer."""
    net = Network(seed)
    a, b = net.pair(4, LinkParams(rate_bps=1e9, latency=5e-6, queue_bytes=8 << 20))
    t = Transfer(net, a, b, _config(spray), size, MiB)
    net.at(0.020, lambda: b.pause(0.050))
    net.drive_until(t.done, timeout=10)
    net.drive(net.now + 0.5)
    evs = t.session.paths.evs
    return t.outcome(
        "receiver_stall",
        spray,
        {
            "still_retired": [ev for ev, r in evs.by_ev.items() if r.state.value == "assumed_bad"],
            "planes_usable": [p for p in t.session.paths.planes if t.session.paths.usable(p)],
            "longest_stall_from": next(iter(b.endpoint.sessions.values())).stats.longest_stall_from,
        },
    )


def congested_tier1(
    spray: str,
    *,
    trim: bool = False,
    rate: float = 200e6,
    queue: int = 64_000,
    seed: int = 1,
    size: int = 24 * MiB,
) -> Outcome:
    """Tier-1 #0 of plane 0 forwards to rack 1 at `rate` (its share of a full plane is
    250 Mbit/s) with a `queue`-byte buffer; switches mark ECN above 16 KB of queue; with
    `trim`, a full queue trims instead of dropping (docs/WIRE.md §5)."""
    net = Network(seed)
    fab = _clos(net, 1e9, ecn_threshold=16_000, trim=trim)
    h0, h1 = fab.hosts
    hot = fab.tier1[0][0]
    port = fab.link(hot, fab.tier0[0][1])
    port.params = replace(port.params, rate_bps=rate, queue_bytes=queue)
    arrivals: dict[int, float] = {}
    trim_to_rtx: list[float] = []

    def observe(host: Host, plane: int, batch: list[Delivery]) -> None:
        for data, _src, tos in batch:
            if len(data) < 12 or not 0xC6 <= data[0] <= 0xCB:
                continue
            psn = int.from_bytes(data[_PSN : _PSN + 3], "big")
            if (tos & 0xFF) >> 2 in (11, 21):
                arrivals[psn] = net.now
            elif data[_BTH_FLAGS] & 0x20 and psn in arrivals:
                trim_to_rtx.append(net.now - arrivals.pop(psn))

    h1.on_receive = observe
    t = Transfer(net, h0, h1, _config(spray, plane_paths=fab.plane_paths), size, MiB)
    half: list[int] = []
    net.at(0.040, lambda: half.append(port.counters["forwarded_bytes"]))
    net.drive_until(t.done, timeout=10)
    evs = t.session.paths.evs
    plane0 = [r for r in evs.by_ev.values() if r.plane == 0]
    hot_evs = [r for r in plane0 if fab.tier1_of(r.ev) is hot]
    sent_plane0 = sum(r.packets_sent for r in plane0)
    return t.outcome(
        "congested_tier1" + ("_trim" if trim else ""),
        spray,
        {
            "hot_share": round(sum(r.packets_sent for r in hot_evs) / max(1, sent_plane0), 4),
            "hot_skips": sum(r.times_skipped for r in hot_evs),
            "other_skips": sum(r.times_skipped for r in plane0 if r not in hot_evs),
            "ce_marked": sum(p.counters["ce_marked"] for p in fab.ports()),
            "trimmed": sum(p.counters["trimmed"] for p in fab.ports()),
            "dropped_queue": sum(p.counters["dropped_queue"] for p in fab.ports()),
            "trim_to_rtx_max": round(max(trim_to_rtx, default=0.0), 6),
            "trim_to_rtx_count": len(trim_to_rtx),
            "srtt_plane0": t.session.paths.planes[0].rtt.srtt,
        },
    )


SCENARIOS: dict[str, Callable[[str], Outcome]] = {
    "ev_loss": ev_loss,
    "tier1_failure": tier1_failure,
    "host_link_down": host_link_down,
    "flap": flap,
    "receiver_stall": receiver_stall,
    "congested_tier1": congested_tier1,
    # A tenth of its share and a 24 KB buffer: the queue overflows and trims.
    "congested_tier1_trim": lambda spray: congested_tier1(
        spray, trim=True, rate=100e6, queue=24_000
    ),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mrc.experiments.scenarios",
        description="Run the multipath scenarios under each spray policy and compare.",
    )
    ap.add_argument("--spray", default="all", help="a policy name or 'all'")
    ap.add_argument("--scenario", default="all", help=f"one of {', '.join(SCENARIOS)} or 'all'")
    ap.add_argument("-J", "--json", action="store_true", help="one JSON document")
    args = ap.parse_args(argv)
    sprays = spray_names() if args.spray == "all" else [args.spray]
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    for n in names:
        if n not in SCENARIOS:
            print(f"scenarios: unknown scenario {n!r}", file=sys.stderr)
            return 2
    for s in sprays:
        if s not in spray_names():
            print(f"scenarios: unknown spray policy {s!r}", file=sys.stderr)
            return 2
    rows = [SCENARIOS[n](s).row() for n in names for s in sprays]
    if args.json:
        json.dump({"results": rows}, sys.stdout, indent=2, default=str)
        print()
        return 0
    head = f"{'scenario':<22}{'spray':<10}{'done':>6}{'Gbit/s':>8}{'ok':>4}"
    head += f"{'retired':>8}{'restored':>9}{'down':>5}{'stall ms':>9}{'rtx':>7}{'probes':>7}"
    print(head)
    for r in rows:
        print(
            f"{r['scenario']:<22}{r['spray']:<10}{r['seconds']:>6.3f}"
            f"{r['goodput_bps'] / 1e9:>8.3f}{'y' if r['intact'] else 'N':>4}"
            f"{r['retired']:>8}{r['restored']:>9}{len(r['planes_down']):>5}"
            f"{r['longest_stall'] * 1e3:>9.2f}{sum(r['retransmits'].values()):>7}"
            f"{r['probes_sent']:>7}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

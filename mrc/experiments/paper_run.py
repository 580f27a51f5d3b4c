"""One run of a paper experiment: a multi-plane Clos, a set of flows, MRC or the RoCE baseline.

What it holds: `Scale` (hosts, planes, tier-1 count, link rate and latency, flow size: the knobs
that take an experiment from 16 hosts in a test to 1,024 × 8 planes), `Flow`, `Run` (the
fabric of one protocol with its flows started: MRC sessions through mrc.core, or RoCE queue
pairs from mrc.sim.roce_host, one per plane per flow), progress sampling, and `RunResult`, the plain
numbers a run leaves: per-flow bytes, completion and failure times, goodput samples, drops,
trims, retransmissions and EVs retired.

Both protocols get the same fabric: every link `scale.rate` with a 5 × BDP buffer and ECN
marking above one BDP on every switch port. MRC's switches trim a packet that meets a full
queue (its deployment, docs/WIRE.md §5); the RoCE baseline's switches drop it, since a trimmed
RoCE packet would be nothing but a corrupt one.

What it leaves to others: the experiments' faults and verdicts (paper_experiments.py), the
command line, the pool and the table (paper.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.config import SessionConfig
from ..core.events import ConnectionEstablished, Event, WriteCompleted
from ..core.session import Session
from ..sim.fabric import Clos
from ..sim.link import LinkParams
from ..sim.network import Host, Network
from ..sim.roce import RoceParams, RoceReceiver, RoceSender
from ..sim.roce_host import RoceHost, RoceNetwork, connect_roce
from ..sim.topology import clos
from .scenarios import _REPLY, _config

MiB = 1 << 20
PROTOCOLS = ("mrc", "roce")
#: Header bytes a full data packet carries on top of its payload, both protocols (about an
#: mrc data header; the RoCE baseline pads to the same order, roce.HEADER).
_PACKET = 4096 + 64


@dataclass(frozen=True, slots=True)
class Scale:
    """The fabric and workload size of a run."""

    hosts: int = 32
    planes: int = 4
    tier1: int = 4
    hosts_per_rack: int = 8
    #: Every link's rate (one plane of a NIC), bit/s, and one-way latency per link.
    rate: float = 10e9
    latency: float = 1e-6
    flow_bytes: int = 2 * MiB
    seed: int = 1

    def validate(self) -> Scale:
        if self.hosts < 2 or self.planes < 1 or self.tier1 < 1 or self.hosts_per_rack < 1:
            raise ValueError("paper: need at least 2 hosts and one plane, tier-1, host per rack")
        if self.hosts % self.hosts_per_rack:
            raise ValueError(
                f"paper: {self.hosts} hosts do not fill racks of {self.hosts_per_rack}"
            )
        if self.planes > 256:
            raise ValueError("paper: an EV has 8 bits of plane (at most 256 planes)")
        if self.racks < 2:
            raise ValueError("paper: need at least two racks (traffic crosses tier-1)")
        if self.rate <= 0 or self.latency < 0 or self.flow_bytes < 4096:
            raise ValueError("paper: rate must be positive, flows at least one packet")
        return self

    @property
    def racks(self) -> int:
        return self.hosts // self.hosts_per_rack

    @property
    def base_rtt(self) -> float:
        """Four links each way, one full data packet's serialisation per link out."""
        return 8 * self.latency + 4 * _PACKET * 8 / self.rate + 4 * 100 * 8 / self.rate

    @property
    def bdp(self) -> float:
        return self.rate / 8 * self.base_rtt

    @property
    def host_rate(self) -> float:
        return self.rate * self.planes

    @property
    def ideal_seconds(self) -> float:
        """One flow alone at the host's full line rate."""
        return self.flow_bytes * 8 / self.host_rate

    @property
    def rto(self) -> float:
        """Both protocols' minimum retransmission timeout: four base RTTs (MRC's queues stay
        under one with NSCC), at least 20 µs."""
        return max(20e-6, 4 * self.base_rtt)

    @property
    def roce_rto(self) -> float:
        """The RoCE baseline's fixed timeout: above the worst queueing a path can hold (four
        5 × BDP queues, 20 base RTTs), as a NIC's timeout is set above the fabric's; a
        shorter one times out on mere queueing and, with go-back-N, feeds it."""
        return 25 * self.base_rtt


@dataclass(frozen=True, slots=True)
class Flow:
    src: int
    dst: int
    size: int
    start: float = 0.0


def permutation(scale: Scale) -> list[Flow]:
    """Host i sends to host i + hosts/2: every flow crosses tier-1, every host sends once and
    receives once."""
    n = scale.hosts
    return [Flow(i, (i + n // 2) % n, scale.flow_bytes) for i in range(n)]


@dataclass
class RunResult:
    proto: str
    #: Per flow: bytes acknowledged, completion time (None: not done), failure time.
    acked: list[int]
    done_at: list[float | None]
    failed_at: list[float | None]
    sizes: list[int]
    end: float
    #: (time, bytes acknowledged per flow) every `sample_every` seconds.
    samples: list[tuple[float, list[int]]]
    #: Bytes the receivers hold, in all (new placements only).
    placed: int
    drops: int
    trims: int
    retransmits: int
    evs_retired: int
    detail: dict[str, Any] = field(default_factory=dict)

    def completed(self, flows: list[int] | None = None) -> bool:
        idx = range(len(self.sizes)) if flows is None else flows
        return all(self.done_at[i] is not None for i in idx)

    def rate(self, i: int, t0: float, t1: float) -> float:
        """Flow i's goodput (bit/s) between two sample times nearest t0 and t1."""
        pts = [(t, b[i]) for t, b in self.samples if t0 <= t <= t1]
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return 0.0
        return (pts[-1][1] - pts[0][1]) * 8 / (pts[-1][0] - pts[0][0])

    def goodput(self, i: int) -> float:
        """Flow i's bytes over its own lifetime (to completion, or to the end of the run)."""
        end = self.done_at[i]
        t = (end if end is not None else self.end) or 0.0
        return self.acked[i] * 8 / t if t > 0 else 0.0

    def aggregate(self, t0: float, t1: float) -> float:
        """Every flow's goodput together between t0 and t1 (bit/s)."""
        return sum(self.rate(i, t0, t1) for i in range(len(self.sizes)))

    def makespan(self) -> float:
        return max((t for t in self.done_at if t is not None), default=self.end)


def _constant(reply: bytes) -> Callable[[bytes], bytes]:
    """An accept function that answers every REQUEST with the same REPLY private data."""

    def accept(_private_data: bytes) -> bytes:
        return reply

    return accept


class Run:
    """A fabric with its flows started, for one protocol."""

    def __init__(self, proto: str, scale: Scale, flows: list[Flow]) -> None:
        if proto not in PROTOCOLS:
            raise ValueError(f"paper: unknown protocol {proto!r} (one of {', '.join(PROTOCOLS)})")
        self.proto, self.scale, self.flows = proto, scale.validate(), flows
        for f in flows:
            if not (0 <= f.src < scale.hosts and 0 <= f.dst < scale.hosts) or f.src == f.dst:
                raise ValueError(f"paper: flow {f.src} -> {f.dst} is not between two hosts")
        self.net: Network = Network(scale.seed) if proto == "mrc" else RoceNetwork(scale.seed)
        link = LinkParams(rate_bps=scale.rate, latency=scale.latency,
                          queue_bytes=int(5 * scale.bdp))  # fmt: skip
        self.fab: Clos = clos(
            self.net, planes=scale.planes, racks=scale.racks,
            hosts_per_rack=scale.hosts_per_rack, tier1=scale.tier1, host_link=link,
            fabric_link=link, ecn_threshold=int(scale.bdp), trim=proto == "mrc",
        )  # fmt: skip
        for host in self.fab.hosts:
            # A NIC holds what its transport hands it (a real one pushes back rather than
            # drop): the switches' queues are the subject.
            for nic in host.links.values():
                nic.params = replace(nic.params, queue_bytes=1 << 30)
        self.samples: list[tuple[float, list[int]]] = []
        #: MRC flows' completion times (the last WriteCompleted); RoCE's come from its QPs.
        self._mrc_done: list[float | None] = [None] * len(flows)
        self._cursor = 0
        self.sessions: list[Session] = []
        self.qps: list[list[tuple[RoceSender, RoceReceiver]]] = []
        if proto == "mrc":
            self._start_mrc()
        else:
            self._start_roce()

    @property
    def hosts(self) -> list[Host]:
        return self.fab.hosts

    # -- MRC -------------------------------------------------------------------------------

    def mrc_config(self) -> SessionConfig:
        s = self.scale
        config = _config(
            "bitmap", s.planes, cc="nscc", max_inflight=None, plane_paths=self.fab.plane_paths,
            cc_plane_rate=s.rate, cc_base_rtt=s.base_rtt,
        )  # fmt: skip
        return replace(config, min_rto=s.rto, reorder_min=2 * s.base_rtt).validate()

    def _start_mrc(self) -> None:
        config = self.mrc_config()
        msg = 256 << 10
        biggest = max(f.size for f in self.flows)
        # The runs count bytes (bytes_placed, bytes_acked), they do not compare contents: every
        # host registers the same two buffers, one that every flow reads and one that every
        # flow writes, so memory stays two flows' worth at 1,024 hosts.
        source, sink = bytearray(biggest), bytearray(biggest)
        for host in self.hosts:
            scratch = host.regions.register(sink, prefault_pages=False)
            reply = _REPLY.pack(scratch.base_va, scratch.rkey)
            host.listen(config, accept=_constant(reply))
        sources = {f.src: self.hosts[f.src].regions.register(source, prefault_pages=False)
                   for f in self.flows}  # fmt: skip
        by_qpn: dict[tuple[str, int], int] = {}
        completed = [0] * len(self.flows)
        done_at = self._mrc_done
        messages = [-(-f.size // msg) for f in self.flows]

        def on_event(host: Host, session: Session, event: Event) -> None:
            i = by_qpn.get((host.name, session.qpn))
            if i is None:
                return
            if isinstance(event, ConnectionEstablished):
                va, rkey = _REPLY.unpack(event.private_data)
                size = self.flows[i].size
                for off in range(0, size, msg):
                    session.post_write(sources[self.flows[i].src], off, min(msg, size - off),
                                       va + off, rkey)  # fmt: skip
            elif isinstance(event, WriteCompleted):
                completed[i] += 1
                if completed[i] == messages[i]:
                    done_at[i] = host.net.now

        self.sessions = []
        for i, f in enumerate(self.flows):
            src = self.hosts[f.src]
            session = src.connect(self.hosts[f.dst], config, on_event=on_event)
            by_qpn[(src.name, session.qpn)] = i
            self.sessions.append(session)

    # -- RoCE ------------------------------------------------------------------------------

    def _start_roce(self) -> None:
        s = self.scale
        params = RoceParams(line_rate=s.rate, rto=s.roce_rto)
        hash_rng = random.Random(s.seed * 7919 + 1)
        for f in self.flows:
            a, b = self.hosts[f.src], self.hosts[f.dst]
            assert isinstance(a, RoceHost) and isinstance(b, RoceHost)
            # One QP per plane (as a RoCE job spreads a NIC's ports), each with one ECMP hash:
            # one path per QP, the flow's bytes split evenly.
            share = -(-f.size // s.planes)
            pairs = []
            for plane in range(s.planes):
                size = min(share, f.size - plane * share)
                if size <= 0:
                    break
                ev = plane << 24 | hash_rng.randrange(1, 1 << 24)
                pairs.append(connect_roce(a, b, size, params, plane=plane, ev=ev))
            self.qps.append(pairs)

    # -- per flow --------------------------------------------------------------------------

    def acked(self, i: int) -> int:
        if self.proto == "mrc":
            return self.sessions[i].stats.bytes_acked
        return sum(q.acked_bytes for q, _ in self.qps[i])

    def done_at(self, i: int) -> float | None:
        if self.proto == "mrc":
            return self._mrc_done[i]
        times = [q.done_at for q, _ in self.qps[i]]
        return None if any(t is None for t in times) else max(t or 0.0 for t in times)

    def failed_at(self, i: int) -> float | None:
        """When flow i failed for good (an MRC session closed, a RoCE QP in error)."""
        if self.done_at(i) is not None:
            return None
        if self.proto == "mrc":
            return self.net.now if self.sessions[i].is_closed else None
        return min((q.failed_at for q, _ in self.qps[i] if q.failed_at is not None), default=None)

    def _all_acked(self) -> list[int]:
        return [self.acked(i) for i in range(len(self.flows))]

    # -- running ---------------------------------------------------------------------------

    def finished(self) -> bool:
        # Called after every event: a flow that is done or failed stays so, so scan onward
        # from the first one that was not.
        i, n = self._cursor, len(self.flows)
        while i < n and (self.done_at(i) is not None or self.failed_at(i) is not None):
            i += 1
        self._cursor = i
        return i == n

    def sample_every(self, interval: float) -> None:
        def tick() -> None:
            self.samples.append((self.net.now, self._all_acked()))
            if not self.finished():
                self.net.at(self.net.now + interval, tick)

        self.net.at(0.0, tick)

    def run(self, timeout: float) -> RunResult:
        self.net.drive_until(self.finished, timeout=timeout)
        self.samples.append((self.net.now, self._all_acked()))
        return self.result()

    def result(self) -> RunResult:
        n = len(self.flows)
        ports = list(self.fab.ports())
        switch_drops = sum(p.counters["dropped_queue"] + p.counters["dropped_down"] for p in ports)
        nics = [lk for h in self.hosts for lk in h.links.values()]
        host_drops = sum(
            c["dropped_down"] + c["dropped_loss"] + c["dropped_filter"]
            for c in (lk.counters for lk in nics)
        )
        if self.proto == "mrc":
            placed = sum(
                s.stats.bytes_placed for h in self.hosts for s in h.endpoint.sessions.values()
            )
            rtx = sum(s.stats.retransmits for s in self.sessions)
            retired = sum(
                r.times_retired for s in self.sessions for r in s.paths.evs.by_ev.values()
            )
        else:
            placed = sum(r.bytes_placed for pairs in self.qps for _, r in pairs)
            rtx = sum(q.retransmitted for pairs in self.qps for q, _ in pairs)
            retired = 0
        return RunResult(
            proto=self.proto,
            acked=self._all_acked(),
            done_at=[self.done_at(i) for i in range(n)],
            failed_at=[self.failed_at(i) for i in range(n)],
            sizes=[f.size for f in self.flows],
            end=self.net.now,
            samples=self.samples,
            placed=placed,
            drops=switch_drops + host_drops,
            trims=sum(p.counters["trimmed"] for p in ports),
            retransmits=rtx,
            evs_retired=retired,
        )

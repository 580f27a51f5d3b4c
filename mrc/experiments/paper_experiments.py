"""The MRC paper's experiments as simulator runs, for MRC and for the RoCE baseline.

What it holds: one function per experiment, `(proto, scale) -> metrics`, each building a
`paper_run.Run`, injecting the experiment's fault at a time fixed relative to the flows'
ideal duration, and reducing the run to plain numbers (JSON-able): the experiment's key figure
`share` (the affected flows' goodput against their goodput in the fault-free run, or against
line rate where the paper states it so), completion, failures, bytes lost, and what the
experiment itself measures. `EXPERIMENTS` names them; `reference` runs the fault-free
permutation and `victim_alone` the incast's victim without the incast, which the shares are
taken against.

The faults (paper numbers in protocol digest terms: the OpenAI MRC paper, §5):
`ev_loss` 20 % loss on one EV of flow 0 (RoCE: on its plane-0 QP's one path); `nic_down`
host 0's plane-0 link cut (carrier loss); `nic_flap` half of host 0's plane links flapping;
`t0t1_downs` T0–T1 links going down one after another, silently; `t0t1_flaps` T0–T1 links
flapping together; `tier0_lost` rack 0's tier-0 switch of plane 0 (its hosts see carrier
loss); `tier1_lost` tier-1 #0 of plane 0, silently; `loss1` 1 % random loss on every host
link; `incast` 7 senders to one host beside a victim flow into the same rack.

What it leaves to others: fabrics and protocol drivers (paper_run.py), verdicts, the pool and
the table (paper_verdict.py, paper.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..core.events import PathRetired
from ..sim.fabric import Switch
from ..sim.roce import DATA
from ..sim.roce_host import RoceHost
from .paper_run import Flow, Run, RunResult, Scale, permutation
from .scenarios import packet_ev

Metrics = dict[str, Any]

#: Faults start this far into a flow's ideal duration (after MRC's handshake and ramp).
FAULT_AT = 0.3
#: The fault-free permutation: the reference for every share.
REFERENCE = "reference"
#: The incast's victim flow alone on the same fabric.
VICTIM_ALONE = "victim_alone"


def _timeout(scale: Scale) -> float:
    # Long enough for RoCE QPs to exhaust their retries on a dead path, and for slow
    # completions under loss: every run ends when all its flows are done or failed.
    return max(200 * scale.ideal_seconds, 40 * scale.roce_rto)


def _summary(run: Run, res: RunResult, affected: list[int], t0: float) -> Metrics:
    """What every experiment reports, `affected` flows' rates measured from `t0`."""
    total = sum(res.sizes)
    end = res.makespan()
    rates = []
    for i in affected:
        done = res.done_at[i]
        stop = done if done is not None else res.end
        rates.append(res.rate(i, t0, stop))
    return {
        "proto": run.proto,
        "flows": len(res.sizes),
        "completed": sum(d is not None for d in res.done_at),
        "failed": sum(f is not None for f in res.failed_at),
        "bytes_lost": total - res.placed,
        "makespan": end,
        "first_done": min((d for d in res.done_at if d is not None), default=res.end),
        "aggregate_bps": sum(res.acked) * 8 / end if end > 0 else 0.0,
        "affected": affected,
        "affected_bps": rates,
        "drops": res.drops,
        "trims": res.trims,
        "retransmits": res.retransmits,
        "evs_retired": res.evs_retired,
        "flow_bps": [res.goodput(i) for i in range(len(res.sizes))],
        "steady_bps": [
            res.rate(i, FAULT_AT * (res.done_at[i] or res.end), res.done_at[i] or res.end)
            for i in range(len(res.sizes))
        ],
        "series": _series(res, affected),
        "failed_flows": [i for i, f in enumerate(res.failed_at) if f is not None],
        # Neither done nor failed when the run ended: the network went quiet (no timer left)
        # or the run's timeout passed with the flow still going.
        "unfinished": [
            i for i, (d, f) in enumerate(zip(res.done_at, res.failed_at, strict=True))
            if d is None and f is None
        ],
        "ended_at": res.end,
        # Each RoCE QP's one path: (plane, tier-1 route), the route its EV hashes to.
        "routes": [
            [(q_plane(run, q.qpn, f), run.fab.route_of(ev_of(run, q.qpn, f))) for q, _ in pairs]
            for f, pairs in zip(run.flows, run.qps, strict=True)
        ]
        if run.proto == "roce"
        else [],
    }


def ev_of(run: Run, qpn: int, flow: Flow) -> int:
    """The EV (plane and ECMP hash) of the RoCE QP `qpn` of `flow`'s sender."""
    host = run.hosts[flow.src]
    assert isinstance(host, RoceHost)
    return host.routes[qpn][2]


def q_plane(run: Run, qpn: int, flow: Flow) -> int:
    return ev_of(run, qpn, flow) >> 24


def _series(res: RunResult, affected: list[int]) -> list[tuple[float, float, float]]:
    """(time, aggregate bit/s, affected flows' bit/s) between consecutive samples, for plots."""
    out = []
    for (t0, b0), (t1, b1) in zip(res.samples, res.samples[1:], strict=False):
        if t1 <= t0:
            continue
        agg = (sum(b1) - sum(b0)) * 8 / (t1 - t0)
        aff = sum(b1[i] - b0[i] for i in affected) * 8 / (t1 - t0)
        out.append((round(t1, 9), agg, aff))
    return out


def _go(run: Run, scale: Scale) -> RunResult:
    run.sample_every(scale.ideal_seconds / 40)
    return run.run(_timeout(scale))


def reference(proto: str, scale: Scale) -> Metrics:
    run = Run(proto, scale, permutation(scale))
    res = _go(run, scale)
    return _summary(run, res, list(range(scale.hosts)), 0.0)


def ev_loss(proto: str, scale: Scale, loss: float = 0.2) -> Metrics:
    """20 % loss on one EV of one long flow, alone on the fabric (the paper's testbed run);
    RoCE: on the one path of its plane-0 QP. The share is its goodput from the first loss on
    against the host's line rate."""
    n = scale.hosts
    run = Run(proto, scale, [Flow(0, n // 2, 8 * scale.flow_bytes)])
    net, host = run.net, run.hosts[0]
    victim: list[int] = []
    drops: list[float] = []

    def drop(data: bytes) -> bool:
        if proto == "mrc":
            ev = packet_ev(data) if 0xC6 <= data[0] <= 0xCB else 0
            if not victim and ev:
                victim.append(ev)  # the first EV that carries data on plane 0
            hit = bool(victim) and packet_ev(data) == victim[0]
        else:
            hit = data[0] == DATA
        if hit and net.rng.random() < loss:
            drops.append(net.now)
            return True
        return False

    host.links[0].params.drop_if = drop
    res = _go(run, scale)
    m = _summary(run, res, [0], drops[0] if drops else 0.0)
    m["line_share"] = m["affected_bps"][0] / scale.host_rate
    m["victim_drops"] = len(drops)
    if proto == "mrc" and victim and drops:
        retired = [t for t, _, e in host.events if isinstance(e, PathRetired) and e.ev == victim[0]]
        m["retired_after"] = retired[0] - drops[0] if retired else None
        m["victim_times_retired"] = run.sessions[0].paths.evs.by_ev[victim[0]].times_retired
    return m


def nic_down(proto: str, scale: Scale) -> Metrics:
    """Host 0's plane-0 NIC link is cut (both ends see carrier loss) and stays down."""
    run = Run(proto, scale, permutation(scale))
    t = FAULT_AT * scale.ideal_seconds
    run.net.set_link(run.hosts[0], 0, False, at=t, notify=True)
    res = _go(run, scale)
    into0 = next(i for i, f in enumerate(run.flows) if f.dst == 0)
    m = _summary(run, res, [0, into0], t + 2 * scale.base_rtt)
    m["fault_at"] = t
    m["expected_share"] = (scale.planes - 1) / scale.planes
    return m


def nic_flap(proto: str, scale: Scale) -> Metrics:
    """Half of host 0's plane links (4 of 8 at paper scale) flap together until the end."""
    run = Run(proto, scale, permutation(scale))
    t = FAULT_AT * scale.ideal_seconds
    period = scale.ideal_seconds / 4
    flapping = max(1, scale.planes // 2)
    for plane in range(flapping):
        run.net.flap(run.hosts[0], plane, start=t, period=period, count=400, notify=True)
    res = _go(run, scale)
    m = _summary(run, res, [0], t)
    m["fault_at"] = t
    m["flapping_planes"] = flapping
    return m


def _t0t1_links(run: Run, n: int) -> list[tuple[Switch, Switch]]:
    """`n` distinct T0–T1 cables spread over planes, racks and tier-1s (deterministic)."""
    fab = run.fab
    cables = [(fab.tier0[p][r], fab.tier1[p][k]) for k in range(fab.paths_per_plane)
              for r in range(fab.racks) for p in range(fab.planes)]  # fmt: skip
    stride = 7 if len(cables) % 7 else 5
    return [cables[(i * stride) % len(cables)] for i in range(n)]


def fabric_faults(scale: Scale, paper: int) -> int:
    """How many T0–T1 cables a run fails: the paper's count when the fabric has 8× as many,
    else an eighth of them (20 of 64 would cut a third of a small fabric)."""
    total = scale.planes * scale.racks * scale.tier1
    return min(paper, max(1, total // 8))


def t0t1_downs(proto: str, scale: Scale) -> Metrics:
    """T0–T1 links (20 at paper scale) go down one after another, silently, and stay down."""
    run = Run(proto, scale, permutation(scale))
    n = fabric_faults(scale, 20)
    t = FAULT_AT * scale.ideal_seconds
    gap = scale.ideal_seconds / 2 / n
    cables = _t0t1_links(run, n)
    for i, (a, b) in enumerate(cables):
        run.fab.set_link(a, b, False, at=t + i * gap, notify=False)
    res = _go(run, scale)
    m = _summary(run, res, list(range(scale.hosts)), t)
    m["cables"] = [(a.plane, a.index, b.index) for a, b in cables]
    m["fault_at"] = t
    m["links_down"] = n
    m["links_total"] = scale.planes * scale.racks * scale.tier1
    return m


def t0t1_flaps(proto: str, scale: Scale) -> Metrics:
    """T0–T1 links (8 at paper scale) flap together, silently, until the end."""
    run = Run(proto, scale, permutation(scale))
    n = fabric_faults(scale, 8)
    t = FAULT_AT * scale.ideal_seconds
    cables = _t0t1_links(run, n)
    for a, b in cables:
        run.fab.flap(a, b, start=t, period=scale.ideal_seconds / 4, count=400, notify=False)
    res = _go(run, scale)
    m = _summary(run, res, list(range(scale.hosts)), t)
    m["cables"] = [(a.plane, a.index, b.index) for a, b in cables]
    m["fault_at"] = t
    m["links_flapping"] = n
    m["links_total"] = scale.planes * scale.racks * scale.tier1
    return m


def tier0_lost(proto: str, scale: Scale) -> Metrics:
    """Rack 0's tier-0 switch of plane 0 dies; its hosts see their plane-0 link go dark."""
    run = Run(proto, scale, permutation(scale))
    t = FAULT_AT * scale.ideal_seconds
    run.fab.set_switch(run.fab.tier0[0][0], False, at=t, notify=True)
    rack0 = {h.name for h in run.fab.rack(0)}
    names = [h.name for h in run.hosts]
    affected = [
        i for i, f in enumerate(run.flows) if names[f.src] in rack0 or names[f.dst] in rack0
    ]
    res = _go(run, scale)
    m = _summary(run, res, affected, t + 2 * scale.base_rtt)
    m["fault_at"] = t
    m["expected_share"] = (scale.planes - 1) / scale.planes
    m["unaffected_bps"] = [
        res.rate(i, t, res.done_at[i] or res.end) for i in range(len(run.flows))
        if i not in affected
    ]  # fmt: skip
    return m


def tier1_lost(proto: str, scale: Scale) -> Metrics:
    """Tier-1 #0 of plane 0 dies silently (nobody is told)."""
    run = Run(proto, scale, permutation(scale))
    t = FAULT_AT * scale.ideal_seconds
    run.fab.set_switch(run.fab.tier1[0][0], False, at=t, notify=False)
    res = _go(run, scale)
    m = _summary(run, res, list(range(scale.hosts)), t)
    m["fault_at"] = t
    m["capacity_left"] = 1 - 1 / (scale.planes * scale.tier1)
    return m


def loss1(proto: str, scale: Scale, loss: float = 0.01) -> Metrics:
    """1 % random loss on every host's link of every plane (data and acknowledgements).

    Measured at 1,024 hosts x 8 planes (2026-11-24): per flow 0.40 of line rate, to the last
    flow 0.18. Every flow has 99 % of its bytes acknowledged at about the same time (467 µs
    mean, the same for the slowest 1 %); the slowest 10 % then wait 232 µs (the slowest 1 %,
    465 µs) for their last packets, by RTO (about 166 µs, up to 501 µs backed off), where the
    rest wait 12-41 µs: tail losses, MRC behaviour. Two things stretch it: (1) a simulator
    artefact, the host's one FIFO for data and SACKs (measured base RTT 40 µs against 21.6,
    RTO 163 µs; with control packets first, as in tools/htsim, 21.4 µs and 87 µs, half the
    retransmissions, to the last flow 0.24); (2) the bulk itself ran at about 0.45 even
    without loss (128 hosts: p50 490 µs lossless), because every connection's 16 active EVs
    per plane sat on paths 0-15 of the plane's 32, so half the tier-1s carried everything.
    Since each connection's active EVs start at its own path offset (docs/DESIGN.md §4),
    measured 2026-11-28 at 1,024 hosts x 8 planes: to the last flow 0.41 (was 0.20 in the
    same pair of runs), per flow 0.64 (was 0.40), last flow done at 516 µs (was 1,036)."""
    run = Run(proto, scale, permutation(scale))
    for host in run.hosts:
        for link in host.links.values():
            link.params.loss = loss
    res = _go(run, scale)
    m = _summary(run, res, list(range(scale.hosts)), 0.0)
    m["share_of"] = "aggregate goodput / line rate"
    m["line_share"] = m["aggregate_bps"] / (scale.host_rate * scale.hosts)
    # What one flow sees on average (the paper's testbed measure); the aggregate above is
    # what a collective sees, ending with its slowest flow.
    m["mean_flow_share"] = sum(m["flow_bps"]) / len(m["flow_bps"]) / scale.host_rate
    return m


def _incast_flows(scale: Scale) -> tuple[list[Flow], int]:
    """Seven senders (or as many as fit) into the last host, and a victim flow from another
    host into the same rack; returns the flows and the victim's index."""
    rx = scale.hosts - 1
    rx_rack = rx // scale.hosts_per_rack
    others = [h for h in range(scale.hosts) if h // scale.hosts_per_rack != rx_rack]
    if len(others) < 2 or scale.hosts_per_rack < 2:
        raise ValueError("paper: incast needs two racks of two hosts and a victim outside")
    senders = others[: min(7, len(others) - 1)]
    victim_src = others[len(senders)]
    flows = [Flow(s, rx, scale.flow_bytes) for s in senders]
    flows.append(Flow(victim_src, rx - 1, 2 * scale.flow_bytes))
    return flows, len(flows) - 1


def incast(proto: str, scale: Scale) -> Metrics:
    """7 → 1 incast beside a victim flow into the receiver's rack."""
    flows, v = _incast_flows(scale)
    run = Run(proto, scale, flows)
    res = _go(run, scale)
    incast_end = max((res.done_at[i] or res.end) for i in range(v))
    m = _summary(run, res, [v], 0.0)
    stop = min(incast_end, res.done_at[v] or res.end)
    m["victim_bps"] = res.rate(v, scale.ideal_seconds * FAULT_AT, stop)
    m["incast_senders"] = v
    m["incast_end"] = incast_end
    return m


def victim_alone(proto: str, scale: Scale) -> Metrics:
    flows, v = _incast_flows(scale)
    run = Run(proto, scale, [flows[v]])
    res = _go(run, scale)
    m = _summary(run, res, [0], 0.0)
    stop = res.done_at[0] or res.end
    m["victim_bps"] = res.rate(0, scale.ideal_seconds * FAULT_AT, stop)
    return m


EXPERIMENTS: dict[str, Callable[[str, Scale], Metrics]] = {
    REFERENCE: reference,
    "ev_loss": ev_loss,
    "nic_down": nic_down,
    "nic_flap": nic_flap,
    "t0t1_downs": t0t1_downs,
    "t0t1_flaps": t0t1_flaps,
    "tier0_lost": tier0_lost,
    "tier1_lost": tier1_lost,
    "loss1": loss1,
    "incast": incast,
    VICTIM_ALONE: victim_alone,
}


def run_one(name: str, proto: str, scale: Scale) -> Metrics:
    """One experiment for one protocol (what a pool worker runs)."""
    fn = EXPERIMENTS.get(name)
    if fn is None:
        raise ValueError(f"paper: unknown experiment {name!r}")
    m = fn(proto, replace(scale))
    m["experiment"] = name
    return m

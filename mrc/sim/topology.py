"""Fabric shapes for the simulator, at any scale: the MRC multi-plane Clos and htsim's fat trees.

What it holds:

- `FabricSpec`, a frozen description of a fabric: `hosts`, `planes` (independent, one NIC link
  per host per plane), `hosts_per_rack` (one tier-0 switch per rack per plane), `tier1` (per
  plane in a 2-tier Clos; per pod in a 3-tier fat tree), and for a fat tree `racks_per_pod` and
  `tier2` (core switches per plane); link parameters per tier (`host_link`, `fabric_link`,
  `core_link`), the switch ports' `ecn_threshold`, `trim`, `trim_size`, and whether control
  packets go ahead of data (`control_priority`). Its properties count
  what `build` makes (`switches_per_plane`, `cables_per_plane`, `paths_per_plane`).
- `mrc_fabric(...)`: the MRC shape (docs/DESIGN.md §5): N planes, each a 2-tier Clos.
- `read_htsim_topo(path)`: a `FabricSpec` from an htsim `.topo` file (the `Nodes / Tiers /
  Podsize / Tier n` format of htsim's `topologies/`, e.g. `fat_tree_1024.topo`); errors are one
  line (`TopologyError`).
- `build(net, spec) -> Fabric`: hosts `h0..h{hosts-1}` and every switch and cable on `net`;
  `handlers` gives hosts by name the event handler they are built with.
  `Fabric` is a `fabric.Clos` (so failures, `link()`, `set_switch()` work the same) plus the
  fat tree's `tier2` and the `spec`. `clos(...)`, the small two-tier Clos of tests and
  experiments, is `build` of a one-pod spec.

Names: `p{plane}.t0.r{rack}`, `p{plane}.t1.{i}` (2-tier) or `p{plane}.t1.{pod}.{i}` (3-tier),
`p{plane}.t2.{i}`. Routing stays static and source-chosen (docs/DESIGN.md §4): tier-0 sends a
packet for its rack down, anything else up to tier-1 `selector mod tier1`; a fat tree's tier-1
sends a packet for its pod down, anything else up to its core `(selector // tier1) mod
(tier2 / tier1)`. So a 2-tier plane has `tier1` paths between racks and a fat tree's plane `tier2`
paths between pods, and `selector mod paths_per_plane` names one path exactly.

What it leaves to others: packet handling (switches and ports: fabric.py; links and their
train queues: link.py; hosts and the event loop: network.py), the protocol (mrc.core), and
experiments (mrc.experiments).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..switchq import MIN_TRIM_SIZE
from .fabric import Clos, Port, Switch
from .link import Link, LinkParams, TrainQueue
from .network import EventHook, Network


class TopologyError(ValueError):
    """A fabric that cannot be built, or a topology file that cannot be read (one line)."""


@dataclass(frozen=True, slots=True)
class FabricSpec:
    """A multi-plane fabric, 2-tier (`racks_per_pod` None) or a 3-tier fat tree."""

    hosts: int = 1024
    planes: int = 8
    hosts_per_rack: int = 32
    #: Tier-1 switches per plane (2-tier), or per pod (3-tier).
    tier1: int = 32
    #: 3-tier only: racks in a pod (each pod has its own `tier1` switches).
    racks_per_pod: int | None = None
    #: 3-tier only: core switches per plane; tier-1 switch i of every pod is cabled to cores
    #: i × (tier2 / tier1) … (i + 1) × (tier2 / tier1) - 1.
    tier2: int = 0
    #: Host–tier-0 cables (both directions).
    host_link: LinkParams = field(default_factory=LinkParams)
    #: Tier-0–tier-1 cables.
    fabric_link: LinkParams = field(default_factory=LinkParams)
    #: Tier-1–tier-2 cables; None = `fabric_link`.
    core_link: LinkParams | None = None
    #: Every switch port's ECN threshold (bytes queued), trimming and trim size (hosts' own
    #: NIC links neither mark nor trim).
    ecn_threshold: int | None = None
    trim: bool = False
    trim_size: int = 64
    #: Hosts' NIC links and every switch port serve control packets (SACK, NACK, CM: not MRC
    #: data) ahead of data, as htsim's NICs and switch queues do (link.py; needs
    #: `Network(trains=True)`). Off: one FIFO for everything.
    control_priority: bool = False

    def check(self) -> FabricSpec:
        """Return self, or raise TopologyError naming the first impossible field."""
        if self.hosts < 1 or self.hosts_per_rack < 1 or self.tier1 < 1:
            raise TopologyError("a fabric needs at least one host, host per rack and tier-1")
        if not 1 <= self.planes <= 256:
            raise TopologyError("planes must be 1..256 (an EV has 8 bits of plane)")
        if self.hosts % self.hosts_per_rack:
            raise TopologyError(
                f"{self.hosts} hosts do not fill racks of {self.hosts_per_rack}"
            )
        if self.trim and self.trim_size < MIN_TRIM_SIZE:
            raise TopologyError(f"trim_size must be at least {MIN_TRIM_SIZE} (docs/WIRE.md §5)")
        if self.racks_per_pod is None:
            if self.tier2:
                raise TopologyError("tier2 switches need pods (racks_per_pod)")
            return self
        if self.racks_per_pod < 1 or self.racks % self.racks_per_pod:
            raise TopologyError(f"{self.racks} racks do not fill pods of {self.racks_per_pod}")
        if self.tier2 < self.tier1 or self.tier2 % self.tier1:
            raise TopologyError(
                f"tier2 ({self.tier2}) must be a multiple of tier1 per pod ({self.tier1})"
            )
        return self

    @property
    def racks(self) -> int:
        return self.hosts // self.hosts_per_rack

    @property
    def pods(self) -> int:
        return 1 if self.racks_per_pod is None else self.racks // self.racks_per_pod

    @property
    def three_tier(self) -> bool:
        return self.racks_per_pod is not None

    @property
    def paths_per_plane(self) -> int:
        """Distinct routes between two hosts of different pods (2-tier: different racks)."""
        return self.tier2 if self.three_tier else self.tier1

    @property
    def switches_per_plane(self) -> int:
        return self.racks + self.pods * self.tier1 + self.tier2

    @property
    def cables_per_plane(self) -> int:
        """Full-duplex cables: hosts' own, tier-0–tier-1, tier-1–tier-2."""
        return self.hosts + self.racks * self.tier1 + self.pods * self.tier2


def mrc_fabric(
    hosts: int = 1024,
    planes: int = 8,
    hosts_per_rack: int = 32,
    tier1: int = 32,
    *,
    rate_bps: float = 100e9,
    latency: float = 1e-6,
    queue_bytes: int = 1 << 20,
    fabric_rate_bps: float | None = None,
    ecn_threshold: int | None = None,
    trim: bool = True,
    trim_size: int = 64,
) -> FabricSpec:
    """The MRC shape (docs/DESIGN.md §5): `planes` planes, each a 2-tier Clos with a tier-0 per
    rack and `tier1` tier-1 switches; every cable `latency` long, hosts' at `rate_bps`, the
    fabric's at `fabric_rate_bps` (default the same), every port `queue_bytes` deep."""
    host = LinkParams(rate_bps=rate_bps, latency=latency, queue_bytes=queue_bytes)
    fab = replace(host, rate_bps=fabric_rate_bps or rate_bps)
    return FabricSpec(
        hosts=hosts,
        planes=planes,
        hosts_per_rack=hosts_per_rack,
        tier1=tier1,
        host_link=host,
        fabric_link=fab,
        ecn_threshold=ecn_threshold,
        trim=trim,
        trim_size=trim_size,
    ).check()


# -- htsim's topology files ---------------------------------------------------------------


def _parse_topo(text: str, where: str) -> tuple[dict[str, int], list[dict[str, float]]]:
    """Global keys and one dict per `Tier n` section; every value is a number."""
    top: dict[str, int] = {}
    tiers: list[dict[str, float]] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TopologyError(f"{where}:{lineno}: expected 'Key value', got {line!r}")
        key, value = parts
        try:
            number = float(value)
        except ValueError:
            raise TopologyError(f"{where}:{lineno}: {key} needs a number, got {value!r}") from None
        if key == "Tier":
            if int(number) != len(tiers):
                raise TopologyError(f"{where}:{lineno}: expected Tier {len(tiers)}")
            tiers.append({})
        elif tiers:
            tiers[-1][key] = number
        else:
            top[key] = int(number)
    return top, tiers


def _link(tier: dict[str, float], queue_bytes: int, where: str, n: int) -> LinkParams:
    try:
        rate = tier["Downlink_speed_Gbps"] * 1e9
        latency = (tier["Downlink_Latency_ns"] + tier.get("Switch_Latency_ns", 0.0)) * 1e-9
    except KeyError as e:
        raise TopologyError(f"{where}: Tier {n} has no {e.args[0]}") from None
    if rate <= 0 or latency < 0:
        raise TopologyError(f"{where}: Tier {n} needs a positive speed and latency")
    return LinkParams(rate_bps=rate, latency=latency, queue_bytes=queue_bytes)


def read_htsim_topo(
    path: str | Path,
    *,
    planes: int = 1,
    queue_bytes: int = 1 << 20,
    ecn_threshold: int | None = None,
    trim: bool = True,
    trim_size: int = 64,
) -> FabricSpec:
    """A `FabricSpec` of the same shape as an htsim `.topo` file (2 or 3 tiers, not
    oversubscribed, Bundle 1): tier n's `Downlink_speed_Gbps` and `Downlink_Latency_ns` (plus
    its `Switch_Latency_ns`) become the cables below tier n. Queue sizes are htsim's command
    line, not the file's: pass `queue_bytes`."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TopologyError(f"{where}: cannot read ({e.__class__.__name__})") from None
    top, tiers = _parse_topo(text, where)
    try:
        nodes, ntiers = top["Nodes"], top["Tiers"]
    except KeyError as e:
        raise TopologyError(f"{where}: no {e.args[0]} line") from None
    podsize = top.get("Podsize", nodes)
    if ntiers not in (2, 3) or len(tiers) != ntiers:
        raise TopologyError(f"{where}: {ntiers} tiers with {len(tiers)} sections (need 2 or 3)")
    for n, tier in enumerate(tiers):
        if tier.get("Oversubscribed", 1) != 1 or tier.get("Bundle", 1) != 1:
            raise TopologyError(f"{where}: Tier {n} is oversubscribed or bundled (unsupported)")
        if "Radix_Down" not in tier or (n < ntiers - 1 and "Radix_Up" not in tier):
            raise TopologyError(f"{where}: Tier {n} needs Radix_Down (and Radix_Up below the top)")
    hosts_per_rack = int(tiers[0]["Radix_Down"])
    tier1 = int(tiers[0]["Radix_Up"])
    links = [_link(t, queue_bytes, where, n) for n, t in enumerate(tiers)]
    common = {
        "hosts": nodes,
        "planes": planes,
        "hosts_per_rack": hosts_per_rack,
        "tier1": tier1,
        "host_link": links[0],
        "fabric_link": links[1],
        "ecn_threshold": ecn_threshold,
        "trim": trim,
        "trim_size": trim_size,
    }
    if ntiers == 2:
        spec = FabricSpec(**common)  # type: ignore[arg-type]
    else:
        if podsize % hosts_per_rack or nodes % podsize:
            raise TopologyError(f"{where}: Podsize {podsize} does not fit racks and nodes")
        pods = nodes // podsize
        cores = pods * tier1 * int(tiers[1]["Radix_Up"]) // int(tiers[2]["Radix_Down"])
        spec = FabricSpec(
            racks_per_pod=podsize // hosts_per_rack,
            tier2=cores,
            core_link=links[2],
            **common,  # type: ignore[arg-type]
        )
    try:
        return spec.check()
    except TopologyError as e:
        raise TopologyError(f"{where}: {e}") from None


# -- building ---------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Fabric(Clos):
    """A built fabric: a `Clos` whose `tier1[plane]` lists every pod's tier-1 switches (pod by
    pod), plus `tier2[plane]` (empty in a 2-tier fabric) and the `spec` it was built from."""

    tier2: list[list[Switch]] = field(default_factory=list)
    spec: FabricSpec = field(default_factory=FabricSpec)

    @property
    def paths_per_plane(self) -> int:
        return self.spec.paths_per_plane

    def tier1_of(self, ev: int) -> Switch:
        """The tier-1 switch an EV's packets cross between racks (2-tier only: in a fat tree
        it depends on the pod)."""
        if self.spec.three_tier:
            raise TopologyError("a fat tree's tier-1 depends on the pod: use tier1[plane]")
        return Clos.tier1_of(self, ev)

    def switches(self) -> Iterator[Switch]:
        for plane in range(self.planes):
            yield from self.tier0[plane]
            yield from self.tier1[plane]
            if self.tier2:
                yield from self.tier2[plane]


def _register(net: Network, switches: list[Switch]) -> None:
    for sw in switches:
        if sw.name in net.switches:
            raise TopologyError(f"switch {sw.name} already exists on this network")
        net.switches[sw.name] = sw


def _trainq(to_host: bool, control_first: bool) -> TrainQueue | None:
    """The train queue a link is built with: one that puts control first, or none (made on
    first use, in FIFO order, by `Link.carry`)."""
    return TrainQueue(to_host, control_first=True) if control_first else None


def _cable(
    a: Switch, b: Switch, plane: int, params: LinkParams, *, uplink: bool, control_first: bool
) -> None:
    ab = a.ports[b.name] = Port(a, b, plane, replace(params), trainq=_trainq(False, control_first))
    ba = b.ports[a.name] = Port(b, a, plane, replace(params), trainq=_trainq(False, control_first))
    ab.reverse, ba.reverse = ba, ab
    if uplink:
        a.uplinks.append(ab)


def build(
    net: Network, spec: FabricSpec, *, handlers: Mapping[str, EventHook] | None = None
) -> Fabric:
    """Build `spec` on `net` (module docstring): hosts, switches, cables, static routes. Each
    host is built with its event handler in `handlers`, by name (a host not named has none)."""
    spec.check()
    if spec.control_priority and not net.trains:
        raise TopologyError("control_priority needs a network of packet trains (trains=True)")
    nic = replace(spec.host_link, ecn_threshold=None, trim=False)
    ecn, trim, trim_size = spec.ecn_threshold, spec.trim, spec.trim_size
    host_port = replace(spec.host_link, ecn_threshold=ecn, trim=trim, trim_size=trim_size)
    fabric_port = replace(spec.fabric_link, ecn_threshold=ecn, trim=trim, trim_size=trim_size)
    core_params = spec.core_link or spec.fabric_link
    core_port = replace(core_params, ecn_threshold=ecn, trim=trim, trim_size=trim_size)
    # Control ahead of data: every NIC link and switch port is built with a queue that does it.
    first = spec.control_priority
    names = [f"h{i}" for i in range(spec.hosts)]
    if any(name in net.hosts for name in names):
        raise TopologyError("the network already has hosts named h0, h1, …")
    on = handlers or {}
    hosts = [net.add_host(name, on.get(name)) for name in names]
    per_rack = spec.hosts_per_rack
    rack_of = {h.name: i // per_rack for i, h in enumerate(hosts)}
    rpp = spec.racks_per_pod or spec.racks
    t0s: list[list[Switch]] = []
    t1s: list[list[Switch]] = []
    t2s: list[list[Switch]] = []
    for plane in range(spec.planes):
        t0 = [Switch(f"p{plane}.t0.r{r}", plane, 0, r) for r in range(spec.racks)]
        if spec.three_tier:
            t1 = [
                Switch(f"p{plane}.t1.{pod}.{i}", plane, 1, i, route_div=spec.tier1)
                for pod in range(spec.pods)
                for i in range(spec.tier1)
            ]
        else:
            t1 = [Switch(f"p{plane}.t1.{i}", plane, 1, i) for i in range(spec.tier1)]
        t2 = [Switch(f"p{plane}.t2.{i}", plane, 2, i) for i in range(spec.tier2)]
        _register(net, [*t0, *t1, *t2])
        for h in hosts:
            sw = t0[rack_of[h.name]]
            up = h.links[plane] = Link(h, sw, plane, replace(nic), trainq=_trainq(False, first))
            down = sw.ports[h.name] = Port(
                sw, h, plane, replace(host_port), last_hop=True, trainq=_trainq(True, first)
            )
            up.reverse, down.reverse = down, up
            sw.down[h.name] = down
        for rack, lower in enumerate(t0):
            pod = rack // rpp
            for upper in t1[pod * spec.tier1 : (pod + 1) * spec.tier1]:
                _cable(lower, upper, plane, fabric_port, uplink=True, control_first=first)
        for i, upper in enumerate(t1):
            pod = i // spec.tier1
            for h in hosts[pod * rpp * per_rack : (pod + 1) * rpp * per_rack]:
                upper.down[h.name] = upper.ports[t0[rack_of[h.name]].name]
        if spec.three_tier:
            fan = spec.tier2 // spec.tier1
            for i, upper in enumerate(t1):
                for core in t2[i % spec.tier1 * fan : (i % spec.tier1 + 1) * fan]:
                    _cable(upper, core, plane, core_port, uplink=True, control_first=first)
            for core in t2:
                for h in hosts:
                    pod = rack_of[h.name] // rpp
                    agg = t1[pod * spec.tier1 + core.index // fan]
                    core.down[h.name] = core.ports[agg.name]
        t0s.append(t0)
        t1s.append(t1)
        t2s.append(t2)
    return Fabric(net, hosts, t0s, t1s, rack_of, t2s if spec.three_tier else [], spec)


def clos(
    net: Network,
    planes: int = 4,
    racks: int = 2,
    hosts_per_rack: int = 2,
    tier1: int = 4,
    host_link: LinkParams | None = None,
    fabric_link: LinkParams | None = None,
    ecn_threshold: int | None = None,
    trim: bool = False,
    trim_size: int = 64,
    *,
    handlers: Mapping[str, EventHook] | None = None,
) -> Fabric:
    """Build a two-tier multi-plane Clos on `net`: hosts `h0..h{racks × hosts_per_rack - 1}`
    (rack r holds the next `hosts_per_rack`), switches `p{plane}.t0.r{rack}` and
    `p{plane}.t1.{route}`. `host_link` is used by host–tier-0 cables, `fabric_link` by
    tier-0–tier-1 cables; every switch port gets `ecn_threshold`, `trim` and `trim_size`
    (hosts neither mark nor trim). `handlers` as in `build`."""
    if planes < 1 or racks < 1 or hosts_per_rack < 1 or tier1 < 1:
        raise ValueError("a Clos needs at least one plane, rack, host per rack and tier-1")
    spec = FabricSpec(
        hosts=racks * hosts_per_rack,
        planes=planes,
        hosts_per_rack=hosts_per_rack,
        tier1=tier1,
        host_link=host_link or LinkParams(),
        fabric_link=fabric_link or LinkParams(),
        ecn_threshold=ecn_threshold,
        trim=trim,
        trim_size=trim_size,
    )
    return build(net, spec, handlers=handlers)

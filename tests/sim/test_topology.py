"""The fabric generator (mrc.sim.topology): exact counts of switches, cables and routes, the
htsim topology reader, and clear one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from mrc.sim import (
    FabricSpec,
    Host,
    Link,
    Network,
    Port,
    Switch,
    TopologyError,
    build,
    mrc_fabric,
    read_htsim_topo,
)

VENDOR_TOPO = Path("/work/shared/vendor/uet-htsim/sim/datacenter/topologies")


def walk(fab_net: Network, src: str, dst: str, ev: int) -> list[str]:
    """The names a packet from `src` to `dst` on EV `ev` crosses, by the switches' own tables."""
    host = fab_net.hosts[src]
    link: Link = host.links[ev >> 24]
    path = []
    node: Host | Switch = link.dst
    while isinstance(node, Switch):
        path.append(node.name)
        port = node.down.get(dst)
        if port is None:
            port = node.uplinks[(ev & 0xFFFFFF) // node.route_div % len(node.uplinks)]
        node = port.dst
    assert node.name == dst
    return path


def test_mrc_shape_counts() -> None:
    spec = mrc_fabric(hosts=64, planes=8, hosts_per_rack=8, tier1=4)
    net = Network()
    fab = build(net, spec)
    assert (spec.racks, spec.pods, spec.paths_per_plane) == (8, 1, 4)
    assert spec.switches_per_plane == 12 and spec.cables_per_plane == 64 + 32
    assert len(net.hosts) == 64 and len(net.switches) == 8 * 12
    # Every host has one NIC link per plane; every cable is two directions.
    assert all(len(h.links) == 8 for h in fab.hosts)
    assert sum(1 for _ in net.links()) == 2 * 8 * 96
    assert sum(len(sw.uplinks) for sw in fab.switches()) == 8 * 8 * 4
    assert fab.paths_per_plane == 4 and fab.plane_paths == (4,) * 8
    # Same rack: straight down; other rack: tier-1 number selector mod 4, on the EV's plane.
    assert walk(net, "h0", "h7", 3 << 24 | 6) == ["p3.t0.r0"]
    assert walk(net, "h0", "h9", 3 << 24 | 6) == ["p3.t0.r0", "p3.t1.2", "p3.t0.r1"]


def test_fat_tree_counts_and_distinct_paths() -> None:
    spec = FabricSpec(hosts=32, planes=2, hosts_per_rack=4, tier1=2, racks_per_pod=2, tier2=4)
    net = Network()
    fab = build(net, spec.check())
    # 8 racks in 4 pods; per plane 8 tier-0, 4 × 2 tier-1, 4 cores.
    assert (spec.racks, spec.pods, spec.switches_per_plane) == (8, 4, 20)
    assert spec.cables_per_plane == 32 + 8 * 2 + 4 * 4
    assert len(net.switches) == 40 and len(fab.tier2[0]) == 4
    assert sum(1 for _ in net.links()) == 2 * 2 * 64
    # Between pods, the 4 selectors 0..3 take the 4 cores, each once.
    paths = [walk(net, "h0", "h31", 1 << 24 | sel) for sel in range(4)]
    assert [p[2] for p in paths] == ["p1.t2.0", "p1.t2.2", "p1.t2.1", "p1.t2.3"]
    assert paths[1] == ["p1.t0.r0", "p1.t1.0.1", "p1.t2.2", "p1.t1.3.1", "p1.t0.r7"]
    assert len({tuple(p) for p in paths}) == 4
    # Within a pod, tier-1 is the turning point.
    assert walk(net, "h0", "h5", 1) == ["p0.t0.r0", "p0.t1.0.1", "p0.t0.r1"]
    with pytest.raises(TopologyError, match="depends on the pod"):
        fab.tier1_of(1)


def test_switch_ports_mark_and_trim_hosts_do_not() -> None:
    spec = mrc_fabric(hosts=4, planes=1, hosts_per_rack=2, tier1=2, ecn_threshold=1000)
    fab = build(Network(), spec)
    ports = list(fab.ports())
    assert len(ports) == 4 + 8 and all(isinstance(p, Port) for p in ports)
    assert all(p.params.trim and p.params.ecn_threshold == 1000 for p in ports)
    nic = fab.hosts[0].links[0]
    assert not nic.params.trim and nic.params.ecn_threshold is None
    assert nic.params.rate_bps == 100e9 and nic.params.latency == 1e-6


@pytest.mark.skipif(not VENDOR_TOPO.is_dir(), reason="htsim sources not present")
def test_reads_htsim_fat_tree_1024() -> None:
    spec = read_htsim_topo(VENDOR_TOPO / "fat_tree_1024.topo")
    assert (spec.hosts, spec.hosts_per_rack, spec.racks_per_pod, spec.pods) == (1024, 8, 8, 16)
    assert (spec.tier1, spec.tier2, spec.paths_per_plane) == (8, 64, 64)
    assert spec.switches_per_plane == 128 + 128 + 64
    assert spec.host_link.rate_bps == 100e9 and spec.core_link is not None
    assert spec.core_link.latency == pytest.approx(1e-6)
    two = read_htsim_topo(VENDOR_TOPO / "leaf_spine_1024.topo")
    assert (two.racks, two.tier1, two.three_tier) == (32, 32, False)


def test_topology_errors_are_one_line(tmp_path: Path) -> None:
    cases = {
        "Nodes 16\nTiers 2\n": "2 tiers with 0 sections",
        "Nodes x\n": "Nodes needs a number",
        "Tiers 2 3\n": "expected 'Key value'",
        "Nodes 16\nTiers 2\nPodsize 16\nTier 0\nRadix_Down 4\nRadix_Up 2\n"
        "Downlink_speed_Gbps 100\nDownlink_Latency_ns 1000\nBundle 2\nTier 1\nRadix_Down 4\n"
        "Downlink_speed_Gbps 100\nDownlink_Latency_ns 1000\n": "bundled",
        "Tiers 2\n": "no Nodes line",
    }
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"t{i}.topo"
        path.write_text(text)
        with pytest.raises(TopologyError, match=message) as info:
            read_htsim_topo(path)
        assert "\n" not in str(info.value)
    with pytest.raises(TopologyError, match="cannot read"):
        read_htsim_topo(tmp_path / "missing.topo")
    with pytest.raises(TopologyError, match="do not fill racks"):
        FabricSpec(hosts=10, hosts_per_rack=4).check()
    with pytest.raises(TopologyError, match="multiple of tier1"):
        FabricSpec(hosts=16, hosts_per_rack=4, tier1=2, racks_per_pod=2, tier2=3).check()
    with pytest.raises(TopologyError, match="already has hosts"):
        net = Network()
        build(net, FabricSpec(hosts=2, planes=1, hosts_per_rack=2, tier1=1))
        build(net, FabricSpec(hosts=2, planes=1, hosts_per_rack=2, tier1=1))


def test_the_full_mrc_shape_builds_in_about_a_second() -> None:
    """1,024 hosts x 8 planes, racks of 32, 32 tier-1 per plane: what issue 17 asks to run."""
    spec = mrc_fabric()
    net = Network()
    fab = build(net, spec)
    assert (spec.hosts, spec.planes, spec.racks, spec.paths_per_plane) == (1024, 8, 32, 32)
    assert len(net.switches) == 8 * 64 == 8 * spec.switches_per_plane
    assert sum(1 for _ in net.links()) == 2 * 8 * spec.cables_per_plane == 32768
    assert walk(net, "h0", "h1023", 7 << 24 | 33) == ["p7.t0.r0", "p7.t1.1", "p7.t0.r31"]
    assert fab.rack(31)[0].name == "h992"

"""Topology files → model, without root: names, addressing, routes, the path table, and one
clear line for each kind of bad input."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from tools.testbed import topology
from tools.testbed.model import TestbedError, Topology


def test_pair_defaults() -> None:
    topo = topology.load("pair")
    assert sorted(topo.nodes) == ["h1", "h2"]
    assert sorted(topo.links) == ["h1-p0", "h1-p1", "h1-p2", "h1-p3"]
    for p, link in enumerate(topo.links.values()):
        assert (str(link.a), str(link.b), link.mtu, link.plane) == (f"h1:p{p}", f"h2:p{p}", 9000, p)
        for host in ("h1", "h2"):
            addrs = topo.nodes[host].ifaces[f"p{p}"].addrs
            assert {ipaddress.ip_interface(a).version for a in addrs} == {4, 6}
    table = topo.path_table("x")
    assert len(table["entries"]) == 4 * 2 * 2  # planes × directions × IP versions
    assert all(e["paths"] == [{"name": "direct", "segments": []}] for e in table["entries"])


def test_pair_planes_override() -> None:
    topo = topology.load("pair", {"planes": 2})
    assert sorted(topo.links) == ["h1-p0", "h1-p1"]
    assert topo.nodes["h2"].plane_addr(1, 4) == "10.0.1.2"
    assert topo.nodes["h2"].plane_addr(1, 6) == "fd00:1::2"


def test_clos_defaults_nodes_links_sids() -> None:
    topo = topology.load("clos")
    assert topo.params == {"planes": 4, "hosts": 4, "racks": 2, "tier1": 2, "ecmp": 0}
    assert len(topo.nodes) == 4 + 4 * (2 + 2)
    assert len(topo.links) == 4 * 4 + 4 * 2 * 2
    assert {h.name: h.rack for h in topo.hosts()} == {"h1": 1, "h2": 1, "h3": 2, "h4": 2}
    switches = [n for n in topo.nodes.values() if not n.is_host]
    sids = [n.sid for n in switches]
    assert None not in sids and len(set(sids)) == len(sids)
    assert topo.nodes["t0r1p0"].sid == "fc00:0:0:1::"
    assert topo.nodes["t1bp2"].sid == "fc00:2:1:1::"
    assert "h1-p0" in topo.links and "t0r1p0-t1ap0" in topo.links
    assert str(topo.links["h1-p0"].b) == "t0r1p0:h1"
    for sw in switches:  # an End route for its SID on every interface
        ends = [r for r in sw.routes if r.seg6local == "End"]
        assert sorted(r.dev for r in ends) == sorted(sw.ifaces)
        assert {r.dst for r in ends} == {f"{sw.sid}/128"}
    assert all(link.mtu == 9000 for link in topo.links.values())
    # hosts: every plane's fabric prefixes via the tier-0 of that plane
    h3 = topo.nodes["h3"]
    assert {(r.dst, r.dev) for r in h3.routes if r.dev == "p1"} == {
        ("fd00:1::/32", "p1"), ("fd01:1::/32", "p1"), ("fc00:1::/32", "p1")}


def test_clos_path_table_shape() -> None:
    topo = topology.load("clos")
    table = json.loads(json.dumps(topo.path_table("tbx")))
    assert table["version"] == 1 and table["testbed"] == "tbx"
    entries = table["entries"]
    assert len(entries) == 4 * 4 * 3  # planes × ordered host pairs
    keys = {(e["src_node"], e["dst_node"], e["plane"]) for e in entries}
    assert len(keys) == len(entries)
    for e in entries:
        assert set(e) == {"src", "dst", "plane", "src_node", "dst_node", "paths"}
        assert e["src"] == topo.nodes[e["src_node"]].plane_addr(e["plane"])
        assert e["dst"] == topo.nodes[e["dst_node"]].plane_addr(e["plane"])
        same_rack = topo.nodes[e["src_node"]].rack == topo.nodes[e["dst_node"]].rack
        if same_rack:
            assert e["paths"] == [{"name": "direct", "segments": []}]
        else:
            p = e["plane"]
            assert e["paths"] == [
                {"name": "t1-0", "segments": [f"fc00:{p:x}:1::"]},
                {"name": "t1-1", "segments": [f"fc00:{p:x}:1:1::"]},
            ]
    key = ("h1", "h3", 0)
    first = next(e for e in entries if (e["src_node"], e["dst_node"], e["plane"]) == key)
    assert (first["src"], first["dst"]) == ("fd00:0:1:1::2", "fd00:0:2:3::2")


def test_clos_overrides() -> None:
    topo = topology.load("clos", {"hosts": 6, "racks": 3, "tier1": 3, "planes": 2})
    assert [h.rack for h in topo.hosts()] == [1, 1, 2, 2, 3, 3]
    assert len(topo.nodes) == 6 + 2 * (3 + 3)
    entry = next(e for e in topo.entries if e.src_node == "h1" and e.dst_node == "h6")
    assert [p["name"] for p in entry.paths] == ["t1-0", "t1-1", "t1-2"]
    assert "t0r3p1-t1cp1" in topo.links


def test_clos_ecmp_mode_routes_over_every_tier1_at_one_metric() -> None:
    srv6 = topology.load("clos").nodes["t0r1p0"].routes
    ecmp = topology.load("clos", {"ecmp": 1}).nodes["t0r1p0"].routes
    plain = [r.ip_args() for r in srv6 if r.dst == "fd00::/32"]
    multi = [r.ip_args() for r in ecmp if r.dst == "fd00::/32"]
    # SRv6 mode: tier-1 a first, b as the fallback; ECMP mode: one route, both next hops.
    assert plain == [
        "route replace fd00::/32 via fd01:0:1::2 dev t1ap0 metric 1024",
        "route replace fd00::/32 via fd01:0:1:1::2 dev t1bp0 metric 1025",
    ]
    assert multi == [
        "route append fd00::/32 via fd01:0:1::2 dev t1ap0 metric 1024",
        "route append fd00::/32 via fd01:0:1:1::2 dev t1bp0 metric 1024",
    ]


def test_state_round_trip() -> None:
    topo = topology.load("clos", {"planes": 2})
    assert Topology.from_dict(json.loads(json.dumps(topo.to_dict()))) == topo


def test_link_overrides_and_rates(tmp_path: Path) -> None:
    f = tmp_path / "slow.toml"
    f.write_text('kind = "clos"\n[defaults]\nrate = "10gbit"\n'
                 '[[links]]\nmatch = "h*-p3"\nrate = "1G"\nmtu = 1500\n')
    topo = topology.load(str(f))
    assert topo.links["h1-p3"].rate == 10**9 and topo.links["h1-p3"].mtu == 1500
    assert topo.links["h1-p0"].rate == 10 * 10**9 and topo.links["h1-p0"].mtu == 9000


@pytest.mark.parametrize(("text", "bits"), [
    ("100mbit", 10**8), ("1gbit", 10**9), ("500M", 5 * 10**8), ("2.5G", 25 * 10**8),
    ("64kbit", 64_000), (10**6, 10**6),
])
def test_parse_rate(text: object, bits: int) -> None:
    assert topology.parse_rate(text, "r") == bits


def test_custom_topology(tmp_path: Path) -> None:
    f = tmp_path / "line.toml"
    f.write_text("""
kind = "custom"
[nodes.a]
routes = [{dst = "fd00:2::/64", via = "fd00:1::2", dev = "e0"}]
[nodes.r]
role = "switch"
sid = "fc00::9"
[nodes.b]
routes = [{dst = "fd00:1::/64", via = "fd00:2::1", dev = "e0"}]
[[links]]
endpoints = ["a:e0", "r:a"]
addresses = [["fd00:1::1/64"], ["fd00:1::2/64"]]
[[links]]
name = "rb"
endpoints = ["r:b", "b:e0"]
addresses = [["fd00:2::1/64"], ["fd00:2::2/64"]]
rate = "1gbit"
""")
    topo = topology.load(str(f))
    assert sorted(topo.links) == ["a-r", "rb"]
    assert topo.links["rb"].rate == 10**9
    assert [r.ip_args() for r in topo.nodes["r"].routes] == [
        "route replace fc00::9/128 encap seg6local action End dev a metric 1024",
        "route replace fc00::9/128 encap seg6local action End dev b metric 1025",
    ]
    assert topo.entries == []


BAD = [
    ('kind = "pair"\nplanes = [', "malformed TOML"),
    ('kind = "ring"', "kind must be one of"),
    ('kind = "pair"\ncolour = 1', "unknown key 'colour'"),
    ('kind = "pair"\n[params]\nplanes = 0', "params.planes: 0 outside 1 … 64"),
    ('kind = "pair"\n[params]\nplanes = "4"', "params.planes: expected an integer"),
    ('kind = "pair"\n[params]\nhosts = 4', "[params]: unknown key 'hosts'"),
    ('kind = "pair"\n[defaults]\nrate = "fast"', "defaults.rate: bad rate 'fast'"),
    ('kind = "pair"\n[defaults]\nmtu = 100', "defaults.mtu: 100 outside 1280 … 65535"),
    ('kind = "pair"\n[[links]]\nmatch = "x*"\nrate = "1gbit"', "match 'x*' names no link"),
    ('kind = "clos"\n[params]\nhosts = 2\nracks = 3', "racks (3) must not exceed hosts (2)"),
    ('kind = "custom"\n[nodes.a]\n[[links]]\nendpoints = ["a:e0", "z:e0"]', "unknown node 'z'"),
    ('kind = "custom"\n[nodes.a]\nrole = "router"', "must be \"host\" or \"switch\""),
    ('kind = "custom"\n[nodes.a]\n[nodes.b]\n[[links]]\nendpoints = ["a:lo", "b:e0"]',
     "interface name 'lo' is reserved"),
    ('kind = "custom"\n[nodes.a]\nroutes = [{dst = "fd00::/64", dev = "nope"}]',
     "a has no interface 'nope'"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_files_one_clear_line(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(TestbedError) as err:
        topology.load(str(f))
    assert message in str(err.value)
    assert "\n" not in str(err.value) and str(f) in str(err.value)


def test_unknown_topology_and_override() -> None:
    with pytest.raises(TestbedError, match=r"unknown topology 'ring' \(available: clos, pair"):
        topology.load("ring")
    with pytest.raises(TestbedError, match="--tier1 does not apply to a pair topology"):
        topology.load("pair", {"tier1": 2})
    with pytest.raises(TestbedError, match=r"--planes: 65 outside 1 … 64"):
        topology.load("clos", {"planes": 65})

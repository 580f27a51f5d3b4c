"""Topology files: find, parse (tomllib), validate, and expand into a resolved `Topology`.

A topology file is TOML with a `kind`:

- `pair`: two hosts `h1`, `h2` joined by `planes` veth pairs (`[params] planes`, default 4).
  Plane p: link `h1-p<p>` between `h1:p<p>` and `h2:p<p>`; IPv4 10.0.<p>.1/24 and .2/24,
  IPv6 fd00:<p>::1/64 and ::2/64. Every path entry is direct (`segments: []`).
- `clos`: `hosts` hosts (default 4) spread evenly over `racks` racks (default 2), `planes`
  planes (default 4), per plane one tier-0 switch per rack and `tier1` tier-1 switches
  (default 2). Names: hosts `h<N>`, tier-0 `t0r<rack>p<plane>`, tier-1 `t1<letter>p<plane>`
  (a, b, …). Links: `h<N>-p<plane>` (host to its tier-0), `<tier0>-<tier1>`. Interfaces: a
  host's are `p<plane>`, a switch names each interface after the node at the other end.
  Addresses (IPv6 only): host link fd00:<p>:<rack>:<host>::/64 (host ::2, tier-0 ::1);
  tier-0 to tier-1 link fd01:<p>:<rack>:<k>::/64 (tier-0 ::1, tier-1 ::2); SIDs
  fc00:<p>:0:<rack>:: (tier-0) and fc00:<p>:1:<k>:: (tier-1), each a `seg6local End` route.
  A path to another rack is the segment list [tier-1 SID] (the destination is appended by the
  SRH builder); plain IPv6 to another rack goes through tier-1 `a`, falling back to the next
  tier-1 by metric when a link is down. With `ecmp = 1` (`up clos --ecmp 1`), plain IPv6 to
  another rack takes one multipath route over every tier-1 instead, hashed on addresses and
  the IPv6 flow label (`fib_multipath_hash_policy` 0): a sender that puts its EV in the flow
  label (`mrc bench --ev-encoding flowlabel`) sprays over the tier-1s without SRv6. `ecmp = 2`
  hashes the 5-tuple instead (policy 1), for senders whose EV picks the UDP source port
  (`--ev-encoding udp`).
- `custom`: containerlab-like `[nodes.<name>]` (role = "host" | "switch", optional `sid`,
  `routes = [{dst, via, dev, metric}]`) and `[[links]]` with `endpoints = ["a:if", "b:if"]`,
  `addresses = [[…a…], […b…]]`, optional `name`, `plane`, `mtu`, `rate`. No path table.

Every kind takes `[defaults] mtu` (9000) and `rate`, and pair/clos take per-link overrides
`[[links]] match = "<glob on link names>"` with `mtu` and/or `rate`. Rates are tc-style
(`100mbit`, `1gbit`) or SI bits (`500M`). Building the namespaces is `build`'s job.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
import tomllib
from pathlib import Path
from typing import Any

from tools.testbed.model import (
    Endpoint,
    Iface,
    Link,
    Node,
    PathEntry,
    Route,
    TestbedError,
    Topology,
)

TOPOLOGY_DIR = Path(__file__).resolve().parent / "topologies"
KINDS = ("pair", "clos", "custom")
DEFAULT_MTU = 9000
MAX_FILE_BYTES = 1 << 20

# kind → parameter → (default, minimum, maximum)
PARAMS: dict[str, dict[str, tuple[int, int, int]]] = {
    "pair": {"planes": (4, 1, 64)},
    "clos": {
        "planes": (4, 1, 64),
        "hosts": (4, 1, 256),
        "racks": (2, 1, 64),
        "tier1": (2, 1, 26),
        "ecmp": (0, 0, 2),
    },
    "custom": {},
}
_NAME_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,14})$")  # node and interface names
_LINK_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")  # link names: no ':'
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?)(bit)?$", re.IGNORECASE)
_SI = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def available() -> list[str]:
    """Names of the topologies shipped in `topologies/`."""
    return sorted(p.stem for p in TOPOLOGY_DIR.glob("*.toml"))


def find(spec: str) -> Path:
    """The file for a topology name in `topologies/`, or `spec` itself when it is a path."""
    if "/" in spec or spec.endswith(".toml"):
        path = Path(spec)
        if not path.is_file():
            raise TestbedError(f"topology file {spec} not found")
        return path
    path = TOPOLOGY_DIR / f"{spec}.toml"
    if not _NAME_RE.match(spec) or not path.is_file():
        names = ", ".join(available()) or "none"
        raise TestbedError(f"unknown topology '{spec}' (available: {names}; or a path to a .toml)")
    return path


def parse_rate(value: object, where: str) -> int:
    """A rate in bit/s from an int (bit/s) or a string such as `100mbit`, `1gbit`, `500M`."""
    if isinstance(value, bool):
        raise TestbedError(f"{where}: bad rate {value!r} (examples: 100mbit, 1gbit, 500M)")
    if isinstance(value, int):
        bits = value
    else:
        m = _RATE_RE.match(str(value).strip())
        if not m:
            raise TestbedError(f"{where}: bad rate {value!r} (examples: 100mbit, 1gbit, 500M)")
        bits = int(float(m.group(1)) * _SI[m.group(2).lower()])
    if not 8_000 <= bits <= 10**13:
        raise TestbedError(f"{where}: rate {value!r} outside 8kbit … 10tbit")
    return bits


def format_rate(bits: int | None) -> str:
    if bits is None:
        return "-"
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits >= scale and bits % scale == 0:
            return f"{bits // scale}{unit}"
    return f"{bits}bit"


def load(spec: str, overrides: dict[str, int] | None = None) -> Topology:
    """Find, read and validate a topology, apply command-line `overrides`, and expand it."""
    path = find(spec)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TestbedError(f"topology {path}: {e.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise TestbedError(f"topology {path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TestbedError(f"topology {path}: malformed TOML: {e}") from None
    try:
        topo = expand(doc, path.stem, overrides or {})
    except TestbedError as e:
        raise TestbedError(f"topology {path}: {e}") from None
    topo.source = str(path)
    return topo


def _check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            names = ", ".join(sorted(allowed))
            raise TestbedError(f"{where}: unknown key '{key}' (allowed: {names})")


def _table(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise TestbedError(f"'{key}' must be a table ([{key}])")
    return value


def _int(value: object, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TestbedError(f"{where}: expected an integer, got {value!r}")
    if not lo <= value <= hi:
        raise TestbedError(f"{where}: {value} outside {lo} … {hi}")
    return value


def expand(doc: dict[str, Any], name: str, overrides: dict[str, int]) -> Topology:
    """Validate a parsed TOML document and expand it into a resolved `Topology`."""
    _check_keys(doc, {"description", "kind", "params", "defaults", "links", "nodes"}, "top level")
    kind = doc.get("kind")
    if kind not in KINDS:
        raise TestbedError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if "description" in doc and not isinstance(doc["description"], str):
        raise TestbedError("description must be a string")
    spec = PARAMS[kind]
    given = _table(doc, "params")
    _check_keys(given, set(spec), "[params]")
    params: dict[str, int] = {}
    for key, (default, lo, hi) in spec.items():
        params[key] = _int(given.get(key, default), f"params.{key}", lo, hi)
    for key, value in overrides.items():
        if key not in spec:
            raise TestbedError(f"--{key} does not apply to a {kind} topology")
        params[key] = _int(value, f"--{key}", *spec[key][1:])
    defaults = _table(doc, "defaults")
    _check_keys(defaults, {"mtu", "rate"}, "[defaults]")
    mtu = _int(defaults.get("mtu", DEFAULT_MTU), "defaults.mtu", 1280, 65535)
    rate = parse_rate(defaults["rate"], "defaults.rate") if "rate" in defaults else None
    links = doc.get("links", [])
    if not isinstance(links, list) or not all(isinstance(x, dict) for x in links):
        raise TestbedError("links must be an array of tables ([[links]])")
    if kind == "custom":
        topo = _custom(name, _table(doc, "nodes"), links, mtu, rate)
    else:
        if "nodes" in doc:
            raise TestbedError(f"[nodes] is only for kind = \"custom\" (this is {kind})")
        topo = _pair(name, params) if kind == "pair" else _clos(name, params)
        for link in topo.links.values():
            link.mtu, link.rate = mtu, rate
        _apply_overrides(topo, links)
    return topo


def _apply_overrides(topo: Topology, overrides: list[dict[str, Any]]) -> None:
    for i, entry in enumerate(overrides):
        where = f"links[{i}]"
        _check_keys(entry, {"match", "mtu", "rate"}, where)
        pattern = entry.get("match")
        if not isinstance(pattern, str):
            raise TestbedError(f"{where}: needs match = \"<glob on link names>\"")
        hits = [lk for n, lk in topo.links.items() if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise TestbedError(f"{where}: match '{pattern}' names no link")
        for link in hits:
            if "mtu" in entry:
                link.mtu = _int(entry["mtu"], f"{where}.mtu", 1280, 65535)
            if "rate" in entry:
                link.rate = parse_rate(entry["rate"], f"{where}.rate")


def _v6(*words: int) -> ipaddress.IPv6Address:
    """An IPv6 address from up to eight 16-bit words, the rest zero."""
    value = 0
    for i, w in enumerate(words):
        value |= w << (16 * (7 - i))
    return ipaddress.IPv6Address(value)


def _connect(topo: Topology, name: str, a: Endpoint, b: Endpoint, plane: int | None,
             a_addrs: list[str], b_addrs: list[str]) -> None:
    """Add a link and the interfaces at both of its ends."""
    for end, peer, addrs in ((a, b, a_addrs), (b, a, b_addrs)):
        node = topo.nodes[end.node]
        if end.iface in node.ifaces:
            raise TestbedError(f"interface {end} is used by two links")
        node.ifaces[end.iface] = Iface(end.iface, name, peer.node, peer.iface, addrs, plane)
    topo.links[name] = Link(name, a, b, DEFAULT_MTU, None, plane)


def _pair(name: str, params: dict[str, int]) -> Topology:
    topo = Topology(name, "pair", dict(params))
    for h in ("h1", "h2"):
        topo.nodes[h] = Node(h, "host")
    for p in range(params["planes"]):
        iface = f"p{p}"
        a6, b6 = _v6(0xFD00, p, 0, 0, 0, 0, 0, 1), _v6(0xFD00, p, 0, 0, 0, 0, 0, 2)
        _connect(topo, f"h1-{iface}", Endpoint("h1", iface), Endpoint("h2", iface), p,
                 [f"10.0.{p}.1/24", f"{a6}/64"], [f"10.0.{p}.2/24", f"{b6}/64"])
    for p in range(params["planes"]):
        for src, dst in (("h1", "h2"), ("h2", "h1")):
            for version in (6, 4):
                s = topo.nodes[src].plane_addr(p, version)
                d = topo.nodes[dst].plane_addr(p, version)
                assert s and d
                topo.entries.append(
                    PathEntry(s, d, p, src, dst, [{"name": "direct", "segments": []}])
                )
    return topo


def tier0_name(rack: int, plane: int) -> str:
    return f"t0r{rack}p{plane}"


def tier1_name(k: int, plane: int) -> str:
    return f"t1{chr(ord('a') + k)}p{plane}"


def _clos(name: str, params: dict[str, int]) -> Topology:
    planes, hosts, racks, tier1 = (params[k] for k in ("planes", "hosts", "racks", "tier1"))
    if racks > hosts:
        raise TestbedError(f"racks ({racks}) must not exceed hosts ({hosts})")
    topo = Topology(name, "clos", dict(params))
    rack_of = {h: (h - 1) * racks // hosts + 1 for h in range(1, hosts + 1)}
    for h, r in rack_of.items():
        topo.nodes[f"h{h}"] = Node(f"h{h}", "host", rack=r)
    for p in range(planes):
        for r in range(1, racks + 1):
            sid = str(_v6(0xFC00, p, 0, r))
            topo.nodes[tier0_name(r, p)] = Node(tier0_name(r, p), "tier0", rack=r, plane=p, sid=sid)
        for k in range(tier1):
            sid = str(_v6(0xFC00, p, 1, k))
            topo.nodes[tier1_name(k, p)] = Node(tier1_name(k, p), "tier1", plane=p, sid=sid)
        plane_nets = [f"{_v6(w, p)}/32" for w in (0xFD00, 0xFD01, 0xFC00)]
        for h, r in rack_of.items():  # host links
            host, t0_host = f"h{h}", tier0_name(r, p)
            net = (0xFD00, p, r, h)
            gw = str(_v6(*net, 0, 0, 0, 1))
            _connect(topo, f"{host}-p{p}", Endpoint(host, f"p{p}"), Endpoint(t0_host, host), p,
                     [f"{_v6(*net, 0, 0, 0, 2)}/64"], [f"{gw}/64"])
            topo.nodes[host].routes += [Route(n, f"p{p}", via=gw) for n in plane_nets]
        for r in range(1, racks + 1):  # tier-0 to tier-1 links
            t0 = topo.nodes[tier0_name(r, p)]
            for k in range(tier1):
                t1 = topo.nodes[tier1_name(k, p)]
                net = (0xFD01, p, r, k)
                lo, hi = str(_v6(*net, 0, 0, 0, 1)), str(_v6(*net, 0, 0, 0, 2))
                _connect(topo, f"{t0.name}-{t1.name}", Endpoint(t0.name, t1.name),
                         Endpoint(t1.name, t0.name), p, [f"{lo}/64"], [f"{hi}/64"])
                assert t1.sid is not None
                t0.routes.append(Route(f"{t1.sid}/128", t1.name, via=hi))
                if params["ecmp"]:
                    # One multipath route over every tier-1: the kernel hashes each datagram's
                    # addresses, flow label and protocol to pick one (policy 0).
                    t0.routes += [Route(n, t1.name, via=hi, metric=1024, append=True)
                                  for n in plane_nets]  # fmt: skip
                else:
                    t0.routes += [Route(n, t1.name, via=hi, metric=1024 + k) for n in plane_nets]
                for word in (0xFD00, 0xFD01):  # the rack's hosts and its uplinks
                    t1.routes.append(Route(f"{_v6(word, p, r)}/48", t0.name, via=lo))
                t1.routes.append(Route(f"{t0.sid}/128", t0.name, via=lo))
    for node in topo.nodes.values():
        _add_sid_routes(node)
    host_nodes = topo.hosts()
    for p in range(planes):
        for src in host_nodes:
            for dst in host_nodes:
                if src is dst:
                    continue
                s, d = src.plane_addr(p), dst.plane_addr(p)
                assert s and d
                if src.rack == dst.rack:
                    paths: list[dict[str, Any]] = [{"name": "direct", "segments": []}]
                else:
                    paths = [
                        {"name": f"t1-{k}", "segments": [topo.nodes[tier1_name(k, p)].sid]}
                        for k in range(tier1)
                    ]
                topo.entries.append(PathEntry(s, d, p, src.name, dst.name, paths))
    return topo


def _add_sid_routes(node: Node) -> None:
    """A `seg6local End` route for the node's SID on every interface, by rising metric.

    IPv6 drops a route when its device goes down, so one route per interface keeps the SID
    alive while any of the switch's links is up.
    """
    if node.sid is None:
        return
    for i, iface in enumerate(node.ifaces):
        node.routes.insert(i, Route(f"{node.sid}/128", iface, metric=1024 + i, seg6local="End"))


def _endpoint(value: object, where: str, nodes: dict[str, Node]) -> Endpoint:
    if not isinstance(value, str) or value.count(":") != 1:
        raise TestbedError(f"{where}: endpoint must be \"node:interface\", got {value!r}")
    node, iface = value.split(":")
    if node not in nodes:
        raise TestbedError(f"{where}: unknown node '{node}'")
    if not _NAME_RE.match(iface):
        raise TestbedError(f"{where}: bad interface name '{iface}' (1-15 of A-Z a-z 0-9 _ -)")
    if iface in ("lo", "all", "default"):
        raise TestbedError(f"{where}: interface name '{iface}' is reserved")
    return Endpoint(node, iface)


def _addr_list(value: object, where: str) -> list[str]:
    if not isinstance(value, list):
        raise TestbedError(f"{where}: expected a list of addresses such as \"fd00::1/64\"")
    out = []
    for a in value:
        try:
            if not isinstance(a, str) or "/" not in a:
                raise ValueError
            out.append(str(ipaddress.ip_interface(a)))
        except ValueError:
            raise TestbedError(f"{where}: bad address {a!r} (want CIDR, e.g. fd00::1/64)") from None
    return out


def _custom(name: str, nodes_doc: dict[str, Any], links: list[dict[str, Any]],
            mtu: int, rate: int | None) -> Topology:
    topo = Topology(name, "custom", {})
    if not nodes_doc:
        raise TestbedError("a custom topology needs [nodes.<name>] tables")
    for node_name, spec in nodes_doc.items():
        where = f"nodes.{node_name}"
        if not _NAME_RE.match(node_name):
            raise TestbedError(f"{where}: bad node name (1-15 of A-Z a-z 0-9 _ -)")
        if not isinstance(spec, dict):
            raise TestbedError(f"{where}: must be a table")
        _check_keys(spec, {"role", "sid", "routes"}, where)
        role = spec.get("role", "host")
        if role not in ("host", "switch"):
            raise TestbedError(f"{where}.role: must be \"host\" or \"switch\", got {role!r}")
        sid = spec.get("sid")
        if sid is not None:
            try:
                sid = str(ipaddress.IPv6Address(sid))
            except ValueError:
                raise TestbedError(f"{where}.sid: bad IPv6 address {sid!r}") from None
        topo.nodes[node_name] = Node(node_name, role, sid=sid)
    for i, entry in enumerate(links):
        where = f"links[{i}]"
        _check_keys(entry, {"name", "endpoints", "addresses", "plane", "mtu", "rate"}, where)
        ends = entry.get("endpoints")
        if not isinstance(ends, list) or len(ends) != 2:
            raise TestbedError(f"{where}: endpoints must be [\"a:if\", \"b:if\"]")
        a, b = (_endpoint(e, f"{where}.endpoints", topo.nodes) for e in ends)
        link_name = entry.get("name", f"{a.node}-{b.node}")
        if not isinstance(link_name, str) or not _LINK_RE.match(link_name):
            raise TestbedError(f"{where}.name: bad link name {link_name!r}")
        if link_name in topo.links:
            raise TestbedError(f"{where}: duplicate link name '{link_name}' (set name = …)")
        addrs = entry.get("addresses", [[], []])
        if not isinstance(addrs, list) or len(addrs) != 2:
            raise TestbedError(f"{where}.addresses: must be [[a-side…], [b-side…]]")
        plane = entry.get("plane")
        if plane is not None:
            plane = _int(plane, f"{where}.plane", 0, 255)
        _connect(topo, link_name, a, b, plane, _addr_list(addrs[0], f"{where}.addresses"),
                 _addr_list(addrs[1], f"{where}.addresses"))
        link = topo.links[link_name]
        link.mtu = _int(entry.get("mtu", mtu), f"{where}.mtu", 1280, 65535)
        link.rate = parse_rate(entry["rate"], f"{where}.rate") if "rate" in entry else rate
    for node_name, spec in nodes_doc.items():
        node = topo.nodes[node_name]
        routes = spec.get("routes", [])
        if not isinstance(routes, list):
            raise TestbedError(f"nodes.{node_name}.routes: must be an array of tables")
        for j, r in enumerate(routes):
            node.routes.append(_route(r, f"nodes.{node_name}.routes[{j}]", node))
        _add_sid_routes(node)
    return topo


def _route(spec: object, where: str, node: Node) -> Route:
    if not isinstance(spec, dict):
        raise TestbedError(f"{where}: must be a table {{dst = …, via = …, dev = …}}")
    _check_keys(spec, {"dst", "via", "dev", "metric"}, where)
    try:
        dst = str(ipaddress.ip_network(spec.get("dst", ""), strict=True))
        via = spec.get("via")
        if via is not None:
            via = str(ipaddress.ip_address(via))
    except (ValueError, TypeError) as e:
        raise TestbedError(f"{where}: {e}") from None
    dev = spec.get("dev")
    if dev not in node.ifaces:
        raise TestbedError(f"{where}.dev: {node.name} has no interface {dev!r}")
    metric = spec.get("metric")
    if metric is not None:
        metric = _int(metric, f"{where}.metric", 1, 2**31 - 1)
    return Route(dst, dev, via=via, metric=metric)

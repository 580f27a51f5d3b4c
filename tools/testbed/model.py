"""The resolved testbed model: nodes, interfaces, links, routes and the path table.

Holds plain dataclasses that `topology` fills in from a TOML file and that `build` turns into
`ip`/`tc`/`nft` commands, plus their JSON form for the state file (`to_dict`/`from_dict`) and
the path table `mrc bench --paths FILE` reads. Parsing TOML, addressing and running commands
belong to `topology`, `build` and `runner`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass, field
from typing import Any

PATH_TABLE_VERSION = 1


class TestbedError(Exception):
    """A failure reported to the user as one line on stderr and a non-zero exit code."""

    __test__ = False  # not a pytest test class

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Route:
    """One static route of a node: `dst` via gateway `via` out of `dev`, or a seg6local SID."""

    dst: str
    dev: str
    via: str | None = None
    metric: int | None = None
    seg6local: str | None = None  # an action such as "End"
    #: Add as one more next hop of the same destination and metric (an ECMP route) instead of
    #: replacing what is there.
    append: bool = False

    def ip_args(self) -> str:
        """The arguments of `ip` that install (or re-install) this route (a batch line: the
        family follows from the addresses)."""
        words = ["route", "append" if self.append else "replace", self.dst]
        if self.seg6local:
            words += ["encap", "seg6local", "action", self.seg6local]
        if self.via:
            words += ["via", self.via]
        words += ["dev", self.dev]
        if self.metric is not None:
            words += ["metric", str(self.metric)]
        return " ".join(words)


@dataclass
class Iface:
    """An interface of a node: one end of a link, with its addresses (CIDR notation)."""

    name: str
    link: str
    peer_node: str
    peer_iface: str
    addrs: list[str] = field(default_factory=list)
    plane: int | None = None


@dataclass
class Node:
    """A host or a switch; each is one network namespace."""

    name: str
    role: str  # host | tier0 | tier1 | switch
    ifaces: dict[str, Iface] = field(default_factory=dict)
    routes: list[Route] = field(default_factory=list)
    rack: int | None = None
    plane: int | None = None
    sid: str | None = None

    @property
    def is_host(self) -> bool:
        return self.role == "host"

    def plane_addr(self, plane: int, version: int = 6) -> str | None:
        """The host's address (no prefix length) on `plane` in the given IP version."""
        for iface in self.ifaces.values():
            if iface.plane != plane:
                continue
            for cidr in iface.addrs:
                ip = ipaddress.ip_interface(cidr).ip
                if ip.version == version:
                    return str(ip)
        return None


@dataclass
class Endpoint:
    node: str
    iface: str

    def __str__(self) -> str:
        return f"{self.node}:{self.iface}"


@dataclass
class Link:
    """A veth pair between two node interfaces; `rate` is in bit/s (tbf on both ends)."""

    name: str
    a: Endpoint
    b: Endpoint
    mtu: int
    rate: int | None = None
    plane: int | None = None

    @property
    def ends(self) -> tuple[Endpoint, Endpoint]:
        return (self.a, self.b)


@dataclass
class PathEntry:
    """The paths from one host to another on one plane, in `mrc bench --paths` form."""

    src: str
    dst: str
    plane: int
    src_node: str
    dst_node: str
    paths: list[dict[str, Any]]


@dataclass
class Topology:
    """A fully resolved topology: what `up` builds and what the state file records."""

    name: str  # the topology's name (pair, clos, or the TOML file's stem)
    kind: str  # pair | clos | custom
    params: dict[str, int]
    nodes: dict[str, Node] = field(default_factory=dict)
    links: dict[str, Link] = field(default_factory=dict)
    entries: list[PathEntry] = field(default_factory=list)
    source: str = ""

    def hosts(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.is_host]

    def path_table(self, testbed: str) -> dict[str, Any]:
        """The JSON path table (version 1) for a testbed named `testbed`."""
        return {
            "version": PATH_TABLE_VERSION,
            "testbed": testbed,
            "entries": [asdict(e) for e in self.entries],
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Topology:
        nodes = {}
        for name, n in d["nodes"].items():
            ifaces = {k: Iface(**v) for k, v in n["ifaces"].items()}
            routes = [Route(**r) for r in n["routes"]]
            nodes[name] = Node(
                name=n["name"],
                role=n["role"],
                ifaces=ifaces,
                routes=routes,
                rack=n.get("rack"),
                plane=n.get("plane"),
                sid=n.get("sid"),
            )
        links = {
            name: Link(
                name=lk["name"],
                a=Endpoint(**lk["a"]),
                b=Endpoint(**lk["b"]),
                mtu=lk["mtu"],
                rate=lk.get("rate"),
                plane=lk.get("plane"),
            )
            for name, lk in d["links"].items()
        }
        entries = [PathEntry(**e) for e in d.get("entries", [])]
        return cls(
            name=d["name"],
            kind=d["kind"],
            params=dict(d["params"]),
            nodes=nodes,
            links=links,
            entries=entries,
            source=d.get("source", ""),
        )

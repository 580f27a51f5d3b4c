"""What one side of an `mrc bench` test sets up before it runs: parameters, regions, sockets.

Holds `TestParams`, `TestSetup` (the regions registered before the handshake, so their keys can
travel in the private data, and released after the test), `IntervalSample`, `bind_planes` (one
`PlaneSocket` per address, bind errors turned into `BenchError`), `BenchError` itself, and the
`--paths` steps: picking the client's source addresses from the path table, opening the SRv6
path sockets after the path-MTU check (`client_paths`, `server_paths`) and recording path counts
in the report (`record_paths`). The test logic is `bench_roles`; the wire agreement `bench_proto`.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mrc.core.memory import Region, RegionTable
from mrc.io.pathtable import PathTable, PathTableError
from mrc.io.planes import PlaneSocket, SockAddr
from mrc.io.srv6 import PathSockets, check_path_mtu

from .bench_proto import RESULTS_BYTES, Pattern, RegionRef


class BenchError(Exception):
    """An expected failure: one line on stderr, exit status 1."""


WRITER = "sender"
RECEIVER = "receiver"
STATUS_NAMES = {0x80: "BAD_RKEY", 0x81: "OUT_OF_BOUNDS"}


@dataclass(frozen=True, slots=True)
class TestParams:
    msg_size: int
    duration: float = 0.0
    total_bytes: int = 0
    verify: bool = False
    seed: int = 0
    interval: float = 1.0
    #: (plane, seconds after the start): blackholes the writer's io applies.
    injects: tuple[tuple[int, float], ...] = ()


@dataclass(eq=False)
class TestSetup:
    """The regions one side registers for a test."""

    role: str
    params: TestParams
    slots: int
    regions: RegionTable
    inbox: Region
    outbox: Region
    data: Region | None = None
    source: Region | None = None
    pattern: Pattern | None = None

    @classmethod
    def allocate(cls, regions: RegionTable, role: str, params: TestParams, slots: int) -> TestSetup:
        pattern = Pattern(params.seed, params.msg_size) if params.verify else None
        inbox = regions.register(bytearray(RESULTS_BYTES))
        outbox = regions.register(bytearray(RESULTS_BYTES))
        setup = cls(role, params, slots, regions, inbox, outbox, pattern=pattern)
        if role == RECEIVER:
            setup.data = regions.register(bytearray(slots * params.msg_size))
        elif pattern is not None:
            setup.source = regions.register(pattern.stream, prefault_pages=False)
        else:
            setup.source = regions.register(bytearray(params.msg_size))
        return setup

    def ref(self, region: Region | None) -> RegionRef:
        return (
            RegionRef() if region is None else RegionRef(region.base_va, region.rkey, region.size)
        )

    def release(self) -> None:
        for region in (self.inbox, self.outbox, self.data, self.source):
            if region is not None and self.regions.lookup(region.rkey) is region:
                self.regions.deregister(region)


@dataclass(slots=True)
class IntervalSample:
    start: float
    end: float
    bytes: int
    retransmits: int
    #: (plane, bytes, packets) on the wire in this interval, this side's direction.
    planes: list[tuple[int, int, int]] = field(default_factory=list)
    #: The writer's congestion window at the end of the interval (bytes; iperf3's snd_cwnd).
    snd_cwnd: int | None = None
    #: The writer's payload bytes in flight and NSCC's cap (None: uncapped) by plane, at the end.
    in_flight: dict[int, tuple[int, int | None]] = field(default_factory=dict)


def bind_planes(hosts: list[str], port: int, *, reuseport: bool = False) -> dict[int, PlaneSocket]:
    """One plane socket per address; `reuseport` lets SRv6 path sockets share its port."""
    planes: dict[int, PlaneSocket] = {}
    try:
        for i, host in enumerate(hosts):
            try:
                planes[i] = PlaneSocket(i, host, port, gro=True, reuseport=reuseport)
            except socket.gaierror as exc:
                raise BenchError(f"cannot resolve {host!r} (plane {i}): {exc.strerror}") from None
            except OSError as exc:
                reason = exc.strerror or str(exc)
                raise BenchError(f"cannot bind {host} port {port} (plane {i}): {reason}") from None
    except BaseException:
        for s in planes.values():
            s.close()
        raise
    return planes


# -- --paths --------------------------------------------------------------------------------


def _is_local(addr: str) -> bool:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((addr, 0))
    except OSError:
        return False
    return True


def client_binds(table: PathTable, servers: list[str], fallback: list[str]) -> list[str]:
    """The client's address on each plane when -B is not given: the table's source toward the
    server's address on that plane that is an address of this host; `fallback[i]` (a wildcard)
    for a plane the table does not name."""
    binds = []
    for plane, server in enumerate(servers):
        candidates = [str(a) for a in table.sources_for(server, plane)]
        mine = [a for a in candidates if _is_local(a)]
        if len(mine) == 1:
            binds.append(mine[0])
        elif not candidates:
            binds.append(fallback[plane])
        elif not mine:
            listed = ", ".join(candidates[:4]) + (", …" if len(candidates) > 4 else "")
            raise BenchError(
                f"--paths {table.source}: none of the sources toward {server} on plane {plane} "
                f"({listed}) is an address of this host; give -B"
            )
        else:
            raise BenchError(
                f"--paths {table.source}: several local sources reach {server} on plane "
                f"{plane} ({', '.join(mine)}); give -B"
            )
    return binds


def client_paths(
    table: PathTable,
    planes: Mapping[int, PlaneSocket],
    peers: Mapping[int, SockAddr],
    payload_mtu: int,
    port: int,
) -> tuple[PathSockets, dict[int, int], list[str]]:
    """Check every path's MTU and open the client's path sockets.

    Returns the sockets, the path count of each plane (for the core's config) and lines that
    describe the paths; raises BenchError (one line) when a path cannot be used.
    """
    locals_ = [str(planes[p].bound_addr[0]) for p in sorted(planes)]
    remotes = [str(peers[p][0]) for p in sorted(planes)]
    counts = table.paths_per_plane(locals_, remotes)
    lines: list[str] = []
    found = False
    for plane, (src, dst) in enumerate(zip(locals_, remotes, strict=True)):
        entry = table.lookup(src, dst, plane)
        if entry is None:
            others = table.planes_between(src, dst)
            if others:
                raise BenchError(
                    f"--paths {table.source}: {src} -> {dst} is plane {others[0]} in the table "
                    f"but plane {plane} here; list the addresses in plane order"
                )
            lines.append(f"plane {plane}: {src} -> {dst} direct (not in the path table)")
            continue
        found = True
        try:
            mtus = check_path_mtu(entry, payload_mtu, port=port)
        except PathTableError as exc:
            raise BenchError(str(exc)) from None
        names = ", ".join(p.describe() for p in entry.paths)
        lines.append(
            f"plane {plane}: {entry.src_node} -> {entry.dst_node}, {len(entry.paths)} path"
            f"{'s' if len(entry.paths) != 1 else ''}: {names} (MTU {min(mtus.values())})"
        )
    if not found:
        pairs = ", ".join(f"{s} -> {d}" for s, d in zip(locals_, remotes, strict=True))
        raise BenchError(f"--paths {table.source} has no entry for {pairs} on any plane")
    paths = PathSockets(table)
    try:
        for plane, sock in planes.items():
            paths.open(sock, peers[plane])
    except PathTableError as exc:
        paths.close()
        raise BenchError(str(exc)) from None
    return paths, counts, lines


def server_paths(
    table: PathTable, planes: Mapping[int, PlaneSocket], payload_mtu: int, port: int
) -> tuple[PathSockets, dict[int, int], list[str]]:
    """The server's side of `client_paths`: it does not know its peers yet, so it checks the
    MTU of every path leaving its addresses and opens path sockets when a peer shows up."""
    binds = [str(planes[p].bound_addr[0]) for p in sorted(planes)]
    entries = 0
    for plane, src in enumerate(binds):
        leaving = table.entries_from(src, plane)
        for entry in leaving:
            try:
                check_path_mtu(entry, payload_mtu, port=port)
            except PathTableError as exc:
                raise BenchError(str(exc)) from None
        entries += len(leaving)
    if not entries:
        raise BenchError(
            f"--paths {table.source} has no entry leaving {','.join(binds)} on those planes"
        )
    line = (
        f"SRv6 paths from {table.source} (testbed {table.testbed}): {entries} "
        f"{'entry' if entries == 1 else 'entries'} leaving {','.join(binds)}"
    )
    return PathSockets(table), table.server_paths_from(binds), [line]


def path_counts(
    table: PathTable, planes: Mapping[int, PlaneSocket], peer_addrs: Mapping[int, Any]
) -> dict[int, int]:
    """Paths of each plane toward the peer of one session (1 where the table has no entry)."""
    out: dict[int, int] = {}
    for plane, sock in planes.items():
        peer = peer_addrs.get(plane)
        entry = (
            table.lookup(str(sock.bound_addr[0]), str(peer[0]), plane)
            if isinstance(peer, tuple) and peer
            else None
        )
        out[plane] = len(entry.paths) if entry is not None else 1
    return out


def record_paths(
    test_start: dict[str, Any],
    rows: list[dict[str, Any]],
    paths_file: str | None,
    counts: Mapping[int, int],
) -> None:
    """`start.test_start.paths` (the file) and a `paths` count on each plane row."""
    test_start["paths"] = paths_file
    for row in rows:
        plane = row.get("plane")
        if isinstance(plane, int):
            row["paths"] = counts.get(plane, 1)

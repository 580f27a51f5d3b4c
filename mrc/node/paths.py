"""SRv6 path steps of a host: choosing source addresses, checking path MTUs, opening path sockets.

A host that sends through the kernel SRv6 fabric (docs/DESIGN.md §4-§5) reads the path
table the testbed writes (`mrc.io.pathtable`). This module holds what a host does with that table
when it binds and when it connects: pick its own address on each plane when none was given
(`client_binds`), check that payload + headers + SRH fit every path's MTU and open one send socket
per path toward a peer (`client_paths`), check every path leaving its addresses when it does not
know its peers yet (`server_paths`), and count the paths of each plane toward a peer
(`path_counts`, the core's `plane_paths`). Every problem is a `NodeError` with one line. The
sockets themselves are `mrc.io.srv6`; what to do with them is `Node`'s.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

from mrc.io.pathtable import PathTable, PathTableError
from mrc.io.planes import PlaneSocket, SockAddr
from mrc.io.srv6 import PathSockets, check_path_mtu

from .errors import NodeError

__all__ = ["client_binds", "client_paths", "path_counts", "server_paths"]


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
            raise NodeError(
                f"--paths {table.source}: none of the sources toward {server} on plane {plane} "
                f"({listed}) is an address of this host; give -B"
            )
        else:
            raise NodeError(
                f"--paths {table.source}: several local sources reach {server} on plane "
                f"{plane} ({', '.join(mine)}); give -B"
            )
    return binds


def client_paths(
    paths: PathSockets,
    planes: Mapping[int, PlaneSocket],
    peers: Mapping[int, SockAddr],
    payload_mtu: int,
    port: int,
    *,
    secured: bool = False,
) -> tuple[dict[int, int], list[str]]:
    """Check every path's MTU toward `peers` and open their path sockets in `paths`.

    Returns the path count of each plane (for the core's config) and lines that describe the
    paths; raises NodeError (one line) when a path cannot be used.
    """
    table = paths.table
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
                raise NodeError(
                    f"--paths {table.source}: {src} -> {dst} is plane {others[0]} in the table "
                    f"but plane {plane} here; list the addresses in plane order"
                )
            lines.append(f"plane {plane}: {src} -> {dst} direct (not in the path table)")
            continue
        found = True
        try:
            mtus = check_path_mtu(entry, payload_mtu, port=port, secured=secured)
        except PathTableError as exc:
            raise NodeError(str(exc)) from None
        names = ", ".join(p.describe() for p in entry.paths)
        lines.append(
            f"plane {plane}: {entry.src_node} -> {entry.dst_node}, {len(entry.paths)} path"
            f"{'s' if len(entry.paths) != 1 else ''}: {names} (MTU {min(mtus.values())})"
        )
    if not found:
        pairs = ", ".join(f"{s} -> {d}" for s, d in zip(locals_, remotes, strict=True))
        raise NodeError(f"--paths {table.source} has no entry for {pairs} on any plane")
    try:
        for plane, sock in planes.items():
            paths.open(sock, peers[plane])
    except PathTableError as exc:
        raise NodeError(str(exc)) from None
    return counts, lines


def server_paths(
    table: PathTable,
    planes: Mapping[int, PlaneSocket],
    payload_mtu: int,
    port: int,
    *,
    secured: bool = False,
) -> tuple[PathSockets, dict[int, int], list[str]]:
    """The server's side of `client_paths`: it does not know its peers yet, so it checks the
    MTU of every path leaving its addresses and opens path sockets when a peer shows up."""
    binds = [str(planes[p].bound_addr[0]) for p in sorted(planes)]
    entries = 0
    for plane, src in enumerate(binds):
        leaving = table.entries_from(src, plane)
        for entry in leaving:
            try:
                check_path_mtu(entry, payload_mtu, port=port, secured=secured)
            except PathTableError as exc:
                raise NodeError(str(exc)) from None
        entries += len(leaving)
    if not entries:
        raise NodeError(
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



"""SRv6 paths on real sockets: per-path send sockets and the path-MTU check.

Holds:

- `PathSockets`: for each (plane, peer) with SRv6 paths, one send socket per path carrying that
  path's SRH as a sticky `IPV6_RTHDR` option (the kernel copies it into every GSO segment,
  docs/DESIGN.md §11). `via(plane_socket, peer, ev)` picks path `(ev & 0xFFFFFF) % paths`;
- `check_path_mtu`: payload + mrc headers + UDP + IP + SRH must fit the MTU of the route to the
  first hop, else one line naming plane, path, sizes and the `--payload-mtu` that would fit.

Source port: path sockets bind the plane socket's own address and port (SO_REUSEPORT), so the
peer sees one address per plane whichever path a packet took. A reuseport group would spread
incoming datagrams over its members; a one-instruction classic BPF program (`ret 0`) steers them
all to member 0, the plane socket, which stays the only socket io reads. Path sockets are never
connected (a connected member would win the lookup for its peer's datagrams); they send with an
explicit address, and all their counters live in the plane socket (`PlaneSocket.send(via=…)`).

What it leaves to others: the path table (`mrc.io.pathtable`), building the SRH bytes
(`mrc.wire.srh`), choosing EVs (`mrc.core`) and reading sockets (`mrc.io.endpoint`).
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mrc.core.config import MIN_PAYLOAD_MTU
from mrc.wire.bth import Opcode
from mrc.wire.packet import data_header_size
from mrc.wire.trailer import TRAILER_SIZE

from .pathtable import IpAddress, PathEntry, PathTable, PathTableError, SrPath, parse_addr
from .planes import (
    DEFAULT_BUFFER_BYTES,
    ECT0,
    SO_SNDBUFFORCE,
    PlaneSocket,
    SockAddr,
    set_recverr,
)

__all__ = [
    "MRC_DATA_HEADERS",
    "PathMtuError",
    "PathSockets",
    "check_path_mtu",
    "packet_size",
    "route_mtu",
]


#: Bytes of mrc headers in front of the largest data packet's payload: BTH, EVXH, METH, TSETH,
#: RETH and ImmDt (docs/WIRE.md §2–§3). A secured connection adds the trailer (`TRAILER_SIZE`).
MRC_DATA_HEADERS = data_header_size(Opcode.WRITE_ONLY_IMM, ts=True)
UDP_HEADER = 8
IP_HEADER = {4: 20, 6: 40}
#: Linux getsockopt options for the MTU of a connected socket's route.
IPV6_MTU = 24
IP_MTU = 14
SO_ATTACH_REUSEPORT_CBPF = 51
_BPF_RET_K = 0x06



class PathMtuError(PathTableError):
    """A path whose MTU cannot carry the configured payload; the message names the fix."""


# -- path MTU -------------------------------------------------------------------------------


def packet_size(
    payload_mtu: int, path: SrPath, *, ip_version: int = 6, secured: bool = False
) -> int:
    """Bytes on the wire (IP header onward) of the largest data packet sent on `path`."""
    trailer = TRAILER_SIZE if secured else 0
    return (
        payload_mtu
        + MRC_DATA_HEADERS
        + trailer
        + UDP_HEADER
        + IP_HEADER[ip_version]
        + path.srh_size()
    )


def route_mtu(local: IpAddress, dst: IpAddress, path: SrPath, port: int = 4791) -> int:
    """The MTU of the route the kernel picks toward `path`'s first hop from `local`.

    A scratch UDP socket with the path's SRH is bound to `local` and connected to `dst` (with a
    sticky SRH, the kernel routes toward the first segment), then asked for its route's MTU.
    Raises OSError when there is no route.
    """
    family = socket.AF_INET6 if dst.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        srh = path.srh(dst)
        if srh is not None:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RTHDR, srh.encode())
        s.bind((str(local), 0))
        s.connect((str(dst), port or 4791))
        if family == socket.AF_INET6:
            return int(s.getsockopt(socket.IPPROTO_IPV6, IPV6_MTU))
        return int(s.getsockopt(socket.IPPROTO_IP, IP_MTU))


def check_path_mtu(
    entry: PathEntry,
    payload_mtu: int,
    *,
    secured: bool = False,
    port: int = 4791,
    mtu_of: Callable[[IpAddress, IpAddress, SrPath], int] | None = None,
) -> dict[str, int]:
    """Check that every path of `entry` carries `payload_mtu`; return {path name: route MTU}.

    Raises PathMtuError naming the plane, the path, the sizes and the `--payload-mtu` that would
    fit, or PathTableError when the route toward a path's first hop cannot be found.
    """
    out: dict[str, int] = {}
    for path in entry.paths:
        try:
            mtu = (
                mtu_of(entry.src, entry.dst, path)
                if mtu_of is not None
                else route_mtu(entry.src, entry.dst, path, port)
            )
        except OSError as exc:
            hop = path.segments[0] if path.segments else entry.dst
            raise PathTableError(
                f"plane {entry.plane}, path {path.name}: no route from {entry.src} toward "
                f"{hop}: {exc.strerror or exc}"
            ) from None
        size = packet_size(payload_mtu, path, ip_version=entry.dst.version, secured=secured)
        if size > mtu:
            raise PathMtuError(mtu_message(entry, path, payload_mtu, mtu, secured=secured))
        out[path.name] = mtu
    return out


def mtu_message(
    entry: PathEntry, path: SrPath, payload_mtu: int, mtu: int, *, secured: bool = False
) -> str:
    """The one line that says a path's MTU is too small, with the arithmetic and the fix."""
    ip = IP_HEADER[entry.dst.version]
    trailer = TRAILER_SIZE if secured else 0
    size = packet_size(payload_mtu, path, ip_version=entry.dst.version, secured=secured)
    parts = [f"{payload_mtu} payload", f"{MRC_DATA_HEADERS} mrc headers"]
    if trailer:
        parts.append(f"{trailer} security trailer")
    parts += [f"{UDP_HEADER} UDP", f"{ip} IPv{entry.dst.version}"]
    if path.segments:
        parts.append(f"{path.srh_size()} SRH ({len(path.segments) + 1} segments)")
    fits = payload_mtu - (size - mtu)
    fix = (
        f"use --payload-mtu {fits} or less"
        if fits >= MIN_PAYLOAD_MTU
        else f"even --payload-mtu {MIN_PAYLOAD_MTU} does not fit; raise the link MTU"
    )
    return (
        f"plane {entry.plane}, path {path.name} ({entry.src} -> {entry.dst}): "
        f"{' + '.join(parts)} = {size} bytes > path MTU {mtu}; {fix}"
    )


# -- per-path sockets -----------------------------------------------------------------------


def _steer_group_to_first(sock: socket.socket) -> None:
    """Attach `ret 0` to the socket's reuseport group: every datagram goes to member 0."""
    insn = (ctypes.c_uint8 * 8).from_buffer_copy(struct.pack("=HBBI", _BPF_RET_K, 0, 0, 0))
    fprog = struct.pack("@HP", 1, ctypes.addressof(insn))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)


def _send_buffer(sock: socket.socket, size: int) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, size)
    except OSError:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


@dataclass(slots=True)
class PlanePaths:
    """The paths of one (plane, peer) and their send sockets (None = the plane socket)."""

    entry: PathEntry | None
    #: One per path of an SRv6 entry; empty when everything toward the peer is direct.
    socks: tuple[socket.socket | None, ...]


class PathSockets:
    """Per-path send sockets of one endpoint, opened per (plane, peer address).

    `open` does it up front (errors are raised); `via` opens on first use for a peer it has not
    seen (an error is then kept once in `errors`, for the owner to take with `take_errors`, and
    that peer's plane stays direct).
    Planes and peers the table does not name are direct: `via` returns None.
    """

    def __init__(
        self,
        table: PathTable,
        *,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        tos: int = ECT0,
    ) -> None:
        self.table = table
        self.buffer_bytes = buffer_bytes
        self.tos = tos
        #: Paths that failed to open on first use, one line each, until taken.
        self.errors: list[str] = []
        self._routes: dict[tuple[int, Any], tuple[socket.socket | None, ...]] = {}
        self._opened: dict[tuple[int, Any], PlanePaths] = {}
        self._steered: set[int] = set()
        self._closed = False

    def open(self, plane: PlaneSocket, peer: SockAddr) -> PlanePaths:
        """Open (once) the path sockets toward `peer` on `plane`; raises PathTableError."""
        key = (plane.plane, peer)
        known = self._opened.get(key)
        if known is not None:
            return known
        local = parse_addr(str(plane.bound_addr[0]))
        entry = self.table.lookup(local, parse_addr(str(peer[0])), plane.plane)
        socks: list[socket.socket | None] = []
        if entry is not None and entry.srv6:
            if local.is_unspecified:
                raise PathTableError(
                    f"plane {plane.plane} is bound to {local}; SRv6 paths need its own "
                    "address (give -B)"
                )
            if not plane.sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT):
                raise PathTableError(
                    f"plane {plane.plane}: its socket was opened without reuseport, so SRv6 "
                    "path sockets cannot share its port"
                )
            try:
                if plane.fileno() not in self._steered:
                    _steer_group_to_first(plane.sock)
                    self._steered.add(plane.fileno())
                for path in entry.paths:
                    socks.append(None if path.direct else self._path_socket(plane, entry, path))
            except OSError as exc:
                for s in socks:
                    if s is not None:
                        s.close()
                raise PathTableError(
                    f"plane {plane.plane}: cannot open the SRv6 path sockets on "
                    f"{plane.bound_addr[0]} port {plane.bound_addr[1]}: {exc.strerror or exc}"
                ) from None
        result = PlanePaths(entry, tuple(socks))
        self._opened[key] = result
        self._routes[key] = result.socks
        return result

    def _path_socket(self, plane: PlaneSocket, entry: PathEntry, path: SrPath) -> socket.socket:
        srh = path.srh(entry.dst)
        assert srh is not None
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        try:
            s.setblocking(False)
            _send_buffer(s, self.buffer_bytes)
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, self.tos)
            set_recverr(s, socket.AF_INET6)  # a full qdisc reports ENOBUFS here too
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RTHDR, srh.encode())
            s.bind(plane.bound_addr)
        except BaseException:
            s.close()
            raise
        return s

    def via(self, plane: PlaneSocket, peer: Any, ev: int) -> socket.socket | None:
        """The socket that sends a packet with `ev` to `peer` on `plane` (None: the plane's)."""
        socks = self._routes.get((plane.plane, peer))
        if socks is None:
            socks = self._open_lazily(plane, peer)
        if not socks:
            return None
        return socks[(ev & 0xFFFFFF) % len(socks)]

    def _open_lazily(self, plane: PlaneSocket, peer: Any) -> tuple[socket.socket | None, ...]:
        key = (plane.plane, peer)
        if self._closed or not isinstance(peer, tuple) or not peer:
            self._routes[key] = ()
            return ()
        try:
            return self.open(plane, peer).socks
        except (PathTableError, ValueError) as exc:
            self._routes[key] = ()
            self.errors.append(str(exc))
            return ()

    def take_errors(self) -> list[str]:
        """The errors of paths opened on first use since the last call."""
        found = self.errors
        if found:
            self.errors = []
        return found

    def source_routed(self, plane: PlaneSocket, peer: Any) -> bool:
        """Does anything toward `peer` on `plane` leave on a path socket (opening them now)?

        Such a plane socket must not be connected: the peer may be reachable only through SIDs.
        """
        if (plane.plane, peer) not in self._routes:
            self._open_lazily(plane, peer)
        return any(s is not None for s in self._routes.get((plane.plane, peer), ()))

    def close(self) -> None:
        """Close every path socket (the plane sockets belong to the caller). Idempotent."""
        self._closed = True
        for opened in self._opened.values():
            for s in opened.socks:
                if s is not None:
                    s.close()
        self._opened.clear()
        self._routes.clear()

"""SRv6 paths on real sockets: the path table, per-path send sockets and the path-MTU check.

Holds:

- `PathTable`, loaded strictly from the JSON file the testbed writes (`PathTable.load`), keyed
  by (source address, destination address, plane); `paths_per_plane` gives the path count of
  each plane for the core's config (DESIGN.md §4: route = selector mod the plane's path count);
- `PathSockets`: for each (plane, peer) with SRv6 paths, one send socket per path carrying that
  path's SRH as a sticky `IPV6_RTHDR` option (the kernel copies it into every GSO segment,
  DESIGN.md §11). `via(plane_socket, peer, ev)` picks path `(ev & 0xFFFFFF) % paths`;
- `check_path_mtu`: payload + mrc headers + UDP + IP + SRH must fit the MTU of the route to the
  first hop, else one line naming plane, path, sizes and the `--payload-mtu` that would fit.

Source port: path sockets bind the plane socket's own address and port (SO_REUSEPORT), so the
peer sees one address per plane whichever path a packet took. A reuseport group would spread
incoming datagrams over its members; a one-instruction classic BPF program (`ret 0`) steers them
all to member 0, the plane socket, which stays the only socket io reads. Path sockets are never
connected (a connected member would win the lookup for its peer's datagrams); they send with an
explicit address, and all their counters live in the plane socket (`PlaneSocket.send(via=…)`).

What it leaves to others: building the SRH bytes (`mrc.wire.srh`), choosing EVs (`mrc.core`),
reading sockets (`mrc.io.endpoint`), and writing the table (the testbed, `tools/testbed`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import math
import socket
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mrc.core.config import MAX_PLANE_PATHS, MIN_PAYLOAD_MTU
from mrc.wire.bth import Opcode
from mrc.wire.packet import data_header_size
from mrc.wire.srh import SRH
from mrc.wire.trailer import Trailer

from .planes import DEFAULT_BUFFER_BYTES, ECT0, SO_SNDBUFFORCE, PlaneSocket, SockAddr

__all__ = [
    "MAX_PLANE",
    "MAX_SEGMENTS",
    "MRC_DATA_HEADERS",
    "PathEntry",
    "PathMtuError",
    "PathSockets",
    "PathTable",
    "PathTableError",
    "SrPath",
    "check_path_mtu",
    "packet_size",
    "route_mtu",
]

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Bytes of mrc headers in front of the largest data packet's payload: BTH, EVXH, METH, TSETH,
#: RETH and ImmDt (WIRE.md §2–§3). A secured connection adds the trailer (`Trailer.SIZE`).
MRC_DATA_HEADERS = data_header_size(Opcode.WRITE_ONLY_IMM, ts=True)
UDP_HEADER = 8
IP_HEADER = {4: 20, 6: 40}
#: Segments of one path, destination excluded: the SRH (with the destination) must stay within
#: Hdr Ext Len's 8 bits (RFC 8754 §2: at most 127 segments of 16 bytes).
MAX_SEGMENTS = 126
MAX_PLANE = 31
#: Linux getsockopt options for the MTU of a connected socket's route.
IPV6_MTU = 24
IP_MTU = 14
SO_ATTACH_REUSEPORT_CBPF = 51
_BPF_RET_K = 0x06

_TOP_KEYS = {"version", "testbed", "entries"}
_ENTRY_KEYS = {"src", "dst", "plane", "src_node", "dst_node", "paths"}
_PATH_KEYS = {"name", "segments"}


class PathTableError(ValueError):
    """A path table that cannot be used; the message is one line for the user."""


class PathMtuError(PathTableError):
    """A path whose MTU cannot carry the configured payload; the message names the fix."""


@dataclass(frozen=True, slots=True)
class SrPath:
    """One path: its name and its SIDs in travel order, the destination excluded."""

    name: str
    segments: tuple[ipaddress.IPv6Address, ...]

    @property
    def direct(self) -> bool:
        """No SIDs: the packet goes out without an SRH."""
        return not self.segments

    def srh(self, dst: IpAddress) -> SRH | None:
        """The SRH for this path to `dst`, None for a direct path."""
        if not self.segments:
            return None
        return SRH.for_path([*self.segments, ipaddress.IPv6Address(str(dst))])

    def srh_size(self) -> int:
        return 0 if not self.segments else SRH.SIZE + 16 * (len(self.segments) + 1)

    def describe(self) -> str:
        if not self.segments:
            return f"{self.name} (direct)"
        return f"{self.name} via {','.join(str(s) for s in self.segments)}"


@dataclass(frozen=True, slots=True)
class PathEntry:
    """The paths from `src` to `dst` on `plane`."""

    src: IpAddress
    dst: IpAddress
    plane: int
    src_node: str
    dst_node: str
    paths: tuple[SrPath, ...]

    @property
    def srv6(self) -> bool:
        """At least one path carries an SRH."""
        return any(p.segments for p in self.paths)


def _addr(text: str) -> IpAddress:
    """Parse a numeric address, allowing `[v6]` brackets and a `%scope` suffix."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return ipaddress.ip_address(text.split("%", 1)[0])


class _Checker:
    """Strict field checks that name where in the file the problem is."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, what: str) -> PathTableError:
        return PathTableError(
            f"{self.source}: {where}: {what}" if where else f"{self.source}: {what}"
        )

    def obj(self, value: Any, where: str, keys: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected an object, got {_kind(value)}")
        missing = sorted(keys - value.keys())
        if missing:
            raise self.fail(where, f"missing key {missing[0]!r}")
        extra = sorted(value.keys() - keys)
        if extra:
            raise self.fail(where, f"unknown key {extra[0]!r}")
        return value

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, f"expected a non-empty string, got {_kind(value)}")
        return value

    def addr(self, value: Any, where: str) -> IpAddress:
        text = self.text(value, where)
        try:
            return _addr(text)
        except ValueError:
            raise self.fail(where, f"{text!r} is not an IP address") from None

    def sid(self, value: Any, where: str) -> ipaddress.IPv6Address:
        text = self.text(value, where)
        try:
            return ipaddress.IPv6Address(text.strip())
        except ValueError:
            raise self.fail(where, f"{text!r} is not an IPv6 address (a SID)") from None

    def integer(self, value: Any, where: str, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"expected an integer, got {_kind(value)}")
        if not lo <= value <= hi:
            raise self.fail(where, f"{value} is outside {lo}..{hi}")
        return value

    def array(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(where, f"expected a list, got {_kind(value)}")
        if not value:
            raise self.fail(where, "is empty")
        return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string"}.get(
        type(value), "a list" if isinstance(value, list) else "an object"
    )


class PathTable:
    """The SRv6 paths of a testbed, by (source address, destination address, plane)."""

    def __init__(
        self, entries: Iterable[PathEntry], *, testbed: str = "", source: str = ""
    ) -> None:
        self.testbed = testbed
        self.source = source
        self.entries: dict[tuple[IpAddress, IpAddress, int], PathEntry] = {}
        for e in entries:
            self.entries[(e.src, e.dst, e.plane)] = e

    # -- loading ----------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str) -> PathTable:
        """Read and check a path table file; PathTableError (one line) on any problem."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise PathTableError(f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise PathTableError(f"{path}: not UTF-8 text") from None
        return cls.parse(text, source=path)

    @classmethod
    def parse(cls, text: str, *, source: str = "path table") -> PathTable:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PathTableError(
                f"{source}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
            ) from None
        except RecursionError:
            raise PathTableError(f"{source}: not valid JSON: nested too deeply") from None
        return cls.from_document(doc, source=source)

    @classmethod
    def from_document(cls, doc: Any, *, source: str = "path table") -> PathTable:
        c = _Checker(source)
        top = c.obj(doc, "", _TOP_KEYS)
        if isinstance(top["version"], bool) or top["version"] != 1:
            raise c.fail("version", f"unsupported version {top['version']!r} (this mrc reads 1)")
        testbed = c.text(top["testbed"], "testbed")
        entries: dict[tuple[IpAddress, IpAddress, int], PathEntry] = {}
        for i, raw in enumerate(c.array(top["entries"], "entries")):
            entry = _entry(c, raw, f"entries[{i}]")
            key = (entry.src, entry.dst, entry.plane)
            if key in entries:
                raise c.fail(
                    f"entries[{i}]",
                    f"a second entry for {entry.src} -> {entry.dst} on plane {entry.plane}",
                )
            entries[key] = entry
        return cls(entries.values(), testbed=testbed, source=source)

    # -- lookup -----------------------------------------------------------------------------

    def lookup(self, src: str | IpAddress, dst: str | IpAddress, plane: int) -> PathEntry | None:
        """The entry for (src, dst, plane), or None (that plane is direct between them)."""
        try:
            key = (_as_addr(src), _as_addr(dst), plane)
        except ValueError:
            return None
        return self.entries.get(key)

    def planes_between(self, src: str | IpAddress, dst: str | IpAddress) -> list[int]:
        """The planes on which the table has an entry from `src` to `dst`."""
        try:
            s, d = _as_addr(src), _as_addr(dst)
        except ValueError:
            return []
        return sorted(p for (es, ed, p) in self.entries if es == s and ed == d)

    def sources_for(self, dst: str | IpAddress, plane: int) -> list[IpAddress]:
        """The source addresses that have an entry toward `dst` on `plane`."""
        try:
            d = _as_addr(dst)
        except ValueError:
            return []
        return sorted({s for (s, ed, p) in self.entries if ed == d and p == plane}, key=str)

    def entries_from(self, src: str | IpAddress, plane: int) -> list[PathEntry]:
        """Every entry leaving `src` on `plane` (a server checks these before it knows peers)."""
        try:
            s = _as_addr(src)
        except ValueError:
            return []
        return [e for (es, _, p), e in self.entries.items() if es == s and p == plane]

    def paths_per_plane(self, local: Sequence[str], remote: Sequence[str]) -> dict[int, int]:
        """Paths of each plane from local[i] to remote[i] (plane i); 1 where there is no entry."""
        out: dict[int, int] = {}
        for plane, (src, dst) in enumerate(zip(local, remote, strict=True)):
            entry = self.lookup(src, dst, plane)
            out[plane] = len(entry.paths) if entry is not None else 1
        return out

    def server_paths_from(self, local: Sequence[str]) -> dict[int, int]:
        """For a side that does not know its peers yet (a server): a path count for plane i
        that every entry leaving local[i] on plane i divides (their least common multiple).

        Selectors are spread evenly over `selector mod count` (DESIGN.md §4), so they are then
        spread evenly over each peer's own paths too: a server whose peers sit one or two
        paths away still gets a reverse EV on each of a far peer's paths.
        """
        out: dict[int, int] = {}
        for plane, src in enumerate(local):
            counts = {len(e.paths) for e in self.entries_from(src, plane)}
            out[plane] = min(math.lcm(*counts), MAX_PLANE_PATHS) if counts else 1
        return out

    def __len__(self) -> int:
        return len(self.entries)


def _as_addr(value: str | IpAddress) -> IpAddress:
    return value if not isinstance(value, str) else _addr(value)


def _entry(c: _Checker, raw: Any, where: str) -> PathEntry:
    e = c.obj(raw, where, _ENTRY_KEYS)
    src = c.addr(e["src"], f"{where}.src")
    dst = c.addr(e["dst"], f"{where}.dst")
    if src.version != dst.version:
        raise c.fail(where, f"src {src} and dst {dst} are not of the same address family")
    if src == dst:
        raise c.fail(where, f"src and dst are the same address {src}")
    plane = c.integer(e["plane"], f"{where}.plane", 0, MAX_PLANE)
    src_node = c.text(e["src_node"], f"{where}.src_node")
    dst_node = c.text(e["dst_node"], f"{where}.dst_node")
    paths: list[SrPath] = []
    names: set[str] = set()
    for j, rawp in enumerate(c.array(e["paths"], f"{where}.paths")):
        pw = f"{where}.paths[{j}]"
        p = c.obj(rawp, pw, _PATH_KEYS)
        name = c.text(p["name"], f"{pw}.name")
        if name in names:
            raise c.fail(f"{pw}.name", f"duplicate path name {name!r}")
        names.add(name)
        segs = p["segments"]
        if not isinstance(segs, list):
            raise c.fail(f"{pw}.segments", f"expected a list, got {_kind(segs)}")
        if len(segs) > MAX_SEGMENTS:
            raise c.fail(f"{pw}.segments", f"{len(segs)} segments, at most {MAX_SEGMENTS}")
        sids = tuple(c.sid(s, f"{pw}.segments[{k}]") for k, s in enumerate(segs))
        if sids and src.version != 6:
            raise c.fail(pw, f"SRv6 segments need IPv6 src and dst, got {src} -> {dst}")
        if sids and sids[-1] == dst:
            raise c.fail(
                f"{pw}.segments", "ends with the destination; list the SIDs before it only"
            )
        paths.append(SrPath(name, sids))
    return PathEntry(src, dst, plane, src_node, dst_node, tuple(paths))


# -- path MTU -------------------------------------------------------------------------------


def packet_size(
    payload_mtu: int, path: SrPath, *, ip_version: int = 6, secured: bool = False
) -> int:
    """Bytes on the wire (IP header onward) of the largest data packet sent on `path`."""
    trailer = Trailer.SIZE if secured else 0
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
    trailer = Trailer.SIZE if secured else 0
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
    seen (errors are then reported to `on_error` once and that peer's plane stays direct).
    Planes and peers the table does not name are direct: `via` returns None.
    """

    def __init__(
        self,
        table: PathTable,
        *,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        tos: int = ECT0,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.table = table
        self.buffer_bytes = buffer_bytes
        self.tos = tos
        self.on_error = on_error
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
        local = _addr(str(plane.bound_addr[0]))
        entry = self.table.lookup(local, _addr(str(peer[0])), plane.plane)
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
            if self.on_error is not None:
                self.on_error(str(exc))
            return ()

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

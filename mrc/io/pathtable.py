"""The SRv6 path table: which paths lead from one host to another on each plane.

Holds `PathTable`, loaded strictly from the JSON file the testbed writes (`PathTable.load`),
keyed by (source address, destination address, plane), with `SrPath` (a path's SIDs) and
`PathEntry` (one source, destination and plane). `paths_per_plane` gives the path count of each
plane for the core's config (docs/DESIGN.md §4: route = selector mod the plane's path count), and
`server_paths_from` one that suits every peer of a server that does not know its peers yet.
Every fault in the file is one `PathTableError` line naming the field.

What it leaves to others: sockets and the path-MTU check (`mrc.io.srv6`), building the SRH
bytes (`mrc.wire.srh`), and writing the file (the testbed, `tools/testbed`).
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mrc.core.config import MAX_PLANE_PATHS
from mrc.wire.srh import SRH, SRH_SIZE

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Segments of one path, destination excluded: the SRH (with the destination) must stay within
#: Hdr Ext Len's 8 bits (RFC 8754 §2: at most 127 segments of 16 bytes).
MAX_SEGMENTS = 126
MAX_PLANE = 31

_TOP_KEYS = {"version", "testbed", "entries"}
_ENTRY_KEYS = {"src", "dst", "plane", "src_node", "dst_node", "paths"}
_PATH_KEYS = {"name", "segments"}


class PathTableError(ValueError):
    """A path table that cannot be used; the message is one line for the user."""


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
        return 0 if not self.segments else SRH_SIZE + 16 * (len(self.segments) + 1)

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


def parse_addr(text: str) -> IpAddress:
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
            return parse_addr(text)
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

        Selectors are spread evenly over `selector mod count` (docs/DESIGN.md §4), so they are then
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
    return value if not isinstance(value, str) else parse_addr(value)


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

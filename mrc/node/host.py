"""`Node`: one host's transport — its plane sockets, SRv6 path sockets, core endpoint and regions.

What `mrc bench`, the peer daemon and the examples stand on (docs/DESIGN.md §1): a node
binds one UDP socket per plane (an address each, optionally pinned to an interface), loads the
SRv6 path table when one is given and checks that payload + headers + SRH fit every path's MTU,
owns the sans-I/O core `Endpoint` with its `RegionTable`, and runs them on an event loop through
`mrc.io.IoEndpoint`. Every set-up problem is a `NodeError` with one line.

What it leaves to others: what a connection is used for (the bench's tests, the daemon's
applications) and the protocol itself (`mrc.core`). It owns no policy: the `SessionConfig` of a
connection comes from its caller, completed here only with the path count of each plane.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from mrc.core.config import EV_ENCODINGS, SessionConfig
from mrc.core.endpoint import AcceptFn, Endpoint
from mrc.core.events import Event
from mrc.core.memory import RegionTable
from mrc.core.session import Session
from mrc.core.sink import TraceLog, TraceSink
from mrc.io.endpoint import IoEndpoint
from mrc.io.pathtable import PathTable
from mrc.io.planes import PlaneSocket, SockAddr, resolve_addr
from mrc.io.srv6 import PathSockets

from .errors import NodeError
from .paths import client_paths, path_counts, server_paths

__all__ = [
    "EV_ENCODINGS",
    "SPORT_POOL",
    "EventHandler",
    "EventsHandler",
    "Node",
    "bind_planes",
    "resolve_peer",
]

#: Source ports per plane of a node whose EVs pick their source port ("udp").
SPORT_POOL = 128

EventHandler = Callable[[Session, Event], None]
#: Takes every event of one flush at once, in order.
EventsHandler = Callable[[Session, list[Event]], None]

log = logging.getLogger("mrc.node")


def bind_planes(
    addrs: Sequence[str],
    port: int,
    *,
    reuseport: bool = False,
    interfaces: Sequence[str | None] = (),
    flowlabel: bool = False,
    pool: int = 0,
) -> dict[int, PlaneSocket]:
    """One plane socket per address (plane i = addrs[i]), bound to `interfaces[i]` when given;
    `reuseport` lets SRv6 path sockets share the port; `flowlabel` makes each datagram carry its
    EV in the IPv6 flow label, `pool` gives each plane that many more source ports for EVs to
    pick (docs/DESIGN.md §4). Port 0 on distinct addresses picks one free port for every
    plane (a peer names one port for all of them), trying again when a later plane finds it
    taken; on repeated ones (a client's wildcards) each plane takes a port of its own. Closes
    what it opened on failure."""
    share = port == 0 and 1 < len(addrs) == len(set(addrs))
    for _ in range(16 if share else 1):
        try:
            return _bind_planes(addrs, port, share, reuseport, interfaces, flowlabel, pool)
        except _PortTaken:
            continue
    raise NodeError(f"no port was free on all of {', '.join(addrs)}")


class _PortTaken(Exception):
    """A plane after the first could not take the port plane 0 was given (port 0)."""


def _bind_planes(
    addrs: Sequence[str],
    port: int,
    share: bool,
    reuseport: bool,
    interfaces: Sequence[str | None],
    flowlabel: bool,
    pool: int,
) -> dict[int, PlaneSocket]:
    planes: dict[int, PlaneSocket] = {}
    chosen = port
    try:
        for i, host in enumerate(addrs):
            try:
                planes[i] = PlaneSocket(
                    i, host, chosen, gro=True, reuseport=reuseport, flowlabel=flowlabel, pool=pool
                )
                if share:
                    chosen = planes[i].local_addr[1]
            except socket.gaierror as exc:
                raise NodeError(f"cannot resolve {host!r} (plane {i}): {exc.strerror}") from None
            except OSError as exc:
                if share and i > 0 and exc.errno == errno.EADDRINUSE:
                    raise _PortTaken from None
                if flowlabel and exc.errno == errno.EAFNOSUPPORT:
                    raise NodeError(
                        f"EVs in the flow label need IPv6 on every plane; plane {i} is {host}"
                    ) from None
                reason = exc.strerror or str(exc)
                raise NodeError(f"cannot bind {host} port {port} (plane {i}): {reason}") from None
            ifname = interfaces[i] if i < len(interfaces) else None
            if ifname:
                try:
                    planes[i].sock.setsockopt(
                        socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode()
                    )
                except OSError as exc:
                    reason = exc.strerror or str(exc)
                    raise NodeError(
                        f"cannot bind plane {i} to interface {ifname!r}: {reason}"
                    ) from None
    except BaseException:
        for s in planes.values():
            s.close()
        raise
    return planes


def resolve_peer(addrs: Sequence[str], port: int) -> dict[int, SockAddr]:
    """A peer's socket address on each plane; NodeError naming the plane when one fails."""
    peers: dict[int, SockAddr] = {}
    for i, host in enumerate(addrs):
        try:
            _, peers[i] = resolve_addr(host, port)
        except OSError as exc:
            raise NodeError(f"cannot resolve {host!r} (plane {i}): {exc.strerror or exc}") from None
    return peers


class Node:
    """A host bound to its planes, driving a core endpoint on an event loop.

    With `table` (an SRv6 path table) the node checks the MTU of every path, with room for the
    security trailer when `secured`: at once for every path leaving its addresses when `serve`
    is set (a listener cannot know its peers in advance), and toward a peer when it connects
    (`connect`, `open_paths`); it opens path sockets then, or the first time it answers a peer.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        binds: Sequence[str],
        port: int,
        *,
        table: PathTable | None = None,
        payload_mtu: int = 4096,
        serve: bool = False,
        rng: random.Random | None = None,
        endpoint: Endpoint | None = None,
        on_event: EventHandler | None = None,
        on_events: EventsHandler | None = None,
        on_error: Callable[[str], None] | None = None,
        interfaces: Sequence[str | None] = (),
        secured: bool = False,
        ev_encoding: str = "evxh",
    ) -> None:
        self.loop = loop
        self.rng = rng if rng is not None else random.Random()
        # QPNs, initial PSNs and nonces from the OS's generator (mrc.core.endpoint).
        self.endpoint = (
            endpoint
            if endpoint is not None
            else Endpoint(rng=self.rng, regions=None, ids=random.SystemRandom())
        )
        self.regions: RegionTable = self.endpoint.regions
        self.table = table
        self.payload_mtu = payload_mtu
        #: Connections carry the 24-byte security trailer: path MTU checks reserve room for it.
        self.secured = secured
        self.on_event = on_event
        #: When set, takes the events instead of `on_event`, a flush's worth per call.
        self.on_events = on_events
        self.on_error = on_error
        #: Paths of each plane this node's listener spreads its EVs over (1 = direct).
        self.plane_paths: dict[int, int] = {}
        #: Lines that describe the SRv6 paths checked so far (for banners and logs).
        self.path_lines: list[str] = []
        if ev_encoding not in EV_ENCODINGS:
            known = ", ".join(EV_ENCODINGS)
            raise NodeError(f"unknown EV encoding {ev_encoding!r} (one of {known})")
        flowlabel = ev_encoding == "flowlabel"
        if ev_encoding != "evxh" and table is not None:
            raise NodeError(f"EVs in the {'flow label' if flowlabel else 'source port'} are for "
                            "ECMP fabrics; SRv6 paths (--paths) name their path in the segment "
                            "list")  # fmt: skip
        #: Where each datagram's EV rides besides or instead of its EVXH: "evxh" (nowhere
        #: else), "flowlabel" (the IPv6 flow label) or "udp" (it picks the source port), so
        #: ECMP switches spray on it.
        self.ev_encoding = ev_encoding
        planes = bind_planes(
            binds, port, reuseport=table is not None, interfaces=interfaces, flowlabel=flowlabel,
            pool=SPORT_POOL if ev_encoding == "udp" else 0,
        )  # fmt: skip
        path_sockets: PathSockets | None = None
        try:
            if table is not None:
                if serve:
                    path_sockets, self.plane_paths, self.path_lines = server_paths(
                        table, planes, payload_mtu, port, secured=secured
                    )
                else:
                    path_sockets = PathSockets(table)
        except BaseException:
            for sock in planes.values():
                sock.close()
            raise
        self.io: IoEndpoint[Session] = IoEndpoint(
            loop,
            self.endpoint,
            planes,
            on_events=self._on_events,
            on_error=self._on_error,
            paths=path_sockets,
            on_unreachable=self._on_unreachable,
        )
        self.port = planes[0].local_addr[1] if planes else port

    # -- properties -----------------------------------------------------------------------------

    @property
    def planes(self) -> dict[int, PlaneSocket]:
        return self.io.planes

    @property
    def path_sockets(self) -> PathSockets | None:
        return self.io.paths

    def now(self) -> float:
        return self.io.now()

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start reading the plane sockets."""
        self.io.start()

    def close(self) -> None:
        """Close every socket and cancel every timer. Idempotent."""
        self.io.close()

    @property
    def closed(self) -> bool:
        return self.io.closed

    # -- connections ----------------------------------------------------------------------------

    def listen(
        self, config: SessionConfig, accept: AcceptFn, *, trace: TraceLog | None = None
    ) -> None:
        """Accept connections negotiated against `config` (its plane paths filled in here);
        `trace` starts each accepted session's trace (mrc.core.sink)."""
        self.io.listen(self._with_paths(config, self.plane_paths), accept, trace=trace)

    def open_paths(self, peers: Mapping[int, SockAddr]) -> dict[int, int]:
        """Check the MTU of every SRv6 path toward `peers` and open their sockets; returns the
        path count of each plane (1 where the table has none, or without a table)."""
        if self.io.paths is None:
            return {p: 1 for p in self.planes}
        port = next(iter(peers.values()))[1] if peers else self.port
        counts, lines = client_paths(
            self.io.paths, self.planes, peers, self.payload_mtu, port, secured=self.secured
        )
        self.path_lines.extend(lines)
        return counts

    def connect(
        self,
        config: SessionConfig,
        peers: Mapping[int, SockAddr],
        private_data: bytes,
        *,
        connect_sockets: bool = False,
        peer_key: bytes | None = None,
        trace: TraceSink | None = None,
    ) -> Session:
        """Open paths toward `peers`, then start a connection (see `IoEndpoint.connect`;
        `peer_key`: the responder's static key, for a secured connection)."""
        counts = self.open_paths(peers)
        try:
            return self.io.connect(
                self._with_paths(config, counts),
                peers,
                private_data,
                connect_sockets=connect_sockets,
                peer_key=peer_key,
                trace=trace,
            )
        except OSError as exc:
            raise NodeError(f"cannot reach the peer: {exc.strerror or exc}") from None

    def peer_path_counts(self, peer_addrs: Mapping[int, object]) -> dict[int, int]:
        """Paths of each plane toward one session's peer (1 where the table has no entry)."""
        if self.table is None:
            return {p: 1 for p in self.planes}
        return path_counts(self.table, self.planes, peer_addrs)

    def flush(self, session: Session) -> None:
        self.io.flush(session)

    # -- internals ------------------------------------------------------------------------------

    def _with_paths(self, config: SessionConfig, counts: Mapping[int, int]) -> SessionConfig:
        if not counts:
            return config
        paths = tuple(counts.get(p, 1) for p in range(len(config.plane_paths or self.planes)))
        return replace(config, plane_paths=paths).validate()

    def _on_events(self, session: Session, events: list[Event]) -> None:
        if self.on_events is not None:
            self.on_events(session, events)
        elif self.on_event is not None:
            for event in events:
                self.on_event(session, event)

    def _on_unreachable(self, plane: int, addr: SockAddr, now: float) -> list[Session]:
        """An ICMP error said `addr` cannot be reached on `plane`: news for the sessions
        whose peer is there on that plane (docs/DESIGN.md §4)."""
        told = [s for s in self.endpoint.sessions.values() if s.peer_addrs.get(plane) == addr]
        for session in told:
            session.unreachable(plane, addr, now)
        return told

    def _on_error(self, message: str) -> None:
        if self.on_error is not None:
            self.on_error(message)
        else:
            log.error("%s", message)

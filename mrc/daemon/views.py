"""The daemon's read-only views: status, peers, connections, planes, EVs and regions.

Each function answers one control method of docs/DAEMON.md from the service's state, read
through `ServiceState` (what the views need of the service, so they never import it), and
`peer_counters` gathers the per-peer counters (closed connections' totals plus the live
sessions') that both the views and the Prometheus endpoint read. Everything is computed when
asked, from plain integers the data path keeps anyway: nothing here runs per packet. What the
numbers mean is the core's (`mrc.core.stats`); changing state is `service`'s, and which method
name calls which view is `methods`'.

Who sees what: `connections`, `evs` and `regions` show a client only its own rows (a region's
R_Key and VA are what a peer needs to write it), unless the client runs as an admin uid (the
daemon's own or root, who can read the daemon's memory anyway), which sees every row, the
daemon's own (mailboxes, connections peers opened) included.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import mrc
from mrc.core.paths.planes import PlaneState
from mrc.core.stats import PlaneStats
from mrc.node import Node

from .clients import ClientState
from .config import DaemonConfig, PeerConfig
from .conns import Connection, PeerTotals
from .regions import Regions
from .rpc import UNKNOWN_CONNECTION, Params, RpcError

__all__ = [
    "PeerCounters",
    "ServiceState",
    "connections",
    "evs",
    "peer_counters",
    "peers",
    "plane_rows",
    "planes",
    "regions",
    "status",
    "visible",
]


class ServiceState(Protocol):
    """What the views read of the service (`service.Service`); they change none of it."""

    @property
    def config(self) -> DaemonConfig: ...
    @property
    def node(self) -> Node: ...
    @property
    def host(self) -> str: ...
    @property
    def started(self) -> float: ...
    @property
    def peers(self) -> Mapping[str, PeerConfig]: ...
    @property
    def totals(self) -> Mapping[str, PeerTotals]: ...
    @property
    def conns(self) -> Mapping[int, Connection]: ...
    @property
    def clients(self) -> Mapping[int, ClientState]: ...
    @property
    def regions(self) -> Regions: ...
    @property
    def shutting_down(self) -> bool: ...
    @property
    def control_counters(self) -> Mapping[str, int]: ...
    @property
    def admin_uids(self) -> frozenset[int]: ...

    def now(self) -> float: ...


@dataclass(slots=True)
class PeerCounters:
    planes: dict[int, PlaneStats] = field(default_factory=dict)
    retransmits_by_cause: Counter[str] = field(default_factory=Counter)
    drops_by_reason: Counter[str] = field(default_factory=Counter)
    live: int = 0


def peer_counters(svc: ServiceState) -> dict[str, PeerCounters]:
    """Per peer: bytes and packets by plane, retransmits by cause, drops by reason."""
    out: dict[str, PeerCounters] = {name: PeerCounters() for name in svc.peers}
    for name, totals in svc.totals.items():
        pc = out.setdefault(name, PeerCounters())
        _add_planes(pc.planes, totals.planes)
        pc.retransmits_by_cause.update(totals.retransmits_by_cause)
        pc.drops_by_reason.update(totals.drops_by_reason)
    for conn in svc.conns.values():
        session = conn.session
        if session is None:
            continue
        pc = out.setdefault(conn.peer, PeerCounters())
        pc.live += 1
        _add_planes(pc.planes, session.stats.planes)
        pc.retransmits_by_cause.update(session.stats.retransmits_by_cause)
        pc.drops_by_reason.update(session.stats.drops_by_reason)
    return out


def _add_planes(into: dict[int, PlaneStats], planes: dict[int, PlaneStats]) -> None:
    for plane, ps in planes.items():
        mine = into.setdefault(plane, PlaneStats())
        mine.packets_sent += ps.packets_sent
        mine.bytes_sent += ps.bytes_sent
        mine.packets_received += ps.packets_received
        mine.bytes_received += ps.bytes_received
        mine.retransmits += ps.retransmits


def plane_rows(svc: ServiceState) -> list[dict[str, Any]]:
    """Each plane socket's counters (what the kernel took and gave, every packet included)."""
    rows = []
    for plane, sock in sorted(svc.node.planes.items()):
        downs = ups = 0
        for conn in svc.conns.values():
            if conn.session is not None and conn.state == "established":
                pl = conn.session.paths.planes.get(plane)
                if pl is None:
                    continue
                if pl.state is PlaneState.DOWN:
                    downs += 1
                else:
                    ups += 1
        host, port = sock.local_addr[0], sock.local_addr[1]
        rows.append(
            {
                "plane": plane,
                "local": f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}",
                # Down when every connection using the plane has it down.
                "state": "down" if downs and not ups else "up",
                "connections_down": downs,
                "bytes_sent": sock.bytes_sent,
                "bytes_received": sock.bytes_received,
                "packets_sent": sock.packets_sent,
                "packets_received": sock.packets_received,
            }
        )
    return rows


def status(svc: ServiceState, p: Params) -> dict[str, Any]:
    p.done()
    return {
        "version": mrc.__version__,
        "host": svc.host,
        "pid": os.getpid(),
        "uptime": round(svc.now() - svc.started, 3),
        "security": svc.config.security,
        "planes": plane_rows(svc),
        "peers": len(svc.peers),
        "connections": sum(1 for c in svc.conns.values() if c.live),
        "regions": sum(1 for r in svc.regions.by_id.values() if r.owner is not None),
        "clients": len(svc.clients),
        "shutting_down": svc.shutting_down,
        "control": dict(sorted(svc.control_counters.items())),
    }


def planes(svc: ServiceState, p: Params) -> list[dict[str, Any]]:
    p.done()
    return plane_rows(svc)


def peers(svc: ServiceState, p: Params) -> list[dict[str, Any]]:
    p.done()
    counters = peer_counters(svc)
    rows = []
    for name, peer in sorted(svc.peers.items()):
        pc = counters.get(name, PeerCounters())
        rows.append(
            {
                "name": name,
                "addresses": list(peer.addresses),
                "port": peer.port,
                "public_key": peer.public_key,
                "connections": pc.live,
                "bytes_sent": sum(ps.bytes_sent for ps in pc.planes.values()),
                "bytes_received": sum(ps.bytes_received for ps in pc.planes.values()),
                "retransmits": sum(pc.retransmits_by_cause.values()),
            }
        )
    return rows


def _conn_row(svc: ServiceState, conn: Connection) -> dict[str, Any]:
    session = conn.session
    row: dict[str, Any] = {
        "connection": conn.id,
        "peer": conn.peer,
        "kind": conn.kind,
        "role": conn.role,
        "owner": conn.owner,
        "state": conn.state,
        "close_reason": conn.close_reason or None,
        "connection_id": f"{conn.mrc_connection_id:016x}",
        "outstanding": len(conn.outstanding),
        "writes_posted": conn.writes_posted,
        "bytes_posted": conn.bytes_posted,
        "writes_failed": conn.writes_failed,
        "immediates": conn.immediates,
        "age": round(svc.now() - conn.created, 3),
    }
    if session is not None:
        row["qpn"] = session.qpn
        row["peer_qpn"] = session.peer_qpn
        # A connection still in its handshake has no window and no planes yet.
        established = session.established
        row["cwnd"] = int(established.cc.cwnd) if established is not None else None
        row["planes"] = [
            {"plane": plane, "state": session.plane_state(plane)}
            for plane in sorted(established.paths.planes if established is not None else ())
        ]
        row["bytes_acked"] = session.stats.bytes_acked
        row["bytes_placed"] = session.stats.bytes_placed
        row["retransmits"] = session.stats.retransmits
    return row


def visible(svc: ServiceState, cs: ClientState, owner: int | None) -> bool:
    """Whether `cs` may see a row owned by control client `owner` (None: the daemon's)."""
    return owner == cs.id or cs.uid in svc.admin_uids


def connections(svc: ServiceState, cs: ClientState, p: Params) -> list[dict[str, Any]]:
    p.done()
    return [_conn_row(svc, c) for _, c in sorted(svc.conns.items()) if visible(svc, cs, c.owner)]


def evs(svc: ServiceState, cs: ClientState, p: Params) -> list[dict[str, Any]]:
    conn_id = p.opt_integer("connection")
    p.done()
    if conn_id is not None and (
        conn_id not in svc.conns or not visible(svc, cs, svc.conns[conn_id].owner)
    ):
        raise RpcError(UNKNOWN_CONNECTION, f"evs: no connection {conn_id}", {"key": "connection"})
    now = svc.now()
    rows = []
    for cid, conn in sorted(svc.conns.items()):
        if (conn_id is not None and cid != conn_id) or conn.session is None:
            continue
        if not visible(svc, cs, conn.owner):
            continue
        for row in conn.session.ev_stats(now):
            rows.append({"connection": cid, "peer": conn.peer, **row})
    return rows


def regions(svc: ServiceState, cs: ClientState, p: Params) -> list[dict[str, Any]]:
    p.done()
    rows = []
    for rid, region in sorted(svc.regions.by_id.items()):
        if not visible(svc, cs, region.owner):
            continue
        owner = svc.clients.get(region.owner) if region.owner is not None else None
        rows.append(
            {
                "region": rid,
                "name": region.name,
                "kind": "shared" if region.owner is not None else "mailbox",
                "owner": region.owner,
                "pid": owner.pid if owner is not None else None,
                "length": region.size,
                "rkey": region.core.rkey,
                "va": region.core.base_va,
                "immediates": region.immediates,
            }
        )
    return rows

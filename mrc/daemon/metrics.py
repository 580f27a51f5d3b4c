"""Prometheus metrics: the daemon's counters as text exposition format 0.0.4 over HTTP.

`render(service)` builds the page at scrape time from the plain integers the data path keeps
anyway (plane sockets, session stats, EV tables, the service's counters): nothing is counted
per packet for metrics' sake (a client library's `Counter.inc` would cost about 0.5 µs a packet;
docs/DESIGN.md §9). `MetricsServer` answers `GET /metrics` on the address of `--metrics`
or `[metrics] listen`, one short HTTP/1.0 exchange per connection, a bounded number at a time.

Families: `mrc_plane_*_total` per plane socket; `mrc_peer_*_total` by peer and plane (payload
and control packets of that peer's connections, closed ones included); retransmits by cause and
drops by reason per peer; EVs by state, plane state and cwnd per connection; the service's own
gauges and counters (clients, regions, connections, writes by status, refusals, messages).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from mrc.core.paths.planes import PlaneState

from .views import peer_counters, plane_rows

if TYPE_CHECKING:
    from .control import ControlServer
    from .service import Service

__all__ = ["MetricsServer", "render"]

log = logging.getLogger("mrc.daemon")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_SCRAPERS = 16
REQUEST_TIMEOUT = 5.0
MAX_REQUEST = 8192

Labels = dict[str, object]


class _Page:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self, name: str, kind: str, help_text: str, samples: Iterable[tuple[Labels, float]]
    ) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{_labels(labels)} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    parts = []
    for key, value in labels.items():
        text = str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
        parts.append(f'{key}="{text}"')
    return "{" + ",".join(parts) + "}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(svc: Service, control: ControlServer | None = None) -> str:
    page = _Page()
    planes = plane_rows(svc)
    for what, key in (
        ("bytes_sent", "bytes the plane's socket sent, headers of every packet included"),
        ("bytes_received", "bytes the plane's socket received, every packet included"),
        ("packets_sent", "datagrams the plane's socket sent"),
        ("packets_received", "datagrams the plane's socket received"),
    ):
        page.family(
            f"mrc_plane_{what}_total",
            "counter",
            key.capitalize() + ".",
            (({"plane": r["plane"], "local": r["local"]}, r[what]) for r in planes),
        )
    page.family(
        "mrc_plane_up",
        "gauge",
        "1 unless every connection using the plane has it down.",
        (({"plane": r["plane"], "local": r["local"]}, r["state"] == "up") for r in planes),
    )
    counters = peer_counters(svc)
    for what in ("bytes_sent", "bytes_received", "packets_sent", "packets_received"):
        page.family(
            f"mrc_peer_{what}_total",
            "counter",
            f"The {what.replace('_', ' ')} of a peer's connections by plane.",
            (
                ({"peer": peer, "plane": plane}, getattr(ps, what))
                for peer, pc in sorted(counters.items())
                for plane, ps in sorted(pc.planes.items())
            ),
        )
    page.family(
        "mrc_peer_retransmits_total",
        "counter",
        "Retransmitted packets to a peer by cause.",
        (
            ({"peer": peer, "cause": cause}, n)
            for peer, pc in sorted(counters.items())
            for cause, n in sorted(pc.retransmits_by_cause.items())
        ),
    )
    page.family(
        "mrc_peer_drops_total",
        "counter",
        "Packets from a peer dropped by the receiver, by reason.",
        (
            ({"peer": peer, "reason": reason}, n)
            for peer, pc in sorted(counters.items())
            for reason, n in sorted(pc.drops_by_reason.items())
        ),
    )
    page.family(
        "mrc_endpoint_drops_total",
        "counter",
        "Datagrams no connection took (unknown QP, refused REQUESTs, undecodable), by reason.",
        [({"reason": r}, n) for r, n in sorted(svc.node.endpoint.drops.items())],
    )
    page.family(
        "mrc_io_events_total",
        "counter",
        "Incidents of the socket layer (injected drops, path socket errors, internal errors).",
        [({"kind": k}, n) for k, n in sorted(svc.node.io.counters.items())],
    )
    _connections(page, svc)
    _service(page, svc, control)
    return page.text()


def _connections(page: _Page, svc: Service) -> None:
    live = [(cid, c) for cid, c in sorted(svc.conns.items()) if c.session is not None]
    evs: Counter[tuple[str, int, str]] = Counter()
    plane_up = []
    cwnd = []
    for cid, conn in live:
        session = conn.session.established if conn.session is not None else None
        if session is None:
            continue  # still in its handshake: no EVs, planes or window yet
        for ev in session.paths.evs.by_ev.values():
            state = ev.state.value if ev.active else "backup"
            evs[(conn.peer, ev.plane, state)] += 1
        for plane, pl in sorted(session.paths.planes.items()):
            labels = {"peer": conn.peer, "connection": cid, "plane": plane}
            plane_up.append((labels, pl.state is not PlaneState.DOWN))
        cwnd.append(({"peer": conn.peer, "connection": cid}, int(session.cc.cwnd)))
    page.family(
        "mrc_evs",
        "gauge",
        "EVs of live connections by peer, plane and state.",
        (({"peer": p, "plane": pl, "state": s}, n) for (p, pl, s), n in sorted(evs.items())),
    )
    page.family(
        "mrc_connection_plane_up", "gauge", "1 while the plane carries the connection.", plane_up
    )
    page.family("mrc_connection_cwnd_bytes", "gauge", "Congestion window of the sender.", cwnd)
    kinds: Counter[tuple[str, str, str]] = Counter(
        (c.peer, c.kind, c.role) for _, c in live
    )
    page.family(
        "mrc_connections",
        "gauge",
        "Live connections by peer, kind (app or mail) and role.",
        (({"peer": p, "kind": k, "role": r}, n) for (p, k, r), n in sorted(kinds.items())),
    )


def _service(page: _Page, svc: Service, control: ControlServer | None) -> None:
    page.family("mrc_uptime_seconds", "gauge", "Seconds since the daemon started.",
                [({}, round(svc.now() - svc.started, 3))])
    page.family("mrc_clients", "gauge", "Connected control clients.", [({}, len(svc.clients))])
    shared = [r for r in svc.regions.by_id.values() if r.owner is not None]
    page.family("mrc_regions", "gauge", "Registered application regions.", [({}, len(shared))])
    page.family("mrc_region_bytes", "gauge", "Bytes of registered application regions.",
                [({}, sum(r.size for r in shared))])
    page.family("mrc_regions_unmapping", "gauge",
                "Deregistered regions still mapped while a send record holds them.",
                [({}, len(svc.regions.unmapper))])
    statuses = {k[len("writes_"):]: n for k, n in svc.counters.items() if k.startswith("writes_")}
    page.family("mrc_writes_total", "counter", "Completed application WRITEs by status.",
                (({"status": s}, n) for s, n in sorted(statuses.items())))
    refused = {k[len("refused_"):]: n for k, n in svc.counters.items()
               if k.startswith("refused_")}
    page.family("mrc_connections_refused_total", "counter",
                "Connection REQUESTs from peers the daemon refused, by reason.",
                (({"reason": r}, n) for r, n in sorted(refused.items())))
    other = {k: n for k, n in svc.counters.items()
             if not k.startswith(("writes_", "refused_"))}
    page.family("mrc_service_events_total", "counter",
                "Other service events (immediates orphaned or dropped, session events).",
                (({"event": k}, n) for k, n in sorted(other.items())))
    page.family("mrc_messages_total", "counter", "Small messages by outcome.",
                (({"outcome": k}, n) for k, n in sorted(svc.mailbox.counters.items())))
    if control is not None:
        page.family("mrc_control_total", "counter",
                    "Control socket events (requests, refused clients, errors by code).",
                    (({"event": k}, n) for k, n in sorted(control.counters.items())))


class MetricsServer:
    def __init__(self, svc: Service, control: ControlServer | None = None) -> None:
        self.svc = svc
        self.control = control
        self.scrapes = 0
        self._server: asyncio.AbstractServer | None = None
        self._active = 0

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen; OSError when the address cannot be bound. Returns the bound address."""
        self._server = await asyncio.start_server(self._handle, host, port)
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._active >= MAX_SCRAPERS:
            writer.close()
            return
        self._active += 1
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                return
            if len(head) > MAX_REQUEST:
                return
            parts = head.split(b"\r\n", 1)[0].split()
            if len(parts) != 3 or parts[0] not in (b"GET", b"HEAD"):
                await self._reply(writer, 405, "text/plain", "only GET /metrics\n")
                return
            if parts[1].split(b"?", 1)[0] != b"/metrics":
                await self._reply(writer, 404, "text/plain", "see /metrics\n")
                return
            self.scrapes += 1
            body = render(self.svc, self.control)
            await self._reply(writer, 200, CONTENT_TYPE, body, head_only=parts[0] == b"HEAD")
        except (ConnectionError, OSError):
            pass
        finally:
            self._active -= 1
            with contextlib.suppress(Exception):
                writer.close()

    @staticmethod
    async def _reply(
        writer: asyncio.StreamWriter, code: int, ctype: str, body: str, *, head_only: bool = False
    ) -> None:
        reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}[code]
        data = body.encode()
        writer.write(
            f"HTTP/1.0 {code} {reason}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        )
        if not head_only:
            writer.write(data)
        await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT)

"""The daemon's service: applications' regions, connections, WRITEs, completions and immediates.

`Service` implements every control method of docs/DAEMON.md that changes state, on top of one
`mrc.node.Node`. It keeps per control client (`ClientState`) the completions of its connections in
MSN order and the immediates of WRITE_WITH_IMMs that landed in its regions, answers long-polls when
they arrive, and routes every session event: a requester's handshake result to the `connect` waiting
for it, a `WriteCompleted` to the write's owner, an `ImmediateReceived` to the owner of the region
its R_Key names (or to the mailbox), a `ConnectionClosed` into failed completions.

Quotas: each client, and the clients of one uid together (but not the admin uids: the daemon's
own and root), are held to the `[limits]` of connections and endpoints here, of regions in
`regions`.

Ownership: regions and APP connections belong to the control connection that made them. When
it closes, its connections are closed (DISCONNECT to the peer) and its regions deregistered;
WRITEs from peers into them then fail at the writer with remote_access_error. A region
deregistered while a WRITE of its owner still reads from it closes that WRITE's connection, so
nothing more is sent from it: those writes complete "cancelled" (`shm` keeps the pages mapped
until the core's send records let go of them).

What it leaves to others: the socket and framing (`control`), which method name calls what
(`methods`), the mapping (`shm`), messages (`mailbox`), the read-only views (`views`), the
process's life cycle (`daemon`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from typing import Any

from mrc.core.errors import LocalProtocolError
from mrc.core.events import (
    ConnectionClosed,
    ConnectionEstablished,
    Event,
    ImmediateReceived,
    PlaneDown,
    PlaneUp,
    WriteCompleted,
)
from mrc.core.memory import Region
from mrc.core.session import Session
from mrc.node import EventHandler, Node, NodeError, resolve_peer

from .clients import MAX_IMMEDIATES, ClientState, check_write, long_poll
from .config import DaemonConfig, PeerConfig
from .conns import APP, MAIL, Connection, Hello, PeerTotals, WriteRecord, write_status
from .control import ControlClient
from .mailbox import MAX_NAME, Mailbox
from .regions import DaemonRegion, Regions
from .rpc import (
    BAD_MEMORY,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    NOT_CONNECTED,
    RESOURCE_LIMIT,
    SHUTTING_DOWN,
    TOO_MANY_OUTSTANDING,
    UNKNOWN_CONNECTION,
    UNKNOWN_PEER,
    UNKNOWN_REGION,
    Params,
    RpcError,
)
from .shm import SharedMapping

__all__ = ["Service"]

log = logging.getLogger("mrc.daemon")

#: WRITEs one `write` call may post.
MAX_WRITES_PER_CALL = 4096
#: A connect gives up after this even if the core still retries.
CONNECT_TIMEOUT = 30.0
#: Responder mailboxes set aside by `_accept` whose session has not appeared yet.
MAX_PENDING_MAILBOXES = 64


#: What a client may have pushed to it (`subscribe`, docs/DAEMON.md).
PUSHED = ("immediates", "completions")


def _not_pushed(cs: ClientState, kind: str) -> None:
    if kind in cs.pushes:
        raise RpcError(INVALID_PARAMS, f"{kind}: this client subscribed to its {kind}: they "
                                       "come as notifications")  # fmt: skip


class Service:
    def __init__(self, config: DaemonConfig, open_node: Callable[[EventHandler], Node]) -> None:
        """`open_node` binds the daemon's node, its events going to the handler it is given
        (NodeError when it cannot)."""
        self.config = config
        node = open_node(self.on_event)
        self.node = node
        self.loop = node.loop
        self.host = config.host
        self.started = node.now()
        self.session_config = config.session_config()
        #: The daemon's own uid and root's, who administer it: their clients see every region
        #: and connection in the views and are held only to the per-client and global limits.
        self.admin_uids = frozenset({os.geteuid(), 0})
        self.regions = Regions(node.regions, config.limits, self.admin_uids)
        self.mailbox = Mailbox(self, self.regions, node.now)
        self.clients: dict[int, ClientState] = {}
        self.conns: dict[int, Connection] = {}
        self.peers: dict[str, PeerConfig] = {p.name: p for p in config.peers}
        self.totals: dict[str, PeerTotals] = {}
        self.counters: Counter[str] = Counter()
        self.shutting_down = False
        #: The control socket's counters (refused clients, errors by code), which the daemon
        #: hands the control server to keep, for the views.
        self.control_counters: Counter[str] = Counter()
        self._by_session: dict[int, Connection] = {}
        self._pending_mailboxes: dict[int, int] = {}
        self._rng = random.SystemRandom()
        self._next_conn = 1
        self._next_write = 1

    def start(self) -> None:
        self.node.listen(self.session_config, self._accept)

    # -- the control socket's entry points ------------------------------------------------------

    def client(self, client: ControlClient) -> ClientState:
        """The state of a control client, made at its first request."""
        cs = self.clients.get(client.id)
        if cs is None:
            cs = self.clients[client.id] = ClientState(client, self.loop)
        return cs

    def client_gone(self, client: ControlClient) -> None:
        cs = self.clients.pop(client.id, None)
        if cs is None:
            return
        conns = [self.conns[c] for c in cs.connections if c in self.conns]
        for conn in conns:
            self._close_conn(conn, "application gone", "cancelled")
            self.conns.pop(conn.id, None)
        self.mailbox.unbind_all(cs.id)
        regions = self.regions.owned_by(cs.id)
        for region in regions:
            self.regions.deregister(region)
        self.regions.unmapper.sweep()
        cs.cancel()
        if conns or regions:
            log.info(
                "client %d (pid %s) gone: %d region(s) deregistered, %d connection(s) closed",
                cs.id, cs.pid, len(regions), len(conns),
            )

    def stop_accepting(self) -> None:
        """Shutdown begins: refuse new regions, connections, writes and peers' connections."""
        self.shutting_down = True

    def wake(self, client: int) -> None:
        cs = self.clients.get(client)
        if cs is not None:
            cs.wake()

    def now(self) -> float:
        return self.node.now()

    # -- regions --------------------------------------------------------------------------------

    def register_without_fd(self, cs: ClientState, p: Params) -> Any:
        raise RpcError(
            BAD_MEMORY, "register_region: send the region's memfd with the line (SCM_RIGHTS)"
        )

    def register_region(self, cs: ClientState, p: Params, fd: int) -> dict[str, Any]:
        size = p.integer("size", 1, 1 << 40)
        name = p.opt_text("name", max_len=128) or "region"
        peers = self._region_peers(p)
        p.done()
        self._not_stopping("register_region")
        region = self.regions.register_shared(
            cs.id, cs.uid, fd, size, name, self.now(), self._keys(peers)
        )
        if region.mapping is not None:
            self._prefault(region.mapping)
        log.debug("client %d registered region %d (%d bytes)", cs.id, region.id, size)
        return {"region": region.id, "handle": region.handle(self.host)}

    def _prefault(self, mapping: SharedMapping) -> None:
        """Map the application's pages into the daemon a step per turn of the event loop, so
        a large region never holds up the other clients and the data path."""
        if mapping.prefault():
            self.loop.call_soon(self._prefault, mapping)

    def _region_peers(self, p: Params) -> list[str] | None:
        """register_region's `peers`: the configured peers that may write the region (None:
        any). Only with security, where a connection's peer proved its key."""
        raw = p.raw("peers")
        if raw is None:
            return None
        if not isinstance(raw, list) or len(raw) > len(self.peers) or not all(
            isinstance(n, str) for n in raw
        ):
            raise p.bad("peers", "must be a list of the names of configured peers")
        unknown = [n for n in raw if n not in self.peers]
        if unknown:
            raise RpcError(
                UNKNOWN_PEER, f"register_region: no peer named {unknown[0]!r}", {"key": "peers"}
            )
        if self.config.security == "none":
            raise p.bad(
                "peers",
                'needs security "auth" or "encrypt": with security = "none" no peer proves '
                "who it is",
            )
        return raw

    def _keys(self, names: list[str] | None) -> frozenset[bytes] | None:
        """The static public keys listed for these peers (None: any peer)."""
        if names is None:
            return None
        return frozenset(key for key in (self.peers[n].key for n in names) if key is not None)

    def _own_region(self, cs: ClientState, region_id: int, where: str) -> DaemonRegion:
        region = self.regions.get(region_id)
        if region is None or region.owner != cs.id:
            raise RpcError(
                UNKNOWN_REGION, f"{where}: no region {region_id} of this client", {"key": "region"}
            )
        return region

    def deregister_region(self, cs: ClientState, p: Params) -> dict[str, Any]:
        region = self._own_region(cs, p.integer("region"), "deregister_region")
        p.done()
        for cid in list(cs.connections):
            conn = self.conns.get(cid)
            if conn is not None and any(w.region == region.id for w in conn.outstanding):
                self._close_conn(conn, f"region {region.id} deregistered", "cancelled")
        self.regions.deregister(region)
        return {}

    # -- connections ----------------------------------------------------------------------------

    def _not_stopping(self, method: str) -> None:
        if self.shutting_down:
            raise RpcError(SHUTTING_DOWN, f"{method}: the daemon is shutting down")

    def _open(self, name: str, kind: str, owner: int | None) -> Connection:
        peer = self.peers.get(name)
        if peer is None:
            raise RpcError(UNKNOWN_PEER, f"no peer named {name!r}", {"key": "peer"})
        self._not_stopping("connect")
        limits = self.config.limits
        if len(self.conns) >= limits.max_connections:
            raise RpcError(
                RESOURCE_LIMIT, f"connect: max_connections ({limits.max_connections}) reached"
            )
        if owner is not None:
            cs = self.clients[owner]
            self._quota(cs, "connect", "connections", lambda c: len(c.connections),
                        limits.max_connections_per_client, limits.max_connections_per_uid)
        token = self._rng.getrandbits(64)
        hello = Hello(kind, self.host, token)
        try:
            addrs = resolve_peer(peer.addresses, peer.port)
            # A secured REQUEST is sealed to the responder's static key (docs/WIRE.md §7).
            session = self.node.connect(
                self.session_config, addrs, hello.encode(), peer_key=peer.key
            )
        except NodeError as exc:
            raise RpcError(NOT_CONNECTED, f"connect to {name}: {exc}") from None
        conn = Connection(
            id=self._next_conn,
            peer=name,
            kind=kind,
            role="requester",
            owner=owner,
            session=session,
            created=self.now(),
            established=self.loop.create_future(),
            token=token,
        )
        self._next_conn += 1
        self.conns[conn.id] = conn
        self._by_session[id(session)] = conn
        if owner is not None:
            self.clients[owner].connections.add(conn.id)
        return conn

    async def _until_established(self, conn: Connection) -> None:
        assert conn.established is not None
        try:
            await asyncio.wait_for(asyncio.shield(conn.established), CONNECT_TIMEOUT)
        except TimeoutError:
            self._close_conn(conn, "no answer in time", "connection_lost")
            raise RpcError(NOT_CONNECTED, f"connect to {conn.peer}: no answer") from None

    def connect(self, cs: ClientState, p: Params) -> Coroutine[Any, Any, dict[str, Any]]:
        name = p.text("peer")
        p.done()
        conn = self._open(name, APP, cs.id)

        async def wait() -> dict[str, Any]:
            try:
                await self._until_established(conn)
            except BaseException:
                # A failed connect leaves nothing behind for the client to disconnect.
                cs.connections.discard(conn.id)
                self.conns.pop(conn.id, None)
                raise
            return {"connection": conn.id, "peer": conn.peer, "state": "established"}

        return wait()

    async def open_mail(self, peer: str) -> Connection:
        """The mailbox's MAIL connection to `peer`, once established."""
        conn = self._open(peer, MAIL, None)
        await self._until_established(conn)
        return conn

    def _own_conn(self, cs: ClientState, conn_id: int, where: str) -> Connection:
        conn = self.conns.get(conn_id)
        if conn is None or conn.id not in cs.connections:
            raise RpcError(
                UNKNOWN_CONNECTION,
                f"{where}: no connection {conn_id} of this client",
                {"key": "connection"},
            )
        return conn

    def disconnect(self, cs: ClientState, p: Params) -> dict[str, Any]:
        conn = self._own_conn(cs, p.integer("connection"), "disconnect")
        p.done()
        self._close_conn(conn, "closed by the application", "cancelled")
        self.conns.pop(conn.id, None)
        cs.connections.discard(conn.id)
        cs.completions.pop(conn.id, None)
        return {}

    def _close_conn(self, conn: Connection, reason: str, fail_status: str) -> None:
        """Close a connection ourselves (CM_DISCONNECT to the peer)."""
        if conn.state == "closed":
            return
        conn.fail_status = fail_status
        conn.local_reason = reason
        session = conn.session
        if session is not None and not session.is_closed:
            session.close(self.now())
            self.node.flush(session)
        if conn.state != "closed":  # the node is closed: its flush delivered nothing
            self._closed(conn, reason)

    def close_all(self, reason: str) -> None:
        """Close every connection (shutdown): outstanding writes complete "cancelled"."""
        for conn in list(self.conns.values()):
            self._close_conn(conn, reason, "cancelled")

    def reload_peers(self, peers: tuple[PeerConfig, ...]) -> tuple[int, int]:
        """Take a new peer list (SIGHUP); connections to peers no longer listed, or listed
        with other addresses, are closed. Returns (peers, connections closed)."""
        new = {p.name: p for p in peers}
        changed = {n for n, p in self.peers.items() if new.get(n) != p}
        self.peers = new
        closed = 0
        for conn in list(self.conns.values()):
            if conn.peer in changed and conn.state != "closed":
                self._close_conn(conn, "peer changed in the configuration", "connection_lost")
                closed += 1
        return len(new), closed

    # -- writes and completions ------------------------------------------------------------------

    def write(self, cs: ClientState, p: Params) -> dict[str, Any]:
        conn = self._own_conn(cs, p.integer("connection"), "write")
        items = p.items("writes", max_len=MAX_WRITES_PER_CALL)
        p.done()
        self._not_stopping("write")
        session = conn.session
        if conn.state != "established" or session is None or session.is_closed:
            why = f": {conn.close_reason}" if conn.close_reason else ""
            raise RpcError(NOT_CONNECTED, f"write: connection {conn.id} is {conn.state}{why}")
        cap = self.config.limits.max_outstanding_writes
        if len(conn.outstanding) + len(items) > cap:
            raise RpcError(
                TOO_MANY_OUTSTANDING,
                f"write {max(0, cap - len(conn.outstanding))}: more than max_outstanding_writes "
                f"({cap}) on connection {conn.id}; wait for completions",
                {"index": max(0, cap - len(conn.outstanding))},
            )
        checked = [check_write(self.regions, cs.id, conn, i, w) for i, w in enumerate(items)]
        ids = []
        for region, offset, length, va, rkey, imm in checked:
            try:
                msn = session.post_write(region.core, offset, length, va, rkey, imm)
            except LocalProtocolError as exc:  # the checks above should make this unreachable
                raise RpcError(INTERNAL_ERROR, f"write: the core refused it: {exc}") from None
            rec = WriteRecord(self._next_write, msn, length, region.id)
            self._next_write += 1
            conn.outstanding.append(rec)
            conn.writes_posted += 1
            conn.bytes_posted += length
            ids.append(rec.id)
        self.node.flush(session)
        return {"ids": ids}

    def completions(self, cs: ClientState, p: Params) -> Any:
        conn_id, limit, timeout = long_poll(p, "connection")
        _not_pushed(cs, "completions")
        if conn_id is not None:
            self._own_conn(cs, conn_id, "completions")
        return cs.completions_when(conn_id, limit, timeout)

    def immediates(self, cs: ClientState, p: Params) -> Any:
        region_id, limit, timeout = long_poll(p, "region")
        _not_pushed(cs, "immediates")
        if region_id is not None:
            self._own_region(cs, region_id, "immediates")
        return cs.immediates_when(region_id, limit, timeout)

    def subscribe(self, cs: ClientState, p: Params) -> Any:
        kinds = set()
        for kind in PUSHED:
            value = p.raw(kind)
            if value is True:
                kinds.add(kind)
            elif value is not None:
                raise p.bad(kind, "must be true when given")
        p.done()
        if not kinds:
            raise RpcError(INVALID_PARAMS, "subscribe: name a kind (immediates, completions)")
        cs.subscribe(kinds)
        return {}

    def bind(self, cs: ClientState, p: Params) -> Any:
        name = p.text("endpoint", max_len=MAX_NAME)  # checked before any quota
        if self.mailbox.bound.get(name) != cs.id:  # a new one
            limits = self.config.limits
            held: dict[int, int] = {}
            for client in self.mailbox.bound.values():
                held[client] = held.get(client, 0) + 1
            self._quota(cs, "bind", "endpoints", lambda c: held.get(c.id, 0),
                        limits.max_endpoints_per_client, limits.max_endpoints_per_uid)
        return self.mailbox.bind(cs.id, p)

    def _quota(
        self,
        cs: ClientState,
        method: str,
        what: str,
        count: Callable[[ClientState], int],
        per_client: int,
        per_uid: int,
    ) -> None:
        """RESOURCE_LIMIT when `cs` holds `per_client` of `what` already, or the clients of its
        uid `per_uid` together (not for an admin uid)."""
        if count(cs) >= per_client:
            raise RpcError(
                RESOURCE_LIMIT,
                f"{method}: this client holds {count(cs)} {what} "
                f"(max_{what}_per_client = {per_client})",
            )
        if cs.uid not in self.admin_uids:
            total = sum(count(c) for c in self.clients.values() if c.uid == cs.uid)
            if total >= per_uid:
                raise RpcError(
                    RESOURCE_LIMIT,
                    f"{method}: the clients of uid {cs.uid} hold {total} {what} "
                    f"(max_{what}_per_uid = {per_uid})",
                )

    def send_message(self, cs: ClientState, p: Params) -> Any:
        name = p.text("peer")
        if name not in self.peers:
            raise RpcError(UNKNOWN_PEER, f"no peer named {name!r}", {"key": "peer"})
        self._not_stopping("send_message")
        return self.mailbox.send(name, p)

    def recv_message(self, cs: ClientState, p: Params) -> Any:
        name, take = self.mailbox.take(cs.id, p)
        timeout = p.seconds("timeout")
        p.done()
        return cs.answer_when(lambda: self.mailbox.ready(name), lambda: {"messages": take()},
                              timeout)

    def post(
        self, conn: Connection, src: Region, offset: int, length: int, va: int, rkey: int, imm: int
    ) -> int:
        """Post a daemon-owned WRITE (a mailbox message) and send it."""
        session = conn.session
        if session is None or session.is_closed:
            raise RpcError(NOT_CONNECTED, f"send_message: connection to {conn.peer} lost")
        try:
            msn = session.post_write(src, offset, length, va, rkey, imm)
        except LocalProtocolError as exc:
            raise RpcError(RESOURCE_LIMIT, f"send_message: {exc}") from None
        self.node.flush(session)
        return msn

    # -- session events -------------------------------------------------------------------------

    def on_event(self, session: Session, event: Event) -> None:
        conn = self._by_session.get(id(session))
        kind = type(event)
        if conn is None:
            if kind is ConnectionEstablished:
                self._accepted(session, event)  # type: ignore[arg-type]
            return
        if kind is WriteCompleted:
            self._write_completed(conn, event)  # type: ignore[arg-type]
        elif kind is ImmediateReceived:
            self._immediate(conn, event)  # type: ignore[arg-type]
        elif kind is ConnectionEstablished:
            self._established(conn, event)  # type: ignore[arg-type]
        elif kind is ConnectionClosed:
            self._closed(conn, event.reason)  # type: ignore[attr-defined]
        else:
            self.counters[f"event_{kind.__name__}"] += 1
            if isinstance(event, PlaneDown | PlaneUp):
                log.info("connection %d to %s: %s", conn.id, conn.peer, event)

    def _accept(self, private_data: bytes) -> bytes | None:
        """A peer's REQUEST: its REPLY's private data, or None to refuse it."""
        hello = Hello.decode(private_data)
        refusal = None
        if hello is None:
            refusal = "bad_hello"
        elif hello.host not in self.peers:
            refusal = "unknown_peer"
        elif self.shutting_down:
            refusal = "shutting_down"
        elif len(self.conns) >= self.config.limits.max_connections:
            refusal = "max_connections"
        if refusal is not None or hello is None:
            self.counters[f"refused_{refusal}"] += 1
            log.warning("refused a connection: %s", refusal)
            return None
        mailbox = None
        if hello.kind == MAIL:
            while len(self._pending_mailboxes) >= MAX_PENDING_MAILBOXES:
                stale = self._pending_mailboxes.pop(next(iter(self._pending_mailboxes)))
                region = self.regions.get(stale)
                if region is not None:
                    self.regions.deregister(region)
            # Only that peer may write its mailbox (with security; any peer without).
            keys = self._keys([hello.host]) if self.config.security != "none" else None
            region = self.mailbox.new_mailbox(hello.host, keys)
            self._pending_mailboxes[hello.token] = region.id
            mailbox = (region.core.base_va, region.core.rkey, region.size)
        return Hello(hello.kind, self.host, hello.token, mailbox).encode()

    def _authentic(self, session: Session, name: str) -> bool:
        """On a secured connection, the peer proved the key listed for `name` (the allowlist
        holds every peer's key; this stops one peer from speaking as another)."""
        if not session.config.secured:
            return self.config.security == "none"
        peer = self.peers.get(name)
        return (
            peer is not None
            and peer.key is not None
            and session.peer_static_key == peer.key
        )

    def _accepted(self, session: Session, event: ConnectionEstablished) -> None:
        hello = Hello.decode(event.private_data)
        if hello is None:
            return
        if not self._authentic(session, hello.host):
            self.counters["refused_wrong_key"] += 1
            log.warning("refused a connection claiming to be %s: not its key", hello.host)
            stale = self._pending_mailboxes.pop(hello.token, None)
            region = self.regions.get(stale) if stale is not None else None
            if region is not None:
                self.regions.deregister(region)
            session.close(self.now())
            self.node.flush(session)
            return
        conn = Connection(
            id=self._next_conn,
            peer=hello.host,
            kind=hello.kind,
            role="responder",
            owner=None,
            session=session,
            created=self.now(),
            state="established",
            mrc_connection_id=event.connection_id,
        )
        self._next_conn += 1
        if hello.kind == MAIL:
            conn.mailbox_region = self._pending_mailboxes.pop(hello.token, None)
        self.conns[conn.id] = conn
        self._by_session[id(session)] = conn
        log.info("connection %d from %s (%s) established", conn.id, conn.peer, conn.kind)

    def _established(self, conn: Connection, event: ConnectionEstablished) -> None:
        hello = Hello.decode(event.private_data)
        if hello is None or hello.host != conn.peer or hello.token != conn.token:
            who = hello.host if hello is not None else "not a daemon"
            self._close_conn(conn, f"the peer answered as {who!r}", "connection_lost")
            return
        if conn.session is None or not self._authentic(conn.session, conn.peer):
            self._close_conn(conn, f"the peer did not prove {conn.peer}'s key", "connection_lost")
            return
        conn.state = "established"
        conn.peer_mailbox = hello.mailbox
        conn.mrc_connection_id = event.connection_id
        if conn.established is not None and not conn.established.done():
            conn.established.set_result(None)
        log.info("connection %d to %s (%s) established", conn.id, conn.peer, conn.kind)

    def _write_completed(self, conn: Connection, event: WriteCompleted) -> None:
        if conn.kind == MAIL:
            self.mailbox.completed(conn, event)
            return
        queue = conn.outstanding
        if queue and queue[0].msn == event.msn:
            rec = queue.popleft()
        else:
            found = next((w for w in queue if w.msn == event.msn), None)
            if found is None:
                self.counters["completions_unmatched"] += 1
                return
            queue.remove(found)
            rec = found
        self._complete(conn, rec, write_status(event.status))

    def _complete(self, conn: Connection, rec: WriteRecord, status: str) -> None:
        self.counters[f"writes_{status}"] += 1
        if status != "ok":
            conn.writes_failed += 1
        cs = self.clients.get(conn.owner) if conn.owner is not None else None
        if cs is None:
            return
        item = {
            "id": rec.id,
            "connection": conn.id,
            "status": status,
            "bytes": rec.length if status == "ok" else 0,
        }
        if "completions" in cs.pushes:
            self.counters["completions_pushed"] += 1
            cs.push("completions", item)
            return
        cs.completions.setdefault(conn.id, deque()).append(item)
        self.wake(cs.id)

    def _immediate(self, conn: Connection, event: ImmediateReceived) -> None:
        conn.immediates += 1
        region = self.regions.by_rkey(event.rkey)
        if region is None:
            self.counters["immediates_orphaned"] += 1
            return
        if region.owner is None:
            self.mailbox.deliver(conn, region, event)
            return
        cs = self.clients.get(region.owner)
        if cs is None:
            self.counters["immediates_orphaned"] += 1
            return
        region.immediates += 1
        item = {"region": region.id, "imm": event.imm, "peer": conn.peer, "connection": conn.id}
        if "immediates" in cs.pushes:
            self.counters["immediates_pushed"] += 1
            cs.push("immediates", item)
            return
        if len(cs.immediates) >= MAX_IMMEDIATES:
            cs.immediates.popleft()
            self.counters["immediates_dropped"] += 1
        cs.immediates.append(item)
        self.wake(cs.id)

    def _closed(self, conn: Connection, reason: str) -> None:
        if conn.state == "closed":
            return
        conn.state = "closed"
        conn.close_reason = conn.local_reason or reason
        session = conn.session
        if session is not None:
            self.totals.setdefault(conn.peer, PeerTotals()).fold(session.stats)
            self._by_session.pop(id(session), None)
            conn.session = None
        for rec in conn.outstanding:
            self._complete(conn, rec, conn.fail_status)
        conn.outstanding.clear()
        fut = conn.established
        if fut is not None and not fut.done():
            fut.set_exception(
                RpcError(NOT_CONNECTED, f"connect to {conn.peer}: {conn.close_reason}")
            )
            fut.exception()  # retrieved: whoever awaits it gets it anyway
        if conn.kind == MAIL:
            self.mailbox.closed(conn)
        if conn.owner is None or conn.owner not in self.clients:
            self.conns.pop(conn.id, None)
        log.info("connection %d with %s closed: %s", conn.id, conn.peer, conn.close_reason)

    # -- shutdown -------------------------------------------------------------------------------

    def outstanding_writes(self) -> int:
        return sum(len(c.outstanding) for c in self.conns.values() if c.live)

    def close(self) -> None:
        for cs in self.clients.values():
            cs.cancel()
        self.regions.close()

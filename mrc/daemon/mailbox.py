"""Small messages between applications on different hosts, carried by their daemons.

docs/DAEMON.md, "Messages": an application binds a named endpoint on its daemon; another one
sends up to 4 KiB to (peer, endpoint). The sending daemon keeps one MAIL connection per peer
(opened on the first message); in its REPLY the peer daemon names a mailbox region it set aside
for that connection (`conns.Hello`). A message is one WRITE_WITH_IMM into a free slot of that
mailbox, its immediate the slot number. The peer daemon copies the slot out when the immediate
arrives (the core raises it only once every byte is placed) and queues the message for whoever
bound the endpoint. A slot is reused only after the WRITE that filled it completed, which is
after the receiver raised its immediate, so a slot is never overwritten before it was read.
`send_message` answers once the WRITE completed: the message is then in the peer daemon.

Slot layout: name length (1 byte) | endpoint name | data length (2 bytes, big-endian) | data.

Holds `Mailbox`: endpoint bindings, the bounded queues of received messages (messages to an
endpoint nobody bound yet wait, a bounded few per endpoint and MAX_UNBOUND in all, so a reply
can race its receiver's bind), the
outgoing links per peer, and the incoming mailboxes. What it leaves to `service`: opening and
posting on connections, routing session events here, and waking long-polls.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import struct
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from mrc.core.events import ImmediateReceived, WriteCompleted
from mrc.core.memory import Region

from .conns import Connection, write_status
from .regions import DaemonRegion, Regions
from .rpc import NOT_CONNECTED, RESOURCE_LIMIT, Params, RpcError

__all__ = ["MAILBOX_BYTES", "MAX_MESSAGE", "Mailbox"]

MAX_MESSAGE = 4096
MAX_NAME = 64
SLOTS = 16
SLOT_BYTES = 1 + MAX_NAME + 2 + MAX_MESSAGE
MAILBOX_BYTES = SLOTS * SLOT_BYTES
#: Messages kept per endpoint until its client takes them, and endpoints with a queue.
MAX_QUEUED = 256
MAX_ENDPOINTS = 1024
#: Messages waiting, all endpoints together, for an endpoint nobody bound yet (past it the new
#: ones are dropped, counted): without it, peers could park MAX_ENDPOINTS × MAX_QUEUED messages
#: (a GiB) in the daemon for names nobody will ever bind.
MAX_UNBOUND = 1024
#: How long a sender waits for a free slot before giving up.
SLOT_WAIT = 10.0
_LEN = struct.Struct(">H")


class MailHost(Protocol):
    """What the mailbox needs from the service."""

    def open_mail(self, peer: str) -> Coroutine[Any, Any, Connection]: ...

    def post(
        self, conn: Connection, src: Region, offset: int, length: int, va: int, rkey: int, imm: int
    ) -> int: ...

    def wake(self, client: int) -> None: ...


@dataclass(eq=False)
class _Link:
    """The outgoing side toward one peer: its MAIL connection and the slots in use."""

    conn: Connection
    outbox: Region
    free: deque[int] = field(default_factory=lambda: deque(range(SLOTS)))
    #: msn → (slot, future answered when the WRITE completes).
    sending: dict[int, tuple[int, asyncio.Future[None]]] = field(default_factory=dict)
    slot_freed: asyncio.Event = field(default_factory=asyncio.Event)


class Mailbox:
    def __init__(self, host: MailHost, regions: Regions, now: Callable[[], float]) -> None:
        self.host = host
        self.regions = regions
        self.now = now
        #: endpoint name → the client that bound it.
        self.bound: dict[str, int] = {}
        self.queues: dict[str, deque[tuple[str, bytes]]] = {}
        #: Messages queued for endpoints nobody bound (at most MAX_UNBOUND).
        self.unbound_messages = 0
        self.counters: Counter[str] = Counter()
        self._links: dict[str, _Link] = {}
        self._opening: dict[str, asyncio.Future[_Link]] = {}

    # -- endpoints ------------------------------------------------------------------------------

    def bind(self, client: int, p: Params) -> dict[str, Any]:
        name = p.text("endpoint", max_len=MAX_NAME)
        p.done()
        owner = self.bound.get(name)
        if owner is not None and owner != client:
            raise p.bad("endpoint", f"{name!r} is bound by another client")
        if owner is None and len(self.bound) >= MAX_ENDPOINTS:
            raise RpcError(RESOURCE_LIMIT, f"bind: more than {MAX_ENDPOINTS} endpoints")
        if owner is None:
            # What waited here unbound is this client's from now on.
            self.unbound_messages -= len(self.queues.get(name, ()))
        self.bound[name] = client
        self.queues.setdefault(name, deque())
        return {}

    def unbind_all(self, client: int) -> None:
        for name in [n for n, c in self.bound.items() if c == client]:
            del self.bound[name]
            self.queues.pop(name, None)

    def take(self, client: int, p: Params) -> tuple[str, Callable[[], list[dict[str, Any]]]]:
        """The endpoint a recv_message reads and a function taking what is queued there."""
        name = p.text("endpoint", max_len=MAX_NAME)
        if self.bound.get(name) != client:
            raise p.bad("endpoint", f"{name!r} is not bound by this client (bind it first)")

        def messages() -> list[dict[str, Any]]:
            queue = self.queues.get(name)
            out = []
            while queue:
                peer, data = queue.popleft()
                out.append({"peer": peer, "data": base64.b64encode(data).decode("ascii")})
            return out

        return name, messages

    def ready(self, name: str) -> bool:
        return bool(self.queues.get(name))

    # -- sending --------------------------------------------------------------------------------

    async def send(self, peer: str, p: Params) -> dict[str, Any]:
        name = p.text("endpoint", max_len=MAX_NAME)
        raw = p.raw("data")
        p.done()
        if not isinstance(raw, str):
            raise p.bad("data", "must be a base64 string")
        try:
            data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise p.bad("data", "is not valid base64") from None
        if len(data) > MAX_MESSAGE:
            raise p.bad("data", f"holds {len(data)} bytes, more than {MAX_MESSAGE}")
        link = await self._link(peer)
        slot = await self._slot(link)
        encoded = name.encode()
        body = bytes([len(encoded)]) + encoded + _LEN.pack(len(data)) + data
        offset = slot * SLOT_BYTES
        link.outbox.view[offset : offset + len(body)] = body
        va, rkey, length = link.conn.peer_mailbox or (0, 0, 0)
        if length < MAILBOX_BYTES:
            link.free.append(slot)
            raise RpcError(NOT_CONNECTED, f"send_message: {peer}'s mailbox is too small")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            msn = self.host.post(link.conn, link.outbox, offset, len(body), va + offset, rkey, slot)
        except RpcError:
            link.free.append(slot)
            raise
        link.sending[msn] = (slot, done)
        await done
        self.counters["sent"] += 1
        return {}

    async def _link(self, peer: str) -> _Link:
        link = self._links.get(peer)
        if link is not None and link.conn.live:
            return link
        pending = self._opening.get(peer)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._opening[peer] = pending
            try:
                conn = await self.host.open_mail(peer)
                link = _Link(conn, Region(rkey=0, base_va=0, view=memoryview(
                    bytearray(MAILBOX_BYTES))))
                self._links[peer] = link
                pending.set_result(link)
            except BaseException as exc:
                pending.set_exception(exc)
                pending.exception()  # retrieved: the other waiters get it through `await`
                raise
            finally:
                self._opening.pop(peer, None)
            return link
        return await asyncio.shield(pending)

    async def _slot(self, link: _Link) -> int:
        deadline = self.now() + SLOT_WAIT
        while not link.free:
            if not link.conn.live:
                raise RpcError(NOT_CONNECTED, f"send_message: connection to {link.conn.peer} lost")
            link.slot_freed.clear()
            try:
                await asyncio.wait_for(link.slot_freed.wait(), max(0.0, deadline - self.now()))
            except TimeoutError:
                raise RpcError(
                    RESOURCE_LIMIT, f"send_message: {SLOTS} messages to {link.conn.peer} in flight"
                ) from None
        return link.free.popleft()

    def completed(self, conn: Connection, event: WriteCompleted) -> None:
        link = self._links.get(conn.peer)
        if link is None or link.conn is not conn:
            return
        entry = link.sending.pop(event.msn, None)
        if entry is None:
            return
        slot, done = entry
        link.free.append(slot)
        link.slot_freed.set()
        if done.done():
            return
        status = write_status(event.status)
        if status == "ok":
            done.set_result(None)
        else:
            self.counters["send_failed"] += 1
            done.set_exception(
                RpcError(NOT_CONNECTED, f"send_message: {conn.peer} refused it ({status})")
            )

    def closed(self, conn: Connection) -> None:
        """A MAIL connection ended: its senders fail; a responder's mailbox goes away."""
        link = self._links.get(conn.peer)
        if link is not None and link.conn is conn:
            del self._links[conn.peer]
            for _, done in link.sending.values():
                if not done.done():
                    done.set_exception(
                        RpcError(
                            NOT_CONNECTED,
                            f"send_message: connection to {conn.peer} lost "
                            f"({conn.close_reason})",
                        )
                    )
            link.slot_freed.set()
        if conn.mailbox_region is not None:
            region = self.regions.get(conn.mailbox_region)
            if region is not None:
                self.regions.deregister(region)
            conn.mailbox_region = None

    # -- receiving ------------------------------------------------------------------------------

    def new_mailbox(self, peer: str, keys: frozenset[bytes] | None = None) -> DaemonRegion:
        """A mailbox for `peer`'s MAIL connection, writable by the peers of `keys` (None: any)."""
        return self.regions.register_local(
            bytearray(MAILBOX_BYTES), f"mailbox:{peer}", self.now(), keys
        )

    def deliver(self, conn: Connection, region: DaemonRegion, event: ImmediateReceived) -> None:
        """A message landed in `region` (this connection's mailbox), slot = its immediate."""
        slot = event.imm
        if conn.mailbox_region != region.id or slot >= SLOTS:
            self.counters["bad_slot"] += 1
            return
        view = region.core.view[slot * SLOT_BYTES : (slot + 1) * SLOT_BYTES]
        n = view[0]
        if not 1 <= n <= MAX_NAME:
            self.counters["malformed"] += 1
            return
        try:
            name = bytes(view[1 : 1 + n]).decode()
        except UnicodeDecodeError:
            self.counters["malformed"] += 1
            return
        (size,) = _LEN.unpack_from(view, 1 + n)
        if size > MAX_MESSAGE:
            self.counters["malformed"] += 1
            return
        data = bytes(view[3 + n : 3 + n + size])
        client = self.bound.get(name)
        queue = self.queues.get(name)
        if client is None and self.unbound_messages >= MAX_UNBOUND and (
            queue is None or len(queue) < MAX_QUEUED
        ):
            self.counters["dropped_unbound_full"] += 1
            return
        if queue is None:
            if len(self.queues) >= MAX_ENDPOINTS:
                self.counters["dropped_no_endpoint"] += 1
                return
            queue = self.queues[name] = deque()
        if len(queue) >= MAX_QUEUED:
            queue.popleft()
            self.counters["dropped_queue_full"] += 1
        elif client is None:
            self.unbound_messages += 1
        queue.append((conn.peer, data))
        self.counters["received"] += 1
        if client is not None:
            self.host.wake(client)


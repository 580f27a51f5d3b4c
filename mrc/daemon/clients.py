"""Per application: the queues a control client reads, its long-polls, and its WRITEs' checks.

Holds `ClientState` (the completions of each of its connections in MSN order, the immediates of
WRITE_WITH_IMMs that landed in its regions, or, once it subscribed, the notifications that push
them, and the futures of its long-polls, woken when something arrives) and `check_write`,
which turns one entry of a `write` call into the arguments of `Session.post_write` or refuses
it with the error docs/DAEMON.md gives (naming the entry's index and key). What a client may
do, and what happens when it goes, is `service`'s.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mrc.control import U64_MAX

from .conns import Connection
from .regions import DaemonRegion, Regions
from .rpc import INVALID_PARAMS, OUT_OF_BOUNDS, UNKNOWN_REGION, Params, RpcError, notification

if TYPE_CHECKING:
    from .control import ControlClient

__all__ = ["MAX_IMMEDIATES", "MAX_ITEMS", "MAX_WRITE", "ClientState", "check_write", "long_poll"]

MAX_WRITE = 1 << 31
#: Items one completions/immediates answer holds (the answer line stays well under 1 MiB).
MAX_ITEMS = 8192
#: Immediates kept for a client that does not fetch them (the oldest go, counted).
MAX_IMMEDIATES = 1 << 16
_U32 = (1 << 32) - 1
_WRITE_KEYS = {"region", "offset", "length", "remote", "remote_offset", "imm"}
_HANDLE_KEYS = {"host", "region", "rkey", "va", "length"}

Item = dict[str, Any]


class ClientState:
    """What the service keeps for one control connection."""

    def __init__(self, client: ControlClient, loop: asyncio.AbstractEventLoop) -> None:
        self.id = client.id
        self.pid = client.pid
        self.uid = client.uid
        self.loop = loop
        self.connections: set[int] = set()
        #: connection id → completions not yet fetched, in MSN order.
        self.completions: dict[int, deque[Item]] = {}
        self.immediates: deque[Item] = deque()
        self.waiters: list[asyncio.Future[None]] = []
        #: The kinds `subscribe` asked for ("immediates", "completions"): those go out as
        #: notifications (`push`), not into the queues for a long-poll to fetch.
        self.pushes: set[str] = set()
        self._send = client.send
        self._outbox: dict[str, list[Item]] = {}

    def wake(self) -> None:
        for fut in self.waiters:
            if not fut.done():
                fut.set_result(None)
        self.waiters.clear()

    def subscribe(self, kinds: set[str]) -> None:
        """From now on every item of `kinds` is pushed; those already waiting go first."""
        new = kinds - self.pushes
        self.pushes |= kinds
        if "immediates" in new and self.immediates:
            waiting, self.immediates = self.immediates, deque()
            for item in waiting:
                self.push("immediates", item)
        if "completions" in new:
            for conn_id in sorted(self.completions):
                queue = self.completions[conn_id]
                while queue:
                    self.push("completions", queue.popleft())

    def push(self, kind: str, item: Item) -> None:
        """Send `item` in the next notification of its kind: one for all that land in one turn
        of the event loop (a drain's worth), sent once the turn's answers went out."""
        if not self._outbox:
            self.loop.call_soon(self._notify)
        self._outbox.setdefault(kind, []).append(item)

    def _notify(self) -> None:
        outbox, self._outbox = self._outbox, {}
        for kind, items in outbox.items():
            for at in range(0, len(items), MAX_ITEMS):
                self._send(notification(kind, {kind: items[at : at + MAX_ITEMS]}))

    def cancel(self) -> None:
        for fut in self.waiters:
            if not fut.done():
                fut.cancel()
        self.waiters.clear()

    def completions_when(self, conn_id: int | None, limit: int, timeout: float) -> Any:
        def ready() -> bool:
            if conn_id is not None:
                return bool(self.completions.get(conn_id))
            return any(self.completions.values())

        def take() -> Item:
            out: list[Item] = []
            queues = [conn_id] if conn_id is not None else sorted(self.completions)
            for cid in queues:
                queue = self.completions.get(cid)
                while queue and len(out) < limit:
                    out.append(queue.popleft())
            return {"completions": out}

        return self.answer_when(ready, take, timeout)

    def immediates_when(self, region_id: int | None, limit: int, timeout: float) -> Any:
        def ready() -> bool:
            if region_id is None:
                return bool(self.immediates)
            return any(item["region"] == region_id for item in self.immediates)

        def take() -> Item:
            out: list[Item] = []
            keep: deque[Item] = deque()
            for item in self.immediates:
                if len(out) < limit and (region_id is None or item["region"] == region_id):
                    out.append(item)
                else:
                    keep.append(item)
            self.immediates = keep
            return {"immediates": out}

        return self.answer_when(ready, take, timeout)

    def answer_when(
        self, ready: Callable[[], bool], take: Callable[[], Item], timeout: float
    ) -> Any:
        """`take()` now when something is ready or `timeout` is 0, else a long-poll that
        answers as soon as `ready()` (checked on every `wake`) or when `timeout` passed."""
        if timeout <= 0 or ready():
            return take()
        loop = self.loop

        async def poll() -> Item:
            deadline = loop.time() + timeout
            while not ready() and loop.time() < deadline:
                fut: asyncio.Future[None] = loop.create_future()
                self.waiters.append(fut)
                # The deadline resolves the future as a wake does (a timer handle, not
                # asyncio.wait_for: its second future and callbacks per long-poll cost more
                # than a small message's answer).
                expiry = loop.call_at(deadline, _expire, fut)
                try:
                    await fut
                finally:
                    expiry.cancel()
                    if fut in self.waiters:
                        self.waiters.remove(fut)
            return take()

        return poll()


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def long_poll(p: Params, key: str) -> tuple[int | None, int, float]:
    """A long-poll's parameters (`completions`, `immediates`): the optional object `key`
    names, `max` and `timeout`."""
    ident = p.opt_integer(key)
    limit = p.opt_integer("max", 1, MAX_ITEMS) or MAX_ITEMS
    timeout = p.seconds("timeout")
    p.done()
    return ident, limit, timeout


def check_write(
    regions: Regions, client: int, conn: Connection, i: int, w: Any
) -> tuple[DaemonRegion, int, int, int, int, int | None]:
    """Entry `i` of a write call → (local region, offset, length, remote VA, R_Key, imm)."""
    where = f"write {i}"

    def bad(key: str, message: str, code: int = INVALID_PARAMS) -> RpcError:
        return RpcError(code, f"{where}: {key} {message}", {"index": i, "key": key})

    if not isinstance(w, dict):
        raise RpcError(INVALID_PARAMS, f"{where}: must be an object", {"index": i})
    unknown = set(w) - _WRITE_KEYS
    if unknown:
        raise bad(sorted(unknown)[0], "is not a field of a write")

    def integer(obj: dict[str, Any], key: str, hi: int, default: int | None = None) -> int:
        value = obj.get(key, default)
        if type(value) is not int or not 0 <= value <= hi:
            raise bad(key, f"must be an integer 0..{hi}")
        return value

    region_id = integer(w, "region", U64_MAX)
    region = regions.get(region_id)
    if region is None or region.owner != client:
        raise bad("region", f"{region_id} is not a region of this client", UNKNOWN_REGION)
    offset = integer(w, "offset", U64_MAX)
    length = integer(w, "length", U64_MAX)
    if not 1 <= length <= MAX_WRITE:
        raise bad("length", f"must be 1..{MAX_WRITE}, got {length}")
    if offset + length > region.size:
        raise bad(
            "offset",
            f"{offset} + length {length} is outside region {region_id} ({region.size} bytes)",
            OUT_OF_BOUNDS,
        )
    remote = w.get("remote")
    if not isinstance(remote, dict) or set(remote) != _HANDLE_KEYS:
        raise bad("remote", f"must be a region handle ({', '.join(sorted(_HANDLE_KEYS))})")
    if remote["host"] != conn.peer:
        raise bad(
            "remote",
            f"is a region on {remote['host']!r}; connection {conn.id} goes to {conn.peer!r}",
        )
    rkey = integer(remote, "rkey", _U32)
    va = integer(remote, "va", U64_MAX)
    handle_length = integer(remote, "length", U64_MAX)
    integer(remote, "region", U64_MAX)
    remote_offset = integer(w, "remote_offset", U64_MAX, 0)
    if remote_offset + length > handle_length:
        raise bad(
            "remote_offset",
            f"{remote_offset} + length {length} is outside the remote region "
            f"({handle_length} bytes)",
            OUT_OF_BOUNDS,
        )
    # Packets carry VA + offset in 64 bits (docs/WIRE.md §3 RETH): a handle near the top
    # would wrap around.
    if va + remote_offset + length > 1 << 64:
        raise bad("remote", "VA + remote_offset + length overflows 64 bits")
    imm = w.get("imm")
    if imm is not None and (type(imm) is not int or not 0 <= imm <= _U32):
        raise bad("imm", f"must be an integer 0..{_U32}")
    return region, offset, length, va + remote_offset, rkey, imm

"""What every client operation asks the daemon and keeps in between, written once for both
flavours.

Each operation is a generator that yields `Call`s (method, params, an fd for
`register_region`, how long to wait for the answer) and is sent each call's result back (or has
the call's `ClientError` thrown into it); `sync.Client` drives it with blocking socket calls,
`aio.AsyncClient` with awaits. So the long-poll loops, the per-connection completion buffer and
the ownership checks exist once. `ClientCore` holds that state: the regions and connections this
control connection owns, the write ids posted on each connection and not yet handed back, and
completions fetched for ids nobody asked for yet. It moves no bytes itself.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .memory import RegionBase, SharedMemory
from .objects import (
    Completion,
    Immediate,
    Message,
    RegionHandle,
    Write,
    answer_list,
    check_endpoint,
    check_timeout,
    encode_message,
    write_params,
)
from .rpc import (
    BAD_ANSWER,
    INVALID_PARAMS,
    UNKNOWN_CONNECTION,
    UNKNOWN_REGION,
    ClientError,
)

__all__ = ["POLL_SLICE", "PUSHED", "VIEWS", "Call", "ClientCore", "Op", "Pushed", "push_kinds"]

T = TypeVar("T")

#: Longest single long-poll: a wait without a deadline is a loop of these, so an interrupt or a
#: dead daemon is noticed within about this long.
POLL_SLICE = 1.0
#: Time the daemon gets to answer beyond a long-poll's own timeout.
ANSWER_GRACE = 10.0
#: `connect` waits for the MRC handshake (retries included) before the daemon answers.
CONNECT_GRACE = 60.0
#: The read-only views and the daemon methods behind them.
VIEWS = ("peers", "connections", "planes", "evs", "regions")


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    params: dict[str, Any]
    #: Seconds to wait for the answer before giving up on the daemon (TIMEOUT).
    answer_within: float = ANSWER_GRACE
    fd: int | None = None


@dataclass(frozen=True, slots=True)
class Pushed:
    """Not a request: wait up to `seconds` for what the daemon pushes unasked (a subscribed
    client's immediates and completions, `ClientCore.notified`); answered with None, the
    operation then looks again at what arrived."""

    seconds: float


Op = Generator[Call | Pushed, Any, T]
#: The kinds a client may have pushed to it (docs/DAEMON.md, `subscribe`).
PUSHED = ("immediates", "completions")


def push_kinds(immediates: bool, completions: bool) -> list[str]:
    """The kinds of `subscribe` from its two flags."""
    return [k for k, on in zip(PUSHED, (immediates, completions), strict=True) if on]


class _Conn:
    """What the core keeps per connection: ids posted and not yet returned (in posting order)
    and the completions already fetched for them."""

    __slots__ = ("done", "early", "peer", "posted")

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.posted: dict[int, None] = {}
        self.done: dict[int, Completion] = {}
        #: Pushed completions of ids whose `write` answer the operation has not read yet (the
        #: reader files a push the moment it arrives, the answer before it may still wait for
        #: its operation to run on); at most MAX_EARLY, the oldest go.
        self.early: dict[int, Completion] = {}


#: Pushed completions kept per connection for ids not known yet (see `_Conn.early`).
MAX_EARLY = 4096
#: Pushed immediates kept for `wait_immediates` at most (the daemon's bound on those waiting
#: for an `immediates` call, docs/DAEMON.md); past it the oldest go, counted.
MAX_PUSHED = 1 << 16


class ClientCore:
    def __init__(self) -> None:
        self.regions: dict[int, RegionBase] = {}
        self.conns: dict[int, _Conn] = {}
        #: Messages fetched for an endpoint and not yet handed out.
        self.inbox: dict[str, deque[Message]] = {}
        #: The kinds `subscribe` asked the daemon to push (set from before its request: a
        #: notification may follow its answer at once). Pushed immediates not handed out
        #: wait in `pushed`; pushed completions are filed under their connection.
        self.pushes: set[str] = set()
        self.pushed: deque[Immediate] = deque()
        self.pushed_dropped = 0

    # ---- regions -------------------------------------------------------------------------

    def register_region(
        self, size: int, name: str | None, peers: Sequence[str] | None = None
    ) -> Op[tuple[int, RegionHandle, SharedMemory]]:
        if name is not None and (not isinstance(name, str) or not 1 <= len(name) <= 64):
            raise ClientError(INVALID_PARAMS, f"region name must be 1..64 characters: {name!r}")
        if peers is not None and (
            isinstance(peers, str)
            or not isinstance(peers, Sequence)
            or not all(isinstance(p, str) and p for p in peers)
        ):
            raise ClientError(INVALID_PARAMS, f"peers must be a list of peer names: {peers!r}")
        memory = SharedMemory(size, name or "region")
        try:
            params: dict[str, Any] = {"size": size}
            if name is not None:
                params["name"] = name
            if peers is not None:
                params["peers"] = list(peers)
            result = yield Call("register_region", params, fd=memory.fd)
            if not isinstance(result, dict) or type(result.get("region")) is not int:
                raise ClientError(BAD_ANSWER, "register_region: answer without a region id")
            handle = RegionHandle.from_dict(result.get("handle"), BAD_ANSWER)
        except BaseException:
            memory.release()
            raise
        # The daemon mapped the memfd; the mapping alone keeps the pages now.
        memory.close_fd()
        return result["region"], handle, memory

    def adopt_region(self, region: RegionBase) -> None:
        self.regions[region.id] = region

    def deregister_region(self, region: RegionBase) -> Op[None]:
        if region.closed:
            return
        try:
            if self.regions.pop(region.id, None) is not None:
                if self.pushed:  # its pushed immediates will never be asked for
                    self.pushed = deque(i for i in self.pushed if i.region != region.id)
                yield Call("deregister_region", {"region": region.id})
        finally:
            region._release()

    def _own_region(self, region: Any, where: str) -> RegionBase:
        if not isinstance(region, RegionBase) or self.regions.get(region.id) is not region:
            raise ClientError(UNKNOWN_REGION, f"{where}: region is not registered by this client")
        return region

    # ---- connections and writes -----------------------------------------------------------

    def connect(self, peer: str) -> Op[int]:
        if not isinstance(peer, str) or not peer:
            raise ClientError(INVALID_PARAMS, f"peer must be a non-empty name: {peer!r}")
        result = yield Call("connect", {"peer": peer}, answer_within=CONNECT_GRACE)
        if not isinstance(result, dict) or type(result.get("connection")) is not int:
            raise ClientError(BAD_ANSWER, "connect: answer without a connection id")
        cid: int = result["connection"]
        self.conns[cid] = _Conn(peer)
        return cid

    def _conn(self, cid: int) -> _Conn:
        conn = self.conns.get(cid)
        if conn is None:
            raise ClientError(UNKNOWN_CONNECTION, f"connection {cid} is closed")
        return conn

    def disconnect(self, cid: int) -> Op[None]:
        if self.conns.pop(cid, None) is not None:
            yield Call("disconnect", {"connection": cid})

    def write(self, cid: int, writes: Sequence[Write]) -> Op[list[int]]:
        conn = self._conn(cid)
        if not writes:
            raise ClientError(INVALID_PARAMS, "write: no writes given")
        entries = []
        for i, w in enumerate(writes):
            if not isinstance(w, Write):
                raise ClientError(INVALID_PARAMS, f"write {i}: expected a Write")
            region = self._own_region(w.region, f"write {i}")
            entries.append(write_params(i, region.id, region.size, w))
        result = yield Call("write", {"connection": cid, "writes": entries})
        ids = result.get("ids") if isinstance(result, dict) else None
        if (not isinstance(ids, list) or len(ids) != len(entries)
                or any(type(i) is not int for i in ids)):
            raise ClientError(BAD_ANSWER, f"write: expected {len(entries)} ids in the answer")
        for i in ids:
            conn.posted[i] = None
            early = conn.early.pop(i, None) if conn.early else None
            if early is not None:
                conn.done[i] = early
        return ids

    def _record(self, result: Any) -> int:
        """File completions under their connection; returns how many arrived."""
        items = answer_list(result, "completions")
        for item in items:
            c = Completion.decode(item)
            conn = self.conns.get(c.connection)
            # Only ids this client posted: a stray one would sit in `done` forever.
            if conn is not None and c.id in conn.posted:
                conn.done[c.id] = c
            elif conn is not None and "completions" in self.pushes:
                conn.early[c.id] = c
                if len(conn.early) > MAX_EARLY:
                    del conn.early[next(iter(conn.early))]
        return len(items)

    def _fetch(self, cid: int | None, timeout: float) -> Op[None]:
        """Completions of connection `cid` (None: all), waiting up to `timeout` for one: one
        request, or, when they are pushed, a wait for the next push (none for 0 s)."""
        if "completions" in self.pushes:
            if timeout > 0:
                yield Pushed(timeout)
            return
        params: dict[str, Any] = {"timeout": timeout}
        if cid is not None:
            params["connection"] = cid
        result = yield Call("completions", params, answer_within=timeout + ANSWER_GRACE)
        self._record(result)

    def outstanding(self, cid: int) -> int:
        conn = self._conn(cid)
        return len(conn.posted) - len(conn.done)

    def wait(self, cid: int, ids: Sequence[int] | None, timeout: float | None) -> Op[
            list[Completion]]:
        """Until every id in `ids` (None: every write posted on the connection so far) has a
        completion, or `timeout` passes; returns the completions that came, in posting order.
        Those not returned stay for a later wait."""
        conn = self._conn(cid)
        timeout = check_timeout(timeout)
        if ids is None:
            want = list(conn.posted)
        else:
            want = list(dict.fromkeys(ids))
            unknown = [i for i in want if i not in conn.posted]
            if unknown:
                raise ClientError(INVALID_PARAMS, f"wait: ids {unknown[:8]} were not posted on "
                                                  f"connection {cid} or were already returned")
        deadline = None if timeout is None else time.monotonic() + timeout
        fetched = False
        while any(i not in conn.done for i in want):
            wait = _slice(deadline)
            if wait == 0 and fetched:
                break
            yield from self._fetch(cid, wait)
            fetched = True
        return self._take(conn, [i for i in want if i in conn.done])

    def poll(self, cid: int, timeout: float | None, limit: int | None) -> Op[list[Completion]]:
        """The completions that have arrived (waiting up to `timeout` for the first one)."""
        conn = self._conn(cid)
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        fetched = False
        while not conn.done:
            wait = _slice(deadline)
            if wait == 0 and fetched:
                break
            yield from self._fetch(cid, wait)
            fetched = True
        ready = [i for i in conn.posted if i in conn.done]
        return self._take(conn, ready[:limit] if limit else ready)

    def poll_all(self, timeout: float | None) -> Op[list[Completion]]:
        """The completions that have arrived on any of this client's connections (waiting up
        to `timeout` for the first one): one request for all of them, in posting order per
        connection."""
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        fetched = False
        while not any(conn.done for conn in self.conns.values()):
            wait = _slice(deadline)
            if wait == 0 and fetched:
                break
            yield from self._fetch(None, wait)
            fetched = True
        out: list[Completion] = []
        for conn in self.conns.values():
            if conn.done:
                out += self._take(conn, [i for i in conn.posted if i in conn.done])
        return out

    @staticmethod
    def _take(conn: _Conn, ids: list[int]) -> list[Completion]:
        out = []
        for i in ids:
            out.append(conn.done.pop(i))
            del conn.posted[i]
        return out

    # ---- immediates and messages -----------------------------------------------------------

    def immediates(self, region: RegionBase | None, timeout: float | None,
                   limit: int | None) -> Op[list[Immediate]]:
        """The immediates that have landed (waiting up to `timeout` for the first one)."""
        timeout = check_timeout(timeout)
        params: dict[str, Any] = {}
        if region is not None:
            params["region"] = self._own_region(region, "wait_immediates").id
        if limit is not None:
            if type(limit) is not int or limit < 1:
                raise ClientError(INVALID_PARAMS, f"max must be a positive integer: {limit!r}")
            params["max"] = limit
        deadline = None if timeout is None else time.monotonic() + timeout
        fetched = False
        while True:
            if "immediates" in self.pushes:
                got = self.take_pushed(region, limit)
                if got:
                    return got
            wait = _slice(deadline)
            if wait == 0 and fetched:
                return []
            fetched = True
            if "immediates" in self.pushes:
                if wait > 0:
                    yield Pushed(wait)
                continue
            result = yield Call("immediates", dict(params, timeout=wait),
                                answer_within=wait + ANSWER_GRACE)
            got = [Immediate.decode(item) for item in answer_list(result, "immediates")]
            if got:
                return got

    def subscribe(self, kinds: Sequence[str]) -> Op[None]:
        """Have the daemon push `kinds` of this client's items as notifications (docs/DAEMON.md):
        the waits for them then ask nothing (`Pushed`)."""
        new = set(kinds)
        if not new or not new <= set(PUSHED):
            raise ClientError(INVALID_PARAMS, f"subscribe: kinds must be among {PUSHED}")
        if new & self.pushes:
            raise ClientError(INVALID_PARAMS, f"subscribe: already subscribed to "
                                              f"{', '.join(sorted(new & self.pushes))}")
        self.pushes |= new
        try:
            yield Call("subscribe", dict.fromkeys(sorted(new), True))
        except BaseException:
            self.pushes -= new
            raise

    def notified(self, method: str, params: dict[str, Any]) -> list[Immediate]:
        """Take one notification: completions are filed, immediates kept in `pushed` (and
        returned); a kind not subscribed to is ignored."""
        if method not in self.pushes:
            return []
        if method == "completions":
            self._record(params)
            return []
        got = [Immediate.decode(item) for item in answer_list(params, "immediates")]
        self.pushed.extend(got)
        while len(self.pushed) > MAX_PUSHED:  # as the daemon keeps them unasked: the oldest go
            self.pushed.popleft()
            self.pushed_dropped += 1
        return got

    def take_pushed(self, region: RegionBase | None, limit: int | None) -> list[Immediate]:
        """What `wait_immediates` hands out of `pushed` now (of `region`, at most `limit`)."""
        region_id = None if region is None else self._own_region(region, "wait_immediates").id
        if limit is not None and (type(limit) is not int or limit < 1):
            raise ClientError(INVALID_PARAMS, f"max must be a positive integer: {limit!r}")
        out: list[Immediate] = []
        keep: deque[Immediate] = deque()
        for imm in self.pushed:
            if (limit is None or len(out) < limit) and region_id in (None, imm.region):
                out.append(imm)
            else:
                keep.append(imm)
        self.pushed = keep
        return out

    def bind(self, endpoint: str) -> Op[None]:
        yield Call("bind", {"endpoint": check_endpoint(endpoint)})
        self.inbox.setdefault(endpoint, deque())

    def send_message(self, peer: str, endpoint: str, data: bytes) -> Op[None]:
        if not isinstance(peer, str) or not peer:
            raise ClientError(INVALID_PARAMS, f"peer must be a non-empty name: {peer!r}")
        params = {"peer": peer, "endpoint": check_endpoint(endpoint),
                  "data": encode_message(data)}
        yield Call("send_message", params, answer_within=CONNECT_GRACE)

    def recv_message(self, endpoint: str, timeout: float | None) -> Op[Message | None]:
        """The next message to `endpoint`, or None once `timeout` passed without one. The
        daemon may hand over several at once: the rest wait here for the next call."""
        check_endpoint(endpoint)
        timeout = check_timeout(timeout)
        queue = self.inbox.setdefault(endpoint, deque())
        deadline = None if timeout is None else time.monotonic() + timeout
        fetched = False
        while not queue:
            wait = _slice(deadline)
            if wait == 0 and fetched:
                return None
            result = yield Call("recv_message", {"endpoint": endpoint, "timeout": wait},
                                answer_within=wait + ANSWER_GRACE)
            fetched = True
            queue.extend(Message.decode(item) for item in answer_list(result, "messages"))
        return queue.popleft()

    # ---- views ----------------------------------------------------------------------------

    @staticmethod
    def status() -> Op[dict[str, Any]]:
        result = yield Call("status", {})
        if not isinstance(result, dict):
            raise ClientError(BAD_ANSWER, "status: the answer is not an object")
        return result

    @staticmethod
    def view(name: str, params: dict[str, Any] | None = None) -> Op[list[dict[str, Any]]]:
        if name not in VIEWS:
            raise ClientError(INVALID_PARAMS, f"no view {name!r} (views: {', '.join(VIEWS)})")
        result = yield Call(name, params or {})
        # The protocol says "lists of dicts"; accept {name: [...]} as well, the shape a daemon
        # answering with a named list would use.
        if isinstance(result, dict) and isinstance(result.get(name), list):
            result = result[name]
        if not isinstance(result, list) or not all(isinstance(r, dict) for r in result):
            raise ClientError(BAD_ANSWER, f"{name}: the answer is not a list of objects")
        return result


def _slice(deadline: float | None) -> float:
    """How long the next long-poll may wait: a slice, or what is left before `deadline`."""
    if deadline is None:
        return POLL_SLICE
    return max(0.0, min(deadline - time.monotonic(), POLL_SLICE))

"""The ring over the MRC daemons: an `engine.Link` made of `mrc.client` regions and connections.

Each rank registers five regions with its daemon: the receive slots (`slots` × `chunk_bytes`,
the previous rank WRITEs chunks there), a credit page (the next rank WRITEs its credits there;
it is also the source of this rank's one-byte credit WRITEs), the local buffer (the header
staging area and the work buffer, grown when a collective needs more; only this rank knows
it), and the one-shot receive and staging areas (every other rank WRITEs its small calls
straight into the first, docs/COLLECTIVE.md §6). A chunk is a WRITE_WITH_IMM into the next
rank's slot `counter mod slots`, its immediate the item counter (mod 2^32); a credit is a
one-byte WRITE_WITH_IMM into the previous rank's credit page, its immediate the count of
items applied. An immediate is raised only once every byte of its WRITE is placed, so an
arrived counter means the slot is whole.

Bootstrap uses the daemons' message service only: every rank binds the endpoint
`<group>.<rank>` and sends every other rank (its ring neighbours only when ranks share a
daemon) a hello (its region handles, world, slots, chunk size) until each acknowledges; then
it connects to each of them. The same endpoint carries aborts afterwards: a rank that fails
tells every other rank why, so they fail at once instead of at their timeouts.

Three pumps run while the link lives (`AsyncClient` answers their long-polls concurrently):
immediates (chunks, credits and one-shot messages), messages (aborts, late hellos), and the
completions of every connection (one request for them all; a failed WRITE is a failure),
long-polled only while the engine waits for some, else swept every SWEEP seconds. A one-shot
call's WRITEs go in one control request (a batch) that also fetches the completions that
came, so a small call costs one request line. Credits are posted without waiting for the
daemon's answer (a refused one fails the link when it is answered). The engine that uses them
is `engine`; the communicator `ring`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from mrc.client import (
    AsyncClient,
    AsyncConnection,
    AsyncRegion,
    ClientError,
    Completion,
    Immediate,
    Message,
    RegionHandle,
    Write,
    rpc,
)

from .comm import CollectiveError
from .engine import MESH_SLOT, WORK_OFFSET, await_change
from .ring import AsyncRing, Ring, run_blocking, stop_loop

__all__ = ["DEFAULT_CHUNK", "DEFAULT_SLOTS", "MrcLink", "open_mrc", "open_mrc_async"]

#: Bytes per chunk (= per receive slot) and slots per rank, unless the caller says otherwise.
DEFAULT_CHUNK = 1 << 20
DEFAULT_SLOTS = 8
#: Long-poll slice of the pumps, and how often completions nobody waits for are swept.
POLL = 1.0
SWEEP = 1.0
_U32 = 0xFFFFFFFF
#: Where in the credit page the previous rank's credits land, and our credits are sent from.
_CREDIT_IN, _CREDIT_OUT = 0, 64
_HELLO_EVERY = 0.25
#: The most ranks a one-shot call takes (the sender's rank rides in the immediate's low byte),
#: and the one-shot call counter's bits in the rest of it.
MESH_MAX_WORLD = 64
_SEQ24 = 0xFFFFFF
#: Completions kept whose post was not answered yet (credits' too: they are never asked for).
_EARLY_MAX = 4096
#: Staging slots of one-shot calls: call n is staged in slot n mod MESH_STAGING, once every
#: WRITE of call n - MESH_STAGING completed (their completions come back with later calls'
#: posts, so a call seldom waits for one).
MESH_STAGING = 4


def _catch_up(last: int, imm: int) -> int:
    """The full counter an immediate (counter mod 2^32) stands for, given the last one."""
    return last + ((imm - last) & _U32)


class MrcLink:
    """One rank's regions and connections, and the pumps that keep its counters."""

    def __init__(self, client: AsyncClient, rank: int, world: int, peers: Sequence[str],
                 endpoint_of: Callable[[int], str], slots: int, chunk_bytes: int,
                 regions: tuple[AsyncRegion, AsyncRegion, AsyncRegion],
                 to_next: AsyncConnection, to_prev: AsyncConnection,
                 next_slots: RegionHandle, prev_credit: RegionHandle,
                 mesh: tuple[AsyncRegion, AsyncRegion, dict[int, AsyncConnection],
                             dict[int, RegionHandle]]) -> None:
        self.client = client
        self.rank = rank
        self.world = world
        self.peers = list(peers)
        self.endpoint_of = endpoint_of
        self.slots = slots
        self.chunk_bytes = chunk_bytes
        self.recv, self.credits, self._local = regions
        self.to_next = to_next
        self.to_prev = to_prev
        self.next_slots = next_slots
        self.prev_credit = prev_credit
        #: The one-shot side (docs/COLLECTIVE.md §6): our receive area (a slot per rank and
        #: half), our staging area (a half per call parity), a connection to and the receive
        #: area of every other rank.
        self._mesh_in, self._mesh_out, self._conns, self._mesh_handles = mesh
        #: Whether one-shot calls can run (a connection to every other rank).
        self.mesh = len(self._conns) == world - 1
        self.mesh_arrived = [0] * world
        #: Ids of our one-shot WRITEs not completed yet, by staging slot.
        self._mesh_pending: list[set[int]] = [set() for _ in range(MESH_STAGING)]
        #: Our one-shot posts the daemon has not answered yet, by staging slot.
        self._mesh_posting: list[set[asyncio.Task[None]]] = [
            set() for _ in range(MESH_STAGING)]
        #: Connection id → peer name, for what a completion says.
        self._peer_of = {c.id: c.peer for c in (to_next, to_prev, *self._conns.values())}
        #: Completions whose id was not known yet (the answer to its post still on its way).
        self._early: dict[int, bool] = {}
        self.arrived = 0
        self.credit = 0
        self.completed = 0
        self.credited = 0
        self._data_ids: set[int] = set()
        #: `stream`'s WRITE sizes by id, and the bytes of those completed.
        self._sizes: dict[int, int] = {}
        self._streamed = 0
        self._posted = 0
        self._failure: CollectiveError | None = None
        self._remote_abort = False
        self._closing = False
        self._changed = asyncio.Event()
        #: Set while the engine waits for completions of data WRITEs.
        self._want = asyncio.Event()
        self._pumps: list[asyncio.Task[None]] = []
        #: Credit WRITEs whose post the daemon has not answered yet.
        self._credits_posting: set[asyncio.Task[list[int]]] = set()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._pumps = [loop.create_task(self._immediates()), loop.create_task(self._messages()),
                       loop.create_task(self._completions())]

    # ---- the engine's side ------------------------------------------------------------

    def local(self) -> memoryview:
        return self._local.buf

    async def reserve(self, work_bytes: int) -> None:
        need = WORK_OFFSET + work_bytes
        if need <= self._local.size:
            return
        size = max(need, 2 * self._local.size)
        try:
            new = await self.client.register_region(size, f"coll-local-{self.rank}")
        except ClientError as exc:
            raise CollectiveError(f"cannot register a {size}-byte work buffer: {exc}") from None
        old, self._local = self._local, new
        await old.close()

    async def post(self, items: list[tuple[int, int, int]]) -> None:
        writes = []
        for counter, offset, nbytes in items:
            slot = (counter % self.slots) * self.chunk_bytes
            if nbytes:
                writes.append(Write(self._local, offset, nbytes, self.next_slots, slot,
                                    counter & _U32))
            else:  # an empty chunk still moves the counter: one byte nobody reads
                writes.append(Write(self.credits, _CREDIT_OUT, 1, self.next_slots, slot,
                                    counter & _U32))
        ids = await self.to_next.write_many(writes)
        self._data_ids.update(ids)
        self._posted += len(ids)

    def slot(self, counter: int) -> memoryview:
        at = (counter % self.slots) * self.chunk_bytes
        return self.recv.buf[at:at + self.chunk_bytes]

    async def mesh_send(self, seq: int, payload: bytes, deadline: float,
                        waiting: Callable[[], str]) -> None:
        """Write `payload` (at most MESH_SLOT bytes) into every other rank's slot for us in
        the half of one-shot call `seq`, from our staging slot `seq` mod MESH_STAGING, which
        call `seq` - MESH_STAGING used: its WRITEs must have completed first. Every WRITE of
        the call goes in one control request, with a fetch of the completions that arrived
        meanwhile (so completions cost no request of their own); it is not waited for
        (the call reads what arrives meanwhile), and a refused one fails the link when it
        is answered."""
        half = seq % 2
        staging = seq % MESH_STAGING
        pending, posting = self._mesh_pending[staging], self._mesh_posting[staging]
        while pending or posting:
            await self.wait(deadline, waiting, completions=True)
        at = staging * MESH_SLOT
        self._mesh_out.buf[at:at + len(payload)] = payload
        imm = ((seq & _SEQ24) << 8) | self.rank
        posts = [(conn, [Write(self._mesh_out, at, len(payload), self._mesh_handles[r],
                               (self.rank * 2 + half) * MESH_SLOT, imm)])
                 for r, conn in self._conns.items()]

        async def post() -> None:
            try:
                ids, done = await self.client.write_batch(posts, completions=True)
            except ClientError as exc:
                self._fail(f"a one-shot WRITE: {exc}")
                return
            finally:
                posting.discard(asyncio.current_task())
            for (conn, _), got in zip(posts, ids, strict=True):
                for i in got:
                    ok = self._early.pop(i, None)
                    if ok is None:
                        pending.add(i)
                    elif not ok:
                        self._fail(f"a one-shot WRITE to {conn.peer} failed (the rank there "
                                   "or its daemon is gone)")
            self._absorb(done)
            self._changed.set()

        # Tasks start in the order they are made, and a batch is one line: every peer sees
        # our calls in order.
        posting.add(asyncio.get_running_loop().create_task(post()))

    def mesh_unfinished(self) -> int:
        return (sum(len(p) for p in self._mesh_pending)
                + sum(len(p) for p in self._mesh_posting))

    def mesh_slot(self, sender: int, seq: int) -> memoryview:
        at = (sender * 2 + seq % 2) * MESH_SLOT
        return self._mesh_in.buf[at:at + MESH_SLOT]

    async def give_credit(self, applied: int) -> None:
        """Post the credit WRITE without waiting for the daemon's answer (a pipelined
        request): the engine goes on, and a refused post fails the link when it answers."""
        self.credited = applied
        task = asyncio.get_running_loop().create_task(self.to_prev.write_many(
            [Write(self.credits, _CREDIT_OUT, 1, self.prev_credit, _CREDIT_IN,
                   applied & _U32)]))
        self._credits_posting.add(task)
        task.add_done_callback(self._credit_posted)

    def _credit_posted(self, task: asyncio.Task[list[int]]) -> None:
        self._credits_posting.discard(task)
        if task.cancelled() or self._closing:
            return
        exc = task.exception()
        if exc is not None:
            self._fail(f"a credit to rank {self._prev()} ({self.to_prev.peer}): {exc}")

    async def wait(self, deadline: float, waiting: Callable[[], str], *, chunks: bool = False,
                   credit: bool = False, completions: bool = False) -> None:
        if self._failure is not None:
            raise self._failure
        if completions:
            self._want.set()
        await await_change(self._changed, deadline, waiting, lambda: self._failure)

    async def abort(self, reason: str) -> None:
        """Tell every other rank (at once, each bounded) unless the failure came from one."""
        if self._failure is None:
            self._failure = CollectiveError(reason)
        if self._remote_abort:
            return
        self._remote_abort = True
        msg = json.dumps({"op": "abort", "rank": self.rank, "reason": reason[:3000]}).encode()

        async def tell(r: int) -> None:
            with contextlib.suppress(ClientError, TimeoutError):
                await asyncio.wait_for(
                    self.client.send_message(self.peers[r], self.endpoint_of(r), msg), 1.5)

        await asyncio.gather(*(tell(r) for r in range(self.world) if r != self.rank))

    async def stream(self, total: int, timeout: float) -> tuple[int, float]:
        """The ring's ceiling: plain WRITEs of `chunk_bytes` from the local buffer into the
        next rank's slots (no immediates, no credits), `slots` in flight, until `total` bytes
        completed; returns (bytes, seconds). Only between collectives (the communicator is
        not usable for collectives afterwards: the slots hold garbage, no counters moved)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.completed < self._posted:
            await self.wait(deadline, lambda: "waiting for the last collective's WRITEs",
                            completions=True)
        await self.reserve(self.chunk_bytes)
        size = self.chunk_bytes
        done = posted = 0
        start = loop.time()
        while done < total:
            batch = []
            while posted < total and posted - done < self.slots * size:
                n = min(size, total - posted)
                slot = (posted // size % self.slots) * size
                batch.append(Write(self._local, WORK_OFFSET, n, self.next_slots, slot))
                posted += n
            if batch:
                ids = await self.to_next.write_many(batch)
                self._data_ids.update(ids)
                self._posted += len(ids)
                self._sizes.update(zip(ids, (w.length for w in batch), strict=True))
            before = self.completed
            while self.completed == before:
                await self.wait(deadline, lambda: "streaming to the next rank", completions=True)
            done = self._streamed
        return done, loop.time() - start

    async def close(self) -> None:
        """Close the control connection (the daemon drops our regions, connections and
        endpoint; the pumps' long-polls fail with it and they end), then reap the pumps."""
        self._closing = True
        if self._credits_posting:  # let the last credits reach the daemon (bounded)
            await asyncio.wait(self._credits_posting, timeout=1.0)
        await self.client.close()
        for task in self._pumps:
            task.cancel()
        # Python 3.11's wait_for can swallow a cancel that races an answer: the pumps also
        # stop on `_closing`, and are not waited for forever.
        await asyncio.wait(self._pumps, timeout=2.0)
        self._pumps = []

    # ---- pumps ---------------------------------------------------------------------------

    def _fail(self, message: str) -> None:
        if self._failure is None:
            self._failure = CollectiveError(message)
        self._changed.set()

    async def _immediates(self) -> None:
        """The daemon pushes our immediates and completions (one notification for those of one
        of its wake-ups, no request per arrival: docs/COLLECTIVE.md §2); a daemon that does not
        know `subscribe` is asked with one long-poll after another."""
        try:
            try:
                # Completions too: the waits for them (and a one-shot call's fetch) ask nothing.
                await self.client.subscribe(on_immediates=self._absorb_immediates)
                return
            except ClientError as exc:
                if exc.code != rpc.METHOD_NOT_FOUND:
                    raise
            while not self._closing:
                self._absorb_immediates(await self.client.wait_immediates(timeout=POLL))
        except ClientError as exc:
            self._fail(f"the local daemon ({self.client.path}): {exc}")

    def _absorb_immediates(self, got: list[Immediate]) -> None:
        for imm in got:
            if imm.region == self.recv.id:
                if imm.imm != self.arrived & _U32:
                    self._fail(f"chunk {imm.imm} from rank {self._prev()} arrived "
                               f"where chunk {self.arrived & _U32} was due")
                    continue
                self.arrived += 1
            elif imm.region == self.credits.id:
                self.credit = max(self.credit, _catch_up(self.credit, imm.imm))
            elif imm.region == self._mesh_in.id:
                sender, seq = imm.imm & 0xFF, imm.imm >> 8
                if (sender >= self.world or sender == self.rank
                        or seq != self.mesh_arrived[sender] & _SEQ24):
                    self._fail(f"one-shot message {seq} from rank {sender} arrived "
                               "out of turn")
                    continue
                self.mesh_arrived[sender] += 1
        if got:
            self._changed.set()

    async def _completions(self) -> None:
        """Completions of every connection (one request for them all) are fetched when the
        engine waits for them (a long-poll), and come back with every one-shot call's posts;
        else they are swept every SWEEP seconds, so a failed WRITE is still seen. A small
        collective pays no control round trip for completions nobody is waiting for."""
        try:
            while not self._closing:
                if self._want.is_set():
                    got = await self.client.poll_completions(timeout=POLL)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._want.wait(), SWEEP)
                    if self._want.is_set():
                        continue
                    got = await self.client.poll_completions(timeout=0)
                self._absorb(got)
                # Wanted again by whoever still waits (`wait` sets it); chunks of a ring call
                # keep it while any is in flight.
                if self.completed >= self._posted:
                    self._want.clear()
                if got:
                    self._changed.set()
        except ClientError as exc:
            self._fail(f"the local daemon ({self.client.path}): {exc}")

    def _absorb(self, got: Sequence[Completion]) -> None:
        """Count completions in: a chunk's (a failed one is a failure), a one-shot WRITE's,
        or one whose post is still being answered (kept for its answer)."""
        for c in got:
            # A failed credit only means the previous rank went (it may have finished and
            # closed): if a chunk of it is still due, that shows as its absence.
            if c.id in self._data_ids:
                if not c.ok:
                    self._fail(f"a WRITE to {self._peer_of.get(c.connection)} ended "
                               f"{c.status} (the rank there or its daemon is gone)")
                self._data_ids.discard(c.id)
                self.completed += 1
                self._streamed += self._sizes.pop(c.id, 0)
                continue
            for pending in self._mesh_pending:
                if c.id in pending:
                    if not c.ok:
                        self._fail(f"a one-shot WRITE to {self._peer_of.get(c.connection)} "
                                   f"ended {c.status} (the rank there or its daemon is gone)")
                    pending.discard(c.id)
                    break
            else:  # a credit's, or one whose post is still being answered
                self._early[c.id] = c.ok
                if len(self._early) > _EARLY_MAX:
                    del self._early[next(iter(self._early))]

    async def _messages(self) -> None:
        endpoint = self.endpoint_of(self.rank)
        try:
            while not self._closing:
                msg = await self.client.recv_message(endpoint, timeout=POLL)
                if msg is None:
                    continue
                obj = _decode(msg)
                if obj.get("op") == "abort":
                    self._remote_abort = True
                    self._fail(f"rank {obj.get('rank')} ({msg.peer}) failed: "
                               f"{obj.get('reason')}")
                elif obj.get("op") == "hello" and isinstance(obj.get("rank"), int):
                    # A neighbour that missed our ack asks again.
                    await _send(self.client, msg.peer, self.endpoint_of(obj["rank"]),
                                {"op": "ack", "rank": self.rank, "token": obj.get("token")})
        except ClientError as exc:
            self._fail(f"the local daemon ({self.client.path}): {exc}")

    def _prev(self) -> int:
        return (self.rank - 1) % self.world


def _decode(msg: Message) -> dict[str, Any]:
    try:
        obj = json.loads(msg.data)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


async def _send(client: AsyncClient, peer: str, endpoint: str, obj: dict[str, Any],
                within: float = 2.0) -> None:
    """One message; a daemon not reachable yet is retried by the caller, an unknown peer is
    the caller's mistake."""
    try:
        await asyncio.wait_for(client.send_message(peer, endpoint, json.dumps(obj).encode()),
                               within)
    except TimeoutError:
        return
    except ClientError as exc:
        if exc.code in (rpc.UNKNOWN_PEER, rpc.CLOSED, rpc.INVALID_PARAMS):
            raise CollectiveError(f"message to {peer}: {exc}") from None


def _check(rank: Any, world: Any, peers: Any, slots: Any, chunk_bytes: Any, group: Any) -> None:
    if isinstance(world, bool) or not isinstance(world, int) or world < 2:
        raise CollectiveError(f"world must be an integer of at least 2 ranks, got {world!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise CollectiveError(f"rank must be 0..{world - 1}, got {rank!r}")
    if (not isinstance(peers, Sequence) or isinstance(peers, str) or len(peers) != world
            or not all(isinstance(p, str) and p for p in peers)):
        raise CollectiveError(f"peers must name the daemon of each of the {world} ranks")
    if world > 1 and any(peers[i] == peers[(i + 1) % world] for i in range(world)):
        raise CollectiveError("neighbouring ranks must use different daemons")
    if isinstance(slots, bool) or not isinstance(slots, int) or not 2 <= slots <= 1024:
        raise CollectiveError(f"slots must be 2..1024, got {slots!r}")
    if (isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int)
            or not 64 <= chunk_bytes <= 1 << 30):
        raise CollectiveError(f"chunk_bytes must be 64..{1 << 30}, got {chunk_bytes!r}")
    if not isinstance(group, str) or not group or len(f"{group}.{world}") > 64:
        raise CollectiveError(f"group must be a short non-empty name, got {group!r}")


async def open_mrc_async(socket_path: str, rank: int, world: int, peers: Sequence[str], *,
                         timeout: float = 30.0, group: str = "mrc",
                         chunk_bytes: int = DEFAULT_CHUNK,
                         slots: int = DEFAULT_SLOTS) -> AsyncRing:
    """The coroutine communicator of rank `rank` (see `comm` for the arguments)."""
    _check(rank, world, peers, slots, chunk_bytes, group)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        client = await AsyncClient.open(socket_path, connect_timeout=min(timeout, 5.0))
    except ClientError as exc:
        raise CollectiveError(f"rank {rank}: {exc}") from None
    try:
        link = await _bootstrap(client, rank, world, list(peers), group, slots, chunk_bytes,
                                deadline, timeout)
    except ClientError as exc:
        await client.close()
        raise CollectiveError(f"rank {rank}: bootstrap: {exc}") from None
    except BaseException:
        await client.close()
        raise
    link.start()
    return AsyncRing(link, timeout)


async def _bootstrap(client: AsyncClient, rank: int, world: int, peers: list[str], group: str,
                     slots: int, chunk_bytes: int, deadline: float, timeout: float) -> MrcLink:
    loop = asyncio.get_running_loop()
    host = (await client.status()).get("host")
    if host != peers[rank]:
        raise CollectiveError(f"rank {rank} should be on {peers[rank]} but the daemon at "
                              f"{client.path} is {host}")

    def endpoint_of(r: int) -> str:
        return f"{group}.{r}"

    me = endpoint_of(rank)
    await client.bind(me)
    recv = await client.register_region(slots * chunk_bytes, f"coll-slots-{rank}")
    credits = await client.register_region(4096, f"coll-credit-{rank}")
    local = await client.register_region(WORK_OFFSET + (1 << 20), f"coll-local-{rank}")
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    # One-shot calls write to every other rank (docs/COLLECTIVE.md §6): only when every rank
    # has a daemon of its own (a connection goes to another daemon).
    mesh = len(set(peers)) == world and world <= MESH_MAX_WORLD
    neighbours = [r for r in range(world) if r != rank] if mesh else sorted({nxt, prv} - {rank})
    mesh_in = await client.register_region((world if mesh else 1) * 2 * MESH_SLOT,
                                           f"coll-mesh-in-{rank}")
    mesh_out = await client.register_region(MESH_STAGING * MESH_SLOT, f"coll-mesh-out-{rank}")
    token = secrets.token_hex(8)
    hello = {"op": "hello", "rank": rank, "world": world, "slots": slots, "chunk": chunk_bytes,
             "token": token, "slots_handle": recv.handle.to_dict(),
             "credit_handle": credits.handle.to_dict(), "mesh_handle": mesh_in.handle.to_dict()}
    got: dict[int, dict[str, Any]] = {}
    acked: set[int] = set()
    next_hello = 0.0
    while len(got) < len(neighbours) or len(acked) < len(neighbours):
        now = loop.time()
        if now >= deadline:
            missing = [f"no hello from rank {r} ({peers[r]})" for r in neighbours if r not in got]
            missing += [f"rank {r} ({peers[r]}) never acknowledged" for r in neighbours
                        if r not in acked]
            raise CollectiveError(f"rank {rank}: bootstrap timed out after {timeout:g} s: "
                                  + "; ".join(missing))
        if now >= next_hello:
            for r in neighbours:
                if r not in acked:
                    await _send(client, peers[r], endpoint_of(r), hello,
                                within=max(0.1, min(2.0, deadline - now)))
            next_hello = loop.time() + _HELLO_EVERY
        msg = await client.recv_message(me, timeout=max(0.0, min(0.1, deadline - loop.time())))
        if msg is None:
            continue
        obj = _decode(msg)
        sender = obj.get("rank")
        if obj.get("op") == "abort":
            raise CollectiveError(f"rank {sender} ({msg.peer}) failed: {obj.get('reason')}")
        if sender not in neighbours or msg.peer != peers[sender]:
            continue
        if obj.get("op") == "ack" and obj.get("token") == token:
            acked.add(sender)
        elif obj.get("op") == "hello":
            for key, mine in (("world", world), ("slots", slots), ("chunk", chunk_bytes)):
                if obj.get(key) != mine:
                    raise CollectiveError(f"rank {rank}: rank {sender} has {key} "
                                          f"{obj.get(key)}, this rank {mine}")
            try:
                got[sender] = {"slots": RegionHandle.from_dict(obj.get("slots_handle")),
                               "credit": RegionHandle.from_dict(obj.get("credit_handle")),
                               "mesh": RegionHandle.from_dict(obj.get("mesh_handle"))}
            except ClientError as exc:
                raise CollectiveError(f"rank {rank}: bad hello from rank {sender}: {exc}") \
                    from None
            await _send(client, msg.peer, endpoint_of(sender),
                        {"op": "ack", "rank": rank, "token": obj.get("token")})
    conns = dict(zip(neighbours, await asyncio.gather(
        *(client.connect(peers[r]) for r in neighbours)), strict=True))
    return MrcLink(client, rank, world, peers, endpoint_of, slots, chunk_bytes,
                   (recv, credits, local), conns[nxt], conns[prv], got[nxt]["slots"],
                   got[prv]["credit"],
                   (mesh_in, mesh_out, conns if mesh else {},
                    {r: got[r]["mesh"] for r in neighbours} if mesh else {}))


def open_mrc(socket_path: str, rank: int, world: int, peers: Sequence[str], *,
             timeout: float = 30.0, group: str = "mrc", chunk_bytes: int = DEFAULT_CHUNK,
             slots: int = DEFAULT_SLOTS) -> Ring:
    """The blocking communicator of rank `rank` (see `comm` for the arguments)."""
    loop, thread = Ring.start_loop()
    try:
        ring = run_blocking(loop, open_mrc_async(socket_path, rank, world, peers,
                                                 timeout=timeout, group=group,
                                                 chunk_bytes=chunk_bytes, slots=slots))
    except BaseException:
        stop_loop(loop, thread)
        raise
    return Ring(loop, thread, ring)

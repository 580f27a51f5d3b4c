"""The same collectives over TCP (or MPTCP): an `engine.Link` made of sockets between ranks.

The comparison baseline of `mrc collective-bench --transport tcp|mptcp`: the plans, chunk
size, slot count, credits and one-shot calls are the engine's, exactly as over the daemons;
only the moving of bytes differs. Each rank listens on its own address, connects to every
other rank (to the next one only when the world is larger than MESH_MAX_WORLD) and accepts
a connection from each of them: the connection to rank j carries what this rank sends j,
the one from j what j sends. Frames are `type 8 | pad 24 | a 32 | b 32`, big-endian: `D` (a
chunk, to the next rank: counter, bytes, then the bytes, read straight into the receive
slot), `C` (a credit, back to the previous rank on the connection it opened: items applied),
`M` (a one-shot message, to every other rank: the one-shot call counter, bytes, then the
bytes, read straight into the sender's slot of that call's parity), `H` (hello: rank, world,
then a JSON body with slots and chunk size) and `A` (abort: rank, reason length, then the
reason). A send is complete once the kernel took its bytes. A rank whose connection closes or
resets is a failure as soon as something is still wanted from it; an abort goes to every
rank at once.

MPTCP is the same with `IPPROTO_MPTCP` sockets (the kernel's path manager adds subflows as
its endpoints allow); when the kernel refuses them, opening fails with one line saying so.
What the frames mean (which item, which call) is the engine's (docs/COLLECTIVE.md §2, §6).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import Callable, Sequence
from typing import Any

from .comm import CollectiveError
from .engine import MESH_SLOT, WORK_OFFSET, await_change
from .ring import AsyncRing, Ring, run_blocking, stop_loop

__all__ = ["MESH_MAX_WORLD", "TcpLink", "mptcp_available", "open_tcp", "open_tcp_async"]

DEFAULT_CHUNK = 1 << 20
DEFAULT_SLOTS = 8
#: Up to this many ranks every rank connects to every other one (one-shot calls); above it
#: to its ring neighbours only (as over MRC: docs/COLLECTIVE.md §3).
MESH_MAX_WORLD = 64
#: How long `close` reads what the other ranks still send before it closes.
CLOSE_LINGER = 1.0
_FRAME = struct.Struct("!B3xII")
_D, _C, _M, _H, _A = b"DCMHA"
_U32 = 0xFFFFFFFF


def _proto(mptcp: bool) -> int:
    if not mptcp:
        return 0
    proto = getattr(socket, "IPPROTO_MPTCP", None)
    if proto is None:
        raise CollectiveError("MPTCP: this Python has no socket.IPPROTO_MPTCP")
    return int(proto)


def mptcp_available() -> str | None:
    """None when this kernel gives MPTCP sockets, else why not (one line)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM, _proto(True)):
            return None
    except CollectiveError as exc:
        return str(exc)
    except OSError as exc:
        return f"MPTCP: the kernel refuses MPTCP sockets: {exc.strerror or exc}"


def _peers(rank: int, world: int) -> list[int]:
    """The ranks this rank has connections with: all others, or its ring neighbours."""
    if world <= MESH_MAX_WORLD:
        return [r for r in range(world) if r != rank]
    return sorted({(rank + 1) % world, (rank - 1) % world})


class TcpLink:
    """One rank's sockets (`out[j]` to rank j, `into[j]` from it), buffers and readers."""

    def __init__(self, rank: int, world: int, slots: int, chunk_bytes: int,
                 out: dict[int, socket.socket], into: dict[int, socket.socket]) -> None:
        self.rank = rank
        self.world = world
        self.slots = slots
        self.chunk_bytes = chunk_bytes
        self.out = out
        self.into = into
        self.to_next = out[self._next()]
        self.from_prev = into[self._prev()]
        #: Whether one-shot calls can run (a connection to every other rank).
        self.mesh = len(out) == world - 1 and len(into) == world - 1
        self.mesh_arrived = [0] * world
        self._recv = memoryview(bytearray(slots * chunk_bytes))
        self._mesh_in = memoryview(bytearray((world if self.mesh else 1) * 2 * MESH_SLOT))
        self._local = memoryview(bytearray(WORK_OFFSET + (1 << 20)))
        self.arrived = 0
        self.credit = 0
        self.completed = 0
        self.credited = 0
        #: One-shot calls this rank has sent (so it wants call `_mesh_sent - 1` of each rank).
        self._mesh_sent = 0
        self._failure: CollectiveError | None = None
        self._aborted = False
        #: Why the connection from rank j, or the next rank's (credits), ended, once it did.
        self._gone: dict[int, str] = {}
        self._gone_next: str | None = None
        self._changed = asyncio.Event()
        self._readers: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._readers = [loop.create_task(self._read_from(j)) for j in self.into]
        self._readers.append(loop.create_task(self._read_next()))

    def local(self) -> memoryview:
        return self._local

    async def reserve(self, work_bytes: int) -> None:
        need = WORK_OFFSET + work_bytes
        if need > len(self._local):
            self._local = memoryview(bytearray(max(need, 2 * len(self._local))))

    async def post(self, items: list[tuple[int, int, int]]) -> None:
        loop = asyncio.get_running_loop()
        try:
            for counter, offset, nbytes in items:
                await loop.sock_sendall(self.to_next, _FRAME.pack(_D, counter & _U32, nbytes))
                if nbytes:
                    await loop.sock_sendall(self.to_next, self._local[offset:offset + nbytes])
                self.completed += 1
        except OSError as exc:
            self._fail(f"sending to rank {self._next()}: {exc.strerror or exc}")
            raise self._failure or CollectiveError("send failed") from None

    def slot(self, counter: int) -> memoryview:
        at = (counter % self.slots) * self.chunk_bytes
        return self._recv[at:at + self.chunk_bytes]

    async def mesh_send(self, seq: int, payload: bytes, deadline: float,
                        waiting: Callable[[], str]) -> None:
        """Send one-shot call `seq` (at most MESH_SLOT bytes) to every other rank at once;
        returns when the kernel took all of it (nothing stays in flight: `mesh_unfinished`
        is 0), or raises a CollectiveError (a rank gone, the deadline)."""
        if len(payload) > MESH_SLOT:
            raise CollectiveError(f"a one-shot message of {len(payload)} bytes is larger "
                                  f"than {MESH_SLOT}")
        self._mesh_sent = seq + 1
        frame = _FRAME.pack(_M, seq & _U32, len(payload)) + payload
        loop = asyncio.get_running_loop()

        async def one(j: int) -> None:
            try:
                await loop.sock_sendall(self.out[j], frame)
            except OSError as exc:
                self._fail(f"sending a one-shot message to rank {j}: {exc.strerror or exc}")

        left = deadline - loop.time()
        try:
            await asyncio.wait_for(asyncio.gather(*(one(j) for j in self.out)), max(left, 0))
        except TimeoutError:
            self._fail(f"timed out sending one-shot call {seq} (the other ranks do not read)")
        if self._failure is not None:
            raise self._failure

    def mesh_slot(self, sender: int, seq: int) -> memoryview:
        at = (sender * 2 + seq % 2) * MESH_SLOT
        return self._mesh_in[at:at + MESH_SLOT]

    def mesh_unfinished(self) -> int:
        return 0

    async def give_credit(self, applied: int) -> None:
        self.credited = applied
        try:
            await asyncio.get_running_loop().sock_sendall(
                self.from_prev, _FRAME.pack(_C, applied & _U32, 0))
        except OSError as exc:
            self._fail(f"sending a credit to rank {self._prev()}: {exc.strerror or exc}")

    async def wait(self, deadline: float, waiting: Callable[[], str], *, chunks: bool = False,
                   credit: bool = False, completions: bool = False) -> None:
        if self._failure is not None:
            raise self._failure
        if not self._changed.is_set():
            # A rank we wait for closed and nothing moved since: it will not come.
            gone = self._awaited_gone(chunks, credit)
            if gone is not None:
                raise CollectiveError(gone)
        await await_change(self._changed, deadline, waiting, lambda: self._failure)

    def _awaited_gone(self, chunks: bool, credit: bool) -> str | None:
        if credit and self._gone_next is not None:
            return self._gone_next
        if not chunks:
            return None
        prev = self._gone.get(self._prev())
        if prev is not None:
            return prev
        for j, why in self._gone.items():
            if self.mesh_arrived[j] < self._mesh_sent:  # its one-shot message is still due
                return why
        return None

    async def abort(self, reason: str) -> None:
        """Tell every rank we have a connection to once (bounded), then stop reading."""
        if self._failure is None:
            self._failure = CollectiveError(reason)
        if self._aborted:
            return
        self._aborted = True
        body = reason.encode()[:3000]
        frame = _FRAME.pack(_A, self.rank, len(body)) + body
        loop = asyncio.get_running_loop()
        socks = [*self.out.values(), self.from_prev]

        async def one(sock: socket.socket) -> None:
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(loop.sock_sendall(sock, frame), 1.0)

        await asyncio.gather(*(one(s) for s in socks))

    async def close(self) -> None:
        """Stop reading, then close gracefully: FIN after what is still queued, and read
        (and drop) what the other ranks still send until theirs, at most CLOSE_LINGER
        seconds. Closing with unread bytes would reset the connection, and a rank
        finishing its last collective could lose our last chunks with it."""
        for task in self._readers:
            task.cancel()
        if self._readers:
            await asyncio.wait(self._readers, timeout=2.0)
        self._readers = []
        socks = [*self.out.values(), *self.into.values()]
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
        drains = [asyncio.ensure_future(_drain(s)) for s in socks]
        await asyncio.wait(drains, timeout=CLOSE_LINGER)
        for task in drains:
            task.cancel()
        for sock in socks:
            sock.close()

    # ---- readers -------------------------------------------------------------------------

    def _next(self) -> int:
        return (self.rank + 1) % self.world

    def _prev(self) -> int:
        return (self.rank - 1) % self.world

    def _fail(self, message: str) -> None:
        if self._failure is None:
            self._failure = CollectiveError(message)
        self._changed.set()

    async def _frame(self, sock: socket.socket, who: str) -> tuple[int, int, int]:
        head = await _read_exactly(sock, _FRAME.size, who)
        kind, a, b = _FRAME.unpack(head)
        if kind == _A:
            reason = (await _read_exactly(sock, b, who)).decode(errors="replace")
            raise _Abort(a, reason)
        return kind, a, b

    async def _read_from(self, j: int) -> None:
        """What rank j sends this rank: chunks (when j is the previous rank), one-shot
        messages, an abort. Every frame is checked here, in the order j sent them."""
        who = f"rank {j}"
        sock = self.into[j]
        try:
            while True:
                kind, a, nbytes = await self._frame(sock, who)
                if kind == _D and j == self._prev():
                    if a != self.arrived & _U32 or nbytes > self.chunk_bytes:
                        raise CollectiveError(f"{who} sent chunk {a} of {nbytes} bytes where "
                                              f"chunk {self.arrived & _U32} was due")
                    if nbytes:
                        await _read_into(sock, self.slot(self.arrived)[:nbytes], who)
                    self.arrived += 1
                elif kind == _M and self.mesh:
                    if a != self.mesh_arrived[j] & _U32 or nbytes > MESH_SLOT:
                        raise CollectiveError(f"{who} sent one-shot message {a} of {nbytes} "
                                              f"bytes where {self.mesh_arrived[j] & _U32} was "
                                              "due (out of turn)")
                    await _read_into(sock, self.mesh_slot(j, a)[:nbytes], who)
                    self.mesh_arrived[j] += 1
                else:
                    raise CollectiveError(f"{who} sent an unexpected frame {kind!r} "
                                          f"({a}, {nbytes} bytes)")
                self._changed.set()
        except _Abort as ab:
            self._remote_abort(ab)
        except _Gone as exc:
            # Not a failure yet: a rank that finished closes; `wait` decides.
            self._gone.setdefault(j, str(exc))
            self._changed.set()
        except CollectiveError as exc:
            self._fail(str(exc))

    async def _read_next(self) -> None:
        """Credits from the next rank, on the connection to it (and an abort)."""
        who = f"rank {self._next()}"
        try:
            while True:
                kind, applied, _ = await self._frame(self.to_next, who)
                if kind != _C:
                    raise CollectiveError(f"{who} sent an unexpected frame {kind!r}")
                self.credit = max(self.credit, self.credit + ((applied - self.credit) & _U32))
                self._changed.set()
        except _Abort as ab:
            self._remote_abort(ab)
        except _Gone as exc:
            # Not a failure yet: a neighbour that finished closes; `wait` decides.
            self._gone_next = self._gone_next or str(exc)
            self._changed.set()
        except CollectiveError as exc:
            self._fail(str(exc))

    def _remote_abort(self, ab: _Abort) -> None:
        self._fail(f"rank {ab.rank} failed: {ab.reason}")


class _Gone(CollectiveError):
    """A rank's connection closed or reset."""


class _Abort(Exception):
    def __init__(self, rank: int, reason: str) -> None:
        super().__init__(reason)
        self.rank = rank
        self.reason = reason


async def _read_exactly(sock: socket.socket, n: int, who: str) -> bytes:
    buf = bytearray(n)
    await _read_into(sock, memoryview(buf), who)
    return bytes(buf)


async def _read_into(sock: socket.socket, view: memoryview, who: str) -> None:
    loop = asyncio.get_running_loop()
    got = 0
    while got < len(view):
        try:
            n = await loop.sock_recv_into(sock, view[got:])
        except OSError as exc:
            raise _Gone(f"{who}: connection failed: {exc.strerror or exc}") from None
        if not n:
            raise _Gone(f"{who} closed its connection (the rank is gone)")
        got += n


async def _drain(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError):
        while await loop.sock_recv(sock, 1 << 16):
            pass


def _check(rank: Any, world: Any, addresses: Any, slots: Any, chunk_bytes: Any) -> None:
    if isinstance(world, bool) or not isinstance(world, int) or world < 2:
        raise CollectiveError(f"world must be an integer of at least 2 ranks, got {world!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise CollectiveError(f"rank must be 0..{world - 1}, got {rank!r}")
    if not isinstance(addresses, Sequence) or len(addresses) != world or not all(
            isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str)
            and isinstance(a[1], int) for a in addresses):
        raise CollectiveError(f"addresses must give (host, port) for each of the {world} ranks")
    if isinstance(slots, bool) or not isinstance(slots, int) or not 2 <= slots <= 1024:
        raise CollectiveError(f"slots must be 2..1024, got {slots!r}")
    if (isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int)
            or not 64 <= chunk_bytes <= 1 << 30):
        raise CollectiveError(f"chunk_bytes must be 64..{1 << 30}, got {chunk_bytes!r}")


async def open_tcp_async(rank: int, world: int, addresses: Sequence[tuple[str, int]], *,
                         mptcp: bool = False, timeout: float = 30.0,
                         chunk_bytes: int = DEFAULT_CHUNK,
                         slots: int = DEFAULT_SLOTS) -> AsyncRing:
    """The coroutine communicator of rank `rank` over TCP (see `comm`)."""
    _check(rank, world, addresses, slots, chunk_bytes)
    proto = _proto(mptcp)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    peers = _peers(rank, world)
    listener = socket.socket(_family(addresses[rank][0]), socket.SOCK_STREAM, proto)
    out: dict[int, socket.socket] = {}
    into: dict[int, socket.socket] = {}
    tasks: list[asyncio.Task[None]] = []
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(addresses[rank])
        except OSError as exc:
            raise CollectiveError(f"rank {rank}: cannot listen on {addresses[rank]}: "
                                  f"{exc.strerror or exc}") from None
        listener.listen(max(8, len(peers)))
        listener.setblocking(False)
        hello = json.dumps({"slots": slots, "chunk": chunk_bytes}).encode()
        tasks = [loop.create_task(_accept(listener, rank, world, peers, into, hello, deadline))]
        tasks += [loop.create_task(_connect(addresses[j], j, proto, rank, world, hello, out,
                                            deadline)) for j in peers]
        await _all_or_none(tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for s in (*out.values(), *into.values()):
            s.close()
        raise
    finally:
        listener.close()
    link = TcpLink(rank, world, slots, chunk_bytes, out, into)
    link.start()
    return AsyncRing(link, timeout)


async def _all_or_none(tasks: list[asyncio.Task[None]]) -> None:
    """Wait for every task; the first that fails raises its error here (the caller cancels
    the rest)."""
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _tune(sock: socket.socket) -> None:
    sock.setblocking(False)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _connect(addr: tuple[str, int], peer: int, proto: int, rank: int, world: int,
                   hello: bytes, out: dict[int, socket.socket], deadline: float) -> None:
    """Connect to rank `peer` and say hello, retrying until `deadline`; into `out[peer]`."""
    loop = asyncio.get_running_loop()
    last = "no attempt"
    while loop.time() < deadline:
        sock = socket.socket(_family(addr[0]), socket.SOCK_STREAM, proto)
        _tune(sock)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, addr),
                                   max(0.05, deadline - loop.time()))
            await loop.sock_sendall(sock, _FRAME.pack(_H, rank, world) + struct.pack(
                "!I", len(hello)) + hello)
            out[peer] = sock
            return
        except (OSError, TimeoutError) as exc:
            sock.close()
            last = str(getattr(exc, "strerror", None) or exc or "timed out")
            await asyncio.sleep(0.05)
        except BaseException:
            sock.close()
            raise
    raise CollectiveError(f"rank {rank}: cannot connect to rank {peer} at {addr[0]}:{addr[1]} "
                          f"({last})")


async def _accept(listener: socket.socket, rank: int, world: int, peers: list[int],
                  into: dict[int, socket.socket], hello: bytes, deadline: float) -> None:
    """Accept one connection from each rank of `peers` (a stray or duplicate one is closed),
    into `into`; ranks whose world, slots or chunk size differ fail here, naming them."""
    loop = asyncio.get_running_loop()
    while len(into) < len(peers):
        left = deadline - loop.time()
        if left <= 0:
            missing = ", ".join(str(j) for j in peers if j not in into)
            raise CollectiveError(f"rank {rank}: no connection from rank {missing} in time")
        try:
            sock, _ = await asyncio.wait_for(loop.sock_accept(listener), left)
        except TimeoutError:
            continue
        _tune(sock)
        try:
            head = await asyncio.wait_for(_read_exactly(sock, _FRAME.size + 4, "a peer"), 5.0)
            kind, their_rank, their_world = _FRAME.unpack(head[:_FRAME.size])
            (n,) = struct.unpack("!I", head[_FRAME.size:])
            body = await asyncio.wait_for(_read_exactly(sock, min(n, 4096), "a peer"), 5.0)
        except (CollectiveError, TimeoutError):
            sock.close()
            continue
        if kind != _H or their_rank not in peers or their_rank in into:
            sock.close()
            continue
        if their_world != world or body != hello:
            sock.close()
            raise CollectiveError(f"rank {rank}: rank {their_rank} has world {their_world} and "
                                  f"{body.decode(errors='replace')}, this rank world {world} "
                                  f"and {hello.decode()}")
        into[their_rank] = sock


def open_tcp(rank: int, world: int, addresses: Sequence[tuple[str, int]], *,
             mptcp: bool = False, timeout: float = 30.0, chunk_bytes: int = DEFAULT_CHUNK,
             slots: int = DEFAULT_SLOTS) -> Ring:
    """The blocking communicator of rank `rank` over TCP (see `comm`)."""
    loop, thread = Ring.start_loop()
    try:
        ring = run_blocking(loop, open_tcp_async(rank, world, addresses, mptcp=mptcp,
                                                 timeout=timeout, chunk_bytes=chunk_bytes,
                                                 slots=slots))
    except BaseException:
        stop_loop(loop, thread)
        raise
    return Ring(loop, thread, ring)

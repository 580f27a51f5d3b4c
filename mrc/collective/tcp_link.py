"""The same ring over TCP (or MPTCP): an `engine.Link` made of one socket per ring neighbour.

The comparison baseline of `mrc collective-bench --transport tcp|mptcp`: the plans, chunk
size, slot count and credits are the engine's, exactly as over the daemons; only the moving
of bytes differs. Each rank listens on its own address, connects to the next rank and accepts
the previous one. On the socket to the next rank it sends chunks and reads credits; on the
socket from the previous rank it reads chunks straight into the receive slots and sends
credits. A frame is `type 8 | pad 24 | a 32 | b 32`, big-endian: `D` (a chunk: counter, bytes,
then the bytes), `C` (a credit: items applied), `H` (hello: rank, world, then a JSON body
with slots and chunk size), `A` (abort: rank, reason length, then the reason). A send is
complete once the kernel took its bytes. A neighbour whose socket closes or resets is a
failure at once; an abort is forwarded to the other neighbour, so it goes round the ring.

MPTCP is the same with `IPPROTO_MPTCP` sockets (the kernel's path manager adds subflows as
its endpoints allow); when the kernel refuses them, opening fails with one line saying so.
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
from .engine import WORK_OFFSET, await_change
from .ring import AsyncRing, Ring, run_blocking, stop_loop

__all__ = ["TcpLink", "mptcp_available", "open_tcp", "open_tcp_async"]

DEFAULT_CHUNK = 1 << 20
DEFAULT_SLOTS = 8
#: How long `close` reads what the neighbours still send before it closes.
CLOSE_LINGER = 1.0
_FRAME = struct.Struct("!B3xII")
_D, _C, _H, _A = b"DCHA"
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


class TcpLink:
    """One rank's two sockets, buffers and reader tasks."""

    def __init__(self, rank: int, world: int, slots: int, chunk_bytes: int,
                 to_next: socket.socket, from_prev: socket.socket) -> None:
        self.rank = rank
        self.world = world
        self.slots = slots
        self.chunk_bytes = chunk_bytes
        self.to_next = to_next
        self.from_prev = from_prev
        self._recv = memoryview(bytearray(slots * chunk_bytes))
        self._local = memoryview(bytearray(WORK_OFFSET + (1 << 20)))
        self.arrived = 0
        self.credit = 0
        self.completed = 0
        self.credited = 0
        self._failure: CollectiveError | None = None
        self._aborted = False
        #: Why the previous / next rank's socket ended, once it did.
        self._gone_prev: str | None = None
        self._gone_next: str | None = None
        self._changed = asyncio.Event()
        self._readers: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._readers = [loop.create_task(self._read_prev()), loop.create_task(self._read_next())]

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
        gone = (self._gone_prev if chunks else None) or (self._gone_next if credit else None)
        if gone is not None and not self._changed.is_set():
            # The neighbour we wait for closed and nothing moved since: it will not come.
            raise CollectiveError(gone)
        await await_change(self._changed, deadline, waiting, lambda: self._failure)

    async def abort(self, reason: str) -> None:
        """Tell both neighbours once (each forwards it once), then stop reading."""
        if self._failure is None:
            self._failure = CollectiveError(reason)
        if self._aborted:
            return
        self._aborted = True
        body = reason.encode()[:3000]
        frame = _FRAME.pack(_A, self.rank, len(body)) + body
        loop = asyncio.get_running_loop()
        for sock in {id(s): s for s in (self.to_next, self.from_prev)}.values():
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(loop.sock_sendall(sock, frame), 1.0)

    async def close(self) -> None:
        """Stop reading, then close gracefully: FIN after what is still queued, and read
        (and drop) what the neighbours still send until theirs, at most CLOSE_LINGER
        seconds. Closing with unread bytes would reset the connection, and a neighbour
        finishing its last collective could lose our last chunks with it."""
        for task in self._readers:
            task.cancel()
        if self._readers:
            await asyncio.wait(self._readers, timeout=2.0)
        self._readers = []
        socks = list({id(s): s for s in (self.to_next, self.from_prev)}.values())
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

    async def _read_prev(self) -> None:
        who = f"rank {self._prev()}"
        try:
            while True:
                kind, counter, nbytes = await self._frame(self.from_prev, who)
                if kind != _D or counter != self.arrived & _U32 or nbytes > self.chunk_bytes:
                    raise CollectiveError(f"{who} sent an unexpected frame {kind!r} "
                                          f"(chunk {counter}, {nbytes} bytes)")
                if nbytes:
                    await _read_into(self.from_prev, self.slot(self.arrived)[:nbytes], who)
                self.arrived += 1
                self._changed.set()
        except _Abort as ab:
            self._remote_abort(ab)
        except _Gone as exc:
            # Not a failure yet: a neighbour that finished closes; `wait` decides.
            self._gone_prev = self._gone_prev or str(exc)
            self._changed.set()
        except CollectiveError as exc:
            self._fail(str(exc))

    async def _read_next(self) -> None:
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
    """A neighbour's socket closed or reset."""


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
    listener = socket.socket(_family(addresses[rank][0]), socket.SOCK_STREAM, proto)
    to_next = from_prev = None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(addresses[rank])
        except OSError as exc:
            raise CollectiveError(f"rank {rank}: cannot listen on {addresses[rank]}: "
                                  f"{exc.strerror or exc}") from None
        listener.listen(8)
        listener.setblocking(False)
        hello = json.dumps({"slots": slots, "chunk": chunk_bytes}).encode()
        accept = loop.create_task(_accept(listener, rank, world, hello, deadline))
        try:
            to_next = await _connect(addresses[(rank + 1) % world], proto, rank, world, hello,
                                     deadline)
            from_prev = await accept
        finally:
            if not accept.done():
                accept.cancel()
                with contextlib.suppress(BaseException):
                    await accept
    except BaseException:
        for s in (to_next, from_prev):
            if s is not None:
                s.close()
        raise
    finally:
        listener.close()
    link = TcpLink(rank, world, slots, chunk_bytes, to_next, from_prev)
    link.start()
    return AsyncRing(link, timeout)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _tune(sock: socket.socket) -> None:
    sock.setblocking(False)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _connect(addr: tuple[str, int], proto: int, rank: int, world: int, hello: bytes,
                   deadline: float) -> socket.socket:
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
            return sock
        except (OSError, TimeoutError) as exc:
            sock.close()
            last = str(getattr(exc, "strerror", None) or exc or "timed out")
            await asyncio.sleep(0.05)
    raise CollectiveError(f"rank {rank}: cannot connect to the next rank at {addr[0]}:{addr[1]} "
                          f"({last})")


async def _accept(listener: socket.socket, rank: int, world: int, hello: bytes,
                  deadline: float) -> socket.socket:
    loop = asyncio.get_running_loop()
    prev = (rank - 1) % world
    while True:
        left = deadline - loop.time()
        if left <= 0:
            raise CollectiveError(f"rank {rank}: rank {prev} did not connect in time")
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
        if kind != _H or their_rank != prev:
            sock.close()
            continue
        if their_world != world or body != hello:
            sock.close()
            raise CollectiveError(f"rank {rank}: rank {prev} has world {their_world} and "
                                  f"{body.decode(errors='replace')}, this rank world {world} "
                                  f"and {hello.decode()}")
        return sock


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

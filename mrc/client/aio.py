"""`AsyncClient`: the asyncio flavour of `mrc.client`, mirroring `Client` with coroutines.

Holds `AsyncClient`, `AsyncRegion` and `AsyncConnection` and the transport under them: a
non-blocking Unix socket, one reader task that matches answers to waiting futures by id (so
coroutines may have several requests in flight on one control connection, e.g. a long-poll for
completions while another posts writes), and a send lock that keeps request lines whole. The
region fd rides on its request line (SCM_RIGHTS). What each operation asks and keeps is `ops`';
the framing is `rpc`'s; connect errors are worded by `sync.unreachable`. Two calls have no
blocking twin: `write_batch` (WRITEs on several connections in one JSON-RPC batch, optionally
with a fetch of the completions that came) and `poll_completions` (every connection's at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

from .memory import RegionBase, SharedMemory
from .objects import (
    Completion,
    Immediate,
    Message,
    RegionHandle,
    Write,
    answer_list,
)
from .ops import Call, ClientCore, Op, Pushed, push_kinds
from .rpc import (
    CLOSED,
    INVALID_PARAMS,
    TIMEOUT,
    ClientError,
    LineReader,
    Notification,
    decode_message,
    encode_batch,
    encode_request,
)
from .sync import check_path, default_socket, unreachable

__all__ = ["AsyncClient", "AsyncConnection", "AsyncRegion"]

T = TypeVar("T")


class AsyncRegion(RegionBase):
    """A registered region of an `AsyncClient`: `buf`, `handle`, `await close()`."""

    def __init__(self, client: AsyncClient, region_id: int, handle: RegionHandle,
                 memory: SharedMemory, name: str | None) -> None:
        super().__init__(region_id, handle, memory, name)
        self._client = client

    async def close(self) -> None:
        await self._client._run(self._client._core.deregister_region(self))

    deregister = close

    async def __aenter__(self) -> AsyncRegion:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


class AsyncConnection:
    """One MRC connection (QP) to a peer daemon; the coroutine twin of `Connection`."""

    def __init__(self, client: AsyncClient, connection_id: int, peer: str) -> None:
        self._client = client
        self.id = connection_id
        self.peer = peer

    async def write(self, region: AsyncRegion, offset: int, length: int,
                    remote_handle: RegionHandle, remote_offset: int = 0,
                    imm: int | None = None) -> int:
        ids = await self.write_many([Write(region, offset, length, remote_handle, remote_offset,
                                           imm)])
        return ids[0]

    async def write_many(self, writes: Sequence[Write]) -> list[int]:
        return await self._client._run(self._client._core.write(self.id, writes))

    async def wait(self, ids: Sequence[int] | None = None,
                   timeout: float | None = None) -> list[Completion]:
        return await self._client._run(self._client._core.wait(self.id, ids, timeout))

    async def poll(self, timeout: float | None = 0.0,
                   max: int | None = None) -> list[Completion]:
        return await self._client._run(self._client._core.poll(self.id, timeout, max))

    @property
    def outstanding(self) -> int:
        return self._client._core.outstanding(self.id)

    async def evs(self) -> list[dict[str, Any]]:
        return await self._client.evs(self.id)

    async def close(self) -> None:
        await self._client._run(self._client._core.disconnect(self.id))

    disconnect = close

    async def __aenter__(self) -> AsyncConnection:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class AsyncClient:
    """An asyncio client of the daemon at `path`; use `async with AsyncClient(path) as c` or
    `c = await AsyncClient.open(path)`."""

    def __init__(self, path: str | None = None, *, connect_timeout: float = 5.0) -> None:
        self.path = check_path(path) if path is not None else default_socket()
        self.connect_timeout = connect_timeout
        self._sock: socket.socket | None = None
        self._core = ClientCore()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 1
        self._send_lock = asyncio.Lock()
        self._reader_task: asyncio.Task[None] | None = None
        self._failure: ClientError | None = None
        #: Takes the immediates the daemon pushes, if `subscribe` was given one; else they
        #: wait in the core for `wait_immediates`. A push resolves `_push_waiters`.
        self._on_immediates: Callable[[list[Immediate]], None] | None = None
        self._push_waiters: list[asyncio.Future[None]] = []

    @classmethod
    async def open(cls, path: str | None = None, *, connect_timeout: float = 5.0) -> AsyncClient:
        client = cls(path, connect_timeout=connect_timeout)
        await client.start()
        return client

    async def start(self) -> None:
        if self._sock is not None:
            return
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, self.path), self.connect_timeout)
        except BaseException as exc:
            sock.close()
            err = unreachable(self.path, exc, self.connect_timeout)
            if err is None:
                raise
            raise err from None
        self._sock = sock
        self._failure = None
        self._reader_task = loop.create_task(self._read_loop(sock))

    # ---- transport -----------------------------------------------------------------------

    async def _read_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        reader = LineReader()
        failure = ClientError(CLOSED, "the daemon closed the control connection")
        try:
            while True:
                data = await loop.sock_recv(sock, 1 << 16)
                if not data:
                    break
                for line in reader.feed(data):
                    msg = decode_message(line)
                    if isinstance(msg, Notification):
                        self._notified(msg)
                        continue
                    for resp in msg:  # one answer, or a batch's
                        req_id = resp.id
                        if req_id is None:
                            # The daemon could not tell which request failed: the oldest.
                            req_id = next(iter(self._pending), None)
                        fut = self._pending.pop(req_id, None) if req_id is not None else None
                        if fut is None or fut.done():
                            continue  # an answer to a request given up on
                        if resp.error is not None:
                            fut.set_exception(resp.error)
                        else:
                            fut.set_result(resp.result)
        except ClientError as exc:
            failure = exc
        except OSError as exc:
            failure = ClientError(CLOSED, f"control connection failed: {exc.strerror or exc}")
        self._fail(failure)

    def _notified(self, msg: Notification) -> None:
        """A pushed message: immediates go to the subscriber's handler when there is one (in
        arrival order), else, as completions do, into the core for the waits it wakes; a kind
        not subscribed to is ignored. A handler that raises fails the client (every waiting
        call gets the error) rather than end the reader silently."""
        handler = self._on_immediates
        if msg.method == "immediates" and handler is not None:
            if "immediates" not in self._core.pushes:
                return
            got = [Immediate.decode(item) for item in answer_list(msg.params, "immediates")]
            try:
                handler(got)
            except Exception as exc:
                raise ClientError(CLOSED, f"the immediates handler raised {type(exc).__name__}: "
                                          f"{exc}") from None  # fmt: skip
            return
        self._core.notified(msg.method, msg.params)
        self._wake_push_waiters()

    def _wake_push_waiters(self) -> None:
        waiters, self._push_waiters = self._push_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _wait_push(self, seconds: float) -> None:
        """Until the daemon pushes something or `seconds` pass (a subscribed client's wait,
        with no request); the client's failure ends it. The operation that asks looked at
        what arrived just before, with no await between: no push is missed."""
        if self._sock is None:
            raise self._failure or ClientError(CLOSED, "the client is not open")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._push_waiters.append(fut)
        # (a timer handle, not asyncio.wait_for: that makes a task of each wait)
        expiry = loop.call_later(seconds, _resolve, fut)
        try:
            await fut
        finally:
            expiry.cancel()
            if fut in self._push_waiters:  # (timed out or cancelled: no push took it)
                self._push_waiters.remove(fut)
        if self._sock is None:
            raise self._failure or ClientError(CLOSED, "the client is not open")

    def _fail(self, failure: ClientError) -> None:
        self._failure = failure
        self._wake_push_waiters()  # a wait for pushes ends with the failure
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._core.regions.clear()
        self._core.conns.clear()
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(failure)

    async def _call(self, call: Call) -> Any:
        sock = self._sock
        if sock is None:
            raise self._failure or ClientError(CLOSED, "the client is not open")
        loop = asyncio.get_running_loop()
        req_id = self._next_id
        self._next_id += 1
        line = encode_request(call.method, call.params, req_id)
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending[req_id] = fut
        try:
            async with self._send_lock:
                if call.fd is not None:
                    sent = await self._send_fd(sock, line, call.fd)
                    line = line[sent:]
                if line:
                    await loop.sock_sendall(sock, line)
            return await asyncio.wait_for(fut, call.answer_within)
        except TimeoutError:
            raise ClientError(
                TIMEOUT, f"{call.method}: no answer from the daemon within {call.answer_within:g} s"
            ) from None
        except OSError as exc:
            raise self._broken(call.method, exc) from None
        finally:
            self._pending.pop(req_id, None)

    def _broken(self, method: str, exc: OSError) -> ClientError:
        """A send failed: the client fails (every waiting call gets the error), and `method`'s
        caller gets it too, naming the method."""
        why = f"control connection failed: {exc.strerror or exc}"
        self._fail(ClientError(CLOSED, why))
        return ClientError(CLOSED, f"{method}: {why}")

    async def _call_batch(self, calls: Sequence[Call]) -> list[Any]:
        """Send `calls` as one JSON-RPC batch (one line, one answer line); each call's result,
        or its ClientError (returned, not raised), in order. None of them may carry an fd."""
        sock = self._sock
        if sock is None:
            raise self._failure or ClientError(CLOSED, "the client is not open")
        loop = asyncio.get_running_loop()
        first = self._next_id
        self._next_id += len(calls)
        line = encode_batch([(c.method, c.params, first + i) for i, c in enumerate(calls)])
        futs = [loop.create_future() for _ in calls]
        for i, fut in enumerate(futs):
            self._pending[first + i] = fut
        within = max(c.answer_within for c in calls)
        try:
            async with self._send_lock:
                await loop.sock_sendall(sock, line)
            done, _ = await asyncio.wait(futs, timeout=within)
            if len(done) < len(futs):
                raise ClientError(TIMEOUT, f"{calls[0].method}: no answer from the daemon "
                                           f"within {within:g} s")
            return [f.exception() or f.result() for f in futs]
        except OSError as exc:
            raise self._broken(calls[0].method, exc) from None
        finally:
            for i in range(len(calls)):
                self._pending.pop(first + i, None)

    async def _run_batch(self, ops: Sequence[Op[Any]]) -> list[Any]:
        """Drive operations whose first request goes in one batch; an operation that asks
        more goes on alone. Each one's value, or the ClientError it ended with."""
        firsts: list[Call | Pushed | None] = []
        out: list[Any] = []
        for op in ops:
            try:  # an argument error raises here, before anything is sent
                firsts.append(next(op))
                out.append(None)
            except StopIteration as stop:  # done without asking (what was pushed sufficed)
                firsts.append(None)
                out.append(stop.value)
        calls = [c for c in firsts if isinstance(c, Call)]
        results = iter(await self._call_batch(calls) if calls else [])
        for i, (op, first) in enumerate(zip(ops, firsts, strict=True)):
            if first is None:
                continue
            try:
                if isinstance(first, Pushed):
                    out[i] = await self._step(op, first)
                else:
                    out[i] = await self._drive(op, next(results))
            except ClientError as exc:
                out[i] = exc
        return out

    @staticmethod
    async def _send_fd(sock: socket.socket, line: bytes, fd: int) -> int:
        """sendmsg with the fd on a non-blocking socket, waiting for room if it is full."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                return socket.send_fds(sock, [line], [fd])
            except BlockingIOError:
                ready: asyncio.Future[None] = loop.create_future()
                loop.add_writer(sock.fileno(), ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_writer(sock.fileno())

    async def _run(self, op: Op[T]) -> T:
        try:
            call = next(op)
        except StopIteration as stop:
            done: T = stop.value
            return done
        return await self._step(op, call)

    async def _step(self, op: Op[T], call: Call | Pushed) -> T:
        """Do `call`, then drive `op` on to its value."""
        try:
            result: Any = await self._do(call)
        except ClientError as exc:
            result = exc
        return await self._drive(op, result)

    async def _do(self, call: Call | Pushed) -> Any:
        """A request's answer, or None once a wait for pushes ended."""
        if isinstance(call, Pushed):
            await self._wait_push(call.seconds)
            return None
        return await self._call(call)

    async def _drive(self, op: Op[T], result: Any) -> T:
        """Run `op` on from the answer to its last request (`result`, or the ClientError it
        raised), each further request answered in turn, to its value."""
        try:
            call = op.throw(result) if isinstance(result, ClientError) else op.send(result)
            while True:
                try:
                    result = await self._do(call)
                except ClientError as exc:
                    call = op.throw(exc)
                else:
                    call = op.send(result)
        except StopIteration as stop:
            value: T = stop.value
            return value

    @property
    def closed(self) -> bool:
        return self._sock is None

    async def close(self) -> None:
        self._fail(ClientError(CLOSED, "the client is closed"))
        task, self._reader_task = self._reader_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> AsyncClient:
        await self.start()
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # ---- the API -------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        return await self._run(self._core.status())

    async def register_region(
        self, size: int, name: str | None = None, *, peers: Sequence[str] | None = None
    ) -> AsyncRegion:
        """As `Client.register_region`: `peers` names the peers that may write it."""
        region_id, handle, memory = await self._run(
            self._core.register_region(size, name, peers)
        )
        region = AsyncRegion(self, region_id, handle, memory, name)
        self._core.adopt_region(region)
        return region

    async def connect(self, peer: str) -> AsyncConnection:
        cid = await self._run(self._core.connect(peer))
        return AsyncConnection(self, cid, peer)

    async def write_batch(
        self, posts: Sequence[tuple[AsyncConnection, Sequence[Write]]], *,
        completions: bool = False,
    ) -> tuple[list[list[int]], list[Completion]]:
        """Post writes on several connections in one control request (a JSON-RPC batch:
        one line to the daemon, one answer back): the ids of each post, in order. With
        `completions`, the batch also fetches, without waiting, the completions that have
        arrived on any of this client's connections, returned as `poll_completions` returns
        them. A refused post raises its ClientError once the batch is answered; the posts
        that were accepted stay posted (their completions come as usual)."""
        ops: list[Op[Any]] = [self._core.write(conn.id, writes) for conn, writes in posts]
        if completions:
            ops.append(self._core.poll_all(0.0))
        results = await self._run_batch(ops)
        failed = next((r for r in results if isinstance(r, ClientError)), None)
        if failed is not None:
            raise failed
        return results[:len(posts)], results[len(posts)] if completions else []

    async def poll_completions(self, timeout: float | None = 0.0) -> list[Completion]:
        """The completions that have arrived on any of this client's connections, waiting up
        to `timeout` for the first one (one long-poll for them all), in posting order per
        connection."""
        return await self._run(self._core.poll_all(timeout))

    async def wait_immediates(self, region: AsyncRegion | None = None,
                              timeout: float | None = None,
                              max: int | None = None) -> list[Immediate]:
        """As `Client.wait_immediates`; with an immediates handler given to `subscribe` they
        are its, and this is refused."""
        if self._on_immediates is not None:
            raise ClientError(INVALID_PARAMS, "wait_immediates: the immediates go to the "
                                              "handler given to subscribe")
        return await self._run(self._core.immediates(region, timeout, max))

    async def subscribe(
        self, *, immediates: bool = True, completions: bool = True,
        on_immediates: Callable[[list[Immediate]], None] | None = None,
    ) -> None:  # fmt: skip
        """As `Client.subscribe`. With `on_immediates`, that handler gets each push of
        immediates (in arrival order, from the reader, so it must not block) and
        `wait_immediates` is refused; without, the waits hand them out as before."""
        kinds = push_kinds(immediates, completions)
        if on_immediates is not None and "immediates" not in kinds:
            raise ClientError(INVALID_PARAMS, "subscribe: on_immediates without immediates")
        op = self._core.subscribe(kinds)  # (checks before the handler is kept)
        call = next(op)
        self._on_immediates = on_immediates or self._on_immediates
        try:
            await self._step(op, call)
        except BaseException:
            if on_immediates is not None:
                self._on_immediates = None
            raise

    async def bind(self, endpoint: str) -> None:
        await self._run(self._core.bind(endpoint))

    async def send_message(self, peer: str, endpoint: str, data: bytes) -> None:
        await self._run(self._core.send_message(peer, endpoint, data))

    async def recv_message(self, endpoint: str, timeout: float | None = None) -> Message | None:
        return await self._run(self._core.recv_message(endpoint, timeout))

    async def peers(self) -> list[dict[str, Any]]:
        return await self._run(self._core.view("peers"))

    async def connections(self) -> list[dict[str, Any]]:
        return await self._run(self._core.view("connections"))

    async def planes(self) -> list[dict[str, Any]]:
        return await self._run(self._core.view("planes"))

    async def evs(self, connection: int | None = None) -> list[dict[str, Any]]:
        return await self._run(
            self._core.view("evs", None if connection is None else {"connection": connection})
        )

    async def regions(self) -> list[dict[str, Any]]:
        """As `Client.regions`: this client's own unless it runs as the daemon's uid or root."""
        return await self._run(self._core.view("regions"))

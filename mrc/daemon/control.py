"""The control socket: a Unix stream socket speaking newline-delimited JSON-RPC 2.0 with fds.

Holds `ControlServer` (binding the socket path with its mode and group, refusing to start when
another daemon answers there and replacing a stale file, following no symlink while setting
it up, accepting up to `max_clients` clients, `max_clients_per_uid` of a uid other than the
admin ones (the daemon's own and root), only those and the `allowed_uids` when given (the uid
is the kernel's, SO_PEERCRED), and refusing the rest with a counted error line, removing the
file at the end) and
`ControlClient` (one application's connection: reading lines with the fds that came with them,
answering in order or, for a long-poll, when it is over, and a bounded output buffer).

Framing (docs/DAEMON.md): one JSON value per line, at most 1 MiB. An fd (SCM_RIGHTS) is sent
with the line of the `register_region` request that it belongs to, in the same sendmsg. On a
stream socket the kernel hands the fds over with the read that ends with (or cuts into) the
bytes they were sent with, so they belong to the last line that starts in that read. Every fd
that arrives is closed here once its request was handled, whatever happened (the daemon keeps a
mapping, never the fd); an fd with any other request is refused. A malformed, oversized or
unknown request gets its error answer and the client stays connected.

What it leaves to others: what a method does (`Dispatcher`, implemented by `methods`).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import grp
import inspect
import logging
import os
import socket
import stat
import struct
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from . import rpc
from .rpc import RpcError

__all__ = ["ControlClient", "ControlError", "ControlServer", "Dispatcher"]

log = logging.getLogger("mrc.daemon")

#: Bytes one read takes; fds ride with the read, so more is not better.
READ_BYTES = 256 << 10
#: fds one read can carry; more are a refused request (and the kernel closes what did not fit).
MAX_FDS = 4
#: Unread answers above which the daemon stops reading the client's requests (it resumes
#: below the low mark), and the most it keeps before disconnecting a client that stopped
#: reading (long-polls that were already waiting may still add their answers).
PAUSE_OUTPUT = 4 << 20
RESUME_OUTPUT = 1 << 20
MAX_OUTPUT = 64 << 20
#: Long-polls one client may have waiting at once.
MAX_WAITING = 64
_PEERCRED = struct.Struct("3i")


class ControlError(Exception):
    """The control socket cannot be served (one line); the daemon exits 1."""


class Dispatcher(Protocol):
    """What the server asks of the methods above it (`methods.Methods`)."""

    def dispatch(
        self, client: ControlClient, method: str, params: dict[str, Any], fd: int | None
    ) -> Any:
        """The result of one request (JSON-able), or an awaitable of it for a long-poll; raise
        RpcError to refuse. An fd is only passed with register_region, which must map it
        synchronously: the server closes the fd when `dispatch` returns."""
        ...

    def client_gone(self, client: ControlClient) -> None: ...


@dataclass(frozen=True, slots=True)
class _Pending:
    """A request whose answer is awaited (a long-poll, a connect)."""

    req: rpc.Request
    pending: Awaitable[Any]


class ControlClient:
    """One connected application."""

    def __init__(
        self,
        server: ControlServer,
        sock: socket.socket,
        client_id: int,
        credentials: tuple[int, int, int],
    ) -> None:
        """`credentials`: the process's (pid, uid, gid) from SO_PEERCRED at connect time."""
        self.server = server
        self.sock = sock
        self.id = client_id
        self.pid, self.uid, self.gid = credentials
        self.closed = False
        self._buf = bytearray()
        #: Buffer offset of a line start → the fds that came with that line.
        self._fds: dict[int, list[int]] = {}
        #: The rest of an oversized line is being thrown away up to its newline.
        self._skipping = False
        self._out = bytearray()
        self._writer = False
        self._paused = False
        self.waiting: set[asyncio.Task[None]] = set()

    # -- output ---------------------------------------------------------------------------------

    def send(self, doc: Any) -> None:
        if self.closed:
            return
        data = rpc.encode(doc)
        if not self._out:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self.close()
                return
            if sent == len(data):
                return
            data = data[sent:]
        self._out += data
        if len(self._out) > MAX_OUTPUT:
            self.server.counters["slow_clients"] += 1
            log.warning("control client %d (pid %s) stopped reading: dropped", self.id, self.pid)
            self.close()
            return
        if not self._writer:
            self.server.loop.add_writer(self.sock.fileno(), self._on_writable)
            self._writer = True
        if len(self._out) > PAUSE_OUTPUT and not self._paused:
            # Backpressure: its requests wait in the socket until it reads its answers.
            self.server.loop.remove_reader(self.sock.fileno())
            self._paused = True
            self.server.counters["paused_clients"] += 1

    def _on_writable(self) -> None:
        try:
            sent = self.sock.send(self._out)
        except BlockingIOError:
            return
        except OSError:
            self.close()
            return
        del self._out[:sent]
        if not self._out and self._writer:
            self.server.loop.remove_writer(self.sock.fileno())
            self._writer = False
        if self._paused and len(self._out) < RESUME_OUTPUT:
            self._paused = False
            self.server.loop.add_reader(self.sock.fileno(), self._on_readable)

    @property
    def unsent(self) -> int:
        return len(self._out)

    # -- input ----------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        for _ in range(8):  # bounded: other clients and the data plane wait meanwhile
            if self.closed or self._paused:
                return
            try:
                data, ancdata, flags, _ = self.sock.recvmsg(
                    READ_BYTES, socket.CMSG_SPACE(MAX_FDS * 4)
                )
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.close()
                return
            fds = _fds_of(ancdata)
            if flags & socket.MSG_CTRUNC:
                fds.append(-1)  # some did not fit: the kernel closed them; refuse the request
            if not data:
                _close_fds(fds)
                self.close()
                return
            self._feed(data, fds)

    def _feed(self, data: bytes, fds: list[int]) -> None:
        buf = self._buf
        base = len(buf)
        buf += data
        if fds:
            # The fds came with the sendmsg that began the last line starting in this read.
            nl = buf.rfind(b"\n", base, len(buf) - 1)
            self._fds.setdefault(nl + 1 if nl >= 0 else 0, []).extend(fds)
        start = 0
        while not self.closed:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            line_fds = self._take_fds(start, nl)
            if self._skipping:
                self._skipping = False  # the tail of an oversized line
                _close_fds(line_fds)
            elif nl - start + 1 > rpc.MAX_LINE:
                _close_fds(line_fds)
                self._refuse_oversized()
                self._skipping = False
            elif buf[start:nl].strip():
                self._line(bytes(buf[start:nl]), line_fds)
            else:
                _close_fds(line_fds)
            start = nl + 1
        if self.closed:
            return
        if start:
            del buf[:start]
            self._fds = {k - start: v for k, v in self._fds.items()}
        if len(buf) > rpc.MAX_LINE or (self._skipping and buf):
            if not self._skipping:
                self._refuse_oversized()
                self._skipping = True
            buf.clear()
            _close_fds(self._take_fds(0, 1 << 62))

    def _take_fds(self, start: int, end: int) -> list[int]:
        out: list[int] = []
        for key in [k for k in self._fds if start <= k <= end]:
            out.extend(self._fds.pop(key))
        return out

    def _refuse_oversized(self) -> None:
        self.server.counters["oversized_lines"] += 1
        err = RpcError(rpc.INVALID_REQUEST, f"line longer than {rpc.MAX_LINE} bytes; skipped")
        self.send(rpc.failure(None, err))

    def _line(self, line: bytes, fds: list[int]) -> None:
        try:
            self._handle(line, fds)
        finally:
            _close_fds(fds)

    def _handle(self, line: bytes, fds: list[int]) -> None:
        parsed = rpc.parse_line(line)
        if isinstance(parsed, dict):
            self.server.counters["malformed_requests"] += 1
            self.send(parsed)
            return
        items, batch = parsed
        fd: int | None = None
        refusal: RpcError | None = None
        if fds:
            first = items[0]
            if len(fds) != 1 or fds[0] < 0:
                refusal = RpcError(rpc.INVALID_PARAMS, "one fd per register_region request")
            elif batch or not isinstance(first, rpc.Request) or first.method != "register_region":
                name = first.method if isinstance(first, rpc.Request) and not batch else "batch"
                refusal = RpcError(
                    rpc.INVALID_PARAMS,
                    f"an fd came with {name!r}; only register_region takes one: closed",
                )
            else:
                fd = fds[0]
        results: list[Any] = []
        for item in items:
            if isinstance(item, dict):
                self.server.counters["malformed_requests"] += 1
                results.append(item)
            elif refusal is not None:
                self.server.counters["refused_fds"] += 1
                results.append(None if item.notification else rpc.failure(item.id, refusal))
            else:
                results.append(self._call(item, fd))
        waits = [r for r in results if isinstance(r, _Pending)]
        if not waits:
            self._answer([r for r in results if r is not None], batch)
            return
        if len(self.waiting) >= MAX_WAITING:
            for w in waits:
                if inspect.iscoroutine(w.pending):
                    w.pending.close()
            err = RpcError(rpc.RESOURCE_LIMIT, f"more than {MAX_WAITING} long-polls waiting")
            self._answer([rpc.failure(None, err)], batch)
            return
        task = self.server.loop.create_task(self._finish(results, batch))
        self.waiting.add(task)
        task.add_done_callback(self.waiting.discard)

    async def _finish(self, results: list[Any], batch: bool) -> None:
        done = [await self._later(r.req, r.pending) if isinstance(r, _Pending) else r
                for r in results]
        self._answer([r for r in done if r is not None], batch)

    def _answer(self, docs: list[Any], batch: bool) -> None:
        if not docs:
            return
        self.send(docs if batch else docs[0])

    def _call(self, req: rpc.Request, fd: int | None) -> Any:
        server = self.server
        server.counters["requests"] += 1
        try:
            result = server.dispatcher.dispatch(self, req.method, req.params, fd)
        except RpcError as err:
            server.counters[f"errors_{-err.code}"] += 1
            return None if req.notification else rpc.failure(req.id, err)
        except Exception as exc:  # a bug: answered, logged, and the daemon goes on
            return self._internal(req, exc)
        if inspect.isawaitable(result):
            return _Pending(req, result)
        return None if req.notification else rpc.answer(req.id, result)

    async def _later(self, req: rpc.Request, pending: Awaitable[Any]) -> dict[str, Any] | None:
        try:
            result = await pending
        except RpcError as err:
            self.server.counters[f"errors_{-err.code}"] += 1
            return None if req.notification else rpc.failure(req.id, err)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return self._internal(req, exc)
        return None if req.notification else rpc.answer(req.id, result)

    def _internal(self, req: rpc.Request, exc: Exception) -> dict[str, Any] | None:
        self.server.counters["internal_errors"] += 1
        log.error("internal error in %s: %s: %s", req.method, type(exc).__name__, exc)
        err = RpcError(rpc.INTERNAL_ERROR, f"{req.method}: internal error: {type(exc).__name__}")
        return None if req.notification else rpc.failure(req.id, err)

    # -- end ------------------------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        loop = self.server.loop
        fd = self.sock.fileno()
        if fd >= 0:
            if not self._paused:
                loop.remove_reader(fd)
            if self._writer:
                loop.remove_writer(fd)
        self._writer = False
        self.sock.close()
        _close_fds(self._take_fds(0, 1 << 62))
        for task in list(self.waiting):
            task.cancel()
        self.server._gone(self)


class ControlServer:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        path: str,
        dispatcher: Dispatcher,
        *,
        mode: int = 0o600,
        group: str | None = None,
        max_clients: int = 256,
        max_clients_per_uid: int = 128,
        allowed_uids: frozenset[int] | None = None,
        admin_uids: frozenset[int] = frozenset(),
        counters: Counter[str] | None = None,
    ) -> None:
        """`counters`: where to count refused clients, errors by code and the like (the
        daemon hands in the service's, which its views show); a new one if None.
        `allowed_uids`: who may connect besides the `admin_uids` (the daemon's own and root;
        None: anyone the socket's mode lets in); `max_clients_per_uid` does not hold for an
        admin uid."""
        self.loop = loop
        self.path = path
        self.dispatcher = dispatcher
        self.mode = mode
        self.group = group
        self.max_clients = max_clients
        self.max_clients_per_uid = max_clients_per_uid
        self.allowed_uids = allowed_uids
        self.admin_uids = admin_uids
        self.clients: dict[int, ControlClient] = {}
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self._sock: socket.socket | None = None
        self._inode: tuple[int, int] | None = None
        self._next_id = 1

    def start(self) -> None:
        """Bind and listen; ControlError (one line) when the path cannot be served."""
        path = self.path
        _clear_stale(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177 if self.mode == 0o600 else 0o117)
        try:
            sock.bind(path)
        except OSError as exc:
            sock.close()
            if exc.errno == 98:  # EADDRINUSE: another daemon bound it between check and bind
                raise ControlError(f"another daemon is serving {path}") from None
            raise ControlError(f"cannot bind {path}: {exc.strerror or exc}") from None
        finally:
            os.umask(old)
        try:
            # The umask above gave the socket its mode. Nothing here follows a symlink: whoever
            # can write the directory could have swapped the file for one to theirs since bind.
            st = os.lstat(path)
            if not stat.S_ISSOCK(st.st_mode) or stat.S_IMODE(st.st_mode) != self.mode:
                raise ControlError(f"{path} was replaced while binding; not serving it")
            if self.group is not None:
                os.chown(path, -1, grp.getgrnam(self.group).gr_gid, follow_symlinks=False)
            self._inode = (st.st_dev, st.st_ino)
            sock.listen(min(4096, max(128, self.max_clients)))
            sock.setblocking(False)
        except ControlError:
            sock.close()
            raise
        except (OSError, KeyError) as exc:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            reason = exc.strerror if isinstance(exc, OSError) else f"no group {exc}"
            raise ControlError(f"cannot set up {path}: {reason}") from None
        self._sock = sock
        self.loop.add_reader(sock.fileno(), self._on_accept)

    @property
    def accepting(self) -> bool:
        return self._sock is not None

    def stop_accepting(self) -> None:
        """Close the listening socket and remove its file (if it is still ours)."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        self.loop.remove_reader(sock.fileno())
        sock.close()
        with contextlib.suppress(OSError):
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:
                os.unlink(self.path)

    def close(self) -> None:
        self.stop_accepting()
        for client in list(self.clients.values()):
            client.close()

    def _on_accept(self) -> None:
        for _ in range(256):
            if self._sock is None:
                return
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # EMFILE/ENFILE: out of fds. Counted; the pending clients wait in the backlog.
                self.counters[f"accept_error_{exc.errno}"] += 1
                return
            conn.setblocking(False)
            credentials = _peer_credentials(conn)
            refusal = self._refusal(credentials[1])
            if refusal is not None:
                with contextlib.suppress(OSError):
                    conn.send(rpc.encode(rpc.failure(None, refusal)))
                conn.close()
                continue
            client = ControlClient(self, conn, self._next_id, credentials)
            self._next_id += 1
            self.clients[client.id] = client
            self.counters["accepted_clients"] += 1
            self.loop.add_reader(conn.fileno(), client._on_readable)

    def _refusal(self, uid: int) -> RpcError | None:
        """Why a process of `uid` may not become a client now (counted), or None."""
        admin = uid in self.admin_uids
        if not admin and self.allowed_uids is not None and uid not in self.allowed_uids:
            self.counters["refused_uid"] += 1
            return RpcError(rpc.PERMISSION_DENIED, f"uid {uid} is not in control.allowed_uids")
        if len(self.clients) >= self.max_clients:
            self.counters["refused_clients"] += 1
            return RpcError(
                rpc.RESOURCE_LIMIT, f"too many clients (max_clients = {self.max_clients})"
            )
        if not admin:
            cap = self.max_clients_per_uid
            if sum(1 for c in self.clients.values() if c.uid == uid) >= cap:
                self.counters["refused_clients_uid"] += 1
                return RpcError(
                    rpc.RESOURCE_LIMIT,
                    f"too many clients of uid {uid} (max_clients_per_uid = {cap})",
                )
        return None

    def _gone(self, client: ControlClient) -> None:
        if self.clients.pop(client.id, None) is not None:
            try:
                self.dispatcher.client_gone(client)
            except Exception as exc:
                log.error("internal error cleaning up client %d: %s", client.id, exc)


def _clear_stale(path: str) -> None:
    """ControlError when a daemon answers at `path` or it is not a socket; a stale socket file
    (nobody listening) is removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(path) or "."
        if not os.path.isdir(parent):
            raise ControlError(f"cannot bind {path}: directory {parent} does not exist") from None
        return
    except OSError as exc:
        raise ControlError(f"cannot examine {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise ControlError(f"{path} exists and is not a socket; remove it or change control.socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except OSError as exc:
        if exc.errno == 11:  # EAGAIN: its backlog is full, so somebody is listening
            raise ControlError(f"another daemon is serving {path}") from None
        raise ControlError(f"cannot check {path}: {exc.strerror or exc}") from None
    finally:
        probe.close()
    raise ControlError(f"another daemon is serving {path}")


def _fds_of(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(data[: len(data) - len(data) % arr.itemsize])
            fds.extend(arr)
    return fds


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
    fds.clear()


def _peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        pid, uid, gid = _PEERCRED.unpack(raw)
        return pid, uid, gid
    except OSError:
        return 0, -1, -1

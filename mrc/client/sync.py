"""`Client`: the blocking flavour of `mrc.client`, one control connection to the local daemon.

Holds `Client`, `Region` and `Connection` and the driver that runs `ops` operations over a
blocking Unix socket: one request at a time (a lock serialises threads), answers matched by id,
an answer to a request abandoned after a timeout skipped when it turns up. The region fd goes
with its request line in one `sendmsg` (SCM_RIGHTS). What each operation asks and keeps is
`ops`'; the framing is `rpc`'s. Everything is a context manager: leaving it deregisters,
disconnects or closes.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import Any, TypeVar

from .memory import RegionBase, SharedMemory
from .objects import Completion, Immediate, Message, RegionHandle, Write
from .ops import Call, ClientCore, Op, Pushed, push_kinds
from .rpc import (
    BAD_ANSWER,
    CLOSED,
    TIMEOUT,
    UNREACHABLE,
    ClientError,
    LineReader,
    Notification,
    Response,
    decode_message,
    encode_request,
)

__all__ = [
    "DEFAULT_SOCKET",
    "Client",
    "Connection",
    "Region",
    "check_path",
    "default_socket",
    "open_socket",
    "unreachable",
]

T = TypeVar("T")

#: Where the daemon listens unless its configuration says otherwise; MRC_SOCKET overrides.
DEFAULT_SOCKET = "/run/mrc/mrc.sock"


def default_socket() -> str:
    return os.environ.get("MRC_SOCKET") or DEFAULT_SOCKET


def check_path(path: Any) -> str:
    if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise ClientError(UNREACHABLE, f"bad control socket path {path!r}")
    return str(os.fspath(path))


def unreachable(path: str, exc: BaseException, timeout: float) -> ClientError | None:
    """The one-line UNREACHABLE for a failed connect to `path`; None if `exc` is not an
    OSError (an interrupt, say), which the caller re-raises."""
    if isinstance(exc, FileNotFoundError):
        msg = f"no mrc daemon socket at {path}"
    elif isinstance(exc, ConnectionRefusedError):
        msg = f"{path}: connection refused (is the mrc daemon running?)"
    elif isinstance(exc, PermissionError):
        msg = f"{path}: permission denied (the control socket belongs to the daemon's user)"
    elif isinstance(exc, TimeoutError):
        msg = f"{path}: the daemon did not accept within {timeout:g} s"
    elif isinstance(exc, OSError):
        msg = f"{path}: {exc.strerror or exc}"
    else:
        return None
    return ClientError(UNREACHABLE, msg)


def open_socket(path: str, timeout: float) -> socket.socket:
    """A connected control socket, or a one-line UNREACHABLE naming why not."""
    path = check_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except BaseException as exc:
        sock.close()
        err = unreachable(path, exc, timeout)
        if err is None:
            raise
        raise err from None
    return sock


class Region(RegionBase):
    """A registered region of a `Client`: `buf`, `handle`, `close()` (= `deregister()`)."""

    def __init__(self, client: Client, region_id: int, handle: RegionHandle,
                 memory: SharedMemory, name: str | None) -> None:
        super().__init__(region_id, handle, memory, name)
        self._client = client

    def close(self) -> None:
        """Deregister at the daemon (later WRITEs into it fail at their writer with
        remote_access_error) and unmap."""
        self._client._run(self._client._core.deregister_region(self))

    deregister = close

    def __enter__(self) -> Region:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Connection:
    """One MRC connection (QP) to a peer daemon, owned by this control connection."""

    def __init__(self, client: Client, connection_id: int, peer: str) -> None:
        self._client = client
        self.id = connection_id
        self.peer = peer

    def write(self, region: Region, offset: int, length: int, remote_handle: RegionHandle,
              remote_offset: int = 0, imm: int | None = None) -> int:
        """Post one WRITE (a WRITE_WITH_IMM when `imm` is set); returns its id."""
        return self.write_many([Write(region, offset, length, remote_handle, remote_offset,
                                      imm)])[0]

    def write_many(self, writes: Sequence[Write]) -> list[int]:
        """Post many WRITEs with one request; all are posted or none (the error names the
        first bad one by index)."""
        return self._client._run(self._client._core.write(self.id, writes))

    def wait(self, ids: Sequence[int] | None = None, timeout: float | None = None) -> list[
            Completion]:
        """Completions of `ids` (None: of every write posted and not yet returned), in posting
        order; after `timeout` seconds, those that came so far (the rest stay for later)."""
        return self._client._run(self._client._core.wait(self.id, ids, timeout))

    def poll(self, timeout: float | None = 0.0, max: int | None = None) -> list[Completion]:
        """Whatever completions have arrived, waiting up to `timeout` for the first."""
        return self._client._run(self._client._core.poll(self.id, timeout, max))

    @property
    def outstanding(self) -> int:
        """Writes posted whose completion has not been returned yet."""
        return self._client._core.outstanding(self.id)

    def evs(self) -> list[dict[str, Any]]:
        return self._client.evs(self.id)

    def close(self) -> None:
        self._client._run(self._client._core.disconnect(self.id))

    disconnect = close

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Client:
    """A blocking client of the daemon listening at `path` (default: MRC_SOCKET, else
    DEFAULT_SOCKET). Not for concurrent use from many threads: calls take turns."""

    def __init__(self, path: str | None = None, *, connect_timeout: float = 5.0) -> None:
        self.path = check_path(path) if path is not None else default_socket()
        self._sock: socket.socket | None = open_socket(self.path, connect_timeout)
        self._core = ClientCore()
        self._reader = LineReader()
        self._lines: deque[bytes] = deque()
        self._next_id = 1
        self._lock = threading.Lock()

    # ---- transport -----------------------------------------------------------------------

    def _run(self, op: Op[T]) -> T:
        """Drive an operation: each Call it yields is sent and answered in turn; a failed call
        is thrown back into it so it can clean up (a region's memory, for one)."""
        try:
            call = next(op)
            while True:
                try:
                    result = self._do(call)
                except ClientError as exc:
                    call = op.throw(exc)
                else:
                    call = op.send(result)
        except StopIteration as stop:
            value: T = stop.value
            return value

    def _do(self, call: Call | Pushed) -> Any:
        """A request's answer, or None once a wait for pushes ended."""
        if isinstance(call, Pushed):
            self._wait_push(call.seconds)
            return None
        return self._call(call)

    def _call(self, call: Call) -> Any:
        with self._lock:
            sock = self._sock
            if sock is None:
                raise ClientError(CLOSED, "the client is closed")
            req_id = self._next_id
            self._next_id += 1
            line = encode_request(call.method, call.params, req_id)
            try:
                sock.settimeout(call.answer_within)
                if call.fd is None:
                    sock.sendall(line)
                else:
                    # The fd rides on the first bytes of its own line (the daemon ties an fd
                    # to the line it arrived with); a short send finishes without it.
                    sent = socket.send_fds(sock, [line], [call.fd])
                    if sent < len(line):
                        sock.sendall(line[sent:])
                while True:
                    resp = self._read(sock)
                    # Answers to requests given up on (timeout, interrupt) are skipped.
                    if resp.id == req_id or resp.id is None:
                        return resp.value()
            except TimeoutError:
                raise ClientError(
                    TIMEOUT,
                    f"{call.method}: no answer from the daemon within {call.answer_within:g} s",
                ) from None
            except OSError as exc:
                self._drop()
                raise ClientError(
                    CLOSED, f"{call.method}: control connection failed: {exc.strerror or exc}"
                ) from None

    def _read(self, sock: socket.socket) -> Response:
        """The next answer; the notifications read on the way are kept (`_notified`)."""
        while True:
            while not self._lines:
                self._receive(sock)
            msg = decode_message(self._lines.popleft())
            if isinstance(msg, Notification):
                self._notified(msg)
                continue
            if len(msg) != 1:
                raise ClientError(BAD_ANSWER, "the daemon answered one request with an array")
            return msg[0]

    def _receive(self, sock: socket.socket) -> None:
        data = sock.recv(1 << 16)
        if not data:
            self._drop()
            raise ClientError(CLOSED, "the daemon closed the control connection")
        self._lines.extend(self._reader.feed(data))

    def _notified(self, msg: Notification) -> None:
        self._core.notified(msg.method, msg.params)

    def _wait_push(self, seconds: float) -> None:
        """Until the daemon pushed something (the lines read after an answer included) or
        `seconds` passed: a subscribed client's wait, with no request."""
        deadline = time.monotonic() + seconds
        with self._lock:
            while True:
                pushed = False
                while self._lines:  # read after an answer: pushes (or answers given up on)
                    msg = decode_message(self._lines.popleft())
                    if isinstance(msg, Notification):
                        self._notified(msg)
                        pushed = True
                left = deadline - time.monotonic()
                if pushed or left <= 0:
                    return
                sock = self._sock
                if sock is None:
                    raise ClientError(CLOSED, "the client is closed")
                try:
                    sock.settimeout(left)
                    self._receive(sock)
                except TimeoutError:
                    return
                except OSError as exc:
                    self._drop()
                    raise ClientError(
                        CLOSED, f"control connection failed: {exc.strerror or exc}"
                    ) from None

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        # The daemon deregisters and disconnects whatever a closed control connection owned.
        self._core.regions.clear()
        self._core.conns.clear()

    @property
    def closed(self) -> bool:
        return self._sock is None

    def close(self) -> None:
        """Close the control connection: the daemon deregisters this client's regions and
        disconnects its connections. Mappings stay readable until each region is closed."""
        with self._lock:
            self._drop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ---- the API -------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self._run(self._core.status())

    def register_region(
        self, size: int, name: str | None = None, *, peers: Sequence[str] | None = None
    ) -> Region:
        """A new region of `size` bytes in shared memory, registered with the daemon. `peers`:
        the names of the configured peers that may write it (default: any of them); a WRITE
        from another fails at its writer with remote_access_error."""
        region_id, handle, memory = self._run(self._core.register_region(size, name, peers))
        region = Region(self, region_id, handle, memory, name)
        self._core.adopt_region(region)
        return region

    def connect(self, peer: str) -> Connection:
        """A new MRC connection to the named peer daemon (waits for the handshake)."""
        cid = self._run(self._core.connect(peer))
        return Connection(self, cid, peer)

    def wait_immediates(self, region: Region | None = None, timeout: float | None = None,
                        max: int | None = None) -> list[Immediate]:
        """Immediates that landed in this client's regions (or in `region`), waiting up to
        `timeout` for the first; [] on timeout. Once subscribed, from those the daemon pushed,
        with no request."""
        return self._run(self._core.immediates(region, timeout, max))

    def subscribe(self, *, immediates: bool = True, completions: bool = True) -> None:
        """Have the daemon push this client's immediates and/or completions (docs/DAEMON.md,
        `subscribe`): `wait_immediates`, and a connection's `wait` and `poll`, then wait on
        the control socket instead of asking, which saves a request, and a wake-up of the
        daemon, per arrival."""
        self._run(self._core.subscribe(push_kinds(immediates, completions)))

    def bind(self, endpoint: str) -> None:
        self._run(self._core.bind(endpoint))

    def send_message(self, peer: str, endpoint: str, data: bytes) -> None:
        self._run(self._core.send_message(peer, endpoint, data))

    def recv_message(self, endpoint: str, timeout: float | None = None) -> Message | None:
        return self._run(self._core.recv_message(endpoint, timeout))

    def peers(self) -> list[dict[str, Any]]:
        return self._run(self._core.view("peers"))

    def connections(self) -> list[dict[str, Any]]:
        return self._run(self._core.view("connections"))

    def planes(self) -> list[dict[str, Any]]:
        return self._run(self._core.view("planes"))

    def evs(self, connection: int | None = None) -> list[dict[str, Any]]:
        return self._run(
            self._core.view("evs", None if connection is None else {"connection": connection})
        )

    def regions(self) -> list[dict[str, Any]]:
        """This client's regions (every one on the host when it runs as the daemon's uid or
        root; `connections` and `evs` likewise)."""
        return self._run(self._core.view("regions"))

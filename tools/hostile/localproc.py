"""The daemon the `local` family attacks, and control clients connected as any uid.

Holds `LocalDaemon` (one `python -m mrc daemon` child on loopback: its configuration and log in
a temporary directory the other uids can pass through, its control socket mode 0660 group
nogroup, stopped with SIGTERM then SIGKILL), `connect_as` (control connections made by a
process forked from this one and given another uid, so the daemon's SO_PEERCRED names that
uid; the sockets are handed back over SCM_RIGHTS and driven from here), `Client` (the control
protocol by hand: JSON lines, fds with SCM_RIGHTS, answers matched by id, and every error
answer kept for the report) and `memfd`. What the attacks are and how they are judged is
`tools.hostile.local`'s.
"""

from __future__ import annotations

import contextlib
import ctypes
import grp
import json
import mmap
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import IO, Any

from tools.hostile.procs import REPO_ROOT

#: The group the socket is given and the forked clients run in.
GROUP = "nogroup"
_PR_SET_PDEATHSIG = 1


class LocalError(Exception):
    """The daemon could not be started or reached (one line)."""


def group_id() -> int:
    try:
        return grp.getgrnam(GROUP).gr_gid
    except KeyError:
        return 65534


class LocalDaemon:
    """One `mrc daemon` with `config` (whose control socket must be `self.socket_path`)."""

    def __init__(self, tmp: str, config: str) -> None:
        self.tmp = tmp
        self.socket_path = os.path.join(tmp, "mrc.sock")
        self.config_path = os.path.join(tmp, "mrc.toml")
        with open(self.config_path, "w") as f:
            f.write(config)
        self.log_path = os.path.join(tmp, "daemon.log")
        self._log: IO[bytes] = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            env.pop(key, None)
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "mrc", "daemon", "--config", self.config_path],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=tmp,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.pid = self.popen.pid
        self.signalled = False
        self.killed = False

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until the daemon answers `status` on its socket; LocalError when it does not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.returncode is not None:
                raise LocalError(f"the daemon did not start: {self.log_tail()}")
            if os.path.exists(self.socket_path):
                with contextlib.suppress(OSError, EOFError, TimeoutError, ValueError):
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    try:
                        sock.settimeout(2.0)
                        sock.connect(self.socket_path)
                        client = Client(sock, os.geteuid(), "probe")
                        if "result" in client.request("status"):
                            return
                    finally:
                        sock.close()
            time.sleep(0.05)
        self.stop()
        raise LocalError(f"the daemon did not answer within {timeout:.0f} s: {self.log_tail()}")

    def log(self, offset: int = 0) -> str:
        """The daemon's output from byte `offset` on."""
        with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
        return ""

    def log_size(self) -> int:
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def log_tail(self) -> str:
        lines = [ln.strip() for ln in self.log().splitlines() if ln.strip()]
        return lines[-1][:300] if lines else f"exit {self.returncode}"

    def fds(self) -> int:
        """Open fds of the daemon process (sockets, the memfds it kept: it should keep none)."""
        try:
            return len(os.listdir(f"/proc/{self.pid}/fd"))
        except OSError:
            return -1

    def rss(self) -> int:
        """Resident bytes of the daemon (the application memory it mapped in included)."""
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return -1

    def stop(self, grace: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `grace` seconds; the exit status."""
        if self.popen.poll() is None:
            self.signalled = True
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.killed = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self._log.close()
        return self.popen.returncode


def _die_with_parent() -> None:
    """In the daemon's child, before exec: SIGKILL when the harness dies, however it dies
    (a harness killed by a test's timeout must not leave a daemon behind)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def connect_as(path: str, uid: int, n: int = 1, timeout: float = 10.0) -> list[socket.socket]:
    """`n` control connections to `path` made by a child process running as `uid` (group
    nogroup, no supplementary groups). The sockets come back over SCM_RIGHTS; the daemon
    knows them by the child's credentials at connect time. OSError with the child's reason
    when it could not connect."""
    here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    gid = group_id()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the harness
        code = 1
        try:
            here.close()
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            todo = n
            while todo:
                made: list[socket.socket] = []
                try:
                    for _ in range(min(todo, 200)):
                        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                        made.append(s)
                        s.settimeout(timeout)
                        s.connect(path)
                    socket.send_fds(there, [b"k"], [s.fileno() for s in made])
                finally:
                    for s in made:
                        s.close()
                todo -= len(made)
            code = 0
        except BaseException as exc:  # reported to the parent, whatever it is
            with contextlib.suppress(BaseException):
                there.send(b"E" + f"{type(exc).__name__}: {exc}".encode()[:300])
        finally:
            os._exit(code)
    there.close()
    socks: list[socket.socket] = []
    error = ""
    deadline = time.monotonic() + timeout + 5
    try:
        while len(socks) < n and not error:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([here], [], [], left)[0]:
                error = "timed out"
                break
            msg, fds, _, _ = socket.recv_fds(here, 512, 253)
            socks += [socket.socket(fileno=fd) for fd in fds]
            if not msg:
                error = "the child ended early"
            elif msg.startswith(b"E"):
                error = msg[1:].decode(errors="replace")
    finally:
        here.close()
        _reap(pid, deadline)
    if error:
        for s in socks:
            s.close()
        raise OSError(f"connecting as uid {uid}: {error}")
    return socks


def _reap(pid: int, deadline: float) -> None:
    while True:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return
        time.sleep(0.005)


class Client:
    """One control connection. `errors` keeps every error object the daemon answered with
    (the report checks each is one line); answers are matched to requests by id."""

    def __init__(self, sock: socket.socket, uid: int, name: str, timeout: float = 5.0) -> None:
        self.sock = sock
        self.uid = uid
        self.name = name
        self.timeout = timeout
        sock.settimeout(timeout)
        self.errors: list[dict[str, Any]] = []
        self.lines = 0
        #: The longest answer line so far, its newline included.
        self.longest = 0
        self._buf = b""
        self._next_id = 1
        self._stash: dict[Any, dict[str, Any]] = {}
        self._unmatched: list[dict[str, Any]] = []

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, data: bytes, fds: list[int] | None = None) -> None:
        if fds:
            sent = socket.send_fds(self.sock, [data], fds)
            if sent < len(data):
                self.sock.sendall(data[sent:])
        else:
            self.sock.sendall(data)

    def line(self, timeout: float | None = None) -> Any:
        """The next answer line, decoded (its error noted); EOFError when the daemon closed,
        TimeoutError when none came in time."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name}: no answer within the time")
            self.sock.settimeout(left)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError(f"{self.name}: the daemon closed the connection")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\n", 1)
        self.lines += 1
        self.longest = max(self.longest, len(raw) + 1)
        doc = json.loads(raw)
        for item in doc if isinstance(doc, list) else [doc]:
            if isinstance(item, dict) and isinstance(item.get("error"), dict):
                self.errors.append(item["error"])
        return doc

    def next_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def line_of(self, method: str, params: dict[str, Any] | None = None,
                req_id: int | None = None) -> bytes:
        """The request line (`req_id` None: a new id)."""
        msg = {"jsonrpc": "2.0", "id": self.next_id() if req_id is None else req_id,
               "method": method, "params": params or {}}
        return json.dumps(msg).encode() + b"\n"

    def answer(self, req_id: Any, timeout: float | None = None) -> dict[str, Any]:
        """The answer object with this id (answers to other ids are kept for later)."""
        while req_id not in self._stash:
            doc = self.line(timeout)
            if isinstance(doc, dict) and "id" in doc:
                self._stash[doc["id"]] = doc
            else:
                self._unmatched.append({"line": doc})
        return self._stash.pop(req_id)

    def unmatched(self) -> list[dict[str, Any]]:
        """Answer lines that matched no request asked for by id (id null errors, batches)."""
        out, self._unmatched = self._unmatched, []
        return out

    def request(self, method: str, params: dict[str, Any] | None = None,
                fd: int | None = None, timeout: float | None = None) -> dict[str, Any]:
        req_id = self.next_id()
        self.send_raw(self.line_of(method, params, req_id), [fd] if fd is not None else None)
        return self.answer(req_id, timeout)


class Memfd:
    """An application's region: a memfd of `size` bytes, mapped shared (never written unless
    `fill` bytes are asked for)."""

    def __init__(self, size: int, *, sealing: bool = True, fill: int = 0) -> None:
        flags = os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if sealing else 0)
        self.fd = os.memfd_create("hostile-region", flags)
        os.ftruncate(self.fd, size)
        self.size = size
        self.map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED)
        if fill:
            self.map[:fill] = b"\x5a" * fill

    def close(self) -> None:
        self.map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)

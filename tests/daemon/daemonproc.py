"""Test support: real `mrc daemon` processes on loopback planes and a raw control-socket client.

`DaemonProc` writes a configuration into a temporary directory, starts the daemon as a
subprocess with a fake `$NOTIFY_SOCKET` (an abstract datagram socket the test owns), waits for
its READY=1 and is always killed in teardown. `RawClient` speaks the control protocol with
nothing but `socket`: one JSON line per request, an fd with SCM_RIGHTS when asked, so the tests
check the daemon's side without the client library.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PLANES_A = ["127.0.0.2", "127.0.0.3"]
PLANES_B = ["127.0.0.6", "127.0.0.7"]
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A UDP port free on every test plane address (both daemons use one port)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.2", 0))
            port = int(probe.getsockname()[1])
        ok = True
        for addr in PLANES_A + PLANES_B:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                try:
                    s.bind((addr, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise RuntimeError("no free port")


def toml_config(
    host: str,
    planes: list[str],
    port: int,
    sock: Path,
    peers: dict[str, list[str]],
    *,
    extra: str = "",
    limits: str = "",
) -> str:
    lines = [f'host = "{host}"', f"port = {port}", 'security = "none"']
    lines.append(extra)
    for addr in planes:
        lines += ["[[planes]]", f'address = "{addr}"']
    for name, addrs in peers.items():
        lines += ["[[peers]]", f'name = "{name}"', f"addresses = {json.dumps(addrs)}"]
    lines += ["[control]", f'socket = "{sock}"']
    lines += ["[limits]", limits or "drain_seconds = 2"]
    return "\n".join(lines) + "\n"


class Notify:
    """A fake systemd notification socket (abstract namespace)."""

    def __init__(self, tag: str) -> None:
        self.name = f"@mrc-test-{os.getpid()}-{tag}-{time.monotonic_ns()}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.messages: list[str] = []

    def wait_for(self, key: str, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while key not in "\n".join(self.messages):
            left = end - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                return False
        return True

    def close(self) -> None:
        self.sock.close()


class DaemonProc:
    def __init__(
        self,
        tmp: Path,
        host: str,
        config: str,
        *,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        socket_path: Path | None = None,
    ) -> None:
        """`socket_path`: where the configuration puts the control socket (default: TMP/HOST.sock,
        as `toml_config` is usually given)."""
        self.tmp = tmp
        self.host = host
        self.config_path = tmp / f"{host}.toml"
        self.config_path.write_text(config)
        self.socket_path = socket_path or tmp / f"{host}.sock"
        self.notify = Notify(host)
        self.log_path = tmp / f"{host}.log"
        environ = dict(os.environ, NOTIFY_SOCKET=self.notify.name, PYTHONPATH=str(ROOT))
        environ.pop("WATCHDOG_USEC", None)
        environ.update(env or {})
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mrc", "daemon", "--config", str(self.config_path), *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=environ,
            cwd=tmp,
        )

    def wait_ready(self, timeout: float = 15.0) -> None:
        if not self.notify.wait_for("READY=1", timeout):
            self.stop()
            raise AssertionError(f"daemon {self.host} not ready:\n{self.log()}")

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()
        self.notify.close()

    def client(self) -> RawClient:
        return RawClient(self.socket_path)


class RawClient:
    """The control protocol by hand: JSON lines, SCM_RIGHTS, nothing else."""

    def __init__(self, path: Path | str, timeout: float = 20.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self._buf = b""
        self._id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes, fds: list[int] | None = None) -> None:
        if fds:
            socket.send_fds(self.sock, [data], fds)
        else:
            self.sock.sendall(data)

    def line(self) -> Any:
        while b"\n" not in self._buf:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("daemon closed the connection")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\n", 1)
        return json.loads(raw)

    def request(self, method: str, params: dict[str, Any] | None = None,
                fd: int | None = None) -> Any:
        """The whole answer object of one request."""
        self._id += 1
        msg = {"jsonrpc": "2.0", "id": self._id, "method": method, "params": params or {}}
        self.send_raw(json.dumps(msg).encode() + b"\n", [fd] if fd is not None else None)
        answer = self.line()
        assert answer.get("id") == self._id, answer
        return answer

    def call(self, method: str, params: dict[str, Any] | None = None,
             fd: int | None = None) -> Any:
        """The result, asserting there was no error."""
        answer = self.request(method, params, fd)
        assert "error" not in answer, answer["error"]
        return answer["result"]

    def error(self, method: str, params: dict[str, Any] | None = None,
              fd: int | None = None) -> dict[str, Any]:
        answer = self.request(method, params, fd)
        assert "error" in answer, answer
        err: dict[str, Any] = answer["error"]
        return err


class Memfd:
    """An application-side region: a memfd sized and mapped shared."""

    def __init__(self, size: int, *, sealing: bool = True) -> None:
        flags = os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if sealing else 0)
        self.fd = os.memfd_create("test-region", flags)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED)
        self.size = size

    def register(self, client: RawClient, name: str = "r") -> dict[str, Any]:
        result: dict[str, Any] = client.call(
            "register_region", {"size": self.size, "name": name}, fd=self.fd
        )
        return result

    def close(self) -> None:
        self.map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def daemon_pair(
    tmp: Path,
    *,
    limits: str = "",
    args_a: tuple[str, ...] = (),
    args_b: tuple[str, ...] = (),
) -> Iterator[tuple[DaemonProc, DaemonProc]]:
    """Daemons a (planes .2/.3) and b (.6/.7), each listing the other, ready."""
    port = free_port()
    a = DaemonProc(tmp, "a", toml_config("a", PLANES_A, port, tmp / "a.sock",
                                         {"b": PLANES_B}, limits=limits), args=args_a)
    b = DaemonProc(tmp, "b", toml_config("b", PLANES_B, port, tmp / "b.sock",
                                         {"a": PLANES_A}, limits=limits), args=args_b)
    try:
        a.wait_ready()
        b.wait_ready()
        yield a, b
    finally:
        a.stop()
        b.stop()

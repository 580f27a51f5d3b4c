"""Helpers to run `python -m mrc bench` servers and clients as real subprocesses on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER_ADDRS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
CLIENT_ADDRS = ["127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"]


def env() -> dict[str, str]:
    """The environment for a child `python -m mrc`: this checkout first on the path."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, e.get("PYTHONPATH", "")) if p)
    return e


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def free_port(host: str = "127.0.0.2") -> int:
    with socket.socket(_family(host), socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def bound(host: str, port: int) -> bool:
    """Is something bound to host:port (UDP)? Read from /proc, without touching the port."""
    if _family(host) == socket.AF_INET6:
        raw = socket.inet_pton(socket.AF_INET6, host)
        addr = "".join(raw[i : i + 4][::-1].hex() for i in range(0, 16, 4)).upper()
        table = "/proc/net/udp6"
    else:
        addr = socket.inet_aton(host)[::-1].hex().upper()
        table = "/proc/net/udp"
    want = f"{addr}:{port:04X}"
    with open(table) as f:
        return any(line.split()[1] == want for line in f.readlines()[1:])


class Server:
    """`mrc bench -s` on the 4 loopback planes; `stop()` returns (rc, stdout, stderr)."""

    def __init__(self, *extra: str, addrs: list[str] | None = None) -> None:
        self.addrs = addrs or SERVER_ADDRS
        for _ in range(5):
            self.port = free_port(self.addrs[0])
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mrc",
                    "bench",
                    "-s",
                    "-B",
                    ",".join(self.addrs),
                    "-p",
                    str(self.port),
                    *extra,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env(),
            )
            # Drain both pipes as the server writes: a full pipe would block its -J output.
            self._out: list[str] = []
            self._err: list[str] = []
            self._readers = [
                threading.Thread(target=_drain, args=(pipe, sink), daemon=True)
                for pipe, sink in ((self.proc.stdout, self._out), (self.proc.stderr, self._err))
            ]
            for r in self._readers:
                r.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                if all(bound(a, self.port) for a in self.addrs):
                    return
                time.sleep(0.02)
            self.stop()
        raise RuntimeError("could not start the bench server")

    def stop(self, timeout: float = 10) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for r in self._readers:
            r.join(timeout=5)
        err = "".join(self._err)
        assert_no_internal_error(err)
        return self.proc.returncode, "".join(self._out), err


def _drain(pipe: Any, sink: list[str]) -> None:
    for chunk in iter(lambda: pipe.read(4096), ""):
        sink.append(chunk)


def client(
    port: int,
    *args: str,
    addrs: list[str] | None = None,
    binds: list[str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "mrc",
        "bench",
        "-c",
        ",".join(addrs or SERVER_ADDRS),
        "-p",
        str(port),
    ]
    if binds is not None or addrs is None:
        cmd += ["-B", ",".join(binds or CLIENT_ADDRS)]
    proc = subprocess.run(
        [*cmd, *args], capture_output=True, text=True, timeout=timeout, env=env()
    )
    assert_no_internal_error(proc.stderr)
    return proc


def assert_no_internal_error(stderr: str) -> None:
    """Every bench run of the suite fails on an exception inside the transport, whatever the
    test itself checks (the bench also exits non-zero then)."""
    bad = [line for line in stderr.splitlines() if "internal error" in line]
    assert not bad, f"internal error in a bench process: {bad[0]}"


def json_docs(text: str) -> list[dict[str, Any]]:
    """Every JSON document in a stream of concatenated documents."""
    dec = json.JSONDecoder()
    docs, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return docs
        doc, i = dec.raw_decode(text, i)
        docs.append(doc)

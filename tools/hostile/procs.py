"""The bench processes under attack, and the kernel's UDP counters around them.

Holds `BenchProc` (one `python -m mrc bench` child on loopback: stdout and stderr in temporary
files, its own session, stopped with SIGTERM then SIGKILL), `bench_argv`, `free_port`,
`udp_bound` / `socket_drops` / `socket_backlog` (read from /proc/net/udp, without touching
the sockets) and
`udp_snmp` (the host's Udp counters from /proc/net/snmp). Deciding what a process's end means
(a crash, a failed transfer) is `tools.hostile.report`'s job.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import IO, Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER_ADDRS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
CLIENT_ADDRS = ["127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"]


class BenchProc:
    """One `mrc bench` process; `returncode` is None while it runs."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.argv = argv
        self._out: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (lives with self)
        self._err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=self._err,
            cwd=REPO_ROOT,
            env=env,
            start_new_session=True,
        )
        self.started = time.monotonic()
        self.ended: float | None = None
        self.signalled = False  # we sent SIGTERM (a clean stop, not a death)
        self.killed = False  # it outlived its time and got SIGKILL

    @property
    def returncode(self) -> int | None:
        rc = self.popen.poll()
        if rc is not None and self.ended is None:
            self.ended = time.monotonic()
        return rc

    def wait(self, timeout: float) -> int | None:
        """Wait up to `timeout` s; None if it is still running."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=max(0.0, timeout))
        return self.returncode

    def stop(self, grace: float = 10.0) -> int:
        """SIGTERM, then SIGKILL to its process group after `grace` seconds; its exit status."""
        if self.returncode is None:
            self.signalled = True
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            if self.wait(grace) is None:
                self.killed = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        rc = self.returncode
        assert rc is not None
        return rc

    def stdout(self) -> str:
        self._out.seek(0)
        return self._out.read().decode(errors="replace")

    def stderr(self) -> str:
        self._err.seek(0)
        return self._err.read().decode(errors="replace")

    def docs(self) -> list[dict[str, Any]]:
        """Every JSON document on its stdout (a server prints one per test)."""
        return json_docs(self.stdout())

    def close(self) -> None:
        self.stop(grace=2.0)
        self._out.close()
        self._err.close()


def json_docs(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a stream of concatenated documents; stops at the first bad byte."""
    dec = json.JSONDecoder()
    docs: list[dict[str, Any]] = []
    i = 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return docs
        try:
            doc, i = dec.raw_decode(text, i)
        except ValueError:
            return docs
        if isinstance(doc, dict):
            docs.append(doc)


def bench_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "mrc", "bench", *args]


def free_port(host: str = SERVER_ADDRS[0]) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _udp_rows() -> list[list[str]]:
    with open("/proc/net/udp") as f:
        return [line.split() for line in f.readlines()[1:]]


def _key(host: str, port: int) -> str:
    return f"{socket.inet_aton(host)[::-1].hex().upper()}:{port:04X}"


def udp_bound(hosts: list[str], port: int) -> bool:
    """Is a UDP socket bound to every host:port?"""
    bound = {row[1] for row in _udp_rows()}
    return all(_key(h, port) in bound for h in hosts)


def socket_drops(hosts: list[str], port: int) -> int:
    """Datagrams the kernel dropped at the sockets bound to hosts:port (the `drops` column of
    /proc/net/udp: a full receive buffer, a bad checksum), summed over the sockets."""
    want = {_key(h, port) for h in hosts}
    return sum(int(row[12]) for row in _udp_rows() if len(row) > 12 and row[1] in want)


def socket_backlog(hosts: list[str], port: int) -> int:
    """Bytes waiting in the receive queues of the sockets bound to hosts:port (the `rx_queue`
    column of /proc/net/udp, in the kernel's accounting), summed over the sockets."""
    want = {_key(h, port) for h in hosts}
    return sum(int(row[4].split(":")[1], 16) for row in _udp_rows() if row[1] in want)


def udp_snmp() -> dict[str, int]:
    """The host's Udp counters (InDatagrams, InErrors, RcvbufErrors, …) from /proc/net/snmp."""
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Udp:")]
    if len(rows) < 2:
        return {}
    return {k: int(v) for k, v in zip(rows[0][1:], rows[1][1:], strict=False)}

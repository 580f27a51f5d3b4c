"""`mrc switch` as a real process: one-line errors for bad input, and a relay on loopback.

Holds `SwitchProc` (start `python -m mrc switch` in its own process group, drain its pipes in
threads, wait for its "listening" line, stop it with a signal; the bench acceptance test uses it
too) and the tests of the command line itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from benchproc import env

ECT0, CE = 0x02, 0x03
UDP_SEGMENT = 103


def _drain(pipe: Any, sink: list[str]) -> None:
    for line in iter(pipe.readline, ""):  # by line: the "listening" line must show at once
        sink.append(line)


class SwitchProc:
    """`mrc switch ARGS` in its own process group; `stop()` returns (rc, stdout, stderr)."""

    def __init__(self, *args: str, ready_timeout: float = 10.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mrc", "switch", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
            start_new_session=True,
        )
        self._out: list[str] = []
        self._err: list[str] = []
        self._readers = [
            threading.Thread(target=_drain, args=(pipe, sink), daemon=True)
            for pipe, sink in ((self.proc.stdout, self._out), (self.proc.stderr, self._err))
        ]
        for r in self._readers:
            r.start()
        deadline = time.monotonic() + ready_timeout
        while "listening on" not in self.stderr and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        m = re.search(r"listening on (\S+), forwarding to \S+ from (\S+);", self.stderr)
        self.listen = _split(m.group(1)) if m else None
        self.source = _split(m.group(2)) if m else None

    @property
    def stderr(self) -> str:
        return "".join(self._err)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        for r in self._readers:
            r.join(timeout=5)
        return self.proc.returncode, "".join(self._out), self.stderr

    def kill(self) -> None:
        """Kill the whole process group (for `finally`); harmless once it has exited."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def _split(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def run_switch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mrc", "switch", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env(),
    )


BASE = ["--listen", "127.0.0.31:0", "--forward", "127.0.0.32:9", "--rate", "100M"]


def with_base(*args: str, drop: str = "") -> list[str]:
    """BASE plus `args` (argparse keeps the last value of a repeated flag), minus `drop`."""
    pairs = [BASE[i : i + 2] for i in range(0, len(BASE), 2)]
    return [x for pair in pairs if pair[0] != drop for x in pair] + list(args)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        with_base(drop="--rate"),
        with_base("--rate", "0"),
        with_base("--rate", "fast"),
        with_base("--rate", "-5M"),
        with_base("--rate", "nan"),
        with_base("--rate", "1e999"),
        with_base("--listen", "127.0.0.31"),
        with_base("--listen", "::1:4791"),
        with_base("--listen", "127.0.0.31:99999"),
        with_base("--forward", "127.0.0.32:0"),
        with_base("--queue", "0"),
        with_base("--queue", "12Q"),
        with_base("--trim-size", "43"),
        with_base("--trim-size", "big"),
        with_base("--queue", "256K", "--ecn-threshold", "300K"),
        with_base("-t", "-1"),
        with_base("-t", "0"),
        with_base("--reverse-rate", "10x"),
        with_base("--bogus"),
    ],
    ids=lambda a: " ".join(a[-2:]) or "no-args",
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str]) -> None:
    proc = run_switch(*argv)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert re.match(r"mrc( switch)?: error: ", lines[0]), lines[0]
    assert proc.stdout == ""


def test_socket_errors_are_one_line_and_exit_1() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.31", 0))
        port = busy.getsockname()[1]
        proc = run_switch(*with_base("--listen", f"127.0.0.31:{port}"))
    assert proc.returncode == 1
    assert proc.stderr == f"mrc switch: error: --listen 127.0.0.31:{port}: address already in use\n"
    proc = run_switch(*with_base("--listen", "192.0.2.1:4791"))
    assert proc.returncode == 1
    assert proc.stderr == (
        "mrc switch: error: --listen 192.0.2.1:4791: not an address of this host\n"
    )


def test_help_lists_the_flags() -> None:
    proc = run_switch("--help")
    assert proc.returncode == 0
    flags = "--listen --forward --rate --reverse-rate --queue --ecn-threshold --priority-queue"
    flags += " --trim-size --no-trim --last-hop --no-last-hop --realtime -t -J"
    for flag in flags.split():
        assert flag in proc.stdout


@pytest.fixture
def server() -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.32", 0))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    try:
        yield s
    finally:
        s.close()


def addr(s: socket.socket) -> str:
    host, port = s.getsockname()[:2]
    return f"{host}:{port}"


def recv_tos(s: socket.socket, timeout: float = 5.0) -> tuple[bytes, int, Any]:
    r, _, _ = select.select([s], [], [], timeout)
    assert r, "nothing arrived"
    data, anc, _, addr = s.recvmsg(65536, 64)
    tos = next((c[0] for _, kind, c in anc if kind == socket.IP_TOS), -1)
    return data, tos, addr


def test_relay_process_forwards_both_ways_and_reports_json(server: socket.socket) -> None:
    sw = SwitchProc(
        "--listen", "127.0.0.31:0", "--forward", addr(server),
        "--rate", "50M", "--queue", "8K", "-J",
    )  # fmt: skip
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert sw.listen is not None and sw.source is not None, sw.stderr
        client.bind(("127.0.0.33", 0))
        client.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, ECT0)
        client.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        # 12 data packets of 1 KiB in one GSO send (so in one read at the relay) into an
        # 8 KiB queue: 8 fit, the 4th to 8th CE-marked (more than 2 KiB ahead of them); the
        # other 4 are trimmed to 64 B with DSCP 21 and overtake them.
        burst = [bytes([0xC7, i]) + bytes(1022) for i in range(12)]
        gso = [(socket.SOL_UDP, UDP_SEGMENT, struct.pack("=H", 1024))]
        client.sendmsg([b"".join(burst)], gso, 0, sw.listen)
        got = [recv_tos(server) for _ in burst]
        assert all(a == sw.source for _, _, a in got)
        assert [(d, t) for d, t, _ in got] == [
            *((p[:64], 21 << 2 | ECT0) for p in burst[8:]),
            *zip(burst[:8], [ECT0] * 3 + [CE] * 5, strict=True),
        ]
        # The server answers the relay's socket; the answer reaches the client.
        for i in range(3):
            server.sendto(bytes([0xDC, i]) + bytes(38), sw.source)
        back = [recv_tos(client) for _ in range(3)]
        assert [d for d, _, _ in back] == [bytes([0xDC, i]) + bytes(38) for i in range(3)]
        assert all(a == sw.listen for _, _, a in back)
        rc, out, err = sw.stop(signal.SIGTERM)
    finally:
        client.close()
        sw.kill()
    assert rc == 0, err
    assert "Traceback" not in err
    doc = json.loads(out)
    fwd, rev = doc["end"]["forward"], doc["end"]["reverse"]
    assert fwd["received_packets"] == 12 and fwd["forwarded_packets"] == 12
    assert (fwd["trimmed"], fwd["ce_marked"], fwd["dropped_queue"]) == (4, 5, 0)
    assert fwd["socket_overflow"] == 0 and fwd["max_queue_bytes"] <= 8192
    assert rev["received_packets"] == rev["forwarded_packets"] == 3
    assert doc["start"]["rate_bps"] == 50e6 and doc["start"]["queue_bytes"] == 8192
    assert doc["start"]["ecn_threshold_bytes"] == 2048 and doc["start"]["last_hop"] is True
    for key in ("ce_marked", "dropped_priority", "mean_queue_delay_seconds"):
        assert key in fwd


def test_ipv6_relay_runs_for_t_seconds_and_prints_text() -> None:
    try:
        srv = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        srv.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    sw = SwitchProc(
        "--listen", "[::1]:0", "--forward", f"[::1]:{srv.getsockname()[1]}",
        "--rate", "1G", "--reverse-rate", "1G", "--no-last-hop", "-t", "1",
    )  # fmt: skip
    client = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        assert sw.listen is not None, sw.stderr
        client.bind(("::1", 0))
        client.sendto(b"\xca" + bytes(99), sw.listen)
        srv.settimeout(5)
        data, addr = srv.recvfrom(2048)
        assert data == b"\xca" + bytes(99)
        srv.sendto(b"\xdc" + bytes(40), addr)
        client.settimeout(5)
        assert client.recvfrom(2048)[0] == b"\xdc" + bytes(40)
        sw.proc.wait(timeout=10)  # -t 1: it stops by itself
        rc, out, err = sw.stop()
    finally:
        client.close()
        srv.close()
        sw.kill()
    assert rc == 0, err
    assert "DSCP 11" in err  # --no-last-hop
    assert out.startswith("mrc switch: ")
    assert "forward rx 1 pkts 100 B, tx 1 pkts 100 B" in out
    assert "reverse rx 1 pkts 41 B, tx 1 pkts 41 B" in out


def test_sigint_also_ends_with_the_report(server: socket.socket) -> None:
    sw = SwitchProc("--listen", "127.0.0.31:0", "--forward", addr(server), "--rate", "10M", "-J")
    try:
        assert sw.listen is not None, sw.stderr
        rc, out, err = sw.stop(signal.SIGINT)
    finally:
        sw.kill()
    assert rc == 0, err
    assert json.loads(out)["end"]["client"] is None

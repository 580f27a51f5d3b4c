"""What the README promises of `mrc bench` and no other test checked, on 4 loopback planes:
`-t` ends on time, a signal still gives a report, a dead server is one line, `--verify` sees a
wrong byte, every spray policy and `--cc none` deliver, and every plane carries its share."""

from __future__ import annotations

import json
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from benchproc import (
    CLIENT_ADDRS,
    SERVER_ADDRS,
    Server,
    assert_no_internal_error,
    client,
    env,
    json_docs,
)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server("-J")
    yield srv
    srv.stop()


def run_json(server: Server, *args: str) -> dict[str, Any]:
    proc = client(server.port, "-J", *args)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def popen_client(port: int, *args: str, servers: list[str] | None = None) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "mrc", "bench", "-c", ",".join(servers or SERVER_ADDRS),
           "-B", ",".join(CLIENT_ADDRS), "-p", str(port), *args]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env())  # fmt: skip


def test_a_timed_run_ends_near_its_time(server: Server) -> None:
    t0 = time.monotonic()
    doc = run_json(server, "-t", "2", "-i", "0.5")
    wall = time.monotonic() - t0
    sent = doc["end"]["sum_sent"]
    # Posting stops at 2 s; the WRITEs in flight then complete (a few ms on loopback).
    assert 2.0 <= sent["seconds"] <= 2.5, sent
    assert wall < 6.0
    assert doc["start"]["test_start"]["duration"] == 2.0
    assert doc["end"]["sum_received"]["bytes"] == sent["bytes"] > 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signalled_client_prints_the_report_so_far(server: Server, sig: int) -> None:
    proc = popen_client(server.port, "-t", "30", "-i", "0.2", "--verify")
    try:
        time.sleep(1.5)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_no_internal_error(err)
    assert proc.returncode == 1
    lines = out.splitlines()
    assert any(line.rstrip().endswith("sender") for line in lines), out
    assert "error: interrupted" in lines
    assert lines[-1] == "mrc Done."
    assert err.strip().splitlines() == ["mrc bench: test failed: interrupted"]


def test_a_server_killed_mid_transfer_is_one_line_for_the_client() -> None:
    srv = Server("-1")
    proc = popen_client(srv.port, "-t", "30", "-i", "0")
    try:
        time.sleep(1.5)
        srv.proc.kill()
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        srv.stop()
    assert proc.returncode == 1
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("mrc bench: test failed: connection closed"), err


class CorruptingRelay:
    """Plane 0 through a relay that flips one payload byte of the `nth` full data packet it
    forwards to the server (UDP checksums recomputed by the kernel: only --verify can tell)."""

    def __init__(self, listen: str, forward: tuple[str, int], nth: int) -> None:
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind((listen, 0))
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.bind((listen, 0))
        self.forward = forward
        self.nth = nth
        self.seen = 0
        self.flipped = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self.front.getsockname()[1])

    def _run(self) -> None:
        client_addr: Any = None
        while not self._stop.is_set():
            ready, _, _ = select.select([self.front, self.back], [], [], 0.05)
            for sock in ready:
                data, addr = sock.recvfrom(65535)
                if sock is self.front:
                    client_addr = addr
                    if len(data) > 4000:
                        self.seen += 1
                        if self.seen == self.nth:
                            buf = bytearray(data)
                            buf[-100] ^= 0x5A
                            data = bytes(buf)
                            self.flipped = True
                    self.back.sendto(data, self.forward)
                elif client_addr is not None:
                    self.front.sendto(data, client_addr)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.front.close()
        self.back.close()


def test_verify_reports_a_mismatch_when_a_byte_is_wrong() -> None:
    srv = Server("-1", "-J")
    relay = CorruptingRelay("127.0.0.20", (SERVER_ADDRS[0], srv.port), nth=200)
    try:
        # One plane (one -p serves every plane's address): the client's only plane goes to
        # the relay, which forwards it to the server's plane 0.
        proc = client(relay.port, "-J", "-n", "8M", "--verify", "--flowcell", "1",
                      addrs=["127.0.0.20"], binds=[CLIENT_ADDRS[0]])  # fmt: skip
    finally:
        relay.close()
        _, server_out, _ = srv.stop()
    assert relay.flipped
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stderr
    assert doc["end"]["mrc"]["integrity"] == "mismatch"
    assert doc["end"]["mrc"]["remote"]["mismatches"] >= 1
    (server_doc,) = json_docs(server_out)  # the receiver's own view
    assert server_doc["end"]["mrc"]["integrity"] == "mismatch"
    assert proc.stderr.strip().splitlines() == [
        "mrc bench: integrity check failed: received bytes did not match"
    ]


@pytest.mark.parametrize(("flag", "value"), [("--spray", "reps"), ("--spray", "oblivious"),
                                             ("--cc", "none")])  # fmt: skip
def test_every_spray_policy_and_cc_none_deliver(server: Server, flag: str, value: str) -> None:
    doc = run_json(server, "-n", "64M", "--verify", flag, value)
    m = doc["end"]["mrc"]
    assert m["integrity"] == "ok" and m["messages_verified"] == 64
    assert doc["start"]["test_start"][flag.lstrip("-")] == value


def test_every_plane_carries_its_share_on_loopback(server: Server) -> None:
    doc = run_json(server, "-n", "256M")
    sent = [row["bytes_sent"] for row in doc["end"]["mrc"]["planes"]]
    mean = sum(sent) / len(sent)
    # Equal balance (the default) on four identical planes: each within ±25 % of the mean.
    assert all(0.75 * mean <= b <= 1.25 * mean for b in sent), sent

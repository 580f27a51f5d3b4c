"""100 000 random and mutated datagrams at a listening `mrc bench -s`, idle and mid-transfer.

The server must stay up and keep serving (later runs succeed with integrity ok), count the junk
in drops_by_reason, and never print a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from benchproc import CLIENT_ADDRS, SERVER_ADDRS, Server, client, env, json_docs
from fuzzgen import capture, mutations, open_live_session

import mrc

N = 100_000
#: Datagrams sent between two 0.5 ms pauses. The server runs the build this process runs
#: (MRC_PURE is inherited); pure Python it reads about a third as fast, and at the compiled
#: pace the kernel dropped up to 62 % of the junk before the core could count it (the session
#: start failed 2 of 3 runs so on a slow host).
PACE = 256 if mrc.compiled() else 64


def blast(port: int, datagrams: list[bytes], pace: int = PACE) -> int:
    """Send round-robin to the 4 server planes from 127.0.0.50; returns how many went out.

    Every third datagram is aimed at a live connection on the server (its real QPN), so the
    session's own checks see junk too, not only the endpoint's routing.
    """
    sent = 0
    qpn, s = open_live_session((SERVER_ADDRS[0], port))
    live = qpn.to_bytes(3, "big")
    with s:
        s.setblocking(False)
        targets = [(a, port) for a in SERVER_ADDRS]
        for i, d in enumerate(datagrams):
            if i % 3 == 0 and len(d) >= 8 and d[0] not in (0xE0,):
                d = d[:5] + live + d[8:]
            try:
                s.sendto(d, targets[i % 4])
                sent += 1
            except (BlockingIOError, ConnectionRefusedError):
                pass
            if i % pace == pace - 1:
                time.sleep(0.0005)  # let the server keep up; kernel drops would hide nothing
                try:
                    while s.recv(65536):
                        pass  # REJECTs and the like
                except (BlockingIOError, ConnectionRefusedError):
                    pass
    return sent


def test_fuzzed_server_keeps_serving() -> None:
    packets = capture()
    assert len(packets) > 50
    junk_idle = list(mutations(packets, N, seed=1))
    junk_busy = list(mutations(packets, N, seed=2))
    srv = Server("-J")
    try:
        # 1. idle: junk first, then a normal verified run
        assert blast(srv.port, junk_idle) > N * 0.99
        time.sleep(0.3)
        assert srv.proc.poll() is None, "server died"
        proc = client(srv.port, "-J", "-n", "16M", "--verify")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["end"]["mrc"]["integrity"] == "ok"

        # 2. busy: junk while a verified transfer runs
        cmd = [
            sys.executable,
            "-m",
            "mrc",
            "bench",
            "-c",
            ",".join(SERVER_ADDRS),
            "-B",
            ",".join(CLIENT_ADDRS),
            "-p",
            str(srv.port),
            "-J",
            "-t",
            "3",
            "--verify",
        ]
        running = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()
        )
        try:
            time.sleep(0.4)
            assert blast(srv.port, junk_busy) > N * 0.99
            out, err = running.communicate(timeout=60)
        finally:
            if running.poll() is None:
                running.kill()
        assert running.returncode == 0, err
        doc = json.loads(out)
        assert doc["end"]["mrc"]["integrity"] == "ok"
        assert doc["end"]["mrc"]["messages_verified"] > 0
        assert srv.proc.poll() is None, "server died"
    finally:
        rc, out, err = srv.stop()
    assert rc == 0, err
    assert "Traceback" not in err and "internal error" not in err, err
    # Reports of the two real clients (the junk targets' connections may report too).
    docs = [d for d in json_docs(out) if d["end"]["mrc"]["messages_verified"] > 0]
    assert len(docs) == 2
    idle_drops = docs[0]["end"]["mrc"]["drops_by_reason"]
    busy_drops = docs[1]["end"]["mrc"]["drops_by_reason"]
    # Junk the kernel did not drop for lack of buffer reached the core and was counted by reason.
    assert sum(idle_drops.values()) > N * 0.5, idle_drops
    assert sum(busy_drops.values()) > N * 0.3, busy_drops
    assert any(k.startswith("decode") for k in idle_drops) and "unknown_qp" in idle_drops
    assert all(d["end"]["mrc"]["integrity"] == "ok" for d in docs)

"""The daemon's life cycle: systemd notifications (READY=1, WATCHDOG=1, STOPPING=1), SIGTERM in
the middle of a transfer (every WRITE reported ok is intact at the receiver, the rest are
reported failed, exit 0 within 5 s, the socket gone) and SIGHUP re-reading the peer list."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from .daemonproc import (
    PLANES_A,
    PLANES_B,
    DaemonProc,
    Memfd,
    daemon_pair,
    free_port,
    toml_config,
)

MIB = 1 << 20


def pattern(n: int) -> bytes:
    return bytes([n & 0xFF, 0x5A, (n * 13) & 0xFF, 0xA5]) * (MIB // 4)


def test_notifications_ready_watchdog_then_stopping(tmp_path: Path) -> None:
    config = toml_config("a", PLANES_A, free_port(), tmp_path / "a.sock", {})
    d = DaemonProc(tmp_path, "a", config, env={"WATCHDOG_USEC": "200000"})
    try:
        d.wait_ready()
        assert d.notify.wait_for("WATCHDOG=1", 2.0), d.notify.messages
        assert (tmp_path / "a.sock").exists()
        d.signal(signal.SIGTERM)
        assert d.notify.wait_for("STOPPING=1", 5.0), d.notify.messages
        assert d.wait(5) == 0
        first = d.notify.messages[0].splitlines()
        assert first[0] == "READY=1" and "STATUS=serving " + str(tmp_path / "a.sock") in first
        keys = [m.splitlines()[0] for m in d.notify.messages]
        assert keys.index("READY=1") < keys.index("WATCHDOG=1") < keys.index("STOPPING=1")
        assert not (tmp_path / "a.sock").exists()
        assert d.log().splitlines()[-1] == "mrc daemon: stopped"
    finally:
        d.stop()


def test_a_sigterm_right_after_ready_stops_the_daemon(tmp_path: Path) -> None:
    """systemd may stop a unit the moment it says READY=1: that SIGTERM must not be lost
    (it was, under uvloop, when it came before the daemon's main loop was running)."""
    for attempt in range(3):
        config = toml_config("a", PLANES_A, free_port(), tmp_path / f"a{attempt}.sock", {})
        d = DaemonProc(tmp_path, "a", config, env={"WATCHDOG_USEC": "200000"})
        try:
            d.wait_ready()
            d.signal(signal.SIGTERM)
            assert d.notify.wait_for("STOPPING=1", 5.0), (attempt, d.notify.messages)
            assert d.wait(5) == 0
        finally:
            d.stop()


def test_sigterm_mid_transfer_keeps_every_ok_write_intact(tmp_path: Path) -> None:
    # 256 MiB take about half a second here, the drain 20 ms: the stop always cuts the
    # transfer (96 MiB and a 100 ms drain let every write finish once in a clean-clone run).
    count = 256
    with daemon_pair(tmp_path, limits="drain_seconds = 0.02") as (a, b):
        dst, src = Memfd(count * MIB), Memfd(count * MIB)
        ca, cb = a.client(), b.client()
        try:
            region = dst.register(ca)
            source = src.register(cb)["region"]
            for i in range(count):
                src.map[i * MIB : (i + 1) * MIB] = pattern(i)
            cid = cb.call("connect", {"peer": "a"})["connection"]
            writes = [
                {"region": source, "offset": i * MIB, "length": MIB, "remote": region["handle"],
                 "remote_offset": i * MIB, "imm": i}
                for i in range(count)
            ]
            ids = cb.call("write", {"connection": cid, "writes": writes})["ids"]
            done: list[Any] = []
            while not done:
                done += cb.call("completions", {"connection": cid, "timeout": 5})["completions"]
            b.signal(signal.SIGTERM)
            stopped_at = time.monotonic()
            while True:
                try:
                    got = cb.call("completions", {"connection": cid, "timeout": 1})
                except (EOFError, ConnectionError):
                    break
                done += got["completions"]
            assert b.wait(5) == 0
            assert time.monotonic() - stopped_at < 5
            assert not b.socket_path.exists()
            imms: list[int] = []
            while True:
                got = ca.call("immediates", {"timeout": 0.5})["immediates"]
                if not got:
                    break
                imms += [m["imm"] for m in got]
        finally:
            ca.close()
            cb.close()
        assert [d["id"] for d in done] == ids  # every write reported, in posting order
        statuses = [d["status"] for d in done]
        ok = [i for i, s in enumerate(statuses) if s == "ok"]
        assert ok == list(range(len(ok)))  # completions come in MSN order
        assert set(statuses[len(ok):]) <= {"cancelled", "connection_lost"}
        assert 1 <= len(ok) < count, statuses
        for i in ok:
            assert dst.map[i * MIB : (i + 1) * MIB] == pattern(i), f"write {i} reported ok"
        # The receiver's application saw the immediate of every ok write, in order (and
        # perhaps of writes that landed but whose acknowledgement the stop overtook).
        assert imms[: len(ok)] == ok and imms == list(range(len(imms)))
        dst.close()
        src.close()
        assert "stopping: draining" in b.log()
        lines = b.log().splitlines()
        assert lines[-1] == "mrc daemon: stopped"
        assert any("connection 1 with a closed: daemon shutting down" in line for line in lines)


def test_sighup_rereads_the_peer_list(tmp_path: Path) -> None:
    port = free_port()
    sock = tmp_path / "a.sock"
    d = DaemonProc(tmp_path, "a", toml_config("a", PLANES_A, port, sock, {"b": PLANES_B}))
    try:
        d.wait_ready()
        with d.client() as c:
            assert [p["name"] for p in c.call("peers")] == ["b"]
            d.config_path.write_text(
                toml_config("a", PLANES_A, port, sock, {"c": ["127.0.0.8", "127.0.0.9"]})
            )
            d.signal(signal.SIGHUP)
            deadline = time.monotonic() + 5
            while [p["name"] for p in c.call("peers")] != ["c"]:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert c.error("connect", {"peer": "b"})["code"] == -32001
            # A file with a mistake changes nothing and says why.
            d.config_path.write_text("host = \n")
            d.signal(signal.SIGHUP)
            deadline = time.monotonic() + 5
            while "reload of" not in d.log():
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert [p["name"] for p in c.call("peers")] == ["c"]
        assert "peers unchanged: not valid TOML" in d.log()
    finally:
        d.stop()

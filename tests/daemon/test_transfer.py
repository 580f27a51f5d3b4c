"""Two daemons on loopback planes and applications on each, speaking the control protocol by
hand: regions in shared memory, a connection, WRITEs with immediates, completions in posting
order, bytes verified; every argument check of a WRITE; remote access errors; an application
killed with SIGKILL; messages between applications; and a Prometheus scrape that agrees with
what moved."""

from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .daemonproc import DaemonProc, Memfd, RawClient, daemon_pair, free_tcp_port

MIB = 1 << 20
CAP = 64  # max_outstanding_writes of this module's daemons
APP = Path(__file__).resolve().parent / "app_proc.py"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProc, DaemonProc]]:
    tmp = tmp_path_factory.mktemp("xfer")
    ports = free_tcp_port(), free_tcp_port()
    with daemon_pair(
        tmp,
        limits=f"max_outstanding_writes = {CAP}\ndrain_seconds = 1",
        args_a=("--metrics", f"127.0.0.1:{ports[0]}"),
        args_b=("--metrics", f"127.0.0.1:{ports[1]}"),
    ) as (a, b):
        a.metrics_port, b.metrics_port = ports  # type: ignore[attr-defined]
        yield a, b


def pattern(n: int, size: int) -> bytes:
    block = bytes((n * 7 + i) & 0xFF for i in range(251))
    return (block * (size // len(block) + 1))[:size]


def wait_completions(c: RawClient, conn: int, count: int, timeout: float = 20) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        assert time.monotonic() < deadline, f"only {len(out)} of {count} completions"
        out += c.call("completions", {"connection": conn, "timeout": 1})["completions"]
    return out


def wait_immediates(c: RawClient, count: int, timeout: float = 20, **params: Any) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        assert time.monotonic() < deadline, f"only {len(out)} of {count} immediates"
        out += c.call("immediates", {"timeout": 1, **params})["immediates"]
    return out


def test_writes_with_immediates_land_and_complete_in_order(
    pair: tuple[DaemonProc, DaemonProc],
) -> None:
    a, b = pair
    dst, src = Memfd(8 * MIB), Memfd(8 * MIB)
    with a.client() as ca, b.client() as cb:
        region = dst.register(ca, "inbox")
        handle = region["handle"]
        source = src.register(cb, "outbox")["region"]
        for i in range(8):
            src.map[i * MIB : (i + 1) * MIB] = pattern(i, MIB)
        conn = cb.call("connect", {"peer": "a"})
        assert conn["peer"] == "a" and conn["state"] == "established"
        cid = conn["connection"]
        writes = [
            {"region": source, "offset": i * MIB, "length": MIB, "remote": handle,
             "remote_offset": (7 - i) * MIB, "imm": 1000 + i}
            for i in range(8)
        ]
        ids = cb.call("write", {"connection": cid, "writes": writes})["ids"]
        assert len(ids) == 8 and ids == sorted(ids)
        done = wait_completions(cb, cid, 8)
        assert [(d["id"], d["connection"], d["status"], d["bytes"]) for d in done] == [
            (i, cid, "ok", MIB) for i in ids
        ]
        imms = wait_immediates(ca, 8)
        assert [(m["region"], m["imm"], m["peer"]) for m in imms] == [
            (region["region"], 1000 + i, "b") for i in range(8)
        ]
        for i in range(8):
            assert dst.map[(7 - i) * MIB : (8 - i) * MIB] == pattern(i, MIB), f"write {i}"
        row = next(r for r in cb.call("connections") if r["connection"] == cid)
        assert (row["writes_posted"], row["bytes_posted"], row["outstanding"]) == (8, 8 * MIB, 0)
        # A poll with nothing to hand over answers at once, empty.
        assert cb.call("completions", {"connection": cid}) == {"completions": []}
    dst.close()
    src.close()


def test_every_argument_check_of_a_write(pair: tuple[DaemonProc, DaemonProc]) -> None:
    a, b = pair
    dst, src = Memfd(MIB), Memfd(MIB)
    with a.client() as ca, b.client() as cb, b.client() as other:
        handle = dst.register(ca)["handle"]
        source = src.register(cb)["region"]
        foreign = Memfd(4096)
        foreign_region = foreign.register(other)["region"]
        cid = cb.call("connect", {"peer": "a"})["connection"]
        good = {"region": source, "offset": 0, "length": 4096, "remote": handle}

        def refused(changes: dict[str, Any], code: int, words: str, index: int = 1) -> None:
            bad = {**good, **changes}
            bad = {k: v for k, v in bad.items() if v is not None}
            err = cb.error("write", {"connection": cid, "writes": [good, bad]})
            assert err["code"] == code, err
            assert err["message"].startswith(f"write {index}: ") and words in err["message"], err
            assert err["data"]["index"] == index

        refused({"length": 0}, -32602, "length must be 1..2147483648")
        refused({"length": (1 << 31) + 1}, -32602, "length must be 1..2147483648")
        refused({"offset": MIB - 100}, -32005, "outside region")
        refused({"offset": -1}, -32602, "offset must be an integer")
        refused({"remote_offset": MIB - 4095}, -32005, "outside the remote region")
        refused({"remote": {**handle, "va": (1 << 64) - 2048, "length": 1 << 20}}, -32602,
                "overflows 64 bits")
        refused({"remote": {**handle, "rkey": 1 << 32}}, -32602, "rkey must be an integer")
        refused({"remote": {**handle, "host": "c"}}, -32602, "a region on 'c'")
        refused({"remote": {"host": "a", "rkey": 1}}, -32602, "must be a region handle")
        refused({"imm": 1 << 32}, -32602, "imm must be an integer 0..4294967295")
        refused({"imm": -1}, -32602, "imm")
        refused({"region": foreign_region}, -32002, "not a region of this client")
        refused({"region": 999}, -32002, "not a region of this client")
        refused({"colour": "red"}, -32602, "colour is not a field")
        err = cb.error("write", {"connection": cid, "writes": [good] * (CAP + 1)})
        assert err["code"] == -32006 and err["data"]["index"] == CAP
        err = cb.error("write", {"connection": cid, "writes": []})
        assert err["code"] == -32602 and "writes" in err["message"]
        # All or nothing: none of the refused calls posted a WRITE.
        row = next(r for r in cb.call("connections") if r["connection"] == cid)
        assert row["writes_posted"] == 0 and row["outstanding"] == 0
        # Another client cannot write on this client's connection.
        assert other.error("write", {"connection": cid, "writes": [good]})["code"] == -32003
        ids = cb.call("write", {"connection": cid, "writes": [good]})["ids"]
        assert [d["status"] for d in wait_completions(cb, cid, 1)] == ["ok"]
        assert len(ids) == 1
        foreign.close()
    dst.close()
    src.close()


def test_a_write_under_a_wrong_rkey_fails_at_the_writer(
    pair: tuple[DaemonProc, DaemonProc],
) -> None:
    a, b = pair
    dst, src = Memfd(MIB), Memfd(MIB)
    with a.client() as ca, b.client() as cb:
        handle = dst.register(ca)["handle"]
        source = src.register(cb)["region"]
        cid = cb.call("connect", {"peer": "a"})["connection"]
        forged = {**handle, "rkey": handle["rkey"] ^ 0x5A5A}
        writes = [
            {"region": source, "offset": 0, "length": 8192, "remote": forged, "imm": 1},
            {"region": source, "offset": 0, "length": 8192, "remote": handle, "imm": 2},
        ]
        cb.call("write", {"connection": cid, "writes": writes})
        done = wait_completions(cb, cid, 2)
        assert [(d["status"], d["bytes"]) for d in done] == [("remote_access_error", 0),
                                                             ("ok", 8192)]
        # A failed WRITE_WITH_IMM raises no immediate.
        assert [m["imm"] for m in wait_immediates(ca, 1)] == [2]
        assert ca.call("immediates", {"timeout": 0.2}) == {"immediates": []}
    dst.close()
    src.close()


def test_a_killed_application_loses_its_regions_and_others_go_on(
    pair: tuple[DaemonProc, DaemonProc],
) -> None:
    a, b = pair
    app = subprocess.Popen(
        [sys.executable, str(APP), str(a.socket_path), "hold", str(MIB)],
        stdout=subprocess.PIPE,
    )
    keep, src = Memfd(MIB), Memfd(MIB)
    try:
        assert app.stdout is not None
        dead_handle = json.loads(app.stdout.readline())
        with a.client() as ca, b.client() as cb:
            kept = keep.register(ca)["handle"]
            source = src.register(cb)["region"]
            src.map[:] = pattern(3, MIB)
            cid = cb.call("connect", {"peer": "a"})["connection"]
            assert dead_handle["region"] in [r["region"] for r in ca.call("regions")]
            app.send_signal(signal.SIGKILL)
            app.wait(10)
            deadline = time.monotonic() + 10
            while dead_handle["region"] in [r["region"] for r in ca.call("regions")]:
                assert time.monotonic() < deadline, "the dead application's region stayed"
                time.sleep(0.01)
            writes = [
                {"region": source, "offset": 0, "length": MIB, "remote": dead_handle, "imm": 1},
                {"region": source, "offset": 0, "length": MIB, "remote": kept, "imm": 2},
            ]
            cb.call("write", {"connection": cid, "writes": writes})
            done = wait_completions(cb, cid, 2)
            assert [d["status"] for d in done] == ["remote_access_error", "ok"]
            assert [m["imm"] for m in wait_immediates(ca, 1)] == [2]
            assert keep.map[:] == pattern(3, MIB)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait(10)
        keep.close()
        src.close()


def test_a_writer_killed_mid_write_is_cleaned_up(pair: tuple[DaemonProc, DaemonProc]) -> None:
    a, b = pair
    dst = Memfd(MIB)
    with a.client() as ca, b.client() as cb:
        handle = dst.register(ca)["handle"]
        before = {r["connection"] for r in cb.call("connections")}
        app = subprocess.Popen(
            [sys.executable, str(APP), str(b.socket_path), "write", "a", json.dumps(handle)],
            stdout=subprocess.PIPE,
        )
        try:
            assert app.stdout is not None and app.stdout.readline().strip() == b"writing"
            time.sleep(0.2)  # WRITEs in flight
            app.send_signal(signal.SIGKILL)
            app.wait(10)
        finally:
            if app.poll() is None:
                app.kill()
        deadline = time.monotonic() + 10
        while {r["connection"] for r in cb.call("connections")} - before:
            assert time.monotonic() < deadline, "the dead writer's connection stayed"
            time.sleep(0.01)
        assert cb.call("regions") == [] or all(r["kind"] == "mailbox" for r in cb.call("regions"))
        # The daemon goes on serving: a new connection writes.
        src = Memfd(4096)
        source = src.register(cb)["region"]
        cid = cb.call("connect", {"peer": "a"})["connection"]
        write = {"region": source, "offset": 0, "length": 4096, "remote": handle}
        cb.call("write", {"connection": cid, "writes": [write]})
        assert [d["status"] for d in wait_completions(cb, cid, 1)] == ["ok"]
        src.close()
    dst.close()


def test_deregistering_a_region_cancels_the_writes_reading_it(
    pair: tuple[DaemonProc, DaemonProc],
) -> None:
    a, b = pair
    dst, src = Memfd(4 * MIB), Memfd(4 * MIB)
    with a.client() as ca, b.client() as cb:
        handle = dst.register(ca)["handle"]
        source = src.register(cb)["region"]
        cid = cb.call("connect", {"peer": "a"})["connection"]
        writes = [{"region": source, "offset": 0, "length": 4 * MIB, "remote": handle}] * 32
        cb.call("write", {"connection": cid, "writes": writes})
        assert cb.call("deregister_region", {"region": source}) == {}
        done = wait_completions(cb, cid, 32)
        statuses = [d["status"] for d in done]
        assert set(statuses) <= {"ok", "cancelled"} and statuses[-1] == "cancelled"
        # In posting order: every ok before the first cancelled.
        assert statuses == sorted(statuses, key=lambda s: s != "ok")
        row = next(r for r in cb.call("connections") if r["connection"] == cid)
        assert row["state"] == "closed" and row["close_reason"] == f"region {source} deregistered"
        err = cb.error("write", {"connection": cid, "writes": writes[:1]})
        assert err["code"] == -32007
        assert cb.call("disconnect", {"connection": cid}) == {}
        assert cb.error("disconnect", {"connection": cid})["code"] == -32003
    dst.close()
    src.close()


def test_messages_between_applications(pair: tuple[DaemonProc, DaemonProc]) -> None:
    a, b = pair
    with a.client() as ca, b.client() as cb, a.client() as other:
        assert ca.call("bind", {"endpoint": "handles"}) == {}
        assert other.error("bind", {"endpoint": "handles"})["code"] == -32602
        for n in range(20):  # more than the mailbox's slots: slots are reused
            data = base64.b64encode(bytes([n]) * (n * 200 + 1)).decode()
            assert cb.call("send_message", {"peer": "a", "endpoint": "handles",
                                             "data": data}) == {}
        got: list[Any] = []
        while len(got) < 20:
            got += ca.call("recv_message", {"endpoint": "handles", "timeout": 2})["messages"]
        assert [(m["peer"], base64.b64decode(m["data"])) for m in got] == [
            ("b", bytes([n]) * (n * 200 + 1)) for n in range(20)
        ]
        # A message may arrive before its endpoint is bound: it waits there.
        too_big = base64.b64encode(b"x" * 4097).decode()
        err = ca.error("send_message", {"peer": "b", "endpoint": "r", "data": too_big})
        assert err["code"] == -32602 and "4096" in err["message"]
        err = ca.error("send_message", {"peer": "b", "endpoint": "r", "data": "%%%"})
        assert err["code"] == -32602 and "base64" in err["message"]
        reply = base64.b64encode(b"x" * 4096).decode()
        assert ca.call("send_message", {"peer": "b", "endpoint": "r", "data": reply}) == {}
        assert cb.call("bind", {"endpoint": "r"}) == {}
        msgs = cb.call("recv_message", {"endpoint": "r", "timeout": 5})["messages"]
        assert [(m["peer"], m["data"]) for m in msgs] == [("a", reply)]


def test_the_grafana_dashboard_queries_only_what_the_daemon_exposes(
    pair: tuple[DaemonProc, DaemonProc],
) -> None:
    from tools.grafana import dashboard

    # The checked-in file is what the builder makes (`python -m tools.grafana.dashboard`).
    assert dashboard.OUT.read_text() == dashboard.render()
    a, b = pair
    # One WRITE from b to a, so the per-peer and per-status families have samples to show
    # their labels.
    dst, src = Memfd(MIB), Memfd(MIB)
    with a.client() as ca, b.client() as cb:
        handle = dst.register(ca)["handle"]
        source = src.register(cb)["region"]
        cid = cb.call("connect", {"peer": "a"})["connection"]
        cb.call("write", {"connection": cid, "writes": [
            {"region": source, "offset": 0, "length": MIB, "remote": handle, "remote_offset": 0}
        ]})  # fmt: skip
        assert [d["status"] for d in wait_completions(cb, cid, 1)] == ["ok"]
    dst.close()
    src.close()
    port: int = b.metrics_port  # type: ignore[attr-defined]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    queries = [t["expr"] for p in dashboard.build()["panels"] for t in p.get("targets", [])]
    assert len(queries) >= 20
    checked = 0
    for expr in queries:
        names = re.findall(r"\b(mrc_[a-z_]+)\b", expr)
        assert names, expr
        for name in names:
            family = families.get(name.removesuffix("_total"))
            assert family is not None, f"{name} is not exposed: {expr}"
            by = re.search(r"by \(([a-z_, ]+)\)", expr)
            if by and family.samples:
                wanted = {label.strip() for label in by.group(1).split(",")}
                assert wanted <= set(family.samples[0].labels), (expr, family.samples[0].labels)
                checked += 1
    # Families with no sample yet (no retransmits, no refusals) show no labels; most do.
    assert checked >= 8, checked


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def test_a_scrape_agrees_with_what_moved(pair: tuple[DaemonProc, DaemonProc]) -> None:
    a, b = pair
    port_a: int = a.metrics_port  # type: ignore[attr-defined]
    port_b: int = b.metrics_port  # type: ignore[attr-defined]
    before_a, before_b = scrape(port_a), scrape(port_b)
    size = 32 * MIB
    dst, src = Memfd(size), Memfd(size)
    with a.client() as ca, b.client() as cb:
        handle = dst.register(ca)["handle"]
        source = src.register(cb)["region"]
        cid = cb.call("connect", {"peer": "a"})["connection"]
        writes = [{"region": source, "offset": i * MIB, "length": MIB, "remote": handle,
                   "remote_offset": i * MIB} for i in range(32)]
        cb.call("write", {"connection": cid, "writes": writes})
        assert {d["status"] for d in wait_completions(cb, cid, 32)} == {"ok"}
        status_a = ca.call("status")
        after_a, after_b = scrape(port_a), scrape(port_b)
    dst.close()
    src.close()
    moved = {}
    for plane in ("0", "1"):
        got = total(after_a, "mrc_peer_bytes_received_total", peer="b", plane=plane)
        got -= total(before_a, "mrc_peer_bytes_received_total", peer="b", plane=plane)
        sent = total(after_b, "mrc_peer_bytes_sent_total", peer="a", plane=plane)
        sent -= total(before_b, "mrc_peer_bytes_sent_total", peer="a", plane=plane)
        moved[plane] = got
        # What b's connections sent on a plane, a's received: loopback loses nothing; the
        # two sides count a handshake's few control datagrams differently.
        assert abs(got - sent) <= 4096, (got, sent)
        # The plane sockets carried the connections' packets and a few handshake datagrams
        # (before this test, also the late packets of connections closed mid-transfer,
        # which no connection counts: so the deltas).
        sock = total(after_a, "mrc_plane_bytes_received_total", plane=plane)
        sock -= total(before_a, "mrc_plane_bytes_received_total", plane=plane)
        peers = total(after_a, "mrc_peer_bytes_received_total", plane=plane)
        peers -= total(before_a, "mrc_peer_bytes_received_total", plane=plane)
        assert 0 <= sock - peers <= 4096, (sock, peers)
        assert total(after_a, "mrc_plane_bytes_received_total", plane=plane) >= total(
            after_a, "mrc_peer_bytes_received_total", plane=plane)
        row = next(p for p in status_a["planes"] if p["plane"] == int(plane))
        # status came just before the scrape, after the transfer
        assert row["bytes_received"] <= total(after_a, "mrc_plane_bytes_received_total",
                                              plane=plane)
        assert row["bytes_received"] >= total(before_a, "mrc_plane_bytes_received_total",
                                              plane=plane) + size * 0.2
        assert row["state"] == "up"
    # Every payload byte arrived once, with headers (about 1.2% at MTU 4096) and ACKs on top.
    assert size <= sum(moved.values()) <= size * 1.05
    assert min(moved.values()) >= size * 0.2, moved  # both planes carried the transfer
    assert total(after_b, "mrc_writes_total", status="ok") - total(
        before_b, "mrc_writes_total", status="ok") == 32
    assert total(after_a, "mrc_regions") == total(before_a, "mrc_regions") + 1
    assert total(after_a, "mrc_evs", peer="b") > 0

"""`mrc bench` client and server as real processes over 4 loopback planes (127.0.0.x)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from benchproc import Server, client, env, json_docs

from mrc.cli.bench.stream import next_tick


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server("-J")
    yield srv
    rc, out, err = srv.stop()
    assert rc == 0, err
    assert "Traceback" not in err and "internal error" not in err, err
    for doc in json_docs(out):  # the server's own view of every test it ran
        assert doc["end"]["mrc"]["integrity"] in ("ok", "not-checked"), doc.get("error")


def run_json(server: Server, *args: str) -> dict[str, Any]:
    proc = client(server.port, "-J", *args)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_verify_over_4_planes_and_json_schema(server: Server) -> None:
    doc = run_json(server, "-n", "48M", "--verify", "-i", "0.1")
    start, end = doc["start"], doc["end"]
    ts = start["test_start"]
    for key in (
        "protocol",
        "num_planes",
        "blksize",
        "duration",
        "bytes",
        "reverse",
        "verify",
        "interval",
        "payload_mtu",
        "ev_per_plane",
        "mpr",
        "inject",
        "port",
    ):
        assert key in ts
    assert ts["num_planes"] == 4 and ts["bytes"] == 48 << 20 and ts["verify"] is True
    assert doc["intervals"], "no interval reports"
    for iv in doc["intervals"]:
        assert set(iv["sum"]) >= {
            "start",
            "end",
            "seconds",
            "bytes",
            "bits_per_second",
            "retransmits",
            "snd_cwnd",
        }
        assert iv["sum"]["snd_cwnd"] >= 4096
        assert [p["plane"] for p in iv["planes"]] == [0, 1, 2, 3]
        # The writer's bytes in flight and NSCC's plane cap at the end of the interval.
        keys = {"plane", "bytes", "packets", "in_flight", "cap"}
        assert all(set(p) == keys for p in iv["planes"])
        assert all(p["in_flight"] >= 0 and p["cap"] >= 2 * 4096 for p in iv["planes"])
    assert set(end["sum_sent"]) == {
        "start",
        "end",
        "seconds",
        "bytes",
        "bits_per_second",
        "retransmits",
    }
    assert set(end["sum_received"]) == {"start", "end", "seconds", "bytes", "bits_per_second"}
    assert end["sum_sent"]["bytes"] == end["sum_received"]["bytes"] == 48 << 20
    assert set(end["cpu_utilization_percent"]) >= {
        "host_total",
        "host_user",
        "host_system",
        "remote_total",
    }
    m = end["mrc"]
    for key in (
        "integrity",
        "messages_verified",
        "planes",
        "evs",
        "retransmits_by_cause",
        "drops_by_reason",
        "trimmed_received",
        "nacks_sent",
        "nacks_received",
        "probes_sent",
        "probes_answered",
        "longest_stall_seconds",
        "longest_stall_at_seconds",
        "events",
    ):
        assert key in m
    assert m["integrity"] == "ok" and m["messages_verified"] == 48
    assert set(m["retransmits_by_cause"]) >= {"rack", "rto", "nack_trimmed", "nack_other"}
    for row in m["planes"]:
        assert set(row) >= {
            "plane",
            "local",
            "remote",
            "state",
            "packets_sent",
            "bytes_sent",
            "packets_received",
            "bytes_received",
            "retransmits",
        }
        assert row["bytes_sent"] > 1 << 20, f"plane {row['plane']} carried no traffic"
    assert sum(iv["sum"]["bytes"] for iv in doc["intervals"]) >= 48 << 20


def test_plane_blackholed_midway_still_verifies(server: Server) -> None:
    doc = run_json(server, "-t", "2", "--verify", "--inject", "plane-down=2@0.8")
    m = doc["end"]["mrc"]
    assert m["integrity"] == "ok" and m["messages_verified"] > 0
    assert doc["start"]["test_start"]["inject"] == ["plane-down=2@0.8"]
    faults = [e for e in m["events"] if e["event"] == "fault"]
    assert [(e["plane"], e["t"]) for e in faults] == [(2, pytest.approx(0.8, abs=0.01))]
    assert m["io_drops"]["injected_plane_down"] > 0
    # The core noticed by itself: plane 2 went down (or its paths were retired) after 0.8 s.
    noticed = [
        e for e in m["events"] if e["plane"] == 2 and e["event"] != "fault" and e["t"] >= 0.79
    ]
    assert noticed, m["events"]
    late = [iv for iv in doc["intervals"] if iv["sum"]["start"] >= 1.2]
    assert late and all(iv["sum"]["bytes"] > 0 for iv in late)


def test_reverse(server: Server) -> None:
    doc = run_json(server, "-R", "-n", "24M", "--verify", "-l", "256K")
    assert doc["start"]["test_start"]["reverse"] == 1
    m = doc["end"]["mrc"]
    assert m["integrity"] == "ok" and m["messages_verified"] == 96
    assert doc["end"]["sum_received"]["bytes"] == 24 << 20
    assert all(row["bytes_received"] > 0 for row in m["planes"])


def test_text_output_like_iperf3(server: Server) -> None:
    proc = client(server.port, "-n", "8M", "--verify", "-i", "0.05")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("Connecting to host 127.0.0.2,127.0.0.3,127.0.0.4,127.0.0.5")
    assert any(line.startswith("[ ID] Interval") and "Retr" in line for line in lines)
    assert any(line.rstrip().endswith("sender") for line in lines)
    assert any(line.rstrip().endswith("receiver") for line in lines)
    assert "integrity: ok (8 messages verified)" in lines
    assert lines[-1] == "mrc Done."


def test_ipv6_single_plane() -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    srv = Server("-1", "-J", addrs=["::1"])
    try:
        proc = client(srv.port, "-J", "-n", "8M", "--verify", addrs=["::1"], binds=["::1"])
        assert proc.returncode == 0, proc.stderr
        m = json.loads(proc.stdout)["end"]["mrc"]
        assert m["integrity"] == "ok" and m["planes"][0]["remote"].startswith("[::1]:")
    finally:
        rc, _, err = srv.stop()
    assert rc == 0 and "Traceback" not in err


def test_demo_in_one_process() -> None:
    proc = run_cli_demo("-n", "24M", "-i", "0.5")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "integrity: ok (24 messages verified)" in out
    assert "s  plane 2: plane-down injected" in out
    assert out.rstrip().endswith("mrc Done.")
    # The report tells what happened once: no event text repeats on the next line.
    texts = [line.split(" s  ", 1)[1] for line in out.splitlines() if line.startswith("event:")]
    assert texts and all(a != b for a, b in itertools.pairwise(texts)), texts
    assert sum("retired on plane 2" in t for t in texts) <= 2, texts


def run_cli_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mrc", "bench", "--demo", *args],
        capture_output=True, text=True, timeout=60, env=env(),
    )



def test_a_late_tick_skips_the_ticks_it_overran() -> None:
    # Ticks every 10 ms; tick 3 fires at 0.0305 s (on time): tick 4 is next.
    assert next_tick(3, 0.0305, 0.01) == 4
    # Tick 3 fires 47 ms late, at 0.077 s: ticks 4..7 are gone, the next ends at 0.08 s.
    assert next_tick(3, 0.077, 0.01) == 8
    # A timer that fires a little early never schedules the same tick again.
    assert next_tick(3, 0.0299, 0.01) == 4


def test_every_interval_spans_real_time(server: Server) -> None:
    doc = run_json(server, "-n", "64M", "-i", "0.01")
    sums = [iv["sum"] for iv in doc["intervals"]]
    assert len(sums) > 3
    widths = [s["end"] - s["start"] for s in sums]
    assert min(widths) > 0, [w for w in widths if w <= 0]
    assert all(a["end"] == b["start"] for a, b in itertools.pairwise(sums))

"""`mrc bench --trace FILE` on real processes over 4 loopback planes: the trace of a run with a
blackholed plane agrees with its -J document on both sides, a 10 s trace stays under the
documented bound, and a bad path fails at once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from benchproc import Server, client, env, json_docs

from mrc.core.trace import CC_SAMPLE_SECONDS, RECORDS_PER_SECOND

#: The bound docs/DESIGN.md §10 ("Traces") promises for a 10 s run.
TEN_SECOND_BOUND = 8 << 20
CAUSES = {"rack", "rto", "nack_trimmed", "nack_other", "plane_down", "local", "completion",
          "tail_probe", "silent"}


def read_trace(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return lines[0], lines[1:]


def check_shape(header: dict[str, Any], records: list[dict[str, Any]], doc: dict[str, Any]) -> None:
    """What every trace holds: the header of its run, records in time order, `end` last."""
    assert header == {
        "format": "mrc-trace",
        "version": 1,
        "role": doc["start"]["role"],
        "qpn": doc["start"]["qpn"],
        "peer_qpn": doc["start"]["peer_qpn"],
        "planes": [0, 1, 2, 3],
        "ev_per_plane": 16,
        "start_unix": pytest.approx(time.time(), abs=120),
        "limits": {
            "records_per_second": RECORDS_PER_SECOND,
            "cc_sample_seconds": CC_SAMPLE_SECONDS,
        },
    }
    ts = [r["t"] for r in records]
    assert ts == sorted(ts) and ts[0] >= 0
    end = records[-1]
    assert end["kind"] == "end" and [r for r in records if r["kind"] == "end"] == [end]
    assert end["records"] == len(records) + 1  # the header counts
    assert end["suppressed"] >= 0
    # The trace's EV records are the -J document's EV timeline, record for record.
    evs = [{k: v for k, v in r.items() if k != "kind"} for r in records if r["kind"] == "ev"]
    assert evs == doc["end"]["mrc"]["ev_timeline"]
    assert doc["end"]["mrc"]["ev_timeline_truncated"] is False
    starts = [r for r in evs if r["reason"] == "start"]
    assert len(starts) == 4 * 32 and {r["state"] for r in starts} == {"good", "backup"}


def test_a_blackholed_plane_in_the_trace_and_the_json_alike(tmp_path: Path) -> None:
    server_trace, client_trace = tmp_path / "server.jsonl", tmp_path / "client.jsonl"
    server = Server("-1", "-J", "--trace", str(server_trace))
    try:
        proc = client(
            server.port,
            "-t", "2", "--verify", "--inject", "plane-down=2@0.8", "-J",
            "--trace", str(client_trace),
        )  # fmt: skip
    finally:
        rc, out, err = server.stop()
    assert proc.returncode == 0, proc.stderr
    assert rc == 0, err
    doc = json.loads(proc.stdout)
    header, records = read_trace(client_trace)
    check_shape(header, records, doc)
    assert header["role"] == "client"
    # The fault, when the bench injected it.
    (fault,) = [r for r in records if r["kind"] == "fault"]
    assert fault["plane"] == 2 and fault["t"] == pytest.approx(0.8, abs=0.01)
    assert fault["detail"] == "plane-down injected at 0.8 s"
    # The core saw plane 2 fail after it: its EVs retired or the plane down.
    after = [r for r in records if r.get("plane") == 2 and r["t"] >= fault["t"]]
    assert any(r["kind"] == "ev" and r["state"] == "retired" for r in after) or any(
        r["kind"] == "plane" and r["state"] == "down" for r in after
    ), after[:20]
    # Its lost packets were resent, with their causes.
    resent = [r for r in records if r["kind"] == "retransmit"]
    assert resent and {r["cause"] for r in resent} <= CAUSES
    # A congestion sample of every plane every 10 ms, bytes sent never going back.
    cc = [r for r in records if r["kind"] == "cc"]
    for plane in range(4):
        mine = [r for r in cc if r["plane"] == plane]
        assert len(mine) >= 120, plane  # 200 in 2 s at 10 ms, if the loop is never late
        sent = [r["bytes_sent"] for r in mine]
        assert sent == sorted(sent) and sent[-1] > 0
        assert all(r["cwnd"] > 0 and r["in_flight"] >= 0 for r in mine)
    rows = {row["plane"]: row["bytes_sent"] for row in doc["end"]["mrc"]["planes"]}
    assert all(0 < cc[-4 + p]["bytes_sent"] <= rows[p] for p in range(4))
    # The server traced its side of the same test.
    (server_doc,) = json_docs(out)
    s_header, s_records = read_trace(server_trace)
    check_shape(s_header, s_records, server_doc)
    assert s_header["role"] == "server"
    assert (s_header["qpn"], s_header["peer_qpn"]) == (header["peer_qpn"], header["qpn"])


def test_a_ten_second_trace_stays_under_the_documented_bound(tmp_path: Path) -> None:
    trace = tmp_path / "ten.jsonl"
    server = Server("-1")
    try:
        proc = client(
            server.port, "-t", "10", "--inject", "plane-down=1@3", "--trace", str(trace),
            timeout=60,
        )  # fmt: skip
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    size = trace.stat().st_size
    _, records = read_trace(trace)
    assert records[-1]["kind"] == "end" and records[-1]["t"] >= 10.0
    assert 0 < size < TEN_SECOND_BOUND, size
    # The limited kinds keep to the bucket: one second's burst plus the rate, over the run.
    limited = [r for r in records if r["kind"] in ("retransmit", "drop", "rtt")]
    assert len(limited) <= RECORDS_PER_SECOND * (1 + records[-1]["t"])


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mrc", "bench", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env(),
    )


def test_a_trace_file_that_cannot_be_written_fails_before_connecting(tmp_path: Path) -> None:
    bad = tmp_path / "missing" / "t.jsonl"
    started = time.monotonic()
    # Nobody listens on this port: a client that tried to connect would wait 5 s.
    proc = bench("-c", "127.0.0.2", "-p", "9", "--trace", str(bad))
    assert time.monotonic() - started < 5
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == f"mrc bench: --trace {bad}: No such file or directory\n"
    proc = bench("-s", "-B", "127.0.0.2", "-p", "0", "--trace", str(tmp_path))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == f"mrc bench: --trace {tmp_path}: Is a directory\n"
    proc = bench("--daemon", str(tmp_path / "sock"), "-c", "peer", "--trace", str(bad))
    assert proc.returncode == 2
    assert proc.stderr == "mrc bench: error: --trace does not apply with --daemon\n"

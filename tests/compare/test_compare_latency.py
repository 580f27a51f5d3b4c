"""tools.compare's latency section: the UDP/TCP ping-pong programs on loopback, the sweep's
goal numbers and how the report prints them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tools.compare import report
from tools.compare.latency import sweep_summary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("proto", ["udp", "tcp"])
def test_pingpong_on_loopback(proto: str) -> None:
    port = _free_port(socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM)
    mod = [sys.executable, "-m", "tools.compare.pingpong"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    server = subprocess.Popen(
        [*mod, "serve", proto, "--bind", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "READY"
        ping = subprocess.run(
            [*mod, "ping", proto, "--connect", "127.0.0.1", "--port", str(port), "-n", "200",
             "-l", "100"],
            capture_output=True, text=True, timeout=30, env=env, cwd=ROOT,
        )
        assert ping.returncode == 0, ping.stderr
        doc = json.loads(ping.stdout)
        assert doc["samples"] == 200 and doc["lost"] == 0 and doc["bytes"] == 100
        order = [doc[k] for k in ("min", "p50", "p90", "p99", "p99_9", "max")]
        assert order == sorted(order) and order[0] > 0
        assert server.wait(10) == 0  # the pinger ended it (UDP: empty datagram; TCP: EOF)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_pingpong_refuses_nonsense_in_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.compare.pingpong", "ping", "udp", "--port", "9", "-n", "0",
         "--connect", "127.0.0.1"],
        capture_output=True, text=True, timeout=30, cwd=ROOT,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "pingpong: -l and -n must be at least 1"


def _row(size: int, bps: float, mps: float) -> dict[str, object]:
    return {"bytes": size, "bits_per_second": bps, "messages_per_second": mps,
            "cpu_client_percent": 50.0, "cpu_server_percent": 40.0, "retransmits": 0,
            "integrity": "ok"}


def test_sweep_goals_met_and_not() -> None:
    rows = [_row(4096, 3.2e9, 97_656.0), _row(65536, 4.2e9, 8011.0),
            _row(1 << 20, 4.8e9, 572.0)]
    summary = sweep_summary(rows)
    assert summary == {"writes_per_s_4k": 97_656.0, "goodput_4k_over_1m": 0.6667,
                       "goodput_64k_over_1m": 0.875}
    doc = {"sweep": {"mrc": {"rows": rows, **summary}}}
    goals = {g["goal"]: (g["value"], g["met"]) for g in report.goals(doc)}
    assert goals["mrc 4 KiB goodput >= 0.6 x 1 MiB goodput"] == (0.6667, True)
    assert goals["mrc 64 KiB goodput >= 0.85 x 1 MiB goodput"] == (0.875, True)
    slow = sweep_summary([_row(4096, 1.9e9, 58_000.0), _row(65536, 4.0e9, 7629.0),
                          _row(1 << 20, 4.8e9, 572.0)])
    doc = {"sweep": {"mrc": slow}}
    goals = {g["goal"]: g["met"] for g in report.goals(doc)}
    assert goals["mrc 4 KiB goodput >= 0.6 x 1 MiB goodput"] is False  # 0.3958
    assert goals["mrc 64 KiB goodput >= 0.85 x 1 MiB goodput"] is False  # 0.8333
    assert all(g["met"] is None for g in report.goals({}))  # nothing ran


def test_latency_goals_read_tcp_and_both_cpus() -> None:
    stats = {"samples": 10, "min": 1.0, "mean": 2.0, "p50": 2.0, "p90": 3.0, "p99": 4.0,
             "p99_9": 5.0, "max": 6.0, "stdev": 1.0}
    doc = {"latency": {"tcp": dict(stats, p50=40.0, p99=100.0),
                       "mrc": dict(stats, p50=80.0, p99=310.0, cpu_client_us=99.5,
                                   cpu_server_us=120.25)}}
    assert report.latency_ratios(doc) == {"p50 mrc/tcp": 2.0, "p99 mrc/tcp": 3.1,
                                          "cpu_client_us": 99.5, "cpu_server_us": 120.25}
    goals = {g["goal"]: (g["value"], g["met"]) for g in report.goals(doc)}
    assert goals["mrc --latency p50 <= 2 x TCP ping-pong p50"] == (2.0, True)
    assert goals["mrc --latency p99 <= 3 x TCP ping-pong p99"] == (3.1, False)
    assert goals["mrc --latency client CPU per round trip <= 100 us"] == (99.5, True)
    lines = report.latency_lines(doc)
    assert "mrc CPU per round trip: client 99.5 us, server 120.2 us" in lines
    doc["latency"]["tcp"] = {"error": "tcp ping-pong: no answers"}
    goals = {g["goal"]: g["met"] for g in report.goals(doc)}
    assert goals["mrc --latency p50 <= 2 x TCP ping-pong p50"] is None


def test_latency_table_rows() -> None:
    stats = {"samples": 10, "min": 1.0, "mean": 2.0, "p50": 2.0, "p90": 3.0, "p99": 4.0,
             "p99_9": 5.0, "max": 6.0, "stdev": 1.0}
    doc = {"latency": {"udp": dict(stats, p50=50.0), "mrc": dict(stats, p50=500.0),
                       "tcp": {"error": "tcp ping-pong: no answers"}}}
    lines = report.latency_lines(doc)
    udp = next(x for x in lines if x.startswith("UDP ping-pong"))
    assert udp.split()[-7:] == ["10", "1.0", "50.0", "4.0", "5.0", "6.0", "0.10"]
    assert any(x.startswith("TCP ping-pong") and "FAILED: tcp ping-pong" in x for x in lines)
    mrc = next(x for x in lines if x.startswith("mrc bench --latency"))
    assert mrc.split()[-1] == "-"

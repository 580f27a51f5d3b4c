"""`mrc bench --sweep` and `--latency`: the percentile math, the protocol's test kinds, the flag
checks, and both modes as real processes over 4 loopback planes (127.0.0.x)."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from benchproc import SERVER_ADDRS, Server, bound, client, env, free_port, json_docs

from mrc.cli import main
from mrc.cli.bench.latency import latency_stats, percentile
from mrc.cli.bench.options import sweep_sizes
from mrc.cli.bench.proto import (
    KIND_LATENCY,
    BenchProtocolError,
    BenchReply,
    BenchRequest,
    RegionRef,
)

# -- percentiles ------------------------------------------------------------------------------


def test_nearest_rank_percentiles_of_ten_samples() -> None:
    ten = [float(x) for x in range(1, 11)]
    assert percentile(ten, 50) == 5.0
    assert percentile(ten, 90) == 9.0
    assert percentile(ten, 91) == 10.0
    assert percentile(ten, 99) == 10.0
    assert percentile(ten, 99.9) == 10.0
    assert percentile(ten, 100) == 10.0
    assert percentile(ten, 10) == 1.0
    assert percentile(ten, 0.01) == 1.0


def test_p99_9_of_a_thousand_is_the_999th_not_the_last() -> None:
    # 99.9 % of 1000 is 999.0000000000001 in floating point: it must not round up to 1000.
    thousand = [float(x) for x in range(1, 1001)]
    assert percentile(thousand, 99.9) == 999.0
    assert percentile(thousand, 99) == 990.0
    assert percentile(thousand, 50) == 500.0
    assert percentile([7.0], 99.9) == 7.0


def test_percentile_refuses_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 50)
    for pct in (0, -1, 100.5):
        with pytest.raises(ValueError, match="percentile must be"):
            percentile([1.0], pct)


def test_latency_stats_in_microseconds() -> None:
    stats = latency_stats([4e-6, 1e-6, 3e-6, 2e-6])  # unsorted on purpose
    assert stats == {
        "min": 1.0,
        "mean": 2.5,
        "p50": 2.0,
        "p90": 4.0,
        "p99": 4.0,
        "p99_9": 4.0,
        "max": 4.0,
        "stdev": round(math.sqrt(1.25), 2),
    }


# -- sizes and the protocol -------------------------------------------------------------------


def test_sweep_sizes_are_the_powers_of_two_between() -> None:
    sizes = sweep_sizes(4 << 10, 16 << 20)
    assert len(sizes) == 13
    assert sizes[0] == 4096 and sizes[-1] == 16 << 20
    assert all(b == 2 * a for a, b in itertools.pairwise(sizes))
    assert sweep_sizes(64, 64) == (64,)
    with pytest.raises(ValueError, match="power of two"):
        sweep_sizes(3000, 8192)
    with pytest.raises(ValueError, match="upwards"):
        sweep_sizes(8192, 4096)


def _latency_request(**kw: object) -> BenchRequest:
    base: dict[str, object] = {
        "cookie": 0x1122334455667788,
        "msg_size": 64,
        "results": RegionRef(0x1000, 7, 65536),
        "data": RegionRef(0x9000, 8, 64),
        "kind": KIND_LATENCY,
        "iterations": 500,
    }
    base.update(kw)
    return BenchRequest(**base)  # type: ignore[arg-type]


def test_latency_request_is_version_2_and_round_trips() -> None:
    req = _latency_request()
    raw = req.encode()
    assert raw[0] == 2 and raw[2:4] == b"\x00\x01"  # version 2, kind 1
    back = BenchRequest.decode(raw)
    assert back == req
    assert back.iterations == 500 and back.total_bytes == 0
    reply = BenchReply(req.cookie, RegionRef(1, 2, 3), RegionRef(4, 5, 64), version=2)
    assert BenchReply.decode(reply.encode()) == reply


def test_stream_request_stays_version_1() -> None:
    req = BenchRequest(cookie=1, msg_size=4096, total_bytes=1 << 20, results=RegionRef(1, 2, 64))
    raw = req.encode()
    assert raw[0] == 1 and raw[2:4] == b"\x00\x00"
    assert BenchRequest.decode(raw) == req


def test_unknown_kinds_and_versions_are_refused() -> None:
    raw = bytearray(_latency_request().encode())
    raw[3] = 9
    with pytest.raises(BenchProtocolError, match="unknown test kind 9"):
        BenchRequest.decode(bytes(raw))
    raw[0] = 3
    with pytest.raises(BenchProtocolError, match="version 3"):
        BenchRequest.decode(bytes(raw))
    with pytest.raises(BenchProtocolError, match="exactly one of duration and iterations"):
        BenchRequest.decode(_latency_request(iterations=0).encode())
    with pytest.raises(BenchProtocolError, match="no flags"):
        BenchRequest.decode(_latency_request(verify=True).encode())
    with pytest.raises(BenchProtocolError, match="region for the echoes"):
        BenchRequest.decode(_latency_request(data=RegionRef()).encode())


# -- flags ------------------------------------------------------------------------------------

C = ["bench", "-c", "127.0.0.2"]
BAD = [
    ([*C, "--sweep", "--latency"], "choose one"),
    ([*C, "--sweep", "-l", "4K"], "-l does not apply with --sweep"),
    ([*C, "--sweep", "-R"], "-R does not apply with --sweep"),
    ([*C, "--latency", "--verify"], "--verify does not apply with --latency"),
    ([*C, "--latency", "-n", "1M"], "-n does not apply with --latency"),
    ([*C, "--latency", "-t", "1", "--iterations", "5"], "not both"),
    ([*C, "--iterations", "5"], "--iterations needs --latency"),
    ([*C, "--sweep-sizes", "4K-1M"], "--sweep-sizes needs --sweep"),
    ([*C, "--sweep", "--sweep-sizes", "3K-1M"], "power of two"),
    ([*C, "--sweep", "--sweep-sizes", "1M-4K"], "upwards"),
    ([*C, "--sweep", "--sweep-sizes", "4K"], "wants A-B"),
    ([*C, "--latency", "--iterations", "0"], "iterations must be"),
    (["bench", "-s", "-B", "127.0.0.2", "--latency"], "--latency is a client flag"),
    (["bench", "--demo", "--sweep"], "--sweep is a client flag"),
    ([*C, "--daemon", "/tmp/s", "--sweep"], "do not apply with --daemon"),
]


@pytest.mark.parametrize(("argv", "needle"), BAD)
def test_bad_mode_flags_are_one_line_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert needle in lines[0]


# -- real runs --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server("-J")
    yield srv
    rc, out, err = srv.stop()
    assert rc == 0, err
    assert "Traceback" not in err, err
    echoes = [d["latency_server"] for d in json_docs(out) if "latency_server" in d]
    assert echoes and all(e["error"] is None and e["write_errors"] == 0 for e in echoes)


@pytest.mark.timeout(90)
def test_sweep_every_size_verified(server: Server) -> None:
    proc = client(server.port, "-J", "--sweep", "-t", "0.1", "--verify", timeout=80)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rows = doc["sweep"]
    assert [r["bytes"] for r in rows] == list(sweep_sizes(4 << 10, 16 << 20))
    assert doc["start"]["test_start"]["sizes"] == [r["bytes"] for r in rows]
    assert doc["end"] == {"sizes_completed": 13, "error": None}
    for r in rows:
        assert r["messages"] >= 1 and r["bytes_completed"] >= r["bytes"], r
        assert r["bits_per_second"] > 0 and r["messages_per_second"] > 0, r
        assert r["integrity"] == "ok", r
        assert r["cpu_client_percent"] > 0 and r["cpu_server_percent"] is not None, r
        assert r["error"] is None


def test_sweep_text_table(server: Server) -> None:
    proc = client(server.port, "--sweep", "--sweep-sizes", "64K-128K", "-n", "1M", timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].endswith("(2 sizes), 1.00 MBytes per size, one connection each")
    assert lines[2].split()[:5] == ["#bytes", "#messages", "seconds", "Gbit/s", "msgs/s"]
    rows = [line.split() for line in lines[3:5]]
    assert [r[0] for r in rows] == ["65536", "131072"]
    assert [r[1] for r in rows] == ["16", "8"]  # 1 MiB per size
    assert lines[5].startswith("---")


def test_latency_percentiles_ordered(server: Server) -> None:
    proc = client(server.port, "-J", "--latency", "--iterations", "300", timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    lat = doc["end"]["latency"]
    assert lat["samples"] == 300 and lat["unit"] == "us" and lat["round_trip"] is True
    order = [lat[k] for k in ("min", "p50", "p90", "p99", "p99_9", "max")]
    assert order == sorted(order) and order[0] > 0
    assert lat["min"] <= lat["mean"] <= lat["max"]
    assert doc["start"]["test_start"]["bytes"] == 64
    assert doc["end"]["error"] is None


def test_latency_by_time_in_text(server: Server) -> None:
    proc = client(server.port, "--latency", "-t", "0.3", "-l", "4K", timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    head = lines.index(next(x for x in lines if x.startswith(" #bytes")))
    row = lines[head + 1].split()
    assert row[0] == "4096" and int(row[1]) > 0
    values = [float(v) for v in row[2:]]
    assert len(values) == 8  # min p50 avg p90 p99 p99.9 max stdev


OLD_SERVER = (
    "import sys, mrc.cli.bench.proto as p\n"
    "p.{patch}\n"
    "from mrc.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize(
    "patch",
    [
        "VERSION_KINDS = 99",  # a version-1-only server: it does not know version 2
        "KIND_NAMES.pop(1)",  # a server that knows versions but not this kind
    ],
)
def test_a_server_without_latency_refuses_in_one_line(patch: str) -> None:
    port = free_port()
    code = OLD_SERVER.format(patch=patch)
    cmd = [sys.executable, "-c", code, "bench", "-s", "-1", "-B", ",".join(SERVER_ADDRS)]
    srv = subprocess.Popen(
        [*cmd, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env()
    )
    try:
        deadline = time.monotonic() + 10
        while not all(bound(a, port) for a in SERVER_ADDRS):
            assert srv.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        proc = client(port, "--latency", "--iterations", "10", "--connect-timeout", "3")
        assert proc.returncode == 1
        lines = proc.stderr.splitlines()
        assert len(lines) == 1, proc.stderr
        assert "refused the latency test" in lines[0]
        # The same server still serves an ordinary (version 1) stream test.
        ok = client(port, "-n", "1M", "--verify")
        assert ok.returncode == 0, ok.stderr
    finally:
        srv.terminate()
        srv.wait(10)


@pytest.mark.timeout(60)
def test_a_latency_client_that_dies_is_ended_by_the_server() -> None:
    srv = Server("-1")
    cmd = [sys.executable, "-m", "mrc", "bench", "-c", ",".join(SERVER_ADDRS), "-p",
           str(srv.port), "--latency", "-t", "30"]  # fmt: skip
    victim = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env())
    try:
        time.sleep(1.5)
        assert victim.poll() is None
        victim.kill()  # no DISCONNECT: the server must notice the silence by itself
        victim.wait(10)
        srv.proc.wait(timeout=20)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        rc, out, err = srv.stop()
    assert rc == 1, err
    line = next(x for x in out.splitlines() if x.startswith("Latency test from"))
    # The echo in flight when the client died runs out of retries, or (nothing in flight)
    # the server's silence timer ends the test: either way it ends, with a reason.
    assert line.endswith(
        ("connection closed: retry limit", "no message from the client for 5 s")
    ), line

"""`mrc bench --latency` reports the CPU each side spent per round trip: the client's own, the
server's from the summary it writes back when the client is done (imm IMM_END, answered with
IMM_RESULTS; mrc/cli/bench/proto.py). Real processes over 4 loopback planes (127.0.0.x)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from benchproc import SERVER_ADDRS, Server, bound, client, env, free_port, json_docs


@pytest.mark.timeout(60)
def test_both_sides_cpu_per_round_trip() -> None:
    srv = Server("-J", "-1")
    try:
        proc = client(srv.port, "-J", "--latency", "--iterations", "200", timeout=40)
        assert proc.returncode == 0, proc.stderr
        lat = json.loads(proc.stdout)["end"]["latency"]
        assert lat["samples"] == 200
        # Microseconds of process CPU per round trip: something, and less than the whole
        # test's wall time per round trip on each side.
        per_rt = lat["seconds"] / 200 * 1e6
        for side in ("cpu_client_us_per_round_trip", "cpu_server_us_per_round_trip"):
            assert 0 < lat[side] < 2 * per_rt, (side, lat)
    finally:
        rc, out, err = srv.stop()
    assert rc == 0, err
    # The summary request is not an echo: the server counts exactly the client's 200.
    (echo,) = [d["latency_server"] for d in json_docs(out) if "latency_server" in d]
    assert echo["echoes"] == 200 and echo["error"] is None


OLDER_SERVER = (
    "import sys, mrc.cli.bench.echo as e\n"
    "e.IMM_END = -1  # a server that knows no summary: it echoes the client's last message\n"
    "from mrc.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.timeout(60)
def test_a_server_without_the_summary_leaves_its_cpu_unknown() -> None:
    port = free_port()
    cmd = [sys.executable, "-c", OLDER_SERVER, "bench", "-s", "-1", "-B", ",".join(SERVER_ADDRS),
           "-p", str(port)]  # fmt: skip
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env())
    try:
        deadline = time.monotonic() + 10
        while not all(bound(a, port) for a in SERVER_ADDRS):
            assert srv.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        proc = client(port, "--latency", "--iterations", "50", timeout=40)
        assert proc.returncode == 0, proc.stderr
        line = proc.stdout.splitlines()[-1]
        assert line.startswith("CPU per round trip: client ") and line.endswith(
            " us, server unknown"), line
    finally:
        srv.terminate()
        srv.wait(10)

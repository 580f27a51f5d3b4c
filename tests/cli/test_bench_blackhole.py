"""A plane blackholed by a real nftables rule for 1.5 s during a 3 GiB `mrc bench --verify`
(long enough that the plane is back before the end even with the batched datapath).

Runs as root inside a network namespace the test creates (its own loopback, its own nftables
table), so nothing outside it is touched; skips with a reason without root or without nft.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from benchproc import CLIENT_ADDRS, SERVER_ADDRS, env

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespace, nftables)"),
    pytest.mark.skipif(shutil.which("nft") is None, reason="nft (nftables) is not installed"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="ip (iproute2) is not installed"),
]

PLANE = 2
PORT = 4791


def run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=10)


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"mrc-test-bh-{secrets.token_hex(3)}"
    run("ip", "netns", "add", name)
    try:
        run("ip", "-n", name, "link", "set", "lo", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=10)


def bench(ns: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "mrc", "bench", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )


def test_blackholed_plane_is_retired_then_restored(netns: str) -> None:
    server = bench(netns, "-s", "-1", "-B", ",".join(SERVER_ADDRS), "-p", str(PORT))
    client = None
    try:
        time.sleep(0.5)
        client = bench(
            netns,
            "-c",
            ",".join(SERVER_ADDRS),
            "-B",
            ",".join(CLIENT_ADDRS),
            "-p",
            str(PORT),
            "-n",
            # Long enough to outlast the blackhole and the plane's return with room to spare:
            # 3 GiB ran out at the moment the rule went, once the compiled build got faster.
            "8G",
            "--verify",
            "-J",
        )
        time.sleep(1.0)
        # Both directions of plane 2 vanish without any error a socket could see.
        both = f"{{ {SERVER_ADDRS[PLANE]}, {CLIENT_ADDRS[PLANE]} }}"
        run("ip", "netns", "exec", netns, "nft", "add", "table", "inet", "mrcbh")
        run(
            "ip", "netns", "exec", netns, "nft", "add", "chain", "inet", "mrcbh", "out",
            "{ type filter hook output priority 0 ; }",
        )  # fmt: skip
        run(
            "ip", "netns", "exec", netns, "nft", "add", "rule", "inet", "mrcbh", "out",
            "ip", "daddr", both, "udp", "dport", str(PORT), "drop",
        )  # fmt: skip
        time.sleep(1.5)
        run("ip", "netns", "exec", netns, "nft", "delete", "table", "inet", "mrcbh")
        out, err = client.communicate(timeout=120)
        assert client.returncode == 0, err
    finally:
        for proc in (client, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    doc = json.loads(out)
    m = doc["end"]["mrc"]
    assert m["integrity"] == "ok" and m["messages_verified"] == 8192
    assert doc["end"]["sum_received"]["bytes"] == 8 << 30
    events = m["events"]
    # Taken out of use: its EVs retired by the sender's RTOs, or the whole plane down (the
    # receiver's EV_PROBEs found its return path dead first and cleared it from PORTSTATE).
    retired = [
        e for e in events if e["event"] in ("path-retired", "plane-down") and e["plane"] == PLANE
    ]
    assert retired, events
    # The plane came back once the rule was gone: its EVs carry data again at the end.
    assert [p["state"] for p in m["planes"] if p["plane"] == PLANE] == ["up"]
    back = [
        e
        for e in events
        if e["plane"] == PLANE
        and e["event"] in ("plane-up", "path-restored")
        and e["t"] > retired[0]["t"]
    ]
    assert back, events
    assert isinstance(m["longest_stall_seconds"], float)
    assert m["longest_stall_seconds"] > 0

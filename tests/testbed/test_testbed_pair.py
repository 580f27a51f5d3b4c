"""`up pair` → every plane answers on IPv4 and IPv6 → `down` leaves nothing behind; `down --all`
cleans up after a crash (state file left behind, namespaces without a state file, an `up`
killed part-way)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testbed_support import (
    ROOT,
    addr_of,
    env,
    namespaces,
    nft_ruleset,
    ns_of,
    ping,
    probe,
    qdiscs,
    receiver,
    requires_root,
    running_testbed,
    skip_without_features,
    status,
    tb,
    unique,
)

pytestmark = requires_root


@pytest.fixture(autouse=True)
def _features() -> None:
    skip_without_features()


def _root_veths() -> set[str]:
    out = subprocess.run(["ip", "-j", "link", "show", "type", "veth"], capture_output=True,
                         text=True, check=True).stdout
    return {row["ifname"] for row in json.loads(out or "[]")}


def _root_nft_tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout


def test_pair_up_ping_every_plane_down_leaves_nothing(tmp_path: Path) -> None:
    name = unique()
    veths_before = _root_veths()
    try:
        up = tb("up", "pair", "--name", name)
        assert f"testbed {name} up: pair (planes=4)" in up.stdout
        doc = status(name)
        assert doc["state"] == "up" and len(doc["links"]) == 4
        assert all(link["state"] == "up" and link["mtu"] == 9000 for link in doc["links"])
        h1, h2 = ns_of(doc, "h1"), ns_of(doc, "h2")
        assert h1 == f"mrc-{name}-h1" and h1 in namespaces()
        assert _root_veths() == veths_before  # the veths live only inside the namespaces
        peers = [addr_of(doc, "h2", p, v) for p in range(4) for v in (4, 6)]
        assert ping(h1, *peers) == {a: 2 for a in peers}
        mine = [addr_of(doc, "h1", p, v) for p in range(4) for v in (4, 6)]
        assert ping(h2, *mine) == {a: 2 for a in mine}
        # a fault leaves an nftables table inside a namespace; down must take it too
        tb("fault", "--name", name, "loss", "h1-p2", "5")
        assert "mrc_testbed" in nft_ruleset(h1)
        out = tmp_path / "paths.json"
        tb("paths", name, "-o", str(out))
        table = json.loads(out.read_text())
        assert table["testbed"] == name and len(table["entries"]) == 16
        assert table == doc["paths"]
    finally:
        down = tb("down", name, check=False)
    assert down.returncode == 0, down.stderr
    assert f"testbed {name} down: removed 2 namespaces" in down.stdout
    assert not [ns for ns in namespaces() if name in ns]
    assert _root_veths() <= veths_before
    assert "mrc_testbed" not in _root_nft_tables()
    assert name not in tb("list").stdout.split()


def test_down_all_after_crash(tmp_path: Path) -> None:
    pre = unique("mrcC") + "-"
    sandbox = {"MRC_TESTBED_STATE_DIR": str(tmp_path / "state"), "MRC_TESTBED_PREFIX": pre}
    left, orphan, killed = unique(), unique(), unique()
    try:
        # 1. a testbed whose owner went away: state file and namespaces left behind
        tb("up", "pair", "--planes", "2", "--name", left, extra_env=sandbox)
        # 2. namespaces whose state file is gone
        tb("up", "pair", "--planes", "1", "--name", orphan, extra_env=sandbox)
        (tmp_path / "state" / f"{orphan}.json").unlink()
        # 3. an `up` killed part-way (the state file is written before anything is built)
        proc = subprocess.Popen([sys.executable, "-m", "tools.testbed", "up", "clos", "--name",
                                 killed], env=env(**sandbox), cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        state_file = tmp_path / "state" / f"{killed}.json"
        deadline = time.monotonic() + 10
        while not state_file.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert state_file.exists()
        assert len([ns for ns in namespaces() if ns.startswith(pre)]) >= 3
        out = tb("down", "--all", extra_env=sandbox).stdout
        for name in (left, orphan):
            assert f"testbed {name} down" in out
        assert [ns for ns in namespaces() if ns.startswith(pre)] == []
        assert list((tmp_path / "state").glob("*.json")) == []
        assert tb("down", "--all", extra_env=sandbox).stdout.strip() == "no testbeds"
    finally:
        tb("down", "--all", extra_env=sandbox, check=False)
        for ns in namespaces():
            if ns.startswith(pre):
                subprocess.run(["ip", "netns", "del", ns], check=False)


LINE = """
kind = "custom"
[nodes.a]
routes = [{dst = "fd00:2::/64", via = "fd00:1::2", dev = "e0"},
          {dst = "fc00::/16", via = "fd00:1::2", dev = "e0"}]
[nodes.r]
role = "switch"
sid = "fc00::9"
[nodes.b]
routes = [{dst = "fd00:1::/64", via = "fd00:2::1", dev = "e0"}]
[[links]]
endpoints = ["a:e0", "r:a"]
addresses = [["fd00:1::1/64", "10.1.0.1/24"], ["fd00:1::2/64", "10.1.0.2/24"]]
[[links]]
name = "rb"
endpoints = ["r:b", "b:e0"]
addresses = [["fd00:2::1/64"], ["fd00:2::2/64"]]
rate = "1gbit"
"""


def test_custom_topology_routes_and_sid(tmp_path: Path) -> None:
    f = tmp_path / "line.toml"
    f.write_text(LINE)
    with running_testbed(str(f)) as doc:
        a, b = ns_of(doc, "a"), ns_of(doc, "b")
        assert ping(a, "fd00:2::2", "10.1.0.2") == {"fd00:2::2": 2, "10.1.0.2": 2}
        with receiver(b, 7200, 5) as got:
            probe(a, "send", "fd00:2::2", "7200", "--hops", "fc00::9", "--count", "5")
        assert got == {"received": 5, "segments": ["fc00::9", "fd00:2::2"]}
        assert "rate 1Gbit" in qdiscs(ns_of(doc, "r"), "b")

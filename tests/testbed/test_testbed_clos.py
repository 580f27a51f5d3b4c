"""`up clos` (4 hosts in 2 racks, 4 planes, 2 tier-1 switches per plane): plain IPv6 across
racks, SRv6 datagrams through each tier-1 switch (seen in its counters and in the routing header
the receiver gets), and each fault observed and cleared."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testbed_support import (
    addr_of,
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
    tx_packets,
)

from tools.testbed import faults
from tools.testbed.build import load_state
from tools.testbed.runner import Runner

pytestmark = requires_root
N = 40  # datagrams per SRv6 check


@pytest.fixture(scope="module")
def clos() -> Iterator[dict[str, Any]]:
    skip_without_features()
    with running_testbed("clos") as doc:
        yield doc


def _path(doc: dict[str, Any], src: str, dst: str, plane: int) -> dict[str, Any]:
    entries = doc["paths"]["entries"]
    return next(e for e in entries
                if (e["src_node"], e["dst_node"], e["plane"]) == (src, dst, plane))


def _srv6(doc: dict[str, Any], src: str, dst: str, plane: int, segments: list[str],
          port: int) -> dict[str, Any]:
    """Send N datagrams from src to dst through `segments` (via `exec`); the receiver's answer."""
    dst_addr = addr_of(doc, dst, plane)
    with receiver(ns_of(doc, dst), port, N, timeout=1.0) as got:
        cmd = ["exec", "--name", doc["name"], src, "--", "python3",
               str(Path(__file__).with_name("testbed_probe.py")), "send", dst_addr, str(port),
               "--hops", ",".join(segments), "--count", str(N), "--size", "1000"]
        tb(*cmd)
    return got


def test_status_and_paths(clos: dict[str, Any], tmp_path: Path) -> None:
    name = clos["name"]
    assert len(clos["nodes"]) == 20 and len(clos["links"]) == 32
    assert all(link["state"] == "up" for link in clos["links"])
    assert clos["sids"]["t1ap0"] == "fc00:0:1::" and clos["sids"]["t0r2p3"] == "fc00:3:0:2::"
    out = tmp_path / "paths.json"
    tb("paths", name, "-o", str(out))
    assert json.loads(out.read_text()) == clos["paths"]
    assert len(clos["paths"]["entries"]) == 48
    text = tb("status", name).stdout
    assert "t0r1p0-t1ap0" in text and "fc00:0:1::" in text and "h1-p0" in text


def test_plain_ipv6_every_plane(clos: dict[str, Any]) -> None:
    h1 = ns_of(clos, "h1")
    targets = [addr_of(clos, h, p) for h in ("h2", "h3", "h4") for p in range(4)]
    assert ping(h1, *targets) == {a: 2 for a in targets}


def test_srv6_through_every_tier1_of_a_plane(clos: dict[str, Any]) -> None:
    entry = _path(clos, "h1", "h3", 0)
    assert [p["name"] for p in entry["paths"]] == ["t1-0", "t1-1"]
    tier1 = {"t1-0": "t1ap0", "t1-1": "t1bp0"}
    for i, path in enumerate(entry["paths"]):
        before = {t: tx_packets(ns_of(clos, t), "t0r2p0") for t in tier1.values()}
        got = _srv6(clos, "h1", "h3", 0, path["segments"], 7000 + i)
        after = {t: tx_packets(ns_of(clos, t), "t0r2p0") for t in tier1.values()}
        assert got["received"] == N
        assert got["segments"] == [*path["segments"], entry["dst"]]
        chosen = tier1[path["name"]]
        for t in tier1.values():
            delta = after[t] - before[t]
            if t == chosen:
                assert delta >= N, (t, delta)
            else:
                assert delta < N // 2, (t, delta)


def test_fault_link_down_up_breaks_one_path(clos: dict[str, Any]) -> None:
    name = clos["name"]
    entry = _path(clos, "h1", "h4", 1)
    via_a, via_b = (p["segments"] for p in entry["paths"])
    try:
        tb("fault", "--name", name, "link-down", "t0r1p1-t1ap1")
        link = next(lk for lk in status(name)["links"] if lk["name"] == "t0r1p1-t1ap1")
        assert link["state"] == "down" and link["faults"]
        assert _srv6(clos, "h1", "h4", 1, via_a, 7100)["received"] == 0
        assert _srv6(clos, "h1", "h4", 1, via_b, 7101)["received"] == N
        tb("fault", "--name", name, "link-up", "t0r1p1-t1ap1")
        assert _srv6(clos, "h1", "h4", 1, via_a, 7102)["received"] == N
    finally:
        tb("fault", "--name", name, "clear", check=False)


def test_fault_host_link_down(clos: dict[str, Any]) -> None:
    name, h1, dst = clos["name"], ns_of(clos, "h1"), addr_of(clos, "h3", 2)
    try:
        tb("fault", "--name", name, "link-down", "h1-p2")
        assert ping(h1, dst, timeout=0.3) == {dst: 0}
        tb("fault", "--name", name, "link-up", "h1-p2")
        assert ping(h1, dst) == {dst: 2}
    finally:
        tb("fault", "--name", name, "clear", "h1-p2", check=False)


def test_fault_blackhole_loss_clear(clos: dict[str, Any]) -> None:
    name, h2 = clos["name"], ns_of(clos, "h2")
    t0 = ns_of(clos, "t0r1p3")
    dst = addr_of(clos, "h4", 3)
    try:
        tb("fault", "--name", name, "blackhole", "h2-p3")
        assert "counter" in nft_ruleset(h2) and "drop" in nft_ruleset(t0)
        assert ping(h2, dst, timeout=0.3) == {dst: 0}
        link = next(lk for lk in status(name)["links"] if lk["name"] == "h2-p3")
        assert link["state"] == "up" and link["faults"]["h2:p3"] == {"blackhole": True}
        tb("fault", "--name", name, "loss", "t0r1p3:h2", "30")  # one end only
        assert "numgen random mod 100 < 30" in nft_ruleset(t0)
        assert "numgen" not in nft_ruleset(h2) and "drop" in nft_ruleset(h2)
        tb("fault", "--name", name, "loss", "h2-p3", "100")
        assert ping(h2, dst, timeout=0.3) == {dst: 0}
        tb("fault", "--name", name, "clear", "h2-p3")
        assert "drop" not in nft_ruleset(h2) and "drop" not in nft_ruleset(t0)
        assert ping(h2, dst) == {dst: 2}
    finally:
        tb("fault", "--name", name, "clear", "h2-p3", check=False)


def test_an_armed_blackhole_acts_only_when_fired(clos: dict[str, Any]) -> None:
    """tools/compare arms its fault while the transfer ramps up: armed, nothing is dropped
    yet; fired, both ends drop and the fault is recorded; an armed fault cancelled unfired
    leaves nothing behind."""
    name, h2, t0 = clos["name"], ns_of(clos, "h2"), ns_of(clos, "t0r1p3")
    dst = addr_of(clos, "h4", 3)
    runner = Runner()
    try:
        armed = faults.arm_blackhole(load_state(name), "h2-p3", runner)
        try:
            assert ping(h2, dst) == {dst: 2}
            assert "drop" not in nft_ruleset(h2) and "drop" not in nft_ruleset(t0)
            msg = armed.fire()
        finally:
            armed.cancel()
        assert msg == "h2-p3: blackholed (everything arriving at h2:p3, t0r1p3:h2 dropped)"
        assert "drop" in nft_ruleset(h2) and "drop" in nft_ruleset(t0)
        assert ping(h2, dst, timeout=0.3) == {dst: 0}
        link = next(lk for lk in status(name)["links"] if lk["name"] == "h2-p3")
        assert link["faults"]["h2:p3"] == {"blackhole": True}
        tb("fault", "--name", name, "clear", "h2-p3")
        unfired = faults.arm_link_down(load_state(name), "h2-p3", runner)
        unfired.cancel()
        unfired.cancel()  # twice is harmless
        assert ping(h2, dst) == {dst: 2}
        link = next(lk for lk in status(name)["links"] if lk["name"] == "h2-p3")
        assert link["state"] == "up" and not link["faults"]
    finally:
        tb("fault", "--name", name, "clear", "h2-p3", check=False)


def test_fault_rate_and_clear(clos: dict[str, Any]) -> None:
    name, h1 = clos["name"], ns_of(clos, "h1")
    try:
        tb("fault", "--name", name, "rate", "h1-p1", "100mbit")
        assert "tbf" in qdiscs(h1, "p1") and "rate 100Mbit" in qdiscs(h1, "p1")
        assert "tbf" in qdiscs(ns_of(clos, "t0r1p1"), "h1")
        assert ping(h1, addr_of(clos, "h3", 1)) == {addr_of(clos, "h3", 1): 2}
        tb("fault", "--name", name, "clear")
        assert "tbf" not in qdiscs(h1, "p1")
    finally:
        tb("fault", "--name", name, "clear", check=False)


def test_fault_flap_foreground_and_background(clos: dict[str, Any]) -> None:
    name, h1, dst = clos["name"], ns_of(clos, "h1"), addr_of(clos, "h3", 0)
    try:
        t = time.monotonic()
        out = tb("fault", "--name", name, "flap", "h1-p0", "--period", "100", "--count", "3")
        assert "flapped 3 times" in out.stdout and time.monotonic() - t >= 0.3
        assert ping(h1, dst) == {dst: 2}
        out = tb("fault", "--name", name, "flap", "h1-p0", "--period", "40", "--count", "0",
                 "--background")
        pid = status(name)["links"][0]["flapping_pid"]
        assert pid and f"pid {pid}" in out.stdout
        assert Path(f"/proc/{pid}").exists()
        tb("fault", "--name", name, "clear", "h1-p0")
        assert not Path(f"/proc/{pid}").exists() or b"flap" not in Path(
            f"/proc/{pid}/cmdline").read_bytes()
        link = status(name)["links"][0]
        assert link["name"] == "h1-p0" and link["state"] == "up" and not link["flapping_pid"]
        assert ping(h1, dst) == {dst: 2}
    finally:
        tb("fault", "--name", name, "clear", check=False)


def test_exec_runs_in_the_node(clos: dict[str, Any]) -> None:
    out = tb("exec", "--name", clos["name"], "t1bp2", "--", "ip", "-j", "addr", "show").stdout
    addrs = {a["local"] for row in json.loads(out) for a in row.get("addr_info", [])}
    assert "fd01:2:1:1::2" in addrs and "fd01:2:2:1::2" in addrs
    assert probe(ns_of(clos, "h4"), "ping", addr_of(clos, "h1", 3))[addr_of(clos, "h1", 3)] == 3

"""`up clos --ecmp 1` (4 hosts in 2 racks, 4 planes, 2 tier-1 switches per plane, no SRv6): the
tier-0 switches reach the other rack through one multipath route over both tier-1s, and the
kernel hashes each datagram's addresses and flow label to pick one. `mrc bench --ev-encoding
flowlabel` puts each datagram's EV in its flow label, so a plain ECMP fabric sprays it; with
`--ecmp 2` the kernel hashes the 5-tuple, and `--ev-encoding udp` lets each EV pick its source
port.

h1 (rack 1) writes to a server on h3 (rack 2) with `--verify`; the tier-1 interfaces toward rack
2 count what crossed each tier-1. With 255 EVs per plane every tier-1 of a plane carries its
plane's mean share ±25 %; with the EV in the EVXH only, the fabric sees one flow per plane and
each plane's bytes take a single tier-1 (the contrast shows the counters can tell). A tier-1
that fails silently mid-transfer gets the EVs hashed onto it retired; one whose links go down is
routed around by the fabric itself; either way the transfer ends `integrity ok`. The testbed is
private to this module and taken down in every case.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from testbed_support import (
    BenchBed,
    requires_root,
    running_testbed,
    skip_without_features,
    stop,
    tb,
    unique,
)

pytestmark = requires_root
TIER1 = ("a", "b")
PLANES = 4
CLIENT, SERVER = "h1", "h3"
MIB = 1 << 20
EVS = "255"  # EVs per plane (the most CM carries): enough labels for the hash to split evenly


def _clos(factory: pytest.TempPathFactory, mode: str, stem: str) -> Iterator[BenchBed]:
    """A Clos in ECMP mode `mode` under a private prefix and state directory, always down."""
    skip_without_features()
    work = factory.mktemp(stem)
    extra = {"MRC_TESTBED_STATE_DIR": str(work / "state"),
             "MRC_TESTBED_PREFIX": unique(stem[:2]) + "-"}  # fmt: skip
    try:
        with running_testbed("clos", "--ecmp", mode, extra_env=extra, name=unique(stem)) as doc:
            yield BenchBed(doc, extra)
    finally:
        tb("down", "--all", extra_env=extra, check=False)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BenchBed]:
    """The Clos hashing addresses and the flow label (`--ecmp 1`)."""
    yield from _clos(tmp_path_factory, "1", "ecmp")


@pytest.fixture(scope="module")
def l4bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BenchBed]:
    """The same Clos hashing the 5-tuple (`--ecmp 2`), for EVs that pick the source port."""
    yield from _clos(tmp_path_factory, "2", "l4ecmp")


@pytest.fixture
def clean(bed: BenchBed) -> Iterator[BenchBed]:
    try:
        yield bed
    finally:
        bed.tb("fault", "--name", bed.name, "clear", check=False)


def tx_bytes(ns: str, iface: str) -> int:
    out = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", iface],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])


def toward_rack2(bed: BenchBed) -> dict[tuple[int, str], int]:
    """Bytes each tier-1 has sent toward rack 2's tier-0, by (plane, tier-1 letter)."""
    return {(p, x): tx_bytes(bed.ns(f"t1{x}p{p}"), f"t0r2p{p}")
            for p in range(PLANES) for x in TIER1}  # fmt: skip


def bench(bed: BenchBed, encoding: str, nbytes: int, port: int,
          fault: Callable[[], object] | None = None) -> dict[str, Any]:  # fmt: skip
    """Client h1 → server h3, `nbytes` with --verify and the EV `encoding`; `fault` runs once
    a quarter of the bytes crossed rack 2's tier-1 interfaces. The client's -J document."""
    common = ("--ev-encoding", encoding, "--ev-per-plane", EVS)
    server = bed.popen(bed.bench_argv(SERVER, "-s", "-1", "-J", "-B", bed.addrs(SERVER), "-p",
                                      str(port), *common))  # fmt: skip
    client = None
    try:
        bed.wait_bound(SERVER, port)
        start = sum(toward_rack2(bed).values())
        client = bed.popen(bed.bench_argv(
            CLIENT, "-c", bed.addrs(SERVER), "-B", bed.addrs(CLIENT), "-p", str(port), "-n",
            f"{nbytes // MIB}M", "--verify", "-J", *common))  # fmt: skip
        if fault is not None:
            deadline = time.monotonic() + 30
            while sum(toward_rack2(bed).values()) - start < nbytes // 4:
                assert client.poll() is None and time.monotonic() < deadline, "no progress"
                time.sleep(0.01)
            fault()
        c_out, c_err = client.communicate(timeout=120)
        s_out, s_err = server.communicate(timeout=15)
    finally:
        stop(client)
        stop(server)
    assert client.returncode == 0, c_err
    assert server.returncode == 0, s_err
    doc: dict[str, Any] = json.loads(c_out)
    assert doc["end"]["mrc"]["integrity"] == "ok"
    assert json.loads(s_out)["end"]["mrc"]["integrity"] == "ok"
    assert doc["start"]["test_start"]["ev_encoding"] == encoding
    assert doc["start"]["test_start"]["ev_per_plane"] == int(EVS)
    return doc


def shares(before: dict[tuple[int, str], int],
           after: dict[tuple[int, str], int]) -> dict[tuple[int, str], float]:  # fmt: skip
    """Each tier-1's bytes as a fraction of its plane's mean."""
    sent = {k: after[k] - before[k] for k in before}
    out = {}
    for p in range(PLANES):
        mean = sum(sent[p, x] for x in TIER1) / len(TIER1)
        for x in TIER1:
            out[p, x] = round(sent[p, x] / mean, 3)
    return out


def test_the_flow_label_sprays_every_plane_over_every_tier1(clean: BenchBed) -> None:
    before = toward_rack2(clean)
    bench(clean, "flowlabel", 256 * MIB, 4901)
    after = toward_rack2(clean)
    got = shares(before, after)
    print("per-tier-1 share of its plane's mean:", got)
    assert sum(after[k] - before[k] for k in before) >= 256 * MIB  # the data crossed tier 1
    assert all(0.75 <= s <= 1.25 for s in got.values()), got


def test_the_source_port_sprays_every_plane_over_every_tier1(l4bed: BenchBed) -> None:
    # Each EV sends from the pool port it picks (128 per plane): the 5-tuple hash spreads them.
    before = toward_rack2(l4bed)
    bench(l4bed, "udp", 256 * MIB, 4905)
    after = toward_rack2(l4bed)
    got = shares(before, after)
    print("per-tier-1 share of its plane's mean:", got)
    assert sum(after[k] - before[k] for k in before) >= 256 * MIB
    assert all(0.75 <= s <= 1.25 for s in got.values()), got


def test_without_the_flow_label_each_plane_takes_one_tier1(clean: BenchBed) -> None:
    before = toward_rack2(clean)
    bench(clean, "evxh", 64 * MIB, 4902)
    got = shares(before, toward_rack2(clean))
    print("per-tier-1 share of its plane's mean:", got)
    # One 5-tuple per plane: the hash sends all of a plane's data one way.
    assert all(sorted(got[p, x] for x in TIER1) == [0.0, 2.0] for p in range(PLANES)), got


@pytest.mark.parametrize(
    ("fault", "retires"),
    [("blackhole", True), ("link-down", False)],
    ids=["silent-tier1", "tier1-links-down"],
)
def test_a_tier1_lost_mid_transfer(clean: BenchBed, fault: str, retires: bool) -> None:
    """t1bp1 fails a quarter into the transfer. Silently (everything arriving at it dropped):
    the fabric keeps hashing labels onto it, so the sender retires the EVs that land there
    and the plane carries on over t1ap1. With its links down, the tier-0s drop it from the
    multipath route themselves (ignore_routes_with_linkdown) and the labels rehash."""

    def inject() -> None:
        for link in ("t0r1p1-t1bp1", "t0r2p1-t1bp1"):
            clean.tb("fault", "--name", clean.name, fault, link)

    port = 4903 if retires else 4904
    doc = bench(clean, "flowlabel", 256 * MIB, port, inject)
    mrc = doc["end"]["mrc"]
    retired = [e for e in mrc["events"] if e["event"] == "path-retired" and e["plane"] == 1]
    print(fault, "plane 1 retirements:", len(retired), mrc["retransmits_by_cause"])
    assert all(e["plane"] != 1 for e in mrc["events"] if e["event"] == "plane-down"), [
        (e["t"], e["event"], e["detail"]) for e in mrc["events"] if e["event"] != "path-retired"]
    if retires:
        assert len(retired) >= 8, mrc["events"]  # about half of plane 1's labels hash there

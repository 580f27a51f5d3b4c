"""`mrc bench --paths` over `up clos` (4 hosts in 2 racks, 4 planes, 2 tier-1 switches per
plane): issue 4's acceptance runs.

h1 (rack 1) writes 256 MiB to a server on h3 (rack 2) with `--verify` (`exec NODE -- python -m
mrc bench … --paths FILE -J`), through SRv6 paths that name one tier-1 switch each; 256 MiB takes
2-4 s over veth here. Checked with the kernel's interface counters and independent decoders
(scapy, and tshark where installed): every tier-1 of every plane forwards a fair share of the
data toward rack 2, and what leaves a tier-1 carries a type-4 routing header whose segment list
is that path (64 MiB is plenty for that capture). Then one fault per test, injected half a
second after data starts to flow (0.5-0.8 s into the transfer): a tier-1 switch down, a host
plane link down, a flapping link, 1 % loss on one plane, one plane at a tenth of the rate.
Every run ends `integrity ok` on both sides; the faults that break paths show the broken
path's EVs retired (or, for the host link, the plane down) in the sender's `end.mrc`.

The testbed is private to this module: its own namespace prefix and state directory
(`MRC_TESTBED_PREFIX`, `MRC_TESTBED_STATE_DIR`), taken down in every case.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
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

PLANES, TIER1 = 4, ("a", "b")
CLIENT, SERVER = "h1", "h3"  # rack 1 writes to rack 2
RACK_OF_SERVER = 2
MIB = 1 << 20


@dataclass
class Bed(BenchBed):
    #: The SRv6 path table the testbed wrote (`paths NAME -o FILE`).
    paths: Path = Path()

    def fault(self, *args: str) -> None:
        self.tb("fault", "--name", self.name, *args)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    skip_without_features()
    work = tmp_path_factory.mktemp("clos-bench")
    extra = {"MRC_TESTBED_STATE_DIR": str(work / "state"),
             "MRC_TESTBED_PREFIX": unique("mb") + "-"}
    try:
        with running_testbed("clos", extra_env=extra, name=unique("bench")) as doc:
            b = Bed(doc, extra, PLANES, work / "paths.json")
            b.tb("paths", b.name, "-o", str(b.paths))
            yield b
    finally:  # the prefix is ours alone: anything left behind by a crash goes too
        tb("down", "--all", extra_env=extra, check=False)


@pytest.fixture
def clean(bed: Bed) -> Iterator[Bed]:
    """The testbed, with every fault cleared afterwards whatever happened."""
    try:
        yield bed
    finally:
        bed.tb("fault", "--name", bed.name, "clear", check=False)


# -- counters ---------------------------------------------------------------------------------


def tx_bytes(ns: str) -> dict[str, int]:
    """Every interface's transmitted bytes in a namespace."""
    out = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show"], capture_output=True,
                         text=True, check=True).stdout
    return {row["ifname"]: int(row["stats64"]["tx"]["bytes"]) for row in json.loads(out)}


def tier1_toward_server(bed: Bed) -> dict[str, int]:
    """Bytes each tier-1 switch has sent toward the server's rack, by switch name."""
    return {
        f"t1{x}p{p}": tx_bytes(bed.ns(f"t1{x}p{p}"))[f"t0r{RACK_OF_SERVER}p{p}"]
        for p in range(PLANES) for x in TIER1
    }


def client_tx(bed: Bed) -> int:
    return sum(v for k, v in tx_bytes(bed.ns(CLIENT)).items() if k.startswith("p"))


# -- a bench run ------------------------------------------------------------------------------


@dataclass
class Run:
    client: dict[str, Any]  # the client's (sender's) -J document
    server: dict[str, Any]
    seconds: float  # wall time from client start to its exit

    @property
    def mrc(self) -> dict[str, Any]:
        return self.client["end"]["mrc"]  # type: ignore[no-any-return]

    def bits_per_second(self) -> float:
        return float(self.client["end"]["sum_sent"]["bits_per_second"])


def _bench(bed: Bed, node: str, *args: str) -> list[str]:
    return bed.bench_argv(node, *args, "--paths", str(bed.paths))


def _wait_flowing(bed: Bed, before: int, proc: subprocess.Popen[str],
                  at_least: int = 2 * MIB, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while client_tx(bed) - before < at_least:
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail("the transfer never started")
        time.sleep(0.02)


#: A fault to inject mid-transfer; it gets the bit rate one plane was carrying just before.
Fault = Callable[[float], object]


def bench(bed: Bed, nbytes: str, port: int, fault: Fault | None = None, delay: float = 0.5,
          timeout: float = 90) -> Run:
    """`mrc bench` server on h3, client on h1 writing `nbytes` with --verify; `fault` runs
    `delay` seconds after h1's data starts to flow (so about 0.5-0.8 s into the transfer)."""
    server = bed.popen(_bench(bed, SERVER, "-s", "-1", "-J", "-B", bed.addrs(SERVER), "-p",
                              str(port)))
    client = None
    try:
        bed.wait_bound(SERVER, port)
        before = client_tx(bed)
        t0 = time.monotonic()
        client = bed.popen(_bench(bed, CLIENT, "-c", bed.addrs(SERVER), "-p", str(port), "-n",
                                  nbytes, "--verify", "-J", "-i", "0.5"))
        if fault is not None:
            _wait_flowing(bed, before, client)
            t1, b1 = time.monotonic(), client_tx(bed)
            time.sleep(delay)
            per_plane = (client_tx(bed) - b1) * 8 / (time.monotonic() - t1) / PLANES
            fault(per_plane)
        c_out, c_err = client.communicate(timeout=timeout)
        seconds = time.monotonic() - t0
        s_out, s_err = server.communicate(timeout=15)
    finally:
        stop(client)
        stop(server)
    assert client.returncode == 0, c_err
    assert server.returncode == 0, s_err
    run = Run(json.loads(c_out), json.loads(s_out), seconds)
    total = int(nbytes[:-1]) * MIB
    assert run.mrc["integrity"] == "ok", run.mrc["integrity"]
    assert run.server["end"]["mrc"]["integrity"] == "ok"
    assert run.mrc["messages_verified"] == total // MIB  # one 1 MiB WRITE each
    assert run.client["end"]["sum_sent"]["bytes"] == total
    return run


# -- what end.mrc says ------------------------------------------------------------------------


def plane_events(run: Run, plane: int, kind: str) -> list[dict[str, Any]]:
    return [e for e in run.mrc["events"] if e["event"] == kind and e["plane"] == plane]


def per_path(run: Run, plane: int) -> dict[int, dict[str, int]]:
    """Per path of `plane`: EVs, EVs retired at least once, retirements, packets sent."""
    out: dict[int, dict[str, int]] = {}
    for e in run.mrc["evs"]:
        if e["plane"] == plane:
            d = out.setdefault(e["path"], {"evs": 0, "retired_evs": 0, "retirements": 0,
                                           "packets": 0})
            d["evs"] += 1
            d["retired_evs"] += e["times_retired"] > 0
            d["retirements"] += e["times_retired"]
            d["packets"] += e["packets_sent"]
    return out


def summary(run: Run) -> str:
    counts: dict[tuple[str, int], int] = {}
    for e in run.mrc["events"]:
        counts[e["event"], e["plane"]] = counts.get((e["event"], e["plane"]), 0) + 1
    return (f"{run.bits_per_second() / 1e6:.0f} Mbit/s in {run.seconds:.1f} s, retransmits "
            f"{run.mrc['retransmits_by_cause']}, events {counts}")


# -- 1. balance over every tier-1 --------------------------------------------------------------


def test_verified_256mib_crosses_every_tier1_evenly(clean: Bed) -> None:
    """256 MiB h1 → h3 with --verify: every tier-1 of every plane forwards data toward rack 2
    (bytes its interface toward rack 2's tier-0 sent), each within ±25 % of the mean."""
    before = tier1_toward_server(clean)
    run = bench(clean, "256M", 4801)
    after = tier1_toward_server(clean)
    sent = {t: after[t] - before[t] for t in after}
    avg = mean(sent.values())
    shares = {t: round(n / avg, 3) for t, n in sent.items()}
    print(summary(run), "per-tier-1 share of the mean:", shares)
    assert avg > (256 * MIB) / len(sent) * 0.9, sent  # the data did cross the tier-1s
    assert all(0.75 <= s <= 1.25 for s in shares.values()), (
        f"tier-1 shares outside ±25 % of the mean: {shares}; {summary(run)}")


# -- 2. the routing header on the wire ---------------------------------------------------------

CAPTURE = r"""
import select, socket, struct, sys, time
dev, path, count, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))  # ETH_P_ALL
s.bind((dev, 0))
out = open(path, "wb")
out.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 256, 1))  # pcap, Ethernet
print("ready", flush=True)
end, got = time.monotonic() + secs, 0
while got < count and time.monotonic() < end:
    if not select.select([s], [], [], 0.05)[0]:
        continue
    frame, addr = s.recvfrom(65535)
    if addr[2] != socket.PACKET_OUTGOING:  # egress toward the receiver's rack only
        continue
    t = time.time()
    out.write(struct.pack("<IIII", int(t), int(t % 1 * 1e6), min(len(frame), 256), len(frame)))
    out.write(frame[:256])
    got += 1
out.close()
print(got, flush=True)
"""


def _capture(bed: Bed, node: str, iface: str, pcap: Path, count: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", bed.ns(node), sys.executable, "-c", CAPTURE, iface, str(pcap),
         str(count), "20"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _tshark_rows(pcap: Path) -> list[dict[str, Any]]:
    fields = ["ipv6.src", "ipv6.dst", "ipv6.nxt", "ipv6.routing.type", "ipv6.routing.segleft",
              "ipv6.routing.srh.last_entry", "ipv6.routing.srh.addr", "udp.dstport"]
    argv = ["tshark", "-n", "-r", str(pcap), "-T", "fields", "-E", "separator=|",
            "-E", "aggregator=,", "-E", "occurrence=a"]
    for f in fields:
        argv += ["-e", f]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    rows = []
    for line in out.splitlines():
        src, dst, nxt, rtype, segleft, last, addrs, dport = line.split("|")
        rows.append({"src": src, "dst": dst, "nh": nxt.split(",")[0], "type": rtype,
                     "segleft": segleft, "last": last, "addrs": addrs.split(",") if addrs else [],
                     "dport": dport})
    return rows


def _scapy_rows(pcap: Path) -> list[dict[str, Any]]:
    from scapy.layers.inet import UDP
    from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
    from scapy.utils import rdpcap

    rows = []
    for pkt in rdpcap(str(pcap)):
        if IPv6 not in pkt:
            continue
        srh = pkt.getlayer(IPv6ExtHdrSegmentRouting)
        rows.append({"src": pkt[IPv6].src, "dst": pkt[IPv6].dst, "nh": str(pkt[IPv6].nh),
                     "type": str(srh.type) if srh else "", "segleft": str(srh.segleft) if srh
                     else "", "last": str(srh.lastentry) if srh else "",
                     "addrs": list(srh.addresses) if srh else [],
                     "dport": str(pkt[UDP].dport) if UDP in pkt else ""})
    return rows


def test_tier1_egress_carries_the_paths_srh(clean: Bed, tmp_path: Path) -> None:
    """While h1 writes to h3, what t1ap0 and t1bp2 send toward rack 2 is IPv6 with a type-4
    routing header: segment list [h3's address, that tier-1's SID] (End consumed it, segments
    left 0), as the path table says. Decoded by scapy's IPv6ExtHdrSegmentRouting and, where it
    is installed, by tshark; never by mrc's own decoder. Captured with AF_PACKET on the
    tier-1's egress interface (End rewrites the header in place, so ingress shows it before)."""
    table = json.loads(clean.paths.read_text())
    watch = {"t1ap0": (0, 0), "t1bp2": (2, 1)}  # switch → (plane, path index)
    pcaps = {sw: tmp_path / f"{sw}.pcap" for sw in watch}
    caps = {sw: _capture(clean, sw, f"t0r{RACK_OF_SERVER}p{plane}", pcaps[sw], 300)
            for sw, (plane, _) in watch.items()}
    try:
        bench(clean, "64M", 4802)
        for cap in caps.values():
            assert cap.communicate(timeout=25)[0].strip() == "300"
    finally:
        for cap in caps.values():
            stop(cap)
    decoders = [("scapy", _scapy_rows)]
    if shutil.which("tshark"):
        decoders.insert(0, ("tshark", _tshark_rows))
    for sw, (plane, idx) in watch.items():
        entry = next(e for e in table["entries"]
                     if (e["src_node"], e["dst_node"], e["plane"]) == (CLIENT, SERVER, plane))
        segments = entry["paths"][idx]["segments"]
        assert segments == [clean.doc["sids"][sw]]
        want = [entry["dst"], *reversed(segments)]  # the SRH's list: last segment first
        for decoder, rows_of in decoders:
            rows = [r for r in rows_of(pcaps[sw]) if r["src"] == entry["src"]]
            assert len(rows) >= 250, (decoder, sw, len(rows))
            for r in rows:  # every packet h1 sent through this switch is source-routed
                assert (r["dst"], r["nh"], r["type"], r["segleft"], r["last"]) == (
                    entry["dst"], "43", "4", "0", str(len(want) - 1)), (decoder, sw, r)
                assert r["addrs"] == want, (decoder, sw, r)
            assert {r["dport"] for r in rows} == {"4802"}, (decoder, sw)


# -- 3. faults during a transfer ---------------------------------------------------------------
#
# 512 MiB each (2-4 s here). Spurious retransmission timeouts retire some healthy EVs too on a
# busy 2-core machine, so the checks name the broken path and ask for its EVs, not for
# silence elsewhere.


EV_PER_PATH = 16 // len(TIER1)  # bench's default 16 EVs per plane, spread over its paths
#: What a fault test moves: the fault comes 0.5-0.8 s after data starts to flow, and at about
#: 3 Gbit/s a 256 MiB transfer was over by 1.1 s (a flap then saw two or three outages, and
#: one EV of a dead path could stay unused): 512 MiB keeps a second of transfer after it.
FAULT_BYTES = "512M"


def retired_evs(run: Run, plane: int, path: int) -> tuple[set[int], set[int]]:
    """EVs of `path` on `plane` named by a path-retired event, and those whose
    `evs[].times_retired` is above 0."""
    evs = {e["ev"]: e for e in run.mrc["evs"] if e["plane"] == plane and e["path"] == path}
    named = {e["ev"] for e in run.mrc["events"]
             if e["event"] == "path-retired" and e["plane"] == plane and e["ev"] in evs}
    return named, {ev for ev, e in evs.items() if e["times_retired"] > 0}


def _check_path_retired(run: Run, plane: int, path: int, at_least: int = EV_PER_PATH) -> None:
    """Path-retired events name EVs of `path` on `plane`, and at least `at_least` of the path's
    EVs show times_retired > 0; the plane itself never went down, on either side (a plane with
    one dead path of two still carries data both ways)."""
    named, counted = retired_evs(run, plane, path)
    detail = f"{summary(run)}; per path {per_path(run, plane)}"
    assert named and len(counted) >= at_least, (
        f"plane {plane} path {path}: {len(named)} EVs named by path-retired events, "
        f"{len(counted)} with times_retired > 0 (want >= {at_least}); {detail}")
    assert plane_events(run, plane, "plane-down") == [], detail
    withdrawn = [e for e in run.server["end"]["mrc"]["events"]
                 if e["event"] == "port-down" and e["plane"] == plane]
    assert withdrawn == [], f"the receiver withdrew plane {plane}: {withdrawn}; {detail}"


def test_tier1_switch_down(clean: Bed) -> None:
    """t1bp1 (plane 1's path t1-1) loses both its links mid-transfer: path-retired events on
    plane 1 name EVs of that path, and at least the path's share of plane 1's EVs (8 of 16)
    show times_retired > 0."""
    def fault(_: float) -> None:
        for link in ("t0r1p1-t1bp1", "t0r2p1-t1bp1"):
            clean.fault("link-down", link)

    run = bench(clean, FAULT_BYTES, 4811, fault)
    print(summary(run), per_path(run, 1))
    _check_path_retired(run, 1, 1)


def test_host_plane_link_down(clean: Bed) -> None:
    """h1-p2 goes down mid-transfer: the sender's sends fail, plane 2 goes down (`local`) and
    stays down, and the other planes finish the transfer."""
    run = bench(clean, FAULT_BYTES, 4812, lambda _: clean.fault("link-down", "h1-p2"))
    print(summary(run))
    assert [e for e in plane_events(run, 2, "plane-down") if e["detail"] == "local"], summary(run)
    states = {p["plane"]: p["state"] for p in run.mrc["planes"]}
    assert states[2] == "down", states


def test_flapping_tier1_link(clean: Bed) -> None:
    """t0r1p0-t1ap0 (plane 0's path t1-0) flaps every 100 ms (50 ms down, 50 ms up) until the
    transfer ends: path-retired events name EVs of that path, and at least half of its 8 EVs
    show times_retired > 0 (an EV that sent nothing while the link was down keeps its record:
    a transfer of a second or more after the flap starts sees about 10 outages)."""
    run = bench(clean, FAULT_BYTES, 4813, lambda _: clean.fault(
        "flap", "t0r1p0-t1ap0", "--period", "100", "--count", "0", "--background"))
    print(summary(run), per_path(run, 0))
    _check_path_retired(run, 0, 0, at_least=EV_PER_PATH // 2)


def test_one_percent_loss_on_a_plane(clean: Bed) -> None:
    """1 % random loss arriving at both ends of h1-p3 (data and acknowledgements): EVs of both
    of plane 3's paths are retired (path-retired events name them), at least 8 in all."""
    run = bench(clean, FAULT_BYTES, 4814, lambda _: clean.fault("loss", "h1-p3", "1"))
    print(summary(run), per_path(run, 3))
    named = [retired_evs(run, 3, path)[0] for path in (0, 1)]
    assert all(named) and len(named[0] | named[1]) >= EV_PER_PATH, (summary(run),
                                                                     per_path(run, 3))


def test_plane_at_a_tenth_of_the_rate(clean: Bed) -> None:
    """h1-p0 (both directions) limited by tbf to a tenth of what each plane was carrying just
    before (measured on h1's interfaces just before: 25-40 Mbit/s here); the other planes
    unlimited. Only integrity is required; the bytes each plane carried are printed."""
    limit: list[int] = []

    def fault(per_plane: float) -> None:
        limit.append(max(int(per_plane / 10), 1_000_000))
        clean.fault("rate", "h1-p0", f"{limit[0]}bit")

    run = bench(clean, FAULT_BYTES, 4815, fault)
    sent = [p["bytes_sent"] for p in run.mrc["planes"]]
    print(f"plane 0 limited to {limit[0] / 1e6:.1f} Mbit/s;", summary(run),
          "bytes sent per plane:", sent)

"""SRv6 paths in io: the path table file, the MTU arithmetic, per-path sockets, and a real run.

The last tests build a tiny kernel SRv6 fabric (`srv6_minifabric`: A — S1 / S2 — B) and run
`mrc bench --paths` across it; they need root and skip with the reason otherwise.
"""

from __future__ import annotations

import asyncio
import copy
import errno
import ipaddress
import json
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from srv6_minifabric import A_ADDR, B_ADDR, CAPTURE, SID, MiniFabric, child_env, skip_reason

from mrc.cli import main
from mrc.core.endpoint import Endpoint
from mrc.core.flush import SendResult
from mrc.core.transmit import Transmit
from mrc.io.endpoint import IoEndpoint
from mrc.io.pathtable import PathEntry, PathTable, PathTableError, SrPath
from mrc.io.planes import PlaneSocket
from mrc.io.srv6 import MRC_DATA_HEADERS, PathMtuError, PathSockets, check_path_mtu, packet_size
from mrc.wire.srh import SRH

H1, H3 = "fd00:0:1::1", "fd00:0:3::1"
T1, T2 = "fc00:0:a::", "fc00:0:b::"


def good_doc() -> dict[str, Any]:
    return {
        "version": 1,
        "testbed": "clos-3f2a",
        "entries": [
            {
                "src": H1,
                "dst": H3,
                "plane": 0,
                "src_node": "h1",
                "dst_node": "h3",
                "paths": [
                    {"name": "t1-0", "segments": [T1]},
                    {"name": "t1-1", "segments": [T2, "fc00:0:c::"]},
                ],
            },
            {
                "src": H3,
                "dst": H1,
                "plane": 0,
                "src_node": "h3",
                "dst_node": "h1",
                "paths": [{"name": "t1-0", "segments": [T1]}, {"name": "t1-1", "segments": [T2]}],
            },
            {
                "src": "fd00:1:1::1",
                "dst": "fd00:1:3::1",
                "plane": 1,
                "src_node": "h1",
                "dst_node": "h3",
                "paths": [{"name": "direct", "segments": []}],
            },
        ],
    }


# -- loading ----------------------------------------------------------------------------------


def test_good_file_loads_and_looks_up_both_directions(tmp_path: Path) -> None:
    f = tmp_path / "paths.json"
    f.write_text(json.dumps(good_doc()))
    table = PathTable.load(str(f))
    assert table.testbed == "clos-3f2a" and len(table) == 3
    fwd = table.lookup(H1, H3, 0)
    assert fwd is not None and fwd.srv6 and (fwd.src_node, fwd.dst_node) == ("h1", "h3")
    assert [p.name for p in fwd.paths] == ["t1-0", "t1-1"]
    assert [str(s) for s in fwd.paths[1].segments] == [T2, "fc00:0:c::"]
    back = table.lookup(H3, H1, 0)
    assert back is not None and back.dst_node == "h1" and len(back.paths) == 2
    # Any spelling of the same address finds the entry; other planes or pairs do not.
    assert table.lookup("[fd00:0:1:0:0:0:0:1]", "fd00:0:3::1%eth0", 0) is fwd
    assert table.lookup(H1, H3, 1) is None and table.lookup(H1, "fd00::9", 0) is None
    assert table.lookup("not an address", H3, 0) is None
    direct = table.lookup("fd00:1:1::1", "fd00:1:3::1", 1)
    assert direct is not None and not direct.srv6 and direct.paths[0].direct
    assert table.paths_per_plane([H1, "fd00:1:1::1"], [H3, "fd00:1:3::1"]) == {0: 2, 1: 1}
    assert table.paths_per_plane([H1, "fd00:9::1"], [H3, "fd00:9::2"]) == {0: 2, 1: 1}
    assert table.server_paths_from([H3]) == {0: 2}
    assert [str(a) for a in table.sources_for(H3, 0)] == [H1]
    assert table.planes_between(H1, H3) == [0] and table.entries_from(H3, 0) == [back]


def test_a_server_spreads_its_selectors_over_every_peers_paths(tmp_path: Path) -> None:
    """h3 has a rack neighbour one path away and far peers two or three paths away: its EV
    selectors must be spread mod 6, so each peer's own paths (selector mod 1, 2 or 3) all get
    reverse EVs. (Taking 1 when the counts disagree left h3 with one reverse EV per plane.)"""
    doc = good_doc()
    for dst, n in (("fd00:0:4::1", 1), ("fd00:0:5::1", 3)):
        doc["entries"].append({
            "src": H3, "dst": dst, "plane": 0, "src_node": "h3", "dst_node": "hx",
            "paths": [{"name": f"t1-{k}", "segments": [T1]} for k in range(n)],
        })
    f = tmp_path / "paths.json"
    f.write_text(json.dumps(doc))
    table = PathTable.load(str(f))
    assert table.server_paths_from([H3, "fd00:1:3::1"]) == {0: 6, 1: 1}


def _mutate(path: str, value: Any) -> dict[str, Any]:
    """good_doc() with the value at a dotted path replaced (value DELETE removes the key)."""
    doc = good_doc()
    node: Any = doc
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    for k in keys[:-1]:
        node = node[k]
    if value is DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return doc


DELETE = object()
BAD: list[tuple[Any, str]] = [
    ([], "expected an object, got a list"),
    (_mutate("version", 2), "unsupported version 2"),
    (_mutate("version", True), "unsupported version True"),
    (_mutate("version", DELETE), "missing key 'version'"),
    (_mutate("extra", 1), "unknown key 'extra'"),
    (_mutate("testbed", ""), "testbed: expected a non-empty string"),
    (_mutate("entries", {}), "entries: expected a list, got an object"),
    (_mutate("entries", []), "entries: is empty"),
    (_mutate("entries.0", "h1"), "entries[0]: expected an object, got a string"),
    (_mutate("entries.0.dst_node", DELETE), "entries[0]: missing key 'dst_node'"),
    (_mutate("entries.0.weight", 3), "entries[0]: unknown key 'weight'"),
    (_mutate("entries.0.src", "fd00::zz"), "entries[0].src: 'fd00::zz' is not an IP address"),
    (_mutate("entries.0.src", 7), "entries[0].src: expected a non-empty string, got a number"),
    (_mutate("entries.0.dst", "10.0.0.1"), "not of the same address family"),
    (_mutate("entries.0.dst", H1), "src and dst are the same address"),
    (_mutate("entries.0.plane", "0"), "entries[0].plane: expected an integer, got a string"),
    (_mutate("entries.0.plane", False), "entries[0].plane: expected an integer, got a boolean"),
    (_mutate("entries.0.plane", -1), "entries[0].plane: -1 is outside 0..31"),
    (_mutate("entries.0.plane", 32), "entries[0].plane: 32 is outside 0..31"),
    (_mutate("entries.0.src_node", None), "entries[0].src_node: expected a non-empty string"),
    (_mutate("entries.0.paths", []), "entries[0].paths: is empty"),
    (_mutate("entries.0.paths.1.name", "t1-0"), "duplicate path name 't1-0'"),
    (_mutate("entries.0.paths.1.name", DELETE), "entries[0].paths[1]: missing key 'name'"),
    (_mutate("entries.0.paths.1.segments", T1), "paths[1].segments: expected a list"),
    (_mutate("entries.0.paths.1.segments", ["fc00::g"]), "segments[0]: 'fc00::g' is not an IPv6"),
    (_mutate("entries.0.paths.1.segments", ["10.0.0.1"]), "is not an IPv6 address (a SID)"),
    (_mutate("entries.0.paths.1.segments", [T1, H3]), "ends with the destination"),
    (_mutate("entries.0.paths.1.segments", [T1] * 127), "127 segments, at most 126"),
    (
        _mutate("entries.2", {**good_doc()["entries"][0], "src": "10.0.0.1", "dst": "10.0.0.3"}),
        "SRv6 segments need IPv6 src and dst",
    ),
    (_mutate("entries.2", copy.deepcopy(good_doc()["entries"][0])), "a second entry for"),
]


@pytest.mark.parametrize(("doc", "needle"), BAD)
def test_malformed_tables_are_one_clear_line(doc: Any, needle: str) -> None:
    with pytest.raises(PathTableError) as info:
        PathTable.from_document(doc, source="t.json")
    message = str(info.value)
    assert "\n" not in message and message.startswith("t.json: ")
    assert needle in message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"version": 1,', "not valid JSON"),
        ("", "not valid JSON: Expecting value (line 1, column 1)"),
        ("[" * 100000, "not valid JSON"),
    ],
)
def test_not_json(text: str, needle: str) -> None:
    with pytest.raises(PathTableError, match=r"^t\.json: ") as info:
        PathTable.parse(text, source="t.json")
    assert needle in str(info.value)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(PathTableError, match=r"cannot read .*missing\.json: No such file"):
        PathTable.load(str(tmp_path / "missing.json"))
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PathTableError, match="not UTF-8"):
        PathTable.load(str(tmp_path / "bin.json"))


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["-c", H3, "--paths", "{missing}"], "--paths: cannot read"),
        (["-s", "-B", H1, "--paths", "{bad}"], "--paths: {bad}: entries: is empty"),
        (["--demo", "--paths", "{bad}"], "--paths does not apply"),
    ],
)
def test_bench_rejects_a_bad_paths_file_in_one_line(
    tmp_path: Path, argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_mutate("entries", [])))
    names = {"missing": str(tmp_path / "missing.json"), "bad": str(bad)}
    assert main(["bench", *(a.format(**names) for a in argv)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and needle.format(**names) in err


# -- the SRH and the MTU arithmetic -----------------------------------------------------------


def test_srh_of_a_path_is_type_4_with_the_destination_last() -> None:
    path = SrPath("p", (ipaddress.IPv6Address(T1), ipaddress.IPv6Address(T2)))
    raw = path.srh(ipaddress.IPv6Address(H3))
    assert raw is not None
    data = raw.encode()
    # next header UDP, 3 segments of 16 bytes, type 4, segments_left = last_entry = 2
    assert data[:5] == bytes([17, 6, 4, 2, 2]) and len(data) == 8 + 48 == path.srh_size()
    back = SRH.decode(data)
    assert [str(s) for s in back.segments] == [H3, T2, T1]
    assert SrPath("d", ()).srh(back.segments[0]) is None and SrPath("d", ()).srh_size() == 0


def _entry(*paths: SrPath) -> PathEntry:
    return PathEntry(
        ipaddress.IPv6Address(H1), ipaddress.IPv6Address(H3), 2, "h1", "h3", tuple(paths)
    )


def _path(name: str, n: int) -> SrPath:
    return SrPath(name, tuple(ipaddress.IPv6Address(f"fc00::{i + 1}") for i in range(n)))


def test_packet_size_arithmetic() -> None:
    assert MRC_DATA_HEADERS == 12 + 4 + 4 + 4 + 16 + 4
    assert packet_size(4096, _path("d", 0)) == 4096 + 44 + 8 + 40
    assert packet_size(4096, _path("s", 1)) == 4096 + 44 + 8 + 40 + 8 + 32
    assert packet_size(4096, _path("s", 3)) == 4096 + 44 + 8 + 40 + 8 + 64
    assert packet_size(4096, _path("s", 1), secured=True) == 4096 + 44 + 24 + 8 + 40 + 40
    assert packet_size(1000, _path("d", 0), ip_version=4) == 1000 + 44 + 8 + 20


def test_mtu_check_passes_at_the_boundary_and_fails_one_byte_over() -> None:
    entry = _entry(_path("t1-0", 0), _path("t1-1", 2))
    need = packet_size(4096, _path("t1-1", 2))  # 4096 + 44 + 8 + 40 + 56 = 4244
    assert need == 4244
    mtus = check_path_mtu(entry, 4096, mtu_of=lambda s, d, p: need)
    assert mtus == {"t1-0": need, "t1-1": need}
    with pytest.raises(PathMtuError) as info:
        check_path_mtu(entry, 4096, mtu_of=lambda s, d, p: 9000 if p.direct else need - 1)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"plane 2, path t1-1 ({H1} -> {H3}): ")
    assert "4096 payload + 44 mrc headers + 8 UDP + 40 IPv6 + 56 SRH (3 segments)" in msg
    assert "= 4244 bytes > path MTU 4243; use --payload-mtu 4095 or less" in msg
    with pytest.raises(PathMtuError, match=r"security trailer .* use --payload-mtu 4072 "):
        check_path_mtu(entry, 4096, secured=True, mtu_of=lambda s, d, p: need)
    with pytest.raises(PathMtuError, match="even --payload-mtu 256 does not fit"):
        check_path_mtu(entry, 4096, mtu_of=lambda s, d, p: 300)


def test_mtu_check_reports_a_missing_route() -> None:
    def no_route(s: object, d: object, p: object) -> int:
        raise OSError(101, "Network is unreachable")

    with pytest.raises(PathTableError, match=r"plane 2, path t1-0: no route from .* unreachable"):
        check_path_mtu(_entry(_path("t1-0", 1)), 4096, mtu_of=no_route)


# -- per-path sockets on loopback (no root) ---------------------------------------------------


@pytest.fixture
def loop_table() -> Iterator[tuple[PathTable, PlaneSocket]]:
    try:
        plane = PlaneSocket(0, "::1", 0, reuseport=True)
    except OSError:
        pytest.skip("no IPv6 loopback")
    lo = ipaddress.IPv6Address("::1")
    paths = (_path("p0", 1), SrPath("p1", ()), _path("p2", 2))
    table = PathTable([PathEntry(lo, lo, 0, "a", "b", paths)])
    yield table, plane
    plane.close()


def test_path_sockets_pick_by_ev_carry_the_srh_and_never_receive(
    loop_table: tuple[PathTable, PlaneSocket],
) -> None:
    table, plane = loop_table
    peer = ("::1", 9, 0, 0)
    ps = PathSockets(table)
    try:
        opened = ps.open(plane, peer)
        assert len(opened.socks) == 3 and opened.socks[1] is None
        for ev in (0, 3, 0x01000000 | 6, 0x01FFFFFF):
            assert ps.via(plane, peer, ev) is opened.socks[(ev & 0xFFFFFF) % 3]
        other = ("::2", 9, 0, 0)
        assert ps.via(plane, other, 0) is None  # a peer the table lacks: direct
        assert ps.source_routed(plane, peer) and not ps.source_routed(plane, other)
        entry = table.lookup("::1", "::1", 0)
        assert entry is not None
        for path, sock in zip(entry.paths, opened.socks, strict=True):
            if sock is None:
                continue
            srh = path.srh(entry.dst)
            assert srh is not None
            got = sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_RTHDR, 512)
            assert got[2] == 4 and SRH.decode(got).segments == srh.segments
            assert sock.getsockname()[:2] == plane.bound_addr[:2]  # same address and port
        # Datagrams to the shared port all reach the plane socket, never a path socket.
        for i in range(64):
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as tx:
                tx.sendto(bytes([i]), plane.bound_addr)  # a new source port each time
        time.sleep(0.05)
        got_plane = len(plane.drain(128))
        assert got_plane == 64
    finally:
        ps.close()
    assert ps.via(plane, peer, 0) is None  # closed: everything goes direct


def test_reuseport_plane_socket_still_refuses_a_taken_port() -> None:
    first = PlaneSocket(0, "127.0.0.2", 0, reuseport=True)
    try:
        with pytest.raises(OSError) as info:
            PlaneSocket(0, "127.0.0.2", first.bound_addr[1], reuseport=True)
        assert info.value.errno == errno.EADDRINUSE
    finally:
        first.close()
    again = PlaneSocket(0, "127.0.0.2", first.bound_addr[1], reuseport=True)  # free again
    again.close()


def _without_reuseport() -> tuple[PlaneSocket, PathSockets]:
    """A plane socket on ::1 opened without reuseport, and path sockets toward ::1 over it:
    their opening fails."""
    try:
        plane = PlaneSocket(0, "::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback")
    lo = ipaddress.IPv6Address("::1")
    return plane, PathSockets(PathTable([PathEntry(lo, lo, 0, "a", "b", (_path("p0", 1),))]))


def test_path_sockets_need_a_reuseport_plane_socket() -> None:
    plane, ps = _without_reuseport()
    try:
        with pytest.raises(PathTableError, match="opened without reuseport"):
            ps.open(plane, ("::1", 9, 0, 0))
        assert ps.errors == []  # (raised, not kept)
        assert ps.via(plane, ("::1", 9, 0, 0), 0) is None
        (error,) = ps.take_errors()
        assert "opened without reuseport" in error and ps.take_errors() == []
        assert ps.via(plane, ("::1", 9, 0, 0), 1) is None and ps.errors == []  # reported once
    finally:
        ps.close()
        plane.close()


def test_io_reports_a_path_that_fails_to_open_on_first_use_once() -> None:
    plane, ps = _without_reuseport()
    errors: list[str] = []
    loop = asyncio.new_event_loop()
    core = Endpoint(rng=random.Random(1))
    io: IoEndpoint[Any] = IoEndpoint(loop, core, {0: plane}, paths=ps, on_error=errors.append)
    try:
        peer = ("::1", 9, 0, 0)
        for ev in range(3):
            # Each send goes out direct (the plane's own socket) once the paths failed.
            assert io.send(Transmit(0, peer, b"x", ev), 0.0) is SendResult.SENT
        assert len(errors) == 1 and "opened without reuseport" in errors[0]
        assert io.counters["path_open_error"] == 1 and ps.errors == []
    finally:
        io.close()
        loop.close()


# -- a real kernel SRv6 fabric ----------------------------------------------------------------


@pytest.fixture(scope="module")
def fabric() -> Iterator[MiniFabric]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    fab = MiniFabric()
    try:
        try:
            fab.up()
        except RuntimeError as exc:
            pytest.skip(str(exc))
        yield fab
    finally:
        fab.down()


def _bench(fab: MiniFabric, node: str, *args: str) -> list[str]:
    return fab.argv(node, sys.executable, "-m", "mrc", "bench", *args)


@pytest.mark.parametrize("reverse", [False, True], ids=["A-writes", "B-writes"])
def test_bench_over_two_srv6_paths(fabric: MiniFabric, tmp_path: Path, reverse: bool) -> None:
    """8 MiB verified across both paths; the writer's data leaves through BOTH switches."""
    table = tmp_path / "paths.json"
    table.write_text(json.dumps(fabric.path_table()))
    port = "4791"
    # Links from the switches toward the receiver, and the (src, dst) of the data packets.
    toward = "a" if reverse else "b"
    src, dst = (B_ADDR, A_ADDR) if reverse else (A_ADDR, B_ADDR)
    before = {sw: fabric.tx_bytes(sw, f"{sw.lower()}{toward}") for sw in ("S1", "S2")}
    procs: list[subprocess.Popen[str]] = []
    try:
        capture = subprocess.Popen(
            fabric.argv("S1", sys.executable, "-c", CAPTURE, f"s1{toward}", "40", "15"),
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(capture)
        assert capture.stdout is not None and capture.stdout.readline().strip() == "ready"
        server = subprocess.Popen(
            _bench(fabric, "B", "-s", "-1", "-J", "-B", B_ADDR, "-p", port, "--paths", str(table)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        procs.append(server)
        deadline = time.monotonic() + 10
        client = None
        while time.monotonic() < deadline:  # the server binds in a moment; retry until then
            client = subprocess.run(
                _bench(fabric, "A", "-c", B_ADDR, "-p", port, "-n", "8M", "--verify", "-J",
                       "--paths", str(table), "--connect-timeout", "2",
                       *(["-R"] if reverse else [])),
                capture_output=True, text=True, env=child_env(), timeout=30,
            )  # fmt: skip
            if "no answer" not in client.stderr:
                break
            time.sleep(0.1)
        assert client is not None and client.returncode == 0, client.stderr if client else ""
        s_out, s_err = server.communicate(timeout=15)
        capture.terminate()
        frames = capture.communicate(timeout=5)[0].split("\n")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert server.returncode == 0, s_err
    doc = json.loads(client.stdout)
    mrc_end = doc["end"]["mrc"]
    assert mrc_end["integrity"] == "ok" and mrc_end["messages_verified"] == 8
    assert doc["start"]["test_start"]["paths"] == str(table)
    assert doc["start"]["connected"][0]["paths"] == 2 and mrc_end["planes"][0]["paths"] == 2
    assert doc["start"]["connected"][0]["local_host"] == A_ADDR  # picked from the table
    sdoc = json.loads(s_out)
    assert sdoc["start"]["test_start"]["paths"] == str(table)
    assert sdoc["end"]["mrc"]["planes"][0]["paths"] == 2
    # Both switches forwarded the data toward the receiver, each a fair share of it.
    sent = {sw: fabric.tx_bytes(sw, f"{sw.lower()}{toward}") - before[sw] for sw in ("S1", "S2")}
    assert all(n > (8 << 20) // 4 for n in sent.values()), sent
    _check_captured_srh(frames, src, dst)


def _check_captured_srh(lines: list[str], src: str, dst: str) -> None:
    """Decode what S1 forwarded toward `dst` with scapy (not our decoder): a type-4 SRH whose
    segment list is the path through S1, its one SID consumed by S1's End."""
    scapy_all = pytest.importorskip("scapy.all")
    from scapy.layers.inet import UDP
    from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting

    rows = [line.split() for line in lines if line.strip()]
    packets = [scapy_all.Ether(bytes.fromhex(hexed)) for _, hexed in rows]
    assert packets and max(int(n) for n, _ in rows) > 4096, "no data packet captured on S1"
    ports = set()
    for pkt in packets:
        ip6 = pkt[IPv6]
        srh = pkt[IPv6ExtHdrSegmentRouting]
        assert (ip6.src, ip6.dst, ip6.nh) == (src, dst, 43)
        assert srh.type == 4 and srh.segleft == 0 and srh.lastentry == 1 and srh.nh == 17
        assert list(srh.addresses) == [dst, SID["S1"]]
        ports.add((pkt[UDP].sport, pkt[UDP].dport))
    assert len(ports) == 1  # every path sends from the plane socket's port
    if src == B_ADDR:
        assert ports.pop()[0] == 4791


def test_path_mtu_too_small_fails_at_connect(fabric: MiniFabric, tmp_path: Path) -> None:
    table = tmp_path / "paths.json"
    table.write_text(json.dumps(fabric.path_table()))
    fabric.set_mtu("A", "a1", 4200)
    try:
        proc = subprocess.run(
            _bench(fabric, "A", "-c", B_ADDR, "-p", "4791", "-n", "1M", "--paths", str(table)),
            capture_output=True, text=True, env=child_env(), timeout=30,
        )  # fmt: skip
    finally:
        fabric.set_mtu("A", "a1", 9000)
    assert proc.returncode == 1
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith(f"mrc bench: plane 0, path via-s1 ({A_ADDR} -> {B_ADDR}): ")
    assert "40 SRH (2 segments) = 4228 bytes > path MTU 4200; use --payload-mtu 4068 or less" in err


def test_path_mtu_check_reserves_the_security_trailer(fabric: MiniFabric, tmp_path: Path) -> None:
    """4228 bytes fit a 4240-byte path in the clear, but not with the 24-byte trailer."""
    table = tmp_path / "paths.json"
    table.write_text(json.dumps(fabric.path_table()))
    fabric.set_mtu("A", "a1", 4240)
    try:
        proc = subprocess.run(
            _bench(fabric, "A", "-c", B_ADDR, "-p", "4791", "-n", "1M", "--paths", str(table),
                   "--security", "auth"),
            capture_output=True, text=True, env=child_env(), timeout=30,
        )  # fmt: skip
    finally:
        fabric.set_mtu("A", "a1", 9000)
    assert proc.returncode == 1
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith(f"mrc bench: plane 0, path via-s1 ({A_ADDR} -> {B_ADDR}): ")
    assert "security trailer" in err and "> path MTU 4240" in err

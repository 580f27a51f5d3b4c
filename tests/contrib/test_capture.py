"""A real `mrc bench` transfer captured with dumpcap, read back by the three readers.

Root only (capturing on `lo` needs it), and only where dumpcap and tshark are installed. The
bench runs on the four loopback planes of tests/cli/benchproc.py; dumpcap records only the
bench's port, at most 16 MB. With one datagram per packet (--flowcell 1, 512 bytes of each
captured), packet for packet: tshark with
tools/wireshark/mrc.lua (`-T fields -e mrc.psn -e mrc.opcode -e mrc.ev`) and `mrc dissect -J`
agree on PSN, opcode and EV; the data and control opcodes a transfer uses all appear; and the
scapy layers round-trip one packet of every opcode seen (bytes and `decode_packet` record).
With the default flowcell, whole: both readers split each GSO batch into the same packets, and
the data packets cover every PSN of the transfer. With `--security auth`: both find the
trailer of every packet but the REQUEST, so payloads are exact. With `--ev-encoding flowlabel`
on ::1: both show each packet's flow label, its EV's low 20 bits.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cli"))
from benchproc import ROOT, Server, client, env  # type: ignore[import-not-found]

from mrc.wire import DATA_OPCODES, Opcode, decode_packet

pytest.importorskip("scapy")
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root"),
    pytest.mark.skipif(
        not (shutil.which("dumpcap") and shutil.which("tshark")), reason="needs dumpcap and tshark"
    ),
]
LUA = Path(ROOT) / "tools" / "wireshark" / "mrc.lua"


def start_dumpcap(port: int, out: Path, snaplen: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        ["dumpcap", "-i", "lo", "-f", f"udp port {port}", "-s", str(snaplen), "-B", "64",
         "-a", "filesize:16000", "-a", "duration:60", "-P", "-w", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # dumpcap creates the file once it captures; give it a moment to open the interface too.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.stat().st_size > 0:
            time.sleep(0.3)
            return proc
        time.sleep(0.05)
    stop(proc)
    pytest.skip(f"dumpcap did not start: {proc.stderr.read() if proc.stderr else ''}")


def stop(proc: subprocess.Popen[str]) -> int:
    """Stop dumpcap; the packets it says the kernel or it dropped (-1: it did not say)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    found = re.search(r"received/dropped on interface .*: (\d+)/(\d+)", err or "")
    return int(found.group(2)) if found else -1


def run_captured(
    pcap: Path, snaplen: int, *bench: str, both: tuple[str, ...] = (), ipv6: bool = False
) -> tuple[Path, int, int]:
    """Capture one bench transfer into `pcap`: (pcap, the bench's port, packets dropped).
    `bench` goes to the client, `both` to the client and the server; `ipv6`: one plane, ::1."""
    addrs = ["::1"] if ipv6 else None
    server = Server("-1", *both, addrs=addrs)
    dumpcap = None
    dropped = -1
    try:
        dumpcap = start_dumpcap(server.port, pcap, snaplen)
        proc = client(server.port, "-n", "4M", "-l", "1M", "--verify", *bench, *both,
                      addrs=addrs, binds=addrs, timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "integrity: ok" in proc.stdout
        time.sleep(0.3)  # the last ACKs and the DISCONNECTs
    finally:
        if dumpcap is not None:
            dropped = stop(dumpcap)
        server.stop()
    return pcap, int(server.port), dropped


#: An expert note of tshark's own UDP dissector, not of mrc.lua.
_TSHARK_NOTE = re.compile(r"Possible traceroute: hop #\d+, attempt #\d+")


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """One datagram per packet (--flowcell 1), 512 bytes of each."""
    return run_captured(tmp_path_factory.mktemp("capture") / "bench.pcap", 512, "--flowcell", "1")


@pytest.fixture(scope="module")
def gso_capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """The default flowcell: on lo the capture sees each GSO batch whole, every byte of it."""
    return run_captured(tmp_path_factory.mktemp("capture") / "gso.pcap", 0)


def tshark_rows(pcap: Path, port: int) -> list[tuple[int, int, int, int | None]]:
    """(frame, psn, opcode, ev or None) of every MRC packet, read through mrc.lua."""
    proc = subprocess.run(
        ["tshark", "-n", "-X", f"lua_script:{LUA}", "-d", f"udp.port=={port},mrc", "-r",
         str(pcap), "-Y", "mrc", "-T", "fields", "-e", "frame.number", "-e", "mrc.psn",
         "-e", "mrc.opcode", "-e", "mrc.ev"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Lua" not in proc.stderr, proc.stderr
    rows = []
    for line in proc.stdout.splitlines():
        frame, psn, opcode, ev = line.split("\t")
        rows.append((int(frame), int(psn), int(opcode, 16), int(ev, 16) if ev else None))
    return rows


def dissect_doc(pcap: Path, port: int) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "mrc", "dissect", "-J", "-p", str(port), str(pcap)],
        capture_output=True, text=True, timeout=60, env=env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_lua_and_mrc_dissect_agree_packet_for_packet(capture: tuple[Path, int, int]) -> None:
    pcap, port, _ = capture
    rows = tshark_rows(pcap, port)
    doc = dissect_doc(pcap, port)
    ours = [
        (p["number"], p["psn"], Opcode[p["opcode"]].value, p["ev"])
        for p in doc["packets"]
        if "not_mrc" not in p
    ]
    assert len(rows) > 1024  # 4 MiB in 4 KiB packets, plus their SACKs
    assert rows == ours
    assert all(p["malformed"] is None for p in doc["packets"])
    seen = {Opcode(op) for _, _, op, _ in rows}
    # What a bench transfer sends (its messages end with WRITE_LAST_IMM, and it probes no EV
    # when nothing is lost, so RELIABILITY_PROBE, NACK and WRITE_LAST/ONLY may not appear).
    assert {
        Opcode.CM_REQUEST, Opcode.CM_REPLY, Opcode.WRITE_FIRST, Opcode.WRITE_MIDDLE,
        Opcode.WRITE_LAST_IMM, Opcode.RELIABILITY_SACK, Opcode.ACKNOWLEDGE,
        Opcode.ENDPOINT_REQUEST, Opcode.ENDPOINT_RESPONSE, Opcode.CM_DISCONNECT,
    } <= seen  # fmt: skip
    # Every data packet carries an EV on one of the four planes; CM packets carry none.
    for _, _, op, ev in rows:
        if op in {o.value for o in DATA_OPCODES}:
            assert ev is not None and ev >> 24 in range(4)
        if Opcode(op).name.startswith("CM_"):
            assert ev is None


def test_scapy_round_trips_every_opcode_seen(capture: tuple[Path, int, int]) -> None:
    from scapy.layers.inet import UDP
    from scapy.utils import rdpcap

    from mrc.contrib.scapy_mrc import MRC_BTH

    pcap, port, _ = capture
    firsts: dict[int, bytes] = {}
    for frame in rdpcap(str(pcap)):
        udp = frame.getlayer(UDP)
        if udp is not None and port in (udp.sport, udp.dport):
            data = bytes(udp.payload)
            if data and data[0] not in firsts:
                firsts[data[0]] = data
    assert len(firsts) >= 9
    for op, data in sorted(firsts.items()):
        layers = MRC_BTH(data)
        assert bytes(layers) == data, Opcode(op).name
        assert int(layers.opcode) == op
        record = decode_packet(data)
        assert layers.dest_qp == record.dest_qp
        if op not in {o.value for o in DATA_OPCODES}:  # control packets are captured whole
            assert record.encode() == data, Opcode(op).name


def test_gso_batches_split_alike(gso_capture: tuple[Path, int, int]) -> None:
    pcap, port, dropped = gso_capture
    lua: dict[int, list[tuple[int, int, int]]] = {}  # frame: its packets' (psn, opcode, qp)
    proc = subprocess.run(
        ["tshark", "-n", "-X", f"lua_script:{LUA}", "-d", f"udp.port=={port},mrc", "-r",
         str(pcap), "-Y", "mrc", "-T", "fields", "-e", "frame.number", "-e", "mrc.psn",
         "-e", "mrc.opcode", "-e", "mrc.dest_qp"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and "Lua" not in proc.stderr, proc.stderr
    for line in proc.stdout.splitlines():
        frame, *columns = line.split("\t")
        psns, ops, qps = ([int(v, 0) for v in c.split(",")] for c in columns)
        lua[int(frame)] = list(zip(psns, ops, qps, strict=True))
    ours: dict[int, list[tuple[int, int, int]]] = {}
    for p in dissect_doc(pcap, port)["packets"]:
        assert p["malformed"] is None and not p.get("gso"), p
        ours.setdefault(p["number"], []).append(
            (p["psn"], Opcode[p["opcode"]].value, p["dest_qp"]))
    assert ours == lua
    assert len([pkts for pkts in lua.values() if len(pkts) > 1]) > 10  # the flowcells
    # The client's QP gets the transfer: 4 messages of 256 packets (and a short message at the
    # end), each PSN once, from the initial PSN on (which may lie just below the 2^24 wrap).
    data_ops = {o.value for o in DATA_OPCODES}
    by_qp: dict[int, set[int]] = {}
    for pkts in lua.values():
        for psn, op, qp in pkts:
            if op in data_ops:
                by_qp.setdefault(qp, set()).add(psn)
    if dropped != 0:  # a busy machine: the capture, not the readers, lost packets
        pytest.skip(f"dumpcap dropped {dropped} packets: the PSNs cannot all be there")
    main = max(by_qp.values(), key=len)
    starts = [psn for psn in main if (psn - 1) % (1 << 24) not in main]
    assert len(starts) == 1
    offsets = {(psn - starts[0]) % (1 << 24) for psn in main}
    assert offsets == set(range(len(main))) and len(main) >= 1024


@pytest.fixture(scope="module")
def secured_capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """`--security auth`: every packet after the handshake ends in a 24-byte trailer."""
    pcap = tmp_path_factory.mktemp("capture") / "secured.pcap"
    return run_captured(pcap, 0, "--flowcell", "1", both=("--security", "auth"))


def test_secured_transfer_payloads_exclude_trailers(
    secured_capture: tuple[Path, int, int],
) -> None:
    pcap, port, _ = secured_capture
    proc = subprocess.run(
        ["tshark", "-n", "-X", f"lua_script:{LUA}", "-d", f"udp.port=={port},mrc", "-r",
         str(pcap), "-Y", "mrc", "-T", "fields", "-e", "frame.number", "-e", "mrc.opcode",
         "-e", "mrc.payload_length", "-e", "mrc.tx_counter", "-e", "_ws.expert.message"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and "Lua" not in proc.stderr, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    # tshark's UDP dissector adds "Possible traceroute" to any datagram whose port falls in
    # 33434-33534, which a client's ephemeral source port sometimes does: not mrc.lua's word.
    lua = {int(f): (int(op, 16), length, counter, _TSHARK_NOTE.sub("", expert).strip(",")) for
           f, op, length, counter, expert in rows}  # fmt: skip
    packets = [p for p in dissect_doc(pcap, port)["packets"] if "not_mrc" not in p]
    assert [p["number"] for p in packets] == sorted(lua)
    middles = 0
    for p in packets:
        op, length, counter, expert = lua[p["number"]]
        assert p["malformed"] is None and expert == "", p
        assert Opcode[p["opcode"]].value == op
        no_trailer = op in (Opcode.CM_REQUEST.value, Opcode.CM_REJECT.value)
        assert (p.get("trailer") is None) == no_trailer == (counter == ""), p
        if op == Opcode.WRITE_MIDDLE.value:
            middles += 1
            assert p["record"]["payload_length"] == 4096 and length == "4096"
    assert middles > 900


@pytest.fixture(scope="module")
def flowlabel_capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """`--ev-encoding flowlabel` on both sides, ::1: agreed in CM, each datagram's EV rides in
    its flow label instead of an EVXH."""
    pcap = tmp_path_factory.mktemp("capture") / "flowlabel.pcap"
    try:
        return run_captured(pcap, 256, "--flowcell", "1", both=("--ev-encoding", "flowlabel"),
                            ipv6=True)  # fmt: skip
    except RuntimeError as exc:  # no IPv6 loopback
        pytest.skip(str(exc))


def test_flow_labels_carry_the_evs(flowlabel_capture: tuple[Path, int, int]) -> None:
    pcap, port, _ = flowlabel_capture
    proc = subprocess.run(
        ["tshark", "-n", "-X", f"lua_script:{LUA}", "-d", f"udp.port=={port},mrc", "-r",
         str(pcap), "-Y", "mrc", "-T", "fields", "-e", "frame.number", "-e", "mrc.ev",
         "-e", "mrc.flow_label"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and "Lua" not in proc.stderr, proc.stderr
    lua = {int(f): (ev, label) for f, ev, label in (line.split("\t")
                                                    for line in proc.stdout.splitlines())}
    checked = 0
    data_labels: set[int] = set()
    for p in dissect_doc(pcap, port)["packets"]:
        ev, label = lua[p["number"]]
        assert (int(ev, 16) if ev else None) == p["ev"]
        assert (int(label, 16) if label else 0) == p["flow_label"]
        op = Opcode[p["opcode"]].value
        if op < Opcode.CM_REQUEST.value:
            # Both sides asked: agreed in CM, so no EVXH; the EV rides in the label alone.
            assert p["ev"] is None, p
            if op <= Opcode.WRITE_ONLY_IMM.value:
                data_labels.add(p["flow_label"])
            checked += 1
    assert checked > 1000
    assert len(data_labels) >= 16 and 0 not in data_labels  # sprayed over the plane's EVs

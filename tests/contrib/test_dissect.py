"""`mrc dissect` and tools/wireshark/mrc.lua on a capture written by scapy from mrc.wire records.

The capture holds one packet of every record of test_scapy_mrc.RECORDS (every opcode and header
variant), then the bad cases: a UDP datagram on another port, an ARP frame, a SACK cut after
its BTH, a two-byte datagram, an ACK followed by a 24-byte security trailer, a GSO batch of
three data packets (split into them), a datagram longer than any packet that is no batch
(flagged), and one record over IPv6. `mrc dissect` must print one line per packet
with the record's key fields, `-J` must hold every record field for field, `-V` every header;
bad files are one line on stderr. tshark with mrc.lua must read the same fields (skipped when
tshark is missing).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("scapy")
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Ether
from scapy.utils import wrpcap
from test_scapy_mrc import RECORDS

from mrc.cli import dissect
from mrc.cli import main as mrc_main
from mrc.wire import (
    AETH,
    AckPacket,
    CmPacket,
    DataPacket,
    EndpointPacket,
    NackPacket,
    Opcode,
    ProbePacket,
    SackPacket,
)
from mrc.wire.cm import CM_HEAD, REQUEST_TAG_SIZE, TIMESTAMP_SIZE

ROOT = Path(__file__).resolve().parent.parent.parent
LUA = ROOT / "tools" / "wireshark" / "mrc.lua"
ACK = AckPacket(dest_qp=0x10, psn=0x100, ev=0x01000002, aeth=AETH(0x1F, 7))
MIDDLE = next(r for _, r in RECORDS if isinstance(r, DataPacket) and r.opcode.name ==
              "WRITE_MIDDLE")  # fmt: skip
# A flowcell as a capture before GSO splitting holds it: two MIDDLEs and a shorter LAST_IMM.
GSO = [dataclasses.replace(MIDDLE, psn=10), dataclasses.replace(MIDDLE, psn=11),
       dataclasses.replace(MIDDLE, psn=12, opcode=Opcode.WRITE_LAST_IMM, imm=5,
                           payload=b"\1" * 60)]  # fmt: skip
# Longer than any one packet, and no second packet inside: shown whole, flagged.
BIG = dataclasses.replace(MIDDLE, opcode=Opcode.WRITE_ONLY, dma_length=9000, payload=b"\2" * 9000)
N_RECORDS = len(RECORDS)


def ether() -> Any:
    # Explicit addresses: without them scapy would look the destination up (ARP, timeouts).
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def frame(payload: bytes, sport: int = 4791, dport: int = 4791) -> Any:
    return ether() / IP(src="192.0.2.1", dst="192.0.2.2") / UDP(sport=sport, dport=dport) / payload


@pytest.fixture(scope="module")
def pcap(tmp_path_factory: pytest.TempPathFactory) -> Path:
    frames = [frame(r.encode(), sport=50000 + i) for i, (_, r) in enumerate(RECORDS)]
    frames += [
        frame(b"not mrc at all", sport=53, dport=53),
        ether() / ARP(pdst="192.0.2.9", psrc="192.0.2.1"),
        frame(dict(RECORDS)["sack-ps"].encode()[:12]),  # a SACK's BTH (EVX set), nothing after
        frame(b"\xdc\x00"),
        frame(ACK.encode() + bytes(range(24))),
        frame(b"".join(r.encode() for r in GSO)),
        frame(BIG.encode()),
        ether() / IPv6(src="fd00::1", dst="fd00::2", fl=0x12345) / UDP(sport=4791, dport=4791)
        / RECORDS[0][1].encode(),
    ]  # fmt: skip
    path = tmp_path_factory.mktemp("dissect") / "records.pcap"
    wrpcap(str(path), frames)
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = mrc_main(["dissect", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_one_line_per_packet_with_key_fields(
    pcap: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(capsys, str(pcap))
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert len(lines) == N_RECORDS + 10  # 8 frames more, one of them 3 packets
    first = lines[0].split()
    assert first[:2] == ["1", "0.000000"]
    assert first[2:5] == ["192.0.2.1:50000", ">", "192.0.2.2:4791"]
    assert first[5:9] == ["WRITE_FIRST", "qp=0x123456", f"psn={0xABCDEF}", "ev=0x01000007"]
    assert "msn=6" in first and "rkey=0xDEADBEEF" in first and "dma_length=100" in first
    by_name = dict(zip([n for n, _ in RECORDS], lines, strict=False))
    assert "cack_psn=256" in by_name["sack-ps"] and "port_state=0xF" in by_name["sack-ps"]
    assert "nack_reason=TRIMMED " in by_name["nack-TRIMMED"] + " "
    assert "probe_id=48879" in by_name["ep-request-probe"]
    assert "syndrome=0x62" in by_name["ack-nak-noevx"] and "ev=" not in by_name["ack-nak-noevx"]
    assert "security=2" in by_name["CM_REPLY-2"] and "ev=" not in by_name["CM_REPLY-2"]
    bad = lines[N_RECORDS:]
    assert bad[0].endswith("192.0.2.1:53 > 192.0.2.2:53 UDP 53 > 53, 14 bytes")
    assert "not UDP: Ether / ARP" in bad[1]
    assert bad[2].endswith("malformed: length: EVXH needs 4 bytes, 0 left")
    assert bad[3].endswith("(no BTH) len=2 malformed: length: BTH needs 12 bytes, datagram has 2")
    assert "ACKNOWLEDGE" in bad[4] and bad[4].endswith("msn=7 trailer=24")
    for k, (line, record) in enumerate(zip(bad[5:8], GSO, strict=True), 1):
        assert line.startswith(f" {N_RECORDS + 6}.{k}    0.")
        assert f"{record.opcode.name} qp=0x123456 psn={record.psn} " in line
        assert line.endswith(f"payload_length={len(record.payload)} (GSO segment {k} of 3)")
    assert "WRITE_ONLY" in bad[8] and "len=9040" in bad[8]
    assert bad[8].endswith("(a GSO batch of several packets: only the first is dissected)")
    assert "fd00::1:4791 > fd00::2:4791 WRITE_FIRST" in bad[9]
    assert "ev=0x01000007 flow_label=0x12345 len=140" in bad[9]


def test_json_holds_every_record_field(pcap: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "-J", str(pcap))
    assert rc == 0
    doc = json.loads(out)
    packets = doc["packets"]
    assert [p["number"] for p in packets] == [
        *range(1, N_RECORDS + 7), N_RECORDS + 6, N_RECORDS + 6, N_RECORDS + 7, N_RECORDS + 8]
    for (name, record), pkt in zip(RECORDS, packets, strict=False):
        assert pkt["malformed"] is None, name
        assert pkt["record"] == dissect._plain(record), name
        assert pkt["opcode"] == (record.opcode.name if hasattr(record, "opcode") else {
            SackPacket: "RELIABILITY_SACK", NackPacket: "RELIABILITY_NACK",
            AckPacket: "ACKNOWLEDGE", ProbePacket: "RELIABILITY_PROBE"}[type(record)])  # fmt: skip
        if isinstance(record, EndpointPacket):
            psn = record.probe_id
        elif isinstance(record, CmPacket):
            psn = 0
        else:
            psn = record.cack_psn if isinstance(record, SackPacket) else record.psn
        assert pkt["psn"] == psn, name
        if isinstance(record, CmPacket) or not getattr(record, "evx", True):
            assert pkt["ev"] is None, name
        else:
            assert pkt["ev"] == record.ev, name
        assert pkt["headers"][0]["name"] == "MRC BTH"
        assert pkt["headers"][0]["fields"]["dest_qp"] == record.dest_qp
    sack = packets[[n for n, _ in RECORDS].index("sack-ps")]
    assert sack["record"]["seth"]["sack_bitmap"] == 1 << 58
    assert [h["name"] for h in sack["headers"]] == [
        "MRC BTH", "MRC EVXH", "MRC SETH", "MRC CC_STATE", "MRC PORTSTATE"]  # fmt: skip
    bad = packets[N_RECORDS:]
    assert bad[0]["not_mrc"] == "UDP 53 > 53, 14 bytes"
    assert (bad[2]["malformed"], bad[3]["malformed"]) == ("length", "length")
    assert bad[4]["trailer"] == 24 and bad[4]["record"]["aeth"] == {"syndrome": 31, "msn": 7}
    for k, (pkt, record) in enumerate(zip(bad[5:8], GSO, strict=True), 1):
        assert (pkt["segment"], pkt["segments"]) == (k, 3)
        assert pkt["record"] == dissect._plain(record)
        assert pkt["length"] == len(record.encode())
    assert bad[8]["gso"] is True and bad[8]["record"]["payload_length"] == 9000
    assert bad[9]["flow_label"] == 0x12345 and "flow_label" not in bad[8]


def test_verbose_tree(pcap: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "-V", str(pcap))
    assert rc == 0
    block = out.split("\n    2 ")[0].splitlines()
    assert block[1] == "    UDP 192.0.2.1:50000 > 192.0.2.2:4791, 140 bytes of payload"
    assert "    MRC BTH" in block and "        opcode = WRITE_FIRST" in block
    assert "        psn = 0xabcdef" in block and "        ev = 0x1000007" in block
    assert block[-2:] == ["    payload", "        length = 100"]


def test_port_selection(pcap: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "-p", "53", str(pcap))
    lines = out.splitlines()
    assert rc == 0 and lines[N_RECORDS].endswith("UDP 53 > 53, 14 bytes") is False
    assert "malformed" in lines[N_RECORDS]  # port 53 is now MRC's: "not mrc" has no BTH
    assert all(f"UDP {50000 + i} > 4791," in lines[i] for i in range(N_RECORDS))
    rc, out, _ = run(capsys, "-p", "any", str(pcap))
    lines = out.splitlines()
    assert "WRITE_FIRST" in lines[0] and "not MRC" not in lines[0]
    assert lines[N_RECORDS].endswith("UDP 53 > 53, 14 bytes")  # 'n' is no MRC opcode
    rc, _, err = run(capsys, "-p", "99999", str(pcap))
    assert (rc, err) == (1, "mrc dissect: bad port '99999' (1-65535 or 'any')\n")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"hello world, not a pcap at all", "not a pcap or pcapng capture"),
        (b"", "not a pcap or pcapng capture"),
        (None, "No such file or directory"),
    ],
)
def test_bad_files_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, message: str
) -> None:
    path = tmp_path / "bad.pcap"
    if content is not None:
        path.write_bytes(content)
    rc, out, err = run(capsys, str(path))
    assert (rc, out) == (1, "")
    assert err.startswith(f"mrc dissect: {path}: ") and message in err
    assert err.count("\n") == 1


def test_truncated_capture_shows_what_it_has(
    pcap: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(pcap.read_bytes()[:-30])
    rc, out, err = run(capsys, str(cut))
    assert rc == 1
    assert len(out.splitlines()) == N_RECORDS + 9
    assert err == f"mrc dissect: {cut}: damaged after packet {N_RECORDS + 7}: " \
        "Pcap: packet has been truncated\n"
    rc, out, err = run(capsys, "-J", str(cut))
    assert rc == 1 and "damaged" in json.loads(out)["capture_error"]


def test_pcapng(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scapy.utils import PcapNgWriter

    path = tmp_path / "one.pcapng"
    with PcapNgWriter(str(path)) as w:
        w.write(frame(ACK.encode()))
    rc, out, _ = run(capsys, str(path))
    assert rc == 0 and "ACKNOWLEDGE qp=0x000010 psn=256 ev=0x01000002" in out


def test_without_scapy_one_line(pcap: Path) -> None:
    code = ("import sys; sys.modules['scapy'] = None; from mrc.cli import main; "
            f"sys.exit(main(['dissect', {str(pcap)!r}]))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr == "mrc dissect: needs scapy (pip install 'mrc[dissect]')\n"


# --- the Lua dissector on the same capture ---------------------------------------------------

LUA_FIELDS = ("mrc.opcode", "mrc.dest_qp", "mrc.psn", "mrc.ev", "mrc.msn", "mrc.cack_psn",
              "mrc.sack_bitmap", "mrc.port_state_mask", "mrc.nack_reason", "mrc.nack_psn",
              "mrc.probe_id", "mrc.syndrome", "mrc.port_status_mask", "mrc.rkey", "mrc.va",
              "mrc.dma_length", "mrc.imm", "mrc.cm.local_qpn", "mrc.cm.security",
              "mrc.cm.private_data_len", "mrc.payload_length", "mrc.tx_counter",
              "mrc.flow_label")  # fmt: skip


def lua_expected(record: Any) -> dict[str, str]:
    """What tshark prints for LUA_FIELDS of `record` (hex fields as Wireshark shows them)."""
    e: dict[str, str] = {"mrc.dest_qp": f"0x{record.dest_qp:08x}"}
    ev = getattr(record, "ev", 0)
    if not isinstance(record, CmPacket) and getattr(record, "evx", True):
        e["mrc.ev"] = f"0x{ev:08x}"
    if isinstance(record, DataPacket):
        e.update({"mrc.opcode": f"0x{record.opcode.value:02x}", "mrc.psn": str(record.psn),
                  "mrc.msn": str(record.msn), "mrc.rkey": f"0x{record.rkey:08x}",
                  "mrc.va": f"0x{record.va:016x}", "mrc.dma_length": str(record.dma_length),
                  "mrc.payload_length": str(len(record.payload))})  # fmt: skip
        if record.imm is not None:
            e["mrc.imm"] = f"0x{record.imm:08x}"
    elif isinstance(record, SackPacket):
        e.update({"mrc.opcode": "0xdc", "mrc.psn": str(record.cack_psn),
                  "mrc.cack_psn": str(record.seth.cack_psn),
                  "mrc.sack_bitmap": f"0x{record.seth.sack_bitmap:016x}"})  # fmt: skip
        if record.port_state is not None:
            e["mrc.port_state_mask"] = f"0x{record.port_state:08x}"
    elif isinstance(record, NackPacket):
        e.update({"mrc.opcode": "0xdd", "mrc.psn": str(record.psn),
                  "mrc.nack_reason": f"0x{record.neth.nack_reason.value:02x}",
                  "mrc.nack_psn": str(record.neth.nack_psn)})  # fmt: skip
    elif isinstance(record, AckPacket):
        e.update({"mrc.opcode": "0xd1", "mrc.psn": str(record.psn),
                  "mrc.msn": str(record.aeth.msn), "mrc.syndrome": f"0x{record.aeth.syndrome:02x}"})
    elif isinstance(record, ProbePacket):
        e.update({"mrc.opcode": "0xde", "mrc.psn": str(record.psn),
                  "mrc.probe_id": str(record.peth.probe_id)})  # fmt: skip
    elif isinstance(record, EndpointPacket):
        e.update({"mrc.opcode": f"0x{record.opcode.value:02x}", "mrc.psn": str(record.probe_id),
                  "mrc.probe_id": str(record.probe_id),
                  "mrc.port_status_mask": f"0x{record.header.port_status_mask:08x}"})  # fmt: skip
    else:
        assert isinstance(record, CmPacket)
        e.update({"mrc.opcode": f"0x{record.opcode.value:02x}", "mrc.psn": "0",
                  "mrc.cm.local_qpn": f"0x{record.cmh.local_qpn:08x}",
                  "mrc.cm.security": str(record.cmh.security),
                  "mrc.cm.private_data_len": str(record.cmh.private_data_len)})  # fmt: skip
    return e


@pytest.mark.skipif(shutil.which("tshark") is None, reason="needs tshark")
def test_lua_reads_every_record(pcap: Path) -> None:
    args = ["tshark", "-n", "-X", f"lua_script:{LUA}", "-r", str(pcap), "-T", "fields",
            "-e", "frame.number", "-e", "_ws.expert.message"]  # fmt: skip
    for f in LUA_FIELDS:
        args += ["-e", f]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Lua" not in proc.stderr, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert len(rows) == N_RECORDS + 8
    for (name, record), row in zip(RECORDS, rows, strict=False):
        got = {f: v for f, v in zip(LUA_FIELDS, row[2:], strict=True) if v}
        assert got == lua_expected(record), name
        assert row[1] == "", name  # no expert info
    bad = {int(row[0]) - N_RECORDS: row for row in rows[N_RECORDS:]}
    assert "malformed: EVXH needs 4 bytes, 0 left" in bad[3][1]
    assert "malformed: length (BTH needs 12 bytes)" in bad[4][1]
    assert bad[5][2 + LUA_FIELDS.index("mrc.tx_counter")] == str(
        int.from_bytes(bytes(range(8)), "big"))  # the ACK's trailer
    gso = dict(zip(LUA_FIELDS, bad[6][2:], strict=True))
    assert gso["mrc.psn"] == "10,11,12" and gso["mrc.opcode"] == "0xc7,0xc7,0xc9"
    assert gso["mrc.payload_length"] == "100,100,60" and gso["mrc.imm"] == "0x00000005"
    assert "GSO batch" in bad[7][1]
    assert bad[8][2] == f"0x{Opcode.WRITE_FIRST.value:02x}"
    assert bad[8][2 + LUA_FIELDS.index("mrc.flow_label")] == "0x00012345"


# --- any bytes at all --------------------------------------------------------------------------

_MRC_FIRST = st.sampled_from([op.value for op in Opcode])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200),
                 st.tuples(_MRC_FIRST, st.binary(max_size=200)).map(
                     lambda t: bytes([t[0], 0]) + t[1])))  # fmt: skip
def test_any_payload_is_a_line_never_a_traceback(data: bytes) -> None:
    out = dissect.mrc_fields(data)
    assert (out["malformed"] is None) == ("record" in out)
    pkt = {"number": 1, "rel": 0.0, "src": "a", "dst": "b", "sport": 1, "dport": 2,
           "length": len(data), **out}  # fmt: skip
    assert "\n" not in dissect.summary(pkt)
    dissect.tree(pkt)


@pytest.mark.skipif(shutil.which("tshark") is None, reason="needs tshark")
def test_lua_survives_random_payloads(tmp_path: Path) -> None:
    import random

    rng = random.Random(18)
    ops = [op.value for op in Opcode]
    frames = []
    for i in range(400):
        n = rng.randrange(0, 220)
        body = bytes(rng.randrange(256) for _ in range(n))
        if i % 2 and n >= 2:  # half start like MRC: a known opcode and TVer 0
            body = bytes([rng.choice(ops), rng.randrange(256) & 0xF0]) + body[2:]
        frames.append(frame(body))
    path = tmp_path / "random.pcap"
    wrpcap(str(path), frames)
    proc = subprocess.run(
        ["tshark", "-n", "-X", f"lua_script:{LUA}", "-r", str(path), "-T", "fields",
         "-e", "frame.number", "-e", "_ws.expert.message", "-e", "mrc.opcode"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and "Lua" not in proc.stderr, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert len(rows) == 400
    assert not [r for r in rows if "Lua Error" in r[1] or "Dissector bug" in r[1]]


def test_trailers_of_a_secured_connection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/WIRE.md §7: after a secured CM exchange, every packet but a REQUEST or REJECT ends in
    # a 24-byte trailer; a data packet's would otherwise count as payload.
    named = dict(RECORDS)
    request, reply = named["CM_REQUEST-2"], named["CM_REPLY-2"]
    assert isinstance(request, CmPacket) and isinstance(reply, CmPacket)
    request = dataclasses.replace(
        request, dest_qp=0x1, cmh=dataclasses.replace(request.cmh, local_qpn=0x20, remote_qpn=0))
    reply = dataclasses.replace(
        reply, dest_qp=0x20, cmh=dataclasses.replace(reply.cmh, local_qpn=0x30, remote_qpn=0x20))
    data = dataclasses.replace(named["WRITE_ONLY-ts"], dest_qp=0x30)
    sack = dataclasses.replace(named["sack-ps"], dest_qp=0x20)
    trailer = bytes(range(24))
    path = tmp_path / "secured.pcap"
    wrpcap(str(path), [frame(request.encode()), frame(reply.encode() + trailer),
                       frame(data.encode() + trailer), frame(sack.encode() + trailer)])  # fmt: skip
    rc, out, _ = run(capsys, "-J", str(path))
    packets = json.loads(out)["packets"]
    assert rc == 0 and [p["malformed"] for p in packets] == [None] * 4
    assert [p.get("trailer") for p in packets] == [None, 24, 24, 24]
    assert packets[2]["record"]["payload_length"] == 100
    for p, record in zip(packets, (request, reply, data, sack), strict=True):
        assert p["record"] == dissect._plain(record)
    if shutil.which("tshark"):  # mrc.lua keeps the same list of secured QPNs
        proc = subprocess.run(
            ["tshark", "-n", "-X", f"lua_script:{LUA}", "-r", str(path), "-T", "fields",
             "-e", "mrc.payload_length", "-e", "mrc.tx_counter"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        counter = int.from_bytes(trailer[:8], "big")
        assert proc.stdout.splitlines() == ["\t", f"\t{counter}", f"100\t{counter}", f"\t{counter}"]


def test_a_sealed_request_decodes_with_its_sealed_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/WIRE.md §7 (revision 1.2): a secured REQUEST ends in `sealed` (timestamp and private
    # data, encrypted) and its tag, not in clear private data; before, the strict decoder
    # called every such REQUEST malformed at `private_data_len`.
    request = dict(RECORDS)["CM_REQUEST-2"]
    assert isinstance(request, CmPacket) and request.cmh.security
    head = request.encode()[:CM_HEAD]
    sealed = bytes(range(TIMESTAMP_SIZE + request.cmh.private_data_len + REQUEST_TAG_SIZE))
    path = tmp_path / "sealed.pcap"
    wrpcap(str(path), [frame(head + sealed)])
    rc, out, _ = run(capsys, "-J", str(path))
    (packet,) = json.loads(out)["packets"]
    assert rc == 0 and packet["malformed"] is None and packet["sealed"] == len(sealed)
    shown = dataclasses.replace(request, dest_qp=1, private_data=b"")
    assert packet["record"] == dissect._plain(shown)

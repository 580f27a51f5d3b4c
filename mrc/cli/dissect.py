"""`mrc dissect FILE.pcap [-V] [-J] [-p PORT]`: read a capture and print its MRC packets.

Reads pcap or pcapng with scapy (the `dissect` extra), finds each UDP datagram on an MRC port
(4791 unless `-p` says otherwise; `-p any` tries every datagram whose first byte is an MRC
opcode), decodes its payload strictly with `mrc.wire.decode_packet` and shows its headers as the
scapy layers of `mrc.contrib.scapy_mrc` read them. One line per packet, like tshark's summary;
`-V` adds the full header tree; `-J` prints one JSON document with a list of packets. A packet
that does not decode gets a `malformed: <field>` note (the field `DecodeError` names, docs/WIRE.md
§1); a file that is not a capture, or ends inside a packet, is one line on stderr and exit
status 1. The wire format itself is `mrc.wire`'s; the layers are `mrc.contrib`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

from mrc.cli import COMMANDS
from mrc.wire import (
    CM_OPCODES,
    DATA_OPCODES,
    ROCE_PORT,
    CmPacket,
    DecodeError,
    Opcode,
    decode_packet,
)
from mrc.wire.cm import split_request

_NEEDS_SCAPY = "mrc dissect: needs scapy (pip install 'mrc[dissect]')"
_TRAILER = 24  # docs/WIRE.md §7: a secured connection's packets end with it
_REQUEST = bytes([Opcode.CM_REQUEST.value])
_MRC_OPCODES = frozenset(op.value for op in Opcode)
_DATA = frozenset(op.value for op in DATA_OPCODES)
_CM = frozenset(op.value for op in CM_OPCODES)
_ENDPOINT = frozenset({Opcode.ENDPOINT_REQUEST.value, Opcode.ENDPOINT_RESPONSE.value})
_NO_TRAILER = frozenset({Opcode.CM_REQUEST.value, Opcode.CM_REJECT.value})  # docs/WIRE.md §7
# The longest single packet: payload_mtu 8192, every data header, a trailer (docs/WIRE.md §3,
# §7). A longer datagram in a capture is a UDP GSO batch the kernel had not split yet (§1).
_MAX_PACKET = 8192 + 44 + _TRAILER


class DissectError(Exception):
    """A capture that cannot be read (the message is the one line shown)."""


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "dissect",
        help=COMMANDS["dissect"],
        description="Print the MRC packets of a capture: one line per packet (time, addresses, "
        "opcode, QPN, PSN, EV, lengths and the key fields of its headers), -V for every header "
        "field, -J for JSON. Needs scapy (pip install 'mrc[dissect]').",
    )
    p.add_argument("file", metavar="FILE", help="a pcap or pcapng capture")
    p.add_argument("-V", "--verbose", action="store_true", help="the full header tree")
    p.add_argument("-J", "--json", action="store_true", help="one JSON document")
    p.add_argument("-p", "--port", action="append", metavar="PORT",
                   help=f"UDP port(s) carrying MRC (default {ROCE_PORT}; repeat or comma-separate; "
                   "'any': every datagram that starts with an MRC opcode)")  # fmt: skip
    p.set_defaults(func=run)


def _ports(values: list[str] | None) -> set[int] | None:
    """The ports `-p` names; None for `any`."""
    if not values:
        return {ROCE_PORT}
    ports: set[int] = set()
    for item in ",".join(values).split(","):
        if item.strip() == "any":
            return None
        if not item.strip().isdigit() or not 0 < int(item) < 65536:
            raise DissectError(f"mrc dissect: bad port {item.strip()!r} (1-65535 or 'any')")
        ports.add(int(item))
    return ports


def run(ns: argparse.Namespace) -> int:
    damaged: str | None = None
    shown: list[dict[str, Any]] = []
    try:
        ports = _ports(ns.port)
        # Lines go out as the capture is read (a long capture piped into head); -J is one
        # document, so it waits for the end.
        for pkt in dissect_file(ns.file, ports, text=not ns.json):
            if "capture_error" in pkt:
                damaged = pkt["capture_error"]
            elif ns.json:
                shown.append(pkt)
            else:
                sys.stdout.write(summary(pkt) + "\n" + (tree(pkt) if ns.verbose else ""))
    except DissectError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    if ns.json:
        doc: dict[str, Any] = {"file": ns.file, "packets": shown}
        if damaged:
            doc["capture_error"] = damaged
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    if damaged:
        sys.stderr.write(f"mrc dissect: {ns.file}: {damaged}\n")
        return 1
    return 0


# --- reading -------------------------------------------------------------------------------


class _Warnings(logging.Handler):
    """Collects what scapy's pcap readers log (a truncated record is only a warning there)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def dissect_file(
    path: str, ports: set[int] | None, text: bool = False
) -> Iterator[dict[str, Any]]:
    """One dict per frame of the capture at `path` (see `dissect_frame`); a last dict with only
    `capture_error` if the file turned out damaged. `text`: header fields as scapy shows them
    (hex, enum names) rather than numbers."""
    try:
        from scapy.utils import PcapReader

        from mrc.contrib import scapy_mrc  # noqa: F401  (binds the layers)
    except ImportError:
        raise DissectError(_NEEDS_SCAPY) from None
    log = logging.getLogger("scapy.runtime")
    caught = _Warnings()
    log.addHandler(caught)
    propagate, log.propagate = log.propagate, False
    try:
        try:
            reader = PcapReader(path)
        except OSError as exc:
            raise DissectError(f"mrc dissect: {path}: {exc.strerror or exc}") from None
        except Exception as exc:  # scapy's Scapy_Exception and struct errors on garbage
            msg = f"mrc dissect: {path}: not a pcap or pcapng capture ({exc})"
            raise DissectError(msg) from None
        first: float | None = None
        secured: set[int] = set()  # QPNs of secured connections seen in CM: their trailers
        with reader:
            number = 0
            while True:
                try:
                    frame = reader.read_packet()
                except EOFError:
                    break
                except Exception as exc:
                    yield {"capture_error": f"unreadable after packet {number}: {exc}"}
                    return
                if caught.messages:
                    yield {"capture_error": f"damaged after packet {number}: {caught.messages[0]}"}
                    return
                number += 1
                t = float(frame.time)
                first = t if first is None else first
                yield from dissect_frame(frame, number, t, t - first, ports, text, secured)
            if caught.messages:
                yield {"capture_error": f"damaged after packet {number}: {caught.messages[0]}"}
    finally:
        log.removeHandler(caught)
        log.propagate = propagate


def dissect_frame(
    frame: Any,
    number: int,
    t: float,
    rel: float,
    ports: set[int] | None,
    text: bool = False,
    secured: set[int] | None = None,
) -> list[dict[str, Any]]:
    """A frame as dicts: where it went, and, for MRC, its record's fields and headers. One
    dict, or one per packet of a GSO batch (`segment` k of `segments`, see `split_gso`)."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.inet6 import IPv6

    out: dict[str, Any] = {"number": number, "time": t, "rel": round(rel, 6)}
    ip = frame.getlayer(IP) or frame.getlayer(IPv6)
    udp = frame.getlayer(UDP)
    if ip is None or udp is None:
        out["not_mrc"] = f"not UDP: {frame.summary()}"
        return [out]
    out.update(src=str(ip.src), dst=str(ip.dst), sport=int(udp.sport), dport=int(udp.dport))
    if isinstance(ip, IPv6):
        # Where an ECMP fabric hashes, and where `--ev-encoding flowlabel` puts an EV's low
        # 20 bits (docs/WIRE.md, revision note item 6).
        out["flow_label"] = int(ip.fl)
    data = bytes(udp.payload)
    out["length"] = len(data)
    wire_len = int(getattr(udp, "len", 0) or 0) - 8
    if 0 <= len(data) < wire_len:
        out["captured"] = f"{len(data)} of {wire_len} bytes"
    on_port = ports is None or udp.sport in ports or udp.dport in ports
    if not on_port or (ports is None and (not data or data[0] not in _MRC_OPCODES)):
        out["not_mrc"] = f"UDP {udp.sport} > {udp.dport}, {len(data)} bytes"
        return [out]
    segments = split_gso(data) if "captured" not in out else [data]
    if len(segments) == 1 and max(wire_len, len(data)) > _MAX_PACKET:
        out["gso"] = True  # too long for one packet, and not split: only the first is shown
    if len(segments) == 1:
        out.update(mrc_fields(data, text, secured))
        return [out]
    packets = []
    for k, segment in enumerate(segments, 1):
        one = {**out, "segment": k, "segments": len(segments), "length": len(segment)}
        one.update(mrc_fields(segment, text, secured))
        packets.append(one)
    return packets


def split_gso(data: bytes) -> list[bytes]:
    """The packets of a UDP GSO batch captured before the kernel split it (docs/WIRE.md §1):
    data packets of one size back to back, the last one possibly shorter.

    The size is where the next data packet starts: the first later offset holding a data
    opcode with TVer 0 and the first packet's P_Key, EVX bit and DestQP (a flowcell goes to
    one QP on one EV). Every later start must match the same way, or nothing is split: the
    datagram comes back whole. tools/wireshark/mrc.lua splits by the same rule."""
    n = len(data)
    if n < 2 * 13 or data[0] not in _DATA or data[1] & 0x0F:
        return [data]
    key = data[2:8]
    at = data.find(key, 14)
    while at != -1:
        start = at - 2
        if data[start] in _DATA and not data[start + 1] & 0x0F and n - start >= 12:
            break
        at = data.find(key, at + 1)
    if at == -1:
        return [data]
    size = at - 2
    starts = range(0, n, size)
    for q in starts[1:]:
        if n - q < 12 or data[q] not in _DATA or data[q + 1] & 0x0F or data[q + 2 : q + 8] != key:
            return [data]
    return [data[q : q + size] for q in starts]


def mrc_fields(data: bytes, text: bool = False, secured: set[int] | None = None) -> dict[str, Any]:
    """The BTH summary, the record (or the malformed field) and the header tree of one MRC
    datagram's bytes.

    `secured` holds the QPNs of secured connections whose CM packets the capture showed: a
    packet to one of them (but a CM_REQUEST or CM_REJECT) ends in a 24-byte trailer
    (docs/WIRE.md §7), cut off before decoding. A secured CM packet adds its QPNs to it."""
    from mrc.contrib.scapy_mrc import MRC_BTH, layer_fields

    out: dict[str, Any] = {"opcode": None, "malformed": None}
    if len(data) >= 12:
        op = data[0]
        out["opcode"] = Opcode(op).name if op in _MRC_OPCODES else f"0x{op:02X}"
        out["dest_qp"] = int.from_bytes(data[5:8], "big")
        out["psn"] = int.from_bytes(data[9:12], "big")
        evx = bool(data[4] & 1) and op not in _CM
        out["ev"] = int.from_bytes(data[12:16], "big") if evx and len(data) >= 16 else None
    body = data
    if (secured and out.get("dest_qp") in secured and len(data) > 12 + _TRAILER
            and data[0] not in _NO_TRAILER):  # fmt: skip
        body = data[:-_TRAILER]
        out["trailer"] = _TRAILER
    record: Any = None
    try:
        record = _request(body, out) if body[:1] == _REQUEST else decode_packet(body)
    except DecodeError as exc:
        record = _with_trailer(body, exc) if body is data else None
        if record is None:
            out["malformed"] = exc.field
            out["error"] = str(exc)
        else:
            out["trailer"] = _TRAILER
    if record is not None:
        out["record"] = _plain(record)
        if secured is not None and isinstance(record, CmPacket) and record.cmh.security:
            # Packets to the requester (its QPN is local in a REQUEST, remote in a REPLY) and
            # to the responder (local in a REPLY) carry trailers from now on.
            secured.update(q for q in (record.cmh.local_qpn, record.cmh.remote_qpn) if q)
    try:
        layers = MRC_BTH(data) if len(data) >= 12 else None
    except Exception:  # scapy refuses the bytes: the record (or the malformed note) says it
        layers = None
    out["headers"] = [{"name": n, "fields": f} for n, f in layer_fields(layers, text)] if (
        layers is not None) else []  # fmt: skip
    return out


def _request(data: bytes, out: dict[str, Any]) -> CmPacket:
    """A CM_REQUEST as `mrc.wire.cm.split_request` cuts it: a sealed secured REQUEST's
    timestamp and private data are ciphertext (docs/WIRE.md §7), shown as `sealed` (bytes);
    the open and unsecured forms carry the private data in clear."""
    parts = split_request(data)
    if parts.is_sealed:
        out["sealed"] = len(parts.rest)
    return CmPacket(Opcode.CM_REQUEST, 1, parts.cmh, parts.key_block,
                    b"" if parts.is_sealed else parts.rest, parts.p_key)  # fmt: skip


def _with_trailer(data: bytes, exc: DecodeError) -> Any:
    """The record when `data` decodes once a security trailer is cut off; else None.

    A control packet of a secured connection (docs/WIRE.md §7) has 24 bytes the codec calls
    left over; a data packet's trailer is inside what the codec calls payload."""
    if exc.field not in ("length", "private_data_len") or len(data) <= 12 + _TRAILER or (
            data[0] in _DATA or data[0] in _NO_TRAILER):  # fmt: skip
        return None
    try:
        return decode_packet(data[:-_TRAILER])
    except DecodeError:
        return None


def _plain(value: Any) -> Any:
    """A record as JSON-ready values: dataclasses as dicts, bytes as hex, payloads as length."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.name == "payload":
                out["payload_length"] = len(v)
                continue
            out[f.name] = _plain(v)
        return out
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return value


# --- printing ------------------------------------------------------------------------------

_KEY_FIELDS: dict[str, tuple[str, ...]] = {
    "DataPacket": ("msn", "rqmsn", "a", "rtx", "tx_timestamp", "rkey", "va", "dma_length", "imm",
                   "payload_length"),
    "SackPacket": ("seth.cack_psn", "seth.ack_psn_offset", "seth.sack_offset", "seth.sack_bitmap",
                   "seth.m", "seth.pr", "seth.entropy", "cc.valid", "cc.tx_timestamp",
                   "cc.ooo_count", "cc.rcvd_bytes", "port_state"),
    "NackPacket": ("neth.nack_reason", "neth.nack_psn", "neth.entropy", "neth.tx_timestamp"),
    "AckPacket": ("aeth.syndrome", "aeth.msn"),
    "ProbePacket": ("peth.probe_id", "peth.tx_timestamp"),
    "EndpointPacket": ("probe_id", "header.op", "header.port_status_mask", "header.tx_timestamp"),
    "CmPacket": ("cmh.local_qpn", "cmh.remote_qpn", "cmh.initial_psn", "cmh.plane",
                 "cmh.security", "cmh.reject_reason", "cmh.payload_mtu", "cmh.plane_mask",
                 "cmh.private_data_len"),
}  # fmt: skip
_KIND = {
    "RELIABILITY_SACK": "SackPacket", "RELIABILITY_NACK": "NackPacket",
    "ACKNOWLEDGE": "AckPacket", "RELIABILITY_PROBE": "ProbePacket",
    "ENDPOINT_REQUEST": "EndpointPacket", "ENDPOINT_RESPONSE": "EndpointPacket",
}  # fmt: skip
_HEX = frozenset({"rkey", "va", "sack_bitmap", "entropy", "port_state", "port_status_mask",
                  "plane_mask", "local_qpn", "remote_qpn", "syndrome", "imm"})  # fmt: skip


def _kind(opcode: str) -> str:
    if opcode.startswith("WRITE_"):
        return "DataPacket"
    if opcode.startswith("CM_"):
        return "CmPacket"
    return _KIND.get(opcode, "")


def _lookup(record: dict[str, Any], path: str) -> Any:
    value: Any = record
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _fmt(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int) and name in _HEX:
        return f"0x{value:X}"
    return str(value)


def summary(pkt: dict[str, Any]) -> str:
    """One line for a packet, tshark style."""
    number = str(pkt["number"]) + (f".{pkt['segment']}" if "segment" in pkt else "")
    head = f"{number:>5} {pkt['rel']:11.6f}"
    if "src" not in pkt:
        return f"{head} {pkt['not_mrc']}"
    head += f" {pkt['src']}:{pkt['sport']} > {pkt['dst']}:{pkt['dport']}"
    if "not_mrc" in pkt:
        return f"{head} {pkt['not_mrc']}"
    parts = [head, pkt["opcode"] or "(no BTH)"]
    if "dest_qp" in pkt:
        parts.append(f"qp=0x{pkt['dest_qp']:06X} psn={pkt['psn']}")
    if pkt.get("ev") is not None:
        parts.append(f"ev=0x{pkt['ev']:08X}")
    if pkt.get("flow_label"):
        parts.append(f"flow_label=0x{pkt['flow_label']:05X}")
    parts.append(f"len={pkt['length']}")
    record = pkt.get("record")
    if record is not None:
        for path in _KEY_FIELDS.get(_kind(pkt["opcode"] or ""), ()):
            value = _lookup(record, path)
            if value is not None:
                name = path.rsplit(".", 1)[-1]
                parts.append(f"{name}={_fmt(name, value)}")
    if pkt.get("trailer"):
        parts.append(f"trailer={pkt['trailer']}")
    if pkt.get("gso"):
        parts.append("(a GSO batch of several packets: only the first is dissected)")
    if pkt.get("segment"):
        parts.append(f"(GSO segment {pkt['segment']} of {pkt['segments']})")
    if pkt.get("captured"):
        parts.append(f"(captured {pkt['captured']})")
    if pkt["malformed"] is not None:
        parts.append(f"malformed: {pkt['error']}")
    return " ".join(parts)


def tree(pkt: dict[str, Any]) -> str:
    """Every header field of a packet, one per line, indented under its header."""
    lines = []
    if "src" in pkt:
        lines.append(f"    UDP {pkt['src']}:{pkt['sport']} > {pkt['dst']}:{pkt['dport']}, "
                     f"{pkt['length']} bytes of payload")  # fmt: skip
    for header in pkt.get("headers", ()):
        lines.append(f"    {header['name']}")
        lines.extend(f"        {k} = {v}" for k, v in header["fields"].items())
    return "".join(line + "\n" for line in lines)

"""Scapy layers for every header of the mrc wire format (docs/WIRE.md §2–§7), building and
dissecting.

Holds one `Packet` class per header (`MRC_BTH`, `MRC_EVXH`, `MRC_METH`, `MRC_TSETH`, `MRC_RETH`,
`MRC_ImmDt`, `MRC_SETH`, `MRC_CCState`, `MRC_PortState`, `MRC_NETH`, `MRC_PETH`, `MRC_AETH`,
`MRC_ERTH`, `MRC_EETH`, `MRC_CMH`, `MRC_KeyBlock`, `MRC_SealedRequest` (a secured REQUEST's
sealed timestamp and private data and its tag, revision 1.2), and `MRC_Trailer`, which
dissection picks only when exactly 24 bytes follow a control packet's last header: nothing in a
packet says it is secured), the chaining of docs/WIRE.md §2 (by opcode and the BTH's EVX and TS
bits, SETH's PS bit and CMH's security), the binding to UDP port 4791, and `layer_fields`, the
flat view `mrc dissect` prints. It checks nothing: strict decoding (`DecodeError`) stays with
`mrc.wire.decode_packet`, and a malformed packet dissects as far as its bytes go, the rest
`Raw`. This is the only module of `mrc` that imports scapy.

Building: `UDP()/MRC_BTH(dest_qp=…, psn=…)/MRC_EVXH(ev=…)/MRC_SETH(…)/MRC_CCState(…)` fills
in what the layers imply when it is left unset: UDP ports 4791, the opcode (for an unambiguous
header: SETH is a SACK, RETH without ImmDt a WRITE_ONLY, CMH a CM_REQUEST), BTH.EVX and BTH.TS,
SETH.PS and CMH.private_data_len. Field names follow the spec; an endpoint packet's BTH shows
`probe_id` (its low 16 PSN bits) instead of `psn`.

Relation to `scapy.contrib.roce`: scapy's RoCE `BTH` is InfiniBand's (with an ICRC at the end,
which mrc does not send) and binds UDP dport 4791 as well. Importing this module puts `MRC_BTH`
first in UDP's dissection list for ports 4791 (source or destination), so MRC traffic dissects
as MRC; a datagram whose first byte is not an MRC opcode is handed to RoCE's `BTH` when
`scapy.contrib.roce` is loaded, so plain RoCE traffic still reads as RoCE. RoCE's `BTH` stays
usable on MRC bytes for the 12 bytes the two share (opcode, pkey, dqpn, ackreq, psn).
"""

from __future__ import annotations

import sys
from typing import Any

from scapy.fields import (
    BitEnumField,
    BitField,
    ByteEnumField,
    ByteField,
    ConditionalField,
    IntField,
    ShortEnumField,
    ShortField,
    SignedShortField,
    StrFixedLenField,
    StrLenField,
    XBitField,
    XByteField,
    XIntField,
    XLongField,
    XShortField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, Raw, bind_top_down

from mrc.wire import (
    CM_OPCODES,
    DATA_OPCODES,
    IMM_OPCODES,
    ROCE_PORT,
    EndpointOp,
    NackReason,
    Opcode,
    RejectReason,
    SackMark,
    SecurityLevel,
    Syndrome,
)

__all__ = [
    "LAYERS",
    "MRC_AETH",
    "MRC_BTH",
    "MRC_CMH",
    "MRC_EETH",
    "MRC_ERTH",
    "MRC_EVXH",
    "MRC_METH",
    "MRC_NETH",
    "MRC_PETH",
    "MRC_RETH",
    "MRC_SETH",
    "MRC_TSETH",
    "MRC_CCState",
    "MRC_ImmDt",
    "MRC_KeyBlock",
    "MRC_PortState",
    "MRC_SealedRequest",
    "MRC_Trailer",
    "bind_port",
    "layer_fields",
]

_OPCODE_NAMES = {op.value: op.name for op in Opcode}
_MRC_OPCODES = frozenset(_OPCODE_NAMES)
_DATA = frozenset(op.value for op in DATA_OPCODES)
_IMM = frozenset(op.value for op in IMM_OPCODES)
_CM = frozenset(op.value for op in CM_OPCODES)
_ENDPOINT = frozenset({Opcode.ENDPOINT_REQUEST.value, Opcode.ENDPOINT_RESPONSE.value})


def _names(enum: Any) -> dict[int, str]:
    return {int(v.value): str(v.name) for v in enum}


def _bth_of(layer: Any) -> Any:
    """The MRC_BTH below `layer` (or `layer` itself), or None."""
    while layer is not None and not isinstance(layer, MRC_BTH):
        layer = layer.underlayer
    return layer


def _opcode(bth: Any) -> int | None:
    """The BTH's opcode; when left unset for building, the one its headers imply."""
    if bth is None:
        return None
    if bth.opcode is not None:
        return int(bth.opcode)
    for cls, op in _IMPLIED_OPCODE:
        if bth.haslayer(cls):
            if cls is MRC_RETH and bth.haslayer(MRC_ImmDt):
                return Opcode.WRITE_ONLY_IMM.value
            return op.value
    return None


def _is_endpoint(pkt: Any) -> bool:
    return _opcode(pkt) in _ENDPOINT


class MRC_BTH(Packet):
    """Base Transport Header, 12 bytes (docs/WIRE.md §2), with mrc's EVX, A, RTX and TS bits."""

    name = "MRC BTH"
    fields_desc = [  # noqa: RUF012 (scapy's own declaration style)
        ByteEnumField("opcode", None, _OPCODE_NAMES),
        BitField("se", 0, 1),
        BitField("m", 0, 1),
        BitField("pad_cnt", 0, 2),
        BitField("tver", 0, 4),
        XShortField("p_key", 0xFFFF),
        BitField("fecn", 0, 1),
        BitField("becn", 0, 1),
        BitField("rsvd1", 0, 5),
        BitField("evx", None, 1),
        XBitField("dest_qp", 0, 24),
        BitField("a", 0, 1),
        BitField("r", 0, 1),
        BitField("rtx", 0, 1),
        BitField("ts", None, 1),
        BitField("rsvd2", 0, 4),
        # An endpoint packet's probe id travels in the low 16 PSN bits (docs/WIRE.md §4).
        ConditionalField(XByteField("psn_rsvd", 0), _is_endpoint),
        ConditionalField(XShortField("probe_id", 0), _is_endpoint),
        ConditionalField(XBitField("psn", 0, 24), lambda pkt: not _is_endpoint(pkt)),
    ]

    @classmethod
    def dispatch_hook(cls, _pkt: bytes | None = None, *args: Any, **kargs: Any) -> Any:
        # Port 4791 is RoCE's too: leave bytes that cannot be MRC to scapy's RoCE BTH.
        if _pkt and _pkt[0] not in _MRC_OPCODES:
            roce = sys.modules.get("scapy.contrib.roce")
            if roce is not None:
                return roce.BTH
        return cls

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        out = bytearray(pkt)
        if self.opcode is None:
            out[0] = _opcode(self) or 0
        if self.evx is None and isinstance(self.payload, MRC_EVXH):
            out[4] |= 0x01
        if self.ts is None and self.haslayer(MRC_TSETH):
            out[8] |= 0x10
        return bytes(out) + pay

    def guess_payload_class(self, payload: bytes) -> Any:
        op = _opcode(self)
        if self.evx and op not in _CM:
            return MRC_EVXH
        return _after_bth(self, op)

    def mysummary(self) -> str:
        op = _opcode(self)
        name = _OPCODE_NAMES.get(op or -1, f"0x{op or 0:02X}")
        where = f"probe_id={self.probe_id}" if op in _ENDPOINT else f"psn={self.psn}"
        return f"MRC {name} qp=0x{self.dest_qp:06X} {where}"


def _after_bth(bth: Any, op: int | None) -> Any:
    """The header that follows the BTH (and its EVXH) for opcode `op`, docs/WIRE.md §2."""
    if op in _DATA:
        return MRC_METH
    nxt = _CONTROL_NEXT.get(op or -1)
    return nxt if nxt is not None else Raw


class MRC_EVXH(Packet):
    """Entropy-value extension header, 4 bytes [ours]: `plane 8 | selector 24`."""

    name = "MRC EVXH"
    fields_desc = [XIntField("ev", 0)]  # noqa: RUF012

    def guess_payload_class(self, payload: bytes) -> Any:
        bth = _bth_of(self.underlayer)
        return _after_bth(bth, _opcode(bth))

    def mysummary(self) -> str:
        return f"ev=0x{self.ev:08X}"


class MRC_METH(Packet):
    """Message extension header, 4 bytes (docs/WIRE.md §3)."""

    name = "MRC METH"
    fields_desc = [ShortField("rqmsn", 0), ShortField("msn", 0)]  # noqa: RUF012

    def guess_payload_class(self, payload: bytes) -> Any:
        bth = _bth_of(self.underlayer)
        return MRC_TSETH if bth is not None and bth.ts else MRC_RETH


class MRC_TSETH(Packet):
    """Timestamp extension header, 4 bytes (when BTH.TS = 1)."""

    name = "MRC TSETH"
    fields_desc = [  # noqa: RUF012
        XShortField("tx_timestamp", 0),
        BitField("tsr", 0, 1),
        BitField("rsvd", 0, 11),
        BitField("ftype", 0, 4),
    ]

    def guess_payload_class(self, payload: bytes) -> Any:
        return MRC_RETH


class MRC_RETH(Packet):
    """RDMA extended transport header, 16 bytes: VA, R_Key, DMA_length."""

    name = "MRC RETH"
    fields_desc = [  # noqa: RUF012
        XLongField("va", 0),
        XIntField("rkey", 0),
        IntField("dma_length", 1),
    ]

    def guess_payload_class(self, payload: bytes) -> Any:
        return MRC_ImmDt if _opcode(_bth_of(self.underlayer)) in _IMM else Raw


class MRC_ImmDt(Packet):
    """Immediate data, 4 bytes, on the `*_IMM` opcodes."""

    name = "MRC ImmDt"
    fields_desc = [XIntField("imm", 0)]  # noqa: RUF012

    def guess_payload_class(self, payload: bytes) -> Any:
        return Raw


class MRC_SETH(Packet):
    """SACK extension header, 28 bytes (docs/WIRE.md §4)."""

    name = "MRC SETH"
    fields_desc = [  # noqa: RUF012
        BitField("type", 0, 4),
        BitField("next", 0, 5),
        BitEnumField("m", 0, 2, _names(SackMark)),
        BitField("flags_rsvd", 0, 3),
        BitField("pr", 0, 1),
        BitField("ps", None, 1),
        SignedShortField("ack_psn_offset", 0),
        XIntField("entropy", 0),
        ShortField("spdcid", 0),
        ShortField("dpdcid", 0),
        XByteField("rsvd", 0),
        XBitField("cack_psn", 0, 24),
        BitField("cc_type", 0, 4),
        BitField("cc_flags", 0, 4),
        ByteField("mpr", 8),
        SignedShortField("sack_offset", 0),
        XLongField("sack_bitmap", 0),
    ]

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.ps is None and self.haslayer(MRC_PortState):
            pkt = pkt[:1] + bytes([pkt[1] | 0x01]) + pkt[2:]
        return bytes(pkt) + pay

    def guess_payload_class(self, payload: bytes) -> Any:
        return MRC_CCState


class MRC_CCState(Packet):
    """CC_STATE, 8 bytes, after every SETH."""

    name = "MRC CC_STATE"
    fields_desc = [  # noqa: RUF012
        XShortField("tx_timestamp", 0),
        BitField("v", 0, 1),
        BitField("ooo_count", 0, 15),
        BitField("restore_cwnd", 0, 1),
        BitField("rcv_cwnd_pen", 0, 7),
        BitField("rcvd_bytes", 0, 24),
    ]

    def guess_payload_class(self, payload: bytes) -> Any:
        seth = self.underlayer
        if isinstance(seth, MRC_SETH) and seth.ps:
            return MRC_PortState
        return _trailer_or_raw(payload)


class MRC_PortState(Packet):
    """PORTSTATE, 4 bytes [ours], after CC_STATE when SETH.PS = 1."""

    name = "MRC PORTSTATE"
    fields_desc = [XIntField("port_state_mask", 0)]  # noqa: RUF012

    def guess_payload_class(self, payload: bytes) -> Any:
        return _trailer_or_raw(payload)


class MRC_NETH(Packet):
    """NACK extension header, 20 bytes."""

    name = "MRC NETH"
    fields_desc = [  # noqa: RUF012
        BitField("type", 0, 4),
        BitField("next", 0, 5),
        BitField("rsvd1", 0, 7),
        ByteEnumField("nack_reason", NackReason.TRIMMED.value, _names(NackReason)),
        XByteField("vendor", 0),
        XIntField("entropy", 0),
        ShortField("spdcid", 0),
        ShortField("dpdcid", 0),
        XByteField("rsvd2", 0),
        XBitField("nack_psn", 0, 24),
        BitField("cc_type", 0, 4),
        BitField("cc_flags", 0, 4),
        XByteField("rsvd3", 0),
        XShortField("tx_timestamp", 0),
    ]

    def guess_payload_class(self, payload: bytes) -> Any:
        return _trailer_or_raw(payload)


class MRC_PETH(Packet):
    """Probe extension header, 16 bytes, on RELIABILITY_PROBE."""

    name = "MRC PETH"
    fields_desc = [  # noqa: RUF012
        BitField("type", 0, 4),
        BitField("next", 0, 5),
        BitField("rsvd1", 0, 7),
        XByteField("vendor", 0),
        XByteField("rsvd2", 0),
        ShortField("probe_id", 0),
        XShortField("rsvd3", 0),
        ShortField("spdcid", 0),
        ShortField("dpdcid", 0),
        XShortField("tx_timestamp", 0),
        BitField("tsr", 0, 1),
        BitField("rsvd4", 0, 11),
        BitField("ftype", 0, 4),
    ]

    def guess_payload_class(self, payload: bytes) -> Any:
        return _trailer_or_raw(payload)


class MRC_AETH(Packet):
    """ACK extension header, 4 bytes: IBTA syndrome and the MSN (24 bits on the wire)."""

    name = "MRC AETH"
    fields_desc = [  # noqa: RUF012
        ByteEnumField("syndrome", Syndrome.ACK.value, _names(Syndrome)),
        XBitField("msn", 0, 24),
    ]

    def guess_payload_class(self, payload: bytes) -> Any:
        return _trailer_or_raw(payload)


class MRC_ERTH(Packet):
    """Endpoint request header, 16 bytes, on ENDPOINT_REQUEST."""

    name = "MRC ERTH"
    fields_desc = [  # noqa: RUF012
        BitField("type", 0, 4),
        BitField("next", 0, 5),
        BitField("rsvd1", 0, 5),
        BitEnumField("op", 0, 2, _names(EndpointOp)),
        XByteField("rsvd2", 0),
        XByteField("vendor", 0),
        XIntField("port_status_mask", 0),
        XIntField("rsvd3", 0),
        XShortField("tx_timestamp", 0),
        BitField("tsr", 0, 1),
        BitField("rsvd4", 0, 11),
        BitField("ftype", 0, 4),
    ]

    def guess_payload_class(self, payload: bytes) -> Any:
        return _trailer_or_raw(payload)


class MRC_EETH(Packet):
    """Endpoint response header, 36 bytes (MRC's size), on ENDPOINT_RESPONSE."""

    name = "MRC EETH"
    fields_desc = [  # noqa: RUF012
        BitField("type", 0, 4),
        BitField("next", 0, 5),
        BitField("rsvd1", 0, 5),
        BitEnumField("op", 0, 2, _names(EndpointOp)),
        XShortField("rsvd2", 0),
        XIntField("port_status_mask", 0),
        StrFixedLenField("rsvd3", b"\0" * 20, 20),
        XShortField("tx_timestamp", 0),
        XShortField("rsvd4", 0),
        XIntField("rsvd5", 0),
    ]

    def guess_payload_class(self, payload: bytes) -> Any:
        return _trailer_or_raw(payload)


class MRC_CMH(Packet):
    """Connection-management header, 64 bytes [ours] (docs/WIRE.md §6)."""

    name = "MRC CMH"
    fields_desc = [  # noqa: RUF012
        ByteField("version", 1),
        XByteField("plane", 0xFF),
        XShortField("flags", 0),
        XBitField("local_qpn", 0, 24),
        XByteField("rsvd1", 0),
        XBitField("remote_qpn", 0, 24),
        XByteField("rsvd2", 0),
        XBitField("initial_psn", 0, 24),
        ByteField("mpr", 8),
        ShortField("payload_mtu", 4096),
        ByteField("plane_count", 1),
        ByteField("ev_per_plane", 1),
        XIntField("plane_mask", 1),
        ShortField("max_imm", 1),
        ByteEnumField("security", 0, _names(SecurityLevel)),
        XByteField("rsvd3", 0),
        StrFixedLenField("nonce", b"\0" * 16, 16),
        ShortEnumField("reject_reason", 0, _names(RejectReason)),
        ShortField("private_data_len", None),
        XLongField("connection_id", 0),
        XLongField("rsvd4", 0),
    ]

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.private_data_len is None:
            key = MRC_KeyBlock.SIZE if isinstance(self.payload, MRC_KeyBlock) else 0
            n = max(len(pay) - key, 0)
            pkt = pkt[:46] + n.to_bytes(2, "big") + pkt[48:]
        return bytes(pkt) + pay

    def guess_payload_class(self, payload: bytes) -> Any:
        if self.security:
            return MRC_KeyBlock
        return Raw if self.private_data_len else _trailer_or_raw(payload)


def _trailer_or_raw(payload: bytes) -> Any:
    """What follows the last header of a control packet: exactly 24 bytes are taken for the
    security trailer of a secured connection (docs/WIRE.md §7), anything else stays Raw. Only
    a guess, as for mrc dissect and mrc.lua: nothing in the packet says it is secured."""
    return MRC_Trailer if len(payload) == MRC_Trailer.SIZE else Raw


class MRC_KeyBlock(Packet):
    """Key block, 64 bytes: the sender's ephemeral then static X25519 public keys (§6)."""

    SIZE = 64
    name = "MRC key block"
    fields_desc = [  # noqa: RUF012
        StrFixedLenField("ephemeral", b"\0" * 32, 32),
        StrFixedLenField("static", b"\0" * 32, 32),
    ]

    def guess_payload_class(self, payload: bytes) -> Any:
        cmh = self.underlayer
        if isinstance(cmh, MRC_CMH):
            bth = cmh.underlayer
            sealed = MRC_SealedRequest.SEALED_EXTRA + cmh.private_data_len
            if (
                isinstance(bth, MRC_BTH)
                and bth.opcode == Opcode.CM_REQUEST.value
                and len(payload) == sealed
            ):
                return MRC_SealedRequest  # docs/WIRE.md §7, revision 1.2
            if cmh.private_data_len:
                return Raw  # private data (and a trailer, if any, after it)
        return _trailer_or_raw(payload)


class MRC_SealedRequest(Packet):
    """What follows a sealed REQUEST's key block (docs/WIRE.md §7, revision 1.2): AES-GCM
    ciphertext of the TAI64N timestamp (12 bytes) and the private data, then the 16-byte tag.
    Dissection picks it when exactly 12 + private_data_len + 16 bytes follow the key block."""

    #: Bytes a sealed REQUEST holds after its key block beyond its private data.
    SEALED_EXTRA = 12 + 16
    name = "MRC sealed request"
    fields_desc = [  # noqa: RUF012
        StrLenField(
            "sealed",
            b"\0" * 12,
            length_from=lambda pkt: len(pkt.original) - 16 if pkt.original else 12,
        ),
        StrFixedLenField("tag", b"\0" * 16, 16),
    ]


class MRC_Trailer(Packet):
    """Security trailer, 24 bytes (docs/WIRE.md §7). Dissection never picks it (a packet does
    not say it has one); build with it, or apply it to the last 24 bytes yourself."""

    SIZE = 24
    name = "MRC trailer"
    fields_desc = [  # noqa: RUF012
        XLongField("tx_counter", 0),
        StrFixedLenField("tag", b"\0" * 16, 16),
    ]


_CONTROL_NEXT: dict[int, Any] = {
    Opcode.ACKNOWLEDGE.value: MRC_AETH,
    Opcode.ENDPOINT_REQUEST.value: MRC_ERTH,
    Opcode.ENDPOINT_RESPONSE.value: MRC_EETH,
    Opcode.RELIABILITY_SACK.value: MRC_SETH,
    Opcode.RELIABILITY_NACK.value: MRC_NETH,
    Opcode.RELIABILITY_PROBE.value: MRC_PETH,
    **{op: MRC_CMH for op in _CM},
}

# For building with the opcode left unset: the first header found names it.
_IMPLIED_OPCODE: tuple[tuple[Any, Opcode], ...] = (
    (MRC_SETH, Opcode.RELIABILITY_SACK),
    (MRC_NETH, Opcode.RELIABILITY_NACK),
    (MRC_AETH, Opcode.ACKNOWLEDGE),
    (MRC_PETH, Opcode.RELIABILITY_PROBE),
    (MRC_ERTH, Opcode.ENDPOINT_REQUEST),
    (MRC_EETH, Opcode.ENDPOINT_RESPONSE),
    (MRC_RETH, Opcode.WRITE_ONLY),
    (MRC_CMH, Opcode.CM_REQUEST),
)

#: Every MRC layer, in the order of docs/WIRE.md.
LAYERS: tuple[Any, ...] = (
    MRC_BTH, MRC_EVXH, MRC_METH, MRC_TSETH, MRC_RETH, MRC_ImmDt, MRC_SETH, MRC_CCState,
    MRC_PortState, MRC_NETH, MRC_PETH, MRC_AETH, MRC_ERTH, MRC_EETH, MRC_CMH, MRC_KeyBlock,
    MRC_SealedRequest, MRC_Trailer,
)  # fmt: skip


def bind_port(port: int) -> None:
    """Dissect UDP datagrams from or to `port` as MRC, ahead of any other binding of that port
    (scapy's RoCE BTH included: see the module docstring)."""
    entries = [({"dport": port}, MRC_BTH), ({"sport": port}, MRC_BTH)]
    UDP.payload_guess = entries + [e for e in UDP.payload_guess if e not in entries]


def layer_fields(pkt: Any, text: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """(layer name, {field: value}) for each layer from the first MRC_BTH in `pkt` on: what a
    header holds as scapy read it. Byte strings become hex; with `text`, every value is the
    string scapy shows (hex for X fields, names for enums). The trailing `Raw` is
    `("payload", {"length": n})` (payload, trailer or bytes left over)."""
    layer = pkt if isinstance(pkt, MRC_BTH) else pkt.getlayer(MRC_BTH)
    out: list[tuple[str, dict[str, Any]]] = []
    while layer:
        if isinstance(layer, Raw):
            out.append(("payload", {"length": len(layer.load)}))
            break
        values: dict[str, Any] = {}
        for f in layer.fields_desc:
            if isinstance(f, ConditionalField) and not f._evalcond(layer):
                continue
            value = layer.getfieldval(f.name)
            if text:
                values[f.name] = str(f.i2repr(layer, value))
            else:
                values[f.name] = value.hex() if isinstance(value, bytes) else value
        out.append((str(layer.name), values))
        layer = layer.payload
    return out


bind_port(ROCE_PORT)
# Building `UDP()/MRC_BTH()` sets both ports to 4791, as mrc's planes use one port each way.
bind_top_down(UDP, MRC_BTH, sport=ROCE_PORT, dport=ROCE_PORT)

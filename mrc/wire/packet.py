"""Whole packets: one flat record per packet kind, and strict whole-datagram decoding.

Holds `DataPacket`, `SackPacket`, `NackPacket`, `AckPacket`, `ProbePacket`, `EndpointPacket`
and `CmPacket` (the `Packet` union), `decode_packet` and the routing peeks `peek_dest_qp` /
`peek_opcode`. The raw layouts and one-call encoders of the fast paths live in `mrc.wire.fast`
(re-exported here: `DATA_HEADER`, `DATA_HEADER_IMM`, `encode_data_header`, `data_header_size`,
`encode_sack`).
The per-header dataclasses live in the sibling modules; this module only chains them in the order
of docs/WIRE.md §2 and checks that the datagram holds exactly what the headers claim.

The security trailer (§7) is not part of any record: on a secured connection the caller checks
and strips it before calling `decode_packet`, and appends it after `encode()`. Whether a data
packet is trimmed (its payload shorter than its opcode implies, §5) is also the caller's call:
the codec does not know the connection's payload_mtu, so any non-empty payload decodes.

Encoders here write an EVXH on non-CM packets (BTH.EVX = 1); decoders also accept packets
without one (EV = 0, and a control record's `evx` False, so it re-encodes byte for byte).

The records are slotted but not frozen dataclasses: a frozen dataclass's `__init__` costs about
five times as much (1.9 µs against 0.35 µs for a DataPacket), and one is built per packet.
Treat them as read-only values; the headers they nest (SETH, NETH, ...) are frozen.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mrc.wire._codec import Buffer, check_bits, need
from mrc.wire.ack import AETH, NETH, PORTSTATE_STRUCT, SETH, CCState
from mrc.wire.bth import (
    A_BIT,
    BTH_STRUCT,
    CM_OPCODES,
    DATA_OPCODES,
    EVX_BIT,
    EVXH_STRUCT,
    IMM_OPCODES,
    MASK24,
    OPCODE_BY_VALUE,
    RTX_BIT,
    Opcode,
)
from mrc.wire.cm import CMH, CMH_SIZE, KEYBLOCK_SIZE, KeyBlock
from mrc.wire.data import MAX_DMA_LENGTH
from mrc.wire.errors import DecodeError
from mrc.wire.fast import (
    _BTH_EVXH,
    _DATA_STRUCTS,
    DATA_HEADER,
    DATA_HEADER_IMM,
    data_header_size,
    encode_data_header,
    encode_sack,
)
from mrc.wire.probe import EETH, EETH_SIZE, ERTH, ERTH_SIZE, PETH

_PEEK_QP: Final = struct.Struct(">4xI")
# Bound once: compiled, a method call by name looks the method up per call.
_UNPACK_PEEK_QP: Final = _PEEK_QP.unpack_from

_DATA_VALUES: Final = frozenset(op.value for op in DATA_OPCODES)
_IMM_VALUES: Final = frozenset(op.value for op in IMM_OPCODES)


# --- records -------------------------------------------------------------------------------


@dataclass(slots=True)
class DataPacket:
    """A WRITE packet: BTH, EVXH, METH, [TSETH], RETH, [ImmDt] and the payload, flattened.

    `ev` is 0 when the packet had no EVXH; `tx_timestamp` is None when BTH.TS = 0; `imm` is set
    only on `*_IMM` opcodes. A decoded `payload` is a memoryview slice of the decoded datagram.
    `ftype` is TSETH's, kept as it came (0 from `mrc`, whose fast paths write it as 0).
    """

    opcode: Opcode
    dest_qp: int
    psn: int
    ev: int
    a: bool
    rtx: bool
    rqmsn: int
    msn: int
    tx_timestamp: int | None
    va: int
    rkey: int
    dma_length: int
    imm: int | None
    payload: bytes | memoryview
    p_key: int = 0xFFFF
    ftype: int = 0

    # Written out (the dataclass keeps it): compiled, the `__init__` dataclasses generates
    # stays interpreted, about 0.3 µs of every packet received.
    def __init__(
        self, opcode: Opcode, dest_qp: int, psn: int, ev: int, a: bool, rtx: bool, rqmsn: int,
        msn: int, tx_timestamp: int | None, va: int, rkey: int, dma_length: int,
        imm: int | None, payload: bytes | memoryview, p_key: int = 0xFFFF, ftype: int = 0,
    ) -> None:  # fmt: skip
        self.opcode = opcode
        self.dest_qp = dest_qp
        self.psn = psn
        self.ev = ev
        self.a = a
        self.rtx = rtx
        self.rqmsn = rqmsn
        self.msn = msn
        self.tx_timestamp = tx_timestamp
        self.va = va
        self.rkey = rkey
        self.dma_length = dma_length
        self.imm = imm
        self.payload = payload
        self.p_key = p_key
        self.ftype = ftype

    def encode(self) -> bytes:
        header = encode_data_header(
            opcode=self.opcode,
            dest_qp=self.dest_qp,
            psn=self.psn,
            ev=self.ev,
            a=self.a,
            rtx=self.rtx,
            rqmsn=self.rqmsn,
            msn=self.msn,
            va=self.va,
            rkey=self.rkey,
            dma_length=self.dma_length,
            tx_timestamp=self.tx_timestamp,
            imm=self.imm,
            p_key=self.p_key,
        )
        if self.ftype and self.tx_timestamp is not None:
            # TSETH's last nibble: after BTH, [EVXH], METH and the timestamp (docs/WIRE.md §3).
            at = 12 + (4 if header[4] & 1 else 0) + 4 + 3
            header = header[:at] + bytes((check_bits("ftype", self.ftype, 4),)) + header[at + 1 :]
        return header + self.payload


@dataclass(slots=True)
class SackPacket:
    """RELIABILITY_SACK: BTH (PSN = cack_psn), EVXH, SETH, CC_STATE and, iff `seth.ps`,
    PORTSTATE (`port_state`)."""

    dest_qp: int
    cack_psn: int
    ev: int
    seth: SETH
    cc: CCState
    port_state: int | None
    p_key: int = 0xFFFF
    evx: bool = True

    # Written out (DataPacket says why): one per SACK received.
    def __init__(
        self, dest_qp: int, cack_psn: int, ev: int, seth: SETH, cc: CCState,
        port_state: int | None, p_key: int = 0xFFFF, evx: bool = True,
    ) -> None:  # fmt: skip
        self.dest_qp = dest_qp
        self.cack_psn = cack_psn
        self.ev = ev
        self.seth = seth
        self.cc = cc
        self.port_state = port_state
        self.p_key = p_key
        self.evx = evx

    def encode(self) -> bytes:
        if self.seth.ps != (self.port_state is not None):
            raise ValueError("port_state must be given exactly when seth.ps is set")
        out = _bth_evxh(
            Opcode.RELIABILITY_SACK, self.dest_qp, self.cack_psn, self.ev, self.p_key, self.evx
        )
        out += self.seth.encode() + self.cc.encode()
        if self.port_state is not None:
            out += PORTSTATE_STRUCT.pack(check_bits("port_state", self.port_state, 32))
        return out


@dataclass(slots=True)
class NackPacket:
    """RELIABILITY_NACK: BTH (PSN = nack_psn), EVXH, NETH."""

    dest_qp: int
    psn: int
    ev: int
    neth: NETH
    p_key: int = 0xFFFF
    evx: bool = True

    def encode(self) -> bytes:
        bth = _bth_evxh(
            Opcode.RELIABILITY_NACK, self.dest_qp, self.psn, self.ev, self.p_key, self.evx
        )
        return bth + self.neth.encode()


@dataclass(slots=True)
class AckPacket:
    """ACKNOWLEDGE: BTH (PSN = cack_psn), EVXH, AETH (a message's outcome)."""

    dest_qp: int
    psn: int
    ev: int
    aeth: AETH
    p_key: int = 0xFFFF
    evx: bool = True

    def encode(self) -> bytes:
        bth = _bth_evxh(Opcode.ACKNOWLEDGE, self.dest_qp, self.psn, self.ev, self.p_key, self.evx)
        return bth + self.aeth.encode()


@dataclass(slots=True)
class ProbePacket:
    """RELIABILITY_PROBE: BTH (PSN = the sender's next unsent PSN), EVXH, PETH."""

    dest_qp: int
    psn: int
    ev: int
    peth: PETH
    p_key: int = 0xFFFF
    evx: bool = True

    def encode(self) -> bytes:
        bth = _bth_evxh(
            Opcode.RELIABILITY_PROBE, self.dest_qp, self.psn, self.ev, self.p_key, self.evx
        )
        return bth + self.peth.encode()


@dataclass(slots=True)
class EndpointPacket:
    """ENDPOINT_REQUEST (ERTH) or ENDPOINT_RESPONSE (EETH): BTH, EVXH, the header. BTH.PSN
    carries `probe_id` (a request's, echoed by its response) in its low 16 bits; its upper 8
    bits are sent as 0 and ignored (docs/WIRE.md §4)."""

    opcode: Opcode
    dest_qp: int
    ev: int
    header: ERTH | EETH
    p_key: int = 0xFFFF
    probe_id: int = 0
    evx: bool = True

    def encode(self) -> bytes:
        expected = _ENDPOINT_HEADERS.get(self.opcode)
        if expected is None or type(self.header) is not expected:
            raise ValueError(f"{self.opcode!r} cannot carry {type(self.header).__name__}")
        psn = check_bits("probe_id", self.probe_id, 16)
        bth = _bth_evxh(self.opcode, self.dest_qp, psn, self.ev, self.p_key, self.evx)
        return bth + self.header.encode()


@dataclass(slots=True)
class CmPacket:
    """CM_REQUEST/REPLY/REJECT/DISCONNECT: BTH (PSN 0, no EVXH), CMH, a key block iff
    `cmh.security` is not 0, then `cmh.private_data_len` bytes of private data (§6)."""

    opcode: Opcode
    dest_qp: int
    cmh: CMH
    key_block: KeyBlock | None
    private_data: bytes
    p_key: int = 0xFFFF

    def encode(self) -> bytes:
        if self.opcode not in CM_OPCODES:
            raise ValueError(f"{self.opcode!r} is not a CM opcode")
        if (self.key_block is not None) != (self.cmh.security != 0):
            raise ValueError("key_block must be given exactly when cmh.security is not 0")
        if len(self.private_data) != self.cmh.private_data_len:
            raise ValueError(
                f"private_data is {len(self.private_data)} bytes, "
                f"cmh.private_data_len says {self.cmh.private_data_len}"
            )
        out = BTH_STRUCT.pack(
            self.opcode,
            0,
            check_bits("p_key", self.p_key, 16),
            check_bits("dest_qp", self.dest_qp, 24),
            0,
        )
        out += self.cmh.encode()
        if self.key_block is not None:
            out += self.key_block.encode()
        return out + bytes(self.private_data)


Packet = DataPacket | SackPacket | NackPacket | AckPacket | ProbePacket | EndpointPacket | CmPacket

_ENDPOINT_HEADERS: Final[dict[Opcode, type[ERTH | EETH]]] = {
    Opcode.ENDPOINT_REQUEST: ERTH,
    Opcode.ENDPOINT_RESPONSE: EETH,
}


# --- encoding ------------------------------------------------------------------------------


def _bth_evxh(
    opcode: Opcode, dest_qp: int, psn: int, ev: int, p_key: int, evx: bool = True
) -> bytes:
    """BTH (EVX = 1, no flags) followed by EVXH, for control packets; without `evx`, the BTH
    alone (EVX = 0), as implementations that carry the EV elsewhere send it."""
    if not evx:
        if ev:
            raise ValueError(f"ev={ev:#x} needs an EVXH")
        return BTH_STRUCT.pack(
            opcode,
            0,
            check_bits("p_key", p_key, 16),
            check_bits("dest_qp", dest_qp, 24),
            check_bits("psn", psn, 24),
        )
    try:
        return _BTH_EVXH.pack(
            opcode,
            0,
            p_key,
            EVX_BIT | check_bits("dest_qp", dest_qp, 24),
            check_bits("psn", psn, 24),
            ev,
        )
    except struct.error as exc:
        raise ValueError(str(exc)) from None


# --- decoding ------------------------------------------------------------------------------


def peek_opcode(data: Buffer) -> int:
    """The raw opcode byte, without any validation beyond "not empty"."""
    if not len(data):
        raise DecodeError("length", "empty datagram")
    return data[0]


def peek_dest_qp(data: Buffer) -> int:
    """BTH.DestQP, for routing a datagram to its session before decoding it."""
    if len(data) < 12:
        raise DecodeError("length", f"BTH needs 12 bytes, datagram has {len(data)}")
    return int(_UNPACK_PEEK_QP(data)[0]) & MASK24


def decode_packet(data: Buffer) -> Packet:
    """Decode one whole datagram (without its security trailer) strictly per docs/WIRE.md.

    Raises DecodeError naming the field for an unknown opcode, a non-zero TVer, a header `type`
    that does not match the opcode, truncated headers, bytes after a control packet ("length"),
    a data packet without payload ("payload"), or CM lengths that disagree with the datagram
    ("private_data_len").
    """
    # Compiled, `bytes` and `bytearray` are C type checks; `memoryview` a builtins lookup.
    mv = memoryview(data) if isinstance(data, (bytes, bytearray)) else data
    n = len(mv)
    if n < 12:
        raise DecodeError("length", f"BTH needs 12 bytes, datagram has {n}")
    op = mv[0]
    if mv[1] & 0x0F:
        raise DecodeError("tver", f"transport version {mv[1] & 0x0F}, expected 0")
    if op in _DATA_VALUES:
        return _decode_data(mv, op, n)
    decoder = _CONTROL_DECODERS.get(op)
    if decoder is None:
        raise DecodeError("opcode", f"unknown opcode 0x{op:02X}")
    return decoder(mv, n)


def _decode_data(mv: memoryview, op: int, n: int) -> DataPacket:
    key = (mv[4] & 1) | ((mv[8] >> 3) & 2) | (4 if op in _IMM_VALUES else 0)
    layout = _DATA_STRUCTS[key]
    size = layout.size
    if n <= size:
        if n < size:
            raise DecodeError("length", f"data headers need {size} bytes, datagram has {n}")
        raise DecodeError("payload", "data packet without payload")
    t = layout.unpack_from(mv)
    w8 = t[4]
    if key & 1:
        ev = t[5]
        i = 6
    else:
        ev = 0
        i = 5
    rqmsn = t[i]
    msn = t[i + 1]
    if key & 2:
        tx_timestamp = t[i + 2]
        i += 3
    else:
        tx_timestamp = None
        i += 2
    dma_length = t[i + 2]
    if not 1 <= dma_length <= MAX_DMA_LENGTH:
        raise DecodeError("dma_length", f"{dma_length} outside 1 … 2^31")
    return DataPacket(
        OPCODE_BY_VALUE[op],
        t[3] & MASK24,
        w8 & MASK24,
        ev,
        bool(w8 & A_BIT),
        bool(w8 & RTX_BIT),
        rqmsn,
        msn,
        tx_timestamp,
        t[i],
        t[i + 1],
        dma_length,
        t[i + 3] if key & 4 else None,
        mv[size:],
        t[2],
        mv[12 + 4 * (key & 1) + 7] & 0x0F if key & 2 else 0,  # TSETH ftype
    )


def _control_bth(mv: memoryview, n: int, body: int, what: str) -> tuple[int, int, int, int, int]:
    """(dest_qp, psn, p_key, ev, offset of the header after BTH/EVXH) of a control packet.

    Checks that the datagram holds at least `body` bytes after BTH/EVXH.
    """
    _op, _b1, p_key, w4, w8 = BTH_STRUCT.unpack_from(mv)
    if w4 & EVX_BIT:
        need(mv, 12, 4, "EVXH")
        ev = EVXH_STRUCT.unpack_from(mv, 12)[0]
        off = 16
    else:
        ev = 0
        off = 12
    need(mv, off, body, what)
    return w4 & MASK24, w8 & MASK24, p_key, ev, off


def _exact(n: int, end: int, what: str) -> None:
    if n != end:
        raise DecodeError("length", f"{n - end} bytes after {what}")


def _decode_sack(mv: memoryview, n: int) -> SackPacket:
    dest_qp, psn, p_key, ev, off = _control_bth(mv, n, 36, "SETH + CC_STATE")
    seth = SETH.decode(mv, off)
    cc = CCState.decode(mv, off + 28)
    port_state = None
    end = off + 36
    if seth.ps:
        need(mv, end, 4, "PORTSTATE")
        port_state = PORTSTATE_STRUCT.unpack_from(mv, end)[0]
        end += 4
    _exact(n, end, "SACK")
    return SackPacket(dest_qp, psn, ev, seth, cc, port_state, p_key, off == 16)


def _decode_nack(mv: memoryview, n: int) -> NackPacket:
    dest_qp, psn, p_key, ev, off = _control_bth(mv, n, 20, "NETH")
    neth = NETH.decode(mv, off)
    _exact(n, off + 20, "NACK")
    return NackPacket(dest_qp, psn, ev, neth, p_key, off == 16)


def _decode_ack(mv: memoryview, n: int) -> AckPacket:
    dest_qp, psn, p_key, ev, off = _control_bth(mv, n, 4, "AETH")
    aeth = AETH.decode(mv, off)
    _exact(n, off + 4, "ACKNOWLEDGE")
    return AckPacket(dest_qp, psn, ev, aeth, p_key, off == 16)


def _decode_probe(mv: memoryview, n: int) -> ProbePacket:
    dest_qp, psn, p_key, ev, off = _control_bth(mv, n, 16, "PETH")
    peth = PETH.decode(mv, off)
    _exact(n, off + 16, "PROBE")
    return ProbePacket(dest_qp, psn, ev, peth, p_key, off == 16)


def _decode_endpoint(mv: memoryview, n: int) -> EndpointPacket:
    opcode = OPCODE_BY_VALUE[mv[0]]
    cls = _ENDPOINT_HEADERS[opcode]
    size = ERTH_SIZE if cls is ERTH else EETH_SIZE
    dest_qp, psn, p_key, ev, off = _control_bth(mv, n, size, cls.__name__)
    header = cls.decode(mv, off)
    _exact(n, off + size, opcode.name)
    return EndpointPacket(opcode, dest_qp, ev, header, p_key, psn & 0xFFFF, off == 16)


def _decode_cm(mv: memoryview, n: int) -> CmPacket:
    opcode = OPCODE_BY_VALUE[mv[0]]
    _op, _b1, p_key, w4, _w8 = BTH_STRUCT.unpack_from(mv)
    if w4 & EVX_BIT:
        raise DecodeError("evx", "CM packets carry no EVXH")
    cmh = CMH.decode(mv, 12)
    off = 12 + CMH_SIZE
    key_size = KEYBLOCK_SIZE if cmh.security else 0
    if n - off != key_size + cmh.private_data_len:
        raise DecodeError(
            "private_data_len",
            f"{n - off} bytes after CMH, expected {key_size} of key block"
            f" + {cmh.private_data_len} of private data",
        )
    key_block = KeyBlock.decode(mv, off) if key_size else None
    private_data = bytes(mv[off + key_size :])
    return CmPacket(opcode, w4 & MASK24, cmh, key_block, private_data, p_key)


_CONTROL_DECODERS: Final[dict[int, Callable[[memoryview, int], Packet]]] = {
    Opcode.ACKNOWLEDGE.value: _decode_ack,
    Opcode.ENDPOINT_REQUEST.value: _decode_endpoint,
    Opcode.ENDPOINT_RESPONSE.value: _decode_endpoint,
    Opcode.RELIABILITY_SACK.value: _decode_sack,
    Opcode.RELIABILITY_NACK.value: _decode_nack,
    Opcode.RELIABILITY_PROBE.value: _decode_probe,
    **{op.value: _decode_cm for op in CM_OPCODES},
}


__all__ = [
    "DATA_HEADER",
    "DATA_HEADER_IMM",
    "AckPacket",
    "CmPacket",
    "DataPacket",
    "EndpointPacket",
    "NackPacket",
    "Packet",
    "ProbePacket",
    "SackPacket",
    "data_header_size",
    "decode_packet",
    "encode_data_header",
    "encode_sack",
    "peek_dest_qp",
    "peek_opcode",
]

"""The sender's and responder's fast paths: raw data-header layouts and one-call encoders.

Holds the data-packet layouts of docs/WIRE.md §2-§3 (BTH [EVXH] METH [TSETH] RETH [ImmDt]) as
precompiled structs, the two the framer packs every data packet with (`DATA_HEADER`,
`DATA_HEADER_IMM`, and their variants without EVXH), `encode_data_header` and
`data_header_size`, and `encode_sack`, which writes a whole SACK in one call. They write the
same bytes as the records of `mrc.wire.packet` (tests hold them to it), without building one;
decoding is `mrc.wire.packet`'s job (but for the SACK layouts the sender's byte path reads,
and `data_headers`, the headers of a whole GRO read in one unpack for the receiver's).
And `split_datagrams`, which cuts one GRO read into its
datagrams for io, compiled where the rest of io is not.
"""

from __future__ import annotations

import struct
from typing import Final, TypeVar

from mrc.wire.bth import A_BIT, DATA_OPCODES, EVX_BIT, IMM_OPCODES, RTX_BIT, TS_BIT, Opcode
from mrc.wire.data import MAX_DMA_LENGTH

A = TypeVar("A")


def split_datagrams(
    view: memoryview, nbytes: int, seg: int, addr: A, tos: int,
    out: list[tuple[memoryview, A, int]],
) -> int:  # fmt: skip
    """Append the datagrams of one read with UDP GRO (the first `nbytes` of `view`: `seg`
    bytes each, the last one possibly shorter) to `out` as io hands datagrams to the core,
    (view, source address, TOS word); returns how many. Per datagram it is a view and a
    tuple: compiled, without the interpreter's loop around them."""
    whole = view[:nbytes]
    at = count = 0
    while at < nbytes:
        out.append((whole[at : at + seg], addr, tos))
        at += seg
        count += 1
    return count


# Data layouts (§2 table): BTH [EVXH] METH [TSETH] RETH [ImmDt], indexed by
# EVX | TS << 1 | IMM << 2. TSETH's TSR/ftype half is sent as 0 and skipped ("2x").
_BTH: Final = ">BBHII"


def _data_layout(key: int) -> struct.Struct:
    fmt = _BTH
    fmt += "I" if key & 1 else ""  # EVXH
    fmt += "HH"  # METH
    fmt += "H2x" if key & 2 else ""  # TSETH
    fmt += "QII"  # RETH
    fmt += "I" if key & 4 else ""  # ImmDt
    return struct.Struct(fmt)


_DATA_STRUCTS: Final[tuple[struct.Struct, ...]] = tuple(_data_layout(key) for key in range(8))
_HDR_PLAIN: Final = _DATA_STRUCTS[1]  # BTH EVXH METH RETH, 36 bytes
_HDR_TS: Final = _DATA_STRUCTS[3]  # BTH EVXH METH TSETH RETH, 40 bytes
_HDR_IMM: Final = _DATA_STRUCTS[5]
_HDR_TS_IMM: Final = _DATA_STRUCTS[7]  # 44 bytes, every data header
#: The two layouts the sender frames every data packet with, for callers that frame many
#: packets at once (a flowcell): BTH EVXH METH TSETH RETH (40 bytes), and the same plus ImmDt
#: (44 bytes, `*_IMM` opcodes). Values in wire order: opcode, 0, P_Key, EVX_BIT | DestQP,
#: A/RTX/TS bits | PSN, EV, RQMSN, MSN, tx_timestamp, VA, R_Key, DMA_length[, ImmDt]. They
#: write the same bytes as `encode_data_header` with a `tx_timestamp`, without its checks.
DATA_HEADER: Final = _HDR_TS
DATA_HEADER_IMM: Final = _HDR_TS_IMM
#: The same without EVXH (36 and 40 bytes), for connections that carry the EV in the IPv6 flow
#: label (docs/WIRE.md §3): values as above without EV, and BTH.EVX clear.
DATA_HEADER_NOEVX: Final = _DATA_STRUCTS[2]
DATA_HEADER_IMM_NOEVX: Final = _DATA_STRUCTS[6]
#: A data packet's BTH fields a receiver sorts datagrams by, in one unpack: (OpCode, the word
#: of BTH bytes 4-7: the flags byte with EVX above the 24-bit DestQP, BTH byte 8 with TS).
BTH_PEEK: Final = struct.Struct(">B3xIB")
_HEADERS_CACHE_MAX: Final = 256
_headers_cache: dict[int, struct.Struct] = {}


def data_headers(seg: int, count: int) -> struct.Struct:
    """`DATA_HEADER_IMM` repeated for `count` datagrams `seg` bytes apart (one GRO read, `seg`
    >= 44, `count` < 256): its 13 values for each, in one `unpack_from`. Per read, not per
    packet, it costs the fixed price of a struct call (about 40 % of a one-header unpack);
    for a datagram without ImmDt the last value is its payload's first 4 bytes."""
    if not (0 < count < 256 and seg >= 44):
        raise ValueError(f"data_headers: {count} datagrams of {seg} bytes")
    key = seg << 8 | count
    layout = _headers_cache.get(key)
    if layout is None:
        gap = f"{seg - 44}x" if seg > 44 else ""
        one = _HDR_TS_IMM.format.lstrip(">")
        layout = struct.Struct(">" + (one + gap) * (count - 1) + one)
        if len(_headers_cache) >= _HEADERS_CACHE_MAX:
            _headers_cache.clear()  # read sizes are few; a peer cycling through many is bounded
        _headers_cache[key] = layout
    return layout


#: The data opcodes (`Opcode.WRITE_*`, a test checks they agree) as int literals, for code
#: that reads or writes the first byte itself: compiled, a literal is inlined where it is used.
OP_FIRST: Final = 0xC6
OP_MIDDLE: Final = 0xC7
OP_LAST: Final = 0xC8
OP_LAST_IMM: Final = 0xC9
OP_ONLY: Final = 0xCA
OP_ONLY_IMM: Final = 0xCB
_BTH_EVXH: Final = struct.Struct(">BBHIII")
# A whole RELIABILITY_SACK in one pack: BTH [EVXH] SETH CC_STATE [PORTSTATE] (docs/WIRE.md §4).
_SACK: Final = struct.Struct(">BBHIIIHhIHHIBBhQHHI")
_SACK_PS: Final = struct.Struct(">BBHIIIHhIHHIBBhQHHII")
_SACK_NOEVX: Final = struct.Struct(">BBHIIHhIHHIBBhQHHI")
_SACK_PS_NOEVX: Final = struct.Struct(">BBHIIHhIHHIBBhQHHII")
_SACK_OP: Final = Opcode.RELIABILITY_SACK.value
#: The common SACK's layouts, BTH EVXH SETH CC_STATE (52 bytes) and the same plus PORTSTATE
#: (56), for the sender's byte path (mrc.core.send.sackpath), which reads them without a record.
SACK_LAYOUT: Final = _SACK
SACK_LAYOUT_PS: Final = _SACK_PS


def encode_sack(
    *,
    dest_qp: int,
    cack_psn: int,
    ev: int,
    ack_psn_offset: int,
    entropy: int,
    sack_offset: int,
    sack_bitmap: int,
    m: int = 0,
    pr: bool = False,
    mpr: int = 8,
    tx_timestamp: int = 0,
    valid: bool = False,
    ooo_count: int = 0,
    rcvd_bytes: int = 0,
    port_state: int | None = None,
    p_key: int = 0xFFFF,
    evx: bool = True,
) -> bytes:
    """The bytes of `SackPacket(...).encode()` for a SACK with these fields, in one pack call.

    SETH's cc_type and CC_STATE's restore_cwnd / rcv_cwnd_pen are 0; PS is set iff
    `port_state` is given; without `evx` there is no EVXH (`ev` then rides in the flow label).
    Raises ValueError for a field that does not fit, as the records do.
    """
    if (
        (dest_qp | cack_psn | rcvd_bytes) >> 24
        or ooo_count >> 15
        or m >> 2
        or min(dest_qp, cack_psn, rcvd_bytes, ooo_count, m) < 0
    ):
        raise ValueError(
            f"SACK field out of range: dest_qp={dest_qp} cack_psn={cack_psn} m={m} "
            f"ooo_count={ooo_count} rcvd_bytes={rcvd_bytes}"
        )
    first = (m << 5) | (0x02 if pr else 0)  # SETH type 0, next 0 | m | PR | PS
    half = (0x8000 if valid else 0) | ooo_count
    try:
        if not evx:
            if port_state is None:
                return _SACK_NOEVX.pack(
                    _SACK_OP, 0, p_key, dest_qp, cack_psn,
                    first, ack_psn_offset, entropy, 0, 0, cack_psn, 0, mpr, sack_offset,
                    sack_bitmap, tx_timestamp, half, rcvd_bytes,
                )  # fmt: skip
            return _SACK_PS_NOEVX.pack(
                _SACK_OP, 0, p_key, dest_qp, cack_psn,
                first | 0x01, ack_psn_offset, entropy, 0, 0, cack_psn, 0, mpr, sack_offset,
                sack_bitmap, tx_timestamp, half, rcvd_bytes, port_state,
            )  # fmt: skip
        if port_state is None:
            return _SACK.pack(
                _SACK_OP, 0, p_key, EVX_BIT | dest_qp, cack_psn, ev,
                first, ack_psn_offset, entropy, 0, 0, cack_psn, 0, mpr, sack_offset, sack_bitmap,
                tx_timestamp, half, rcvd_bytes,
            )  # fmt: skip
        return _SACK_PS.pack(
            _SACK_OP, 0, p_key, EVX_BIT | dest_qp, cack_psn, ev,
            first | 0x01, ack_psn_offset, entropy, 0, 0, cack_psn, 0, mpr, sack_offset,
            sack_bitmap, tx_timestamp, half, rcvd_bytes, port_state,
        )  # fmt: skip
    except struct.error as exc:
        raise ValueError(str(exc)) from None


def data_header_size(opcode: Opcode, ts: bool) -> int:
    """Bytes of header (BTH through ImmDt, with EVXH) before a data packet's payload."""
    return 36 + (4 if ts else 0) + (4 if opcode in IMM_OPCODES else 0)


def encode_data_header(
    *,
    opcode: Opcode,
    dest_qp: int,
    psn: int,
    ev: int,
    a: bool,
    rtx: bool,
    rqmsn: int,
    msn: int,
    va: int,
    rkey: int,
    dma_length: int,
    tx_timestamp: int | None = None,
    imm: int | None = None,
    p_key: int = 0xFFFF,
) -> bytes:
    """Every header of a data packet, BTH through ImmDt, in one pack call (the sender's fast path).

    Writes EVXH always, TSETH iff `tx_timestamp` is not None and ImmDt iff `opcode` is `*_IMM`
    (then `imm` is required). Raises ValueError for a field that does not fit.
    """
    if opcode not in DATA_OPCODES:
        raise ValueError(f"{opcode!r} is not a data opcode")
    if (dest_qp | psn) >> 24 or dest_qp < 0 or psn < 0:
        raise ValueError(f"dest_qp={dest_qp} or psn={psn} does not fit in 24 bits")
    if not 1 <= dma_length <= MAX_DMA_LENGTH:
        raise ValueError(f"dma_length={dma_length} outside 1 … 2^31")
    w4 = EVX_BIT | dest_qp
    w8 = (A_BIT if a else 0) | (RTX_BIT if rtx else 0) | psn
    try:
        if opcode in IMM_OPCODES:
            if imm is None:
                raise ValueError(f"{opcode.name} needs imm")
            if tx_timestamp is None:
                return _HDR_IMM.pack(
                    opcode, 0, p_key, w4, w8, ev, rqmsn, msn, va, rkey, dma_length, imm
                )
            return _HDR_TS_IMM.pack(
                opcode,
                0,
                p_key,
                w4,
                w8 | TS_BIT,
                ev,
                rqmsn,
                msn,
                tx_timestamp,
                va,
                rkey,
                dma_length,
                imm,
            )
        if imm is not None:
            raise ValueError(f"{opcode.name} cannot carry imm")
        if tx_timestamp is None:
            return _HDR_PLAIN.pack(opcode, 0, p_key, w4, w8, ev, rqmsn, msn, va, rkey, dma_length)
        return _HDR_TS.pack(
            opcode, 0, p_key, w4, w8 | TS_BIT, ev, rqmsn, msn, tx_timestamp, va, rkey, dma_length
        )
    except struct.error as exc:
        raise ValueError(str(exc)) from None

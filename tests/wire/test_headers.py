"""Header codecs against golden bytes written out by hand from docs/WIRE.md.

One table drives both directions: encode(obj) must give the bytes, decode(bytes) the object.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest

from mrc.wire import (
    AETH,
    BTH,
    CMH,
    EETH,
    ERTH,
    EVXH,
    METH,
    NETH,
    PETH,
    RETH,
    SETH,
    TSETH,
    CCState,
    DecodeError,
    EndpointOp,
    ImmDt,
    KeyBlock,
    NackReason,
    Opcode,
    PortState,
    SackMark,
    Syndrome,
    Trailer,
)
from mrc.wire.ack import AETH_SIZE, CCSTATE_SIZE, NETH_SIZE, PORTSTATE_SIZE, SETH_SIZE
from mrc.wire.bth import BTH_SIZE, EVXH_SIZE
from mrc.wire.cm import CMH_SIZE, KEYBLOCK_SIZE
from mrc.wire.data import IMMDT_SIZE, METH_SIZE, RETH_SIZE, TSETH_SIZE
from mrc.wire.probe import EETH_SIZE, ERTH_SIZE, PETH_SIZE
from mrc.wire.trailer import TRAILER_SIZE

# Each header's wire size, the module constant beside its struct (mrc/wire/_codec.py says why
# the size is not a class attribute).
SIZES: dict[type, int] = {
    BTH: BTH_SIZE,
    EVXH: EVXH_SIZE,
    METH: METH_SIZE,
    TSETH: TSETH_SIZE,
    RETH: RETH_SIZE,
    ImmDt: IMMDT_SIZE,
    SETH: SETH_SIZE,
    CCState: CCSTATE_SIZE,
    PortState: PORTSTATE_SIZE,
    NETH: NETH_SIZE,
    AETH: AETH_SIZE,
    PETH: PETH_SIZE,
    ERTH: ERTH_SIZE,
    EETH: EETH_SIZE,
    CMH: CMH_SIZE,
    KeyBlock: KEYBLOCK_SIZE,
    Trailer: TRAILER_SIZE,
}


def h(text: str) -> bytes:
    """Hex with spaces and `|` separators allowed."""
    return bytes.fromhex(text.replace("|", " "))


CMH_REQUEST = CMH(
    local_qpn=0x10,
    remote_qpn=0,
    initial_psn=0x123456,
    mpr=8,
    payload_mtu=4096,
    plane_count=2,
    ev_per_plane=16,
    plane_mask=0x3,
    max_imm=4,
    security=1,
    nonce=bytes(range(16)),
    connection_id=0x0102030405060708,
    plane=1,
    private_data_len=16,
)
CMH_REQUEST_BYTES = h(
    "01 01 0000 | 00001000 | 00000000 | 12345608 | 1000 02 10 | 00000003 | 0004 01 00"
    "| 000102030405060708090a0b0c0d0e0f | 0000 0010 | 0102030405060708 | 0000000000000000"
)
CMH_REJECT = CMH(
    local_qpn=0xABCDEF,
    remote_qpn=0x10,
    initial_psn=0,
    mpr=0,
    payload_mtu=0,
    plane_count=0,
    ev_per_plane=0,
    plane_mask=0,
    max_imm=0,
    security=0,
    nonce=b"\xff" * 16,
    connection_id=0xFFFFFFFFFFFFFFFF,
    reject_reason=4,
    version=7,
    flags=0x8001,
)
CMH_REJECT_BYTES = h(
    "07 ff 8001 | abcdef00 | 00001000 | 00000000 | 0000 00 00 | 00000000 | 0000 00 00"
    "| ffffffffffffffffffffffffffffffff | 0004 0000 | ffffffffffffffff | 0000000000000000"
)

SETH_PS = SETH(
    ack_psn_offset=-2,
    entropy=0x01000005,
    cack_psn=0x000100,
    sack_offset=-64,
    sack_bitmap=0x8000000000000001,
    m=SackMark.SKIP_ONCE,
    pr=True,
    ps=True,
)
SETH_PS_BYTES = h("0023 fffe | 01000005 | 0000 0000 | 00 000100 | 00 08 ffc0 | 8000000000000001")
SETH_PLAIN = SETH(
    ack_psn_offset=5,
    entropy=0,
    cack_psn=0xFFFFFF,
    sack_offset=0,
    sack_bitmap=0,
    m=SackMark.ALWAYS_SKIP,
    mpr=255,
    cc_type=15,
    spdcid=0x1234,
    dpdcid=0xABCD,
)
SETH_PLAIN_BYTES = h("0040 0005 | 00000000 | 1234 abcd | 00 ffffff | f0 ff 0000 | 0000000000000000")
CC_FULL = CCState(
    tx_timestamp=0x1234,
    valid=True,
    ooo_count=0x7FFF,
    restore_cwnd=True,
    rcv_cwnd_pen=127,
    rcvd_bytes=0xABCDEF,
)
CC_FULL_BYTES = h("1234 ffff ffabcdef")
NETH_TRIM = NETH(
    NackReason.TRIMMED,
    entropy=0x02000007,
    nack_psn=0x00ABCD,
    tx_timestamp=0x4321,
    vendor=0x99,
    cc_type=1,
)
NETH_TRIM_BYTES = h("0000 01 99 | 02000007 | 0000 0000 | 00 00abcd | 10 00 4321")
PETH_ONE = PETH(probe_id=0xBEEF, tx_timestamp=0x1234, vendor=7)
PETH_ONE_BYTES = h("0000 07 00 | beef 0000 | 0000 0000 | 1234 0000")
PETH_KEPT = PETH(probe_id=1, tx_timestamp=2, vendor=3, spdcid=0x0102, dpdcid=0x0304, ftype=5)
PETH_KEPT_BYTES = h("0000 03 00 | 0001 0000 | 0102 0304 | 0002 0005")
ERTH_PROBE = ERTH(EndpointOp.EV_PROBE, port_status_mask=0x3, tx_timestamp=0xFFFF, vendor=1)
ERTH_PROBE_BYTES = h("0001 00 01 | 00000003 | 0000 0000 | ffff 0000")
ERTH_KEPT = ERTH(EndpointOp.PORT_STATUS, port_status_mask=0x80000001, tx_timestamp=7, ftype=0xA)
ERTH_KEPT_BYTES = h("0000 00 00 | 80000001 | 0000 0000 | 0007 000a")
# EETH is 36 bytes: op, 2 reserved bytes, MRC's 24 reserved bytes (ours: the mask in the first
# 4), the echoed timestamp, 6 reserved bytes.
EETH_STATUS = EETH(EndpointOp.PORT_STATUS, port_status_mask=0xFFFFFFFF)
EETH_STATUS_BYTES = h("0000 0000 | ffffffff" + " 00" * 20 + " | 0000 0000 | 00000000")
EETH_PROBE = EETH(EndpointOp.EV_PROBE, port_status_mask=0x5, tx_timestamp=0xBEEF)
EETH_PROBE_BYTES = h("0001 0000 | 00000005" + " 00" * 20 + " | beef 0000 | 00000000")
KEY_BLOCK = KeyBlock(ephemeral=b"\x11" * 32, static=b"\x22" * 32)
KEY_BLOCK_BYTES = b"\x11" * 32 + b"\x22" * 32

GOLDEN: list[tuple[Any, bytes]] = [
    # BTH (§2): opcode | SE M PadCnt TVer | P_Key | F B rsvd EVX DestQP | A R RTX TS rsvd PSN
    (
        BTH(Opcode.WRITE_FIRST, 0x123456, 0xABCDEF, a=True, rtx=True, ts=True, evx=True),
        h("c6 00 ffff | 01 123456 | b0 abcdef"),
    ),
    (
        BTH(Opcode.ACKNOWLEDGE, dest_qp=1, psn=0, p_key=0x8001),
        h("d1 00 8001 | 00 000001 | 00 000000"),
    ),
    (
        BTH(Opcode.CM_REQUEST, 1, 0, se=True, m=True, pad_cnt=3, fecn=True, becn=True, r=True),
        h("e0 f0 ffff | c0 000001 | 40 000000"),
    ),
    (BTH(Opcode.RELIABILITY_PROBE, 0xFFFFFF, 0xFFFFFF), h("de 00 ffff | 00 ffffff | 00 ffffff")),
    (EVXH(0x01000002), h("01000002")),
    (EVXH(0xFFFFFFFF), h("ffffffff")),
    # §3 data headers
    (METH(rqmsn=0xFFFE, msn=1), h("fffe 0001")),
    (TSETH(0xBEEF), h("beef 0000")),
    (TSETH(0x0102, ftype=0xA), h("0102 000a")),
    (
        RETH(va=0x0102030405060708, rkey=0xDEADBEEF, dma_length=1 << 31),
        h("0102030405060708 deadbeef 80000000"),
    ),
    (RETH(va=0, rkey=0, dma_length=1), h("0000000000000000 00000000 00000001")),
    (ImmDt(0x12345678), h("12345678")),
    # §4 reliability headers
    (SETH_PS, SETH_PS_BYTES),
    (SETH_PLAIN, SETH_PLAIN_BYTES),
    (CC_FULL, CC_FULL_BYTES),
    (CCState(tx_timestamp=1, ooo_count=3, rcv_cwnd_pen=1, rcvd_bytes=2), h("0001 0003 01000002")),
    (CCState(), h("0000 0000 00000000")),
    (PortState(0b101), h("00000005")),
    (NETH_TRIM, NETH_TRIM_BYTES),
    (
        NETH(NackReason.OUT_OF_BOUNDS, entropy=0, nack_psn=0xFFFFFF, spdcid=1, dpdcid=0xFFFF),
        h("0000 81 00 | 00000000 | 0001 ffff | 00 ffffff | 00 00 0000"),
    ),
    (AETH(syndrome=Syndrome.ACK, msn=0xFFFF), h("1f 00ffff")),
    (AETH(syndrome=Syndrome.NAK_REMOTE_ACCESS, msn=7), h("62 000007")),
    (AETH(syndrome=0, msn=0), h("00 000000")),
    (PETH_ONE, PETH_ONE_BYTES),
    (PETH_KEPT, PETH_KEPT_BYTES),
    (ERTH_PROBE, ERTH_PROBE_BYTES),
    (ERTH_KEPT, ERTH_KEPT_BYTES),
    (EETH_STATUS, EETH_STATUS_BYTES),
    (EETH_PROBE, EETH_PROBE_BYTES),
    # §6 connection management, §7 trailer
    (CMH_REQUEST, CMH_REQUEST_BYTES),
    (CMH_REJECT, CMH_REJECT_BYTES),
    (KEY_BLOCK, KEY_BLOCK_BYTES),
    (
        Trailer(tx_counter=0x0102030405060708, tag=bytes(range(16, 32))),
        h("0102030405060708 101112131415161718191a1b1c1d1e1f"),
    ),
]

IDS = [f"{type(obj).__name__}-{i}" for i, (obj, _) in enumerate(GOLDEN)]


@pytest.mark.parametrize(("obj", "wire"), GOLDEN, ids=IDS)
def test_encode(obj: Any, wire: bytes) -> None:
    assert len(wire) == SIZES[type(obj)]
    assert obj.encode() == wire


@pytest.mark.parametrize(("obj", "wire"), GOLDEN, ids=IDS)
def test_decode(obj: Any, wire: bytes) -> None:
    assert type(obj).decode(wire) == obj
    assert type(obj).decode(memoryview(wire)) == obj
    assert type(obj).decode(bytearray(wire)) == obj


@pytest.mark.parametrize(("obj", "wire"), GOLDEN, ids=IDS)
def test_decode_at_offset_with_trailing_bytes(obj: Any, wire: bytes) -> None:
    assert type(obj).decode(b"\xaa" * 3 + wire + b"\xbb" * 5, 3) == obj


@pytest.mark.parametrize(("obj", "wire"), GOLDEN, ids=IDS)
def test_encode_into(obj: Any, wire: bytes) -> None:
    buf = bytearray(b"\xee" * (len(wire) + 6))
    assert obj.encode_into(buf, 2) == 2 + len(wire)
    assert buf == b"\xee" * 2 + wire + b"\xee" * 4


@pytest.mark.parametrize(("obj", "wire"), GOLDEN, ids=IDS)
def test_truncated(obj: Any, wire: bytes) -> None:
    cls = type(obj)
    for cut in range(SIZES[cls]):
        with pytest.raises(DecodeError) as info:
            cls.decode(wire[:cut])
        assert info.value.field == "length"
        with pytest.raises(DecodeError):
            cls.decode(b"\x00" * 4 + wire[:cut], 4)


def with_byte(wire: bytes, index: int, value: int) -> bytes:
    return wire[:index] + bytes([value]) + wire[index + 1 :]


BAD: list[tuple[type[Any], bytes, str]] = [
    (BTH, with_byte(h("c6 00 ffff 00000001 00000001"), 0, 0x00), "opcode"),
    (BTH, with_byte(h("c6 00 ffff 00000001 00000001"), 0, 0xD0), "opcode"),
    (BTH, with_byte(h("c6 00 ffff 00000001 00000001"), 1, 0x01), "tver"),
    (BTH, with_byte(h("c6 00 ffff 00000001 00000001"), 1, 0xF8), "tver"),
    (RETH, h("0000000000000000 00000000 00000000"), "dma_length"),
    (RETH, h("0000000000000000 00000000 80000001"), "dma_length"),
    (RETH, h("0000000000000000 00000000 ffffffff"), "dma_length"),
    (SETH, with_byte(SETH_PS_BYTES, 1, 0x63), "m"),
    (NETH, with_byte(NETH_TRIM_BYTES, 2, 0x03), "nack_reason"),
    (NETH, with_byte(NETH_TRIM_BYTES, 2, 0x00), "nack_reason"),
    (AETH, h("00 010000"), "msn"),
    (AETH, h("00 ffffff"), "msn"),
    (ERTH, with_byte(ERTH_PROBE_BYTES, 1, 0x02), "op"),
    (ERTH, with_byte(ERTH_PROBE_BYTES, 1, 0x03), "op"),
    (EETH, with_byte(EETH_PROBE_BYTES, 1, 0x03), "op"),
    # An ERTH is 16 bytes: too short for an EETH.
    (EETH, ERTH_PROBE_BYTES, "length"),
    (CMH, CMH_REQUEST_BYTES[:46] + h("0101") + CMH_REQUEST_BYTES[48:], "private_data_len"),
]


@pytest.mark.parametrize(
    ("cls", "wire", "field"), BAD, ids=[f"{c.__name__}-{f}" for c, _, f in BAD]
)
def test_bad_field(cls: type[Any], wire: bytes, field: str) -> None:
    with pytest.raises(DecodeError) as info:
        cls.decode(wire)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_sent_as_zero_fields_are_ignored() -> None:
    # docs/WIRE.md §4: every reliability header's `type 4 | next 5` prefix and every rsvd field
    # is sent as 0 and ignored, as other MRC implementations send them (TSETH TSR/ftype and
    # SETH/NETH cc_flags too); spdcid, dpdcid, vendor and PETH/ERTH ftype are kept (golden).
    assert TSETH.decode(h("beef fff0")) == TSETH(0xBEEF)
    assert TSETH.decode(h("beef fff5")) == TSETH(0xBEEF, ftype=5)  # ftype is kept
    noisy_seth = bytearray(SETH_PS_BYTES)
    noisy_seth[0] = 0xFF  # type 4 | next 4 of 5
    noisy_seth[1] |= 0x80 | 0x1C  # next's last bit, rsvd flag bits
    noisy_seth[12] = 0xFF  # rsvd before cack_psn
    noisy_seth[16] |= 0x0F  # cc_flags
    assert SETH.decode(bytes(noisy_seth)) == SETH_PS
    noisy_neth = bytearray(NETH_TRIM_BYTES)
    noisy_neth[0] = 0xFF
    noisy_neth[1] = 0xFF  # next, rsvd 7
    noisy_neth[12] = 0xFF
    noisy_neth[16] |= 0x0F
    noisy_neth[17] = 0xFF
    assert NETH.decode(bytes(noisy_neth)) == NETH_TRIM
    noisy_peth = bytearray(PETH_ONE_BYTES)
    noisy_peth[0:2] = b"\xff\xff"
    noisy_peth[3] = 0xFF
    noisy_peth[6:8] = b"\xff\xff"
    noisy_peth[14:16] = b"\xff\xf0"  # TSR, rsvd 11; ftype stays 0
    assert PETH.decode(bytes(noisy_peth)) == PETH_ONE
    noisy_erth = bytearray(ERTH_PROBE_BYTES)
    noisy_erth[0] = 0xFF
    noisy_erth[1] |= 0xFC  # next's last bit, rsvd 5; op stays
    noisy_erth[2] = 0xFF
    noisy_erth[8:12] = b"\xff" * 4  # where revision 1 kept probe_id
    noisy_erth[14:16] = b"\xff\xf0"
    assert ERTH.decode(bytes(noisy_erth)) == ERTH_PROBE
    noisy_eeth = bytearray(EETH_PROBE_BYTES)
    noisy_eeth[0:4] = b"\xff\xfd\xff\xff"  # type, next, rsvd; op 1 kept
    noisy_eeth[8:28] = b"\xff" * 20
    noisy_eeth[30:36] = b"\xff" * 6
    assert EETH.decode(bytes(noisy_eeth)) == EETH_PROBE
    noisy_cmh = bytearray(CMH_REQUEST_BYTES)
    noisy_cmh[7] = noisy_cmh[11] = noisy_cmh[27] = 0xFF
    noisy_cmh[56:64] = b"\xff" * 8
    assert CMH.decode(bytes(noisy_cmh)) == CMH_REQUEST


def test_bth_ignores_reserved_bits() -> None:
    wire = h("c6 00 ffff | 3e 000001 | 0f 000002")
    assert BTH.decode(wire) == BTH(Opcode.WRITE_FIRST, 1, 2)


def test_cmh_keeps_unknown_version_and_security() -> None:
    wire = bytearray(CMH_REQUEST_BYTES)
    wire[0] = 9
    wire[26] = 7
    cmh = CMH.decode(bytes(wire))
    assert (cmh.version, cmh.security) == (9, 7)


ENCODE_ERRORS: list[Any] = [
    BTH(Opcode.WRITE_FIRST, 1 << 24, 0),
    BTH(Opcode.WRITE_FIRST, 0, 1 << 24),
    BTH(Opcode.WRITE_FIRST, 0, -1),
    BTH(Opcode.WRITE_FIRST, 0, 0, pad_cnt=4),
    BTH(Opcode.WRITE_FIRST, 0, 0, p_key=1 << 16),
    EVXH(1 << 32),
    METH(1 << 16, 0),
    TSETH(1 << 16),
    RETH(0, 0, 0),
    RETH(0, 0, (1 << 31) + 1),
    RETH(1 << 64, 0, 1),
    ImmDt(-1),
    SETH(1 << 15, 0, 0, 0, 0),
    SETH(0, 0, 0, -(1 << 15) - 1, 0),
    SETH(0, 0, 0, 0, 1 << 64),
    SETH(0, 0, 0, 0, 0, mpr=256),
    CCState(ooo_count=1 << 15),
    CCState(rcv_cwnd_pen=128),
    CCState(rcvd_bytes=1 << 24),
    NETH(NackReason.TRIMMED, 0, 1 << 24),
    AETH(0, 1 << 16),
    AETH(256, 0),
    PETH(1 << 16),
    ERTH(EndpointOp.PORT_STATUS, port_status_mask=1 << 32),
    KeyBlock(b"\x00" * 31, b"\x00" * 32),
    Trailer(0, b"\x00" * 15),
]


@pytest.mark.parametrize("obj", ENCODE_ERRORS)
def test_encode_rejects_out_of_range(obj: Any) -> None:
    with pytest.raises(ValueError):
        obj.encode()
    with pytest.raises(ValueError):
        obj.encode_into(bytearray(128), 0)


def test_cmh_encode_checks_lengths() -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(CMH_REQUEST, nonce=b"short").encode()
    with pytest.raises(ValueError):
        dataclasses.replace(CMH_REQUEST, private_data_len=257).encode()
    with pytest.raises(ValueError):
        dataclasses.replace(CMH_REQUEST, local_qpn=1 << 24).encode()


def test_decode_error_shape() -> None:
    err = DecodeError("psn", "out of window")
    assert isinstance(err, ValueError)
    assert err.field == "psn"
    assert str(err) == "psn: out of window"
    again = pickle.loads(pickle.dumps(err))
    assert (again.field, str(again)) == ("psn", "psn: out of window")


def test_opcode_families() -> None:
    from mrc.wire import CM_OPCODES, DATA_OPCODES, FIRST_OPCODES, IMM_OPCODES, LAST_OPCODES

    assert {int(o) for o in DATA_OPCODES} == set(range(0xC6, 0xCC))
    assert {Opcode.WRITE_LAST_IMM, Opcode.WRITE_ONLY_IMM} == IMM_OPCODES
    assert IMM_OPCODES | {Opcode.WRITE_LAST, Opcode.WRITE_ONLY} == LAST_OPCODES
    assert {Opcode.WRITE_FIRST, Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_IMM} == FIRST_OPCODES
    assert {int(o) for o in CM_OPCODES} == set(range(0xE0, 0xE4))

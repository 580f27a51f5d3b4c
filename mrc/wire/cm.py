"""Connection-management headers [ours] (docs/WIRE.md §6): CMH and the key block.

Holds `CMH` (64 bytes), `KeyBlock` (two X25519 public keys, 64 bytes), their enums and
`MAX_PRIVATE_DATA`; the TAI64N timestamp of a sealed REQUEST and `split_request`, which cuts a
REQUEST (any revision-1.2 form, §7) into its head and the rest without opening anything. The
decoder accepts any `version` and `security` value: answering those with a REJECT, negotiating
parameters, deriving keys and opening a sealed REQUEST (§7) are `mrc.core`'s job.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final, Self

from mrc.wire._codec import Buffer, FixedHeader, check_bits, check_len, need
from mrc.wire.bth import BTH_STRUCT, CM_LISTEN_QPN, EVX_BIT, Opcode
from mrc.wire.errors import DecodeError

MAX_PRIVATE_DATA: Final = 256
NONCE_SIZE: Final = 16
KEY_SIZE: Final = 32  # an X25519 public key
#: A sealed REQUEST's TAI64N timestamp (§7, revision 1.2): seconds 64 (+ 2^62) | nanoseconds 32.
TIMESTAMP_SIZE: Final = 12
#: A sealed REQUEST's AES-256-GCM tag.
REQUEST_TAG_SIZE: Final = 16
TAI64_BASE: Final = 1 << 62
_TAI64N: Final = struct.Struct(">QI")

# 0 version | plane | flags, 4 local_qpn 24 | rsvd, 8 remote_qpn 24 | rsvd,
# 12 initial_psn 24 | mpr, 16 payload_mtu | plane_count | ev_per_plane, 20 plane_mask,
# 24 max_imm | security | rsvd, 28 nonce, 44 reject_reason | private_data_len,
# 48 connection_id, 56 rsvd 64
CMH_STRUCT: Final = struct.Struct(">BBHIIIHBBIHBx16sHHQ8x")
CMH_SIZE: Final = 64
KEYBLOCK_STRUCT: Final = struct.Struct(">32s32s")
KEYBLOCK_SIZE: Final = 64


class SecurityLevel(IntEnum):
    """CMH `security`: none, authenticated, or authenticated and encrypted (§7)."""

    NONE = 0
    AUTH = 1
    ENCRYPT = 2


class RejectReason(IntEnum):
    """CMH `reject_reason` in a CM_REJECT."""

    NO_LISTENER = 1
    VERSION = 2
    SECURITY_POLICY = 3
    UNKNOWN_PEER = 4
    RESOURCES = 5
    BAD_PARAMETERS = 6


#: CMH `flags` bit: EVs in the IPv6 flow label, no EVXH (docs/WIRE.md §3, §6).
CM_FLAG_EV_FLOWLABEL: Final = 0x0001
#: CMH `flags` bit: each EV also picks the UDP source port (docs/WIRE.md §3, §6).
CM_FLAG_EV_SPORT: Final = 0x0002


@dataclass(frozen=True, slots=True)
class CMH(FixedHeader):
    """Connection-management header, 64 bytes.

    `plane` is informational (REQUEST: the plane this copy went out on; otherwise 0xFF).
    `security` is a SecurityLevel value; `reject_reason` a RejectReason value (0 outside a
    REJECT). A 64-byte key block follows when `security` is not 0, then `private_data_len` bytes
    of private data. `flags` [ours]: bit 0 (`CM_FLAG_EV_FLOWLABEL`) = the EV rides in the IPv6
    flow label instead of EVXH (offered in a REQUEST, agreed in a REPLY); bit 1
    (`CM_FLAG_EV_SPORT`) = the sender's source port varies with the EV (both sides must set
    it alike); the rest sent as 0.
    """

    local_qpn: int
    remote_qpn: int
    initial_psn: int
    mpr: int
    payload_mtu: int
    plane_count: int
    ev_per_plane: int
    plane_mask: int
    max_imm: int
    security: int
    nonce: bytes
    connection_id: int
    plane: int = 0xFF
    reject_reason: int = 0
    private_data_len: int = 0
    version: int = 1
    flags: int = 0

    def _layout(self) -> struct.Struct:
        return CMH_STRUCT

    def _values(self) -> tuple[int | bytes, ...]:
        if self.private_data_len > MAX_PRIVATE_DATA:
            raise ValueError(f"private_data_len={self.private_data_len} exceeds {MAX_PRIVATE_DATA}")
        return (
            check_bits("version", self.version, 8),
            check_bits("plane", self.plane, 8),
            check_bits("flags", self.flags, 16),
            check_bits("local_qpn", self.local_qpn, 24) << 8,
            check_bits("remote_qpn", self.remote_qpn, 24) << 8,
            (check_bits("initial_psn", self.initial_psn, 24) << 8) | check_bits("mpr", self.mpr, 8),
            check_bits("payload_mtu", self.payload_mtu, 16),
            check_bits("plane_count", self.plane_count, 8),
            check_bits("ev_per_plane", self.ev_per_plane, 8),
            check_bits("plane_mask", self.plane_mask, 32),
            check_bits("max_imm", self.max_imm, 16),
            check_bits("security", int(self.security), 8),
            check_len("nonce", self.nonce, NONCE_SIZE),
            check_bits("reject_reason", int(self.reject_reason), 16),
            check_bits("private_data_len", self.private_data_len, 16),
            check_bits("connection_id", self.connection_id, 64),
        )

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 64, "CMH")
        (
            version,
            plane,
            flags,
            local,
            remote,
            psn_mpr,
            payload_mtu,
            plane_count,
            ev_per_plane,
            plane_mask,
            max_imm,
            security,
            nonce,
            reject_reason,
            private_data_len,
            connection_id,
        ) = CMH_STRUCT.unpack_from(buf, offset)
        if private_data_len > MAX_PRIVATE_DATA:
            raise DecodeError("private_data_len", f"{private_data_len} exceeds {MAX_PRIVATE_DATA}")
        return cls(
            local_qpn=local >> 8,
            remote_qpn=remote >> 8,
            initial_psn=psn_mpr >> 8,
            mpr=psn_mpr & 0xFF,
            payload_mtu=payload_mtu,
            plane_count=plane_count,
            ev_per_plane=ev_per_plane,
            plane_mask=plane_mask,
            max_imm=max_imm,
            security=security,
            nonce=nonce,
            connection_id=connection_id,
            plane=plane,
            reject_reason=reject_reason,
            private_data_len=private_data_len,
            version=version,
            flags=flags,
        )


@dataclass(frozen=True, slots=True)
class KeyBlock(FixedHeader):
    """The sender's ephemeral and static X25519 public keys, 32 bytes each (§6)."""

    ephemeral: bytes
    static: bytes

    def _layout(self) -> struct.Struct:
        return KEYBLOCK_STRUCT

    def _values(self) -> tuple[bytes, ...]:
        return (
            check_len("ephemeral", self.ephemeral, KEY_SIZE),
            check_len("static", self.static, KEY_SIZE),
        )

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 64, "key block")
        ephemeral, static = KEYBLOCK_STRUCT.unpack_from(buf, offset)
        return cls(ephemeral, static)


#: BTH + CMH + key block: a secured CM packet's head (what a sealed REQUEST authenticates).
CM_HEAD: Final = 12 + CMH_SIZE + KEYBLOCK_SIZE


def tai64n(seconds: int, nanoseconds: int) -> bytes:
    """A TAI64N label: `seconds` since the Unix epoch (+ 2^62) and `nanoseconds`."""
    if not 0 <= nanoseconds < 1_000_000_000:
        raise ValueError(f"nanoseconds={nanoseconds} outside 0..999999999")
    return _TAI64N.pack(TAI64_BASE + seconds, nanoseconds)


def tai64n_ns(label: bytes) -> int:
    """A TAI64N label as nanoseconds since the epoch (comparable; only the order matters)."""
    sec, nsec = _TAI64N.unpack(check_len("timestamp", label, TIMESTAMP_SIZE))
    return int((sec - TAI64_BASE) * 1_000_000_000 + nsec)


@dataclass(frozen=True, slots=True)
class RequestParts:
    """A CM_REQUEST cut at its boundaries (§6-§7). `sealed` is the AES-GCM ciphertext of
    `timestamp | private data` with its tag (a sealed secured REQUEST), or the private data in
    clear (an unsecured REQUEST, or a secured one in the open form that names no responder key;
    `is_sealed` says which)."""

    p_key: int
    cmh: CMH
    key_block: KeyBlock | None
    rest: bytes
    is_sealed: bool


def split_request(buf: Buffer) -> RequestParts:
    """Cut a REQUEST into its parts; DecodeError when the lengths fit no form of §6-§7. A
    secured REQUEST is sealed when it holds exactly timestamp + private data + tag after the
    key block, open when it holds exactly the private data."""
    mv = memoryview(buf)
    n = len(mv)
    need(mv, 0, 12, "BTH")
    op, _b1, p_key, w4, _w8 = BTH_STRUCT.unpack_from(mv)
    if op != Opcode.CM_REQUEST.value:
        raise DecodeError("opcode", f"{op:#x} is not a CM_REQUEST")
    if w4 & EVX_BIT:
        raise DecodeError("evx", "CM packets carry no EVXH")
    if w4 & 0xFFFFFF != CM_LISTEN_QPN:
        raise DecodeError("dest_qp", "a CM_REQUEST goes to QP 0x1")
    cmh = CMH.decode(mv, 12)
    if not cmh.security:
        if n != 12 + CMH_SIZE + cmh.private_data_len:
            raise DecodeError("private_data_len", f"{n - 76} bytes after CMH")
        return RequestParts(p_key, cmh, None, bytes(mv[12 + CMH_SIZE :]), False)
    need(mv, 0, CM_HEAD, "key block")
    key_block = KeyBlock.decode(mv, 12 + CMH_SIZE)
    after = n - CM_HEAD
    if after == TIMESTAMP_SIZE + cmh.private_data_len + REQUEST_TAG_SIZE:
        return RequestParts(p_key, cmh, key_block, bytes(mv[CM_HEAD:]), True)
    if after == cmh.private_data_len:
        return RequestParts(p_key, cmh, key_block, bytes(mv[CM_HEAD:]), False)
    raise DecodeError(
        "private_data_len",
        f"{after} bytes after the key block fit neither {cmh.private_data_len} of private data"
        f" nor {TIMESTAMP_SIZE} + {cmh.private_data_len} + {REQUEST_TAG_SIZE} sealed",
    )

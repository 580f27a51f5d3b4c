"""The IPv6 Segment Routing Header of RFC 8754, as set on a path socket with IPV6_RTHDR.

Holds `SRH`: segments in RFC order (segments[0] is the last segment, the final destination),
optional TLVs, and the derived fields (Hdr Ext Len, Last Entry, padding) computed on encode.
Which path an EV takes and setting the socket option belong to `mrc.core` and `mrc.io`
(docs/DESIGN.md §4, §5).
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Self

from mrc.wire._codec import Buffer, check_bits, need
from mrc.wire.errors import DecodeError

ROUTING_TYPE_SRH: Final = 4
TLV_PAD1: Final = 0
TLV_PADN: Final = 4
UDP: Final = 17

# next_header | hdr_ext_len | routing_type | segments_left | last_entry | flags | tag
_FIXED: Final = struct.Struct(">BBBBBBH")
SRH_SIZE: Final = 8


@dataclass(frozen=True, slots=True)
class SRH:
    """Segment Routing Header (RFC 8754 §2).

    `segments_left` defaults to `len(segments) - 1` (the first hop is the active segment).
    `tlvs` holds (type, value) pairs other than Pad1/PadN; padding to a multiple of 8 bytes is
    added on encode and dropped on decode. `SRH_SIZE` is the fixed part before the segment list.
    """

    segments: tuple[ipaddress.IPv6Address, ...]
    next_header: int = UDP
    segments_left: int | None = None
    flags: int = 0
    tag: int = 0
    tlvs: tuple[tuple[int, bytes], ...] = ()

    def __post_init__(self) -> None:
        segments = tuple(ipaddress.IPv6Address(s) for s in self.segments)
        object.__setattr__(self, "segments", segments)
        object.__setattr__(self, "tlvs", tuple((t, bytes(v)) for t, v in self.tlvs))
        if self.segments_left is None:
            object.__setattr__(self, "segments_left", len(segments) - 1)

    @classmethod
    def for_path(
        cls,
        hops: Sequence[ipaddress.IPv6Address | str],
        *,
        next_header: int = UDP,
        flags: int = 0,
        tag: int = 0,
        tlvs: tuple[tuple[int, bytes], ...] = (),
    ) -> Self:
        """An SRH for `hops` given in travel order (first hop first, destination last)."""
        segments = tuple(ipaddress.IPv6Address(h) for h in reversed(hops))
        return cls(segments, next_header=next_header, flags=flags, tag=tag, tlvs=tlvs)

    def _tlv_bytes(self) -> bytes:
        out = bytearray()
        for tlv_type, value in self.tlvs:
            if tlv_type in (TLV_PAD1, TLV_PADN):
                raise ValueError("padding TLVs are added on encode; do not pass them")
            check_bits("tlv type", tlv_type, 8)
            check_bits("tlv length", len(value), 8)
            out += bytes((tlv_type, len(value))) + value
        pad = -(SRH_SIZE + 16 * len(self.segments) + len(out)) % 8
        if pad == 1:
            out.append(TLV_PAD1)
        elif pad:
            out += bytes((TLV_PADN, pad - 2)) + bytes(pad - 2)
        return bytes(out)

    def encode(self) -> bytes:
        """The header's wire bytes, derived fields computed here."""
        if not self.segments:
            raise ValueError("an SRH needs at least one segment")
        last_entry = len(self.segments) - 1
        segments_left = last_entry if self.segments_left is None else self.segments_left
        if not 0 <= segments_left <= last_entry:
            raise ValueError(f"segments_left={segments_left} outside 0 … {last_entry}")
        body = b"".join(s.packed for s in self.segments) + self._tlv_bytes()
        hdr_ext_len = len(body) // 8
        check_bits("hdr_ext_len", hdr_ext_len, 8)
        check_bits("last_entry", last_entry, 8)
        fixed = _FIXED.pack(
            check_bits("next_header", self.next_header, 8),
            hdr_ext_len,
            ROUTING_TYPE_SRH,
            segments_left,
            last_entry,
            check_bits("flags", self.flags, 8),
            check_bits("tag", self.tag, 16),
        )
        return fixed + body

    def encode_into(self, buf: bytearray, offset: int) -> int:
        """Write the header into `buf` at `offset`; return the offset just past it."""
        raw = self.encode()
        buf[offset : offset + len(raw)] = raw
        return offset + len(raw)

    @property
    def size(self) -> int:
        """Encoded size in bytes, padding included."""
        return SRH_SIZE + 16 * len(self.segments) + len(self._tlv_bytes())

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 8, "SRH")
        next_header, hdr_ext_len, routing_type, segments_left, last_entry, flags, tag = (
            _FIXED.unpack_from(buf, offset)
        )
        if routing_type != ROUTING_TYPE_SRH:
            raise DecodeError("routing_type", f"routing type {routing_type}, expected 4")
        body_len = 8 * hdr_ext_len
        if len(buf) - offset - 8 < body_len:
            raise DecodeError(
                "hdr_ext_len", f"claims {8 + body_len} bytes, {len(buf) - offset} left"
            )
        seg_len = 16 * (last_entry + 1)
        if seg_len > body_len:
            raise DecodeError(
                "last_entry", f"{last_entry + 1} segments do not fit in {body_len} bytes"
            )
        if segments_left > last_entry:
            raise DecodeError("segments_left", f"{segments_left} > last_entry {last_entry}")
        start = offset + 8
        raw = bytes(buf[start : start + body_len])
        segments = tuple(ipaddress.IPv6Address(raw[i : i + 16]) for i in range(0, seg_len, 16))
        return cls(
            segments=segments,
            next_header=next_header,
            segments_left=segments_left,
            flags=flags,
            tag=tag,
            tlvs=_decode_tlvs(raw, seg_len),
        )


def _decode_tlvs(raw: bytes, pos: int) -> tuple[tuple[int, bytes], ...]:
    """The non-padding TLVs in `raw[pos:]` (RFC 8754 §2.1)."""
    tlvs = []
    while pos < len(raw):
        tlv_type = raw[pos]
        if tlv_type == TLV_PAD1:
            pos += 1
            continue
        if pos + 2 > len(raw) or pos + 2 + raw[pos + 1] > len(raw):
            raise DecodeError("tlv", f"TLV type {tlv_type} at byte {pos} overruns the header")
        end = pos + 2 + raw[pos + 1]
        if tlv_type != TLV_PADN:
            tlvs.append((tlv_type, raw[pos + 2 : end]))
        pos = end
    return tuple(tlvs)

"""The security trailer (docs/WIRE.md §7): `tx_counter 64 | tag 128`, 24 bytes at a packet's end.

Only the layout lives here. Keys, AES-GCM sealing and opening, the nonce and the anti-replay
window belong to `mrc.core`; stripping the trailer before `decode_packet` is the caller's job.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, Self

from mrc.wire._codec import Buffer, FixedHeader, check_bits, check_len, need

TRAILER_STRUCT: Final = struct.Struct(">Q16s")
TRAILER_SIZE: Final = 24
TAG_SIZE: Final = 16


@dataclass(frozen=True, slots=True)
class Trailer(FixedHeader):
    """Security trailer, 24 bytes: this direction's transmission counter and the GCM tag."""

    tx_counter: int
    tag: bytes

    def _layout(self) -> struct.Struct:
        return TRAILER_STRUCT

    def _values(self) -> tuple[int | bytes, ...]:
        return (
            check_bits("tx_counter", self.tx_counter, 64),
            check_len("tag", self.tag, TAG_SIZE),
        )

    @classmethod
    def decode(cls, buf: Buffer, offset: int = 0) -> Self:
        need(buf, offset, 24, "trailer")
        tx_counter, tag = TRAILER_STRUCT.unpack_from(buf, offset)
        return cls(tx_counter, tag)

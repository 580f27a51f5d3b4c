"""Shared plumbing for the fixed-size header codecs.

Holds the `Buffer` type alias, the `FixedHeader` mixin that gives every fixed-size header its
`encode`/`encode_into` pair from one precompiled `struct.Struct`, and small range/length checks.
It knows no header layout itself; each header module declares its own struct. The `type 4 |
next 5` prefix of the reliability headers is sent as 0 and ignored on receipt (docs/WIRE.md §4):
the opcode alone says which header follows.
"""

from __future__ import annotations

import struct
from typing import ClassVar

from mypy_extensions import mypyc_attr

from mrc.wire.errors import DecodeError

Buffer = bytes | bytearray | memoryview


# The header dataclasses stay interpreted (tools/build_mypyc.py says why) and subclass this.
@mypyc_attr(allow_interpreted_subclasses=True)
class FixedHeader:
    """Mixin for frozen, slotted header dataclasses with a fixed wire size."""

    __slots__ = ()

    SIZE: ClassVar[int]
    _STRUCT: ClassVar[struct.Struct]

    def _values(self) -> tuple[int | bytes, ...]:
        """The struct values in wire order; validates ranges (raises ValueError)."""
        raise NotImplementedError

    def encode(self) -> bytes:
        """The header's wire bytes."""
        return self._STRUCT.pack(*self._values())

    def encode_into(self, buf: bytearray, offset: int) -> int:
        """Write the header into `buf` at `offset`; return the offset just past it."""
        self._STRUCT.pack_into(buf, offset, *self._values())
        return offset + self.SIZE


def need(buf: Buffer, offset: int, size: int, what: str) -> None:
    """Raise DecodeError("length") unless `buf` holds `size` bytes from `offset`."""
    have = len(buf) - offset
    if offset < 0 or have < size:
        raise DecodeError("length", f"{what} needs {size} bytes, {max(have, 0)} left")


def check_bits(name: str, value: int, bits: int) -> int:
    """Return `value` if it fits in `bits` unsigned bits, else raise ValueError."""
    if value < 0 or value >> bits:
        raise ValueError(f"{name}={value} does not fit in {bits} bits")
    return value


def check_signed(name: str, value: int, bits: int) -> int:
    """Return `value` if it fits in `bits` two's-complement bits, else raise ValueError."""
    limit = 1 << (bits - 1)
    if not -limit <= value < limit:
        raise ValueError(f"{name}={value} does not fit in {bits} signed bits")
    return value


def check_len(name: str, value: bytes, length: int) -> bytes:
    """Return `value` if it is exactly `length` bytes long, else raise ValueError."""
    if len(value) != length:
        raise ValueError(f"{name} must be {length} bytes, got {len(value)}")
    return bytes(value)

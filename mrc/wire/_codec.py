"""Shared plumbing for the fixed-size header codecs.

Holds the `Buffer` type alias, the `FixedHeader` mixin that gives every fixed-size header its
`encode`/`encode_into` pair from one precompiled `struct.Struct`, and small range/length checks.
It knows no header layout itself; each header module declares its own struct. The `type 4 |
next 5` prefix of the reliability headers is sent as 0 and ignored on receipt (docs/WIRE.md §4):
the opcode alone says which header follows.
"""

from __future__ import annotations

import struct

from mrc.wire.errors import DecodeError

Buffer = bytes | bytearray | memoryview


class FixedHeader:
    """Mixin for frozen, slotted header dataclasses with a fixed wire size.

    A header names its layout through `_layout()` and its size as a module constant beside its
    struct (`METH_SIZE` beside `METH_STRUCT`), not as class attributes: mypyc takes a compiled
    dataclass's class variables for fields and cannot construct it ("attribute 'SIZE' is
    read-only" from its `__init__`), which kept every header module interpreted.
    """

    __slots__ = ()

    def _layout(self) -> struct.Struct:
        """The header's precompiled struct."""
        raise NotImplementedError

    def _values(self) -> tuple[int | bytes, ...]:
        """The struct values in wire order; validates ranges (raises ValueError)."""
        raise NotImplementedError

    def encode(self) -> bytes:
        """The header's wire bytes."""
        return self._layout().pack(*self._values())

    def encode_into(self, buf: bytearray, offset: int) -> int:
        """Write the header into `buf` at `offset`; return the offset just past it."""
        layout = self._layout()
        layout.pack_into(buf, offset, *self._values())
        return offset + layout.size


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

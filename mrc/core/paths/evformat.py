"""EV formats, EV profiles and EV expansion as the OCP MRC controller API defines them.

docs/DESIGN.md §4 ("EV formats and profiles"). The controller API (`mrc_ctl.h`) describes an EV
in two layers. An *EV format profile* names where EVs go on the wire (STEV: IPv6 flow label and
UDP source port; UDP: the source port alone; SRv6: the outer destination address, optionally
with a single-segment SRH) and cuts that space into fields of given widths. An *EV profile*
gives each field a width, an initial value, a min/max range and a mask, and holds EVs either as
an explicit list (EXP) or as every combination the field ranges allow (GEN). An EV as the API
stores it is *compact*: only the bits that vary. *Expansion* turns it into the value a packet
carries: each field starts at its init_val, each set mask bit (from the most significant down)
takes the next bit of the compact EV, and the fields are concatenated, each right-aligned in its
format field and zero-filled to that field's width.

This module holds all of that as frozen data, the expansion and its inverse (`collapse`,
`index_of`: a received value back to its EV, or None when no EV of the profile expands to it),
the controller's DENIED step (`denied`), and the mapping of an expanded EV onto the headers that
carry it (`to_wire`, `from_wire`, and the API's 32-byte EV value). Bad profiles raise a one-line
`ValueError` naming the field and the problem.

Its purpose is the controller side: the formats and profiles a fabric controller provisions a
host with through the OCP controller API. No session calls it today (a connection's EVs come
from `SessionConfig` and evs.py); it stays a module of its own, with its own tests
(tests/core/test_evformat.py), for a host that takes its EVs from a controller.

It leaves to others: which EV a packet takes (spray.py), EV states and their changes (evs.py),
agreeing on an EV encoding with the peer (cm.py), and setting flow labels or picking the socket
of a source port (io/). It is pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Final

#: Bytes of the API's EV value (`mrc_ctl_ev_t`): 16 for the SRv6 address, 16 for the SRH segment.
API_EV_BYTES: Final = 32
#: An EV profile field holds 32-bit values (`struct mrc_ctl_ev_field` is all `uint32_t`).
FIELD_MAX_WIDTH: Final = 32
FLOW_LABEL_BITS: Final = 20
UDP_PORT_BITS: Final = 16
_U32: Final = (1 << 32) - 1
#: `EvProfile.denied` walks the EV array: refuse arrays beyond this rather than run for hours.
DENY_LIMIT: Final = 1 << 20


@dataclass(frozen=True)
class Carrier:
    """One header field an EV format writes EV bits into."""

    name: str  # "flow_label", "udp_sport", "ipv6_da", "srh_segment"
    bits: int  # how many EV bits it takes, in order, from the format's most significant end
    where: str


@dataclass(frozen=True)
class FormatSpec:
    """What the API says about one EV format: its mode code, size and carriers."""

    api_mode: int  # `enum mrc_ctl_ev_fmt_mode`
    max_bits: int  # the widest expanded EV the format holds
    carriers: tuple[Carrier, ...]


_FLOW: Final = Carrier("flow_label", 16, "IPv6 flow label, its low 16 of 20 bits")
_SPORT: Final = Carrier("udp_sport", 16, "UDP source port")
_DA: Final = Carrier("ipv6_da", 128, "outer IPv6 destination address (uSID carrier)")
_SEG: Final = Carrier("srh_segment", 128, "the single segment of a Segment Routing Header")


class EvFormat(Enum):
    """The EV formats of the API. The API has one SRv6 mode with an optional SRH; its two
    shapes differ in size and carriers, so they are two members here.

    STEV's split between flow label and source port is ours: the API says only that the
    (at most 32) bits are spread over the two. The first 16 go into the flow label, so an STEV
    of 16 bits or fewer needs nothing from the source port and one socket serves every EV.
    """

    STEV = "stev"
    UDP = "udp"
    SRV6 = "srv6"
    SRV6_SRH = "srv6_srh"

    @property
    def spec(self) -> FormatSpec:
        return _SPECS[self]


_SPECS: Final[dict[EvFormat, FormatSpec]] = {
    EvFormat.STEV: FormatSpec(1 << 0, 32, (_FLOW, _SPORT)),
    EvFormat.SRV6: FormatSpec(1 << 1, 128, (_DA,)),
    EvFormat.SRV6_SRH: FormatSpec(1 << 1, 256, (_DA, _SEG)),
    EvFormat.UDP: FormatSpec(1 << 2, 16, (_SPORT,)),
}


class EvMode(Enum):
    """EV profile modes (`enum mrc_ctl_ev_mode`). The API's third, AUTO, leaves EVs to the NIC
    vendor (plain ECMP): it has no fields and nothing to expand, so it is not here."""

    EXP = 1 << 1  # the controller lists the EVs
    GEN = 1 << 2  # every combination of the fields' generated values


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class EvFormatProfile:
    """An EV format profile: the format and the widths of its fields, most significant first.
    The fields' sum is the width of every expanded EV of the profiles that use it."""

    fmt: EvFormat
    widths: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.fmt, EvFormat):
            raise ValueError(f"EV format profile: format {self.fmt!r} is not an EvFormat")
        if not isinstance(self.widths, tuple) or not self.widths:
            raise ValueError("EV format profile: needs a non-empty tuple of field widths")
        top = self.fmt.spec.max_bits
        for i, w in enumerate(self.widths):
            if not _is_int(w) or not 1 <= w <= top:
                raise ValueError(
                    f"EV format field {i}: width {w!r} outside 1..{top} ({self.fmt.name})"
                )
        total = sum(self.widths)
        if total > top:
            hint = " (an SRH segment needs SRV6_SRH)" if self.fmt is EvFormat.SRV6 else ""
            raise ValueError(
                f"EV format profile: fields total {total} bits, {self.fmt.name} holds {top}{hint}"
            )
        if self.fmt is EvFormat.SRV6_SRH:
            # The SRH segment starts at bit 128 of the EV: a field across it would put half
            # its value in the destination address and half in the segment.
            ends = {sum(self.widths[: i + 1]) for i in range(len(self.widths))}
            if total <= 128 or 128 not in ends:
                raise ValueError(
                    f"EV format profile: SRV6_SRH fields total {total} bits and must end a "
                    "field at bit 128 (the address) and go past it (the SRH segment)"
                )

    @property
    def bits(self) -> int:
        return sum(self.widths)

    def split(self, expanded: int) -> tuple[int, ...]:
        """The value of each format field in an expanded EV, most significant first."""
        _check_range("expanded EV", expanded, self.bits)
        out: list[int] = []
        left = self.bits
        for w in self.widths:
            left -= w
            out.append(expanded >> left & ((1 << w) - 1))
        return tuple(out)


@dataclass(frozen=True)
class EvField:
    """One EV profile field (`struct mrc_ctl_ev_field`). A fixed field has mask, min_val and
    max_val 0 and carries init_val in every EV. min_val/max_val bound the value a GEN profile
    generates for the field: the number formed by its mask bits."""

    width: int
    init_val: int = 0
    min_val: int = 0
    max_val: int = 0
    mask: int = 0

    @property
    def generated_bits(self) -> int:
        return self.mask.bit_count()

    def deposit(self, value: int) -> int:
        """init_val with `value`'s bits written at the mask positions: the mask's most
        significant set bit takes value's most significant bit (of generated_bits)."""
        out = self.init_val & ~self.mask
        bit = 0
        for pos in range(self.width):
            if self.mask >> pos & 1:
                out |= (value >> bit & 1) << pos
                bit += 1
        return out

    def extract(self, field_value: int) -> int:
        """The inverse of `deposit`: the number the mask positions of field_value hold."""
        out = 0
        bit = 0
        for pos in range(self.width):
            if self.mask >> pos & 1:
                out |= (field_value >> pos & 1) << bit
                bit += 1
        return out


def _check_range(what: str, value: object, bits: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << bits:
        raise ValueError(f"{what} {value!r} does not fit {bits} bits")


def _check_field(i: int, f: object, fmt_width: int) -> None:
    """One line naming field i and its first problem, as the API's profile rules state them."""
    if not isinstance(f, EvField):
        raise ValueError(f"EV profile field {i}: {f!r} is not an EvField")
    where = f"EV profile field {i}"
    for name in ("width", "init_val", "min_val", "max_val", "mask"):
        value = getattr(f, name)
        if not _is_int(value) or not 0 <= value <= _U32:
            raise ValueError(f"{where}: {name} {value!r} is not a 32-bit unsigned integer")
    if not 1 <= f.width <= FIELD_MAX_WIDTH:
        raise ValueError(f"{where}: width {f.width} outside 1..{FIELD_MAX_WIDTH}")
    if f.width > fmt_width:
        raise ValueError(f"{where}: width {f.width} exceeds its format field's {fmt_width} bits")
    if f.init_val >> f.width:
        raise ValueError(f"{where}: init_val {f.init_val:#x} is wider than {f.width} bits")
    if f.mask >> f.width:
        raise ValueError(f"{where}: mask {f.mask:#x} has bits outside the field's {f.width} bits")
    if f.mask == 0:
        if f.min_val or f.max_val:
            raise ValueError(f"{where}: a fixed field (mask 0) takes min_val 0 and max_val 0")
        return
    n = f.generated_bits
    if f.max_val >> n:
        raise ValueError(f"{where}: max_val {f.max_val:#x} is wider than the mask's {n} set bits")
    if f.min_val > f.max_val:
        raise ValueError(f"{where}: min_val {f.min_val:#x} above max_val {f.max_val:#x}")


@dataclass(frozen=True)
class EvProfile:
    """An EV profile: fields over a format profile, in EXP mode (the listed compact EVs, in
    order; copies allowed, as the API's replace-all-copies shows) or GEN mode (every
    combination of the fields' generated values, the last field varying fastest).

    Field i lands in format field i; fewer fields than the format has leave the rest zero.
    The port (plane) of each EV entry is the caller's: a GEN profile's EVs serve any plane.
    """

    fmt: EvFormatProfile
    mode: EvMode
    fields: tuple[EvField, ...]
    evs: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.fmt, EvFormatProfile):
            raise ValueError(f"EV profile: format {self.fmt!r} is not an EvFormatProfile")
        if not isinstance(self.mode, EvMode):
            raise ValueError(f"EV profile: mode {self.mode!r} is not EXP or GEN")
        if not isinstance(self.fields, tuple) or not self.fields:
            raise ValueError("EV profile: needs a non-empty tuple of fields")
        if len(self.fields) > len(self.fmt.widths):
            raise ValueError(
                f"EV profile: {len(self.fields)} fields, its format profile has "
                f"{len(self.fmt.widths)}"
            )
        for i, f in enumerate(self.fields):
            _check_field(i, f, self.fmt.widths[i])
        if not isinstance(self.evs, tuple):
            raise ValueError("EV profile: evs must be a tuple of compact EVs")
        if self.mode is EvMode.GEN:
            if self.evs:
                raise ValueError("EV profile: a GEN profile generates its EVs, it takes no list")
            return
        if not self.evs:
            raise ValueError("EV profile: an EXP profile needs at least one EV")
        for k, ev in enumerate(self.evs):
            if not _is_int(ev) or not 0 <= ev < 1 << self.ev_bits:
                raise ValueError(
                    f"EV profile: explicit EV {k} ({ev!r}) does not fit the profile's "
                    f"{self.ev_bits} EV bits"
                )

    # ---- sizes -------------------------------------------------------------------------

    @property
    def ev_bits(self) -> int:
        """Bits of a compact EV: one per set mask bit over all fields."""
        return sum(f.generated_bits for f in self.fields)

    @cached_property
    def _radices(self) -> tuple[tuple[EvField, int], ...]:
        """(field, how many values it generates) for every field with mask bits."""
        return tuple((f, f.max_val - f.min_val + 1) for f in self.fields if f.mask)

    @property
    def ev_count(self) -> int:
        """How many EVs the profile holds: the list's length, or the product of the
        generated fields' ranges (a GEN profile of fixed fields only has one EV)."""
        if self.mode is EvMode.EXP:
            return len(self.evs)
        count = 1
        for _, radix in self._radices:
            count *= radix
        return count

    # ---- expansion ---------------------------------------------------------------------

    def compact(self, index: int) -> int:
        """The compact EV at `index` of the profile's EV array."""
        if not _is_int(index) or not 0 <= index < self.ev_count:
            raise ValueError(f"EV index {index!r} outside 0..{self.ev_count - 1}")
        if self.mode is EvMode.EXP:
            return self.evs[index]
        digits: list[int] = []
        for f, radix in reversed(self._radices):
            index, digit = divmod(index, radix)
            digits.append(f.min_val + digit)
        out = 0
        for (f, _), value in zip(self._radices, reversed(digits), strict=True):
            out = out << f.generated_bits | value
        return out

    def expand(self, compact: int) -> int:
        """The expanded EV (the format profile's width) of a compact EV."""
        _check_range("compact EV", compact, self.ev_bits)
        left = self.ev_bits
        out = 0
        for f, w in zip(self.fields, self.fmt.widths, strict=False):
            n = f.generated_bits
            left -= n
            value = f.deposit(compact >> left & ((1 << n) - 1))
            out = out << w | value  # right-aligned in its format field: the rest stays zero
        unused = self.fmt.widths[len(self.fields) :]
        return out << sum(unused)

    def expanded(self, index: int) -> int:
        return self.expand(self.compact(index))

    def expanded_evs(self) -> Iterator[int]:
        """Every expanded EV of the array, in index order."""
        for i in range(self.ev_count):
            yield self.expanded(i)

    def generated_values(self, compact: int) -> tuple[int, ...]:
        """Per field, the number its mask bits take from the compact EV (0 for a fixed
        field): what min_val/max_val bound."""
        _check_range("compact EV", compact, self.ev_bits)
        left = self.ev_bits
        out: list[int] = []
        for f in self.fields:
            left -= f.generated_bits
            out.append(compact >> left & ((1 << f.generated_bits) - 1))
        return tuple(out)

    # ---- the inverse -------------------------------------------------------------------

    def collapse(self, expanded: int) -> int | None:
        """The compact EV that expands to `expanded`, or None when none does (a fixed bit,
        a zero-filled bit or an unused format field differs)."""
        _check_range("expanded EV", expanded, self.fmt.bits)
        parts = self.fmt.split(expanded)
        compact = 0
        for f, value in zip(self.fields, parts, strict=False):
            if value >> f.width or (value ^ f.init_val) & ~f.mask:
                return None
            compact = compact << f.generated_bits | f.extract(value)
        if any(parts[len(self.fields) :]):
            return None
        return compact

    @cached_property
    def _explicit_index(self) -> dict[int, int]:
        first: dict[int, int] = {}
        for i, ev in enumerate(self.evs):
            first.setdefault(ev, i)
        return first

    def index_of(self, expanded: int) -> int | None:
        """The array index of an expanded EV (the first, for an EXP list with copies), or None
        when it is no EV of this profile: no compact EV expands to it, it is not listed, or a
        field's generated value lies outside [min_val, max_val] (a GEN profile never makes
        it)."""
        compact = self.collapse(expanded)
        if compact is None:
            return None
        if self.mode is EvMode.EXP:
            return self._explicit_index.get(compact)
        index = 0
        for f, value in zip(self.fields, self.generated_values(compact), strict=True):
            if not f.mask:
                continue
            if not f.min_val <= value <= f.max_val:
                return None
            index = index * (f.max_val - f.min_val + 1) + value - f.min_val
        return index

    def denied(self, field_index: int, lo: int, hi: int) -> frozenset[int]:
        """The indices of the EVs whose format field `field_index` holds a value in [lo, hi]:
        what a controller sets DENIED when a tier has fewer links than its field can name (the
        API's example: T0 has 180 links in 8 bits, so 180..255 are denied)."""
        if not _is_int(field_index) or not 0 <= field_index < len(self.fields):
            raise ValueError(f"deny: field {field_index!r} outside 0..{len(self.fields) - 1}")
        if not (_is_int(lo) and _is_int(hi)) or lo > hi:
            raise ValueError(f"deny: range {lo!r}..{hi!r} is empty or not integers")
        if self.ev_count > DENY_LIMIT:
            # Listing walks the whole array; past this, bounding the field's max_val says
            # the same without a list.
            raise ValueError(
                f"deny: {self.ev_count} EVs are too many to list (at most {DENY_LIMIT}); "
                "bound the field with min_val/max_val instead"
            )
        return frozenset(
            i
            for i, ev in enumerate(self.expanded_evs())
            if lo <= self.fmt.split(ev)[field_index] <= hi
        )


# ---- where the bits go ---------------------------------------------------------------------


@dataclass(frozen=True)
class WireEv:
    """The header values that carry one expanded EV; None where the format puts nothing."""

    flow_label: int | None = None  # the full 20-bit IPv6 flow label
    udp_sport: int | None = None
    ipv6_da: bytes | None = None
    srh_segment: bytes | None = None


def _aligned(fmt: EvFormatProfile, expanded: int) -> int:
    """The expanded EV left-aligned in its format's space: the API stores EVs from the first
    bit of the value, and bits a format profile does not define are zero."""
    _check_range("expanded EV", expanded, fmt.bits)
    return expanded << (fmt.fmt.spec.max_bits - fmt.bits)


def _reached(fmt: EvFormatProfile) -> Iterator[tuple[Carrier, int]]:
    """(carrier, its lowest bit in the format's space) for each carrier the format profile's
    bits reach; the others carry nothing of the EV."""
    spec = fmt.fmt.spec
    floor = spec.max_bits - fmt.bits  # the defined bits are the ones at and above this
    left = spec.max_bits
    for c in spec.carriers:
        left -= c.bits
        if left + c.bits > floor:
            yield c, left


def to_wire(fmt: EvFormatProfile, expanded: int) -> WireEv:
    """The flow label and source port (STEV, UDP) or destination address and SRH segment
    (SRv6) that carry `expanded`. Carriers take the format's bits in order, most significant
    first (`EvFormat.spec.carriers`); a carrier the format profile's bits do not reach is
    None (a 16-bit STEV leaves the source port to the socket)."""
    value = _aligned(fmt, expanded)
    parts = {c.name: value >> low & ((1 << c.bits) - 1) for c, low in _reached(fmt)}
    da = parts.get("ipv6_da")
    seg = parts.get("srh_segment")
    return WireEv(
        flow_label=parts.get("flow_label"),
        udp_sport=parts.get("udp_sport"),
        ipv6_da=None if da is None else da.to_bytes(16, "big"),
        srh_segment=None if seg is None else seg.to_bytes(16, "big"),
    )


def from_wire(fmt: EvFormatProfile, flow_label: int | None, udp_sport: int | None) -> int:
    """The expanded EV a received packet carried, from its flow label and source port.

    Only the bits the format profile defines are read: an STEV of 16 bits or fewer leaves the
    source port to the sender's socket, and the flow label's top 4 bits are not the EV's. An
    SRv6 EV has no inverse here: the path consumes the destination address hop by hop.
    """
    if fmt.fmt in (EvFormat.SRV6, EvFormat.SRV6_SRH):
        raise ValueError(
            f"{fmt.fmt.name}: the EV rides in the destination address, which the path "
            "consumes; it cannot be read back from a received packet"
        )
    if flow_label is not None:
        _check_range("flow label", flow_label, FLOW_LABEL_BITS)
    if udp_sport is not None:
        _check_range("UDP source port", udp_sport, UDP_PORT_BITS)
    value = 0
    for c, low in _reached(fmt):
        got = flow_label if c.name == "flow_label" else udp_sport
        if got is None:
            raise ValueError(f"{fmt.fmt.name}: the EV needs the {c.where}, none given")
        value |= (got & ((1 << c.bits) - 1)) << low
    return value >> (fmt.fmt.spec.max_bits - fmt.bits)


def _check_bits(bits: int) -> None:
    if not _is_int(bits) or not 0 <= bits <= API_EV_BYTES * 8:
        raise ValueError(f"EV width {bits!r} outside 0..{API_EV_BYTES * 8} bits")


def to_api_bytes(bits: int, value: int) -> bytes:
    """A value of `bits` bits as the API stores an EV (`mrc_ctl_ev_t`): from the first bit
    of 32 bytes, zero-filled after. Works for compact EVs (bits = ev_bits) and expanded
    ones (bits = the format profile's width)."""
    _check_bits(bits)
    _check_range("EV", value, bits)
    return (value << (API_EV_BYTES * 8 - bits)).to_bytes(API_EV_BYTES, "big")


def from_api_bytes(bits: int, raw: bytes | bytearray | memoryview) -> int:
    """The inverse of `to_api_bytes`; bits past `bits` must be zero (the API's example checks
    the same of every EV it expands)."""
    _check_bits(bits)
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise ValueError(f"EV value {raw!r} is not bytes")
    data = bytes(raw)
    if len(data) != API_EV_BYTES:
        raise ValueError(f"EV value has {len(data)} bytes, the API's has {API_EV_BYTES}")
    whole = int.from_bytes(data, "big")
    spare = API_EV_BYTES * 8 - bits
    if whole & ((1 << spare) - 1):
        raise ValueError(f"EV value has bits set past its {bits} bits")
    return whole >> spare

"""EV formats, profiles and expansion (docs/DESIGN.md §4), told with the OCP MRC API's examples.

The profiles below are the ones of the API's generated-EV walkthrough (STEV tiers 8+4+4, an SRv6
locator with four uSIDs, SRv6 with an SRH segment) and of its EV expansion sample program; the
expected values are worked out by hand from the expansion rule, not read back from the code.
"""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrc.core.paths.evformat import (
    API_EV_BYTES,
    EvField,
    EvFormat,
    EvFormatProfile,
    EvMode,
    EvProfile,
    WireEv,
    from_api_bytes,
    from_wire,
    to_api_bytes,
    to_wire,
)

GEN, EXP = EvMode.GEN, EvMode.EXP


def addr(raw: bytes | None) -> str:
    assert raw is not None
    return str(ipaddress.IPv6Address(raw))


def full(width: int) -> EvField:
    """A field whose every bit comes from the EV, unbounded (as the examples' EXP fields)."""
    return EvField(width, mask=(1 << width) - 1)


# ---- the formats ---------------------------------------------------------------------------


def test_each_format_has_the_api_mode_code_size_and_carriers_the_header_gives() -> None:
    spec = {f: (f.spec.api_mode, f.spec.max_bits) for f in EvFormat}
    assert spec == {
        EvFormat.STEV: (1, 32),
        EvFormat.SRV6: (2, 128),
        EvFormat.SRV6_SRH: (2, 256),
        EvFormat.UDP: (4, 16),
    }
    carriers = {f: [(c.name, c.bits) for c in f.spec.carriers] for f in EvFormat}
    assert carriers == {
        EvFormat.STEV: [("flow_label", 16), ("udp_sport", 16)],
        EvFormat.UDP: [("udp_sport", 16)],
        EvFormat.SRV6: [("ipv6_da", 128)],
        EvFormat.SRV6_SRH: [("ipv6_da", 128), ("srh_segment", 128)],
    }
    # Every format's carriers hold exactly its size, and the EV value of the API holds the
    # biggest (32 bytes: address and segment).
    assert all(sum(c.bits for c in f.spec.carriers) == f.spec.max_bits for f in EvFormat)
    assert EvFormat.SRV6_SRH.spec.max_bits == API_EV_BYTES * 8
    assert (EvMode.EXP.value, EvMode.GEN.value) == (2, 4)


# ---- STEV: the three-tier example --------------------------------------------------------

STEV_TIERS = EvFormatProfile(EvFormat.STEV, (8, 4, 4))
TIERS = EvProfile(
    STEV_TIERS,
    GEN,
    (EvField(8, 0, 0, 255, 0xFF), EvField(4, 0, 0, 15, 0x0F), EvField(4, 0, 0, 15, 0x0F)),
)


def test_stev_tiers_8_4_4_generate_65536_evs_and_the_controller_denies_t0_180_to_255() -> None:
    # T0 has 180 links in 8 bits, T1 and T2 16 each: (255+1) * (15+1) * (15+1) EVs.
    assert TIERS.ev_count == 65_536 and TIERS.ev_bits == 16 and STEV_TIERS.bits == 16
    # Every bit generated, init 0: the EV at index i is i, T0 in its top byte.
    assert TIERS.expanded(0) == 0 and TIERS.expanded(65_535) == 0xFFFF
    assert TIERS.expanded(0xB437) == 0xB437
    assert STEV_TIERS.split(0xB437) == (180, 3, 7)
    # The example reads the first 4 bytes of the API's value as a little-endian word and
    # tests its low byte: that byte is T0.
    raw = to_api_bytes(STEV_TIERS.bits, 0xB437)
    assert raw == bytes([0xB4, 0x37]) + bytes(30)
    assert int.from_bytes(raw[:4], "little") & 0xFF == 180
    denied = TIERS.denied(0, 180, 255)
    assert len(denied) == 76 * 16 * 16 == 19_456
    assert denied == frozenset(range(180 * 256, 65_536))
    assert TIERS.ev_count - len(denied) == 180 * 16 * 16 == 46_080
    # Denying a T2 value cuts one EV out of every 16.
    assert sorted(TIERS.denied(2, 15, 15))[:3] == [15, 31, 47]


def test_a_16_bit_stev_rides_in_the_flow_label_and_leaves_the_source_port_to_the_socket() -> None:
    assert to_wire(STEV_TIERS, 0xB437) == WireEv(flow_label=0xB437)
    # On receipt the source port is not read, whatever port the sender's socket had.
    assert from_wire(STEV_TIERS, 0xB437, None) == 0xB437
    assert from_wire(STEV_TIERS, 0xB437, 49_152) == 0xB437
    # The flow label's top 4 bits are not part of the EV.
    assert from_wire(STEV_TIERS, 0xF_B437, None) == 0xB437
    assert TIERS.index_of(from_wire(STEV_TIERS, 0xB437, None)) == 0xB437


def test_bounding_t0_at_179_generates_only_the_usable_evs() -> None:
    tiers = EvProfile(
        STEV_TIERS,
        GEN,
        (EvField(8, 0, 0, 179, 0xFF), EvField(4, 0, 0, 15, 0x0F), EvField(4, 0, 0, 15, 0x0F)),
    )
    assert tiers.ev_count == 46_080
    assert tiers.expanded(46_079) == 0xB3FF  # T0 179, T1 15, T2 15
    # T0 180 is outside [min_val, max_val]: no EV of this profile, though it expands.
    assert tiers.collapse(0xB437) == 0xB437
    assert tiers.index_of(0xB437) is None
    assert tiers.index_of(0xB3FF) == 46_079


# ---- STEV: the expansion sample program's cases ------------------------------------------

STEV_16_16 = EvFormatProfile(EvFormat.STEV, (16, 16))


def test_fixed_upper_bytes_and_four_generated_bits_per_field() -> None:
    # Each 16-bit field: 0x0100 or 0x0200 fixed above, 4 generated bits in 1..15 below.
    prof = EvProfile(
        STEV_16_16, GEN, (EvField(16, 0x100, 1, 0xF, 0x000F), EvField(16, 0x200, 1, 0xF, 0x000F))
    )
    assert prof.ev_bits == 8 and prof.ev_count == 15 * 15
    assert prof.compact(0) == 0x11 and prof.compact(224) == 0xFF
    assert prof.expand(0x35) == 0x0103_0205
    assert to_wire(STEV_16_16, 0x0103_0205) == WireEv(flow_label=0x0103, udp_sport=0x0205)
    assert from_wire(STEV_16_16, 0x0103, 0x0205) == 0x0103_0205
    assert prof.generated_values(0x35) == (3, 5)
    assert prof.index_of(0x0103_0205) == (3 - 1) * 15 + (5 - 1) == 34
    assert prof.compact(34) == 0x35
    # A generated value of 0 is below min_val 1: it collapses, but is no EV of the profile.
    assert prof.collapse(0x0100_0205) == 0x05
    assert prof.index_of(0x0100_0205) is None
    # A fixed bit that differs (0x0300 where 0x0200 is fixed) maps to no EV at all.
    assert prof.collapse(0x0103_0305) is None and prof.index_of(0x0103_0305) is None


def test_a_mask_with_gaps_takes_ev_bits_from_its_most_significant_set_bit_down() -> None:
    prof = EvProfile(
        STEV_16_16,
        GEN,
        (EvField(16, 0x1000, 1, 0xFF, 0x0F0F), EvField(16, 0x2000, 1, 0xFF, 0x0F0F)),
    )
    # 0xAB into mask 0x0F0F: A (1010) into bits 11..8, B (1011) into bits 3..0.
    assert prof.expand(0xABCD) == 0x1A0B_2C0D
    assert prof.collapse(0x1A0B_2C0D) == 0xABCD
    # A bit outside the mask that init_val leaves 0 must be 0 on the way back.
    assert prof.collapse(0x1A1B_2C0D) is None
    assert prof.ev_count == 255 * 255


def test_one_32_bit_field_splits_16_bits_to_the_flow_label_and_16_to_the_source_port() -> None:
    fmt = EvFormatProfile(EvFormat.STEV, (32,))
    prof = EvProfile(fmt, GEN, (EvField(32, 0, 0, 0xFFFF_FFFF, 0xFFFF_FFFF),))
    assert prof.ev_count == 1 << 32
    assert prof.expanded(0xDEAD_BEEF) == 0xDEAD_BEEF
    assert to_wire(fmt, 0xDEAD_BEEF) == WireEv(flow_label=0xDEAD, udp_sport=0xBEEF)
    assert from_wire(fmt, 0xDEAD, 0xBEEF) == 0xDEAD_BEEF
    assert prof.index_of(0xDEAD_BEEF) == 0xDEAD_BEEF


def test_a_24_bit_stev_uses_the_top_byte_of_the_source_port() -> None:
    fmt = EvFormatProfile(EvFormat.STEV, (16, 8))
    assert to_wire(fmt, 0xABCD_EF) == WireEv(flow_label=0xABCD, udp_sport=0xEF00)
    # The low byte of the port is not the EV's: the socket's port may fill it.
    assert from_wire(fmt, 0xABCD, 0xEF42) == 0xABCD_EF
    with pytest.raises(ValueError, match=r"^STEV: the EV needs the UDP source port, none given$"):
        from_wire(fmt, 0xABCD, None)


def test_an_explicit_profile_keeps_its_list_in_order_copies_included() -> None:
    prof = EvProfile(
        STEV_16_16, EXP, (full(16), full(16)), evs=(0x1111_2222, 0x3333_4444, 0x1111_2222)
    )
    assert prof.ev_count == 3 and prof.ev_bits == 32
    assert [prof.expanded(i) for i in range(3)] == [0x1111_2222, 0x3333_4444, 0x1111_2222]
    assert prof.index_of(0x1111_2222) == 0  # the first copy
    assert prof.index_of(0x3333_4444) == 1
    assert prof.index_of(0x5555_6666) is None  # expands fine, but not listed
    # min_val/max_val bound generated EVs only: an explicit EV may hold any value.
    assert prof.generated_values(0x3333_4444) == (0x3333, 0x4444)
    # The same fields in GEN mode generate only [min_val, max_val] = [0, 0]: one EV.
    assert EvProfile(STEV_16_16, GEN, (full(16), full(16))).ev_count == 1


# ---- UDP ---------------------------------------------------------------------------------


def test_udp_source_ports_in_the_upper_quarter_two_bits_fixed_fourteen_generated() -> None:
    fmt = EvFormatProfile(EvFormat.UDP, (16,))
    prof = EvProfile(fmt, GEN, (EvField(16, 0xC000, 0, 0x3FFF, 0x3FFF),))
    assert prof.ev_count == 16_384
    assert (prof.expanded(0), prof.expanded(16_383)) == (0xC000, 0xFFFF)
    assert to_wire(fmt, 0xC123) == WireEv(udp_sport=0xC123)
    assert from_wire(fmt, None, 0xC123) == 0xC123
    assert prof.index_of(from_wire(fmt, None, 0xC123)) == 0x123
    assert prof.index_of(from_wire(fmt, None, 0x1234)) is None  # the fixed 0b11 is missing
    with pytest.raises(ValueError, match=r"^UDP: the EV needs the UDP source port, none given$"):
        from_wire(fmt, 0x12345, None)


# ---- SRv6 --------------------------------------------------------------------------------

SRV6_96 = EvFormatProfile(EvFormat.SRV6, (32, 16, 16, 16, 16))


def test_srv6_locator_and_four_usids_tier_number_above_eight_generated_bits() -> None:
    # The walkthrough's SRv6 profile: locator 0xdeadcafe fixed; each uSID carries its tier
    # (1..4) in the upper byte and 8 generated bits in the lower.
    prof = EvProfile(
        SRV6_96,
        GEN,
        (EvField(32, 0xDEAD_CAFE), *(EvField(16, t << 8, 0, 255, 0xFF) for t in range(1, 5))),
    )
    assert SRV6_96.bits == 96 and prof.ev_bits == 32 and prof.ev_count == 1 << 32
    wire = to_wire(SRV6_96, prof.expanded(0x0A0B_0C0D))
    assert addr(wire.ipv6_da) == "dead:cafe:10a:20b:30c:40d::"
    assert (wire.flow_label, wire.udp_sport, wire.srh_segment) == (None, None, None)
    assert prof.expanded(0) == 0xDEAD_CAFE_0100_0200_0300_0400
    assert prof.index_of(0xDEAD_CAFE_010A_020B_030C_040D) == 0x0A0B_0C0D
    assert prof.index_of(0xDEAD_BEEF_010A_020B_030C_040D) is None  # another locator
    with pytest.raises(ValueError, match=r"^SRV6: the EV rides in the destination address"):
        from_wire(SRV6_96, 0, 0)


def test_four_bit_profile_fields_are_zero_filled_to_their_16_bit_usids() -> None:
    prof = EvProfile(SRV6_96, GEN, (EvField(32, 0x4242_4242),) + (EvField(4, 0, 1, 0xF, 0xF),) * 4)
    assert prof.ev_bits == 16 and prof.ev_count == 15**4
    assert addr(to_wire(SRV6_96, prof.expand(0x1234)).ipv6_da) == "4242:4242:1:2:3:4::"
    assert prof.compact(0) == 0x1111
    # A bit above a 4-bit field in its uSID cannot come from any EV.
    assert prof.collapse(0x4242_4242_0011_0002_0003_0004) is None


def test_fewer_profile_fields_than_format_fields_leave_the_last_usids_zero() -> None:
    prof = EvProfile(
        SRV6_96, EXP, (EvField(32, 0xDEAD_DEAD), full(16), full(16)), evs=(0xAAAA_BBBB,)
    )
    assert addr(to_wire(SRV6_96, prof.expanded(0)).ipv6_da) == "dead:dead:aaaa:bbbb::"
    assert prof.index_of(0xDEAD_DEAD_AAAA_BBBB_0000_0000) == 0
    assert prof.collapse(0xDEAD_DEAD_AAAA_BBBB_0001_0000) is None


def test_srv6_with_srh_224_bits_address_then_segment() -> None:
    # Address: 32-bit locator + six 16-bit uSIDs (128 bits); SRH segment: 32-bit locator + four
    # 16-bit uSIDs (96 bits). The sample program fills the segment's first two uSIDs only.
    fmt = EvFormatProfile(EvFormat.SRV6_SRH, (32,) + (16,) * 6 + (32,) + (16,) * 4)
    fields = (
        (EvField(32, 0xCAFE_CAFE),)
        + (full(16),) * 6
        + (EvField(32, 0xDECA_FBAD),)
        + (full(16),) * 2
    )
    prof = EvProfile(fmt, EXP, fields, evs=(0x0001_0002_0003_0004_0005_0006_0007_0008,))
    assert fmt.bits == 224 and prof.ev_bits == 128
    wire = to_wire(fmt, prof.expanded(0))
    assert addr(wire.ipv6_da) == "cafe:cafe:1:2:3:4:5:6"
    assert addr(wire.srh_segment) == "deca:fbad:7:8::"
    assert to_api_bytes(fmt.bits, prof.expanded(0)).hex() == (
        "cafecafe000100020003000400050006" + "decafbad00070008" + "00" * 8
    )
    assert prof.index_of(prof.expanded(0)) == 0


# ---- the API's EV value --------------------------------------------------------------------


def test_api_value_bytes_start_at_the_first_bit_and_reject_bits_past_the_width() -> None:
    assert to_api_bytes(8, 0x35) == b"\x35" + bytes(31)
    assert from_api_bytes(8, b"\x35" + bytes(31)) == 0x35
    assert from_api_bytes(0, bytes(32)) == 0
    with pytest.raises(ValueError, match=r"^EV value has bits set past its 8 bits$"):
        from_api_bytes(8, b"\x35\x01" + bytes(30))
    with pytest.raises(ValueError, match=r"^EV value has 4 bytes, the API's has 32$"):
        from_api_bytes(8, b"\x35\x00\x00\x00")
    with pytest.raises(ValueError, match=r"^EV value 'x' is not bytes$"):
        from_api_bytes(8, "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^EV 256 does not fit 8 bits$"):
        to_api_bytes(8, 256)
    with pytest.raises(ValueError, match=r"^EV width 257 outside 0..256 bits$"):
        to_api_bytes(257, 0)


def test_wire_values_out_of_range_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^flow label 1048576 does not fit 20 bits$"):
        from_wire(STEV_16_16, 1 << 20, 0)
    with pytest.raises(ValueError, match=r"^UDP source port -1 does not fit 16 bits$"):
        from_wire(STEV_16_16, 0, -1)
    with pytest.raises(ValueError, match=r"^expanded EV 65536 does not fit 16 bits$"):
        to_wire(STEV_TIERS, 1 << 16)
    with pytest.raises(ValueError, match=r"^compact EV 65536 does not fit 16 bits$"):
        TIERS.expand(1 << 16)
    with pytest.raises(ValueError, match=r"^EV index 65536 outside 0..65535$"):
        TIERS.compact(65_536)
    with pytest.raises(ValueError, match=r"^deny: field 3 outside 0..2$"):
        TIERS.denied(3, 0, 1)
    with pytest.raises(ValueError, match=r"^deny: range 5..4 is empty or not integers$"):
        TIERS.denied(0, 5, 4)
    huge = EvProfile(
        STEV_16_16, GEN, (EvField(16, 0, 0, 0xFFFF, 0xFFFF), EvField(16, 0, 0, 16, 0x1F))
    )
    assert huge.ev_count == 65_536 * 17
    with pytest.raises(ValueError, match=r"^deny: 1114112 EVs are too many to list \(at most"):
        huge.denied(0, 0, 1)


# ---- validation ----------------------------------------------------------------------------

BAD_FORMATS = [
    (EvFormat.STEV, (), "EV format profile: needs a non-empty tuple of field widths"),
    (EvFormat.STEV, (8, 0), "EV format field 1: width 0 outside 1..32 (STEV)"),
    (EvFormat.UDP, (17,), "EV format field 0: width 17 outside 1..16 (UDP)"),
    (EvFormat.STEV, (16, 16, 1), "EV format profile: fields total 33 bits, STEV holds 32"),
    (
        EvFormat.SRV6,
        (32,) + (16,) * 7,
        "EV format profile: fields total 144 bits, SRV6 holds 128 (an SRH segment needs SRV6_SRH)",
    ),
    (EvFormat.SRV6_SRH, (32,) * 4, "EV format profile: SRV6_SRH fields total 128 bits and must"),
    (
        EvFormat.SRV6_SRH,
        (120, 16, 32),
        "EV format profile: SRV6_SRH fields total 168 bits and must",
    ),
    (EvFormat.STEV, (8, True), "EV format field 1: width True outside 1..32 (STEV)"),
    ("stev", (8,), "EV format profile: format 'stev' is not an EvFormat"),
]


@pytest.mark.parametrize(("fmt", "widths", "message"), BAD_FORMATS)
def test_a_format_profile_that_does_not_fit_its_format_is_refused(
    fmt: EvFormat, widths: tuple[int, ...], message: str
) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        EvFormatProfile(fmt, widths)


BAD_FIELDS = [
    (EvField(0), "EV profile field 0: width 0 outside 1..32"),
    (EvField(33), "EV profile field 0: width 33 outside 1..32"),
    (EvField(-1), "EV profile field 0: width -1 is not a 32-bit unsigned integer"),
    (EvField(8, mask=1 << 32), "EV profile field 0: mask 4294967296 is not a 32-bit unsigned"),
    (EvField(8, init_val=0x100), "EV profile field 0: init_val 0x100 is wider than 8 bits"),
    (EvField(8, mask=0x1F0), "EV profile field 0: mask 0x1f0 has bits outside the field's 8 bits"),
    (
        EvField(8, max_val=3),
        "EV profile field 0: a fixed field (mask 0) takes min_val 0 and max_val 0",
    ),
    (
        EvField(8, min_val=1),
        "EV profile field 0: a fixed field (mask 0) takes min_val 0 and max_val 0",
    ),
    (
        EvField(8, max_val=0x10, mask=0x0F),
        "EV profile field 0: max_val 0x10 is wider than the mask's 4 set bits",
    ),
    (
        EvField(8, min_val=5, max_val=4, mask=0x0F),
        "EV profile field 0: min_val 0x5 above max_val 0x4",
    ),
    (EvField(8, init_val=1.5), "EV profile field 0: init_val 1.5 is not a 32-bit unsigned integer"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("bad", "message"), BAD_FIELDS)
def test_a_field_against_the_api_rules_is_refused_naming_it(bad: EvField, message: str) -> None:
    fmt = EvFormatProfile(EvFormat.STEV, (16,))
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        EvProfile(fmt, GEN, (bad,))


def test_profile_level_errors_name_the_problem() -> None:
    cases: list[tuple[EvFormatProfile, EvMode, tuple[EvField, ...], tuple[int, ...], str]] = [
        (STEV_TIERS, GEN, (), (), "EV profile: needs a non-empty tuple of fields"),
        (
            STEV_TIERS,
            GEN,
            (full(8), full(4), full(4), full(4)),
            (),
            "EV profile: 4 fields, its format profile has 3",
        ),
        (
            STEV_TIERS,
            GEN,
            (full(8), full(8)),
            (),
            "EV profile field 1: width 8 exceeds its format field's 4 bits",
        ),
        (STEV_TIERS, GEN, (full(8),), (1,), "EV profile: a GEN profile generates its EVs"),
        (STEV_TIERS, EXP, (full(8),), (), "EV profile: an EXP profile needs at least one EV"),
        (
            STEV_TIERS,
            EXP,
            (full(8), EvField(4, 0x3)),
            (0x12, 0x100),
            "EV profile: explicit EV 1 (256) does not fit the profile's 8 EV bits",
        ),
        (STEV_TIERS, EXP, (full(8),), (-1,), "EV profile: explicit EV 0 (-1) does not fit"),
    ]
    for fmt, mode, fields, evs, message in cases:
        with pytest.raises(ValueError, match="^" + re.escape(message)):
            EvProfile(fmt, mode, fields, evs)
    with pytest.raises(ValueError, match=r"^EV profile: mode 'gen' is not EXP or GEN$"):
        EvProfile(STEV_TIERS, "gen", (full(8),))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^EV profile field 0: 8 is not an EvField$"):
        EvProfile(STEV_TIERS, GEN, (8,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^EV profile: format \(8, 4, 4\) is not an EvFormat"):
        EvProfile((8, 4, 4), GEN, (full(8),))  # type: ignore[arg-type]


def test_a_profile_of_fixed_fields_only_has_exactly_one_ev() -> None:
    prof = EvProfile(STEV_16_16, GEN, (EvField(16, 0x1234), EvField(16, 0x5678)))
    assert (prof.ev_bits, prof.ev_count) == (0, 1)
    assert list(prof.expanded_evs()) == [0x1234_5678]
    assert prof.index_of(0x1234_5678) == 0 and prof.index_of(0x1234_5679) is None


# ---- properties ----------------------------------------------------------------------------


@st.composite
def profiles(draw: st.DrawFn) -> EvProfile:
    fmt_kind = draw(st.sampled_from([EvFormat.STEV, EvFormat.UDP, EvFormat.SRV6]))
    room = fmt_kind.spec.max_bits
    widths: list[int] = []
    for _ in range(draw(st.integers(1, 5))):
        if room == 0:
            break
        w = draw(st.integers(1, min(room, 40)))
        widths.append(w)
        room -= w
    fmt = EvFormatProfile(fmt_kind, tuple(widths))
    fields: list[EvField] = []
    for fw in widths[: draw(st.integers(1, len(widths)))]:
        width = draw(st.integers(1, min(fw, 32)))
        mask = draw(st.integers(0, (1 << width) - 1))
        init = draw(st.integers(0, (1 << width) - 1))
        if mask:
            hi = draw(st.integers(0, (1 << mask.bit_count()) - 1))
            lo = draw(st.integers(0, hi))
            fields.append(EvField(width, init, lo, hi, mask))
        else:
            fields.append(EvField(width, init))
    return EvProfile(fmt, GEN, tuple(fields))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_expansion_is_injective_and_every_field_stays_within_its_mask(data: st.DataObject) -> None:
    prof = data.draw(profiles())
    i = data.draw(st.integers(0, prof.ev_count - 1))
    j = data.draw(st.integers(0, prof.ev_count - 1))
    a, b = prof.expanded(i), prof.expanded(j)
    assert (a == b) == (i == j)
    assert prof.index_of(a) == i and prof.index_of(b) == j
    compact = prof.collapse(a)
    assert compact is not None and prof.expand(compact) == a
    for ev in (a, b):
        parts = prof.fmt.split(ev)
        for f, value in zip(prof.fields, parts, strict=False):
            assert value < 1 << f.width
            assert (value ^ f.init_val) & ~f.mask == 0
        assert not any(parts[len(prof.fields) :])
        if prof.fmt.fmt is not EvFormat.SRV6:
            wire = to_wire(prof.fmt, ev)
            assert from_wire(prof.fmt, wire.flow_label, wire.udp_sport) == ev
        assert from_api_bytes(prof.fmt.bits, to_api_bytes(prof.fmt.bits, ev)) == ev
    for value, f in zip(prof.generated_values(prof.compact(i)), prof.fields, strict=True):
        assert f.min_val <= value <= f.max_val


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_collapse_inverts_expand_for_every_compact_ev(data: st.DataObject) -> None:
    prof = data.draw(profiles())
    compact = data.draw(st.integers(0, (1 << prof.ev_bits) - 1))
    assert prof.collapse(prof.expand(compact)) == compact

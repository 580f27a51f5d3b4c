"""Cross-check our BTH with scapy's RoCE dissector (`scapy.contrib.roce.BTH`).

Scapy's layout is the InfiniBand one: it knows opcode, SE, M, PadCnt, TVer, P_Key, F/B, DestQP,
the A bit and the PSN, and lumps our EVX bit into its reserved `resv6` and our R/RTX/TS bits into
its reserved `resv7` (docs/WIRE.md §2).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_roundtrip import PACKETS, bths

from mrc.wire import AETH, BTH, AckPacket, Opcode, decode_packet

roce = pytest.importorskip("scapy.contrib.roce")
ScapyBTH: Any = roce.BTH


def check(bth: BTH, pkt: Any) -> None:
    assert pkt.opcode == bth.opcode
    assert pkt.solicited == bth.se
    assert pkt.migreq == bth.m
    assert pkt.padcount == bth.pad_cnt
    assert pkt.version == 0
    assert pkt.pkey == bth.p_key
    assert pkt.fecn == bth.fecn
    assert pkt.becn == bth.becn
    assert pkt.resv6 & 1 == bth.evx
    assert pkt.dqpn == bth.dest_qp
    assert pkt.ackreq == bth.a
    assert pkt.resv7 == (bth.r << 6) | (bth.rtx << 5) | (bth.ts << 4)
    assert pkt.psn == bth.psn


@given(bths)
def test_scapy_reads_our_bth(bth: BTH) -> None:
    # scapy's BTH ends with a 4-byte ICRC taken from the end of the packet: give it one.
    check(bth, ScapyBTH(bth.encode() + b"\x00" * 4))


@given(PACKETS)
def test_scapy_reads_the_bth_of_every_packet(packet: Any) -> None:
    wire = packet.encode()
    check(BTH.decode(wire), ScapyBTH(wire))


@given(
    st.sampled_from(Opcode),
    st.integers(0, 0xFFFFFF),
    st.integers(0, 0xFFFFFF),
    st.integers(0, 0xFFFF),
    st.booleans(),
)
def test_we_read_scapy_built_bth(opcode: Opcode, qp: int, psn: int, pkey: int, a: bool) -> None:
    wire = bytes(ScapyBTH(opcode=int(opcode), dqpn=qp, psn=psn, pkey=pkey, ackreq=int(a)))
    bth = BTH.decode(wire)
    assert (bth.opcode, bth.dest_qp, bth.psn, bth.p_key, bth.a) == (opcode, qp, psn, pkey, a)


def test_known_ack() -> None:
    wire = AckPacket(dest_qp=0x20, psn=5, ev=7, aeth=AETH(0, 1)).encode()
    pkt = ScapyBTH(wire)
    assert (pkt.opcode, pkt.dqpn, pkt.psn) == (0xD1, 0x20, 5)
    assert isinstance(decode_packet(wire), AckPacket)

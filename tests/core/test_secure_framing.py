"""The secured framer's kept buffer (mrc/core/sendpath.py): a batch framed after a longer one
carries exactly its own bytes, every packet of both opens to its own plaintext, and a batch
bigger than the buffer (more than one GSO call, outside the flowcell rules) grows it without
losing what was already framed."""

from __future__ import annotations

from collections import Counter

import pytest

from mrc.core.aead import TRAILER, PacketProtection
from mrc.core.config import SessionConfig
from mrc.core.records import new_message
from mrc.core.sendpath import HEADER, HEADER_IMM, Framer
from mrc.core.stats import SessionStats
from mrc.wire.packet import DataPacket, decode_packet

MTU = 4096


def _ends(encrypt: bool, mtu: int) -> tuple[PacketProtection, PacketProtection, Counter[str]]:
    s0, s1 = bytes(range(32)), bytes(range(32, 64))
    drops: Counter[str] = Counter()

    def end(direction: int, tx: bytes, rx: bytes, drops: Counter[str]) -> PacketProtection:
        return PacketProtection(
            direction=direction, tx_secret=tx, rx_secret=rx, encrypt=encrypt, rekey_shift=23,
            replay_width=512, max_payload=mtu, drops=drops,
        )  # fmt: skip

    return end(0, s0, s1, Counter()), end(1, s1, s0, drops), drops


def _split(data: bytes, segment: int | None) -> list[bytes]:
    size = segment or len(data)
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_short_batch_after_a_full_one_carries_only_its_own_bytes(encrypt: bool) -> None:
    tx, rx, drops = _ends(encrypt, MTU)
    framer = Framer(SessionConfig(), stats=SessionStats(), peer_addrs={0: "peer"})
    framer.protection = tx
    big = memoryview(bytes(range(251)) * 70)[: 4 * MTU]  # 4 packets
    small = memoryview(b"\x5a" * 100)  # one ONLY with ImmDt
    a = new_message(1, big, 0x1000, 7, None, MTU)
    b = new_message(2, small, 0x9000, 7, 0xABCD, MTU)
    first = framer.frame([(a, 0, 3)], 3, 10, ev=3, now=1.0, dest_qp=5, rqmsn=0)
    second = framer.frame([(b, 0, 1)], 1, 13, ev=3, now=1.0, dest_qp=5, rqmsn=0)
    full = HEADER + MTU + TRAILER
    assert (len(first.data), first.segment_size) == (3 * full, full)
    assert (len(second.data), second.segment_size) == (HEADER_IMM + 100 + TRAILER, None)
    payloads = [bytes(big[i * MTU : (i + 1) * MTU]) for i in range(3)] + [bytes(small)]
    packets = [*_split(first.data, first.segment_size), second.data]
    for raw, payload in zip(packets, payloads, strict=True):
        header = HEADER_IMM if raw is second.data else HEADER
        assert (raw[header : header + len(payload)] == payload) is not encrypt
        opened = rx.open(raw, header)
        assert opened is not None
        pkt = decode_packet(bytes(opened))
        assert isinstance(pkt, DataPacket) and bytes(pkt.payload) == payload
    assert drops == Counter() and tx.tx_counter == 4


def test_a_batch_bigger_than_the_buffer_grows_it() -> None:
    mtu = 8192
    tx, rx, drops = _ends(True, mtu)
    framer = Framer(
        SessionConfig(payload_mtu=mtu), stats=SessionStats(), peer_addrs={0: "peer"}
    )
    framer.protection = tx
    src = memoryview(bytes(range(256)) * 256)  # 8 packets
    msg = new_message(1, src, 0, 7, None, mtu)
    # Seven full packets (57,792 bytes) fit the 65,507-byte first buffer; the eighth grows it.
    out = framer.frame([(msg, 0, 8)], 8, 0, ev=3, now=0.0, dest_qp=5, rqmsn=0)
    assert len(out.data) == 8 * (HEADER + mtu + TRAILER) > 65507
    for i, raw in enumerate(_split(out.data, out.segment_size)):
        opened = rx.open(raw, HEADER)
        assert opened is not None and bytes(opened[HEADER:]) == bytes(src[i * mtu : (i + 1) * mtu])
    assert drops == Counter()

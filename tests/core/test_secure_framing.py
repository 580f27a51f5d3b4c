"""The secured framer's kept buffer (mrc/core/send/framing.py): a batch framed after a longer one
carries exactly its own bytes, every packet of both opens to its own plaintext, a batch
bigger than the buffer (more than one GSO call, outside the flowcell rules) grows it without
losing what was already framed, and a flowcell with late packets leaves as two batches."""

from __future__ import annotations

from collections import Counter

import pytest

from mrc.core.config import SessionConfig
from mrc.core.secure.aead import TRAILER, PacketProtection
from mrc.core.send.framing import HEADER, HEADER_IMM, Framer
from mrc.core.send.records import new_message
from mrc.core.stats import SessionStats
from mrc.core.transmit import Transmit
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
    framer = Framer(SessionConfig(), stats=SessionStats(), peer_addrs={0: "peer"}, protection=tx)
    big = memoryview(bytes(range(251)) * 70)[: 4 * MTU]  # 4 packets
    small = memoryview(b"\x5a" * 100)  # one ONLY with ImmDt
    a = new_message(1, big, 0x1000, 7, None, MTU)
    b = new_message(2, small, 0x9000, 7, 0xABCD, MTU)
    out: list[Transmit] = []
    framer.frame(out, [(a, 0, 3)], 3, 10, ev=3, now=1.0, dest_qp=5, rqmsn=0)
    framer.frame(out, [(b, 0, 1)], 1, 13, ev=3, now=1.0, dest_qp=5, rqmsn=0)
    first, second = out
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
        SessionConfig(payload_mtu=mtu), stats=SessionStats(), peer_addrs={0: "peer"}, protection=tx
    )
    src = memoryview(bytes(range(256)) * 256)  # 8 packets
    msg = new_message(1, src, 0, 7, None, mtu)
    # Seven full packets (57,792 bytes) fit the 65,507-byte first buffer; the eighth grows it.
    out: list[Transmit] = []
    framer.frame(out, [(msg, 0, 8)], 8, 0, ev=3, now=0.0, dest_qp=5, rqmsn=0)
    (batch,) = out
    assert len(batch.data) == 8 * (HEADER + mtu + TRAILER) > 65507
    for i, raw in enumerate(_split(batch.data, batch.segment_size)):
        opened = rx.open(raw, HEADER)
        assert opened is not None and bytes(opened[HEADER:]) == bytes(src[i * mtu : (i + 1) * mtu])
    assert drops == Counter()


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_flowcell_with_late_packets_is_sealed_as_two_batches(encrypt: bool) -> None:
    tx, rx, drops = _ends(encrypt, MTU)
    framer = Framer(SessionConfig(), stats=SessionStats(), peer_addrs={0: "peer"}, protection=tx)
    src = memoryview(bytes(range(253)) * 100)[: 4 * MTU]
    # Two WRITE_WITH_IMMs of 2 packets: F L F L, the full LAST_IMMs late (bits 1 and 3).
    a = new_message(1, src[: 2 * MTU], 0x1000, 7, 11, MTU)
    b = new_message(2, src[2 * MTU :], 0x9000, 7, 12, MTU)
    out: list[Transmit] = []
    cell = [(a, 0, 2), (b, 0, 2)]
    framer.frame(out, cell, 4, 20, ev=3, now=1.0, dest_qp=5, rqmsn=0, late=0b1010)
    full = HEADER + MTU + TRAILER
    assert [(len(t.data), t.segment_size, t.ev) for t in out] == [
        (2 * full, full, 3), (2 * (full + 4), full + 4, 3)
    ]  # fmt: skip
    opened = []
    for t in out:
        for raw in _split(t.data, t.segment_size):
            plain = rx.open(raw, len(raw) - MTU - TRAILER)
            assert plain is not None
            pkt = decode_packet(bytes(plain))
            assert isinstance(pkt, DataPacket)
            opened.append((pkt.psn, pkt.imm, bytes(pkt.payload)))
    pages = [bytes(src[i * MTU : (i + 1) * MTU]) for i in range(4)]
    assert opened == [
        (20, None, pages[0]), (22, None, pages[2]), (21, 11, pages[1]), (23, 12, pages[3])
    ]  # fmt: skip
    assert drops == Counter() and tx.tx_counter == 4 and framer.stats.plane(0).packets_sent == 4

"""One acknowledgement datagram per small message (docs/DESIGN.md §6), as stories in the
simulator with explicit time: a responder that holds nothing past cack_psn answers a batch
whose messages carried the A bit with their cumulative ACK alone, whose BTH.PSN acknowledges
what the block SACK would have; the requester takes from that ACK what the SACK brought (the
PSNs, the delay sample, the congestion window's acknowledged bytes). Where the ACK does not
cover everything (a hole, so packets are held past cack_psn; no A bit) the SACKs still go.
"""

from __future__ import annotations

from typing import Any

import pytest

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished, ImmediateReceived, WriteCompleted
from mrc.core.send.ackpath import take_ack
from mrc.core.session import Session
from mrc.sim import Host, LinkParams, Network
from mrc.wire.bth import Opcode
from mrc.wire.packet import AckPacket, decode_packet

#: 1 Gbit/s and 10 µs each way: a datagram of n bytes takes n × 8 ns on the wire.
LINK = LinkParams(rate_bps=1e9, latency=10e-6)
T0 = 0.001


class Story:
    """`a` writes into `b`'s 4 KiB region over one plane; handshake done at T0."""

    def __init__(self, cfg: SessionConfig | None = None) -> None:
        self.net = Network(seed=5)
        self.a, self.b = self.net.pair(1, LINK)
        self.dst = bytearray(4096)
        self.region = self.b.regions.register(self.dst)
        self.src = self.a.regions.register(bytearray(b"p" * 4096))
        cfg = cfg or SessionConfig(plane_mask=0b1, payload_mtu=1024, initial_psn=1000)
        self.b.listen(cfg, accept=lambda _: b"")
        self.sa: Session = self.a.connect(self.b, cfg)
        self.net.drive(T0)
        assert self.a.events_of(ConnectionEstablished)
        self.sb: Session = self.b.session()
        #: (time, opcode) of every datagram `a` and `b` receive from here on.
        self.to_a: list[tuple[float, Opcode]] = []
        self.to_b: list[tuple[float, Opcode]] = []
        self.a.on_receive = self._seen(self.to_a)
        self.b.on_receive = self._seen(self.to_b)

    def _seen(self, into: list[tuple[float, Opcode]]) -> Any:
        def hook(host: Host, plane: int, batch: list[tuple[bytes, object, int]]) -> None:
            into.extend((self.net.now, Opcode(bytes(d)[0])) for d, _, _ in batch)

        return hook

    def write(self, length: int, *, imm: int | None = None) -> int:
        msn = self.sa.post_write(self.src, 0, length, self.region.base_va, self.region.rkey, imm)
        self.a.flush(self.sa)
        return msn


def test_a_small_write_is_answered_by_its_ack_alone() -> None:
    s = Story()
    cwnd = s.sa.cc.window
    # t = 1 ms: one 64-byte WRITE_WITH_IMM: 44 bytes of headers + 64 = 108 bytes, 864 ns on
    # the wire, then 10 µs.
    msn = s.write(64, imm=9)
    s.net.drive(T0 + 0.001)
    arrive = T0 + 108 * 8e-9 + 10e-6
    assert s.to_b == [(pytest.approx(arrive), Opcode.WRITE_ONLY_IMM)]
    assert s.b.events_of(ImmediateReceived)[0].imm == 9
    # The responder answers with one datagram, the ACKNOWLEDGE (20 bytes: 160 ns, then 10
    # µs); no RELIABILITY_SACK for the block, which the ACK's BTH.PSN (1001) covers.
    back = arrive + 20 * 8e-9 + 10e-6
    assert s.to_a == [(pytest.approx(back), Opcode.ACKNOWLEDGE)]
    assert s.a.events_of(WriteCompleted) == [WriteCompleted(msn=msn, status=0)]
    # The ACK did the SACK's work on the requester: the PSN is acknowledged, the plane has
    # its RTT sample (the round trip, 21.024 µs), congestion control counted the bytes.
    sender = s.sa.sender
    assert sender is not None and sender.una == 1001 and sender.idle
    assert s.sa.stats.bytes_acked == 64
    assert s.sa.paths.planes[0].rtt.srtt == pytest.approx(back - T0)
    assert s.sa.cc.window >= cwnd
    # Nothing is left to ask for: no completion probe, no resend, no late SACK (the
    # endpoint probes of path upkeep go on regardless).
    s.net.drive(T0 + 0.5)
    data_or_acks = {Opcode.WRITE_ONLY_IMM, Opcode.ACKNOWLEDGE, Opcode.RELIABILITY_SACK}
    assert [op for _, op in s.to_a + s.to_b if op in data_or_acks] == [
        Opcode.ACKNOWLEDGE, Opcode.WRITE_ONLY_IMM]
    assert s.sa.stats.retransmits_by_cause.total() == 0


def test_a_batch_of_small_writes_gets_one_datagram_back() -> None:
    s = Story()
    # t = 1 ms: eight 512-byte WRITEs posted at once leave back to back (one flowcell).
    for _ in range(8):
        s.write(512)
    s.net.drive(T0 + 0.001)
    assert [op for _, op in s.to_b] == [Opcode.WRITE_ONLY] * 8
    # b reads each arrival as it comes (they are 4.4 µs apart on the wire): one ACK each,
    # and never a SACK, since each ACK's cack_psn covers every PSN that came.
    assert [op for _, op in s.to_a] == [Opcode.ACKNOWLEDGE] * 8
    assert [e.msn for e in s.a.events_of(WriteCompleted)] == list(range(8))
    assert s.sa.stats.bytes_acked == 8 * 512


def test_a_hole_keeps_the_sacks() -> None:
    # t = 1 ms: two 100-byte WRITEs (140-byte datagrams, 1.12 µs on the wire); the first is
    # lost, so the second is held past cack_psn when it arrives at 1.01112 ms.
    lost: list[bytes] = []

    def drop_first(data: bytes) -> bool:
        if data[0] == Opcode.WRITE_ONLY and not lost:
            lost.append(data)
            return True
        return False

    s = Story()
    for link in s.net.links():
        if link.plane == 0 and link.src is s.a:
            link.params = LinkParams(rate_bps=1e9, latency=10e-6, drop_if=drop_first)
    s.write(100)
    s.write(100)
    s.net.drive(T0 + 0.007)
    # Its block's SACK goes (56 bytes: 448 ns, then 10 µs): its bitmap says what the ACK
    # could not, and no ACK is due (msn 0 is not complete).
    # The RTO (5 ms, the minimum) resends PSN 1000 at 6 ms; it arrives at 6.01112 ms, fills
    # the hole, and the pull ends with the ACK of both messages alone (cack_psn 1002).
    assert s.to_b == [(pytest.approx(0.00101112), Opcode.WRITE_ONLY),
                      (pytest.approx(0.00601112), Opcode.WRITE_ONLY)]
    assert s.to_a == [(pytest.approx(0.001021568), Opcode.RELIABILITY_SACK),
                      (pytest.approx(0.00602128), Opcode.ACKNOWLEDGE)]
    assert [e.msn for e in s.a.events_of(WriteCompleted)] == [0, 1]
    assert s.sa.stats.retransmits_by_cause["rto"] == 1


def test_the_ack_is_the_records_bytes_and_odd_ones_go_to_the_decoder() -> None:
    s = Story()
    raws: list[bytes] = []
    s.a.on_receive = lambda host, plane, batch: raws.extend(bytes(d) for d, _, _ in batch)
    msn = s.write(64)
    s.net.drive(T0 + 0.001)
    (raw,) = raws
    # replies.py packs it in one call: the same bytes as the records'.
    pkt = decode_packet(raw)
    assert isinstance(pkt, AckPacket) and pkt.encode() == raw
    assert (pkt.psn, pkt.aeth.msn, pkt.aeth.syndrome) == (1001, msn, 0x1F)
    # The byte path (ackpath.py) takes only what the strict decoder would: a TVer, an MSN
    # over 16 bits or another P_Key is the decoder's, and dropped by its rules.
    drops = s.sa.stats.drops_by_reason
    now = s.net.now
    s.sa.receive_datagrams(0, [(raw[:1] + b"\x01" + raw[2:], 0)], now)
    s.sa.receive_datagrams(0, [(raw[:16] + b"\x1f\x01" + raw[18:], 0)], now)
    s.sa.receive_datagrams(0, [(raw[:2] + b"\x12\x34" + raw[4:], 0)], now)
    assert (drops["decode_tver"], drops["decode_msn"], drops["p_key"]) == (1, 1, 1)
    sender = s.sa.sender
    assert sender is not None
    p_key = s.sa.config.p_key
    odd = [
        raw[:1] + b"\x01" + raw[2:],  # TVer 1
        raw[:16] + b"\x1f\x01" + raw[18:],  # MSN 0x010000
        raw[:2] + b"\x12\x34" + raw[4:],  # another P_Key
        raw + b"\x00",  # a byte too many
        bytes([Opcode.RELIABILITY_NACK]) + raw[1:],  # another opcode
    ]
    assert [take_ack(x, p_key, sender, now) for x in odd] == [False] * 5
    # The same ACK again is an overtaken one: taken from its bytes, and no harm done.
    assert take_ack(raw, p_key, sender, now)
    s.sa.receive_datagrams(0, [(raw, 0)], now)
    assert drops["stale_aeth"] == 0  # its message completed: an overtaken ACK, no harm
    assert s.a.events_of(WriteCompleted) == [WriteCompleted(msn=msn, status=0)]

"""The responder's checks (docs/DESIGN.md §6), driven with crafted datagrams after a real handshake.

Each story injects packets straight into the responder's endpoint at an explicit `now` and
checks what was written (nothing, unless every check passed), what was counted, and what the
responder answered.
"""

from __future__ import annotations

import struct

import pytest

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished, ImmediateReceived, WriteCompleted
from mrc.core.paths.evs import make_ev
from mrc.core.session import Session
from mrc.sim import Host, LinkParams, Network
from mrc.wire.ack import NackReason, Syndrome
from mrc.wire.bth import Opcode
from mrc.wire.errors import DecodeError
from mrc.wire.packet import (
    AckPacket,
    DataPacket,
    EndpointPacket,
    NackPacket,
    ProbePacket,
    SackPacket,
    decode_packet,
)
from mrc.wire.probe import EETH, ERTH, PETH, EndpointOp

REPLY = struct.Struct(">QI")
MTU = 1024


class Pair:
    """`a` writes into `b`'s 64 KiB region; the handshake is done at t = 0.001."""

    def __init__(self) -> None:
        self.net = Network(seed=3)
        self.a, self.b = self.net.pair(2, LinkParams(latency=10e-6))
        self.dst = bytearray(64 * 1024)
        self.region = self.b.regions.register(self.dst)
        cfg = SessionConfig(plane_mask=0b11, payload_mtu=MTU, initial_psn=1000)
        self.b.listen(cfg, accept=lambda _: REPLY.pack(self.region.base_va, self.region.rkey))
        self.sa: Session = self.a.connect(self.b, cfg)
        self.net.drive(0.001)
        self.sb: Session = self.b.session()
        assert self.a.events_of(ConnectionEstablished)

    def packet(
        self,
        psn: int,
        payload: bytes,
        *,
        opcode: Opcode = Opcode.WRITE_ONLY,
        va_offset: int = 0,
        rkey: int | None = None,
        dma_length: int | None = None,
        msn: int = 0,
        a: bool = True,
        tx_timestamp: int | None = 1234,
        rqmsn: int = 0,
    ) -> bytes:
        return DataPacket(
            opcode=opcode,
            dest_qp=self.sb.qpn,
            psn=psn,
            ev=7,
            a=a,
            rtx=False,
            rqmsn=rqmsn,
            msn=msn,
            tx_timestamp=tx_timestamp,
            va=self.region.base_va + va_offset,
            rkey=self.region.rkey if rkey is None else rkey,
            dma_length=len(payload) if dma_length is None else dma_length,
            imm=None,
            payload=payload,
        ).encode()

    def inject(self, *datagrams: bytes, tos: int = 2) -> list[object]:
        """Deliver to b at the current time; return b's answers, decoded."""
        sessions = self.b.endpoint.receive_datagrams(
            0, [(d, "a", tos) for d in datagrams], self.net.now
        )
        out: list[object] = []
        for s in sessions:
            out += [decode_packet(t.data) for t in s.datagrams_to_send(self.net.now)]
        return out


@pytest.fixture
def pair() -> Pair:
    return Pair()


def nacks(answers: list[object]) -> list[tuple[NackReason, int]]:
    return [(p.neth.nack_reason, p.neth.nack_psn) for p in answers if isinstance(p, NackPacket)]


def test_a_new_packet_is_placed_at_its_va_and_sacked(pair: Pair) -> None:
    # Without the A bit: with it, the message's ACK would stand for the SACK (one datagram).
    answers = pair.inject(pair.packet(1000, b"x" * 100, va_offset=4096, a=False))
    assert pair.dst[4096:4196] == b"x" * 100 and pair.dst.count(0) == len(pair.dst) - 100
    (sack,) = [p for p in answers if isinstance(p, SackPacket)]
    assert sack.cack_psn == 1001 and sack.seth.entropy == 7
    assert sack.cc.valid and sack.cc.tx_timestamp == 1234


def test_a_duplicate_is_never_written_twice(pair: Pair) -> None:
    pair.inject(pair.packet(1000, b"a" * 10))
    pair.dst[0:10] = b"z" * 10  # the application consumed and reused the bytes
    answers = pair.inject(pair.packet(1000, b"a" * 10))
    assert pair.dst[0:10] == b"z" * 10
    assert pair.sb.stats.drops_by_reason["duplicate"] == 1
    assert any(isinstance(p, SackPacket) for p in answers)  # SACK at once


@pytest.mark.parametrize("behind", [0x8000 - 60, 0x8000 - 1, 0x8000, 0x8001, 0x7F00])
def test_a_packet_far_behind_cack_is_answered_about_cack(pair: Pair, behind: int) -> None:
    # A duplicate (or a forgery) nearly 2^15 PSNs behind: its offset fits 16 bits, but its
    # 64-PSN block's start may not; the SACK then reports about cack_psn (a fuzzed packet
    # once raised out of the SACK encoder here).
    psn = (1000 - behind) % (1 << 24)
    answers = pair.inject(pair.packet(psn, b"b" * 10))
    (sack,) = [p for p in answers if isinstance(p, SackPacket)]
    assert -0x8000 <= sack.seth.sack_offset < 0x8000
    assert pair.dst.count(0) == len(pair.dst)


def test_a_psn_beyond_the_window_is_nacked_and_not_written(pair: Pair) -> None:
    answers = pair.inject(pair.packet(1000 + 8 * 128, b"w" * 10))
    assert pair.dst.count(0) == len(pair.dst)
    assert nacks(answers) == [(NackReason.PSN_OOR_WINDOW, 1000 + 1024)]


def test_a_wrong_rkey_consumes_the_psn_and_writes_nothing(pair: Pair) -> None:
    answers = pair.inject(pair.packet(1000, b"k" * 10, rkey=pair.region.rkey ^ 1))
    assert pair.dst.count(0) == len(pair.dst)
    # One reason for every access error: the AETH's remote access error, no NACK naming it.
    assert nacks(answers) == [] and acks(answers) == [(Syndrome.NAK_REMOTE_ACCESS, 0, 1001)]
    assert pair.sb.receiver.cack == 1001  # type: ignore[union-attr]
    assert pair.sb.stats.drops_by_reason["bad_rkey"] == 1


@pytest.mark.parametrize("va_offset", [-1, 64 * 1024 - 9, 64 * 1024, 1 << 40])
def test_an_out_of_bounds_write_is_refused_whole(pair: Pair, va_offset: int) -> None:
    answers = pair.inject(pair.packet(1000, b"o" * 10, va_offset=va_offset))
    assert pair.dst.count(0) == len(pair.dst)
    # The same answer as an unknown R_Key's: a peer cannot tell a known R_Key by it.
    assert nacks(answers) == [] and acks(answers) == [(Syndrome.NAK_REMOTE_ACCESS, 0, 1001)]


def test_a_trimmed_packet_is_a_hint_never_a_write(pair: Pair) -> None:
    # A FIRST carries a full MTU; this one lost its payload tail in a switch.
    short = pair.packet(1000, b"t" * 20, opcode=Opcode.WRITE_FIRST, dma_length=3 * MTU)
    answers = pair.inject(short)
    assert pair.dst.count(0) == len(pair.dst)
    assert nacks(answers) == [(NackReason.TRIMMED, 1000)]
    # DSCP 21 (TOS 21 << 2) marks a last-hop trim; a retransmission (its own tx_timestamp:
    # one NACK per transmission, docs/WIRE.md §5).
    again = pair.packet(1000, b"t" * 20, opcode=Opcode.WRITE_FIRST, dma_length=3 * MTU,
                        tx_timestamp=1235)  # fmt: skip
    answers = pair.inject(again, tos=21 << 2 | 2)
    assert nacks(answers) == [(NackReason.TRIMMED_LASTHOP, 1000)]
    assert pair.sb.stats.trimmed_received == 2
    assert pair.sb.receiver.cack == 1000  # type: ignore[union-attr]


def test_a_payload_longer_than_its_opcode_allows_is_dropped(pair: Pair) -> None:
    long = pair.packet(1000, b"l" * (MTU + 1), opcode=Opcode.WRITE_FIRST, dma_length=3 * MTU)
    assert pair.inject(long) == []
    assert pair.dst.count(0) == len(pair.dst)
    assert pair.sb.stats.drops_by_reason["bad_length"] == 1


def test_garbage_is_counted_by_field_and_changes_nothing(pair: Pair) -> None:
    good = pair.packet(1000, b"g" * 10)
    bad = [b"", b"\x00" * 5, bytes([0x42]) + good[1:], good[:20], good[:12] + b"\xff" * 40]
    pair.inject(*bad)
    assert pair.dst.count(0) == len(pair.dst)
    dropped = sum(pair.sb.stats.drops_by_reason.values()) + sum(pair.b.endpoint.drops.values())
    assert dropped == len(bad)


def test_bad_rkey_and_out_of_bounds_writes_complete_with_their_status() -> None:
    """A real writer: the WRITE with a wrong R_Key and the one past the region end complete
    with the one remote access error (0x62), the good one after them with 0, and nothing
    lands for the bad two."""
    net = Network(seed=9)
    a, b = net.pair(2, LinkParams(latency=10e-6))
    dst = bytearray(1 << 20)
    region = b.regions.register(dst)
    src = a.regions.register(bytearray(b"s" * (1 << 20)))
    cfg = SessionConfig(plane_mask=0b11, flowcell=1)
    b.listen(cfg, accept=lambda _: REPLY.pack(region.base_va, region.rkey))

    def on_event(host: Host, s: Session, ev: object) -> None:
        if isinstance(ev, ConnectionEstablished):
            va, rkey = REPLY.unpack(ev.private_data)
            s.post_write(src, 0, 100_000, va, rkey ^ 0xFFFF)  # wrong R_Key
            s.post_write(src, 0, 100_000, va + (1 << 20) - 50_000, rkey)  # runs past the end
            s.post_write(src, 0, 10_000, va + 500_000, rkey)  # fine

    a.connect(b, cfg, on_event=on_event)
    assert net.drive_until(lambda: len(a.events_of(WriteCompleted)) == 3, timeout=1.0)
    assert a.events_of(WriteCompleted) == [
        WriteCompleted(msn=0, status=0x62),
        WriteCompleted(msn=1, status=0x62),
        WriteCompleted(msn=2, status=0),
    ]
    assert dst[500_000:510_000] == b"s" * 10_000
    assert dst.count(0) == len(dst) - 10_000


def test_a_nack_unexp_event_closes_the_connection(pair: Pair) -> None:
    from mrc.core.events import ConnectionClosed
    from mrc.wire.ack import NETH
    from mrc.wire.packet import NackPacket as Nack

    nack = Nack(
        dest_qp=pair.sa.qpn,
        psn=0,
        ev=0,
        neth=NETH(nack_reason=NackReason.UNEXP_EVENT, entropy=0, nack_psn=0),
    ).encode()
    pair.a.endpoint.receive_datagrams(0, [(nack, "b", 2)], pair.net.now)
    events = []
    while (e := pair.sa.next_event()) is not None:
        events.append(e)
    assert events == [ConnectionClosed(reason="peer reported a fatal protocol error (UNEXP_EVENT)")]


def test_probes_are_answered_on_the_mirror_of_the_path_they_probed(pair: Pair) -> None:
    """A RELIABILITY_PROBE and an EV_PROBE that came in on EV X are answered on X (the same
    selector, so the same path back): the prober judges X by that answer, and an answer on
    some other reverse EV could die on another path and indict a path that works."""
    probed = make_ev(0, 0x123457)
    probe = ProbePacket(
        dest_qp=pair.sb.qpn, psn=1000, ev=probed, peth=PETH(probe_id=9, tx_timestamp=77)
    ).encode()
    ev_probe = EndpointPacket(
        opcode=Opcode.ENDPOINT_REQUEST,
        dest_qp=pair.sb.qpn,
        ev=make_ev(0, 0xABCDE),
        header=ERTH(op=EndpointOp.EV_PROBE, port_status_mask=0b11, tx_timestamp=78),
        probe_id=10,
    ).encode()
    out = pair.inject(probe, ev_probe)
    (sack,) = [p for p in out if isinstance(p, SackPacket)]
    (answer,) = [p for p in out if isinstance(p, EndpointPacket)]
    assert sack.seth.pr and sack.ev == probed
    assert isinstance(answer.header, EETH)
    # The probe id travels in BTH.PSN both ways (docs/WIRE.md §4).
    assert (answer.ev, answer.probe_id, answer.header.tx_timestamp) == (make_ev(0, 0xABCDE), 10, 78)
    # An EV naming another plane cannot be mirrored: a reverse EV of the arrival plane is.
    stray = EndpointPacket(
        opcode=Opcode.ENDPOINT_REQUEST,
        dest_qp=pair.sb.qpn,
        ev=make_ev(1, 5),
        header=ERTH(op=EndpointOp.EV_PROBE, port_status_mask=0b11, tx_timestamp=79),
        probe_id=11,
    ).encode()
    (stray_answer,) = pair.inject(stray)
    assert isinstance(stray_answer, EndpointPacket)
    assert stray_answer.ev in pair.sb.paths.planes[0].reverse_evs


def _story(pair: Pair) -> list[tuple[bytes, int]]:
    """(datagram, TOS) of three-packet messages: the common FIRST/MIDDLE and every way a
    packet can leave that case."""
    full, mid = b"m" * MTU, Opcode.WRITE_MIDDLE

    def pkt(psn: int, msn: int, **kw: object) -> bytes:
        kw.setdefault("opcode", mid)
        kw.setdefault("a", False)
        kw.setdefault("va_offset", (psn - 1000) * MTU)
        return pair.packet(psn, full, dma_length=3 * MTU, msn=msn, **kw)  # type: ignore[arg-type]

    first = pkt(1000, 0, opcode=Opcode.WRITE_FIRST)
    middle = pkt(1001, 0)
    imm_only = DataPacket(
        opcode=Opcode.WRITE_ONLY_IMM, dest_qp=pair.sb.qpn, psn=1018, ev=7, a=True, rtx=False,
        rqmsn=0, msn=7, tx_timestamp=1, va=pair.region.base_va + 34 * 1024,
        rkey=pair.region.rkey, dma_length=100, imm=9, payload=b"o" * 100,
    ).encode()  # fmt: skip
    return [
        (first, 2),
        (middle, 2),
        (middle, 2),  # a duplicate
        (pkt(1002, 0, opcode=Opcode.WRITE_LAST, a=True), 2),
        (pkt(1004, 1), 3),  # ECN-CE
        (middle[:2] + b"\x12\x34" + middle[4:], 2),  # another P_Key
        (middle[:1] + b"\x01" + middle[2:], 2),  # TVer 1
        (pkt(1005, 1)[:-100], 2),  # trimmed
        (pkt(1008 + 1024, 9), 2),  # beyond the window (cack_psn is 1008 at most)
        (pkt(1005, 1, a=True), 2),  # an A bit on a MIDDLE
        (pkt(1003, 1, opcode=Opcode.WRITE_FIRST, tx_timestamp=None), 2),  # no TSETH
        (pkt(1006, 2, opcode=Opcode.WRITE_FIRST, rkey=pair.region.rkey ^ 1), 2),
        (pkt(1007, 2), 2),  # a MIDDLE of the failed message
        (pkt(1009, 3, opcode=Opcode.WRITE_FIRST, va_offset=64 * 1024 - MTU), 2),  # OOB
        (pkt(1012, 4, opcode=Opcode.WRITE_FIRST), 2),
        (pkt(1013, 4), 2),
        # One-packet WRITEs: a good one, one cut short (trimmed), one with ImmDt.
        (pair.packet(1016, b"o" * 100, msn=5, va_offset=32 * 1024), 2),
        (pair.packet(1017, b"o" * 100, msn=6, va_offset=33 * 1024, dma_length=200), 2),
        (imm_only, 2),
    ]


def test_the_byte_layouts_and_the_decoder_lead_to_the_same_checks() -> None:
    """Reading a datagram's headers from its bytes is a codec shortcut, not a second set of
    rules: every data packet, read from its bytes (the endpoint's way) or decoded first and
    handed to `Receiver.on_data` (the way of every layout the byte reader leaves alone), goes
    through the one sequence of checks (docs/DESIGN.md §6) and the run ends the same."""
    by_bytes, decoded = Pair(), Pair()
    receiver = decoded.sb.receiver
    assert receiver is not None and by_bytes.sb.receiver is not None
    answers: dict[str, list[list[bytes]]] = {"bytes": [], "decoded": []}

    def pull(pr: Pair) -> list[bytes]:
        # The answers' bytes but for BTH.DestQP (each writer has its own random QPN).
        return [t.data[:5] + t.data[8:] for t in pr.sb.datagrams_to_send(pr.net.now)]

    for d, tos in _story(by_bytes):
        by_bytes.b.endpoint.receive_datagrams(0, [(d, "a", tos)], by_bytes.net.now)
        answers["bytes"].append(pull(by_bytes))
    now = decoded.net.now
    for d, tos in _story(decoded):
        try:
            pkt = decode_packet(d)
        except DecodeError:
            decoded.sb.stats.drops_by_reason["decode_tver"] += 1  # (the one TVer 1 packet)
            answers["decoded"].append([])
            continue
        if pkt.p_key != decoded.sb.config.p_key:
            decoded.sb.stats.drops_by_reason["p_key"] += 1
        else:
            assert isinstance(pkt, DataPacket)
            receiver.on_data(pkt, 0, tos, now)
        answers["decoded"].append(pull(decoded))
    assert by_bytes.dst == decoded.dst and by_bytes.dst.count(b"m"[0]) == 8 * MTU
    assert by_bytes.dst.count(b"o"[0]) == 200
    assert answers["bytes"] == answers["decoded"]
    assert by_bytes.sb.stats.drops_by_reason == decoded.sb.stats.drops_by_reason == {
        "duplicate": 1, "p_key": 1, "decode_tver": 1, "out_of_window": 1, "bad_rkey": 1,
        "message_failed": 1, "out_of_bounds": 1,
    }  # fmt: skip
    assert by_bytes.sb.stats.bytes_placed == decoded.sb.stats.bytes_placed == 8 * MTU + 200
    assert by_bytes.sb.receiver.cack == receiver.cack == 1008  # 1008 never came


def test_a_small_write_with_imm_is_placed_and_raises_its_immediate(pair: Pair) -> None:
    """The one-packet WRITE_WITH_IMM (a --verify bench's every message) is placed from its
    bytes too (compiled, the byte path is the one that runs); its immediate and its ACK
    come as from the decoder."""
    va = pair.region.base_va + 4096
    imm_only = DataPacket(
        opcode=Opcode.WRITE_ONLY_IMM, dest_qp=pair.sb.qpn, psn=1000, ev=7, a=True, rtx=False,
        rqmsn=0, msn=0, tx_timestamp=1, va=va, rkey=pair.region.rkey, dma_length=100, imm=9,
        payload=b"i" * 100,
    ).encode()  # fmt: skip
    answers = pair.inject(imm_only)
    assert pair.dst[4096:4196] == b"i" * 100 and pair.sb.stats.bytes_placed == 100
    assert acks(answers) == [(0x1F, 0, 1001)]
    events = [e for e in iter(pair.sb.next_event, None) if isinstance(e, ImmediateReceived)]
    assert events == [ImmediateReceived(0, 9, pair.region.rkey, va, 100)]
    # Its duplicate (a completion probe) writes nothing and raises nothing again.
    assert acks(pair.inject(imm_only)) == [(0x1F, 0, 1001)]
    assert pair.sb.stats.drops_by_reason == {"duplicate": 1}
    assert pair.sb.next_event() is None


def test_one_sack_per_block_answers_every_plane_received_since_the_last_pull(pair: Pair) -> None:
    """io drains every plane before it pulls: the packets of one 64-PSN block that came in on
    two planes get one SACK, not one per plane."""
    now = pair.net.now
    first = pair.packet(1000, b"a" * MTU, opcode=Opcode.WRITE_FIRST, dma_length=2 * MTU, a=False)
    last = pair.packet(
        1001, b"b" * 10, opcode=Opcode.WRITE_LAST, va_offset=MTU, dma_length=MTU + 10, a=False
    )
    pair.b.endpoint.receive_datagrams(0, [(first, "a", 2)], now)
    pair.b.endpoint.receive_datagrams(1, [(last, "a", 2)], now)
    answers = [decode_packet(t.data) for t in pair.sb.datagrams_to_send(now)]
    (sack,) = [p for p in answers if isinstance(p, SackPacket)]
    assert sack.cack_psn == 1002 and pair.dst[MTU : MTU + 10] == b"b" * 10
    # The next pull has nothing left to answer.
    assert pair.sb.datagrams_to_send(now) == []


def acks(answers: list[object]) -> list[tuple[int, int, int]]:
    """(syndrome, MSN, BTH.PSN) of each ACKNOWLEDGE answered, in order."""
    return [(p.aeth.syndrome, p.aeth.msn, p.psn) for p in answers if isinstance(p, AckPacket)]


def test_the_messages_a_pull_completes_get_one_cumulative_ack(pair: Pair) -> None:
    # t = 1 ms: three one-packet WRITEs, each with the A bit, in one receive batch.
    answers = pair.inject(*(pair.packet(1000 + i, b"m" * 10, va_offset=64 * i, msn=i)
                            for i in range(3)))  # fmt: skip
    # One ACK for the newest (IBTA: it acknowledges every message up to its MSN), and no
    # SACK: nothing is held past cack_psn 1003, which the ACK's BTH.PSN acknowledges.
    assert acks(answers) == [(0x1F, 2, 1003)]
    assert len(answers) == 1


def test_no_ack_passes_a_failure_the_requester_has_not_taken(pair: Pair) -> None:
    bad = pair.region.rkey ^ 0xFFFF
    # t = 1 ms: msn 0 fine, msn 1 with a wrong R_Key, msn 2 fine; the requester waits on 0.
    answers = pair.inject(
        pair.packet(1000, b"a" * 10, msn=0),
        pair.packet(1001, b"b" * 10, msn=1, rkey=bad, va_offset=64),
        pair.packet(1002, b"c" * 10, msn=2, va_offset=128),
    )
    # msn 0's ACK goes before msn 1's NAK, so it cannot cover it; msn 2's ACK would claim
    # msn 1 succeeded: it waits.
    assert acks(answers) == [(0x1F, 0, 1002), (0x62, 1, 1002)]  # cack_psn as they left
    # A duplicate LAST of msn 2 (its completion probe) from a requester still waiting on 1:
    # still nothing for it.
    assert acks(pair.inject(pair.packet(1002, b"c" * 10, msn=2, va_offset=128, rqmsn=1))) == []
    # The requester took msn 1's outcome (RQMSN 2): the ACK for msn 2 goes now.
    dup = pair.packet(1002, b"c" * 10, msn=2, va_offset=128, rqmsn=2)
    assert acks(pair.inject(dup)) == [(0x1F, 2, 1003)]
    assert pair.dst[64:74] == bytes(10) and pair.dst[128:138] == b"c" * 10


def test_cack_runs_over_the_whole_ring_and_round_its_end(pair: Pair) -> None:
    # The window (1024) fills the ring: with PSN 1000 missing, 1001..2023 all arrive; then
    # 1000 does, and cack_psn runs over every slot at once, completing 1024 messages.
    receiver = pair.sb.receiver
    assert receiver is not None
    answers = pair.inject(*[pair.packet(p, b"r", msn=p - 1000) for p in range(1001, 2024)])
    assert not [p for p in answers if isinstance(p, AckPacket)] and receiver.cack == 1000
    answers = pair.inject(pair.packet(1000, b"r", msn=0))
    (ack,) = [p for p in answers if isinstance(p, AckPacket)]
    assert (receiver.cack, ack.psn, ack.aeth.msn) == (2024, 2024, 1023)
    # t = +0: a run from ring slot 1000 (PSN 2024) round the ring's end to slot 52 (PSN 2100).
    pair.inject(*[pair.packet(p, b"s", msn=p - 1000) for p in range(2025, 2101)])
    assert receiver.cack == 2024
    (ack,) = [p for p in pair.inject(pair.packet(2024, b"s", msn=1024)) if isinstance(p, AckPacket)]
    assert (receiver.cack, ack.aeth.msn) == (2101, 1100)
    # Nothing is left marked: the next PSN is new, and an old one a duplicate.
    drops = pair.sb.stats.drops_by_reason
    pair.inject(pair.packet(2101, b"t", msn=1101), pair.packet(2050, b"t", msn=1050))
    assert (receiver.cack, drops["duplicate"]) == (2102, 1)


def test_copies_of_one_trimmed_stub_draw_one_nack_and_a_retransmission_its_own(
    pair: Pair,
) -> None:
    """docs/WIRE.md §5 (revision 1.2): at most one NACK per (PSN, tx_timestamp)."""
    stub = pair.packet(1000, b"t" * 20, opcode=Opcode.WRITE_FIRST, dma_length=3 * MTU)
    # t = 1 ms: 1,000 copies of one stub (a replaying attacker, or a looping switch).
    answers = pair.inject(*[stub] * 1000)
    assert nacks(answers) == [(NackReason.TRIMMED, 1000)]
    assert pair.sb.stats.drops_by_reason["trimmed_repeat"] == 999
    # The sender's retransmission carries a new tx_timestamp: trimmed again, NACKed again.
    again = pair.packet(1000, b"t" * 20, opcode=Opcode.WRITE_FIRST, dma_length=3 * MTU,
                        tx_timestamp=1300)  # fmt: skip
    assert nacks(pair.inject(again, again)) == [(NackReason.TRIMMED, 1000)]
    assert pair.sb.stats.nacks_sent == 2 and pair.dst.count(0) == len(pair.dst)


def test_nacks_for_trimmed_stubs_go_through_their_own_token_bucket(pair: Pair) -> None:
    """Distinct stubs (each its own tx_timestamp) at one instant: the bucket's burst of NACKs
    (256), the rest counted; 10 ms later it has refilled 500 (50,000 a second), up to 256."""

    def stubs(first_ts: int, n: int) -> list[bytes]:
        return [pair.packet(1000 + i % 512, b"t" * 20, opcode=Opcode.WRITE_FIRST,
                            dma_length=3 * MTU, tx_timestamp=(first_ts + i) & 0xFFFF)
                for i in range(n)]  # fmt: skip

    assert len(nacks(pair.inject(*stubs(0, 1000)))) == 256
    assert pair.sb.stats.drops_by_reason["trimmed_rate"] == 744
    pair.net.drive(pair.net.now + 0.010)
    assert len(nacks(pair.inject(*stubs(2000, 300)))) == 256
    assert pair.sb.stats.drops_by_reason["trimmed_rate"] == 744 + 44


def test_a_peer_causing_too_many_access_errors_is_disconnected(pair: Pair) -> None:
    """docs/DESIGN.md §6: more than `max_access_errors` (16) failed messages end the
    connection; the peer hears UNEXP_EVENT. An R_Key search stops there."""
    from mrc.core.events import ConnectionClosed

    guesses = [pair.packet(1000 + i, b"k" * 10, msn=i, rkey=0x1000 + i) for i in range(16)]
    answers = pair.inject(*guesses)
    assert len(acks(answers)) == 16 and not pair.sb.is_closed
    assert nacks(answers) == []
    answers = pair.inject(pair.packet(1016, b"k" * 10, msn=16, rkey=0x2000))  # the 17th
    assert pair.sb.is_closed and pair.sb.close_reason == "too many remote access errors"
    assert nacks(answers) == [(NackReason.UNEXP_EVENT, 1016)]
    closed = [e for e in iter(pair.sb.next_event, None) if isinstance(e, ConnectionClosed)]
    assert closed == [ConnectionClosed(reason="too many remote access errors")]
    assert pair.dst.count(0) == len(pair.dst)

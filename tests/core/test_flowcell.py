"""Flowcells (docs/DESIGN.md §11): consecutive new packets on one EV, sent as one GSO batch.

The writer's outputs are read straight from `datagrams_to_send` after a real handshake over
the simulator; the loss story runs a whole transfer through it. Each datagram of a batch is
decoded with the strict wire decoder, so every packet's own headers are checked.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass

import pytest

from mrc.core.config import SessionConfig
from mrc.core.errors import LocalProtocolError
from mrc.core.events import ConnectionEstablished, Event, PathRetired, WriteCompleted
from mrc.core.paths.evs import EvState
from mrc.core.paths.planes import ev_plane
from mrc.core.session import Session
from mrc.core.transmit import Transmit
from mrc.sim import Host, LinkParams, Network
from mrc.wire.ack import AETH, NETH, NackReason, Syndrome
from mrc.wire.bth import DATA_OPCODES, Opcode
from mrc.wire.fast import encode_sack
from mrc.wire.packet import AckPacket, DataPacket, NackPacket, decode_packet

REPLY = struct.Struct(">QI")
HEADER = 40  # BTH EVXH METH TSETH RETH
PSN0 = 1000


class Pair:
    """`a` writes into `b`'s region over 2 planes; the handshake is done at t = 0.001."""

    def __init__(self, **config: int | str) -> None:
        self.net = Network(seed=5)
        self.a, self.b = self.net.pair(2, LinkParams(latency=10e-6))
        self.dst = bytearray(1 << 20)
        self.region = self.b.regions.register(self.dst)
        self.src = bytes(range(256)) * 4096
        self.src_region = self.a.regions.register(bytearray(self.src))
        cfg = SessionConfig(plane_mask=0b11, initial_psn=PSN0, **{"flowcell": 1, **config})  # type: ignore[arg-type]
        self.b.listen(cfg, accept=lambda _: REPLY.pack(self.region.base_va, self.region.rkey))
        self.sa: Session = self.a.connect(self.b, cfg)
        self.net.drive(0.001)
        assert self.a.events_of(ConnectionEstablished)

    def post(self, offset: int, length: int, imm: int | None = None) -> int:
        return self.sa.post_write(
            self.src_region, offset, length, self.region.base_va + offset, self.region.rkey, imm
        )

    def pull(self) -> list[Transmit]:
        """What the writer sends now (not delivered: these stories only read it)."""
        return self.sa.datagrams_to_send(self.net.now)


def packets(tx: Transmit) -> list[DataPacket]:
    """The datagrams of one transmit, as the receiving side's io splits them, decoded."""
    seg = tx.segment_size or len(tx.data)
    out = []
    for off in range(0, len(tx.data), seg):
        pkt = decode_packet(tx.data[off : off + seg])
        assert isinstance(pkt, DataPacket)
        out.append(pkt)
    return out


def data_transmits(txs: list[Transmit]) -> list[Transmit]:
    return [t for t in txs if t.data[0] in DATA_OPCODES]


def test_a_flowcell_is_one_transmit_whose_packets_carry_its_ev_and_share_one_record() -> None:
    pair = Pair(payload_mtu=1024, flowcell=8)
    pair.post(0, 8 * 1024 * 2 + 5 * 1024 + 100, imm=7)  # 21 full packets and a short LAST_IMM
    txs = data_transmits(pair.pull())
    assert [len(packets(t)) for t in txs] == [8, 8, 6]
    assert [t.segment_size for t in txs] == [1024 + HEADER] * 3
    # The short LAST rides as the batch's last segment: 5 full segments and 100 + 44 bytes.
    assert len(txs[2].data) == 5 * (1024 + HEADER) + 100 + HEADER + 4
    sender = pair.sa.sender
    assert sender is not None
    psn = PSN0
    cells = []
    for tx in txs:
        assert tx.plane == ev_plane(tx.ev)
        cell = sender.inflight[psn]
        assert (cell.psn, cell.ev, cell.plane, cell.sent_at) == (psn, tx.ev, tx.plane, pair.net.now)
        for i, pkt in enumerate(packets(tx)):
            assert pkt.psn == psn and pkt.ev == tx.ev and not pkt.rtx
            assert pkt.va == pair.region.base_va + (psn - PSN0) * 1024
            # Every PSN of the flowcell maps to its one send record.
            assert sender.inflight[psn] is cell
            assert cell.packet(i)[1] == psn - PSN0 and cell.tx_ts == pkt.tx_timestamp
            psn += 1
        cells.append(cell)
    assert [(c.size, c.last, c.open, c.open_bytes) for c in cells] == [
        (1024, 1024, 8, 8 * 1024), (1024, 1024, 8, 8 * 1024), (1024, 100, 6, 5 * 1024 + 100)
    ]  # fmt: skip
    # One record per flowcell everywhere the sender keeps them: by PSN, by plane, by EV.
    assert len({id(c) for c in sender.inflight.values()}) == 3
    assert sum(len(f) for f in sender.log.by_plane.values()) == 3
    assert [c.seq for c in cells] == [cells[0].seq, cells[0].seq + 1, cells[0].seq + 2]
    assert sender.flight.bytes == 21 * 1024 + 100
    opcodes = [p.opcode for t in txs for p in packets(t)]
    assert opcodes == [Opcode.WRITE_FIRST] + [Opcode.WRITE_MIDDLE] * 20 + [Opcode.WRITE_LAST_IMM]
    assert [p.a for t in txs for p in packets(t)] == [False] * 21 + [True]
    # Each flowcell took its own EV from the rotation, and the planes took turns.
    assert len({t.ev for t in txs}) == 3
    assert txs[0].plane != txs[1].plane


def test_a_sack_covering_a_flowcell_frees_its_record_at_once() -> None:
    pair = Pair(payload_mtu=1024, flowcell=8)
    pair.post(0, 16 * 1024)
    txs = data_transmits(pair.pull())
    sender = pair.sa.sender
    assert sender is not None and [len(packets(t)) for t in txs] == [8, 8]
    first, second = sender.inflight[PSN0], sender.inflight[PSN0 + 8]
    plane = first.plane
    # t = +0: the peer's SACK says PSNs 1000..1007 arrived (cumulative ack up to 1008).
    sack = encode_sack(
        dest_qp=pair.sa.qpn, cack_psn=PSN0 + 8, ev=txs[0].ev, ack_psn_offset=-1,
        entropy=txs[0].ev, sack_offset=0, sack_bitmap=0,
    )  # fmt: skip
    pair.sa.receive_datagrams(plane, [(sack, 0)], pair.net.now)
    # The whole flowcell is done in that one call: no PSN maps to it, nothing of it is in
    # flight, and its plane's byte count dropped by all 8 packets.
    assert (first.acked, first.open, first.open_bytes) == (0xFF, 0, 0)
    assert all(rec is second for rec in sender.inflight.values())
    assert len(sender.inflight) == 8 and sender.una == PSN0 + 8
    assert sender.flight.bytes == 8 * 1024
    assert sender.flight.by_plane[plane] == (8 * 1024 if second.plane == plane else 0)
    # The next output pull drops it from its plane's FIFO too (no new work; nothing left).
    pair.pull()
    assert first not in sender.log.by_plane[plane]


def test_a_sack_over_a_flowcell_with_a_resent_packet_frees_each_packet_from_its_own_record() -> (
    None
):
    pair = Pair(payload_mtu=1024, flowcell=8, cc="none")
    pair.post(0, 8 * 1024)
    (tx,) = data_transmits(pair.pull())
    sender = pair.sa.sender
    assert sender is not None
    cell = sender.inflight[PSN0]
    qp = pair.sa.qpn
    # t = +0: the peer refuses PSN 1003 as out of its window; the next pull resends it alone.
    neth = NETH(nack_reason=NackReason.PSN_OOR_WINDOW, entropy=tx.ev, nack_psn=PSN0 + 3)
    nack = NackPacket(dest_qp=qp, psn=PSN0 + 3, ev=tx.ev, neth=neth)
    pair.sa.receive_datagrams(tx.plane, [(nack.encode(), 0)], pair.net.now)
    (resend,) = data_transmits(pair.pull())
    rec = sender.inflight[PSN0 + 3]
    assert rec is not cell and (rec.psn, rec.rtx, rec.n) == (PSN0 + 3, True, 1)
    assert cell.lost == 0b1000 and len(sender.inflight) == 8
    assert sender.flight.bytes == 8 * 1024
    # A SACK block (bit 63 is PSN 1000) saying PSNs 1001..1007 arrived, cack_psn still 1000:
    # the flowcell gives up its six, the resend its one, each counted once.
    sack = encode_sack(
        dest_qp=qp, cack_psn=PSN0, ev=tx.ev, ack_psn_offset=1, entropy=tx.ev,
        sack_offset=0, sack_bitmap=0x7F << 56,
    )  # fmt: skip
    pair.sa.receive_datagrams(tx.plane, [(sack, 0)], pair.net.now)
    assert (cell.acked, cell.open, cell.open_bytes) == (0b11110110, 1, 1024)
    assert (rec.acked, rec.open, rec.open_bytes) == (1, 0, 0)
    assert [psn for psn, _ in sender.inflight.items()] == [PSN0]
    assert len(sender.inflight) == 1 and sender.flight.bytes == 1024
    assert sender.una == PSN0
    # The cumulative ACK for the rest: nothing is left, and the write awaits its AETH.
    sack = encode_sack(
        dest_qp=qp, cack_psn=PSN0 + 8, ev=tx.ev, ack_psn_offset=-1, entropy=tx.ev,
        sack_offset=0, sack_bitmap=0,
    )  # fmt: skip
    pair.sa.receive_datagrams(resend.plane, [(sack, 0)], pair.net.now)
    assert cell.acked == 0b11110111 and len(sender.inflight) == 0
    assert sender.flight.bytes == 0 and sender.una == PSN0 + 8
    assert pair.sa.stats.bytes_acked == 8 * 1024
    assert [m.acked for m in sender.outstanding] == [8]


def test_flowcell_one_is_a_datagram_and_an_ev_per_packet() -> None:
    pair = Pair(payload_mtu=1024)
    assert pair.sa.config.flowcell == 1
    pair.post(0, 6 * 1024)
    txs = data_transmits(pair.pull())
    assert [t.segment_size for t in txs] == [None] * 6
    assert [len(t.data) for t in txs] == [1024 + HEADER] * 6
    assert [p.psn for t in txs for p in packets(t)] == list(range(PSN0, PSN0 + 6))
    evs = [t.ev for t in txs]
    assert all(a != b for a, b in itertools.pairwise(evs))


@pytest.mark.parametrize(
    ("mtu", "flowcell", "per_call"),
    [
        (8192, 16, 65507 // (8192 + HEADER)),  # 7: the 64 KiB of one UDP datagram
        (256, 64, 64),  # the kernel's 64 segments
        (4096, 64, 15),
        (1024, 5, 5),  # the configured size
    ],
)
def test_a_flowcell_holds_min_of_flowcell_64k_and_64_segments(
    mtu: int, flowcell: int, per_call: int
) -> None:
    # cc "none": NSCC's plane caps start at 64 KiB a plane, which would cut the third cell.
    pair = Pair(payload_mtu=mtu, flowcell=flowcell, cc="none")
    pair.post(0, 3 * per_call * mtu)
    txs = data_transmits(pair.pull())
    assert [len(packets(t)) for t in txs] == [per_call] * 3
    assert all(len(t.data) <= 65507 for t in txs)
    assert {t.segment_size for t in txs} == ({mtu + HEADER} if per_call > 1 else {None})


def test_a_full_last_imm_leaves_in_its_flowcell_s_second_batch() -> None:
    pair = Pair(payload_mtu=1024, flowcell=8)
    # A LAST_IMM with a full payload is 4 bytes longer than the FIRST/MIDDLE around it: GSO
    # allows only the last segment to differ, and only to be shorter. It stays in the
    # flowcell (its EV, its record) and leaves after the others, as a batch of its own size.
    pair.post(0, 3 * 1024, imm=1)
    pair.post(3 * 1024, 4 * 1024)
    txs = data_transmits(pair.pull())
    shapes = [[(p.opcode, p.psn) for p in packets(t)] for t in txs]
    assert shapes == [
        [(Opcode.WRITE_FIRST, PSN0), (Opcode.WRITE_MIDDLE, PSN0 + 1),
         (Opcode.WRITE_FIRST, PSN0 + 3), (Opcode.WRITE_MIDDLE, PSN0 + 4),
         (Opcode.WRITE_MIDDLE, PSN0 + 5), (Opcode.WRITE_LAST, PSN0 + 6)],
        [(Opcode.WRITE_LAST_IMM, PSN0 + 2)],
    ]  # fmt: skip
    assert [t.segment_size for t in txs] == [1064, None]
    assert len(txs[1].data) == 1068
    assert txs[0].ev == txs[1].ev
    sender = pair.sa.sender
    assert sender is not None
    cell = sender.inflight[PSN0]
    assert all(sender.inflight[PSN0 + i] is cell for i in range(7))
    assert (cell.n, cell.late, cell.open_bytes) == (7, 0b100, 7 * 1024)


def test_a_short_last_imm_longer_than_the_first_packet_starts_the_next_flowcell() -> None:
    pair = Pair(payload_mtu=1024, flowcell=8)
    # 1022 bytes and an ImmDt: 1066 bytes, 2 more than the FIRST. A short packet ends its
    # flowcell as the first batch's last segment, so a longer one waits for the next.
    pair.post(0, 1024 + 1022, imm=1)
    txs = data_transmits(pair.pull())
    assert [[(p.opcode, p.psn) for p in packets(t)] for t in txs] == [
        [(Opcode.WRITE_FIRST, PSN0)],
        [(Opcode.WRITE_LAST_IMM, PSN0 + 1)],
    ]
    assert [len(t.data) for t in txs] == [1064, 1066]
    sender = pair.sa.sender
    assert sender is not None
    assert sender.inflight[PSN0] is not sender.inflight[PSN0 + 1]
    assert sender.inflight[PSN0].late == sender.inflight[PSN0 + 1].late == 0


def two_packet_writes(pair: Pair, count: int) -> list[Transmit]:
    """`count` WRITE_WITH_IMMs of 2 KiB (a FIRST and a full LAST_IMM each), pulled."""
    for k in range(count):
        pair.post(k * 2048, 2048, imm=k)
    return data_transmits(pair.pull())


def sack_of(pair: Pair, tx: Transmit, psns: list[int]) -> bytes:
    """A SACK (cack_psn still PSN0) saying `psns` arrived."""
    bitmap = sum(1 << (63 - (psn - PSN0)) for psn in psns)
    return encode_sack(
        dest_qp=pair.sa.qpn, cack_psn=PSN0, ev=tx.ev, ack_psn_offset=psns[-1] - PSN0,
        entropy=tx.ev, sack_offset=0, sack_bitmap=bitmap,
    )  # fmt: skip


def test_small_writes_with_imm_are_a_flowcell_of_two_batches() -> None:
    pair = Pair(payload_mtu=1024, flowcell=8, cc="none")
    txs = two_packet_writes(pair, 4)
    # PSNs 1000..1007 are F L F L F L F L: the FIRSTs leave first, then the LAST_IMMs.
    assert [[p.psn - PSN0 for p in packets(t)] for t in txs] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert [t.segment_size for t in txs] == [1064, 1068]
    sender = pair.sa.sender
    assert sender is not None
    cell = sender.inflight[PSN0]
    assert (cell.n, cell.late, len(sender.log.by_plane[cell.plane])) == (8, 0b10101010, 1)


def test_rack_judges_a_two_batch_flowcell_in_the_order_its_packets_left() -> None:
    pair = Pair(payload_mtu=1024, flowcell=8, cc="none")
    txs = two_packet_writes(pair, 4)
    sender = pair.sa.sender
    assert sender is not None
    cell = sender.inflight[PSN0]
    t0 = pair.net.now
    # t0: all four FIRSTs arrived (the first batch). Every LAST_IMM left after the last of
    # them, so none is judged, however long the reordering window has passed.
    firsts = sack_of(pair, txs[0], [PSN0, PSN0 + 2, PSN0 + 4, PSN0 + 6])
    pair.sa.receive_datagrams(txs[0].plane, [(firsts, 0)], t0)
    pair.sa.datagrams_to_send(t0)
    pair.sa.handle_timer(t0 + 0.003)
    assert data_transmits(pair.sa.datagrams_to_send(t0 + 0.003)) == []
    assert (cell.acked, cell.lost) == (0b01010101, 0)
    # t0 + 3 ms: LAST_IMM 1003 arrived, from the second batch: 1001 left before it and is
    # lost once the window passes (1 ms); 1005 and 1007 left after it and are not.
    t1 = t0 + 0.003
    pair.sa.receive_datagrams(txs[1].plane, [(sack_of(pair, txs[1], [PSN0 + 3]), 0)], t1)
    pair.sa.datagrams_to_send(t1)
    assert cell.lost == 0
    t2 = t1 + 0.002
    pair.sa.handle_timer(t2)
    resent = data_transmits(pair.sa.datagrams_to_send(t2))
    assert [p.psn for t in resent for p in packets(t)] == [PSN0 + 1]
    assert (cell.acked, cell.lost) == (0b01011101, 0b10)
    assert pair.sa.stats.retransmits_by_cause["rack"] == 1


def test_a_sack_over_both_batches_is_dated_by_the_packet_that_left_last() -> None:
    pair = Pair(payload_mtu=1024, flowcell=8, cc="none")
    txs = two_packet_writes(pair, 4)
    t0 = pair.net.now
    # t0: PSNs 1001 (second batch) and 1002 (first batch) arrived. 1001 left later, after
    # the whole first batch: 1000, 1004 and 1006 are lost when the window passes; the
    # LAST_IMMs after 1001 are not.
    sack = sack_of(pair, txs[1], [PSN0 + 1, PSN0 + 2])
    pair.sa.receive_datagrams(txs[1].plane, [(sack, 0)], t0)
    pair.sa.datagrams_to_send(t0)
    pair.sa.handle_timer(t0 + 0.002)
    resent = data_transmits(pair.sa.datagrams_to_send(t0 + 0.002))
    assert sorted(p.psn - PSN0 for t in resent for p in packets(t)) == [0, 4, 6]


def test_the_window_ends_a_flowcell() -> None:
    pair = Pair(payload_mtu=1024, flowcell=16, mpr=1, max_inflight=20)
    pair.post(0, 64 * 1024)
    txs = data_transmits(pair.pull())
    assert [len(packets(t)) for t in txs] == [16, 4]


def test_a_pull_with_a_limit_frames_whole_flowcells_and_the_next_pull_goes_on() -> None:
    # t = 0.001: 20 packets wait. io pulls 6 at a time: each pull ends with the flowcell
    # that reaches the limit (a flowcell is never cut), and the next pull takes the rest up.
    pair = Pair(payload_mtu=1024, flowcell=4)
    pair.post(0, 20 * 1024)
    now = pair.net.now
    rounds = []
    while txs := data_transmits(pair.sa.datagrams_to_send(now, 6)):
        rounds.append([[p.psn for p in packets(t)] for t in txs])
    assert rounds == [
        [[PSN0 + i for i in range(0, 4)], [PSN0 + i for i in range(4, 8)]],
        [[PSN0 + i for i in range(8, 12)], [PSN0 + i for i in range(12, 16)]],
        [[PSN0 + i for i in range(16, 20)]],
    ]
    # Without a limit the same 20 go in one pull, as five flowcells.
    other = Pair(payload_mtu=1024, flowcell=4)
    other.post(0, 20 * 1024)
    assert [len(packets(t)) for t in data_transmits(other.pull())] == [4] * 5


@pytest.mark.parametrize("bad", [0, 65, -1])
def test_flowcell_must_be_1_to_64(bad: int) -> None:
    with pytest.raises(LocalProtocolError, match="flowcell"):
        SessionConfig(flowcell=bad).validate()


@dataclass
class OneDrop:
    """A transfer whose links dropped the first data packet of one PSN: the writer `a`, its
    session, what arrived at `b` (`dst`), the packet dropped and the resends `b` received."""

    a: Host
    b: Host
    session: Session
    dst: bytearray
    dropped: list[DataPacket]
    resent: list[DataPacket]


def write_dropping_once(seed: int, target: int, src: bytes, length: int) -> OneDrop:
    """`src` written from a to b as WRITE_WITH_IMMs of `length` bytes (imm: their index) over
    4 simulated planes, flowcell 16, the first data packet of PSN `target` dropped; driven
    until every WRITE completed."""
    net = Network(seed=seed)
    dropped: list[DataPacket] = []
    resent: list[DataPacket] = []

    def drop(data: bytes) -> bool:
        pkt = decode_packet(data)
        if isinstance(pkt, DataPacket) and pkt.psn == target and not dropped:
            dropped.append(pkt)
            return True
        return False

    params = LinkParams(rate_bps=10e9, latency=20e-6, queue_bytes=8 << 20, drop_if=drop)
    a, b = net.pair(4, params)
    dst = bytearray(len(src))
    src_region = a.regions.register(bytearray(src))
    dst_region = b.regions.register(dst)
    cfg = SessionConfig(plane_mask=0b1111, initial_psn=PSN0, flowcell=16)
    b.listen(cfg, accept=lambda _: REPLY.pack(dst_region.base_va, dst_region.rkey))

    def on_receive(host: Host, plane: int, batch: list[tuple[bytes, object, int]]) -> None:
        for data, _, _ in batch:
            pkt = decode_packet(data)
            if isinstance(pkt, DataPacket) and pkt.rtx:
                resent.append(pkt)

    def on_event(host: Host, session: Session, event: Event) -> None:
        if isinstance(event, ConnectionEstablished):
            va, rkey = REPLY.unpack(event.private_data)
            for off in range(0, len(src), length):
                session.post_write(src_region, off, length, va + off, rkey, off // length)

    b.on_receive = on_receive
    session = a.connect(b, cfg, on_event=on_event)
    count = len(src) // length
    assert net.drive_until(lambda: len(a.events_of(WriteCompleted)) == count, timeout=5.0)
    return OneDrop(a, b, session, dst, dropped, resent)


def test_a_loss_inside_a_flowcell_retires_its_ev_and_resends_only_that_psn() -> None:
    target = PSN0 + 5  # in the middle of the first flowcell
    src = bytes((i * 7 + (i >> 9)) & 0xFF for i in range(4 << 20))
    t = write_dropping_once(11, target, src, 1 << 20)
    assert t.dst == src
    assert t.b.session().stats.bytes_placed == len(src)
    (lost,) = t.dropped
    retired = t.a.events_of(PathRetired)
    assert [(e.ev, e.reason) for e in retired] == [(lost.ev, "loss")]
    assert [p.psn for p in t.resent] == [target]
    assert t.resent[0].ev != lost.ev
    assert t.session.stats.retransmits == 1
    assert t.session.stats.retransmits_by_cause["rack"] == 1


@pytest.mark.parametrize("lost_index", [4, 5], ids=["first-batch", "late-batch"])
def test_a_loss_in_either_batch_of_a_flowcell_resends_only_that_psn(lost_index: int) -> None:
    # 64 WRITE_WITH_IMMs of 8 KiB: each flowcell of 16 is FIRSTs then full LAST_IMMs (late).
    # PSN 1004 is a FIRST in the first batch, 1005 a LAST_IMM in the second: either one lost
    # is found by RACK from a packet that left after it, and nothing else is resent.
    src = bytes((i * 13 + (i >> 11)) & 0xFF for i in range(512 << 10))
    t = write_dropping_once(12, PSN0 + lost_index, src, 8 << 10)
    assert t.dst == src
    (lost,) = t.dropped
    assert lost.opcode is (Opcode.WRITE_FIRST if lost_index % 2 == 0 else Opcode.WRITE_LAST_IMM)
    assert [p.psn for p in t.resent] == [PSN0 + lost_index]
    assert t.session.stats.retransmits == 1
    assert t.session.stats.retransmits_by_cause["rack"] == 1
    assert [(e.ev, e.reason) for e in t.a.events_of(PathRetired)] == [(lost.ev, "loss")]


def test_a_flowcell_a_local_queue_refused_goes_again_at_once_on_another_plane() -> None:
    # t = 0.001: three flowcells of 4 leave on two planes; io reports that the first one's
    # plane refused it whole (ENOBUFS from a full qdisc): none of its packets left the host.
    pair = Pair(payload_mtu=1024, flowcell=4)
    pair.post(0, 12 * 1024)
    sender = pair.sa.sender
    assert sender is not None
    refused, *sent = data_transmits(pair.pull())
    for tx in sent:
        pair.a._send(tx)  # these two left the host
    assert [p.psn for p in packets(refused)] == [PSN0 + i for i in range(4)]
    pair.sa.transmit_failed(refused, pair.net.now)
    # The same pull-driven contract: the next pull resends the four, in PSN order, marked
    # RTX, on the other plane (the refusing one is full), and counts them as local drops.
    resent = data_transmits(pair.pull())
    assert [(p.psn, p.rtx) for t in resent for p in packets(t)] == [
        (PSN0 + i, True) for i in range(4)
    ]
    assert {t.plane for t in resent} == {1 - refused.plane}
    for tx in resent:
        pair.a._send(tx)
    assert pair.sa.stats.local_drops == 4
    assert pair.sa.stats.retransmits_by_cause == {"local": 4}
    # No path was blamed: the packets never reached one.
    assert pair.sa.paths.evs.state_of(refused.ev) is EvState.GOOD
    assert not pair.a.events_of(PathRetired)
    # A second report of the same transmit finds resent records and changes nothing.
    pair.sa.transmit_failed(refused, pair.net.now)
    assert pair.sa.stats.local_drops == 4 and not data_transmits(pair.pull())
    # And the resends complete the write.
    pair.net.drive(0.01)
    assert [e.msn for e in pair.a.events_of(WriteCompleted)] == [0]
    assert bytes(pair.dst[: 12 * 1024]) == pair.src[: 12 * 1024]


def test_an_ack_completes_every_message_up_to_its_msn_but_not_one_a_nack_failed() -> None:
    pair = Pair(payload_mtu=1024, flowcell=8)
    msns = [pair.post(1024 * i, 1024) for i in range(4)]  # four one-packet WRITEs
    txs = data_transmits(pair.pull())
    sender = pair.sa.sender
    assert sender is not None and msns == [0, 1, 2, 3]
    ev = txs[0].ev

    def answer(pkt: AckPacket | NackPacket) -> list[Event]:
        pair.sa.receive_datagrams(0, [(pkt.encode(), 0)], pair.net.now)
        return [e for e in iter(pair.sa.next_event, None) if isinstance(e, WriteCompleted)]

    qp = pair.sa.qpn
    # The responder says msn 1 failed (bad R_Key) before its AETH comes.
    neth = NETH(nack_reason=NackReason.BAD_RKEY, entropy=ev, nack_psn=PSN0 + 1, tx_timestamp=0)
    assert answer(NackPacket(dest_qp=qp, psn=PSN0 + 1, ev=ev, neth=neth)) == []
    # One ACK for msn 2 (cack_psn 1003): msn 0 and 2 are done, msn 1 waits for its own AETH,
    # and completions stay in MSN order, so only msn 0 is raised.
    ack = AETH(syndrome=Syndrome.ACK, msn=2)
    assert answer(AckPacket(dest_qp=qp, psn=PSN0 + 3, ev=ev, aeth=ack)) == [
        WriteCompleted(msn=0, status=0)
    ]
    # msn 1's NAK: it completes with the NACK's reason, and msn 2 after it.
    nak = AETH(syndrome=Syndrome.NAK_REMOTE_ACCESS, msn=1)
    assert answer(AckPacket(dest_qp=qp, psn=PSN0 + 3, ev=ev, aeth=nak)) == [
        WriteCompleted(msn=1, status=NackReason.BAD_RKEY),
        WriteCompleted(msn=2, status=0),
    ]
    assert [m.msn for m in sender.outstanding] == [3]

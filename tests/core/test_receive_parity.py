"""One receive path (docs/DESIGN.md §6): the same datagrams give the same outcome however they
arrive — one at a time or as UDP GRO reads (each in a buffer of its own, or one after another
in the same receive slot, as io's ring reuses them), on an unsecured or a secured connection.

A writer on host a and a responder on host b are connected in the simulator (handshake done at
t = 0.001); the story's datagrams are crafted by hand (as the writer's framer lays them out, and
on a secured connection sealed with the writer's own keys), handed to b's endpoint at one
`now`, and b's answers pulled once at the end. Every route ends in the receiver's one sequence
of checks, so placements, drops by reason and answers must be identical, and exactly these.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished
from mrc.core.secure.aead import TRAILER
from mrc.core.secure.handshake import Identity
from mrc.core.session import Session
from mrc.sim import LinkParams, Network
from mrc.wire.ack import NackReason, Syndrome
from mrc.wire.bth import A_BIT, TS_BIT, Opcode
from mrc.wire.fast import DATA_HEADER_IMM_NOEVX, DATA_HEADER_NOEVX
from mrc.wire.packet import AckPacket, DataPacket, NackPacket, SackPacket, decode_packet

MTU = 1024
A_KEY, B_KEY = b"\x01" * 32, b"\x02" * 32
HDR = 40  # BTH EVXH METH TSETH RETH, as the framer writes them


class Story:
    """a → b, one plane, `security` as given; b has one 16 KiB region."""

    def __init__(
        self, security: str, peers: list[bytes] | None = None, ev_encoding: str = "evxh"
    ) -> None:
        self.net = Network(seed=11)
        self.a, self.b = self.net.pair(1, LinkParams(latency=10e-6))
        if security != "none":
            a_pub, b_pub = Identity(A_KEY).public_key, Identity(B_KEY).public_key
            self.a.endpoint.identity = Identity(A_KEY, [b_pub], entropy=random.Random(1).randbytes)
            self.b.endpoint.identity = Identity(B_KEY, [a_pub], entropy=random.Random(2).randbytes)
        self.dst = bytearray(16 * 1024)
        self.region = self.b.regions.register(self.dst, peers=peers)
        cfg = SessionConfig(
            payload_mtu=MTU, initial_psn=4999, initial_msn=0xFFFF, security=security,
            cc="none", ev_encoding=ev_encoding,
        )  # fmt: skip
        self.b.listen(cfg)
        self.writer: Session = self.a.connect(self.b, cfg)
        self.net.drive(0.001)
        assert self.a.events_of(ConnectionEstablished)
        self.reader: Session = self.b.session()
        self.secured = security != "none"
        #: Flow-label EVs: data packets carry no EVXH; io hands the label in the TOS word.
        self.noevx = ev_encoding == "flowlabel"
        assert self.reader.noevx == self.noevx
        self.tos = 0x12345 << 8 if self.noevx else 0
        # The writer's own first WRITE (PSN 4999, MSN 0xFFFF: one byte into a spare region),
        # handed to b as io would (with the flow label), ends the responder's half-open start:
        # the story's reads take the path every later read takes, from PSN 5000 and MSN 0.
        spare = self.b.regions.register(bytearray(1))
        one = self.a.regions.register(bytearray(b"z"))
        self.writer.post_write(one, 0, 1, spare.base_va, spare.rkey)
        now = self.net.now
        data = [tx for tx in self.writer.datagrams_to_send(now) if tx.data[0] < 0xD0]
        reads = [
            (memoryview(bytearray(tx.data)), ("a", 0), self.tos, 0, len(tx.data)) for tx in data
        ]
        self.b.endpoint.receive_reads(0, reads, now)
        self.reader.datagrams_to_send(now)  # its answers (not delivered)
        assert spare.view[0] == ord("z") and not self.reader.half_open
        assert self.reader.receiver is not None and self.reader.receiver.cack == 5000
        self.placed_before = self.reader.stats.bytes_placed
        # What the handshake's traffic left counted (on a flow-label connection in the
        # simulator, one control packet without a label): the story's drops come after.
        self.before = dict(self.reader.stats.drops_by_reason)

    @property
    def hdr(self) -> int:
        """A data packet's headers as the framer writes them (without ImmDt)."""
        return HDR - 4 if self.noevx else HDR

    def frame(
        self, psn: int, payload: bytes, *, op: Opcode = Opcode.WRITE_ONLY, msn: int = 0,
        at: int = 0, dma: int | None = None, rkey: int | None = None, imm: int | None = None,
        ts: int = 100,
    ) -> bytes:  # fmt: skip
        """A data packet for b's region at offset `at` as the framer lays it out (without
        EVXH on a flow-label connection), sealed when the connection is."""
        rkey = self.region.rkey if rkey is None else rkey
        dma = len(payload) if dma is None else dma
        if self.noevx:
            fields = (
                op, 0, 0xFFFF, self.reader.qpn, A_BIT | TS_BIT | psn, 0, msn, ts,
                self.region.base_va + at, rkey, dma,
            )  # fmt: skip
            layout = DATA_HEADER_NOEVX if imm is None else DATA_HEADER_IMM_NOEVX
            data = layout.pack(*fields, *(() if imm is None else (imm,))) + payload
        else:
            data = DataPacket(
                opcode=op, dest_qp=self.reader.qpn, psn=psn, ev=0x77, a=True, rtx=False,
                rqmsn=0, msn=msn, tx_timestamp=ts, va=self.region.base_va + at, rkey=rkey,
                dma_length=dma, imm=imm, payload=payload,
            ).encode()  # fmt: skip
        if not self.secured:
            return data
        channel = self.writer.channel
        assert channel is not None
        hdr = len(data) - len(payload)
        buf = bytearray(len(data) + TRAILER)
        buf[:hdr] = data[:hdr]
        mv, protection = memoryview(buf), channel.protection
        first, second = protection.spans(mv, 0, hdr, len(data))
        protection.seal_into(mv, [(first, second, memoryview(payload), len(data))])
        return bytes(buf)

    def datagrams(self) -> list[list[bytes]]:
        """The story, as GRO would read it: runs of equal-size datagrams, each run possibly
        ended by one shorter datagram."""
        p = 5000
        full = [bytes([65 + i]) * MTU for i in range(4)]
        first = [
            self.frame(p, full[0], op=Opcode.WRITE_FIRST, dma=3 * MTU),  # good
            self.frame(p + 1, full[1], op=Opcode.WRITE_MIDDLE, at=MTU, dma=3 * MTU),  # good
            # A duplicate (on a secured connection a retransmission: its own counter).
            self.frame(p + 1, full[1], op=Opcode.WRITE_MIDDLE, at=MTU, dma=3 * MTU, ts=101),
            # Beyond the window (MPR 8 × 128 PSNs).
            self.frame(p + 2000, full[2], op=Opcode.WRITE_FIRST, dma=3 * MTU),
            self.frame(p + 3, full[3], msn=1, at=4 * MTU, rkey=self.region.rkey ^ 1),  # R_Key
            self.frame(p + 4, full[3], msn=2, at=15 * MTU + 1),  # out of bounds
            self.frame(p + 2, full[2], op=Opcode.WRITE_LAST, at=2 * MTU, dma=3 * MTU),  # good
            # Trimmed: a FIRST that lost its payload's tail (its trailer too when secured).
            self.frame(p + 5, full[0], op=Opcode.WRITE_FIRST, dma=2 * MTU)[: self.hdr + 20],
        ]
        imm = [self.frame(p + 6, b"i" * 100, op=Opcode.WRITE_ONLY_IMM, msn=3, at=8192, imm=9)]
        truncated = [self.frame(p + 7, b"t" * 100, msn=4, at=9000)[:20]]
        return [first, imm, truncated]

    def run(self, how: str) -> tuple[bytes, dict[str, int], list[tuple[object, ...]]]:
        """The story's datagrams handed over `how`: "single" (one datagram a read, bytes),
        "gro" (a GRO read each run, a writable buffer of its own) or "slot" (the same GRO
        reads, each into one receive slot io reuses, its own call, stale bytes after it)."""
        now = self.net.now
        reads: list[tuple[memoryview, tuple[str, int], int, int, int]] = []
        slot = memoryview(bytearray(b"\xee" * 16 * 1024))
        for run in self.datagrams():
            whole = b"".join(run)
            if how == "gro":
                # Writable, as io's receive buffer is: a secured read is opened in place.
                read = memoryview(bytearray(whole))
                reads.append((read, ("a", 0), self.tos, len(run[0]), len(read)))
            elif how == "slot":
                # One slot, read into again and again: the views kept of it (aead.py) must
                # follow each read's own layout.
                slot[: len(whole)] = whole
                read5 = (slot, ("a", 0), self.tos, len(run[0]), len(whole))
                self.b.endpoint.receive_reads(0, [read5], now)
            else:  # bytes, as the simulator hands datagrams: the gate opens a copy
                reads += [(memoryview(d), ("a", 0), self.tos, 0, len(d)) for d in run]
        self.b.endpoint.receive_reads(0, reads, now)
        answers = [self.summary(tx.data) for tx in self.reader.datagrams_to_send(now)]
        drops = {
            k: n - self.before.get(k, 0)
            for k, n in self.reader.stats.drops_by_reason.items()
            if n != self.before.get(k, 0)
        }
        return bytes(self.dst), drops, answers

    def summary(self, data: bytes) -> tuple[object, ...]:
        pkt = decode_packet(data[: len(data) - TRAILER] if self.secured else data)
        if isinstance(pkt, SackPacket):
            return ("sack", pkt.cack_psn, pkt.seth.sack_offset, pkt.seth.sack_bitmap)
        if isinstance(pkt, NackPacket):
            # With the EV the NACKed packet came on (its EVXH's, or its flow label's).
            assert pkt.neth.entropy == (0x12345 if self.noevx else 0x77)
            return ("nack", pkt.neth.nack_reason, pkt.neth.nack_psn, pkt.neth.tx_timestamp)
        assert isinstance(pkt, AckPacket)
        return ("ack", pkt.aeth.syndrome, pkt.aeth.msn, pkt.psn)


def outcomes() -> Iterator[tuple[str, bool, str]]:
    for security in ("none", "auth", "encrypt"):
        for how in ("single", "gro", "slot"):
            for ev_encoding in ("evxh", "flowlabel"):
                yield security, how, ev_encoding


@pytest.mark.parametrize(("security", "how", "ev_encoding"), list(outcomes()))
def test_one_story_singly_and_as_gro_reads_secured_and_not_ends_the_same(
    security: str, how: str, ev_encoding: str
) -> None:
    story = Story(security, ev_encoding=ev_encoding)
    dst, drops, answers = story.run(how)
    # Placed: the three-packet WRITE and the ImmDt one, nothing else.
    expected = bytearray(16 * 1024)
    expected[: 3 * MTU] = b"A" * MTU + b"B" * MTU + b"C" * MTU
    expected[8192 : 8192 + 100] = b"i" * 100
    assert dst == expected
    assert story.reader.stats.bytes_placed - story.placed_before == 3 * MTU + 100
    assert drops == {
        "duplicate": 1,
        "out_of_window": 1,
        "bad_rkey": 1,
        "out_of_bounds": 1,
        "decode_length": 1,
    }
    assert story.reader.stats.trimmed_received == 1
    receiver = story.reader.receiver
    assert receiver is not None and receiver.cack == 5005  # 5005 came trimmed, 5007 truncated
    # 4992..5004 before cack_psn, 5005 missing (trimmed), 5006 received.
    sack_bitmap = ((1 << 13) - 1) << 51 | 1 << 49
    assert answers == [
        # At once, as each came: the NACKs.
        ("nack", NackReason.PSN_OOR_WINDOW, 7000, 100),
        ("nack", NackReason.TRIMMED, 5005, 100),
        # At the pull, cack_psn passes each message's LAST in order: the good WRITE's ACK,
        # then the two failed ones, with one reason whatever the cause (remote access error).
        ("ack", 0x1F, 0, 5004),
        ("ack", Syndrome.NAK_REMOTE_ACCESS, 1, 5004),
        ("ack", Syndrome.NAK_REMOTE_ACCESS, 2, 5005),
        # One SACK for the block: the duplicate's (sent at this pull) stands for it.
        ("sack", 5005, -13, sack_bitmap),
    ]


@pytest.mark.parametrize(
    ("security", "named", "placed"),
    [
        ("auth", "writer", True),
        ("encrypt", "other", False),
        ("auth", "nobody", False),
        ("none", "writer", False),  # an unsecured connection proves no key
    ],
)
def test_a_region_scoped_to_peers_takes_writes_only_from_their_connections(
    security: str, named: str, placed: bool
) -> None:
    """docs/DESIGN.md §6: a region registered for named peers (their static keys) refuses a
    WRITE from any other connection with the one remote access error."""
    keys = {"writer": [Identity(A_KEY).public_key], "other": [bytes(range(32))], "nobody": []}
    story = Story(security, peers=keys[named])
    write = story.frame(5000, b"w" * 100, msn=0, at=512)
    read = (memoryview(write), ("a", 0), 0, 0, len(write))
    story.b.endpoint.receive_reads(0, [read], story.net.now)
    answers = [story.summary(tx.data) for tx in story.reader.datagrams_to_send(story.net.now)]
    if placed:
        assert story.dst[512:612] == b"w" * 100
        assert story.reader.stats.bytes_placed - story.placed_before == 100
        assert answers == [("ack", 0x1F, 0, 5001)]
    else:
        assert story.dst.count(0) == len(story.dst)
        assert story.reader.stats.drops_by_reason == {"not_permitted": 1}
        acks = [a for a in answers if a[0] == "ack"]
        assert acks == [("ack", Syndrome.NAK_REMOTE_ACCESS, 0, 5001)]


@pytest.mark.parametrize("security", ["auth", "encrypt"])
@pytest.mark.parametrize("ev_encoding", ["evxh", "flowlabel"])
def test_a_packet_failing_its_tag_inside_a_gro_read_costs_only_itself(
    security: str, ev_encoding: str
) -> None:
    """docs/DESIGN.md §8: a secured read's full-size packets are opened where they lie and each
    run that opened is placed; the one whose tag fails is counted `auth` and skipped, and the
    packets before and after it in the same read are placed as if it were not there."""
    story = Story(security, ev_encoding=ev_encoding)
    p, dma = 5000, 5 * MTU
    read = [
        story.frame(p, b"A" * MTU, op=Opcode.WRITE_FIRST, dma=dma),
        story.frame(p + 1, b"B" * MTU, op=Opcode.WRITE_MIDDLE, at=MTU, dma=dma),
        story.frame(p + 2, b"C" * MTU, op=Opcode.WRITE_MIDDLE, at=2 * MTU, dma=dma),
        story.frame(p + 3, b"D" * MTU, op=Opcode.WRITE_MIDDLE, at=3 * MTU, dma=dma),
    ]
    forged = bytearray(read[1])
    forged[-1] ^= 1  # the tag's last bit
    read[1] = bytes(forged)
    received = story.reader.stats.plane(0).packets_received
    buf = memoryview(bytearray(b"".join(read)))
    gro = (buf, ("a", 0), story.tos, len(read[0]), len(buf))
    story.b.endpoint.receive_reads(0, [gro], story.net.now)
    assert bytes(story.dst[: 4 * MTU]) == b"A" * MTU + bytes(MTU) + b"C" * MTU + b"D" * MTU
    assert story.reader.stats.bytes_placed - story.placed_before == 3 * MTU
    assert story.reader.stats.plane(0).packets_received - received == 4
    drops = {
        k: n - story.before.get(k, 0)
        for k, n in story.reader.stats.drops_by_reason.items()
        if n != story.before.get(k, 0)
    }
    assert drops == {"auth": 1}
    story.reader.datagrams_to_send(story.net.now)  # the pull moves cack_psn
    receiver = story.reader.receiver
    assert receiver is not None and receiver.cack == 5001  # 5001 missing, 5002-5003 held


@pytest.mark.parametrize("security", ["auth", "encrypt"])
def test_a_receive_slot_read_into_again_opens_each_reads_own_packets(security: str) -> None:
    """aead.py keeps the views it opens a receive slot's packets through from read to read (io
    reads into the same ring of slots again and again): a second read into the slot, new
    packets at the same offsets and stale bytes after them, is opened and placed as its own,
    and a replay of the first read's bytes into the slot places nothing."""
    story = Story(security)
    dma = 6 * MTU
    slot = memoryview(bytearray(b"\xee" * 8 * 1024))

    def read_into_slot(psn: int, letters: bytes, op: Opcode) -> bytes:
        packets = [
            story.frame(psn + i, bytes([c]) * MTU, op=op if i == 0 else Opcode.WRITE_MIDDLE,
                        at=(psn - 5000 + i) * MTU, dma=dma)
            for i, c in enumerate(letters)
        ]  # fmt: skip
        whole = b"".join(packets)
        slot[: len(whole)] = whole
        read = (slot, ("a", 0), story.tos, len(packets[0]), len(whole))
        story.b.endpoint.receive_reads(0, [read], story.net.now)
        return whole

    first = read_into_slot(5000, b"ABC", Opcode.WRITE_FIRST)
    read_into_slot(5003, b"DE", Opcode.WRITE_MIDDLE)  # offsets 0 and 1 again, stale 2 after
    assert bytes(story.dst[: 5 * MTU]) == b"".join(bytes([c]) * MTU for c in b"ABCDE")
    slot[: len(first)] = first  # the first read's bytes again, in the same slot
    read = (slot, ("a", 0), story.tos, len(first) // 3, len(first))
    story.b.endpoint.receive_reads(0, [read], story.net.now)
    assert story.reader.stats.bytes_placed - story.placed_before == 5 * MTU
    drops = {
        k: n - story.before.get(k, 0)
        for k, n in story.reader.stats.drops_by_reason.items()
        if n != story.before.get(k, 0)
    }
    assert drops == {"replay": 3}

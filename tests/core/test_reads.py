"""Reads as io hands them to the core (`Endpoint.receive_reads`): a GRO batch stays whole, and
each run of its datagrams for one session is placed where it lies (docs/DESIGN.md §2-§3).

Two writers on host a post to host b over a simulated pair; their data packets are taken
from the writers' pulls and handed to b's endpoint by hand, as one read of equal-size
segments, the way the kernel's UDP GRO would merge datagrams of one 5-tuple.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished
from mrc.core.session import Session
from mrc.sim import LinkParams, Network
from mrc.wire.bth import DATA_OPCODES

REPLY = struct.Struct(">QI")
MTU = 1024
SEG = MTU + 40  # BTH EVXH METH TSETH RETH and a full payload


class Writers:
    """Two sessions from a to b (same planes, same addresses), handshakes done at t = 0.001."""

    def __init__(self) -> None:
        self.net = Network(seed=7)
        self.a, self.b = self.net.pair(1, LinkParams(latency=10e-6))
        self.dst = bytearray(1 << 16)
        region = self.b.regions.register(self.dst)
        self.src = bytes((i * 13 + 5) & 0xFF for i in range(16 * MTU))
        self.src_region = self.a.regions.register(bytearray(self.src))
        cfg = SessionConfig(plane_mask=0b1, payload_mtu=MTU, flowcell=8, cc="none")
        self.b.listen(cfg, accept=lambda _: REPLY.pack(region.base_va, region.rkey))
        self.writers: list[Session] = [self.a.connect(self.b, cfg) for _ in range(2)]
        self.net.drive(0.001)
        assert len(self.a.events_of(ConnectionEstablished)) == 2
        self.base_va, self.rkey = region.base_va, region.rkey

    def segments(self, k: int) -> list[bytes]:
        """Writer k's 8 data packets (8 KiB into its own half of b's region), not sent."""
        s = self.writers[k]
        s.post_write(self.src_region, k * 8 * MTU, 8 * MTU, self.base_va + k * 8 * MTU, self.rkey)
        out = []
        for tx in s.datagrams_to_send(self.net.now):
            if tx.data[0] in DATA_OPCODES:
                assert tx.segment_size == SEG
                out += [tx.data[i : i + SEG] for i in range(0, len(tx.data), SEG)]
        assert len(out) == 8
        return out

    def responders(self) -> list[Session]:
        by_peer = {s.peer_qpn: s for s in self.b.endpoint.sessions.values()}
        return [by_peer[w.qpn] for w in self.writers]


def test_a_read_holding_two_qps_and_junk_places_each_run_for_its_own_session() -> None:
    w = Writers()
    first, second = w.segments(0), w.segments(1)
    junk = b"\xff" * SEG  # DestQP 0xFFFFFF: nobody's
    read = b"".join([*first[:3], *second, junk, *first[3:]]) + b"\x01\x02\x03"
    one, two = w.responders()
    before = {s: s.stats.plane(0).packets_received for s in (one, two)}  # their REQUESTs
    reads = [(memoryview(read), ("a", 0), 0, SEG, len(read)), (memoryview(b""), ("a", 0), 0, 0, 0)]
    sessions = w.b.endpoint.receive_reads(0, reads, w.net.now)
    # t = +0: both sessions got their runs (in first-seen order), the junk, the 3-byte tail
    # and an empty datagram were counted, and every payload byte is in place.
    assert sessions == [one, two]
    assert w.b.endpoint.drops == {"unknown_qp": 1, "decode_length": 2}
    assert one.stats.bytes_placed == two.stats.bytes_placed == 8 * MTU
    assert [s.stats.plane(0).packets_received - n for s, n in before.items()] == [8, 8]
    assert bytes(w.dst[: 16 * MTU]) == w.src
    assert one.receiver is not None and two.receiver is not None
    for s in (one, two):
        s.datagrams_to_send(w.net.now)  # the batch ends: cack_psn moves, SACKs go out
    assert one.receiver.cack == w.writers[0].initial_psn + 8
    assert two.receiver.cack == w.writers[1].initial_psn + 8


def both_ways(edit: Callable[[list[bytes]], None]) -> tuple[Writers, list[tuple[object, ...]]]:
    """Writer 0's 8 data packets, changed by `edit`, handed to b as one read and, on a fresh
    pair, one datagram at a time: per way, b's region, bytes placed, drops and answers."""
    results: list[tuple[object, ...]] = []
    for whole in (True, False):
        w = Writers()
        segs = w.segments(0)
        edit(segs)
        if whole:
            whole = b"".join(segs)
            reads = [(memoryview(whole), ("a", 0), 0, SEG, len(whole))]
            w.b.endpoint.receive_reads(0, reads, w.net.now)
        else:
            w.b.endpoint.receive_datagrams(0, [(s, ("a", 0), 0) for s in segs], w.net.now)
        rs = w.responders()[0]
        rs_out = [tx.data for tx in rs.datagrams_to_send(w.net.now)]
        results.append((bytes(w.dst), rs.stats.bytes_placed,
                        dict(rs.stats.drops_by_reason), rs_out))  # fmt: skip
    return w, results


def test_a_read_and_the_same_datagrams_one_by_one_end_alike() -> None:
    # A duplicate in the middle leaves the byte path for the decoder (no write, a SACK).
    w, results = both_ways(lambda segs: segs.insert(4, segs[2]))
    assert results[0] == results[1]
    dst, count, drops, _ = results[0]
    assert dst == w.src[: 8 * MTU] + bytes(len(w.dst) - 8 * MTU)
    assert count == 8 * MTU and drops == {"duplicate": 1}


def test_a_forged_va_in_a_read_is_refused_as_it_is_one_by_one() -> None:
    """The byte path reads a whole read's headers in one unpack (`data_headers`); a VA far
    outside the region (its top bit set) is refused there as it is one datagram at a time."""

    def forge(segs: list[bytes]) -> None:
        forged = bytearray(segs[5])
        forged[24:32] = ((1 << 64) - 4 * MTU).to_bytes(8, "big")  # RETH.VA
        segs[5] = bytes(forged)

    w, results = both_ways(forge)
    assert results[0] == results[1]
    dst, count, drops, _ = results[0]
    # The message failed whole from its forged packet on: the 5 packets before it were
    # written, nothing after, and nothing outside the message's own bytes.
    assert drops == {"out_of_bounds": 1, "message_failed": 2}
    assert count == 5 * MTU and dst == w.src[: 5 * MTU] + bytes(len(w.dst) - 5 * MTU)

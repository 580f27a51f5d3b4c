"""The sender's framing: data packets as bytes, one packet or one flowcell per `Transmit`.

A flowcell is a run of consecutive new packets that goes out on one EV (docs/DESIGN.md §11)
as one UDP GSO batch: every segment is `segment_size` bytes except possibly a shorter last
one, at most `flowcell_limit` of them. When its packets differ in header size, not payload
(the full LAST_IMM of each small WRITE_WITH_IMM among the FIRSTs of the next ones), it goes
out as two batches, one per size, each in PSN order; its send record says which packets left
in the second (`SentCell.late`). This module holds the size rules (`packet_size`,
`flowcell_limit`), `cut_flowcell`, which takes the next flowcell's packets from the pending
messages as runs (a message's packets in one tuple, not one tuple a packet), and `Framer`,
which writes each packet's headers with the precompiled layouts of `mrc.wire.fast` (every
packet carries the flowcell's EV in its EVXH, or, on a connection that agreed on flow
labels, no EVXH: io puts the EV in each datagram's flow label), slices its payload from the
message's source, joins the lot once per `Transmit`, and counts it in the plane's stats.

On a secured connection (`protection` set) a `Transmit`'s packets are framed into one buffer
the framer keeps (allocated once, not zeroed per batch), sealed there in place (aead.py: every
segment gets its own counter and trailer, so `segment_size` includes the trailer and GSO still
cuts the batch into whole packets), and copied out once as the `Transmit`'s bytes.

What it leaves to the sender (sender.py): on which EV, how many packets the window allows,
and their send records.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Final

from ...wire.bth import A_BIT, EVX_BIT, RTX_BIT, TS_BIT
from ...wire.fast import (
    DATA_HEADER,
    DATA_HEADER_IMM,
    DATA_HEADER_IMM_NOEVX,
    DATA_HEADER_NOEVX,
    OP_FIRST,
    OP_LAST,
    OP_LAST_IMM,
    OP_MIDDLE,
    OP_ONLY,
    OP_ONLY_IMM,
)
from ..config import SessionConfig
from ..paths.planes import ev_plane
from ..secure.aead import TRAILER, PacketProtection
from ..stats import SessionStats
from ..transmit import Addr, Transmit
from .records import PSN_MASK, CellRun, OutMessage, tx_timestamp

#: The most bytes one UDP datagram (and so one GSO call) carries over IPv4.
MAX_GSO_BYTES: Final = 65507
#: The kernel's cap on segments per GSO call (UDP_MAX_SEGMENTS).
MAX_GSO_SEGMENTS: Final = 64
#: Header bytes of a data packet, without and with ImmDt (BTH EVXH METH TSETH RETH [ImmDt]).
HEADER: Final = DATA_HEADER.size
HEADER_IMM: Final = DATA_HEADER_IMM.size

#: Bytes an EVXH adds; left out when the EV rides in the flow label.
EVXH_SIZE: Final = 4
_PACK_NOEVX: Final = DATA_HEADER_NOEVX.pack
_PACK_IMM_NOEVX: Final = DATA_HEADER_IMM_NOEVX.pack
_PACK_INTO_NOEVX: Final = DATA_HEADER_NOEVX.pack_into
_PACK_INTO_IMM_NOEVX: Final = DATA_HEADER_IMM_NOEVX.pack_into


# The layouts without EVXH, called like the ones with it (the EV argument is dropped; the
# framer clears BTH.EVX in `w4` itself), so one framing loop serves both. Arguments are
# `object`: compiled, the framer hands over values it boxed once per batch, and nothing here
# unboxes them only to box them again.
def _pack_noevx(op: object, b1: object, p_key: object, w4: object, w8: object, ev: object,
                rqmsn: object, msn: object, ts: object, va: object, rkey: object,
                dma: object) -> bytes:  # fmt: skip
    return _PACK_NOEVX(op, b1, p_key, w4, w8, rqmsn, msn, ts, va, rkey, dma)


def _pack_imm_noevx(op: object, b1: object, p_key: object, w4: object, w8: object, ev: object,
                    rqmsn: object, msn: object, ts: object, va: object, rkey: object,
                    dma: object, imm: object) -> bytes:  # fmt: skip
    return _PACK_IMM_NOEVX(op, b1, p_key, w4, w8, rqmsn, msn, ts, va, rkey, dma, imm)


def _pack_into_noevx(buf: bytearray, off: int, op: object, b1: object, p_key: object,
                     w4: object, w8: object, ev: object, rqmsn: object, msn: object, ts: object,
                     va: object, rkey: object, dma: object) -> None:  # fmt: skip
    _PACK_INTO_NOEVX(buf, off, op, b1, p_key, w4, w8, rqmsn, msn, ts, va, rkey, dma)


def _pack_into_imm_noevx(buf: bytearray, off: int, op: object, b1: object, p_key: object,
                         w4: object, w8: object, ev: object, rqmsn: object, msn: object,
                         ts: object, va: object, rkey: object, dma: object,
                         imm: object) -> None:  # fmt: skip
    _PACK_INTO_IMM_NOEVX(buf, off, op, b1, p_key, w4, w8, rqmsn, msn, ts, va, rkey, dma, imm)


def flowcell_limit(flowcell: int, segment_size: int) -> int:
    """Packets in one flowcell of `segment_size`-byte segments: min(flowcell, 65507 // size, 64)."""
    # Two-argument min and max: compiled, those are C; a three-argument one is a builtins call.
    return max(1, min(min(flowcell, MAX_GSO_BYTES // segment_size), MAX_GSO_SEGMENTS))


def packet_size(msg: OutMessage, index: int, mtu: int) -> int:
    """UDP payload bytes of packet `index` of `msg`: its headers and its payload
    (docs/WIRE.md §3)."""
    if index == msg.npkts - 1:
        payload = len(msg.src) - index * mtu
        return payload + (HEADER if msg.imm is None else HEADER_IMM)
    return mtu + HEADER


def cut_flowcell(
    pending: deque[OutMessage], psn: int, limit: int, mtu: int
) -> tuple[list[CellRun], int, int]:
    """The next flowcell of at most `limit` packets from the messages `pending`, PSNs from
    `psn`: its runs, how many packets, and which of them leave late (bit i for packet i).
    Each message taken whole leaves `pending`; each message records its first and last PSN
    as they are given.

    GSO cuts a batch into segments of its first one's size, only the last one shorter. So
    every packet with a full payload joins, and those whose headers make them another size
    than the flowcell's first (a full LAST_IMM is 4 bytes longer than a FIRST or MIDDLE,
    docs/WIRE.md §3) are `late`: they leave as a second batch, after the first. A packet
    with a shorter payload (a message's short LAST) ends the flowcell as the first batch's
    last segment, or starts the next flowcell if it is longer than the first packet (a
    LAST_IMM up to 3 bytes short of full)."""
    runs: list[CellRun] = []
    n = late = 0
    size = packet_size(pending[0], pending[0].sent, mtu)
    body = mtu + HEADER  # every packet of a message but its LAST
    while True:
        msg = pending[0]
        index = msg.sent
        lastix = msg.npkts - 1
        take = min(limit - n, msg.npkts - index)
        ends = False
        if index + take > lastix:  # the run holds the message's LAST (`packet_size`, inline)
            payload = len(msg.src) - lastix * mtu
            tail = payload + (HEADER if msg.imm is None else HEADER_IMM)
            if payload < mtu:
                ends = True
                if tail > size:
                    take -= 1
            elif tail != size:
                late |= 1 << (n + take - 1)
        if take:
            if body != size:
                # The run's packets before its message's LAST.
                late |= ((1 << min(take, lastix - index)) - 1) << n
            if index == 0:
                msg.first_psn = psn
            msg.sent = index + take
            psn = (psn + take) & PSN_MASK
            if msg.sent == msg.npkts:
                msg.last_psn = (psn - 1) & PSN_MASK
                pending.popleft()
            runs.append((msg, index, take))
            n += take
        if ends or n == limit or not pending:
            return runs, n, late


def _run_fields(msg: OutMessage) -> tuple[memoryview, object, int, object, object, int]:
    """What every packet of a run of `msg` carries, read once a run: its source, its length,
    remote VA and MSN, R_Key and last packet's index (the length, MSN and R_Key boxed once
    as objects: compiled, an `int` handed to `struct.pack` is boxed at every call)."""
    src = msg.src
    return src, len(src), msg.remote_va, msg.msn, msg.rkey, msg.npkts - 1


class Framer:
    """Writes data packets for one session's sender."""

    def __init__(
        self, config: SessionConfig, *, stats: SessionStats, peer_addrs: dict[int, Addr],
        protection: PacketProtection | None = None,
    ) -> None:  # fmt: skip
        self.mtu = config.payload_mtu
        self.p_key = config.p_key
        self.stats = stats
        self.peer_addrs = peer_addrs
        #: A secured connection's keys: packets are sealed as they are framed.
        self.protection = protection
        #: The buffer secured packets are framed and sealed in (`_frame_sealed`), a view of
        #: it, and the views `PacketProtection.spans` gives for a full-size packet at each
        #: multiple of its size: a bulk batch is full-size packets from offset 0, so its
        #: packets are sealed through views made once, not two slices each.
        self._stage = bytearray(0)
        self._stage_view = memoryview(self._stage)
        self._grid: list[tuple[memoryview, memoryview]] = []
        # EVs in the flow label (agreed in CM): headers without EVXH, 4 bytes shorter.
        noevx = config.ev_encoding == "flowlabel"
        self._pack = _pack_noevx if noevx else DATA_HEADER.pack
        self._pack_imm = _pack_imm_noevx if noevx else DATA_HEADER_IMM.pack
        self._pack_into = _pack_into_noevx if noevx else DATA_HEADER.pack_into
        self._pack_into_imm = _pack_into_imm_noevx if noevx else DATA_HEADER_IMM.pack_into
        #: Bytes each packet is shorter than `packet_size` says (no EVXH).
        self.shrink = EVXH_SIZE if noevx else 0
        #: BTH.EVX as the headers carry it: clear without EVXH.
        self._evx = 0 if noevx else EVX_BIT

    @property
    def overhead(self) -> int:
        """Bytes every packet carries beyond `packet_size`: the trailer when secured, less the
        EVXH when the EV rides in the flow label."""
        return (0 if self.protection is None else TRAILER) - self.shrink

    def frame(
        self,
        out: list[Transmit],
        runs: Sequence[CellRun],
        n: int,
        psn: int,
        ev: int,
        now: float,
        *,
        dest_qp: int,
        rqmsn: int,
        rtx: bool = False,
        late: int = 0,
    ) -> None:
        """Append to `out` the `Transmit` of the `n` packets of `runs`, PSNs from `psn`, all on
        `ev`: one, in PSN order, and a second one of the packets in `late` (bit i for packet
        i) if any.

        The caller keeps to the flowcell rules (`cut_flowcell`): in each transmit no packet
        longer than its first, only the last one shorter, at most `flowcell_limit` packets.
        With more than one packet a transmit's `segment_size` is its first packet's size.
        """
        if self.protection is not None:
            self._frame_sealed(
                out, runs, n, psn, ev, now, dest_qp=dest_qp, rqmsn=rqmsn, rtx=rtx, late=late
            )
            return
        mtu = self.mtu
        flags = TS_BIT | RTX_BIT if rtx else TS_BIT
        # Compiled, an int passed to `struct.pack` is boxed at every call: the fields that
        # stay the same for the batch (or the message) are boxed once, as `object`s.
        p_key: object = self.p_key
        w4: object = self._evx | dest_qp
        ev_o: object = ev
        rqmsn_o: object = rqmsn
        ts: object = tx_timestamp(now)
        pack = self._pack
        pack_imm = self._pack_imm
        # Compiled, `parts.append` is a C call; a bound method kept in a local would not be.
        parts: list[bytes | memoryview] = []
        # The late packets' parts: a run's packets before its LAST share one size, so each
        # run picks a list for them and one for its LAST.
        later: list[bytes | memoryview] = [] if late else parts
        i = 0
        for msg, first, count in runs:
            src, dma, base_va, msn, rkey, last = _run_fields(msg)
            body = later if late >> i & 1 else parts
            tail = later if late >> (i + count - 1) & 1 else parts
            i += count
            for index in range(first, first + count):
                off = index * mtu
                va = base_va + off
                if index == last:
                    imm = msg.imm
                    w8 = flags | A_BIT | psn
                    if imm is None:
                        op = OP_LAST if index else OP_ONLY
                        tail.append(
                            pack(op, 0, p_key, w4, w8, ev_o, rqmsn_o, msn, ts, va, rkey, dma)
                        )
                    else:
                        op = OP_LAST_IMM if index else OP_ONLY_IMM
                        tail.append(
                            pack_imm(
                                op, 0, p_key, w4, w8, ev_o, rqmsn_o, msn, ts, va, rkey, dma, imm
                            )
                        )
                    tail.append(src[off:])
                else:
                    op = OP_MIDDLE if index else OP_FIRST
                    body.append(
                        pack(op, 0, p_key, w4, flags | psn, ev_o, rqmsn_o, msn, ts, va, rkey, dma)
                    )
                    body.append(src[off : off + mtu])
                psn = (psn + 1) & PSN_MASK
        plane = ev_plane(ev)
        ps = self.stats.plane(plane)
        ps.packets_sent += n
        addr = self.peer_addrs[plane]
        for batch in (parts, later) if late else (parts,):
            data = b"".join(batch)
            ps.bytes_sent += len(data)
            segment_size = len(batch[0]) + len(batch[1]) if len(batch) > 2 else None
            out.append(
                Transmit(plane=plane, addr=addr, data=data, ev=ev, segment_size=segment_size)
            )

    def _frame_sealed(
        self,
        out: list[Transmit],
        runs: Sequence[CellRun],
        n: int,
        psn: int,
        ev: int,
        now: float,
        *,
        dest_qp: int,
        rqmsn: int,
        rtx: bool,
        late: int,
    ) -> None:
        """`frame` for a secured connection: headers, payload and trailer of every packet
        written into one buffer, each packet sealed where it lies (docs/WIRE.md §7)."""
        protection = self.protection
        assert protection is not None
        mtu = self.mtu
        flags = TS_BIT | RTX_BIT if rtx else TS_BIT
        # Boxed once, as in `frame`.
        p_key: object = self.p_key
        w4: object = self._evx | dest_qp
        ev_o: object = ev
        rqmsn_o: object = rqmsn
        ts: object = tx_timestamp(now)
        # Every packet but a message's last is a full one: its size needs no lookup.
        shrink = self.shrink
        full = HEADER - shrink + mtu + TRAILER
        hdr, hdr_imm = HEADER - shrink, HEADER_IMM - shrink
        # Framed in a buffer kept from call to call (no allocation and zeroing per batch);
        # every byte up to `start` is written below, so nothing of an earlier batch is sent.
        # It holds the whole call before the first packet (none is longer than a full one
        # with ImmDt), so no view made below outlives its buffer.
        need = n * (full + HEADER_IMM - HEADER)
        if need > len(self._stage):
            self._grow(need, full, protection)
        buf, mv = self._stage, self._stage_view
        grid = self._grid
        spans = protection.spans
        packets: list[tuple[memoryview, memoryview, memoryview, int]] = []
        pack = self._pack_into
        pack_imm = self._pack_into_imm
        start = 0
        for msg, first, count in runs:
            src, dma, base_va, msn, rkey, last = _run_fields(msg)
            for index in range(first, first + count):
                off = index * mtu
                if index == last:
                    size = packet_size(msg, index, mtu) + TRAILER - shrink
                    end = start + size - TRAILER
                    imm = msg.imm
                    w8 = flags | A_BIT | psn
                    if imm is None:
                        op = OP_LAST if index else OP_ONLY
                        pack(buf, start, op, 0, p_key, w4, w8, ev_o, rqmsn_o, msn, ts,
                             base_va + off, rkey, dma)  # fmt: skip
                        views = spans(mv, start, start + hdr, end)
                    else:
                        op = OP_LAST_IMM if index else OP_ONLY_IMM
                        pack_imm(
                            buf, start, op, 0, p_key, w4, w8, ev_o, rqmsn_o, msn, ts,
                            base_va + off, rkey, dma, imm,
                        )  # fmt: skip
                        views = spans(mv, start, start + hdr_imm, end)
                    packets.append((views[0], views[1], src[off:], end))
                else:
                    size = full
                    end = start + full - TRAILER
                    op = OP_MIDDLE if index else OP_FIRST
                    pack(buf, start, op, 0, p_key, w4, flags | psn, ev_o, rqmsn_o, msn, ts,
                         base_va + off, rkey, dma)  # fmt: skip
                    k = start // full
                    views = grid[k] if k * full == start else spans(mv, start, start + hdr, end)
                    packets.append((views[0], views[1], src[off : off + mtu], end))
                start += size
                psn = (psn + 1) & PSN_MASK
        protection.seal_into(mv, packets)
        plane = ev_plane(ev)
        ps = self.stats.plane(plane)
        ps.packets_sent += n
        ps.bytes_sent += start
        addr = self.peer_addrs[plane]
        if not late:
            out.append(
                Transmit(
                    plane=plane,
                    addr=addr,
                    data=bytes(mv[:start]),
                    ev=ev,
                    segment_size=packets[0][3] + TRAILER if n > 1 else None,
                )
            )
            return
        # Two batches (`frame`): packet i's bytes run from its start (the end of the one
        # before, with its trailer) to the next one's.
        starts = [0]
        starts.extend(p[3] + TRAILER for p in packets)
        batches: tuple[list[memoryview], list[memoryview]] = ([], [])
        for i in range(n):
            batches[late >> i & 1].append(mv[starts[i] : starts[i + 1]])
        for batch in batches:
            segment_size = len(batch[0]) if len(batch) > 1 else None
            data = b"".join(batch)
            out.append(
                Transmit(plane=plane, addr=addr, data=data, ev=ev, segment_size=segment_size)
            )

    def _grow(self, size: int, full: int, protection: PacketProtection) -> None:
        """A framing buffer of at least `size` bytes (the largest GSO batch, the first time),
        its view, and the sealing views of a full-size packet (`full` bytes) at each multiple
        of `full` in it."""
        buf = self._stage = bytearray(max(size, MAX_GSO_BYTES))
        mv = self._stage_view = memoryview(buf)
        body = full - self.mtu - TRAILER  # the headers of a full-size packet
        self._grid = [
            protection.spans(mv, k, k + body, k + full - TRAILER)
            for k in range(0, len(buf) - full + 1, full)
        ]

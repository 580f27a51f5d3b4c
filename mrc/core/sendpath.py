"""The sender's framing: data packets as bytes, one packet or one flowcell per `Transmit`.

A flowcell is a run of consecutive new packets that goes out on one EV as one UDP GSO batch
(docs/DESIGN.md §11): every segment is `segment_size` bytes except possibly a shorter last one, and
there are at most `flowcell_limit(flowcell, segment_size)` of them. This module holds the size
rules (`packet_size`, `flowcell_limit`) and `Framer`, which writes each packet's headers with
the precompiled layouts of `mrc.wire.packet` (every packet carries the flowcell's EV in its
EVXH), slices its payload from the message's source, joins the lot once per `Transmit`, and
counts it in the plane's stats.

On a secured connection (`protection` set) a `Transmit`'s packets are framed into one buffer
the framer keeps (allocated once, not zeroed per batch), sealed there in place (aead.py: every
segment gets its own counter and trailer, so `segment_size` includes the trailer and GSO still
cuts the batch into whole packets), and copied out once as the `Transmit`'s bytes.

What it leaves to the sender (sender.py): which packets go, on which EV, whether the window
allows each of them, and their send records.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..wire.bth import A_BIT, EVX_BIT, RTX_BIT, TS_BIT, Opcode
from ..wire.packet import DATA_HEADER, DATA_HEADER_IMM
from .aead import TRAILER, PacketProtection
from .config import SessionConfig
from .paths import ev_plane
from .records import OutMessage, tx_timestamp
from .stats import SessionStats
from .transmit import Addr, Transmit

#: The most bytes one UDP datagram (and so one GSO call) carries over IPv4.
MAX_GSO_BYTES = 65507
#: The kernel's cap on segments per GSO call (UDP_MAX_SEGMENTS).
MAX_GSO_SEGMENTS = 64
#: Header bytes of a data packet, without and with ImmDt (BTH EVXH METH TSETH RETH [ImmDt]).
HEADER = DATA_HEADER.size
HEADER_IMM = DATA_HEADER_IMM.size

_FIRST = int(Opcode.WRITE_FIRST)
_MIDDLE = int(Opcode.WRITE_MIDDLE)
_LAST = int(Opcode.WRITE_LAST)
_LAST_IMM = int(Opcode.WRITE_LAST_IMM)
_ONLY = int(Opcode.WRITE_ONLY)
_ONLY_IMM = int(Opcode.WRITE_ONLY_IMM)

#: One packet of a flowcell: its message, its index in the message, its PSN.
CellPacket = tuple[OutMessage, int, int]


def flowcell_limit(flowcell: int, segment_size: int) -> int:
    """Packets in one flowcell of `segment_size`-byte segments: min(flowcell, 65507 // size, 64)."""
    return max(1, min(flowcell, MAX_GSO_BYTES // segment_size, MAX_GSO_SEGMENTS))


def packet_size(msg: OutMessage, index: int, mtu: int) -> int:
    """UDP payload bytes of packet `index` of `msg`: its headers and its payload
    (docs/WIRE.md §3)."""
    if index == msg.npkts - 1:
        payload = len(msg.src) - index * mtu
        return payload + (HEADER if msg.imm is None else HEADER_IMM)
    return mtu + HEADER


class Framer:
    """Writes data packets for one session's sender."""

    def __init__(
        self, config: SessionConfig, *, stats: SessionStats, peer_addrs: dict[int, Addr]
    ) -> None:
        self.mtu = config.payload_mtu
        self.p_key = config.p_key
        self.stats = stats
        self.peer_addrs = peer_addrs
        #: Set once a secured connection has its keys: packets are sealed as they are framed.
        self.protection: PacketProtection | None = None
        #: The buffer secured packets are framed and sealed in (`_frame_sealed`).
        self._stage = bytearray(0)

    @property
    def overhead(self) -> int:
        """Bytes every packet carries beyond `packet_size`: the trailer when secured."""
        return 0 if self.protection is None else TRAILER

    def frame(
        self,
        cell: Sequence[CellPacket],
        ev: int,
        now: float,
        *,
        dest_qp: int,
        rqmsn: int,
        rtx: bool = False,
    ) -> Transmit:
        """One `Transmit` of the packets of `cell`, in order, all on `ev`.

        The caller keeps to the flowcell rules: no packet longer than the first, only the last
        one shorter, at most `flowcell_limit` packets. With more than one packet the transmit's
        `segment_size` is the first packet's size.
        """
        if self.protection is not None:
            return self._frame_sealed(cell, ev, now, dest_qp=dest_qp, rqmsn=rqmsn, rtx=rtx)
        mtu = self.mtu
        p_key = self.p_key
        w4 = EVX_BIT | dest_qp
        flags = TS_BIT | RTX_BIT if rtx else TS_BIT
        ts = tx_timestamp(now)
        pack = DATA_HEADER.pack
        parts: list[bytes | memoryview] = []
        append = parts.append
        cur: OutMessage | None = None
        src: memoryview  # set with the message's other fields, on the first packet
        dma = base_va = msn = rkey = last = 0
        for msg, index, psn in cell:
            if msg is not cur:
                # Consecutive packets mostly share their message: read its fields once.
                cur = msg
                src = msg.src
                dma = len(src)
                base_va = msg.remote_va
                msn = msg.msn
                rkey = msg.rkey
                last = msg.npkts - 1
            off = index * mtu
            if index == last:
                imm = msg.imm
                w8 = flags | A_BIT | psn
                if imm is None:
                    op = _LAST if index else _ONLY
                    append(pack(op, 0, p_key, w4, w8, ev, rqmsn, msn, ts, base_va + off, rkey, dma))
                else:
                    op = _LAST_IMM if index else _ONLY_IMM
                    append(
                        DATA_HEADER_IMM.pack(
                            op, 0, p_key, w4, w8, ev, rqmsn, msn, ts, base_va + off, rkey, dma, imm
                        )
                    )
                append(src[off:])
            else:
                op = _MIDDLE if index else _FIRST
                va = base_va + off
                append(pack(op, 0, p_key, w4, flags | psn, ev, rqmsn, msn, ts, va, rkey, dma))
                append(src[off : off + mtu])
        data = b"".join(parts)
        plane = ev_plane(ev)
        ps = self.stats.plane(plane)
        ps.packets_sent += len(cell)
        ps.bytes_sent += len(data)
        segment_size = len(parts[0]) + len(parts[1]) if len(cell) > 1 else None
        return Transmit(
            plane=plane, addr=self.peer_addrs[plane], data=data, ev=ev, segment_size=segment_size
        )

    def _frame_sealed(
        self,
        cell: Sequence[CellPacket],
        ev: int,
        now: float,
        *,
        dest_qp: int,
        rqmsn: int,
        rtx: bool,
    ) -> Transmit:
        """`frame` for a secured connection: headers, payload and trailer of every packet
        written into one buffer, each packet sealed where it lies (docs/WIRE.md §7)."""
        protection = self.protection
        assert protection is not None
        mtu = self.mtu
        p_key = self.p_key
        w4 = EVX_BIT | dest_qp
        flags = TS_BIT | RTX_BIT if rtx else TS_BIT
        ts = tx_timestamp(now)
        # Every packet but a message's last is a full one: its size needs no lookup.
        full = HEADER + mtu + TRAILER
        # Framed in a buffer kept from call to call (no allocation and zeroing per batch);
        # every byte up to `start` is written below, so nothing of an earlier batch is sent.
        buf = self._stage
        packets: list[tuple[int, int, memoryview]] = []
        append = packets.append
        pack = DATA_HEADER.pack_into
        start = 0
        cur: OutMessage | None = None
        src: memoryview  # set with the message's other fields, on the first packet
        dma = base_va = msn = rkey = last = 0
        for msg, index, psn in cell:
            if msg is not cur:
                # Consecutive packets mostly share their message: read its fields once.
                cur = msg
                src = msg.src
                dma = len(src)
                base_va = msg.remote_va
                msn = msg.msn
                rkey = msg.rkey
                last = msg.npkts - 1
            off = index * mtu
            size = full if index < last else packet_size(msg, index, mtu) + TRAILER
            if start + size > len(buf):
                buf = self._grow(start, start + size)
            if index == last:
                imm = msg.imm
                w8 = flags | A_BIT | psn
                if imm is None:
                    op = _LAST if index else _ONLY
                    pack(buf, start, op, 0, p_key, w4, w8, ev, rqmsn, msn, ts, base_va + off, rkey,
                         dma)  # fmt: skip
                    append((start, start + HEADER, src[off:]))
                else:
                    op = _LAST_IMM if index else _ONLY_IMM
                    DATA_HEADER_IMM.pack_into(
                        buf, start, op, 0, p_key, w4, w8, ev, rqmsn, msn, ts, base_va + off, rkey,
                        dma, imm,
                    )  # fmt: skip
                    append((start, start + HEADER_IMM, src[off:]))
            else:
                op = _MIDDLE if index else _FIRST
                pack(buf, start, op, 0, p_key, w4, flags | psn, ev, rqmsn, msn, ts, base_va + off,
                     rkey, dma)  # fmt: skip
                append((start, start + HEADER, src[off : off + mtu]))
            start += size
        mv = memoryview(buf)
        protection.seal_into(mv, packets)
        plane = ev_plane(ev)
        ps = self.stats.plane(plane)
        ps.packets_sent += len(cell)
        ps.bytes_sent += start
        return Transmit(
            plane=plane,
            addr=self.peer_addrs[plane],
            data=bytes(mv[:start]),
            ev=ev,
            segment_size=packets[1][0] if len(cell) > 1 else None,
        )

    def _grow(self, keep: int, size: int) -> bytearray:
        """A framing buffer of at least `size` bytes (the largest GSO batch, the first time)
        holding the first `keep` bytes written so far."""
        buf = bytearray(max(size, MAX_GSO_BYTES))
        buf[:keep] = self._stage[:keep]
        self._stage = buf
        return buf

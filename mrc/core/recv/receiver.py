"""The responder half of a session: checks, placement, scoreboard, SACK/NACK/AETH.

Every data packet goes through the checks of docs/DESIGN.md §6 in order — trimmed?, PSN class,
R_Key and bounds — and only then is copied into its region at its own VA and marked in the
scoreboard; a failed step stops the packet and counts it by reason. SACKs are produced when
the session's output is pulled, for everything received since the last pull (one per 64-PSN
block touched, on io every plane one wake-up drained) plus one for each packet that asks for an
immediate answer (duplicate, ECN-CE, probe). Message outcomes and immediates are released in
PSN order, which is MSN order, as `cack_psn` passes each message's LAST; the AETHs of the
messages a pull completed go out coalesced (docs/WIRE.md §4): one cumulative ACK for the newest
success, a NAK of its own for each failure, and no ACK past a failure the requester has not
taken yet.

What it leaves to others: decoding (wire/), encoding and routing its answers (replies.py),
choosing planes and reverse EVs (paths.py), and the sending half (sender.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from ...wire.ack import NackReason
from ...wire.bth import A_BIT, EVX_BIT, PSN_HALF, PSN_MASK, TS_BIT, Opcode, psn_serial
from ...wire.data import MAX_DMA_LENGTH
from ...wire.fast import (
    DATA_HEADER,
    DATA_HEADER_IMM,
    DATA_HEADER_NOEVX,
    OP_FIRST,
    OP_LAST,
    OP_LAST_IMM,
    OP_MIDDLE,
    OP_ONLY,
    OP_ONLY_IMM,
    data_headers,
)
from ...wire.packet import (
    DataPacket,
    ProbePacket,
)
from ..config import SessionConfig
from ..events import Event, ImmediateReceived
from ..memory import RegionTable
from ..paths.evs import ev_plane
from ..paths.planes import PlaneTable
from ..stats import PlaneStats, SessionStats
from ..transmit import Addr
from .replies import Replies

#: DSCP a switch writes on a packet it trimmed at the last hop (docs/WIRE.md §5).
DSCP_TRIMMED_LASTHOP: Final = 21
#: Completed outcomes kept for duplicate LASTs beyond what RQMSN already released.
MAX_OUTCOMES: Final = 4096

_FULL: Final = frozenset({Opcode.WRITE_FIRST, Opcode.WRITE_MIDDLE})
_LAST: Final = frozenset({Opcode.WRITE_LAST, Opcode.WRITE_LAST_IMM})
_ONLY: Final = frozenset({Opcode.WRITE_ONLY, Opcode.WRITE_ONLY_IMM})
#: A trigger as `on_data` notes it for its block, until `end_batch` answers:
#: (psn, ev, plane, tx_ts, ce).
_Note = tuple[int, int, int, "int | None", bool]


_ZERO: Final = 48  # ord("0")
_ONE: Final = 49  # ord("1")
#: `on_data_bytes` takes packets framed like the sender's: BTH EVXH METH TSETH RETH, or the
#: same without EVXH when the EV rides in the flow label (bits 8-27 of the traffic word).
_HDR: Final = DATA_HEADER.size
_HDR_IMM: Final = DATA_HEADER_IMM.size
_HDR_NOEVX: Final = DATA_HEADER_NOEVX.size
_LABEL: Final = 0xFFFFF
_QPN: Final = 0xFFFFFF  # BTH.DestQP, the low 24 bits of the word after P_Key
# Bound once: compiled, `DATA_HEADER.unpack_from(…)` looks the method up by name per call.
_UNPACK_IMM: Final = DATA_HEADER_IMM.unpack_from
_FIELDS: Final = 13  # values a header in a `data_headers` unpack
_UNPACK_NOEVX: Final = DATA_HEADER_NOEVX.unpack_from


@dataclass(slots=True)
class _Trigger:
    """The packet a SACK answers: its PSN and EV are echoed, its timestamp too."""

    psn: int
    ev: int
    plane: int
    tx_ts: int | None
    ce: bool = False

    # Written out (records.OutMessage says why): one per SACK.
    def __init__(self, psn: int, ev: int, plane: int, tx_ts: int | None, ce: bool = False) -> None:
        self.psn = psn
        self.ev = ev
        self.plane = plane
        self.tx_ts = tx_ts
        self.ce = ce


class Receiver:
    def __init__(
        self,
        config: SessionConfig,
        *,
        regions: RegionTable,
        paths: PlaneTable,
        stats: SessionStats,
        events: deque[Event],
        peer_addrs: dict[int, Addr],
        initial_psn: int,
        dest_qp: int,
    ) -> None:
        self.config = config
        self.regions = regions
        self.paths = paths
        self.stats = stats
        self.events = events
        #: Encodes and routes the SACKs, NACKs and ACKs; the session drains its `out`.
        self.replies = Replies(
            config, paths=paths, stats=stats, peer_addrs=peer_addrs, dest_qp=dest_qp
        )
        self.cack = initial_psn  # every PSN before it is received or consumed
        self.window = config.window
        size = 1 << (self.window - 1).bit_length()
        # ASCII '1' = received or consumed, '0' = not yet, for PSNs in [cack, cack + window);
        # ASCII so a SACK block's bitmap is one int(…, 2) over a slice.
        self._ring = bytearray(b"0" * size)
        self._zeros = memoryview(b"0" * size)  # to clear a run of the ring with one slice
        self._rmask = size - 1
        self._held = 0  # ring entries set (packets received beyond cack)
        # psn → msn, imm, A, plane, and for an immediate its message's R_Key, VA and length
        self._lasts: dict[int, tuple[int, int | None, bool, int, int, int, int]] = {}
        self._errors: dict[int, int] = {}  # msn → first failing syndrome
        self._outcomes: dict[int, int] = {}  # completed msn → syndrome, for duplicate LASTs
        self._outcome_order: deque[int] = deque()
        #: Failed MSNs the requester may not have taken yet (its RQMSN has not passed them):
        #: an ACK after one would claim it succeeded (docs/WIRE.md §4).
        self._failed: deque[int] = deque()
        #: The newest successful MSN to announce in a cumulative ACK, and its LAST's plane.
        self._ack_due: tuple[int, int] | None = None
        self._rqmsn = 0
        self._rcvd_bytes = 0
        # Per receive batch: the last trigger of each 64-PSN block, and immediate triggers.
        self._blocks: dict[int, _Note] = {}
        # The newest packet `on_data_bytes` placed, not yet noted in `_blocks`: a run of
        # packets in one block (the usual batch) then costs one note, not one each.
        self._pend_block = -1
        self._pend_psn = self._pend_ev = self._pend_plane = self._pend_ts = 0
        self._immediate: list[_Trigger] = []
        #: The EV rides in the flow label (agreed in CM), not in an EVXH.
        self._noevx = config.ev_encoding == "flowlabel"

    # -- data -------------------------------------------------------------------------------

    def expected_length(self, pkt: DataPacket) -> int | None:
        """A packet's payload length follows from its opcode (docs/WIRE.md §3); None means the
        packet is inconsistent."""
        mtu = self.config.payload_mtu
        dma = pkt.dma_length
        op = pkt.opcode
        if op in _FULL:
            return mtu if dma > mtu else None
        if op in _LAST:
            return (dma - 1) % mtu + 1 if dma > mtu else None
        return dma if dma <= mtu else None

    def on_data(self, pkt: DataPacket, plane: int, tos: int, now: float) -> None:
        # The checks of docs/DESIGN.md §6 in order, for a decoded packet: every packet that
        # `on_data_bytes` did not place straight from its bytes.
        op = pkt.opcode
        payload = pkt.payload
        n = len(payload)
        full = op in _FULL
        expected = self.expected_length(pkt)
        if expected is None:
            self.stats.drops_by_reason["bad_dma_length"] += 1
            return
        if n > expected:
            self.stats.drops_by_reason["bad_length"] += 1
            return
        if n < expected:
            self.on_trimmed(pkt, plane, tos)
            return
        psn = pkt.psn
        d = (psn - self.cack) & PSN_MASK
        in_window = d < self.window
        slot = psn & self._rmask
        fresh = in_window and self._ring[slot] == _ZERO
        if not fresh:
            drops = self.stats.drops_by_reason
            if in_window or d >= PSN_HALF:
                drops["duplicate"] += 1
                self._immediate.append(_Trigger(psn, pkt.ev, plane, pkt.tx_timestamp))
                if d >= PSN_HALF and not full:
                    if pkt.rqmsn != self._rqmsn:
                        self._note_rqmsn(pkt.rqmsn)  # a completion probe's news
                    status = self._outcomes.get(pkt.msn)
                    if status is not None and pkt.a:
                        self._announce(status, pkt.msn, plane)
            else:
                drops["out_of_window"] += 1
                self.replies.nack(NackReason.PSN_OOR_WINDOW, pkt, plane)
            return
        region = self.regions.lookup(pkt.rkey)
        failure = self._errors.get(pkt.msn) if self._errors else None
        reason_name = "message_failed"
        if failure is not None:
            pass  # an earlier packet already showed this message bad: write none of it
        elif region is None:
            failure, reason_name = NackReason.BAD_RKEY, "bad_rkey"
        else:
            if region.contains(*self._message_span(op, pkt.va, pkt.dma_length, n)):
                start = pkt.va - region.base_va
                region.view[start : start + n] = payload
                self._placed(n, now)
            else:
                failure, reason_name = NackReason.OUT_OF_BOUNDS, "out_of_bounds"
        if failure is not None:
            # The PSN is consumed so the window moves on; the error reaches the sender in the
            # message's AETH (docs/WIRE.md §4, 0x80/0x81). Nothing is written.
            self.stats.drops_by_reason[reason_name] += 1
            self._errors.setdefault(pkt.msn, int(failure))
            self.replies.nack(NackReason(failure), pkt, plane)
        self._ring[slot] = _ONE
        self._held += 1
        if not full:
            va, dma = self._message_span(op, pkt.va, pkt.dma_length, n)
            self._lasts[psn] = (pkt.msn, pkt.imm, pkt.a, plane, pkt.rkey, va, dma)
        if pkt.rqmsn != self._rqmsn:
            self._note_rqmsn(pkt.rqmsn)
        ce = tos & 3 == 3
        if ce:
            # The A bit asks for the AETH, which the LAST's completion sends; the SACK of
            # its block goes with it at this pull (docs/DESIGN.md §6).
            self._immediate.append(_Trigger(psn, pkt.ev, plane, pkt.tx_timestamp, ce=True))
        if self._pend_block >= 0:
            self._note_pending()  # an older packet's note must not overwrite this one
        self._blocks[psn & ~63 & PSN_MASK] = (psn, pkt.ev, plane, pkt.tx_timestamp, ce)

    def _note_pending(self) -> None:
        self._blocks[self._pend_block] = (
            self._pend_psn,
            self._pend_ev,
            self._pend_plane,
            self._pend_ts,
            False,
        )
        self._pend_block = -1

    def on_trimmed(self, pkt: DataPacket, plane: int, tos: int) -> None:
        """A trimmed packet (docs/WIRE.md §5): a hint, never written. Answered with a NACK only
        while its PSN is in the window and not yet received; on a secured connection it is
        the one packet that skips authentication, so it must never do more than that."""
        psn = pkt.psn
        if (psn - self.cack) & PSN_MASK >= self.window or self._ring[psn & self._rmask] != _ZERO:
            self.stats.drops_by_reason["trimmed_stale"] += 1
            return
        self.stats.trimmed_received += 1
        lasthop = (tos & 0xFF) >> 2 == DSCP_TRIMMED_LASTHOP
        reason = NackReason.TRIMMED_LASTHOP if lasthop else NackReason.TRIMMED
        self.replies.nack(reason, pkt, plane)

    def on_data_bytes(self, data: bytes | memoryview, plane: int, tos: int, now: float) -> bool:
        """Place the common data packet straight from its bytes, without a `DataPacket`: a
        full-size FIRST or MIDDLE without the A bit, or a LAST or ONLY (a small WRITE is one
        ONLY; with ImmDt only when the EV rides in EVXH), with EVXH (or, on a flow-label
        connection, without one and with a label) and TSETH, no CE mark, new and in the
        window, of a message with no failure, inside its region. True if it was placed;
        False, having changed nothing, for every other packet, which then takes
        `decode_packet` and `on_data` (the same checks, docs/DESIGN.md §6, in order)."""
        # Compiled, `bytes` is a C type check; `memoryview` would be a builtins lookup.
        mv = memoryview(data) if isinstance(data, bytes) else data
        n = self._place_at(mv, 0, len(mv), -1, plane, tos, now)
        if n:
            self._placed(n, now)
        return n > 0

    def _place_at(
        self, buf: memoryview, at: int, size: int, qpn: int, plane: int, tos: int, now: float,
        fields: tuple[Any, ...] | None = None, j: int = 0,
    ) -> int:  # fmt: skip
        """`on_data_bytes` for the datagram of `size` bytes at offset `at` of `buf`, but for
        the stall clock (`_placed`): the payload bytes placed, or 0. One for another QP than
        `qpn` (when not -1) is not placed. `fields`, when given, holds its header's values
        (`DATA_HEADER_IMM`'s) from index `j`: one unpack for a whole read, `on_data_span`."""
        mtu = self.config.payload_mtu
        imm: int | None = None
        if not self._noevx:
            if size < _HDR_IMM:
                return 0  # a payload under 4 bytes: the slow path
            if fields is None:
                fields, j = _UNPACK_IMM(buf, at), 0
            # Typed: compiled, the checks below run on machine ints (struct returns objects).
            op: int = fields[j]
            b1: int = fields[j + 1]
            p_key: int = fields[j + 2]
            w4: int = fields[j + 3]
            w8: int = fields[j + 4]
            ev: int = fields[j + 5]
            rqmsn: int = fields[j + 6]
            msn: int = fields[j + 7]
            ts: int = fields[j + 8]
            va: int = fields[j + 9]
            rkey: int = fields[j + 10]
            dma: int = fields[j + 11]
            if op in (OP_ONLY_IMM, OP_LAST_IMM):
                hdr = _HDR_IMM
                imm = fields[j + 12]  # without ImmDt, the payload's first 4 bytes
            else:
                hdr = _HDR
        else:
            hdr = _HDR_NOEVX
            if size < hdr:
                return 0
            op, b1, p_key, w4, w8, rqmsn, msn, ts, va, rkey, dma = _UNPACK_NOEVX(buf, at)
            ev = tos >> 8 & _LABEL
            if not ev:
                return 0  # no label: the slow path counts it (evlabel.py)
            ev |= plane << 24
            w4 ^= EVX_BIT  # expected clear: the checks below read it set
        if qpn >= 0 and w4 & _QPN != qpn:
            return 0  # a read can hold datagrams of several QPs: the endpoint routes the rest
        n = size - hdr
        if op in (OP_MIDDLE, OP_FIRST):
            if n != mtu or w8 & A_BIT or not mtu < dma <= MAX_DMA_LENGTH:
                return 0
        elif op in (OP_ONLY, OP_ONLY_IMM):
            if n != dma or not 0 < dma <= mtu:
                return 0
        elif op in (OP_LAST, OP_LAST_IMM):
            if not mtu < dma <= MAX_DMA_LENGTH or n != (dma - 1) % mtu + 1:
                return 0
        else:
            return 0
        if (
            b1 & 0x0F  # TVer (docs/WIRE.md §2)
            or p_key != self.config.p_key
            or not w4 & EVX_BIT
            or not w8 & TS_BIT
            or tos & 3 == 3
            or (self._errors and msn in self._errors)
        ):
            return 0
        psn = w8 & PSN_MASK
        slot = psn & self._rmask
        if (psn - self.cack) & PSN_MASK >= self.window or self._ring[slot] != _ZERO:
            return 0
        region = self.regions.lookup(rkey)
        if region is None:
            return 0
        # `_message_span`, inline (a call and a tuple a packet).
        if op == OP_MIDDLE:
            span_va, span = va - mtu, 2 * mtu + 1
        elif op in (OP_LAST, OP_LAST_IMM):
            span_va, span = va + n - dma, dma
        else:
            span_va, span = va, dma
        if not region.contains(span_va, span):
            return 0
        start = va - region.base_va
        region.view[start : start + n] = buf[at + hdr : at + size]
        self._ring[slot] = _ONE
        self._held += 1
        if op not in (OP_MIDDLE, OP_FIRST):
            self._lasts[psn] = (msn, imm, bool(w8 & A_BIT), plane, rkey, span_va, span)
        if rqmsn != self._rqmsn:
            self._note_rqmsn(rqmsn)
        block = psn & ~63 & PSN_MASK
        if block != self._pend_block:
            if self._pend_block >= 0:
                self._note_pending()
            self._pend_block = block
        self._pend_psn = psn
        self._pend_ev = ev
        self._pend_plane = plane
        self._pend_ts = ts
        return n

    def on_data_span(
        self, buf: memoryview, at: int, end: int, seg: int, qpn: int, plane: int, tos: int,
        ps: PlaneStats, now: float,
    ) -> int:  # fmt: skip
        """`on_data_bytes` for one read's datagrams (`buf[at:end]`, `seg` bytes each but the
        last) for QP `qpn`, each placed where it lies in `buf` and counted on `ps`, until one
        does not take the byte path: returns its offset (`end` once all did). One call, and
        one unpack of the headers (`data_headers`), per read; no view or tuple per datagram."""
        placed = j = limit = 0  # fields[j:limit]: the headers from `at` on
        fields: tuple[Any, ...] | None = None
        while at < end:
            size = min(seg, end - at)
            got = self._place_at(
                buf, at, size, qpn, plane, tos, now, fields if j < limit else None, j
            )
            if not got:
                break
            placed += got
            ps.packets_received += 1
            ps.bytes_received += size
            at += size
            j += _FIELDS
            if fields is None:
                # The first was placed, so this is our data: the full-size rest's headers at once.
                fields, count = (), min((end - at) // seg, 64)
                if count > 1 and seg - self.config.payload_mtu in (_HDR, _HDR_IMM):
                    fields = data_headers(seg, count).unpack_from(buf, at)
                    j, limit = 0, _FIELDS * count
        if placed:
            self._placed(placed, now)  # once: every packet of the read came at `now`
        return at

    def _message_span(self, op: int, va: int, dma: int, n: int) -> tuple[int, int]:
        """(VA, length) that must lie inside the region for a packet of opcode `op` with
        `n` payload bytes at `va` of a `dma`-byte message to be written. FIRST/ONLY know where
        the message starts and LAST where it ends, so they check the whole message: an
        out-of-bounds WRITE is refused whole whenever one of them arrives first. A MIDDLE
        checks its own bytes plus the packet before and the byte after it."""
        if op in _LAST:
            return va + n - dma, dma
        if op == OP_MIDDLE:
            mtu = self.config.payload_mtu
            return va - mtu, 2 * mtu + 1
        return va, dma

    def _placed(self, n: int, now: float) -> None:
        st = self.stats
        st.bytes_placed += n
        self._rcvd_bytes = (self._rcvd_bytes + n) & 0xFFFFFF
        last = st.last_placed_at
        if last == now:
            return  # the rest of a receive batch: no time passed
        if last is None:
            st.first_placed_at = now
        elif now - last > st.longest_stall_seconds:
            st.longest_stall_seconds = now - last
            st.longest_stall_from = last
        st.last_placed_at = now

    def _note_rqmsn(self, rqmsn: int) -> None:
        """Outcomes of messages older than the requester's RQMSN are no longer needed."""
        self._rqmsn = rqmsn
        order = self._outcome_order
        while order and (len(order) > MAX_OUTCOMES or 0 < (rqmsn - order[0]) & 0xFFFF < 0x8000):
            self._outcomes.pop(order.popleft(), None)
        failed = self._failed
        while failed and 0 < (rqmsn - failed[0]) & 0xFFFF < 0x8000:
            failed.popleft()  # the requester took its outcome: ACKs may pass it

    # -- end of a receive batch -------------------------------------------------------------

    def end_batch(self, now: float) -> None:
        """Advance cack_psn, release outcomes, and answer the batch (docs/DESIGN.md §6)."""
        if self._pend_block >= 0:
            self._note_pending()
        self._advance_cack()
        cack = self.cack
        # Oldest block first: the sender infers losses per EV from what it has heard, so it
        # must hear of a block before any later one (docs/DESIGN.md §6). A block with an
        # immediate trigger (A bit, CE, duplicate) needs no second, plain SACK.
        triggers = list(self._immediate)
        covered = {t.psn & ~63 & PSN_MASK for t in triggers}
        triggers += [_Trigger(*t) for b, t in self._blocks.items() if b not in covered]
        if len(triggers) > 1:
            triggers.sort(key=lambda t: psn_serial(t.psn - cack))
        for trig in triggers:
            self._sack(trig)
        self._blocks.clear()
        self._immediate.clear()
        self._flush_ack()

    def _advance_cack(self) -> None:
        """Move cack_psn over every PSN received since, clearing their ring entries, and
        complete the messages whose LAST it passes, in PSN order (each with cack_psn just past
        its LAST). The run is found with `bytearray.find` and cleared with a slice: the loop
        a PSN at a time cost the receiver about 100 ns a packet."""
        ring, rmask = self._ring, self._rmask
        cack = self.cack
        lo = cack & rmask
        size = rmask + 1
        zeros = self._zeros
        hi = ring.find(_ZERO, lo)
        if hi >= 0:
            n = hi - lo
            if not n:
                return
            ring[lo:hi] = zeros[:n]
        else:  # the run wraps round the ring (or fills it: the ring can be the window's size)
            hi = ring.find(_ZERO, 0, lo)
            n = size - lo + (hi if hi >= 0 else lo)
            ring[lo:] = zeros[: size - lo]
            ring[: n - (size - lo)] = zeros[: n - (size - lo)]
        self._held -= n
        lasts = self._lasts
        if lasts:
            # Few messages end in the run (large WRITEs): look at those, not at every PSN.
            few = len(lasts) < n
            for k in sorted((psn - cack) & PSN_MASK for psn in lasts) if few else range(n):
                if k >= n:
                    break
                psn = (cack + k) & PSN_MASK
                last = lasts.get(psn)
                if last is not None:
                    del lasts[psn]
                    msn, imm, a, plane, rkey, va, length = last
                    self.cack = (psn + 1) & PSN_MASK
                    self._complete(msn, imm, a, plane, rkey, va, length)
        self.cack = (cack + n) & PSN_MASK

    def _complete(
        self, msn: int, imm: int | None, a: bool, plane: int, rkey: int, va: int, length: int
    ) -> None:
        status = self._errors.pop(msn, 0)
        self._outcomes[msn] = status
        self._outcome_order.append(msn)
        if status:
            self._failed.append(msn)
        self._note_rqmsn(self._rqmsn)
        if a:
            self._announce(status, msn, plane)
        if imm is not None and status == 0:
            self.events.append(ImmediateReceived(msn, imm, rkey, va, length))

    # -- probes -----------------------------------------------------------------------------

    def on_probe(self, pkt: ProbePacket, plane: int, tos: int) -> None:
        """Answer a RELIABILITY_PROBE at once with a PR SACK on the plane it came in on; a
        CE mark on the probe is echoed, so the prober knows the path is congested."""
        trig = _Trigger(self.cack, pkt.ev, plane, pkt.peth.tx_timestamp, ce=tos & 3 == 3)
        self._sack(trig, probe_id=pkt.peth.probe_id, force_plane=True)

    # -- output (replies.py encodes and routes) ---------------------------------------------

    def _sack(
        self, trig: _Trigger, *, probe_id: int | None = None, force_plane: bool = False
    ) -> None:
        route = self.replies.route(trig.plane, force_plane)
        if route is None:
            return
        plane, ev = route
        if probe_id is not None and ev_plane(trig.ev) == plane:
            # A probe is answered on the mirror of the path it probed, so the answer proves
            # that path and not whichever reverse EV came next (as in answer_endpoint).
            ev = trig.ev
        cack = self.cack
        tx_ts = trig.tx_ts
        offset = psn_serial(trig.psn - cack)
        psn = trig.psn
        # Both offsets are 16 signed bits: the triggering PSN's and its 64-PSN block's start
        # (up to 63 further back), so a PSN near -2^15 reports about cack_psn instead.
        if not -0x8000 + 64 <= offset < 0x8000 or probe_id is not None:
            psn, tx_ts = cack, (tx_ts if probe_id is not None else None)
            offset = 0
        block = psn & ~63 & PSN_MASK
        sack_offset = psn_serial(block - cack)
        if probe_id is not None:
            offset = probe_id - 0x10000 if probe_id >= 0x8000 else probe_id
        self.replies.sack(
            plane, ev, cack=cack, offset=offset, entropy=trig.ev, sack_offset=sack_offset,
            bitmap=self._bitmap(block, sack_offset), ce=trig.ce, probe=probe_id is not None,
            tx_ts=tx_ts, held=self._held, rcvd_bytes=self._rcvd_bytes,
        )  # fmt: skip

    def _bitmap(self, block: int, sack_offset: int) -> int:
        """SETH bitmap of the 64 PSNs from `block`: bit 0 (MSB) is `block` itself (docs/WIRE.md §4).

        PSNs before cack_psn read 1, PSNs in the window read the scoreboard, the rest 0.
        """
        before = min(64, max(0, -sack_offset))
        start = max(0, sack_offset)  # first in-window PSN, relative to cack
        count = max(0, min(64 - before, self.window - start))
        bits = b"1" * before
        if count:
            ring, size = self._ring, self._rmask + 1
            lo = (self.cack + start) & self._rmask
            hi = lo + count
            bits += ring[lo:hi] if hi <= size else ring[lo:] + ring[: hi - size]
        return int(bits.ljust(64, b"0"), 2)

    def _announce(self, status: int, msn: int, plane: int) -> None:
        """Message `msn`'s outcome is to be told: a failure at once, in an AETH of its own; a
        success in the cumulative ACK this pull ends with, for the newest such message
        (IBTA coalescing: an ACK acknowledges every message up to its MSN)."""
        if status:
            due = self._ack_due
            if due is not None and 0 < (msn - due[0]) & 0xFFFF < 0x8000:
                self._flush_ack()  # the successes before it first: their ACK cannot cover it
            self.replies.acknowledge(status, msn, plane, self.cack)
            return
        due = self._ack_due
        if due is None or (msn - due[0]) & 0xFFFF < 0x8000:
            self._ack_due = (msn, plane)

    def _flush_ack(self) -> None:
        """Send the cumulative ACK due, unless a failure before it is not yet taken (it then
        waits for the requester's RQMSN to pass that failure)."""
        due = self._ack_due
        failed = self._failed
        if due is None or (failed and 0 < (due[0] - failed[0]) & 0xFFFF < 0x8000):
            return
        self._ack_due = None
        self.replies.acknowledge(0, due[0], due[1], self.cack)

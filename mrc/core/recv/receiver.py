"""The responder half of a session: checks, placement, scoreboard, SACK/NACK/AETH.

Every data packet goes through the checks of docs/DESIGN.md §6 in order — trimmed?, PSN class,
R_Key, the region's peers and bounds — in one function (`_data`), and only then is copied into
its region at its own VA and marked in the scoreboard; a failed step stops the packet and counts
it by reason. Its header values come from the datagram's bytes (`_take`: the layouts the framer
writes, one datagram or every datagram of a GRO read with one unpack) or from a decoded packet
(`on_data`: every other layout); a secured connection's gate (gate.py) runs before either.
SACKs are produced when the session's output is pulled, for everything received since the last
pull (one per 64-PSN block touched, on io every plane one wake-up drained) plus one for each
packet that asks for an immediate answer (duplicate, ECN-CE, probe). Message outcomes and
immediates are released in PSN order, which is MSN order, as `cack_psn` passes each message's
LAST; the AETHs of the messages a pull completed go out coalesced (docs/WIRE.md §4): one
cumulative ACK for the newest success, a NAK of its own for each failure, and no ACK past a
failure the requester has not taken yet.

What it leaves to others: decoding (wire/), encoding and routing its answers (replies.py),
choosing planes and reverse EVs (paths.py), and the sending half (sender.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from ...wire.ack import NackReason, Syndrome
from ...wire.bth import A_BIT, EVX_BIT, PSN_HALF, PSN_MASK, TS_BIT, psn_serial
from ...wire.data import MAX_DMA_LENGTH
from ...wire.fast import (
    DATA_HEADER,
    DATA_HEADER_IMM,
    DATA_HEADER_IMM_NOEVX,
    DATA_HEADER_NOEVX,
    OP_FIRST,
    OP_LAST,
    OP_LAST_IMM,
    OP_MIDDLE,
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

#: A trigger as `_data` notes it for its block, until `end_batch` answers:
#: (psn, ev, plane, tx_ts, ce).
_Note = tuple[int, int, int, "int | None", bool]


_ZERO: Final = 48  # ord("0")
_ONE: Final = 49  # ord("1")
#: `_take` reads packets framed like the sender's: BTH EVXH METH TSETH RETH [ImmDt], or the
#: same without EVXH when the EV rides in the flow label (bits 8-27 of the traffic word).
_HDR: Final = DATA_HEADER.size
_HDR_IMM: Final = DATA_HEADER_IMM.size
_HDR_NOEVX: Final = DATA_HEADER_NOEVX.size
_HDR_IMM_NOEVX: Final = DATA_HEADER_IMM_NOEVX.size
#: Header sizes a full-size datagram of a read can have (for one unpack of all their headers).
_WIDTHS: Final = (_HDR, _HDR_IMM)
_LABEL: Final = 0xFFFFF
_QPN: Final = 0xFFFFFF  # BTH.DestQP, the low 24 bits of the word after P_Key
# Bound once: compiled, `DATA_HEADER.unpack_from(…)` looks the method up by name per call.
_UNPACK: Final = DATA_HEADER.unpack_from
_UNPACK_IMM: Final = DATA_HEADER_IMM.unpack_from
_FIELDS: Final = 13  # values a header in a `data_headers` unpack
_UNPACK_NOEVX: Final = DATA_HEADER_NOEVX.unpack_from
_UNPACK_IMM_NOEVX: Final = DATA_HEADER_IMM_NOEVX.unpack_from


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
        peer_key: bytes | None = None,
    ) -> None:
        """`peer_key`: the peer's authenticated static key (None on an unsecured connection),
        which a region registered for named peers must name (memory.py)."""
        self.config = config
        self.peer_key = peer_key
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
        self._pend_psn = self._pend_ev = self._pend_plane = self._pend_ts = 0  # ts -1: none
        self._immediate: list[_Trigger] = []
        #: The EV rides in the flow label (agreed in CM), not in an EVXH.
        self._noevx = config.ev_encoding == "flowlabel"
        #: Messages refused with a remote access error, and why the connection must end
        #: ("" while it may go on): the session closes it once this is set.
        self.access_errors = 0
        self.fatal = ""
        #: PSN → tx_timestamp of the trimmed packets NACKed (one NACK per transmission), and
        #: the NACK token bucket: tokens and when they were counted.
        self._trim_nacked: dict[int, int] = {}
        self._trim_tokens = float(config.trim_nack_burst)
        self._trim_at = 0.0

    # -- data -------------------------------------------------------------------------------

    def expected_length(self, op: int, dma: int) -> int:
        """A packet's payload length follows from its opcode and DMA_length (docs/WIRE.md §3);
        -1 means the two are inconsistent. The gate asks it to tell a trimmed packet."""
        mtu = self.config.payload_mtu
        if op in (OP_MIDDLE, OP_FIRST):
            return mtu if dma > mtu else -1
        if op in (OP_LAST, OP_LAST_IMM):
            return (dma - 1) % mtu + 1 if dma > mtu else -1
        return dma if dma <= mtu else -1

    def on_data(self, pkt: DataPacket, plane: int, tos: int, now: float) -> None:
        """A decoded data packet, one the byte layouts of `_take` do not cover: `_data`."""
        payload = pkt.payload
        mv = payload if isinstance(payload, memoryview) else memoryview(payload)
        ts = pkt.tx_timestamp
        imm = pkt.imm
        n = self._data(
            pkt.opcode.value, pkt.psn, pkt.a, pkt.ev, pkt.rqmsn, pkt.msn,
            -1 if ts is None else ts, pkt.va, pkt.rkey, pkt.dma_length,
            -1 if imm is None else imm, mv, 0, len(mv), plane, tos, now,
        )  # fmt: skip
        if n:
            self._placed(n, now)

    def on_data_bytes(self, data: bytes | memoryview, plane: int, tos: int, now: float) -> bool:
        """One datagram (a secured one once the gate opened it): `_take`. True if it was a
        data packet of the byte layouts and went through `_data`; False, having changed
        nothing, for every other datagram, which the caller decodes."""
        # Compiled, `bytes` is a C type check; `memoryview` would be a builtins lookup.
        mv = memoryview(data) if isinstance(data, bytes) else data
        n = self._take(mv, 0, len(mv), -1, plane, tos, now, None, 0)
        if n > 0:
            self._placed(n, now)
        return n >= 0

    def on_data_span(
        self, buf: memoryview, at: int, end: int, seg: int, qpn: int, plane: int, tos: int,
        ps: PlaneStats, now: float, trailer: int = 0,
    ) -> int:  # fmt: skip
        """One read's datagrams (`buf[at:end]`, `seg` bytes each but the last) for QP `qpn`,
        each through `_take` where it lies in `buf` and counted on `ps`, until one is not a
        data packet of the byte layouts (or the connection went fatal): returns its offset
        (`end` once all were taken). One unpack of the headers (`data_headers`) per read; no
        view or tuple per datagram. On a secured connection the gate opened the datagrams in
        place first (`Established._secured_run`): the last `trailer` bytes of each are its
        security trailer, not packet."""
        placed = j = limit = 0  # fields[j:limit]: the headers from `at` on
        fields: tuple[Any, ...] | None = None
        while at < end and not self.fatal:
            size = min(seg, end - at)
            got = self._take(
                buf, at, size - trailer, qpn, plane, tos, now, fields if j < limit else None, j
            )
            if got < 0:
                break
            placed += got
            ps.packets_received += 1
            ps.bytes_received += size
            at += size
            j += _FIELDS
            if fields is None:
                # The first was ours: the full-size rest's headers at once.
                fields, count = (), min((end - at) // seg, 64)
                width = seg - trailer - self.config.payload_mtu
                if count > 1 and not self._noevx and width in _WIDTHS:
                    fields = data_headers(seg, count).unpack_from(buf, at)
                    j, limit = 0, _FIELDS * count
        if placed:
            self._placed(placed, now)  # once: every packet of the read came at `now`
        return at

    def _take(
        self, buf: memoryview, at: int, size: int, qpn: int, plane: int, tos: int, now: float,
        fields: tuple[Any, ...] | None, j: int,
    ) -> int:  # fmt: skip
        """The datagram of `size` bytes at `at` in `buf`, if it is a data packet in one of the
        layouts the sender frames (BTH EVXH METH TSETH RETH [ImmDt] with a payload, or the same
        without EVXH and with a flow label on a flow-label connection), well-formed as
        `decode_packet` would find it, for P_Key and QP `qpn` (any when -1): its header values
        go to `_data`, whose result (payload bytes placed, maybe 0) it returns. -1, having
        changed nothing, for any other datagram: the decoder takes it (and names what is
        wrong). `fields`, when given, holds its header's values (`DATA_HEADER_IMM`'s) from
        index `j`: one unpack for a whole read."""
        if not self._noevx:
            if fields is None:
                if size >= _HDR_IMM:
                    fields, j = _UNPACK_IMM(buf, at), 0
                elif size > _HDR:
                    fields, j = _UNPACK(buf, at), 0
                else:
                    return -1
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
            imm = -1
            if op in (OP_ONLY_IMM, OP_LAST_IMM):
                if size <= _HDR_IMM:
                    return -1
                hdr = _HDR_IMM
                imm = fields[j + 12]
            else:
                hdr = _HDR
            if not w4 & EVX_BIT:
                return -1
        else:
            if size <= _HDR_NOEVX:
                return -1
            op = buf[at]
            imm = -1
            if op in (OP_ONLY_IMM, OP_LAST_IMM):
                if size <= _HDR_IMM_NOEVX:
                    return -1
                hdr = _HDR_IMM_NOEVX
                op, b1, p_key, w4, w8, rqmsn, msn, ts, va, rkey, dma, imm = _UNPACK_IMM_NOEVX(
                    buf, at
                )
            else:
                hdr = _HDR_NOEVX
                op, b1, p_key, w4, w8, rqmsn, msn, ts, va, rkey, dma = _UNPACK_NOEVX(buf, at)
            ev = tos >> 8 & _LABEL
            if not ev or w4 & EVX_BIT:
                return -1  # no label (the decoder's path counts it) or an EVXH
            ev |= plane << 24
        if (
            not OP_FIRST <= op <= OP_ONLY_IMM
            or b1 & 0x0F  # TVer (docs/WIRE.md §2)
            or p_key != self.config.p_key
            or not w8 & TS_BIT
            or (qpn >= 0 and w4 & _QPN != qpn)
            or not 1 <= dma <= MAX_DMA_LENGTH
        ):
            return -1
        return self._data(
            op, w8 & PSN_MASK, bool(w8 & A_BIT), ev, rqmsn, msn, ts, va, rkey, dma, imm,
            buf, at + hdr, size - hdr, plane, tos, now,
        )  # fmt: skip

    def _data(
        self, op: int, psn: int, a: bool, ev: int, rqmsn: int, msn: int, ts: int, va: int,
        rkey: int, dma: int, imm: int, buf: memoryview, pos: int, n: int, plane: int, tos: int,
        now: float,
    ) -> int:  # fmt: skip
        """The checks of docs/DESIGN.md §6, in order, for one data packet — every route to
        placement ends here: length (trimmed?), PSN class (duplicate, out of window), the
        message's earlier failure, R_Key, the region's peers, bounds; then the copy of the
        `n` payload bytes at `buf[pos:]` and the scoreboard mark. `ts` and `imm` are -1 when
        the packet has none. Returns the bytes placed (the caller runs the stall clock)."""
        drops = self.stats.drops_by_reason
        expected = self.expected_length(op, dma)
        if expected < 0:
            drops["bad_dma_length"] += 1
            return 0
        if n > expected:
            drops["bad_length"] += 1
            return 0
        if n < expected:
            self.on_trimmed(psn, ev, ts, plane, tos, now)
            return 0
        full = op in (OP_MIDDLE, OP_FIRST)
        d = (psn - self.cack) & PSN_MASK
        slot = psn & self._rmask
        if d >= self.window or self._ring[slot] != _ZERO:
            if d < self.window or d >= PSN_HALF:
                drops["duplicate"] += 1
                self._immediate.append(_Trigger(psn, ev, plane, None if ts < 0 else ts))
                if d >= PSN_HALF and not full:
                    if rqmsn != self._rqmsn:
                        self._note_rqmsn(rqmsn)  # a completion probe's news
                    status = self._outcomes.get(msn)
                    if status is not None and a:
                        self._announce(status, msn, plane)
            else:
                drops["out_of_window"] += 1
                self.replies.nack(NackReason.PSN_OOR_WINDOW, psn, ev, ts, plane)
            return 0
        # The span that must lie inside the region (`_message_span`, inline: a call and a
        # tuple a packet).
        mtu = self.config.payload_mtu
        if op == OP_MIDDLE:
            span_va, span = va - mtu, 2 * mtu + 1
        elif op in (OP_LAST, OP_LAST_IMM):
            span_va, span = va + n - dma, dma
        else:
            span_va, span = va, dma
        placed = 0
        if self._errors and msn in self._errors:
            drops["message_failed"] += 1  # an earlier packet showed it bad: write none of it
        else:
            region = self.regions.lookup(rkey)
            if region is None:
                self._access_error("bad_rkey", msn, psn, ev, ts, plane)
            elif not region.allows(self.peer_key):
                self._access_error("not_permitted", msn, psn, ev, ts, plane)
            elif not region.contains(span_va, span):
                self._access_error("out_of_bounds", msn, psn, ev, ts, plane)
            else:
                start = va - region.base_va
                region.view[start : start + n] = buf[pos : pos + n]
                placed = n
        # Placed or failed, the PSN is consumed so the window moves on; a failure reaches the
        # sender in the message's AETH (docs/WIRE.md §4).
        self._ring[slot] = _ONE
        self._held += 1
        if not full:
            self._lasts[psn] = (msn, None if imm < 0 else imm, a, plane, rkey, span_va, span)
        if rqmsn != self._rqmsn:
            self._note_rqmsn(rqmsn)
        if tos & 3 == 3:
            # CE: the SACK of its block goes at this pull, marked (docs/DESIGN.md §6); the
            # A bit asks for the AETH, which the LAST's completion sends.
            self._immediate.append(_Trigger(psn, ev, plane, None if ts < 0 else ts, ce=True))
        block = psn & ~63 & PSN_MASK
        if block != self._pend_block:
            if self._pend_block >= 0:
                self._note_pending()
            self._pend_block = block
        self._pend_psn = psn
        self._pend_ev = ev
        self._pend_plane = plane
        self._pend_ts = ts
        return placed

    def _access_error(self, reason: str, msn: int, psn: int, ev: int, ts: int, plane: int) -> None:
        """A WRITE the region refuses (unknown R_Key, a region not registered for this peer,
        out of bounds): nothing is written and the message fails with one reason whatever
        the cause, the remote access error of its AETH (docs/WIRE.md §4), so a peer cannot
        tell an unknown R_Key from a known one. Counted per message; past
        `max_access_errors` the connection is fatal (the session closes it, and the peer
        hears UNEXP_EVENT)."""
        self.stats.drops_by_reason[reason] += 1
        self._errors[msn] = int(Syndrome.NAK_REMOTE_ACCESS)
        self.access_errors += 1
        if self.access_errors > self.config.max_access_errors and not self.fatal:
            self.fatal = "too many remote access errors"
            self.replies.nack(NackReason.UNEXP_EVENT, psn, ev, ts, plane)

    def _note_pending(self) -> None:
        ts = self._pend_ts
        self._blocks[self._pend_block] = (
            self._pend_psn,
            self._pend_ev,
            self._pend_plane,
            None if ts < 0 else ts,
            False,
        )
        self._pend_block = -1

    def on_trimmed(self, psn: int, ev: int, ts: int, plane: int, tos: int, now: float) -> None:
        """A trimmed packet (docs/WIRE.md §5): a hint, never written. Answered with a NACK only
        while its PSN is in the window and not yet received, at most once per (PSN,
        tx_timestamp) — one per transmission — and through a token bucket of its own
        (`trim_nack_rate`, `trim_nack_burst`). On a secured connection it is the one packet
        that skips authentication, so it must never do more than that."""
        drops = self.stats.drops_by_reason
        if (psn - self.cack) & PSN_MASK >= self.window or self._ring[psn & self._rmask] != _ZERO:
            drops["trimmed_stale"] += 1
            return
        self.stats.trimmed_received += 1
        nacked = self._trim_nacked
        if nacked.get(psn) == ts:
            drops["trimmed_repeat"] += 1
            return
        cfg = self.config
        tokens = self._trim_tokens
        if now > self._trim_at:
            tokens = min(
                float(cfg.trim_nack_burst), tokens + (now - self._trim_at) * cfg.trim_nack_rate
            )
            self._trim_at = now
        if tokens < 1.0:
            self._trim_tokens = tokens
            drops["trimmed_rate"] += 1
            return
        self._trim_tokens = tokens - 1.0
        if len(nacked) >= self.window:
            # Keep only PSNs still in the window and not received: at most a window's worth.
            cack, window, ring, rmask = self.cack, self.window, self._ring, self._rmask
            self._trim_nacked = nacked = {
                p: t
                for p, t in nacked.items()
                if (p - cack) & PSN_MASK < window and ring[p & rmask] == _ZERO
            }
        nacked[psn] = ts
        lasthop = (tos & 0xFF) >> 2 == DSCP_TRIMMED_LASTHOP
        reason = NackReason.TRIMMED_LASTHOP if lasthop else NackReason.TRIMMED
        self.replies.nack(reason, psn, ev, ts, plane)

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
        elif not self._blocks and not self._immediate and self._ack_due is None:
            # Nothing placed, marked or due since the last pull (every placed PSN notes its
            # block): cack_psn cannot move and nothing is to answer. Most pulls of a small
            # message's flush are such, the one after its sends among them.
            return
        self._advance_cack()
        cack = self.cack
        # Oldest block first: the sender infers losses per EV from what it has heard, so it
        # must hear of a block before any later one (docs/DESIGN.md §6). A block with an
        # immediate trigger (CE, duplicate) needs no second, plain SACK; nor does any block
        # when the pull ends with a cumulative ACK and nothing is held past cack_psn: the
        # ACK's BTH.PSN acknowledges all they would (one datagram per small message).
        triggers = list(self._immediate)
        if triggers or self._held or not self._ack_ready():
            covered = {t.psn & ~63 & PSN_MASK for t in triggers}
            triggers += [_Trigger(*t) for b, t in self._blocks.items() if b not in covered]
        else:
            # The ACK goes alone: on the path the batch's newest packet just proved.
            for _psn, ev, plane, _ts, _ce in self._blocks.values():
                self.replies.arrived(plane, ev)
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
        route = self.replies.route(trig.plane, force_plane, trig.ev)
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
        if due is None or not self._ack_ready():
            return
        self._ack_due = None
        self.replies.acknowledge(0, due[0], due[1], self.cack)

    def _ack_ready(self) -> bool:
        """A cumulative ACK is due and no failure before it waits for the requester."""
        due = self._ack_due
        failed = self._failed
        return due is not None and not (failed and 0 < (due[0] - failed[0]) & 0xFFFF < 0x8000)

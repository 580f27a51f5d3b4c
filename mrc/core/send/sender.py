"""The requester half of a session: posted WRITEs, their transmissions, what acknowledgements
say of them, loss, resends and completion.

Holds the message queue and the acknowledgement ledger: it takes what each SACK and
ACKNOWLEDGE covers out of the send records, the in-flight accounts and the messages (one RTT,
goodput and plane-cap sample per plane per acknowledgement, Karn's rule) and hands the
flowcells touched to RACK; it acts on NACKs, on RACK's, the RTO's and the silence rules'
verdicts (docs/DESIGN.md §6) with resends, and raises `WriteCompleted` in MSN order from
ACKNOWLEDGE/AETH (docs/DESIGN.md §2 step 7). It turns what it learns into EV signals (loss,
ECN, trim) for the EV table (evs.py) and into congestion signals for its congestion control
(cc), whose window bounds the payload bytes in flight (docs/DESIGN.md §7).

Left to others: the packets' bytes (framing.py), the records by PSN and by plane (sendlog.py),
the bytes in flight and the room for more (inflight.py), which EV a packet takes
(evchoice.py), the SACK bits already reported (scoreboard.py), the AETH deadlines
(completion.py), the loss rules themselves (loss/); it does not decide plane states, send
probes or answer the peer: the plane monitor and the session do.

Invariants: every PSN in [una, next_psn) that is not acknowledged has exactly one *current*
record in `inflight` (the flowcell or resend that last carried it: in flight there, or lost
while it waits in the retransmit queue); nothing acknowledged is ever retransmitted; PSNs of
one message are consecutive and messages take PSNs in MSN order.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Final

from ...wire.ack import NackReason, SackMark, syndrome_ok
from ...wire.bth import BTH, DATA_OPCODES, MSN_MOD, PSN_MOD
from ...wire.packet import AckPacket, NackPacket
from ..cc.control import CongestionControl
from ..config import SessionConfig
from ..errors import LocalProtocolError
from ..events import Event, WriteCompleted
from ..loss.rack import Rack
from ..loss.rto import Expiry, RtoTimers, acked_later, acked_on_plane
from ..loss.silence import SilentPlanes, closed_on_silent
from ..memory import Region
from ..paths.balance import PlaneBalance
from ..paths.evs import EvSignal
from ..paths.planes import PlaneTable, ev_plane
from ..paths.spray import SprayPolicy
from ..secure.aead import PacketProtection
from ..sink import TraceSink
from ..stats import SessionStats
from ..timers import Timer, TimerTable
from ..transmit import Addr, Transmit
from .completion import AwaitingAeth
from .evchoice import EvChoice
from .framing import HEADER_IMM, Framer, cut_flowcell, flowcell_limit
from .inflight import InFlight
from .records import CellRun, OutMessage, SentCell, new_message, tx_timestamp
from .scoreboard import SackScoreboard
from .sendlog import SendLog

PSN_MASK: Final = PSN_MOD - 1
MSN_MASK: Final = MSN_MOD - 1
#: Messages posted and not yet completed; MSNs are compared modulo 2^16.
MAX_OUTSTANDING_MESSAGES: Final = 1 << 15


class Sender:
    def __init__(
        self, config: SessionConfig, *, paths: PlaneTable, spray: SprayPolicy,
        balance: PlaneBalance, cc: CongestionControl, stats: SessionStats, timers: TimerTable,
        events: deque[Event], peer_addrs: dict[int, Addr], initial_psn: int, now: float,
        dest_qp: int = 0, protection: PacketProtection | None = None,
        on_suspect: Callable[[int, float], None] | None = None, trace: TraceSink | None = None,
    ) -> None:  # fmt: skip
        self.config = config
        self.paths = paths
        self.spray = spray
        self.balance = balance
        self.cc = cc
        self.evs = paths.evs
        self.stats = stats
        self.timers = timers
        self.events = events
        self.peer_addrs = peer_addrs
        self.framer = Framer(config, stats=stats, peer_addrs=peer_addrs, protection=protection)
        self.dest_qp = dest_qp
        self.next_psn = initial_psn  # next new PSN
        self.una = initial_psn  # every PSN before it is acknowledged
        self.next_msn = config.initial_msn
        #: (psn, cause, plane to avoid, plane to prefer) of each resend due.
        self.rtx_queue: deque[tuple[int, str, int | None, int | None]] = deque()
        self.pending: deque[OutMessage] = deque()  # not fully sent, MSN order
        self.outstanding: deque[OutMessage] = deque()  # not completed, MSN order
        self.by_msn: dict[int, OutMessage] = {}
        self.awaiting_aeth = AwaitingAeth(config.max_rto)
        self.rack = Rack(config, paths, timers)
        self.log = SendLog(config.payload_mtu, config.window)
        #: The records of the packets not yet acknowledged, by PSN.
        self.inflight = self.log.records
        self.rtos = RtoTimers()
        #: EVs with newly acknowledged first transmissions since the last output pull.
        self._acked_evs: set[int] = set()
        self.scoreboard = SackScoreboard()
        self.last_progress = now
        self.rto_expiries = 0  # consecutive, without progress anywhere
        self.drops: Counter[str] = stats.drops_by_reason
        #: Planes gone silent while the peer answers elsewhere (silence.py).
        self.silent = SilentPlanes(config.reorder_min)
        self.flight = InFlight(config, cc, self.inflight, paths.planes, self.silent.until)
        #: Per plane, the age of the oldest first transmission the current acknowledgement
        #: covers, and the payload bytes of those first transmissions (`_sample_rtts`).
        self._ages: dict[int, float] = {}
        self._acked_bytes: dict[int, int] = {}
        # The current `_ack_bits`/`_ack_range` call's totals (payload bytes acknowledged, and
        # of those the bytes still in flight) and the completion interval once computed.
        self._acked = 0
        self._left = 0
        self._interval = -1.0
        self.choice = EvChoice(paths, spray, balance, self.flight, self.silent.until)
        #: Told of each plane newly suspected silent, with `now` (the session: plane probes).
        self.on_suspect = on_suspect
        #: Bytes lost to RACK/RTO since the last output pull (docs/DESIGN.md §7).
        self._lost_bytes = 0
        self.trace = trace  # retransmits and RTT samples (trace.py)

    # -- user calls -------------------------------------------------------------------------

    def post_write(
        self,
        region: Region,
        offset: int,
        length: int,
        remote_va: int,
        rkey: int,
        imm: int | None,
    ) -> int:
        if len(self.outstanding) >= MAX_OUTSTANDING_MESSAGES:
            raise LocalProtocolError("too many WRITEs outstanding (2^15); wait for completions")
        src = region.local_slice(offset, length)
        msg = new_message(self.next_msn, src, remote_va, rkey, imm, self.config.payload_mtu)
        self.next_msn = (self.next_msn + 1) & MSN_MASK
        self.pending.append(msg)
        self.outstanding.append(msg)
        self.by_msn[msg.msn] = msg
        return msg.msn

    @property
    def seq(self) -> int:
        """Send sequence number of the latest transmission."""
        return self.log.seq

    @property
    def idle(self) -> bool:
        """Nothing posted is still waiting for its outcome."""
        return not self.outstanding

    # -- output -----------------------------------------------------------------------------

    def datagrams(self, now: float, limit: int | None = None) -> list[Transmit]:
        """What to send now; `limit` bounds the new data packets of this pull (whole
        flowcells, so it may go over by less than one)."""
        out: list[Transmit] = []
        if self._acked_evs:
            # Loss inference runs once per receive batch, after every SACK of it: SACKs of
            # one batch (and of every plane read in one wake-up) report blocks in no
            # particular order, and judging between them would blame packets whose
            # acknowledgement is in the next SACK (docs/DESIGN.md §6).
            touched, self._acked_evs = self._acked_evs, set()
            for ev in touched:
                self._detect_losses(ev, now)
        self._judge_silence(now)
        if self._lost_bytes:
            self.cc.on_loss(now, lost=self._lost_bytes, inflight=self._in_flight())
            self._lost_bytes = 0
        self._send_retransmissions(now, out)
        self._send_new(now, out, PSN_MASK if limit is None else limit)
        self._send_completion_probes(now, out)
        self._arm_timers(now)
        return out

    def _in_flight(self) -> int:
        return self.flight.bytes

    def _send_new(self, now: float, out: list[Transmit], budget: int) -> None:
        """New packets, a flowcell per EV (docs/DESIGN.md §11): consecutive packets on the EV the
        spray policy picked, as one GSO batch (two when their headers differ in size:
        `cut_flowcell`), while the window lets each of them go, until `budget` packets are
        framed (whole flowcells)."""
        pending = self.pending
        if not pending:
            return  # most pulls: nothing posted waits
        flowcell = self.config.flowcell
        mtu = self.config.payload_mtu
        # Sized for the longest packet, so the batch of either header size fits in one call.
        cell_limit = flowcell_limit(flowcell, mtu + HEADER_IMM + self.framer.overhead)
        tx_ts = tx_timestamp(now)
        while pending and budget > 0 and (room := self.flight.room(self.next_psn, self.una)) > 0:
            ev = self.choice.next_ev(now)
            if ev is None:
                return
            plane = ev_plane(ev)
            room = self.flight.plane_room(plane, room)
            rqmsn = self.outstanding[0].msn
            first_psn = self.next_psn
            runs, n, late = cut_flowcell(pending, first_psn, min(cell_limit, room), mtu)
            self.next_psn = (first_psn + n) & PSN_MASK
            budget -= n
            rec = self._record(runs, n, first_psn, ev, plane, now, tx_ts, rtx=False, late=late)
            self.flight.add(plane, rec.open_bytes)
            self.framer.frame(
                out, runs, n, first_psn, ev, now, dest_qp=self.dest_qp, rqmsn=rqmsn, late=late
            )

    def _record(
        self, runs: list[CellRun], n: int, psn: int, ev: int, plane: int, now: float,
        tx_ts: int, *, rtx: bool, late: int = 0,
    ) -> SentCell:  # fmt: skip
        """One transmission enters the books: its record in the send log, RACK's FIFO of its
        EV, the EV's counts."""
        rec = self.log.add(runs, n, psn, ev, plane, now, tx_ts, rtx=rtx, late=late)
        self.evs.count_sent(ev, rtx, n)
        self.rack.sent(rec)
        return rec

    def _send_retransmissions(self, now: float, out: list[Transmit]) -> None:
        while self.rtx_queue:
            psn, cause, avoid_plane, prefer = self.rtx_queue[0]
            rec = self.inflight.get(psn)
            i = 0 if rec is None else (psn - rec.psn) & PSN_MASK
            if rec is None or not rec.lost >> i & 1:
                self.rtx_queue.popleft()  # acknowledged, or resent already
                continue
            if cause == "nack_trimmed" and not self.cc.can_send(self._in_flight()):
                return  # congestion, not loss: the resend waits for the window (docs/DESIGN.md §7)
            ev = self.choice.resend_ev(rec.ev, avoid_plane, prefer, now)
            if ev is None:
                return
            self.rtx_queue.popleft()
            msg, index = rec.packet(i)
            plane = ev_plane(ev)
            self._record([(msg, index, 1)], 1, psn, ev, plane, now, tx_timestamp(now), rtx=True)
            self._resend(out, msg, index, psn, ev, now)
            self.flight.add(plane, rec.length(i))
            self.stats.retransmits_by_cause[cause] += 1
            self.stats.plane(plane).retransmits += 1
            if self.trace is not None:
                self.trace.retransmit(psn, ev, plane, cause, now)

    def _send_completion_probes(self, now: float, out: list[Transmit]) -> None:
        """Resend the LAST of each message whose AETH is overdue (completion.py)."""
        for msg in self.awaiting_aeth.due(now):
            ev = self.spray.next_ev(now)
            if ev is None:
                return
            self._resend(out, msg, msg.npkts - 1, msg.last_psn, ev, now)
            self.stats.retransmits_by_cause["completion"] += 1

    def _resend(
        self, out: list[Transmit], msg: OutMessage, index: int, psn: int, ev: int, now: float
    ) -> None:
        """One packet sent again, alone in its datagram."""
        rqmsn = self.outstanding[0].msn if self.outstanding else msg.msn
        self.framer.frame(
            out, [(msg, index, 1)], 1, psn, ev, now, dest_qp=self.dest_qp, rqmsn=rqmsn, rtx=True
        )

    # -- timers -----------------------------------------------------------------------------

    def _arm_timers(self, now: float) -> None:
        if self.rtx_queue:
            # Resends still waiting (a refused transmit, a full window): look again soon
            # even if nothing in flight is left to bring an acknowledgement.
            due = self.timers.get(Timer.REORDER)
            if due is None or due > now + self.config.reorder_min:
                self.timers.set(Timer.REORDER, now + self.config.reorder_min)
        self.rtos.arm(self.timers, self.log.by_plane, self.paths.planes)
        deadline = self.awaiting_aeth.deadline()
        if deadline is None:
            self.timers.cancel(Timer.COMPLETION)
        else:
            self.timers.set(Timer.COMPLETION, deadline)

    def on_retransmit_timer(self, plane: int, now: float) -> bool:
        """The RTO of `plane` expired (docs/DESIGN.md §6). True: give up on the connection."""
        fifo = self.log.by_plane.get(plane)
        oldest = next((r for r in fifo if r.open), None) if fifo else None
        if fifo is None or oldest is None:
            return False
        verdict, here = self.rtos.judge(
            plane, oldest, self.log.by_plane, self.paths.planes, top_seq=self.rack.top_seq,
            last_progress=self.last_progress, reorder_min=self.config.reorder_min, now=now,
        )  # fmt: skip
        if verdict is Expiry.HELD:
            return False
        if verdict is Expiry.LOST or verdict is Expiry.SILENT:
            silent = verdict is Expiry.SILENT
            rto = self.paths.planes[plane].rtt.current
            for rec in list(fifo):
                if rec.open and rec.sent_at + rto <= now:
                    self._declare_lost(rec, rec.open_mask(), "rto", avoid_plane=plane)
                    if acked_later(rec, here) or (silent and self.rack.acked_elsewhere(rec)):
                        self._ev_loss(rec, now, "timeout")
            if silent:
                self.cc.on_plane_silent(plane, now)
        elif verdict is Expiry.STALL_PROBE:
            # The one probe, on the plane that answered last: landing on a plane as dead as
            # this one it would prove nothing, and a window full of such planes' packets
            # leaves the working plane idle (nothing else goes out).
            # Later probes of the same silence go wherever the rotation sends them: the plane
            # that answered last may be the one that died, and the peer answers on the plane a
            # packet came in on, so probing only there could never be answered.
            first = oldest.open_mask()
            prefer = self.choice.freshest(plane) if not self.rto_expiries else None
            self._declare_lost(oldest, first & -first, "rto", avoid_plane=plane, prefer=prefer)
        self.rto_expiries += 1
        return (
            self.rto_expiries >= self.config.rto_retries
            and now - self.last_progress >= self.config.give_up_after
        )

    def on_reorder_timer(self, now: float) -> None:
        for ev in self.rack.pending():
            self._detect_losses(ev, now)

    def _judge_silence(self, now: float) -> None:
        """Suspect planes silent while the peer answers on others, end suspicions, send the
        tail probe when nothing else can bring evidence (silence.py); look again when due."""
        new, wake = self.silent.judge(
            self.log.by_plane, self.paths.planes, now, self.rtos.resumed_at
        )
        if self.on_suspect is not None:
            for plane in new:
                self.on_suspect(plane, now)  # the plane monitor probes it
        if self.pending and self.flight.room(self.next_psn, self.una) <= 0:
            # Only with data waiting behind a full window: an idle tail (a ping-pong's one
            # message) is the RTO's, as docs/NOTES.md §6 measured a general TLP to cost.
            probe, due = self.silent.tail_probe(
                self.log.by_plane, self.paths.planes, now, self.rtos.resumed_at
            )
            if probe is not None:
                first = probe.open_mask()
                self._declare_lost(
                    probe, first & -first, "tail_probe", avoid_plane=probe.plane,
                    prefer=self.choice.freshest(probe.plane),
                )  # fmt: skip
            elif due is not None and (wake is None or due < wake):
                wake = due
        due = self._resend_silent(now)
        if due is not None and (wake is None or due < wake):
            wake = due
        if wake is not None:
            due = self.timers.get(Timer.REORDER)
            if due is None or wake < due:
                self.timers.set(Timer.REORDER, wake)

    def _resend_silent(self, now: float) -> float | None:
        """A PSN window closed on a plane found silent (silence.py `closed_on_silent`): what
        it holds goes out on the others and its cap restarts, no path blamed. But where the
        plane answered flowcells sent later on other EVs, only some of its paths are dead
        (one tier-1 of an ECMP plane): those EVs are also retired, as an RTO would. Returns
        the time to look again."""
        if not self.pending or (self.next_psn - self.una) & PSN_MASK < self.config.window:
            return None
        held = self.inflight.get(self.una)
        if held is None or not held.open_mask() >> ((self.una - held.psn) & PSN_MASK) & 1:
            return None
        dead, due = closed_on_silent(
            held, self.log.by_plane, self.paths.planes, self.config.reorder_min, now
        )
        if dead:
            fifo = self.log.by_plane[held.plane]
            here = acked_on_plane(fifo, 0)
            blamed = [rec for rec in fifo if rec.open and acked_later(rec, here)]
            self._lose_plane(held.plane, "silent")
            for rec in blamed:
                self._ev_loss(rec, now, "timeout")
            self.cc.on_plane_silent(held.plane, now)
        return due

    def on_plane_down(self, plane: int) -> None:
        """Every packet in flight on a DOWN plane is lost at once (docs/DESIGN.md §4)."""
        self._lose_plane(plane, "plane_down")

    def _lose_plane(self, plane: int, cause: str) -> None:
        """Every packet in flight on `plane` is lost, to be resent on the others."""
        for rec in self.log.by_plane.get(plane, ()):
            if rec.open:
                self._declare_lost(rec, rec.open_mask(), cause, avoid_plane=plane)

    # -- input ------------------------------------------------------------------------------

    def _cumulative(self, cack: int) -> int | None:
        """`cack` if it lies within what we sent, una for a late one, None for nonsense."""
        if (cack - self.una) & PSN_MASK > (self.next_psn - self.una) & PSN_MASK:
            # Older than what we know (a late SACK) or beyond what we sent (a bad peer).
            if (self.una - cack) & PSN_MASK > self.config.window * 4:
                self.drops["sack_out_of_range"] += 1
                return None
            return self.una
        return cack

    def on_sack_fields(
        self, cack_psn: int, ack_psn_offset: int, sack_offset: int, sack_bitmap: int, m: int,
        pr: bool, entropy: int, echo: int, valid: bool, pen: int, now: float,
    ) -> None:  # fmt: skip
        """A SACK (docs/WIRE.md §4) as its fields: BTH.PSN (`cack_psn`), SETH's offsets,
        bitmap, mark `m`, PR bit and entropy, CC_STATE's timestamp echo, V bit and cwnd
        penalty, as sackpath.py's one SACK reader (`on_sack`) hands them on."""
        cack = self._cumulative(cack_psn)
        if cack is None:
            return
        sent_span = (self.next_psn - self.una) & PSN_MASK
        trig = (cack_psn + ack_psn_offset) & PSN_MASK
        trig_rec = None if pr else self.inflight.get(trig)
        acked_before, rtt = self.stats.bytes_acked, None
        if trig_rec is not None:
            plane = self.paths.planes[trig_rec.plane]
            # Our packet on this plane reached the peer: the plane works (docs/DESIGN.md §4).
            plane.proven_at = now
            if trig_rec.sent_at > plane.answered_sent_at:
                plane.answered_sent_at = trig_rec.sent_at
            # CC's delay sample (Karn): a first transmission whose own timestamp came back
            # (a non-zero echo counts without our V bit too: docs/WIRE.md §4).
            if (valid or echo) and not trig_rec.rtx and trig_rec.tx_ts == echo:
                rtt = now - trig_rec.sent_at
                if self.trace is not None:
                    self.trace.rtt(trig_rec.plane, trig_rec.ev, rtt, now)
        ce_ev = None
        if m != SackMark.NONE and not pr:
            # The packet that triggered this SACK met congestion on its path (SKIP_ONCE)
            # or the peer wants the path avoided (ALWAYS_SKIP).
            sig = EvSignal.ECN if m == SackMark.SKIP_ONCE else EvSignal.ALWAYS_SKIP
            ce_ev = entropy
            self.evs.signal(
                ce_ev,
                sig,
                now=now,
                seq=self.log.seq,
                sent_seq=trig_rec.seq if trig_rec is not None else None,
                reason="peer asked to skip",
            )
        touched: set[int] = set()
        self._ack_through(cack, now, touched)
        base = (cack_psn + sack_offset) & PSN_MASK
        # Only bits no earlier SACK reported for this block, and only PSNs still unacked.
        bits = self.scoreboard.new_span(base, sack_bitmap, cack, sent_span)
        if bits and self._ack_bits(base, bits, now, touched):
            self._progress(now)
        self._advance_una()
        self._sample_rtts(now)
        self.scoreboard.forget_behind(self.una)
        if touched:
            self.spray.on_acked(touched, ce_ev, now)
            self._acked_evs |= touched
        self.cc.on_ack(
            now,
            acked=self.stats.bytes_acked - acked_before,
            rtt=rtt,
            plane=trig_rec.plane if trig_rec is not None else 0,
            ecn=m == SackMark.SKIP_ONCE and not pr,
            pen=pen,
            inflight=self._in_flight(),
        )

    def on_acknowledge(self, pkt: AckPacket, now: float) -> None:
        self.on_acknowledge_fields(pkt.psn, pkt.aeth.syndrome, pkt.aeth.msn, now)

    def on_acknowledge_fields(self, psn: int, syndrome: int, msn: int, now: float) -> None:
        """An ACKNOWLEDGE (docs/WIRE.md §4) as its fields: BTH.PSN (the responder's
        cack_psn), the AETH's syndrome and MSN. `on_acknowledge` for a decoded one; the byte
        path (ackpath.py) calls it straight."""
        msg = self.by_msn.get(msn)
        if msg is None or msg.last_psn < 0:
            # An older cumulative ACK overtaken by a newer one (they travel on several
            # planes) finds its messages complete: no harm, no drop. Anything else is.
            oldest = self.outstanding[0].msn if self.outstanding else self.next_msn
            if msg is not None or not 0 < (oldest - msn) & MSN_MASK < 0x8000:
                self.drops["stale_aeth"] += 1
            return
        if not 0 < (psn - msg.last_psn) & PSN_MASK <= (self.next_psn - msg.last_psn) & PSN_MASK:
            # The responder answers a message once its cack_psn passed the message's LAST,
            # so BTH.PSN lies after that LAST and at most at our next PSN. An AETH that says
            # otherwise is not the peer's (a blind forgery on an unsecured connection): taken,
            # it would settle PSNs that never arrived, and una would pass the peer's cack_psn
            # for good.
            self.drops["aeth_psn"] += 1
            return
        touched: set[int] = set()
        acked_before = self.stats.bytes_acked
        # The responder leaves out the SACKs an ACK covers whole (docs/DESIGN.md §6): then
        # this ACK brings the delay sample its LAST's SACK would have (Karn: a first
        # transmission, acknowledged by this ACK).
        last = self.inflight.get(msg.last_psn)
        if last is not None:
            bit = 1 << ((msg.last_psn - last.psn) & PSN_MASK)
            if last.rtx or last.acked & bit:
                last = None
        # BTH.PSN of an ACKNOWLEDGE is the responder's cack_psn (docs/WIRE.md §2): everything
        # before it arrived, which the SACKs still on their way may not have said yet.
        cack = self._cumulative(psn)
        if cack is not None:
            self._ack_through(cack, now, touched)
        # An ACK acknowledges every message up to its MSN (IBTA; the responder coalesces
        # them, docs/WIRE.md §4); a NAK only its own. Each message's PSNs arrived or were
        # consumed. One a NACK showed failed waits for its own AETH.
        una, span = self.una, (self.next_psn - self.una) & PSN_MASK
        for older in self.outstanding if syndrome_ok(syndrome) else (msg,):
            if older.status is None and (older is msg or older.failure is None):
                # A message wholly before una (the usual case: cack_psn passed it) has
                # nothing left to take: no walk over its PSNs.
                if (older.last_psn - una) & PSN_MASK < span and self._ack_range(
                    older.first_psn, older.npkts, now, touched
                ):
                    self._progress(now)
                older.settle(syndrome)
            if older is msg:
                break
        self._advance_una()
        self._sample_rtts(now)
        self.scoreboard.forget_behind(self.una)
        if touched:
            self.spray.on_acked(touched, None, now)
            self._acked_evs |= touched
        acked = self.stats.bytes_acked - acked_before
        if acked:
            rtt = None
            if last is not None:
                self.paths.planes[last.plane].proven_at = now
                rtt = now - last.sent_at
                if self.trace is not None:
                    self.trace.rtt(last.plane, last.ev, rtt, now)
            self.cc.on_ack(
                now, acked=acked, rtt=rtt, plane=last.plane if last is not None else 0,
                ecn=False, pen=self.cc.rcv_cwnd_pen, inflight=self._in_flight(),
            )  # fmt: skip
        while self.outstanding and self.outstanding[0].status is not None:
            done = self.outstanding.popleft()
            del self.by_msn[done.msn]
            self.stats.messages_completed += 1
            self.events.append(WriteCompleted(msn=done.msn, status=done.status or 0))
        self.awaiting_aeth.settle()

    def on_nack(self, pkt: NackPacket, now: float) -> None:
        self.stats.nacks_received += 1
        neth = pkt.neth
        rec = self.inflight.get(neth.nack_psn)
        i = 0 if rec is None else (neth.nack_psn - rec.psn) & PSN_MASK
        bit = 1 << i
        open_ = rec is not None and bool(rec.open_mask() & bit)
        reason = neth.nack_reason
        if reason in (NackReason.TRIMMED, NackReason.TRIMMED_LASTHOP):
            # At most one TRIMMED NACK per packet of a send record, matched by PSN and
            # timestamp (docs/WIRE.md §4).
            if rec is None or not open_ or rec.trim_nacked & bit:
                return
            if rec.tx_ts != neth.tx_timestamp:
                return
            rec.trim_nacked |= bit
            self._declare_lost(rec, bit, "nack_trimmed", avoid_plane=None, front=True)
            lasthop = reason is NackReason.TRIMMED_LASTHOP
            self.cc.on_nack(
                now, nacked=rec.length(i), lasthop=lasthop, inflight=self._in_flight()
            )
            if reason is NackReason.TRIMMED:
                # Congestion on that path, not a failure: skip it a while (docs/WIRE.md §4).
                self.evs.signal(
                    rec.ev, EvSignal.TRIMMED, now=now, seq=self.log.seq, sent_seq=rec.seq
                )
        elif reason is NackReason.PSN_OOR_WINDOW and rec is not None and open_:
            self._declare_lost(rec, bit, "nack_other", avoid_plane=None)
        elif reason in (NackReason.BAD_RKEY, NackReason.OUT_OF_BOUNDS) and rec is not None:
            # Early; the AETH's remote access error is the outcome.
            rec.packet(i)[0].failure = reason
        # NO_BITMAP / NO_PKT_BUFFER / NO_RESOURCE: the RTO resends.

    def on_transmit_failed(self, tx: Transmit, now: float) -> None:
        """A local queue refused `tx` whole (ENOBUFS): its packets never left the host. Data
        packets are resent at once on another plane, counted as `local` drops; the plane's cap
        is cut, and no EV is blamed: the path never saw them."""
        bth = BTH.decode(tx.data)  # our own bytes: its first packet's BTH
        if bth.opcode not in DATA_OPCODES:
            return  # a control packet: SACKs and probes are never resent
        psn, ev, plane = bth.psn, tx.ev, tx.plane
        count = -(-len(tx.data) // tx.segment_size) if tx.segment_size else 1
        lost = 0
        for i in reversed(range(count)):  # queued at the front: the lowest PSN goes first
            p = (psn + i) & PSN_MASK
            rec = self.inflight.get(p)
            bit = 0 if rec is None else 1 << ((p - rec.psn) & PSN_MASK)
            if rec is None or not rec.open_mask() & bit or rec.ev != ev:
                continue  # acknowledged or resent since: not this transmission
            lost += 1
            self._declare_lost(rec, bit, "local", avoid_plane=plane, front=True)
        if lost:
            self.stats.local_drops += lost
            self.cc.on_local_drop(plane, now, inflight=self.flight.by_plane[plane])

    # -- acknowledgement accounting ---------------------------------------------------------
    # Which PSNs an acknowledgement covers comes from the input handlers above (the SACK
    # scoreboard, cumulative PSNs, an AETH's message); these mark them in their records, take
    # them out of the in-flight accounts, count their bytes, start the completion wait of every
    # message whose packets are all in (completion.py), hand each flowcell touched to RACK once,
    # and turn the first transmissions seen into one RTT, goodput and plane-cap sample per plane
    # per acknowledgement (Karn's rule).

    def _ack_range(self, first: int, count: int, now: float, touched: set[int]) -> int:
        """The `count` PSNs from `first` arrived (a cumulative acknowledgement, or the PSNs of
        a message an AETH acknowledged): `_ack_bits` for a run of PSNs."""
        records = self.inflight
        slots, smask = records.slots, records.mask
        self._acked = self._left = 0
        self._interval = -1.0
        k = 0
        while k < count:
            psn = (first + k) & PSN_MASK
            rec = slots[psn & smask]
            if rec is not None:
                i = (psn - rec.psn) & PSN_MASK
                # A slot reused by a later PSN: this one was acknowledged long ago.
                if i < rec.n:
                    span = min(rec.n - i, count - k)
                    want = ((1 << span) - 1) << i
                    if self._ack_cell(rec, want, now, touched) == want:
                        k += span  # the record's PSNs in range, all taken at once
                        continue
            # A PSN of that record resent elsewhere has its own record: go on one at a time.
            k += 1
        return self._acks_done()

    def _ack_bits(self, base: int, bits: int, now: float, touched: set[int]) -> int:
        """The PSNs `base + k` for every bit k of `bits` (bit 0 first) arrived: mark them in
        their records, a flowcell at a time, count their bytes, and hand each flowcell touched
        to RACK. PSNs without a record (acknowledged already) are skipped. The hottest loop
        of the receive path: a record's packets are taken with integer masks, and its
        accounts (in flight, per plane, acknowledged bytes) change once per record. Returns
        the payload bytes newly acknowledged."""
        records = self.inflight
        slots, smask = records.slots, records.mask
        self._acked = self._left = 0
        self._interval = -1.0
        while bits:
            low = bits & -bits
            k = low.bit_length() - 1
            psn = (base + k) & PSN_MASK
            rec = slots[psn & smask]
            i = 0 if rec is None else (psn - rec.psn) & PSN_MASK
            if rec is None or i >= rec.n:
                bits ^= low  # acknowledged already (its slot empty, or reused by a later PSN)
                continue
            want = ((bits >> k) & ((1 << (rec.n - i)) - 1)) << i
            taken = self._ack_cell(rec, want, now, touched)
            bits &= ~((taken >> i) << k)  # the rest of `want` belongs to resends' records
        return self._acks_done()

    def _ack_cell(self, rec: SentCell, want: int, now: float, touched: set[int]) -> int:
        """Take the packets of `rec` in `want` (a mask of its packets) whose current record
        it is; returns the mask taken (never empty: the lowest bit of `want` is one)."""
        taken = self.inflight.take(rec, want)
        # Each message counts its packets taken, a run (a message's packets) at a time.
        shift = 0
        for msg, _, count in rec.runs:
            got = (taken >> shift) & ((1 << count) - 1)
            if got:
                self._msg_acked(msg, got.bit_count(), now)
            shift += count
        last_bit = 1 << (rec.n - 1)
        size = rec.size
        extra = rec.last - size  # the last packet's length differs from the others'
        acked = taken.bit_count() * size + (extra if taken & last_bit else 0)
        fresh = taken & ~rec.lost
        if fresh:
            opened = fresh.bit_count()
            left = opened * size + (extra if fresh & last_bit else 0)
            rec.open -= opened
            rec.open_bytes -= left
            self.flight.by_plane[rec.plane] -= left
            self._left += left
        rec.acked |= taken
        self._acked += acked
        self._cell_acked(rec, rec.sent_last(taken), acked, now, touched)
        return taken

    def _msg_acked(self, msg: OutMessage, count: int, now: float) -> None:
        """`count` more packets of `msg` arrived: once all have, its completion wait starts."""
        msg.acked += count
        if msg.acked == msg.npkts and msg.status is None:
            if self._interval < 0:  # once per call: many small messages complete in one SACK
                self._interval = max(pl.rtt.current for pl in self.paths.planes.values())
            self.awaiting_aeth.add(msg, now, self._interval)

    def _acks_done(self) -> int:
        """The current call's bytes acknowledged: out of flight, counted; returned."""
        acked = self._acked
        if acked:
            self.flight.left(self._left)
            self.stats.bytes_acked += acked
        return acked

    def _cell_acked(
        self, cell: SentCell, top: int, acked: int, now: float, touched: set[int]
    ) -> None:
        """`acked` bytes of `cell` were acknowledged, `top` the one of its packets that left
        last: RACK's turn, and the plane's RTT and goodput sample (first transmissions only:
        Karn, RFC 8985 §6.2)."""
        if self.rack.acked(cell, top, now):
            age = now - cell.sent_at
            plane = cell.plane
            if age > self._ages.get(plane, -1.0):
                self._ages[plane] = age
            self._acked_bytes[plane] = self._acked_bytes.get(plane, 0) + acked
            touched.add(cell.ev)
            pl = self.paths.planes[plane]
            if cell.sent_at > pl.answered_sent_at:
                # Every flowcell acknowledged, not only the one a SACK names as its trigger
                # (a coalesced SACK covers many planes): silence.py weighs planes by it.
                pl.answered_sent_at = cell.sent_at

    def _sample_rtts(self, now: float) -> None:
        """One RTT sample per plane per acknowledgement: the longest a first transmission
        it newly acknowledged took (Karn's rule: never a retransmitted PSN). The RTO has to
        cover the slowest acknowledgement, not the freshest: a receive batch acknowledges
        packets that waited in the peer's socket queue together with ones that did not."""
        if self._ages:
            planes = self.paths.planes
            for plane, age in self._ages.items():
                pl = planes[plane]
                pl.rtt.sample(max(0.0, age))
                pl.acked_at = now
                acked = self._acked_bytes.get(plane, 0)
                self.balance.on_acked(plane, acked, age, now)
                self.cc.on_plane_sample(
                    plane, age, acked=acked, inflight=self.flight.by_plane[plane], now=now
                )
            self._ages.clear()
            self._acked_bytes.clear()

    # -- helpers ----------------------------------------------------------------------------

    def _progress(self, now: float) -> None:
        """New bytes were acknowledged: progress, for the RTO."""
        self.rtos.progress(now, self.last_progress, self.config.min_rto, self.paths.planes)
        self.last_progress = now
        self.rto_expiries = 0

    def _ack_through(self, cack: int, now: float, touched: set[int]) -> None:
        """Everything before `cack` arrived (a cumulative acknowledgement)."""
        una = self.una
        if cack != una and self._ack_range(una, (cack - una) & PSN_MASK, now, touched):
            self._progress(now)
        self.una = cack

    def _advance_una(self) -> None:
        una, next_psn = self.una, self.next_psn
        slots, mask = self.inflight.slots, self.inflight.mask
        while una != next_psn and slots[una & mask] is None:  # [una, next_psn) is in the ring
            una = (una + 1) & PSN_MASK
        self.una = una

    def _detect_losses(self, ev: int, now: float) -> None:
        for rec, mask in self.rack.lost(ev, now):
            self._declare_lost(rec, mask, "rack", avoid_plane=None)
            self._ev_loss(rec, now, "loss")

    def _ev_loss(self, rec: SentCell, now: float, reason: str) -> None:
        """A loss on `rec`'s EV retires it (MRC's rule; docs/DESIGN.md §4 and §6)."""
        self.evs.signal(
            rec.ev, EvSignal.LOSS, now=now, seq=self.log.seq, sent_seq=rec.seq, reason=reason
        )
        self.spray.on_loss(rec.ev, now)

    def _declare_lost(
        self, rec: SentCell, mask: int, cause: str, *, avoid_plane: int | None,
        front: bool = False, prefer: int | None = None,
    ) -> None:  # fmt: skip
        """The packets of `rec` in `mask` still in flight are lost: out of the window, and
        queued for resending (at the front for `front`, in PSN order)."""
        psns, lost = rec.lose(mask)
        if not psns:
            return
        entries = [(psn, cause, avoid_plane, prefer) for psn in psns]
        self.flight.remove(rec.plane, lost)
        if cause in ("rack", "rto"):
            self._lost_bytes += lost  # told to CC at the next output pull
        if front:
            self.rtx_queue.extendleft(reversed(entries))
        else:
            self.rtx_queue.extend(entries)

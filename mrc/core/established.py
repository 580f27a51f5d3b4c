"""An established connection: the second phase of a session (phase.py), built whole when the
handshake ends.

`Established` builds, from the agreed config, everything a connection runs on: the plane and EV
tables (planes.py, evs.py), the spray and balance policies, the congestion control, the
`Sender`, the `Receiver`, the `PlaneMonitor` (health.py) and, when secured, the `SecureChannel`
(gate.py); each gets what it needs in its constructor (the peer's QPN, the keys, the trace),
and nothing is set on them afterwards. The callbacks between parts that need each other (the
EV table's floor and the sender's suspicion go to the plane monitor, which reads the sender's
PSNs) go through this object's own methods.

It routes each decoded packet to its handler (`_handle_<kind>`), runs the connection's timers
and collects the outputs in the order docs/DESIGN.md §3 gives. A responder's connection starts
half-open: until the requester is heard from, only CM copies are answered. Closing is the
`Lifecycle`'s (phase.py).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from ..wire.ack import NackReason
from ..wire.bth import Opcode
from ..wire.errors import DecodeError
from ..wire.packet import (
    AckPacket,
    CmPacket,
    DataPacket,
    EndpointPacket,
    NackPacket,
    Packet,
    ProbePacket,
    SackPacket,
    decode_packet,
    peek_dest_qp,
)
from ..wire.probe import EETH, ERTH, EndpointOp
from .cc.control import make_cc
from .cm import build_disconnect
from .config import SessionConfig
from .events import Event
from .memory import Region, RegionTable
from .paths.balance import make_balance
from .paths.evlabel import restore_ev, strip_control
from .paths.health import PlaneMonitor
from .paths.planes import PlaneState, PlaneTable
from .paths.spray import make_spray
from .phase import Lifecycle, Phase, SessionState
from .recv.receiver import Receiver
from .secure.aead import TRAILER, PacketProtection
from .secure.gate import SecureChannel
from .send.ackpath import take_ack
from .send.sackpath import on_decoded, take_sack
from .send.sender import Sender
from .sink import CcRow, TraceSink
from .stats import PlaneStats, SessionStats
from .timers import Timer, TimerTable
from .transmit import Addr, Transmit

#: What the peer only sends on a plane it uses toward us (docs/DESIGN.md §4, reverse path).
_ACKNOWLEDGEMENTS: Final = frozenset({SackPacket, NackPacket, AckPacket})


class Established(Phase):
    """One established connection and its parts."""

    def __init__(
        self,
        life: Lifecycle,
        config: SessionConfig,
        *,
        qpn: int,
        peer_qpn: int,
        connection_id: int,
        nonce: bytes,
        initial_psn: int,
        peer_initial_psn: int,
        regions: RegionTable,
        rng: random.Random,
        stats: SessionStats,
        timers: TimerTable,
        events: deque[Event],
        out: list[Transmit],
        peer_addrs: dict[int, Addr],
        now: float,
        protection: PacketProtection | None = None,
        peer_reply: bytes = b"",
        reply: bytes = b"",
        trace: TraceSink | None = None,
        peer_key: bytes | None = None,
    ) -> None:
        """`reply`: a responder's REPLY, sent again for each copy of the REQUEST (a responder
        starts half-open); `peer_reply`: a secured requester's REPLY, whose copies are no
        news; `protection`: a secured connection's keys; `peer_key`: the peer's authenticated
        static key (secured only), which regions scoped to peers check."""
        super().__init__(life, qpn=qpn, out=out, peer_addrs=peer_addrs)
        life.establish()
        self.config = config
        self.peer_qpn = peer_qpn
        self.connection_id = connection_id
        self.nonce = nonce
        self.stats = stats
        self.timers = timers
        self.reply = reply
        self.half_open = bool(reply)
        self.noevx = config.ev_encoding == "flowlabel"  # agreed in CM (evlabel.py)
        self._data_seen = False
        self._heard = False  # an acknowledgement came in this receive batch
        recording = trace if trace is not None and trace.recording else None
        self.paths = paths = PlaneTable(
            config, rng, events, on_floor=self._floor_reached, trace=trace
        )
        self.spray = make_spray(config.spray, paths, rng)
        self.balance = make_balance(config.plane_balance, paths)
        self.cc = make_cc(config.cc, config)
        self.sender = sender = Sender(
            config, paths=paths, spray=self.spray, balance=self.balance, cc=self.cc,
            stats=stats, timers=timers, events=events, peer_addrs=peer_addrs,
            initial_psn=initial_psn, now=now, dest_qp=peer_qpn, protection=protection,
            on_suspect=self._suspect, trace=recording,
        )  # fmt: skip
        self.receiver = receiver = Receiver(
            config, regions=regions, paths=paths, stats=stats, events=events,
            peer_addrs=peer_addrs, initial_psn=peer_initial_psn, dest_qp=peer_qpn,
            peer_key=peer_key,
        )  # fmt: skip
        self.monitor = PlaneMonitor(
            config, paths=paths, timers=timers, stats=stats, events=events,
            peer_addrs=peer_addrs, out=out, next_psn=lambda: sender.next_psn,
            send_seq=lambda: sender.seq, on_down=sender.on_plane_down, peer_qpn=peer_qpn,
            trace=recording,
        )  # fmt: skip
        drops = stats.drops_by_reason
        self.channel = (
            SecureChannel(protection, config, receiver, drops, peer_reply)
            if protection is not None
            else None
        )
        self._handlers: dict[type[Any], Callable[[Any, int, int, float], None]] = {
            DataPacket: self._handle_data,
            SackPacket: self._handle_sack,
            NackPacket: self._handle_nack,
            AckPacket: self._handle_acknowledge,
            ProbePacket: self._handle_probe,
            EndpointPacket: self._handle_endpoint,
            CmPacket: self._handle_cm,
        }
        timers.cancel(Timer.CM_RETRY)
        if trace is not None:
            evs = paths.evs.by_ev
            trace.evs_started([evs[ev] for ev in sorted(evs)], now)
        if self.half_open:
            timers.set(Timer.HALF_OPEN, now + config.half_open_timeout)
            # Planes the REQUEST has not reached us on yet wait for their address (learn_addr).
            for p in paths.planes:
                if p not in peer_addrs:
                    paths.set_state(p, PlaneState.DOWN, "no address")

    # -- callbacks between the parts ----------------------------------------------------------

    def _floor_reached(self, plane: int, now: float) -> None:
        """A loss hit a plane at its EV floor (evs.py): the monitor probes it."""
        self.monitor.floor_reached(plane, now)

    def _suspect(self, plane: int, now: float) -> None:
        """The sender suspects a plane silent (silence.py): the monitor probes it."""
        self.monitor.suspect(plane, now)

    # -- user calls ---------------------------------------------------------------------------

    def post_write(
        self, region: Region, offset: int, length: int, remote_va: int, rkey: int,
        imm: int | None,
    ) -> int:  # fmt: skip
        if self.life.state is not SessionState.ESTABLISHED:
            return super().post_write(region, offset, length, remote_va, rkey, imm)
        return self.sender.post_write(region, offset, length, remote_va, rkey, imm)

    def close(self, now: float) -> None:
        """Send CM_DISCONNECT on every plane and end the session at once."""
        if self.life.state is SessionState.ESTABLISHED:
            data = build_disconnect(
                self.config, local_qpn=self.qpn, remote_qpn=self.peer_qpn,
                connection_id=self.connection_id,
            )  # fmt: skip
            for plane in sorted(self.peer_addrs):
                self.cm_send(plane, data)
        self.life.close("closed")

    def plane_status(self, plane: int, up: bool, now: float) -> None:
        if plane in self.paths.planes and not self.life.closed:
            self.monitor.local_status(plane, up, now)

    def unreachable(self, plane: int, addr: Addr, now: float) -> None:
        if not self.life.closed and self.peer_addrs.get(plane) == addr:
            self.monitor.unreachable(plane, now)

    def transmit_failed(self, tx: Transmit, now: float) -> None:
        if not self.life.closed:
            self.sender.on_transmit_failed(tx, now)

    def learn_addr(self, plane: int, addr: Addr, now: float) -> None:
        if plane in self.peer_addrs or plane not in self.paths.planes:
            return
        self.peer_addrs[plane] = addr
        pl = self.paths.planes[plane]
        if pl.state is PlaneState.DOWN and pl.down_reason == "no address":
            self.paths.set_state(plane, PlaneState.UP)

    # -- reports ------------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return self.sender.idle

    def ev_stats(self, now: float) -> list[dict[str, Any]]:
        return self.paths.evs.report(now)

    def plane_state(self, plane: int) -> str:
        pl = self.paths.planes.get(plane)
        return pl.state.value if pl is not None else "absent"

    def cc_rows(self) -> list[CcRow]:
        cc, stats = self.cc, self.stats.planes
        flight = self.sender.flight.planes_now()
        rows: list[CcRow] = []
        for plane in sorted(self.paths.planes):
            cap = cc.plane_window(plane)
            ps = stats.get(plane)
            sent = ps.bytes_sent if ps is not None else 0
            rows.append((plane, cc.window if cap is None else cap, flight.get(plane, 0), sent))
        return rows

    # -- inputs -------------------------------------------------------------------------------

    def receive_span(
        self, plane: int, buf: memoryview, at: int, end: int, seg: int, tos: int, now: float,
        slot: bool = False,
    ) -> int:  # fmt: skip
        """One read's datagrams (`buf[at:end]`, `seg` bytes each but the last) up to the first
        for another QP, whose offset it returns (`end` once all were taken). Data is placed
        from `buf`, SACKs read from it, the rest decoded."""
        if self.life.state is SessionState.CLOSED:
            return end
        ps = self.stats.plane(plane)
        runs = self.receiver if not self.half_open else None
        channel = self.channel
        first = at
        while at < end:
            if runs is not None:
                if channel is None:
                    k = runs.on_data_span(buf, at, end, seg, self.qpn, plane, tos, ps, now)
                elif not buf.readonly:
                    k = self._secured_run(channel, buf, at, end, seg, plane, tos, ps, now, slot)
                    if k < 0:
                        return end  # the session closed
                else:
                    k = at  # (bytes, as the simulator hands them: the gate opens a copy)
                self._data_seen = self._data_seen or k > at
                at = k
                if runs.fatal:
                    self._fatal(runs.fatal)
                    return end
                if at >= end:
                    break
            stop = min(at + seg, end)
            data = buf[at:stop]
            if at != first and (len(data) < 12 or peek_dest_qp(data) != self.qpn):
                break  # another QP's (or too short to say): the endpoint routes it
            at = stop
            if not self._receive_one(data, plane, tos, ps, now):
                return end
        # Acknowledgements or data: the peer still uses this plane toward us.
        if (self._heard or self._data_seen) and plane in self.paths.planes:
            self.paths.planes[plane].heard_at = now
        self._heard = False
        if self._data_seen:
            self._data_seen = False
            self.monitor.traffic_received(now)
        return at

    def _secured_run(
        self, channel: SecureChannel, buf: memoryview, at: int, end: int, seg: int,
        plane: int, tos: int, ps: PlaneStats, now: float, slot: bool,
    ) -> int:  # fmt: skip
        """`Receiver.on_data_span` for a secured connection: the read's full-size data
        packets for this QP are opened where they lie, one after the other (tag and window,
        `SecureChannel.open_full_at`), and each run of them that opened goes to the
        receiver's one path as an unsecured read does (`on_data_span`, their trailers
        skipped), until one that is not such a packet: returns its offset (-1 once the
        session closed). A packet that fails its tag is counted and skipped; nothing acts on
        it or on any packet after it before that packet opened."""
        receiver = self.receiver
        qpn = self.qpn
        while True:
            run = at
            failed = False
            while at < end:
                size = min(seg, end - at)
                if not channel.full_at(buf, at, size, qpn):
                    break
                if not channel.open_full_at(buf, at, slot):
                    failed = True
                    break
                at += size
            k = run
            while k < at:
                k = receiver.on_data_span(buf, k, at, seg, qpn, plane, tos, ps, now, TRAILER)
                if receiver.fatal:
                    self._fatal(receiver.fatal)
                    return -1
                if k < at:
                    # Opened, but not in the byte layouts: the decoder takes it.
                    ps.packets_received += 1
                    ps.bytes_received += seg
                    if not self._opened(buf[k : k + seg - TRAILER], plane, tos, now):
                        return -1
                    k += seg
            if at > run:
                self._data_seen = True
            if not failed:
                return at
            ps.packets_received += 1  # the one that failed its tag (counted by the gate)
            ps.bytes_received += seg
            at += seg

    def _receive_one(
        self, data: bytes | memoryview, plane: int, tos: int, ps: PlaneStats, now: float
    ) -> bool:
        """One datagram the byte path did not take; False once the session closed."""
        ps.packets_received += 1
        ps.bytes_received += len(data)
        channel = self.channel
        if channel is not None:
            # Nothing below sees a packet that did not authenticate (gate.py).
            opened = channel.open(data, plane, tos, now)
            if opened is None:
                return True
            data = opened
            receiver = self.receiver
            if not self.half_open and receiver.on_data_bytes(data, plane, tos, now):
                self._data_seen = True
                return self._fatal(receiver.fatal) if receiver.fatal else True
        return self._opened(data, plane, tos, now)

    def _opened(self, data: bytes | memoryview, plane: int, tos: int, now: float) -> bool:
        """One datagram past the gate (or of an unsecured connection) that is not a data
        packet of the byte layouts: a SACK or ACK read from its bytes, else decoded and
        handed to its handler. False once the session closed."""
        receiver, drops = self.receiver, self.stats.drops_by_reason
        if (
            not self.half_open and not self.noevx
            and (
                take_sack(data, self.config.p_key, self.sender, self.monitor, now)
                or take_ack(data, self.config.p_key, self.sender, now)
            )
        ):  # fmt: skip
            self._heard = True
            return not self.life.closed
        try:
            pkt: Packet = decode_packet(data)
        except DecodeError as exc:
            drops[f"decode_{exc.field}"] += 1
            return True
        if pkt.p_key != self.config.p_key:
            drops["p_key"] += 1
            return True
        if self.noevx and not restore_ev(pkt, data, plane, tos):
            drops["ev_no_label"] += 1
            return True
        if type(pkt) is DataPacket and not self.half_open:
            self._data_seen = True
            receiver.on_data(pkt, plane, tos, now)
            return self._fatal(receiver.fatal) if receiver.fatal else True
        if not isinstance(pkt, CmPacket):
            if self.half_open:
                self.half_open = False
                self.timers.cancel(Timer.HALF_OPEN)
            self._heard = self._heard or type(pkt) in _ACKNOWLEDGEMENTS
        self._handlers[type(pkt)](pkt, plane, tos, now)
        if receiver.fatal:
            return self._fatal(receiver.fatal)
        return not self.life.closed

    def _fatal(self, reason: str) -> bool:
        """The receiver found the connection must end (too many remote access errors,
        receiver.py): it is closed (the receiver's UNEXP_EVENT NACK tells the peer, at the
        next pull). False: the session closed."""
        if not self.life.closed:
            self.life.close(reason)
        return False

    def on_timer(self, timer: Timer, plane: int | None, now: float) -> None:
        if timer is Timer.RETRANSMIT and plane is not None:
            if self.sender.on_retransmit_timer(plane, now):
                self.life.close("retry limit")
        elif timer is Timer.REORDER:
            self.sender.on_reorder_timer(now)
        elif timer is Timer.PLANE_PROBE and plane is not None:
            self.monitor.on_timer(plane, now)
            if self.monitor.gave_up(not self.sender.idle, now):
                self.life.close("no usable plane")
        elif timer is Timer.EV_PROBE:
            self.monitor.on_ev_timer(now)
        elif timer is Timer.REVERSE_PROBE:
            self.monitor.on_reverse_timer(now)
        elif timer is Timer.HALF_OPEN:
            self.life.close("half-open timeout")
        # Timer.COMPLETION: datagrams() resends the LAST whose AETH is overdue.

    # -- outputs ------------------------------------------------------------------------------

    def datagrams(self, now: float, limit: int | None) -> list[Transmit]:
        # Drained in place: the plane monitor appends to this same list.
        out = self.out[:]
        self.out.clear()
        receiver = self.receiver
        # SACKs answer everything received since the last pull: in io, every plane a wake-up
        # drained, so one SACK covers a 64-PSN block however its packets were spread over
        # the planes (docs/DESIGN.md §6).
        receiver.end_batch(now)
        out += receiver.replies.out
        receiver.replies.out.clear()
        if self.life.state is SessionState.ESTABLISHED:
            out.extend(self.sender.datagrams(now, limit))
            if self.paths.evs.take_probes_changed():
                # An EV was retired: its probes need the timer (docs/DESIGN.md §4).
                self.monitor.arm_ev_timer()
        if self.noevx:
            strip_control(out)
        if self.channel is not None:
            self.channel.seal_control(out)
        return out

    # -- handlers -----------------------------------------------------------------------------

    def _handle_data(self, pkt: DataPacket, plane: int, tos: int, now: float) -> None:
        self._data_seen = True
        self.receiver.on_data(pkt, plane, tos, now)

    def _handle_sack(self, pkt: SackPacket, plane: int, tos: int, now: float) -> None:
        on_decoded(pkt, self.sender, self.monitor, now)

    def _handle_nack(self, pkt: NackPacket, plane: int, tos: int, now: float) -> None:
        if pkt.neth.nack_reason is NackReason.UNEXP_EVENT:
            # docs/WIRE.md §4: the peer hit a fatal protocol error on this connection.
            self.life.close("peer reported a fatal protocol error (UNEXP_EVENT)")
            return
        self.sender.on_nack(pkt, now)

    def _handle_acknowledge(self, pkt: AckPacket, plane: int, tos: int, now: float) -> None:
        self.sender.on_acknowledge(pkt, now)

    def _handle_probe(self, pkt: ProbePacket, plane: int, tos: int, now: float) -> None:
        self.receiver.on_probe(pkt, plane, tos)

    def _handle_endpoint(self, pkt: EndpointPacket, plane: int, tos: int, now: float) -> None:
        header = pkt.header
        if isinstance(header, ERTH):
            if header.op is EndpointOp.PORT_STATUS:
                self.monitor.peer_ports(header.port_status_mask, now)
            # A connectionless request (QPN 0x2) is answered the same way (endpoint.py).
            self.monitor.answer_endpoint(header, plane, pkt.ev, pkt.probe_id, pkt.dest_qp)
        elif isinstance(header, EETH) and header.op is EndpointOp.EV_PROBE:
            # Its port_status_mask is a snapshot from when the peer answered; answers cross
            # newer announcements on the way, so only PORT_STATUS and PORTSTATE set the mask.
            self.monitor.on_ev_probe_answer(plane, pkt.probe_id, now)

    def _handle_cm(self, pkt: CmPacket, plane: int, tos: int, now: float) -> None:
        op = pkt.opcode
        cmh = pkt.cmh
        drops = self.stats.drops_by_reason
        if op is Opcode.CM_REQUEST:
            # Responder: a copy of the REQUEST (another plane, or a retry): same REPLY bytes.
            if self.reply and cmh.nonce == self.nonce:
                self.cm_send(plane, self.reply)
            else:
                drops["cm_unexpected"] += 1
        elif op is Opcode.CM_REPLY:
            return  # a copy from another plane: the first one established us
        elif op is Opcode.CM_DISCONNECT and cmh.local_qpn == self.peer_qpn:
            self.life.close("disconnect")
        else:
            drops["cm_mismatch"] += 1  # a REJECT or a DISCONNECT not for us

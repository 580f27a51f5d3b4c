"""A `Session` is one MRC connection (a QP): the sans-I/O protocol object.

Theory of operation
-------------------
The session never touches a socket, a clock or an event loop (docs/DESIGN.md §3). It is driven by:

* inputs: `receive_span(plane, buf, at, end, seg, tos, now)` (one read, a GRO batch or one
  datagram, which the `Endpoint` routes here by DestQP; `receive_datagrams` for a list),
  `plane_status(plane, up, now)`, `handle_timer(now)`, and user calls (`post_write`, `close`);
* outputs, pulled once after every input, in this order: `datagrams_to_send(now)`,
  `get_timer()`, then `next_event()` until it returns None.

Inside, the work is split by concern: `Sender` (posted WRITEs, send records, loss inference,
completions), `Receiver` (checks, placement, SACK/NACK/AETH), `PlaneTable` (planes, EVs, RTTs),
a spray policy, and the CM handshake helpers in `cm.py`. This module holds the handshake state,
routes decoded packets to their handler (`_handle_<kind>`), hands plane suspicion, probing and
DOWN/UP to `PlaneMonitor` (planes.py), and collects outputs. `now` is monotonic seconds.

Security (docs/WIRE.md §7). With `config.security` "auth" or "encrypt" a session needs an
`Identity` (handshake.py): `Endpoint.connect(..., peer_key=...)` and `Endpoint.listen` pass it
in. Every received datagram then goes through `SecureChannel.open` (secure.py) before anything
else looks at it, data packets are sealed as they are framed and control packets when output
is pulled. `peer_static_key` is the peer's authenticated static public key once established.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, Final

from ..wire.ack import NackReason, SackMark
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
from . import cm
from .cc.control import make_cc
from .config import SessionConfig
from .errors import LocalProtocolError
from .events import (
    ConnectionClosed,
    Event,
)
from .memory import Region, RegionTable
from .paths.balance import make_balance
from .paths.evlabel import restore_ev, strip_control
from .paths.health import PlaneMonitor
from .paths.planes import PlaneState, PlaneTable
from .paths.spray import make_spray
from .recv.receiver import Receiver
from .secure.aead import PacketProtection
from .secure.gate import SecureChannel, before_keys, reply_for
from .secure.handshake import HEAD, Identity, Requester
from .send.sackpath import take_sack
from .send.sender import Sender
from .stats import PlaneStats, SessionStats
from .timers import Timer, TimerTable
from .trace import TraceCollector
from .transmit import Addr, Transmit

#: What the peer only sends on a plane it uses toward us (docs/DESIGN.md §4, reverse path).
_ACKNOWLEDGEMENTS: Final = frozenset({SackPacket, NackPacket, AckPacket})


class SessionState(Enum):
    CONNECTING = "connecting"  # requester: REQUEST sent, waiting for REPLY/REJECT
    ESTABLISHED = "established"
    CLOSED = "closed"


Datagram = tuple[bytes | memoryview, int]  # (bytes, TOS byte of the IP header)


class Session:
    """One connection. Build it with `Session.connect` or `Session.accept` (the Endpoint does)."""

    def __init__(
        self,
        config: SessionConfig,
        *,
        qpn: int,
        regions: RegionTable,
        rng: random.Random,
        peer_addrs: dict[int, Addr],
        now: float,
    ) -> None:
        self.config = config.validate()
        self.qpn = qpn
        self.peer_qpn = 0
        self.regions = regions
        self.rng = rng
        self.peer_addrs = peer_addrs
        self.state = SessionState.CONNECTING
        self.close_reason = ""
        self.stats = SessionStats()
        self.timers = TimerTable()
        self.connection_id = 0
        self.nonce = b""
        self.initial_psn = (
            config.initial_psn if config.initial_psn is not None else rng.getrandbits(24)
        )
        self.half_open = False
        self._events: deque[Event] = deque()
        self._out: list[Transmit] = []
        # Requester: the REQUEST per plane and retry state. Responder: the REPLY bytes.
        self._private_data = b""
        self._cm_attempts = 0
        self._cm_interval = config.cm_retry
        self._reply = b""
        self._data_seen = False
        self._heard = False  # an acknowledgement came in this receive batch
        self.noevx = False
        #: Secured connections: the requester's handshake half until the REPLY verifies, the
        #: REQUEST head the transcript hashes, then the gate (secure.py).
        self._requester: Requester | None = None
        self._request_head = b""
        self._protection: PacketProtection | None = None
        self.channel: SecureChannel | None = None
        #: The peer's static X25519 public key, authenticated by the handshake (secured only).
        self.peer_static_key: bytes | None = None
        self.paths = PlaneTable(config, rng, self._events)
        self.spray = make_spray(config.spray, self.paths, rng)
        self.balance = make_balance(config.plane_balance, self.paths)
        self.cc = make_cc(config.cc, config)
        self.sender: Sender | None = None
        self.receiver: Receiver | None = None
        self.planes: PlaneMonitor | None = None
        self.trace: TraceCollector | None = None  # set by whoever wants one (trace.py)
        self._handlers: dict[type[Any], Callable[[Any, int, int, float], None]] = {
            DataPacket: self._handle_data,
            SackPacket: self._handle_sack,
            NackPacket: self._handle_nack,
            AckPacket: self._handle_acknowledge,
            ProbePacket: self._handle_probe,
            EndpointPacket: self._handle_endpoint,
            CmPacket: self._handle_cm,
        }

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def connect(
        cls, config: SessionConfig, peer_addrs: Mapping[int, Addr], private_data: bytes, *,
        qpn: int, regions: RegionTable, rng: random.Random, now: float,
        identity: Identity | None = None, peer_key: bytes | None = None,
    ) -> Session:  # fmt: skip
        """A requester: sends a REQUEST on every plane of `config.plane_mask` it has an address
        for, and repeats them on a backoff until a REPLY or REJECT arrives (docs/WIRE.md §6).
        A secured one needs `identity`; `peer_key` is the responder static key it accepts
        (None: any key the identity's allowlist holds)."""
        config = config.validate()
        missing = [p for p in config.planes if p not in peer_addrs]
        if missing:
            raise LocalProtocolError(f"no peer address for plane(s) {missing}")
        if config.secured and identity is None:
            raise LocalProtocolError(f"security {config.security!r} needs an identity (a key)")
        s = cls(config, qpn=qpn, regions=regions, rng=rng, peer_addrs=dict(peer_addrs), now=now)
        if config.secured and identity is not None:
            s._requester = Requester(identity, peer_key)
        s._private_data = cm.check_private_data(private_data)
        s.nonce = rng.randbytes(16)
        s.connection_id = rng.getrandbits(64)
        s._send_requests(now)
        return s

    @classmethod
    def accept(
        cls, config: SessionConfig, request: CmPacket, plane: int, addr: Addr,
        reply_private_data: bytes, *, qpn: int, regions: RegionTable, rng: random.Random,
        now: float, identity: Identity | None = None, request_raw: bytes | memoryview = b"",
    ) -> Session:  # fmt: skip
        """A responder for a REQUEST, with `config` already negotiated (`cm.negotiate`). A
        secured one does its half of the key agreement with `identity` over the REQUEST's
        bytes `request_raw` (LocalProtocolError if the REQUEST's keys are degenerate)."""
        s = cls(config, qpn=qpn, regions=regions, rng=rng, peer_addrs={plane: addr}, now=now)
        req = request.cmh
        s.peer_qpn = req.local_qpn
        s.nonce = req.nonce
        s.connection_id = req.connection_id
        s._reply, s._protection = reply_for(
            s.config,
            request,
            request_raw,
            identity,
            qpn=qpn,
            initial_psn=s.initial_psn,
            private_data=cm.check_private_data(reply_private_data),
            rng=rng,
            drops=s.stats.drops_by_reason,
        )
        if request.key_block is not None:
            s.peer_static_key = request.key_block.static
        s._establish(peer_initial_psn=req.initial_psn, now=now)
        s.half_open = True
        s.timers.set(Timer.HALF_OPEN, now + config.half_open_timeout)
        # Planes the REQUEST has not reached us on yet wait for their address (learn_addr).
        for p in s.paths.planes:
            if p not in s.peer_addrs:
                s.paths.set_state(p, PlaneState.DOWN, "no address")
        s._cm_send(plane, s._reply)
        s._events.append(cm.established(s, bytes(request.private_data)))
        return s

    def _establish(self, *, peer_initial_psn: int, now: float) -> None:
        self.state = SessionState.ESTABLISHED
        self.noevx = self.config.ev_encoding == "flowlabel"  # agreed in CM (evlabel.py)
        self.paths = PlaneTable(self.config, self.rng, self._events)
        self.spray = make_spray(self.config.spray, self.paths, self.rng)
        self.balance = make_balance(self.config.plane_balance, self.paths)
        self.cc = make_cc(self.config.cc, self.config)
        paths, stats, events, addrs = self.paths, self.stats, self._events, self.peer_addrs
        self.sender = sender = Sender(
            self.config, paths=paths, spray=self.spray, balance=self.balance, cc=self.cc,
            stats=stats, timers=self.timers, events=events, peer_addrs=addrs,
            initial_psn=self.initial_psn, now=now,
        )  # fmt: skip
        self.sender.dest_qp = self.peer_qpn
        self.receiver = Receiver(
            self.config, regions=self.regions, paths=paths, stats=stats, events=events,
            peer_addrs=addrs, initial_psn=peer_initial_psn,
        )  # fmt: skip
        self.receiver.replies.dest_qp = self.peer_qpn
        self.planes = PlaneMonitor(
            self.config, paths=paths, timers=self.timers, stats=stats, events=events,
            peer_addrs=addrs, out=self._out, next_psn=lambda: sender.next_psn,
            send_seq=lambda: sender.seq, on_down=sender.on_plane_down,
        )  # fmt: skip
        self.planes.peer_qpn = self.peer_qpn
        self.sender.on_suspect = self.planes.suspect
        self.timers.cancel(Timer.CM_RETRY)
        if self._protection is not None:
            self.sender.framer.protection = self._protection
            drops = self.stats.drops_by_reason
            self.channel = SecureChannel(self._protection, self.config, self.receiver, drops)
            self.channel.reply = self._protection.reply
        if self.trace is not None:
            self.trace.attach(self, now)

    # -- user calls ---------------------------------------------------------------------------

    def post_write(
        self,
        region: Region,
        offset: int,
        length: int,
        remote_va: int,
        rkey: int,
        imm: int | None = None,
    ) -> int:
        """Queue a WRITE of `region[offset:offset+length]` to the peer's `remote_va` under
        `rkey`, as WRITE_WITH_IMM when `imm` is given. Returns its MSN; `WriteCompleted(msn,
        status)` follows in MSN order. The bytes must stay unchanged until then."""
        if self.state is not SessionState.ESTABLISHED or self.sender is None:
            raise LocalProtocolError(f"cannot post a WRITE on a {self.state.value} session")
        return self.sender.post_write(region, offset, length, remote_va, rkey, imm)

    def close(self, now: float) -> None:
        """Send CM_DISCONNECT on every plane and end the session at once."""
        if self.state is SessionState.CLOSED:
            return
        if self.state is SessionState.ESTABLISHED:
            data = cm.build_disconnect(
                self.config, local_qpn=self.qpn, remote_qpn=self.peer_qpn,
                connection_id=self.connection_id,
            )  # fmt: skip
            for plane in sorted(self.peer_addrs):
                self._cm_send(plane, data)
        self._close("closed")

    def plane_status(self, plane: int, up: bool, now: float) -> None:
        """io/ or sim/ report a local plane change (a send error such as ENETUNREACH = down)."""
        if plane in self.paths.planes and self.planes is not None and not self.is_closed:
            self.planes.local_status(plane, up, now)

    def transmit_failed(self, tx: Transmit, now: float) -> None:
        """io/ or sim/ report that a local queue refused `tx` whole (ENOBUFS from a full
        qdisc): the sender resends its data packets elsewhere and blames no path."""
        if self.sender is not None and not self.is_closed:
            self.sender.on_transmit_failed(tx, now)

    def learn_addr(self, plane: int, addr: Addr, now: float) -> None:
        """The endpoint saw the peer on `plane` at `addr` (responder: a late REQUEST copy)."""
        if plane in self.peer_addrs or plane not in self.paths.planes:
            return
        self.peer_addrs[plane] = addr
        pl = self.paths.planes[plane]
        if pl.state is PlaneState.DOWN and pl.down_reason == "no address":
            self.paths.set_state(plane, PlaneState.UP)

    # -- state for callers ------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self.state is SessionState.CLOSED

    @property
    def idle(self) -> bool:
        """Every posted WRITE has completed."""
        return self.sender is None or self.sender.idle

    def ev_stats(self, now: float) -> list[dict[str, Any]]:
        """Per-EV counters and states (`end.mrc.evs[]`, docs/DESIGN.md §10)."""
        return self.paths.evs.report(now)

    def plane_state(self, plane: int) -> str:
        pl = self.paths.planes.get(plane)
        return pl.state.value if pl is not None else "absent"

    # -- inputs -------------------------------------------------------------------------------

    def receive_datagrams(self, plane: int, datagrams: list[Datagram], now: float) -> None:
        """One batch from `plane`: `receive_span` for each datagram, with its TOS word."""
        for data, tos in datagrams:  # (a closed session's receive_span takes nothing)
            self.receive_span(plane, memoryview(data), 0, len(data), len(data), tos, now)

    def receive_span(
        self, plane: int, buf: memoryview, at: int, end: int, seg: int, tos: int, now: float
    ) -> int:
        """One read's datagrams (`buf[at:end]`, `seg` bytes each but the last) up to the first
        for another QP, whose offset it returns (`end` once all were taken; the endpoint routed
        the first here). Data is placed from `buf`, SACKs read from it, the rest decoded."""
        if self.state is SessionState.CLOSED:
            return end
        ps = self.stats.plane(plane)
        runs = self.receiver if not self.half_open and not self.config.secured else None
        first = at
        while at < end:
            if runs is not None:
                k = runs.on_data_span(buf, at, end, seg, self.qpn, plane, tos, ps, now)
                self._data_seen = self._data_seen or k > at
                at = k
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
        if self._data_seen and self.planes is not None:
            self._data_seen = False
            self.planes.traffic_received(now)
        return at

    def _receive_one(
        self, data: bytes | memoryview, plane: int, tos: int, ps: PlaneStats, now: float
    ) -> bool:
        """One datagram the byte path did not take; False once the session closed."""
        ps.packets_received += 1
        ps.bytes_received += len(data)
        receiver, drops = self.receiver, self.stats.drops_by_reason
        if self.config.secured:
            # Nothing below sees a packet that did not authenticate (secure.py).
            channel = self.channel
            if channel is None:
                self._before_keys(data, plane, now)
                return not self.is_closed
            opened = channel.open(data, plane, tos)
            if opened is None:
                return True
            data = opened
            if (
                receiver is not None
                and not self.half_open
                and receiver.on_data_bytes(data, plane, tos, now)
            ):
                self._data_seen = True
                return True
        sender, planes = self.sender, self.planes
        if (
            sender is not None and planes is not None and not self.half_open and not self.noevx
            and take_sack(data, self.config.p_key, sender, planes, now)
        ):  # fmt: skip
            self._heard = True
            return not self.is_closed
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
        if type(pkt) is DataPacket and receiver is not None and not self.half_open:
            self._data_seen = True
            receiver.on_data(pkt, plane, tos, now)
            return True
        if not isinstance(pkt, CmPacket):
            if self.state is not SessionState.ESTABLISHED:
                drops["not_connected"] += 1
                return True
            if self.half_open:
                self.half_open = False
                self.timers.cancel(Timer.HALF_OPEN)
            self._heard = self._heard or type(pkt) in _ACKNOWLEDGEMENTS
        self._handlers[type(pkt)](pkt, plane, tos, now)
        return not self.is_closed

    def handle_timer(self, now: float) -> None:
        """Run every timer due at `now`."""
        for timer, plane in self.timers.pop_expired(now):
            if self.state is SessionState.CLOSED:
                return
            if timer is Timer.RETRANSMIT and self.sender is not None and plane is not None:
                if self.sender.on_retransmit_timer(plane, now):
                    self._close("retry limit")
            elif timer is Timer.REORDER and self.sender is not None:
                self.sender.on_reorder_timer(now)
            elif timer is Timer.PLANE_PROBE and plane is not None and self.planes is not None:
                self.planes.on_timer(plane, now)
            elif timer is Timer.EV_PROBE and self.planes is not None:
                self.planes.on_ev_timer(now)
            elif timer is Timer.REVERSE_PROBE and self.planes is not None:
                self.planes.on_reverse_timer(now)
            elif timer is Timer.CM_RETRY:
                self._send_requests(now)
            elif timer is Timer.HALF_OPEN:
                self._close("half-open timeout")
            # Timer.COMPLETION: datagrams_to_send resends the LAST whose AETH is overdue.

    # -- outputs ------------------------------------------------------------------------------

    def datagrams_to_send(self, now: float, limit: int | None = None) -> list[Transmit]:
        """Everything to send now. With `limit`, at most about that many new data packets
        (whole flowcells): pull again until the list comes back empty, so the first
        packets leave while the rest are still being framed (quinn's `poll_transmit` takes a
        `max_datagrams` the same way). Control packets and resends are never held back."""
        # Drained in place: the plane monitor appends to this same list.
        out = self._out[:]
        self._out.clear()
        if self.receiver is not None:
            # SACKs answer everything received since the last pull: in io, every plane a
            # wake-up drained, so one SACK covers a 64-PSN block however its packets were
            # spread over the planes (docs/DESIGN.md §6).
            self.receiver.end_batch(now)
            out += self.receiver.replies.out
            self.receiver.replies.out.clear()
        if self.sender is not None and self.state is SessionState.ESTABLISHED:
            out.extend(self.sender.datagrams(now, limit))
            if self.paths.evs.probes_changed and self.planes is not None:
                # An EV was retired: its probes need the timer (docs/DESIGN.md §4).
                self.paths.evs.probes_changed = False
                self.planes.arm_ev_timer()
        if self.noevx:
            strip_control(out)
        if self.channel is not None:
            self.channel.seal_control(out)
        return out

    def get_timer(self) -> float | None:
        return None if self.state is SessionState.CLOSED else self.timers.next_deadline()

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    # -- handlers -----------------------------------------------------------------------------

    def _handle_data(self, pkt: DataPacket, plane: int, tos: int, now: float) -> None:
        assert self.receiver is not None
        self._data_seen = True
        self.receiver.on_data(pkt, plane, tos, now)

    def _handle_sack(self, pkt: SackPacket, plane: int, tos: int, now: float) -> None:
        assert self.sender is not None and self.planes is not None
        seth = pkt.seth
        if seth.pr:
            self.planes.on_answer(seth.ack_psn_offset & 0xFFFF, seth.m is SackMark.NONE, now)
        if pkt.port_state is not None:
            self.planes.peer_ports(pkt.port_state, now, pkt.cack_psn)
        self.sender.on_sack(pkt, now)

    def _handle_nack(self, pkt: NackPacket, plane: int, tos: int, now: float) -> None:
        assert self.sender is not None
        if pkt.neth.nack_reason is NackReason.UNEXP_EVENT:
            # docs/WIRE.md §4: the peer hit a fatal protocol error on this connection.
            self._close("peer reported a fatal protocol error (UNEXP_EVENT)")
            return
        self.sender.on_nack(pkt, now)

    def _handle_acknowledge(self, pkt: AckPacket, plane: int, tos: int, now: float) -> None:
        assert self.sender is not None
        self.sender.on_acknowledge(pkt, now)

    def _handle_probe(self, pkt: ProbePacket, plane: int, tos: int, now: float) -> None:
        assert self.receiver is not None
        self.receiver.on_probe(pkt, plane, tos)

    def _handle_endpoint(self, pkt: EndpointPacket, plane: int, tos: int, now: float) -> None:
        assert self.planes is not None
        header = pkt.header
        if isinstance(header, ERTH):
            if header.op is EndpointOp.PORT_STATUS:
                self.planes.peer_ports(header.port_status_mask, now)
            # A connectionless request (QPN 0x2) is answered the same way (endpoint.py).
            self.planes.answer_endpoint(header, plane, pkt.ev, pkt.probe_id, pkt.dest_qp)
        elif isinstance(header, EETH) and header.op is EndpointOp.EV_PROBE:
            # Its port_status_mask is a snapshot from when the peer answered; answers cross
            # newer announcements on the way, so only PORT_STATUS and PORTSTATE set the mask.
            self.planes.on_ev_probe_answer(plane, pkt.probe_id, now)

    def _handle_cm(self, pkt: CmPacket, plane: int, tos: int, now: float) -> None:
        op = pkt.opcode
        cmh = pkt.cmh
        drops = self.stats.drops_by_reason
        if op is Opcode.CM_REQUEST:
            # Responder: a copy of the REQUEST (another plane, or a retry): same REPLY bytes.
            if self._reply and cmh.nonce == self.nonce:
                self._cm_send(plane, self._reply)
            else:
                drops["cm_unexpected"] += 1
        elif op is Opcode.CM_REPLY:
            if self.state is not SessionState.CONNECTING:
                return  # a copy from another plane: the first one established us
            if cmh.remote_qpn != self.qpn:
                drops["cm_mismatch"] += 1
                return
            agreed = cm.adopt_reply(self.config, cmh)
            if agreed is None:
                self._close("rejected: reply with parameters we did not offer")
                return
            self.config = agreed
            self.peer_qpn = cmh.local_qpn
            self._establish(peer_initial_psn=cmh.initial_psn, now=now)
            self._events.append(cm.established(self, bytes(pkt.private_data)))
            assert self.planes is not None
            self.planes.announce_ports(now)
        elif op is Opcode.CM_REJECT:
            if self.state is SessionState.CONNECTING and cmh.nonce == self.nonce:
                self._close(f"rejected: {cm.reject_name(cmh)}")
            else:
                drops["cm_mismatch"] += 1
        elif op is Opcode.CM_DISCONNECT:
            if self.state is SessionState.ESTABLISHED and cmh.local_qpn == self.peer_qpn:
                self._close("disconnect")
            else:
                drops["cm_mismatch"] += 1

    # -- CM ---------------------------------------------------------------------------------

    def _before_keys(self, data: bytes | memoryview, plane: int, now: float) -> None:
        """A secured requester before its REPLY verified: only a REPLY or a REJECT counts."""
        assert self._requester is not None
        args = (self._request_head, self._private_data, self.nonce, self.stats.drops_by_reason)
        pkt, protection, key = before_keys(self._requester, self.config, data, *args)
        if protection is not None:
            self._protection, self.peer_static_key = protection, key
        if pkt is not None:
            self._handle_cm(pkt, plane, 0, now)

    def _send_requests(self, now: float) -> None:
        if self._cm_attempts >= self.config.cm_attempts:
            wrong_key = self.stats.drops_by_reason["unknown_peer"] > 0
            self._close("no answer" + " (the responder's key is not one we accept)" * wrong_key)
            return
        self._cm_attempts += 1
        key_block = self._requester.key_block if self._requester is not None else None
        for plane in self.config.planes:
            request = cm.build_request(
                self.config, plane=plane, local_qpn=self.qpn, initial_psn=self.initial_psn,
                nonce=self.nonce, connection_id=self.connection_id,
                private_data=self._private_data, key_block=key_block,
            )  # fmt: skip
            self._request_head = request[:HEAD]
            self._cm_send(plane, request)
        self.timers.set(Timer.CM_RETRY, now + self._cm_interval)
        self._cm_interval = min(self._cm_interval * 2, 2.0)

    def _cm_send(self, plane: int, data: bytes) -> None:
        if plane in self.peer_addrs:
            self._out.append(Transmit(plane=plane, addr=self.peer_addrs[plane], data=data))

    def _close(self, reason: str) -> None:
        if self.state is SessionState.CLOSED:
            return
        self.state = SessionState.CLOSED
        self.close_reason = reason
        self.timers.clear()
        self._events.append(ConnectionClosed(reason=reason))

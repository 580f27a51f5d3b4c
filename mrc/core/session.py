"""A `Session` is one MRC connection (a QP): the sans-I/O protocol object.

Theory of operation
-------------------
The session never touches a socket, a clock or an event loop (docs/DESIGN.md §3). It is driven by:

* inputs: `receive_span(plane, buf, at, end, seg, tos, now)` (one read, a GRO batch or one
  datagram, which the `Endpoint` routes here by DestQP; `receive_datagrams` for a list),
  `plane_status(plane, up, now)`, `handle_timer(now)`, and user calls (`post_write`, `close`);
* outputs, pulled once after every input, in this order: `datagrams_to_send(now)`,
  `get_timer()`, then `next_event()` until it returns None.

A session lives in two phases (phase.py), each an object built whole when it begins: a
requester's handshake (`Connecting`, connecting.py) and the established connection
(`Established`, established.py: planes, EVs, spray, congestion control, `Sender`, `Receiver`,
plane monitor, the secure gate). This module holds what outlives a phase (QPN, counters,
timers, events, the peer's addresses), builds the established phase when the REPLY comes (a
responder's at once), hands every input to the current phase, and shows callers the parts of
an established one (`paths`, `sender`, `cc`, ...). `now` is monotonic seconds.

Security (docs/WIRE.md §7). With `config.security` "auth" or "encrypt" a session needs an
`Identity` (handshake.py): `Endpoint.connect(..., peer_key=...)` and `Endpoint.listen` pass it
in. Every received datagram then goes through `SecureChannel.open` (gate.py) before anything
else looks at it, data packets are sealed as they are framed and control packets when output
is pulled. `peer_static_key` is the peer's authenticated static public key once established.

Tracing: a `TraceSink` (sink.py) handed in at construction goes to the parts that record into
it; the owner asks for congestion and drop samples with `sample_trace(now)`.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping
from typing import Any

from ..wire.packet import CmPacket, peek_dest_qp
from .cc.control import CongestionControl
from .cm import check_private_data
from .cm import established as established_event
from .config import SessionConfig
from .connecting import Agreed, Connecting
from .errors import LocalProtocolError
from .established import Established
from .events import Event
from .memory import Region, RegionTable
from .paths.balance import PlaneBalance
from .paths.health import PlaneMonitor
from .paths.planes import PlaneTable
from .paths.spray import SprayPolicy
from .phase import Lifecycle, Phase, SessionState
from .recv.receiver import Receiver
from .secure.aead import PacketProtection
from .secure.gate import SecureChannel, reply_for
from .secure.handshake import Identity, Requester
from .send.sender import Sender
from .sink import TraceSink
from .stats import SessionStats
from .timers import TimerTable
from .transmit import Addr, Transmit

__all__ = ["Datagram", "Session", "SessionState"]

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
        trace: TraceSink | None = None,
        private_data: bytes = b"",
        requester: Requester | None = None,
        request: CmPacket | None = None,
        reply_private_data: bytes = b"",
        identity: Identity | None = None,
        request_raw: bytes | memoryview = b"",
        ids: random.Random | None = None,
        wall: float | None = None,
    ) -> None:
        """A requester without `request` (`connect`), a responder for `request` (`accept`).
        `ids` gives the initial PSN, nonces and connection id (default: `rng`)."""
        ids = ids if ids is not None else rng
        self.config = config = config.validate()
        self.qpn = qpn
        self.regions = regions
        self.rng = rng
        self.peer_addrs = peer_addrs
        self.stats = SessionStats()
        self.timers = TimerTable()
        #: Where this session's trace records go (sink.py); None: no trace.
        self.trace = trace
        self._events: deque[Event] = deque()
        self._out: list[Transmit] = []
        self.life = Lifecycle(self._events, self.timers, established=request is not None)
        self.initial_psn = (
            config.initial_psn if config.initial_psn is not None else ids.getrandbits(24)
        )
        #: The peer's static X25519 public key, authenticated by the handshake (secured only).
        self.peer_static_key: bytes | None = None
        self._phase: Phase
        if request is None:
            handshake = Connecting(
                self.life, config, qpn=qpn, initial_psn=self.initial_psn, rng=ids,
                stats=self.stats, timers=self.timers, out=self._out, peer_addrs=peer_addrs,
                private_data=private_data, requester=requester, on_reply=self._on_reply,
                wall=wall,
            )  # fmt: skip
            self.peer_qpn = 0
            self.nonce = handshake.nonce
            self.connection_id = handshake.connection_id
            self._phase = handshake
            handshake.start(now)
            return
        # A responder: the endpoint negotiated `config`; it answers and starts established.
        req = request.cmh
        self.peer_qpn = req.local_qpn
        self.nonce = req.nonce
        self.connection_id = req.connection_id
        reply, protection = reply_for(
            config, request, request_raw, identity, qpn=qpn, initial_psn=self.initial_psn,
            private_data=check_private_data(reply_private_data), rng=ids,
            drops=self.stats.drops_by_reason,
        )  # fmt: skip
        if request.key_block is not None:
            self.peer_static_key = request.key_block.static
        conn = self._established(
            config, peer_initial_psn=req.initial_psn, now=now, protection=protection, reply=reply
        )
        self._phase = conn
        (plane,) = peer_addrs  # the plane the REQUEST came on
        conn.cm_send(plane, reply)
        self._events.append(established_event(conn, bytes(request.private_data)))

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def connect(
        cls, config: SessionConfig, peer_addrs: Mapping[int, Addr], private_data: bytes, *,
        qpn: int, regions: RegionTable, rng: random.Random, now: float,
        identity: Identity | None = None, peer_key: bytes | None = None,
        trace: TraceSink | None = None, ids: random.Random | None = None,
        wall: float | None = None,
    ) -> Session:  # fmt: skip
        """A requester: sends a REQUEST on every plane of `config.plane_mask` it has an address
        for, and repeats them on a backoff until a REPLY or REJECT arrives (docs/WIRE.md §6).
        A secured one needs `identity`; `peer_key` is the responder static key it accepts
        (None: any key the identity's allowlist holds). `trace` receives its records."""
        config = config.validate()
        missing = [p for p in config.planes if p not in peer_addrs]
        if missing:
            raise LocalProtocolError(f"no peer address for plane(s) {missing}")
        if config.secured and identity is None:
            raise LocalProtocolError(f"security {config.security!r} needs an identity (a key)")
        requester = (
            Requester(identity, peer_key) if config.secured and identity is not None else None
        )
        return cls(
            config, qpn=qpn, regions=regions, rng=rng, peer_addrs=dict(peer_addrs), now=now,
            trace=trace, private_data=private_data, requester=requester, ids=ids, wall=wall,
        )  # fmt: skip

    @classmethod
    def accept(
        cls, config: SessionConfig, request: CmPacket, plane: int, addr: Addr,
        reply_private_data: bytes, *, qpn: int, regions: RegionTable, rng: random.Random,
        now: float, identity: Identity | None = None, request_raw: bytes | memoryview = b"",
        trace: TraceSink | None = None, ids: random.Random | None = None,
    ) -> Session:  # fmt: skip
        """A responder for a REQUEST, with `config` already negotiated (`cm.negotiate`). A
        secured one does its half of the key agreement with `identity` over the REQUEST's
        bytes `request_raw` (LocalProtocolError if the REQUEST's keys are degenerate)."""
        return cls(
            config, qpn=qpn, regions=regions, rng=rng, peer_addrs={plane: addr}, now=now,
            trace=trace, request=request, reply_private_data=reply_private_data,
            identity=identity, request_raw=request_raw, ids=ids,
        )  # fmt: skip

    def _established(
        self, config: SessionConfig, *, peer_initial_psn: int, now: float,
        protection: PacketProtection | None, peer_reply: bytes = b"", reply: bytes = b"",
    ) -> Established:  # fmt: skip
        return Established(
            self.life, config, qpn=self.qpn, peer_qpn=self.peer_qpn,
            connection_id=self.connection_id, nonce=self.nonce, initial_psn=self.initial_psn,
            peer_initial_psn=peer_initial_psn, regions=self.regions, rng=self.rng,
            stats=self.stats, timers=self.timers, events=self._events, out=self._out,
            peer_addrs=self.peer_addrs, now=now, protection=protection, peer_reply=peer_reply,
            reply=reply, trace=self.trace, peer_key=self.peer_static_key,
        )  # fmt: skip

    def _on_reply(self, agreed: Agreed, now: float) -> None:
        """The handshake ended with a REPLY (connecting.py): the connection begins."""
        self.config = agreed.config
        self.peer_qpn = agreed.peer_qpn
        if agreed.peer_static_key is not None:
            self.peer_static_key = agreed.peer_static_key
        conn = self._established(
            agreed.config, peer_initial_psn=agreed.peer_initial_psn, now=now,
            protection=agreed.protection, peer_reply=agreed.reply,
        )  # fmt: skip
        self._phase = conn
        self._events.append(established_event(conn, agreed.private_data))
        conn.monitor.announce_ports(now)

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
        return self._phase.post_write(region, offset, length, remote_va, rkey, imm)

    def close(self, now: float) -> None:
        """Send CM_DISCONNECT on every plane (once established) and end the session at once."""
        if not self.life.closed:
            self._phase.close(now)

    def plane_status(self, plane: int, up: bool, now: float) -> None:
        """io/ or sim/ report a local plane change (a send error such as ENETUNREACH = down)."""
        self._phase.plane_status(plane, up, now)

    def unreachable(self, plane: int, addr: Addr, now: float) -> None:
        """io/ read a hard ICMP error (port, host or network unreachable) about a datagram
        sent to `addr` on `plane`: evidence against a plane that never answered
        (docs/DESIGN.md §4). Ignored during the handshake and for another peer's address."""
        conn = self.established
        if conn is not None:
            conn.unreachable(plane, addr, now)

    def transmit_failed(self, tx: Transmit, now: float) -> None:
        """io/ or sim/ report that a local queue refused `tx` whole (ENOBUFS from a full
        qdisc): the sender resends its data packets elsewhere and blames no path."""
        self._phase.transmit_failed(tx, now)

    def learn_addr(self, plane: int, addr: Addr, now: float) -> None:
        """The peer is on `plane` at `addr` (kept only while the plane has no address)."""
        self._phase.learn_addr(plane, addr, now)

    def answer_request_copy(self, plane: int, addr: Addr, now: float) -> None:
        """A responder got a copy of its REQUEST (the endpoint checked it is the same bytes):
        it learns the plane's address from it and sends its REPLY bytes there again."""
        conn = self.established
        if conn is not None and conn.reply:
            conn.learn_addr(plane, addr, now)
            conn.cm_send(plane, conn.reply)

    def wants_addr(self, plane: int) -> bool:
        """A secured connection's plane that has no peer address yet: a datagram on it is
        taken alone (`receive_from`), so that only one that authenticates teaches it."""
        if plane in self.peer_addrs:
            return False  # the usual case, on the receive path: one dict lookup
        conn = self.established
        return conn is not None and conn.channel is not None and plane in conn.paths.planes

    def receive_from(self, plane: int, data: bytes | memoryview, addr: Addr, tos: int,
                     now: float) -> None:  # fmt: skip
        """One datagram from `addr` on a plane that `wants_addr`: processed as usual, and
        `addr` becomes the plane's peer address if its tag verified (it moved the replay
        window), never otherwise (docs/DESIGN.md §8)."""
        conn = self.established
        channel = conn.channel if conn is not None else None
        top = channel.protection.replay.top if channel is not None else None
        self.receive_datagrams(plane, [(data, tos)], now)
        if conn is not None and channel is not None and channel.protection.replay.top != top:
            conn.learn_addr(plane, addr, now)

    def sample_trace(self, now: float) -> None:
        """Push what the trace samples at `now` (sink.py): the drop counters and, when the
        sink says one is due, a congestion row per plane."""
        trace = self.trace
        if trace is None or not trace.recording:
            return
        rows = self._phase.cc_rows() if trace.cc_due(now) else None
        trace.sample(now, self.stats.drops_by_reason, rows)

    # -- state for callers ------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self.life.state

    @property
    def close_reason(self) -> str:
        return self.life.close_reason

    @property
    def is_closed(self) -> bool:
        return self.life.state is SessionState.CLOSED

    @property
    def idle(self) -> bool:
        """Every posted WRITE has completed."""
        return self._phase.idle

    @property
    def established(self) -> Established | None:
        """The established connection (None during the handshake)."""
        phase = self._phase
        return phase if isinstance(phase, Established) else None

    @property
    def half_open(self) -> bool:
        """A responder that has not heard from its requester since the REPLY."""
        conn = self.established
        return conn is not None and conn.half_open

    @property
    def noevx(self) -> bool:
        """EVs ride in the flow label (agreed in CM, evlabel.py)."""
        conn = self.established
        return conn is not None and conn.noevx

    def ev_stats(self, now: float) -> list[dict[str, Any]]:
        """Per-EV counters and states (`end.mrc.evs[]`, docs/DESIGN.md §10)."""
        return self._phase.ev_stats(now)

    def plane_state(self, plane: int) -> str:
        """The plane's state ("up", "down"; "absent" when not a plane of the connection)."""
        return self._phase.plane_state(plane)

    # The parts of an established connection; `sender`, `receiver`, `planes` and `channel`
    # are None during the handshake, the others raise.

    def _connection(self) -> Established:
        conn = self.established
        if conn is None:
            raise LocalProtocolError(f"a {self.state.value} session has no connection yet")
        return conn

    @property
    def paths(self) -> PlaneTable:
        return self._connection().paths

    @property
    def cc(self) -> CongestionControl:
        return self._connection().cc

    @property
    def spray(self) -> SprayPolicy:
        return self._connection().spray

    @property
    def balance(self) -> PlaneBalance:
        return self._connection().balance

    @property
    def sender(self) -> Sender | None:
        conn = self.established
        return conn.sender if conn is not None else None

    @property
    def receiver(self) -> Receiver | None:
        conn = self.established
        return conn.receiver if conn is not None else None

    @property
    def planes(self) -> PlaneMonitor | None:
        """The plane monitor (health.py)."""
        conn = self.established
        return conn.monitor if conn is not None else None

    @property
    def channel(self) -> SecureChannel | None:
        conn = self.established
        return conn.channel if conn is not None else None

    # -- inputs -------------------------------------------------------------------------------

    def receive_datagrams(self, plane: int, datagrams: list[Datagram], now: float) -> None:
        """One batch from `plane`: `receive_span` for each datagram, with its TOS word."""
        for data, tos in datagrams:  # (a closed session's receive_span takes nothing)
            self.receive_span(plane, memoryview(data), 0, len(data), len(data), tos, now)

    def receive_span(
        self, plane: int, buf: memoryview, at: int, end: int, seg: int, tos: int, now: float,
        slot: bool = False,
    ) -> int:  # fmt: skip
        """One read's datagrams (`buf[at:end]`, `seg` bytes each but the last) up to the first
        for another QP, whose offset it returns (`end` once all were taken; the endpoint routed
        the first here). Data is placed from `buf`, SACKs read from it, the rest decoded. `slot`:
        `buf` is one of io's receive slots (`Endpoint.receive_reads`; mrc/core/phase.py)."""
        phase = self._phase
        at = phase.receive_span(plane, buf, at, end, seg, tos, now, slot)
        if at < end and self._phase is not phase:
            # The handshake ended inside this read: the rest that is ours goes to the
            # connection (connecting.py stops right after the REPLY).
            head = buf[at : min(at + seg, end)]
            if len(head) >= 12 and peek_dest_qp(head) == self.qpn:
                at = self._phase.receive_span(plane, buf, at, end, seg, tos, now, slot)
        return at

    def handle_timer(self, now: float) -> None:
        """Run every timer due at `now`."""
        for timer, plane in self.timers.pop_expired(now):
            if self.life.state is SessionState.CLOSED:
                return
            self._phase.on_timer(timer, plane, now)

    # -- outputs ------------------------------------------------------------------------------

    def datagrams_to_send(self, now: float, limit: int | None = None) -> list[Transmit]:
        """Everything to send now. With `limit`, at most about that many new data packets
        (whole flowcells): pull again until the list comes back empty, so the first
        packets leave while the rest are still being framed (quinn's `poll_transmit` takes a
        `max_datagrams` the same way). Control packets and resends are never held back."""
        return self._phase.datagrams(now, limit)

    def get_timer(self) -> float | None:
        return None if self.life.state is SessionState.CLOSED else self.timers.next_deadline()

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

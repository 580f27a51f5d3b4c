"""The sans-I/O endpoint: routes datagrams to sessions by DestQP and answers CM REQUESTs.

One endpoint per host (per set of plane sockets). It peeks at each datagram's DestQP, groups a
receive batch per session (a GRO read's run of datagrams for one session goes over whole),
creates responder sessions for REQUESTs that reach the listener (QPN 0x1), REJECTs the ones it
cannot take (docs/WIRE.md §6), bounds half-open connections, and counts every datagram it
cannot route. It never touches a socket: io/ and sim/ feed it and send what
`datagrams_to_send()` and each session's `datagrams_to_send(now)` return.

Security (docs/WIRE.md §6-§7, docs/DESIGN.md §8). The API for secured connections:

    identity = Identity(private_key, allowed_peers=[peer_public, ...], psk=None)
    ep = Endpoint(rng=rng, regions=regions, identity=identity)
    ep.listen(SessionConfig(security="encrypt"), accept)      # or "auth"
    s = ep.connect(SessionConfig(security="encrypt"), addrs, b"", now, peer_key=peer_public)
    ... s.peer_static_key                                     # the peer's authenticated key

A REQUEST's security level must equal the listening config's (else REJECT security policy).
Before any X25519 work the requester's static key must be on the identity's allowlist (else
REJECT unknown peer, which tells nothing else) and the handshake token bucket
(`handshake_rate` per second, `handshake_burst` at once) must have a token: a refused REQUEST
is dropped and counted (`handshake_rate_limited`), and the requester's retry comes back later.
The half-open cap bounds the state a flood can leave behind.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from ..wire.bth import CM_LISTEN_QPN, ENDPOINT_QPN, Opcode
from ..wire.cm import RejectReason
from ..wire.errors import DecodeError
from ..wire.packet import CmPacket, decode_packet, peek_dest_qp
from .cm import build_reject, negotiate
from .config import SessionConfig
from .errors import LocalProtocolError
from .memory import RegionTable
from .secure.handshake import Identity, TokenBucket
from .session import Session
from .sink import TraceLog, TraceSink
from .transmit import Addr, Transmit

#: accept(request private data) → REPLY private data, or None to refuse (RESOURCES).
AcceptFn = Callable[[bytes], bytes | None]

MAX_HALF_OPEN: Final = 64
#: Secured handshakes the responder starts per second, and at once (each costs four X25519
#: operations, about 0.15 ms of CPU here).
HANDSHAKE_RATE: Final = 500.0
HANDSHAKE_BURST: Final = 64


class Endpoint:
    def __init__(
        self,
        *,
        rng: random.Random,
        regions: RegionTable | None = None,
        max_half_open: int = MAX_HALF_OPEN,
        identity: Identity | None = None,
        handshake_rate: float = HANDSHAKE_RATE,
        handshake_burst: int = HANDSHAKE_BURST,
    ) -> None:
        self.rng = rng
        #: This host's static key, allowlist and PSK: needed by secured connections.
        self.identity = identity
        self.handshakes = TokenBucket(handshake_rate, handshake_burst)
        self.regions = regions if regions is not None else RegionTable(rng)
        self.sessions: dict[int, Session] = {}
        self.drops: Counter[str] = Counter()
        self.max_half_open = max_half_open
        self._listen_config: SessionConfig | None = None
        self._accept: AcceptFn | None = None
        self._trace_log: TraceLog | None = None
        self._by_nonce: dict[bytes, Session] = {}
        self._out: list[Transmit] = []

    # -- user calls ---------------------------------------------------------------------------

    def listen(
        self, config: SessionConfig, accept: AcceptFn | None = None, *,
        trace: TraceLog | None = None,
    ) -> None:  # fmt: skip
        """Accept REQUESTs from now on, negotiating against `config`; `trace` starts the
        trace of each accepted session (sink.py)."""
        if config.validate().secured and self.identity is None:
            raise LocalProtocolError(f"security {config.security!r} needs an identity (a key)")
        self._listen_config = config
        self._accept = accept
        self._trace_log = trace

    def connect(
        self,
        config: SessionConfig,
        peer_addrs: Mapping[int, Addr],
        private_data: bytes,
        now: float,
        *,
        peer_key: bytes | None = None,
        trace: TraceSink | None = None,
    ) -> Session:
        """Start a connection; a secured one accepts only the responder static key
        `peer_key` (None: any key on this endpoint's identity's allowlist). `trace` receives
        the session's trace records (sink.py)."""
        session = Session.connect(
            config,
            peer_addrs,
            private_data,
            qpn=self._new_qpn(),
            regions=self.regions,
            rng=self.rng,
            now=now,
            identity=self.identity,
            peer_key=peer_key,
            trace=trace,
        )
        self.sessions[session.qpn] = session
        return session

    def discard(self, session: Session) -> None:
        """Forget a (closed) session; its QPN then counts as unknown."""
        self.sessions.pop(session.qpn, None)
        if self._by_nonce.get(session.nonce) is session:
            del self._by_nonce[session.nonce]

    # -- inputs -------------------------------------------------------------------------------

    def receive_datagrams(
        self, plane: int, datagrams: Sequence[tuple[bytes | memoryview, Addr, int]], now: float
    ) -> list[Session]:
        """Route one receive batch; returns the sessions that got input, in first-seen order."""
        batches: dict[int, list[tuple[bytes | memoryview, int]]] = {}
        # The session of the previous datagram and its batch: a run of datagrams for one QP
        # (the usual case) needs one lookup. Its address is already learned (`learn_addr`
        # only ever keeps the first address of a plane).
        last_qpn = -1
        last_batch: list[tuple[bytes | memoryview, int]] = []
        for data, addr, tos in datagrams:
            try:
                qpn = peek_dest_qp(data)
            except DecodeError:
                self.drops["decode_length"] += 1
                continue
            if qpn == last_qpn:
                last_batch.append((data, tos))
                continue
            session = self.sessions.get(qpn)
            if session is not None:
                if session.is_closed:
                    self.drops["closed_qp"] += 1
                    continue
                session.learn_addr(plane, addr, now)
                last_qpn = qpn
                last_batch = batches.setdefault(qpn, [])
                last_batch.append((data, tos))
            elif qpn == CM_LISTEN_QPN:
                last_qpn = -1  # a REQUEST reaches sessions too: look the next one up again
                accepted = self._handle_request(plane, data, addr, now)
                if accepted is not None:
                    batches.setdefault(accepted.qpn, [])
            elif qpn == ENDPOINT_QPN:
                last_qpn = -1
                self._route_connectionless(plane, data, addr, tos, batches)
            else:
                self.drops["unknown_qp"] += 1
        touched = []
        for qpn, batch in batches.items():
            session = self.sessions[qpn]
            if batch:
                session.receive_datagrams(plane, batch, now)
            touched.append(session)
        return touched

    def receive_reads(
        self, plane: int, reads: Sequence[tuple[memoryview, Addr, int, int]], now: float
    ) -> list[Session]:
        """One receive batch as io reads it: per read its bytes, source, TOS word and segment
        size (a UDP GRO batch of datagrams `seg` bytes each but the last; 0 for one datagram).
        Each run of a read's datagrams for one session goes to it whole
        (`Session.receive_span`), not cut into a view per datagram; the listener's, endpoint
        messages and anything unroutable take `receive_datagrams` one at a time. Returns the
        sessions that got input, in first-seen order."""
        touched: dict[int, Session] = {}
        for buf, addr, tos, seg in reads:
            end = len(buf)
            if not end:
                self.drops["decode_length"] += 1  # an empty datagram: no BTH
                continue
            if not 0 < seg < end:
                seg = end
            at = 0
            while at < end:
                stop = min(at + seg, end)
                try:
                    qpn = peek_dest_qp(buf[at:stop])
                except DecodeError:
                    self.drops["decode_length"] += 1
                    at = stop
                    continue
                session = self.sessions.get(qpn)
                if session is None or session.is_closed:
                    for other in self.receive_datagrams(plane, [(buf[at:stop], addr, tos)], now):
                        touched.setdefault(other.qpn, other)
                    at = stop
                    continue
                session.learn_addr(plane, addr, now)
                touched.setdefault(qpn, session)
                at = session.receive_span(plane, buf, at, end, seg, tos, now)
        return list(touched.values())

    def _route_connectionless(
        self,
        plane: int,
        data: bytes | memoryview,
        addr: Addr,
        tos: int,
        batches: dict[int, list[tuple[bytes | memoryview, int]]],
    ) -> None:
        """An endpoint message to the connectionless QPN 0x2, as other implementations send
        them (docs/WIRE.md §4): it goes to every unsecured established connection with that
        peer on that plane (its port status is the host's, not a QP's). A secured connection
        takes endpoint messages only inside it, authenticated: none, and the message is
        counted (`endpoint_qpn`)."""
        taken = False
        for qpn, session in self.sessions.items():
            if (
                not session.config.secured
                and session.planes is not None
                and not session.is_closed
                and session.peer_addrs.get(plane) == addr
            ):
                batches.setdefault(qpn, []).append((data, tos))
                taken = True
        if not taken:
            self.drops["endpoint_qpn"] += 1

    def _handle_request(
        self, plane: int, data: bytes | memoryview, addr: Addr, now: float
    ) -> Session | None:
        try:
            pkt = decode_packet(data)
        except DecodeError as exc:
            self.drops[f"decode_{exc.field}"] += 1
            return None
        if not isinstance(pkt, CmPacket) or pkt.opcode is not Opcode.CM_REQUEST:
            self.drops["listen_not_request"] += 1
            return None
        cmh = pkt.cmh
        existing = self._by_nonce.get(cmh.nonce)
        if existing is not None and not existing.is_closed:
            # Another plane's copy, or a retry: the session answers with the same REPLY bytes.
            existing.learn_addr(plane, addr, now)
            existing.receive_datagrams(plane, [(data, 0)], now)
            return existing
        if self._listen_config is None:
            self._reject(plane, addr, pkt, RejectReason.NO_LISTENER)
            return None
        agreed = negotiate(self._listen_config, cmh)
        if isinstance(agreed, RejectReason):
            self._reject(plane, addr, pkt, agreed)
            return None
        if agreed.secured:
            # Cheap checks first: an unlisted key costs a set lookup, never an X25519 operation.
            assert self.identity is not None and pkt.key_block is not None
            if not self.identity.allows(pkt.key_block.static):
                self._reject(plane, addr, pkt, RejectReason.UNKNOWN_PEER)
                return None
            if not self.handshakes.take(now):
                self.drops["handshake_rate_limited"] += 1
                return None
        half_open = sum(1 for s in self.sessions.values() if s.half_open and not s.is_closed)
        if half_open >= self.max_half_open:
            self._reject(plane, addr, pkt, RejectReason.RESOURCES)
            return None
        reply_data = b""
        if self._accept is not None:
            answer = self._accept(bytes(pkt.private_data))
            if answer is None:
                self._reject(plane, addr, pkt, RejectReason.RESOURCES)
                return None
            reply_data = answer
        qpn = self._new_qpn()
        log = self._trace_log
        try:
            session = Session.accept(
                agreed,
                pkt,
                plane,
                addr,
                reply_data,
                qpn=qpn,
                regions=self.regions,
                rng=self.rng,
                now=now,
                identity=self.identity,
                request_raw=data,
                trace=log.start_trace(qpn) if log is not None else None,
            )
        except LocalProtocolError:
            self._reject(plane, addr, pkt, RejectReason.BAD_PARAMETERS)
            return None
        self.sessions[session.qpn] = session
        self._by_nonce[cmh.nonce] = session
        return session

    def _reject(self, plane: int, addr: Addr, pkt: CmPacket, reason: RejectReason) -> None:
        self.drops[f"rejected_{reason.name.lower()}"] += 1
        self._out.append(Transmit(plane=plane, addr=addr, data=build_reject(pkt.cmh, reason)))

    # -- outputs ------------------------------------------------------------------------------

    def datagrams_to_send(self) -> list[Transmit]:
        """Endpoint-level packets (REJECTs); sessions have their own outputs."""
        out, self._out = self._out, []
        return out

    def _new_qpn(self) -> int:
        while True:
            qpn = self.rng.randrange(0x10, 1 << 24)
            if qpn not in self.sessions:
                return qpn

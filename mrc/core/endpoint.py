"""The sans-I/O endpoint: routes datagrams to sessions by DestQP and answers CM REQUESTs.

One endpoint per host (per set of plane sockets). It peeks at each datagram's DestQP, groups a
receive batch per session (a GRO read's run of datagrams for one session goes over whole),
creates responder sessions for REQUESTs that reach the listener (QPN 0x1), REJECTs the ones it
cannot take (docs/WIRE.md §6), bounds half-open connections, and counts every datagram it
cannot route. It never touches a socket: io/ and sim/ feed it and send what
`datagrams_to_send()` and each session's `datagrams_to_send(now)` return.

Peer addresses (docs/DESIGN.md §8). A responder learns a plane's peer address only from a copy
of the REQUEST that is byte for byte the one it accepted (the CMH `plane` byte aside), or, on
a secured connection, from a datagram on that plane whose tag verified; any other datagram,
whatever QPN it names, moves no address. QPNs, initial PSNs, nonces and connection ids come from
`ids` (the OS's generator on a real network; a simulation's seeded one in virtual time).

Security (docs/WIRE.md §6-§7, docs/DESIGN.md §8). The API for secured connections:

    identity = Identity(private_key, allowed_peers=[peer_public, ...], psk=None)
    ep = Endpoint(rng=rng, regions=regions, identity=identity)
    ep.listen(SessionConfig(security="encrypt"), accept)      # or "auth"
    s = ep.connect(SessionConfig(security="encrypt"), addrs, b"", now, peer_key=peer_public)
    ... s.peer_static_key                                     # the peer's authenticated key

A REQUEST's security level must equal the listening config's (else REJECT security policy).
Nothing is kept before the requester proved its key (docs/WIRE.md §7, revision 1.2): its static
key must be on the identity's allowlist (else REJECT unknown peer, which tells nothing else),
the handshake token bucket (`handshake_rate` per second, `handshake_burst` at once) must have a
token (else a counted `handshake_rate_limited` drop: the requester's retry comes back later),
the sealed timestamp and private data must open under two X25519 values (else `cm_auth`, no
answer), and the timestamp must be new for that key (else `cm_replay`, no answer). Only then
does the application's `accept()` run and the session exist. Half-open sessions are kept per
requester static key (`MAX_HALF_OPEN_PER_PEER`; a newer one evicts the oldest), so nobody
without a key can take another's place. A REQUEST that proves nothing (unsecured, or secured in
the open form, which only a responder with no allowlist takes) is kept per source host under
the same rule, and all of those under `max_half_open` (else REJECT resources).
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Final

from ..wire.bth import CM_LISTEN_QPN, ENDPOINT_QPN, Opcode
from ..wire.cm import CMH, RejectReason, split_request, tai64n_ns
from ..wire.errors import DecodeError
from ..wire.packet import CmPacket, peek_dest_qp
from .cm import build_reject, negotiate
from .config import SessionConfig
from .errors import LocalProtocolError
from .memory import RegionTable
from .secure.handshake import Identity, TokenBucket, open_request, plane_zeroed
from .secure.replay import RequestTimestamps
from .session import Session
from .sink import TraceLog, TraceSink
from .transmit import Addr, Transmit

#: accept(request private data) → REPLY private data, or None to refuse (RESOURCES).
AcceptFn = Callable[[bytes], bytes | None]

#: Half-open connections from REQUESTs that prove nothing (unsecured, open form), in all.
MAX_HALF_OPEN: Final = 64
#: Half-open connections per requester static key (proved) or per source host (unproven).
MAX_HALF_OPEN_PER_PEER: Final = 16
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
        ids: random.Random | None = None,
    ) -> None:
        self.rng = rng
        #: QPNs, initial PSNs, nonces and connection ids. Hosts on a real network pass
        #: `random.SystemRandom()` (node/host.py does); None draws them from `rng`, so a
        #: simulation's seeded generator keeps its runs reproducible.
        self.ids = ids if ids is not None else rng
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
        #: Responder sessions by their REQUEST's nonce, with that REQUEST (`plane` zeroed).
        self._by_nonce: dict[bytes, tuple[Session, bytes]] = {}
        #: Half-open responder sessions, oldest first, per requester key or source host.
        self._half_open: dict[tuple[bool, Hashable], deque[Session]] = {}
        #: Timestamps of the sealed REQUESTs accepted, per requester key (replay rule).
        self._stamps = RequestTimestamps()
        #: Sessions closed to make room (their owners see them in the next touched list).
        self._evicted: list[Session] = []
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
        wall: float | None = None,
    ) -> Session:
        """Start a connection; a secured one seals its REQUEST to and accepts only the
        responder static key `peer_key` (None: the one key on this endpoint's identity's
        allowlist, else the open form, docs/WIRE.md §7). `wall` is the wall clock at `now`
        (seconds since the Unix epoch; io passes it) for the REQUEST's timestamp; None takes
        `now` itself (virtual time). `trace` receives the session's trace records (sink.py)."""
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
            ids=self.ids,
            wall=wall,
        )
        self.sessions[session.qpn] = session
        return session

    def discard(self, session: Session) -> None:
        """Forget a (closed) session; its QPN then counts as unknown."""
        self.sessions.pop(session.qpn, None)
        known = self._by_nonce.get(session.nonce)
        if known is not None and known[0] is session:
            del self._by_nonce[session.nonce]

    # -- inputs -------------------------------------------------------------------------------

    def receive_datagrams(
        self, plane: int, datagrams: Sequence[tuple[bytes | memoryview, Addr, int]], now: float
    ) -> list[Session]:
        """Route one receive batch; returns the sessions that got input, in first-seen order."""
        batches: dict[int, list[tuple[bytes | memoryview, int]]] = {}
        # The session of the previous datagram and its batch: a run of datagrams for one QP
        # (the usual case) needs one lookup.
        last_qpn = -1
        touched: dict[int, Session] = {}
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
                if session.wants_addr(plane):
                    # Only a datagram that authenticates may teach this plane's address: it
                    # goes in alone, now (docs/DESIGN.md §8).
                    session.receive_from(plane, data, addr, tos, now)
                    touched.setdefault(qpn, session)
                    last_qpn = -1
                    continue
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
        for qpn, batch in batches.items():
            session = self.sessions[qpn]
            if batch:
                session.receive_datagrams(plane, batch, now)
            touched.setdefault(qpn, session)
        out = list(touched.values())
        if self._evicted:
            out.extend(s for s in self._evicted if s.qpn not in touched)
            self._evicted.clear()
        return out

    def receive_reads(
        self, plane: int, reads: Sequence[tuple[memoryview, Addr, int, int, int]], now: float
    ) -> list[Session]:
        """One receive batch as io reads it: per read the view it was read into, its source,
        TOS word, segment size (a UDP GRO batch of datagrams `seg` bytes each but the last; 0
        for one datagram) and length (its bytes are the view's first `nbytes`: io's ring slot,
        the same view at every drain that reads into it, mrc/io/planes.py). Each run of a
        read's datagrams for one session goes to it whole (`Session.receive_span`), not cut
        into a view per datagram; the listener's, endpoint messages and anything unroutable
        take `receive_datagrams` one at a time. Returns the sessions that got input, in
        first-seen order."""
        touched: dict[int, Session] = {}
        for buf, addr, tos, seg, end in reads:
            if not 0 <= end <= len(buf):
                raise ValueError(f"a read of {end} bytes in a view of {len(buf)}")
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
                touched.setdefault(qpn, session)
                if session.wants_addr(plane):
                    # Only a datagram that authenticates may teach this plane's address.
                    session.receive_from(plane, buf[at:stop], addr, tos, now)
                    at = stop
                    continue
                at = session.receive_span(plane, buf, at, end, seg, tos, now, slot=True)
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
        """A datagram to the listener: a copy of a REQUEST already answered, or a new one,
        which gets a session only once it has passed every check (docs/WIRE.md §7)."""
        if not len(data) or data[0] != Opcode.CM_REQUEST.value:
            self.drops["listen_not_request"] += 1
            return None
        try:
            parts = split_request(data)
        except DecodeError as exc:
            self.drops[f"decode_{exc.field}"] += 1
            return None
        cmh = parts.cmh
        known = self._by_nonce.get(cmh.nonce)
        if known is not None and not known[0].is_closed:
            # Another plane's copy, or a retry: the same bytes get the same REPLY bytes and
            # teach the plane's address; anything else naming that nonce moves nothing.
            existing, original = known
            if plane_zeroed(data) != original:
                self.drops["cm_copy_mismatch"] += 1
                return None
            existing.answer_request_copy(plane, addr, now)
            return existing
        if self._listen_config is None:
            self._reject(plane, addr, cmh, RejectReason.NO_LISTENER)
            return None
        agreed = negotiate(self._listen_config, cmh)
        if isinstance(agreed, RejectReason):
            self._reject(plane, addr, cmh, agreed)
            return None
        private = parts.rest
        group: Hashable = addr[0] if isinstance(addr, tuple) else addr
        proved = False
        if agreed.secured:
            # Cheap checks first: an unlisted key costs a set lookup, never an X25519 operation.
            identity, keys = self.identity, parts.key_block
            assert identity is not None and keys is not None
            if not identity.allows(keys.static):
                self._reject(plane, addr, cmh, RejectReason.UNKNOWN_PEER)
                return None
            if not parts.is_sealed and identity.allowed_peers is not None:
                self.drops["cm_unproven"] += 1  # an allowlist takes only sealed REQUESTs
                return None
            if not self.handshakes.take(now):
                self.drops["handshake_rate_limited"] += 1
                return None
            if parts.is_sealed:
                opened = open_request(identity, data, keys, cmh.nonce, parts.rest)
                if opened is None:
                    self.drops["cm_auth"] += 1
                    return None
                stamp, private = opened
                ns = tai64n_ns(stamp)
                if not self._stamps.fresh(keys.static, ns):
                    self.drops["cm_replay"] += 1
                    return None
                self._stamps.accept(keys.static, ns)
                group, proved = keys.static, True
        if not proved and self._unproven_half_open() >= self.max_half_open:
            self._reject(plane, addr, cmh, RejectReason.RESOURCES)
            return None
        reply_data = b""
        if self._accept is not None:
            answer = self._accept(private)
            if answer is None:
                self._reject(plane, addr, cmh, RejectReason.RESOURCES)
                return None
            reply_data = answer
        request = CmPacket(
            Opcode.CM_REQUEST, CM_LISTEN_QPN, cmh, parts.key_block, private, parts.p_key
        )
        qpn = self._new_qpn()
        log = self._trace_log
        try:
            session = Session.accept(
                agreed,
                request,
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
                ids=self.ids,
            )
        except LocalProtocolError:
            self._reject(plane, addr, cmh, RejectReason.BAD_PARAMETERS)
            return None
        self._keep_half_open((proved, group), session, now)
        self.sessions[session.qpn] = session
        self._by_nonce[cmh.nonce] = (session, bytes(plane_zeroed(data)))
        return session

    def _keep_half_open(self, key: tuple[bool, Hashable], session: Session, now: float) -> None:
        """Count `session` as half-open for its requester key (or source host), closing that
        group's oldest when it already holds `MAX_HALF_OPEN_PER_PEER`."""
        self._prune_half_open()
        held = self._half_open.get(key)
        if held is None:
            held = self._half_open[key] = deque()
        while len(held) >= MAX_HALF_OPEN_PER_PEER:
            old = held.popleft()
            old.close(now)
            self.drops["half_open_evicted"] += 1
            self._evicted.append(old)
        held.append(session)

    def _prune_half_open(self) -> None:
        """Forget the sessions that heard from their requester or closed, and empty groups
        (the table holds at most 64 unproven sessions and 16 per requester key)."""
        for key in list(self._half_open):
            held = self._half_open[key]
            live = [s for s in held if s.half_open and not s.is_closed]
            if not live:
                del self._half_open[key]
            elif len(live) != len(held):
                self._half_open[key] = deque(live)

    def _unproven_half_open(self) -> int:
        self._prune_half_open()
        return sum(len(held) for (proved, _), held in self._half_open.items() if not proved)

    def _reject(self, plane: int, addr: Addr, request: CMH, reason: RejectReason) -> None:
        self.drops[f"rejected_{reason.name.lower()}"] += 1
        self._out.append(Transmit(plane=plane, addr=addr, data=build_reject(request, reason)))

    # -- outputs ------------------------------------------------------------------------------

    def datagrams_to_send(self) -> list[Transmit]:
        """Endpoint-level packets (REJECTs); sessions have their own outputs."""
        out, self._out = self._out, []
        return out

    def _new_qpn(self) -> int:
        while True:
            qpn = self.ids.randrange(0x10, 1 << 24)
            if qpn not in self.sessions:
                return qpn

"""The requester's handshake: REQUESTs on every plane until a REPLY or a REJECT (docs/WIRE.md §6).

`Connecting` is the first phase of a requester's session (phase.py). It sends a REQUEST on every
plane of `config.plane_mask` it has an address for and repeats them on a backoff
(`cm_retry` doubling to 2 s, `cm_attempts` sends in all). A REPLY that names our QPN and agrees
to parameters we offered ends the phase: the phase hands what the REPLY agreed to its
`on_reply` callback, with which the session builds the established phase (established.py).

A REJECT for our nonce: on an unsecured attempt, RESOURCES means "later" (the next send on the
backoff is a new round: a new nonce) and any other reason ends the session. On a secured
attempt a REJECT carries no proof of its sender (docs/WIRE.md §7), so every reason is a hint:
the attempt goes on with a new round at the next send and ends only when its sends are used
up, then naming the last reason heard. Anything else is dropped and counted (`not_connected`).

A secured requester (docs/WIRE.md §7) holds its half of the key agreement (`Requester`,
handshake.py). Each round's REQUEST is sealed (revision 1.2: a new timestamp, the private data
encrypted) when the responder's key is known, and its copies on every plane and its repeats are
the same bytes. Before a REPLY verified, only a REPLY or a REJECT is looked at (gate.py's
`before_keys`); the REPLY checks a flood of forged REPLYs may use up (`MAX_REPLY_CHECKS`) start
again at every send, and the REPLY that verifies gives the connection's `PacketProtection` and
the responder's static key.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from ..wire.bth import Opcode
from ..wire.cm import RejectReason
from ..wire.errors import DecodeError
from ..wire.packet import CmPacket, Packet, decode_packet, peek_dest_qp
from .cm import (
    adopt_reply,
    build_request,
    check_private_data,
    reject_name,
    request_head,
    with_plane,
)
from .config import SessionConfig
from .phase import Lifecycle, Phase, SessionState
from .secure.aead import PacketProtection
from .secure.gate import before_keys
from .secure.handshake import Requester
from .stats import SessionStats
from .timers import Timer, TimerTable
from .transmit import Addr, Transmit


@dataclass(frozen=True, slots=True)
class Agreed:
    """What a REPLY settled: everything the established phase needs from the handshake."""

    config: SessionConfig
    peer_qpn: int
    peer_initial_psn: int
    private_data: bytes
    #: Secured: the connection's keys, the responder's static key and the REPLY's bytes.
    protection: PacketProtection | None
    peer_static_key: bytes | None
    reply: bytes


class Connecting(Phase):
    """A requester waiting for its REPLY."""

    def __init__(
        self,
        life: Lifecycle,
        config: SessionConfig,
        *,
        qpn: int,
        initial_psn: int,
        rng: random.Random,
        stats: SessionStats,
        timers: TimerTable,
        out: list[Transmit],
        peer_addrs: dict[int, Addr],
        private_data: bytes,
        requester: Requester | None,
        on_reply: Callable[[Agreed, float], None],
        wall: float | None = None,
    ) -> None:
        """`wall`: the wall clock (seconds since the Unix epoch) at `start`'s `now`, for the
        REQUEST timestamps (None: `now` itself, a simulation's virtual time)."""
        super().__init__(life, qpn=qpn, out=out, peer_addrs=peer_addrs)
        self.config = config
        self.initial_psn = initial_psn
        self.stats = stats
        self.drops: Counter[str] = stats.drops_by_reason
        self.timers = timers
        self.private_data = check_private_data(private_data)
        self.rng = rng
        self.nonce = rng.randbytes(16)
        self.connection_id = rng.getrandbits(64)
        self.requester = requester
        self.on_reply = on_reply
        self._attempts = 0
        self._interval = config.cm_retry
        #: This round's REQUEST (plane 0's copy), which a secured transcript hashes whole.
        self._request = b""
        #: A REJECT asked for a new round (new nonce, new REQUEST) at the next send.
        self._new_round = False
        #: The reason of the last REJECT heard (a secured attempt's hint), or None.
        self._rejected: str | None = None
        self._wall = wall
        #: Wall clock minus `now` (set by `start`): REQUEST timestamps follow `now` from there.
        self._wall_offset = 0.0

    def start(self, now: float) -> None:
        """Send the first REQUESTs."""
        self._wall_offset = (self._wall if self._wall is not None else now) - now
        self._send_requests(now)

    # -- inputs -------------------------------------------------------------------------------

    def receive_span(
        self, plane: int, buf: memoryview, at: int, end: int, seg: int, tos: int, now: float,
        slot: bool = False,
    ) -> int:  # fmt: skip
        """One read's datagrams up to the first for another QP, or up to the one that ended
        the handshake (the rest of the read goes to the next phase)."""
        life = self.life
        if life.state is not SessionState.CONNECTING:
            return end
        ps = self.stats.plane(plane)
        first = at
        while at < end:
            stop = min(at + seg, end)
            data = buf[at:stop]
            if at != first and (len(data) < 12 or peek_dest_qp(data) != self.qpn):
                break
            at = stop
            ps.packets_received += 1
            ps.bytes_received += len(data)
            if not self._receive_one(data, now):
                return end if life.closed else at
        return at

    def _receive_one(self, data: bytes | memoryview, now: float) -> bool:
        """One datagram; False once the handshake is over (established or closed)."""
        self._take(data, now)
        return self.life.state is SessionState.CONNECTING

    def _take(self, data: bytes | memoryview, now: float) -> None:
        requester = self.requester
        if requester is not None:
            # Secured: nothing is looked at before a REPLY verifies (gate.py).
            args = (self._request, self.nonce, self.drops)
            cm, protection, key = before_keys(requester, self.config, data, *args)
            if cm is not None:
                self._handle_cm(cm, now, protection, key, bytes(data))
            return
        try:
            pkt: Packet = decode_packet(data)
        except DecodeError as exc:
            self.drops[f"decode_{exc.field}"] += 1
            return
        if pkt.p_key != self.config.p_key:
            self.drops["p_key"] += 1
        elif isinstance(pkt, CmPacket):
            self._handle_cm(pkt, now, None, None, b"")
        else:
            self.drops["not_connected"] += 1

    def _handle_cm(
        self,
        pkt: CmPacket,
        now: float,
        protection: PacketProtection | None,
        key: bytes | None,
        raw: bytes,
    ) -> None:
        op = pkt.opcode
        cmh = pkt.cmh
        if op is Opcode.CM_REPLY:
            if cmh.remote_qpn != self.qpn:
                self.drops["cm_mismatch"] += 1
                return
            agreed = adopt_reply(self.config, cmh)
            if agreed is None:
                self.life.close("rejected: reply with parameters we did not offer")
                return
            self.on_reply(
                Agreed(
                    config=agreed,
                    peer_qpn=cmh.local_qpn,
                    peer_initial_psn=cmh.initial_psn,
                    private_data=bytes(pkt.private_data),
                    protection=protection,
                    peer_static_key=key,
                    reply=raw if protection is not None else b"",
                ),
                now,
            )
        elif op is Opcode.CM_REJECT and cmh.nonce == self.nonce:
            if self.requester is None and cmh.reject_reason != RejectReason.RESOURCES:
                self.life.close(f"rejected: {reject_name(cmh)}")
                return
            # RESOURCES (come back later), or any REJECT of a secured attempt (unproven):
            # the next send on the backoff is a new round.
            self.drops["cm_reject_hint"] += 1
            self._rejected = reject_name(cmh)
            self._new_round = True
        elif op is Opcode.CM_REQUEST:
            self.drops["cm_unexpected"] += 1
        else:
            self.drops["cm_mismatch"] += 1

    def on_timer(self, timer: Timer, plane: int | None, now: float) -> None:
        if timer is Timer.CM_RETRY:
            self._send_requests(now)

    # -- REQUESTs ---------------------------------------------------------------------------

    def _send_requests(self, now: float) -> None:
        if self._attempts >= self.config.cm_attempts:
            if self._rejected is not None:
                self.life.close(f"rejected: {self._rejected}")
                return
            wrong_key = self.drops["unknown_peer"] > 0
            self.life.close("no answer" + " (the responder's key is not one we accept)" * wrong_key)
            return
        self._attempts += 1
        if self._new_round or not self._request:
            if self._new_round:
                self.nonce = self.rng.randbytes(16)
                self._new_round = False
            self._request = self._build_request(now)
        requester = self.requester
        if requester is not None:
            requester.new_send()  # REPLYs get a fresh budget of checks
        for plane in self.config.planes:
            self.cm_send(plane, with_plane(self._request, plane))
        self.timers.set(Timer.CM_RETRY, now + self._interval)
        self._interval = min(self._interval * 2, 2.0)

    def _build_request(self, now: float) -> bytes:
        """This round's REQUEST (plane 0's copy): sealed with a new timestamp when secured and
        the responder's key is known, else the open form (docs/WIRE.md §6-§7)."""
        requester = self.requester
        if requester is not None:
            head = request_head(
                self.config, local_qpn=self.qpn, initial_psn=self.initial_psn,
                nonce=self.nonce, connection_id=self.connection_id,
                private_data_len=len(self.private_data), key_block=requester.key_block,
            )  # fmt: skip
            wall = now + self._wall_offset
            sealed = requester.seal_request(head, self.nonce, self.private_data, wall)
            if sealed is not None:
                return head + sealed
        return build_request(
            self.config, plane=0, local_qpn=self.qpn, initial_psn=self.initial_psn,
            nonce=self.nonce, connection_id=self.connection_id,
            private_data=self.private_data,
            key_block=requester.key_block if requester is not None else None,
        )  # fmt: skip

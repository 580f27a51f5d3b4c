"""A RoCE-like baseline transport for the simulator: one path, go-back-N, DCQCN rate control.

What it holds: the two halves of one reliable connection, sans-I/O like mrc.core. A
`RoceSender` (the requester) paces a stream of `mtu`-byte packets at its DCQCN rate on one
plane and one ECMP hash (a fixed EV for the whole connection), resends from the oldest
unacknowledged PSN on a NAK or a retransmission timeout (go-back-N), and gives up after
`retry_limit` timeouts in a row, as an RC QP enters the error state. A `RoceReceiver` (the
responder) accepts only the next expected PSN, drops anything after a hole and NAKs it once,
acknowledges every packet that asks for it, and answers CE-marked packets with a CNP (at most one
per `cnp_interval`). Rate control follows DCQCN (Zhu et al., SIGCOMM 2015): a CNP cuts the
rate by alpha/2 and raises alpha; alpha decays while no CNP comes; a timer raises the rate in
fast-recovery, additive and hyper stages. The byte counter is left out: at these link rates the
55 µs timer fires long before 10 MB are sent. PFC is not modelled: the switches drop, as they
do for MRC, which is the deployment the paper compares against.

Its packets are the simulator's own, not RoCEv2 bytes: a 32-byte header (the size of BTH + RETH
+ ICRC) that switches never parse, kind, A-bit, destination QPN and PSN, then zero padding.
Connections are set up out of band (no CM exchange). It reads no clock and draws no random
numbers: `now` comes in, the EV comes from the caller.

What it leaves to others: driving (roce_host.py: receive, timers, sending on the host's link),
the fabric (fabric.py) and experiments (mrc.experiments.paper_*).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

#: kind, flags (bit 0: A, acknowledge me), destination QPN, PSN, then padding to 32 bytes.
_HDR = struct.Struct(">BBHI24x")
HEADER = _HDR.size
DATA, ACK, NAK, CNP = 1, 2, 3, 4
_A_BIT = 0x01
_ECN_CE = 0x03

#: One datagram out: (UDP payload, TOS byte).
Out = tuple[bytes, int]
#: ECT(0): the sender's data and the receiver's replies are ECN-capable (RFC 3168).
TOS_ECT0 = 0x02


class RoceDecodeError(ValueError):
    """A datagram that is not a RoCE-baseline packet."""


def decode(data: bytes) -> tuple[int, int, int, int]:
    """(kind, flags, destination QPN, PSN) of a packet; RoceDecodeError for anything else."""
    if len(data) < HEADER:
        raise RoceDecodeError(f"roce: {len(data)}-byte datagram is shorter than a header")
    kind, flags, qpn, psn = _HDR.unpack_from(data)
    if not DATA <= kind <= CNP:
        raise RoceDecodeError(f"roce: unknown packet kind {kind}")
    return kind, flags, qpn, psn


def encode(kind: int, qpn: int, psn: int, *, flags: int = 0, payload: int = 0) -> bytes:
    return _HDR.pack(kind, flags, qpn, psn) + bytes(payload)


@dataclass(frozen=True, slots=True)
class RoceParams:
    """Per-connection constants. Rates in bit/s, times in seconds."""

    line_rate: float = 100e9
    mtu: int = 4096
    #: Packets in flight at most (the NIC's outstanding-request limit).
    window: int = 256
    #: Every this many packets asks for an ACK (the A bit); the last packet always does.
    ack_every: int = 8
    #: Packets handed to the link at once while the pacer allows it.
    burst: int = 4
    rto: float = 1e-3
    retry_limit: int = 7
    # DCQCN (the paper's defaults, scaled: R_AI and R_HAI are fractions of the line rate).
    g: float = 1 / 256
    alpha_timer: float = 55e-6
    increase_timer: float = 55e-6
    #: A sender cuts its rate at most once per this long (the NIC's rate-reduce period).
    cut_interval: float = 50e-6
    fast_recovery_stages: int = 5
    ai_fraction: float = 0.005
    hai_fraction: float = 0.05
    min_rate_fraction: float = 0.001
    #: The receiver sends at most one CNP per connection per this long.
    cnp_interval: float = 50e-6

    def validate(self) -> RoceParams:
        if self.line_rate <= 0 or self.mtu <= 0 or self.window < 1 or self.ack_every < 1:
            raise ValueError("roce: line_rate, mtu, window and ack_every must be positive")
        if self.burst < 1 or self.rto <= 0 or self.retry_limit < 0:
            raise ValueError("roce: burst and rto must be positive, retry_limit not negative")
        if not 0 < self.g < 1:
            raise ValueError("roce: DCQCN's g must be in (0, 1)")
        return self


class RoceSender:
    """The requester half: sends `size` bytes to `peer_qpn` on one plane and one EV."""

    def __init__(
        self, qpn: int, peer_qpn: int, size: int, params: RoceParams, now: float
    ) -> None:
        if size <= 0:
            raise ValueError("roce: a transfer needs at least one byte")
        self.qpn, self.peer_qpn, self.size, self.p = qpn, peer_qpn, size, params.validate()
        self.packets = -(-size // params.mtu)
        self.next_psn = 0
        #: One past the highest PSN ever sent (a late ACK may pass a rewound next_psn).
        self.high_psn = 0
        self.una = 0
        self.started_at = now
        self.done_at: float | None = None
        #: Set when `retry_limit` timeouts in a row found no progress: the QP's error state.
        self.failed_at: float | None = None
        self.retries = 0
        self.rto_at: float | None = None
        self.packets_sent = 0
        self.retransmitted = 0
        self.naks = 0
        self.timeouts = 0
        self.cnps = 0
        # DCQCN state.
        self.rate = params.line_rate
        self.target = params.line_rate
        self.alpha = 1.0
        self.last_cut = -1.0
        self.last_cnp = -1.0
        self.alpha_at = now + params.alpha_timer
        self.increase_at = now + params.increase_timer
        self.stage = 0
        self.send_at = now
        self._out: list[Out] = []

    # -- state ---------------------------------------------------------------------------

    @property
    def acked_bytes(self) -> int:
        return min(self.size, self.una * self.p.mtu)

    def finished(self) -> bool:
        return self.done_at is not None or self.failed_at is not None

    def _can_send(self) -> bool:
        return self.next_psn < self.packets and self.next_psn - self.una < self.p.window

    def get_timer(self) -> float | None:
        """The next instant this sender must be called back (pacing, RTO, DCQCN timers)."""
        if self.finished():
            return None
        times = [self.alpha_at, self.increase_at]
        if self.rto_at is not None:
            times.append(self.rto_at)
        if self._can_send():
            times.append(self.send_at)
        return min(times)

    def datagrams_to_send(self) -> list[Out]:
        out, self._out = self._out, []
        return out

    # -- inputs --------------------------------------------------------------------------

    def handle_timer(self, now: float) -> None:
        if self.finished():
            return
        p = self.p
        if now >= self.alpha_at:
            # No CNP for a whole period: congestion is easing, forget some of it.
            if now - self.last_cnp >= p.alpha_timer:
                self.alpha *= 1 - p.g
            self.alpha_at = now + p.alpha_timer
        if now >= self.increase_at:
            self._increase()
            self.increase_at = now + p.increase_timer
        if self.rto_at is not None and now >= self.rto_at:
            self._timeout(now)
        self._pace(now)

    def receive(self, kind: int, psn: int, now: float) -> None:
        if self.finished():
            return
        if kind == CNP:
            self._cut(now)
        elif kind in (ACK, NAK):
            if psn > self.high_psn:
                return  # acknowledges what was never sent: a forged or misdirected reply
            if psn > self.una:
                self.una = psn
                self.retries = 0
                self.next_psn = max(self.next_psn, psn)
            if kind == NAK and self.una <= psn < self.next_psn:
                # Go-back-N: everything from the hole on is sent again.
                self.naks += 1
                self.retransmitted += self.next_psn - psn
                self.next_psn = psn
            if self.una >= self.packets:
                self.done_at = now
                self.rto_at = None
                return
            self.rto_at = now + self.p.rto if self.una < self.next_psn else None
        self._pace(now)

    # -- internals -----------------------------------------------------------------------

    def _timeout(self, now: float) -> None:
        self.timeouts += 1
        self.retries += 1
        if self.retries > self.p.retry_limit:
            self.failed_at = now
            self.rto_at = None
            return
        self.retransmitted += self.next_psn - self.una
        self.next_psn = self.una
        self.rto_at = None

    def _pace(self, now: float) -> None:
        p = self.p
        if self.send_at < now:
            self.send_at = now
        # Up to `burst` full packets may start now; half a packet of slack absorbs rounding.
        horizon = now + (p.burst - 0.5) * (p.mtu + HEADER) * 8 / self.rate
        while self._can_send() and self.send_at <= horizon:
            psn = self.next_psn
            last = psn == self.packets - 1
            payload = p.mtu if not last else self.size - psn * p.mtu
            flags = _A_BIT if last or psn % p.ack_every == p.ack_every - 1 else 0
            self._out.append((encode(DATA, self.peer_qpn, psn, flags=flags, payload=payload),
                              TOS_ECT0))  # fmt: skip
            self.next_psn += 1
            self.high_psn = max(self.high_psn, self.next_psn)
            self.packets_sent += 1
            self.send_at += (payload + HEADER) * 8 / self.rate
        if self.rto_at is None and self.una < self.next_psn:
            self.rto_at = now + p.rto

    def _cut(self, now: float) -> None:
        p = self.p
        self.cnps += 1
        self.last_cnp = now
        self.alpha = (1 - p.g) * self.alpha + p.g
        if now - self.last_cut < p.cut_interval:
            return
        self.last_cut = now
        self.target = self.rate
        self.rate = max(self.rate * (1 - self.alpha / 2), p.line_rate * p.min_rate_fraction)
        self.stage = 0
        self.increase_at = now + p.increase_timer

    def _increase(self) -> None:
        p = self.p
        self.stage += 1
        if self.stage > 2 * p.fast_recovery_stages:
            self.target += p.line_rate * p.hai_fraction
        elif self.stage > p.fast_recovery_stages:
            self.target += p.line_rate * p.ai_fraction
        self.target = min(self.target, p.line_rate)
        self.rate = min((self.rate + self.target) / 2, p.line_rate)


class RoceReceiver:
    """The responder half: in-order delivery, one NAK per hole, CNPs for CE marks."""

    def __init__(self, qpn: int, peer_qpn: int, params: RoceParams) -> None:
        self.qpn, self.peer_qpn, self.p = qpn, peer_qpn, params.validate()
        self.epsn = 0
        self.nak_sent = False
        self.last_cnp = -1.0
        self.bytes_placed = 0
        self.first_placed_at: float | None = None
        self.last_placed_at: float | None = None
        self.out_of_order = 0
        self.duplicates = 0
        self.cnps_sent = 0
        self._out: list[Out] = []

    def get_timer(self) -> float | None:
        return None  # the responder only ever answers

    def handle_timer(self, now: float) -> None:
        return None

    def datagrams_to_send(self) -> list[Out]:
        out, self._out = self._out, []
        return out

    def receive_data(self, flags: int, psn: int, payload: int, tos: int, now: float) -> None:
        if tos & _ECN_CE == _ECN_CE and now - self.last_cnp >= self.p.cnp_interval:
            self.last_cnp = now
            self.cnps_sent += 1
            self._out.append((encode(CNP, self.peer_qpn, 0), TOS_ECT0))
        if psn == self.epsn:
            self.epsn += 1
            self.nak_sent = False
            self.bytes_placed += payload
            if self.first_placed_at is None:
                self.first_placed_at = now
            self.last_placed_at = now
            if flags & _A_BIT:
                self._out.append((encode(ACK, self.peer_qpn, self.epsn), TOS_ECT0))
        elif psn > self.epsn:
            # Go-back-N keeps no out-of-order data: drop it, ask once for the hole.
            self.out_of_order += 1
            if not self.nak_sent:
                self.nak_sent = True
                self._out.append((encode(NAK, self.peer_qpn, self.epsn), TOS_ECT0))
        else:
            self.duplicates += 1
            if flags & _A_BIT:
                self._out.append((encode(ACK, self.peer_qpn, self.epsn), TOS_ECT0))

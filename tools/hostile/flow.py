"""What the attacker knows: the live connection as read off the wire by the sniffer.

Holds `Genuine` (one sniffed datagram with its addresses, kept for replays and mutations) and
`Flow`, which follows a bench client's connection to the server: the planes' addresses, both
QPNs, the client's CM REQUEST (a template for forged CM packets, and its bytes, which outlive
the connection for replays), the data packet with the
highest PSN seen (where "ahead of the sender" starts), the EVs in use and two bounded pools of
recent genuine datagrams, one per direction. It reads headers with the `mrc.wire` codecs and
never sends anything; forging is `tools.hostile.attacks`' job.

On a secured connection every packet after the REQUEST, except a REJECT, ends with the 24-byte
trailer (docs/WIRE.md §7); the headers stay in the clear in both modes, so the attacker sees
PSNs, VAs and R_Keys either way and only the payload may be ciphertext.
"""

from __future__ import annotations

import dataclasses
import random
import struct
from collections import deque
from dataclasses import dataclass, field

from mrc.wire import (
    CM_LISTEN_QPN,
    DATA_OPCODES,
    PSN_MOD,
    TRAILER_SIZE,
    CmPacket,
    DataPacket,
    DecodeError,
    Opcode,
    decode_packet,
)
from mrc.wire.cm import split_request
from tools.hostile.rawnet import Seen, ones_sum

Addr = tuple[str, int]

_DATA_VALUES = frozenset(int(op) for op in DATA_OPCODES)
_BTH_QP_PSN = struct.Struct(">4xII")
_MASK24 = 0xFFFFFF
_UNTRAILED = frozenset({int(Opcode.CM_REQUEST), int(Opcode.CM_REJECT)})


@dataclass(slots=True)
class Genuine:
    """A datagram one of the two bench processes sent, as it crossed `lo`."""

    src: Addr
    dst: Addr
    payload: bytes
    to_server: bool
    _sum: int | None = None

    @property
    def psum(self) -> int:
        """The payload's one's-complement sum, computed once (replays reuse it)."""
        if self._sum is None:
            self._sum = ones_sum(self.payload)
        return self._sum


@dataclass(slots=True)
class Flow:
    """The bench connection between the client and the server on `server_addrs`:`port`.

    A new CM REQUEST nonce from a client starts a new connection: QPNs, the client's addresses
    and the data position are forgotten until the REPLY and the first data packets arrive, so
    forgeries always aim at the connection that runs now. `ready` says there is enough to
    forge with: both QPNs, a data packet and the client's address on some plane.
    """

    server_addrs: list[str]
    port: int
    secured: bool
    pool_size: int = 512
    rng: random.Random = field(default_factory=random.Random)
    server_qpn: int | None = None
    client_qpn: int | None = None
    request: CmPacket | None = None
    #: The last genuine REQUEST's bytes as sniffed, and those of the connections before
    #: (kept after their connections end, for replays).
    request_raw: bytes = b""
    past_requests: deque[bytes] = field(default_factory=lambda: deque(maxlen=8))
    latest: DataPacket | None = None
    payload_mtu: int = 0
    window: int = 1024  # the REQUEST's MPR × 128: how far ahead of cack_psn a PSN is new
    client: dict[int, Addr] = field(default_factory=dict)
    evs: list[int] = field(default_factory=list)
    firsts: dict[int, tuple[int, int]] = field(default_factory=dict)  # MSN → its FIRST's PSN, VA
    #: Recent genuine datagrams by (towards the server?, plane), `pool_size` each.
    pools: dict[tuple[bool, int], deque[Genuine]] = field(default_factory=dict)
    connections: int = 0
    seen: int = 0
    undecodable: int = 0
    _plane_of: dict[str, int] = field(default_factory=dict)
    _nonce: bytes = b""

    def __post_init__(self) -> None:
        self._plane_of = {a: p for p, a in enumerate(self.server_addrs)}
        for p in range(len(self.server_addrs)):
            for to_server in (True, False):
                self.pools[(to_server, p)] = deque(maxlen=self.pool_size)

    @property
    def ready(self) -> bool:
        return (
            self.server_qpn is not None
            and self.client_qpn is not None
            and self.latest is not None
            and bool(self.client)
        )

    def server(self, plane: int) -> Addr:
        return (self.server_addrs[plane], self.port)

    def feed(self, datagrams: list[Seen]) -> None:
        for d in datagrams:
            self._one(d)

    def _one(self, d: Seen) -> None:
        if d.dport == self.port and d.dst in self._plane_of:
            plane, to_server = self._plane_of[d.dst], True
        elif d.sport == self.port and d.src in self._plane_of:
            plane, to_server = self._plane_of[d.src], False
        else:
            return  # a datagram of some other program that happens to use the port
        self.seen += 1
        data = d.payload
        if len(data) < 12:
            self.undecodable += 1
            return
        op = data[0]
        dest_qp, w8 = _BTH_QP_PSN.unpack_from(data)
        dest_qp &= _MASK24
        if to_server and op == Opcode.CM_REQUEST and (dest_qp & _MASK24) == CM_LISTEN_QPN:
            self._request(data)
        if to_server:
            self.client[plane] = (d.src, d.sport)
        g = Genuine((d.src, d.sport), (d.dst, d.dport), data, to_server)
        self.pools[(to_server, plane)].append(g)
        if op == Opcode.CM_REPLY and not to_server:
            self._reply(data, dest_qp)
        elif op in _DATA_VALUES and to_server and dest_qp == self.server_qpn:
            self._data(data, w8 & _MASK24)

    def _strip(self, data: bytes) -> bytes:
        if self.secured and data[0] not in _UNTRAILED:
            return data[: -TRAILER_SIZE]
        return data

    def _request(self, data: bytes) -> None:
        # A REQUEST carries no trailer; a secured one's private data is sealed (docs/WIRE.md §7).
        try:
            parts = split_request(data)
        except DecodeError:
            self.undecodable += 1
            return
        if parts.cmh.nonce == self._nonce:
            return  # another plane's copy of the REQUEST we know
        self._nonce = parts.cmh.nonce
        self.forget()
        # (A sealed REQUEST's private data is not readable: the template carries none.)
        cmh, private = parts.cmh, parts.rest
        if parts.is_sealed:
            cmh, private = dataclasses.replace(cmh, private_data_len=0), b""
        self.request = CmPacket(
            Opcode.CM_REQUEST, CM_LISTEN_QPN, cmh, parts.key_block, private, parts.p_key
        )
        if self.request_raw:
            self.past_requests.append(self.request_raw)
        self.request_raw = bytes(data)
        self.window = max(1, cmh.mpr) * 128
        self.connections += 1

    def forget(self) -> None:
        """The connection is gone (its client ended): nothing to aim at until the next one."""
        self.server_qpn = self.client_qpn = None
        self.request = self.latest = None
        self.client.clear()
        self.evs.clear()
        self.firsts.clear()
        for pool in self.pools.values():
            pool.clear()  # replays aim at the live connection, not at one that is gone

    def _reply(self, data: bytes, dest_qp: int) -> None:
        try:
            pkt = decode_packet(self._strip(data))
        except DecodeError:
            self.undecodable += 1
            return
        if isinstance(pkt, CmPacket) and self.request is not None:
            self.server_qpn = pkt.cmh.local_qpn
            self.client_qpn = dest_qp

    def _data(self, data: bytes, psn: int) -> None:
        latest = self.latest
        # Serial-number order (docs/WIRE.md §2): only a PSN after the newest one moves it.
        if latest is not None and not 0 < (psn - latest.psn) % PSN_MOD < PSN_MOD // 2:
            return
        try:
            pkt = decode_packet(self._strip(data))
        except DecodeError:
            self.undecodable += 1
            return
        if not isinstance(pkt, DataPacket):
            return
        if pkt.opcode in (Opcode.WRITE_FIRST, Opcode.WRITE_MIDDLE):
            self.payload_mtu = max(self.payload_mtu, len(pkt.payload))
        if pkt.opcode is Opcode.WRITE_FIRST:
            self.firsts[pkt.msn] = (pkt.psn, pkt.va)
            if len(self.firsts) > 64:
                del self.firsts[next(iter(self.firsts))]
        pkt.payload = b""  # keep the fields, not a view of the whole datagram
        self.latest = pkt
        if pkt.ev and pkt.ev not in self.evs:
            self.evs.append(pkt.ev)
            if len(self.evs) > 256:
                del self.evs[0]

    def genuine(self, to_server: bool, plane: int) -> Genuine | None:
        """A random recent genuine datagram of one direction on `plane` (None before any)."""
        pool = self.pools[(to_server, plane)]
        return pool[self.rng.randrange(len(pool))] if pool else None

    def left_in_message(self) -> int:
        """Packets of the newest packet's message still to come after it (0 when unknown)."""
        last = self.latest
        if last is None or not self.payload_mtu:
            return 0
        first = self.firsts.get(last.msn)
        if first is None:
            return 0
        packets = -(-last.dma_length // self.payload_mtu)
        return max(0, packets - 1 - (last.psn - first[0]) % PSN_MOD)

    def psn_ahead(self, distance: int) -> int:
        """The PSN `distance` after the newest one seen (modulo 2^24)."""
        assert self.latest is not None
        return (self.latest.psn + distance) % PSN_MOD

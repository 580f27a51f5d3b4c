"""A secured session's gate: which bytes of a datagram are checked how, before anything acts.

docs/DESIGN.md §6 orders a data packet's checks: decode → trimmed? → authenticate → PSN
window → R_Key and bounds → copy → mark. `SecureChannel.open` is the part up to
"authenticate", for every packet of an established secured connection:

* a data packet whose payload (UDP length - headers - trailer) is shorter than its opcode
  implies is trimmed (docs/WIRE.md §5): it cannot authenticate (its trailer was cut off), so it
  skips the tag and the anti-replay window and goes to `Receiver.on_trimmed`, which can only
  answer with a NACK, never write;
* every other packet — data, SACK, NACK, ACKNOWLEDGE, PROBE, endpoint, DISCONNECT — must carry
  a tag that verifies under a counter the anti-replay window has not seen (aead.py); only then
  is it handed on, without its trailer, to the same receive path an unsecured session uses;
* CM REQUEST and REJECT copies carry no trailer (docs/WIRE.md §7) and pass as they are: a
  REQUEST copy only ever makes the responder resend its REPLY bytes, a REJECT only ends a
  connection attempt that is still waiting.

A GRO read's full-size data packets take the same gate one after the other where they lie in
the read (`full_at`, `open_full_at`: the session's `_secured_run`), and each run of them that
opened then takes the receiver's one path as an unsecured read does (`on_data_span`).

`seal_control` seals the control packets of one output pull (data packets are sealed as they
are framed, sendpath.py). `reply_for` (the responder's REPLY, sealed when secured) and
`check_reply` (the requester's check of a secured REPLY) are the two ends of the handshake as
the session sees them; both give the connection's `PacketProtection`.

What it leaves to others: the keys and the window (aead.py, replay.py), key agreement
(handshake.py), the checks after authentication (receiver.py, sender.py, session.py).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Final

from ...wire.bth import CM_OPCODES, DATA_OPCODES, EVX_BIT, IMM_OPCODES, TS_BIT, Opcode
from ...wire.errors import DecodeError
from ...wire.fast import BTH_PEEK, DATA_HEADER_NOEVX
from ...wire.packet import DATA_HEADER, CmPacket, DataPacket, decode_packet
from ..cm import build_reply
from ..config import SessionConfig
from ..errors import LocalProtocolError
from ..paths.evlabel import restore_ev
from ..recv.receiver import Receiver
from ..transmit import Transmit
from .aead import TRAILER, PacketProtection
from .handshake import HEAD, Identity, Requester, Responder

#: BTH.EVX and BTH.TS as bits of the bytes that hold them (4 and 8).
_EVX: Final = EVX_BIT >> 24
_TS: Final = TS_BIT >> 24
_DATA: Final = frozenset(op.value for op in DATA_OPCODES)
_IMM: Final = frozenset(op.value for op in IMM_OPCODES)
_CM: Final = frozenset(op.value for op in CM_OPCODES)
#: CM packets that never carry a trailer.
_PLAIN_CM: Final = frozenset({Opcode.CM_REQUEST.value, Opcode.CM_REJECT.value})
_UNSEALED: Final = frozenset({Opcode.CM_REQUEST.value, Opcode.CM_REPLY.value})
_FULL: Final = frozenset({Opcode.WRITE_FIRST.value, Opcode.WRITE_MIDDLE.value})
#: `full_at`'s one unpack of a datagram's BTH (bound once: no method lookup a packet).
_PEEK_FULL: Final = BTH_PEEK.unpack_from
_HDR: Final = DATA_HEADER.size
_HDR_NOEVX: Final = DATA_HEADER_NOEVX.size


class SecureChannel:
    """The gate and the control-packet sealer of one established secured session."""

    def __init__(
        self,
        protection: PacketProtection,
        config: SessionConfig,
        receiver: Receiver,
        drops: Counter[str],
        reply: bytes = b"",
    ) -> None:
        self.protection = protection
        self.receiver = receiver
        self.drops = drops
        #: The headers of a data packet as the sender frames it (BTH EVXH METH TSETH RETH, or
        #: the same without EVXH on a flow-label connection), the value of BTH.EVX they carry,
        #: and the length of a full-size FIRST/MIDDLE: the common case.
        noevx = config.ev_encoding == "flowlabel"
        self._hdr = _HDR_NOEVX if noevx else _HDR
        self._evx = 0 if noevx else _EVX
        self._full = self._hdr + config.payload_mtu + TRAILER
        #: Requester: the REPLY that established us; its copies from other planes are
        #: expected and ignored without a count.
        self.reply = reply

    def open(
        self, data: bytes | memoryview, plane: int, tos: int, now: float
    ) -> bytes | memoryview | None:
        """The packet to process (without its trailer), or None when it was dropped (counted)
        or was a trimmed packet (already answered)."""
        n = len(data)
        if n == self._full and data[0] in _FULL and data[4] & _EVX == self._evx and data[8] & _TS:
            # The common full-size FIRST/MIDDLE with TSETH (and EVXH unless the flow label
            # carries the EV): its headers' size is known.
            return self.protection.open(data, self._hdr)
        if n < 12:
            self.drops["decode_length"] += 1
            return None
        op = data[0]
        if op in _DATA:
            return self._open_data(data, plane, tos, now)
        if op in _CM:
            if op in _PLAIN_CM:
                return data
            if op == Opcode.CM_REPLY.value:
                if data != self.reply:
                    self.drops["cm_unexpected_reply"] += 1
                return None  # a REPLY is never acted on once established
        return self.protection.open(data, 0)

    def full_at(self, buf: memoryview, at: int, size: int, qpn: int) -> bool:
        """Whether the datagram of `size` bytes at `at` in `buf` is a full-size FIRST or
        MIDDLE for QP `qpn` in the sender's layout (`open_full_at` takes it): the packets of a
        GRO read of data, but for its last."""
        if size != self._full:
            return False
        op, w4, b8 = _PEEK_FULL(buf, at)
        return (
            op in _FULL
            and w4 >> 24 & _EVX == self._evx
            and b8 & _TS != 0
            and w4 & 0xFFFFFF == qpn
        )

    def open_full_at(self, buf: memoryview, at: int, slot: bool = False) -> bool:
        """`open` in place for a datagram `full_at` accepted, in a writable `buf`: tag and
        window, its payload in clear where it lies (encrypt); False when dropped (counted).
        `slot`: `buf` is a receive slot of io's ring (`PacketProtection.open_at`)."""
        return self.protection.open_at(buf, at, self._full, self._hdr, slot)

    def _open_data(
        self, data: bytes | memoryview, plane: int, tos: int, now: float
    ) -> bytes | memoryview | None:
        try:
            # The trailer decodes as payload here: the codec does not know about it.
            pkt = decode_packet(data)
        except DecodeError as exc:
            self.drops[f"decode_{exc.field}"] += 1
            return None
        assert isinstance(pkt, DataPacket)
        if not self._evx and not restore_ev(pkt, data, plane, tos):
            self.drops["ev_no_label"] += 1  # a flow-label connection's packet without one
            return None
        receiver = self.receiver
        expected = receiver.expected_length(pkt.opcode.value, pkt.dma_length)
        if expected < 0:
            self.drops["bad_dma_length"] += 1
            return None
        payload = len(pkt.payload)
        if payload < expected + TRAILER:
            # Trimmed (docs/WIRE.md §5): payload = UDP length - headers - trailer is short.
            ts = pkt.tx_timestamp
            receiver.on_trimmed(pkt.psn, pkt.ev, -1 if ts is None else ts, plane, tos, now)
            return None
        return self.protection.open(data, len(data) - payload)

    def seal_control(self, out: list[Transmit]) -> None:
        """Give every control packet of `out` its trailer, in place (data packets are sealed
        by the framer; a REQUEST has none and a REPLY was sealed when it was built)."""
        seal = self.protection.seal
        for i, tx in enumerate(out):
            data = tx.data
            if tx.segment_size is None and data[0] not in _DATA and data[0] not in _UNSEALED:
                out[i] = Transmit(tx.plane, tx.addr, seal(data), tx.ev)


def _protection(
    config: SessionConfig, direction: int, secrets: tuple[bytes, bytes], drops: Counter[str]
) -> PacketProtection:
    return PacketProtection(
        direction=direction,
        tx_secret=secrets[direction],
        rx_secret=secrets[direction ^ 1],
        encrypt=config.security == "encrypt",
        rekey_shift=config.rekey_shift,
        replay_width=config.replay_width,
        max_payload=max(config.payload_mtu, 256),
        drops=drops,
    )


def reply_for(
    config: SessionConfig,
    request: CmPacket,
    request_raw: bytes | memoryview,
    identity: Identity | None,
    *,
    qpn: int,
    initial_psn: int,
    private_data: bytes,
    rng: random.Random,
    drops: Counter[str],
) -> tuple[bytes, PacketProtection | None]:
    """The responder's REPLY to `request` under the negotiated `config`, and on a secured
    connection its protection: the responder's half of the key agreement over the REQUEST's
    bytes `request_raw`, with `identity` (whose allowlist the endpoint already checked). The
    REPLY is sealed under counter 0, its private data encrypted. Raises LocalProtocolError for
    a secured REQUEST without keys or with degenerate ones (the endpoint REJECTs it)."""
    secured = config.secured
    # A secured REPLY's nonce salts the keys: it comes from the identity's entropy.
    nonce = identity.entropy(16) if secured and identity is not None else rng.randbytes(16)
    responder: Responder | None = None
    if secured:
        if identity is None or request.key_block is None:
            raise LocalProtocolError("a secured REQUEST needs an identity and a key block")
        responder = Responder.start(identity, request.key_block)
        if responder is None:
            drops["handshake_bad_key"] += 1
            raise LocalProtocolError("the REQUEST's keys are degenerate")
    reply = build_reply(
        config,
        local_qpn=qpn,
        remote_qpn=request.cmh.local_qpn,
        initial_psn=initial_psn,
        nonce=nonce,
        connection_id=request.cmh.connection_id,
        private_data=private_data,
        key_block=responder.key_block if responder is not None else None,
    )
    if responder is None:
        return reply, None
    secrets = responder.secrets(bytes(request_raw), reply[:HEAD], request.cmh.nonce + nonce)
    protection = _protection(config, 1, secrets, drops)
    return protection.seal_reply(reply, len(private_data)), protection


def before_keys(
    requester: Requester,
    config: SessionConfig,
    data: bytes | memoryview,
    request: bytes,
    request_nonce: bytes,
    drops: Counter[str],
) -> tuple[CmPacket | None, PacketProtection | None, bytes | None]:
    """What a secured requester does with a datagram before its REPLY verified: a REPLY is
    checked (`check_reply`), a REJECT decoded (it needs no trailer), anything else dropped
    as `not_connected`. Returns the CM packet to act on, and with a good REPLY the
    connection's protection and the responder's static key."""
    op = data[0] if len(data) else -1
    if op == Opcode.CM_REPLY.value:
        done = check_reply(requester, config, data, request, request_nonce, drops)
        return done if done is not None else (None, None, None)
    if op != Opcode.CM_REJECT.value:
        drops["not_connected"] += 1
        return None, None, None
    try:
        pkt = decode_packet(data)
    except DecodeError as exc:
        drops[f"decode_{exc.field}"] += 1
        return None, None, None
    return pkt if isinstance(pkt, CmPacket) else None, None, None


def check_reply(
    requester: Requester,
    config: SessionConfig,
    raw: bytes | memoryview,
    request: bytes,
    request_nonce: bytes,
    drops: Counter[str],
) -> tuple[CmPacket, PacketProtection, bytes] | None:
    """The requester's check of a secured REPLY (`raw`, with its trailer): the decoded REPLY
    (its private data in clear), the connection's protection and the responder's static key,
    or None with the reason counted. Nothing in a REPLY is acted on before its tag verifies."""
    if requester.checks >= Requester.MAX_REPLY_CHECKS:
        drops["cm_reply_flood"] += 1
        return None
    try:
        pkt = decode_packet(raw[: len(raw) - TRAILER])
    except DecodeError as exc:
        drops[f"decode_{exc.field}"] += 1
        return None
    if not isinstance(pkt, CmPacket) or pkt.key_block is None:
        drops["cm_mismatch"] += 1
        return None
    if not requester.accepts(pkt.key_block.static):
        drops["unknown_peer"] += 1
        return None
    secrets = requester.secrets(
        request, bytes(raw[:HEAD]), pkt.key_block, request_nonce + pkt.cmh.nonce
    )
    if secrets is None:
        drops["handshake_bad_key"] += 1
        return None
    protection = _protection(config, 0, secrets, drops)
    private = protection.open_reply(raw, pkt.cmh.private_data_len)
    if private is None:
        return None
    pkt.private_data = private
    return pkt, protection, pkt.key_block.static

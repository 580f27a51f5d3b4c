"""Per-packet protection in isolation: the anti-replay window, sealing and opening, epochs,
and the handshake's key derivation recomputed independently from docs/WIRE.md §7."""

from __future__ import annotations

import hashlib
import hmac
import random
import struct
from collections import Counter

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished
from mrc.core.secure.aead import TRAILER, PacketProtection
from mrc.core.secure.handshake import Identity, TokenBucket
from mrc.core.secure.replay import ReplayWindow
from mrc.sim import LinkParams, Network
from mrc.wire.bth import Opcode
from mrc.wire.cm import split_request
from mrc.wire.packet import CmPacket, decode_packet

# -- the anti-replay window --------------------------------------------------------------------


def test_the_window_accepts_each_counter_once_and_refuses_what_fell_behind() -> None:
    w = ReplayWindow(256)
    assert w.fresh(0) and w.fresh(1000)
    for c in (5, 3, 4, 0):
        w.accept(c)
    assert [w.fresh(c) for c in range(7)] == [False, True, True, False, False, False, True]
    w.accept(300)  # the window now spans 45 … 300
    assert w.top == 300
    assert (w.fresh(44), w.stale(44), w.fresh(45), w.stale(45)) == (False, True, True, False)
    assert not w.fresh(300) and w.fresh(299) and w.fresh(301)


def test_a_long_jump_clears_the_blocks_of_the_old_lap() -> None:
    w = ReplayWindow(128)
    for c in range(0, 200):
        w.accept(c)
    w.accept(200 + 64 * 100)  # far ahead: every block is from a past lap
    top = w.top
    assert all(w.fresh(c) for c in range(top - 127, top))
    assert not w.fresh(top) and not w.fresh(top - 128)


def test_the_window_is_at_least_as_wide_as_asked_at_every_alignment() -> None:
    for width in (64, 100, 4096):
        for start in (0, 1, 63, 64, 65, 1000):
            w = ReplayWindow(width)
            w.accept(start + width - 1)
            assert w.fresh(start) and not w.stale(start)
            assert w.stale(start - 1)


# -- sealing and opening -------------------------------------------------------------------------


Pair = tuple[PacketProtection, PacketProtection, Counter[str]]


def _pair(encrypt: bool, shift: int = 23) -> Pair:
    """The two ends of one direction (0): a sender and a receiver with its drop counter."""
    s0, s1 = bytes(range(32)), bytes(range(32, 64))
    drops: Counter[str] = Counter()

    def end(direction: int, tx: bytes, rx: bytes, drops: Counter[str]) -> PacketProtection:
        return PacketProtection(
            direction=direction, tx_secret=tx, rx_secret=rx, encrypt=encrypt,
            rekey_shift=shift, replay_width=512, max_payload=4096, drops=drops,
        )  # fmt: skip

    return end(0, s0, s1, Counter()), end(1, s1, s0, drops), drops


def _data_packet(tx: PacketProtection, header: bytes, payload: bytes) -> bytes:
    buf = bytearray(len(header) + len(payload) + TRAILER)
    buf[: len(header)] = header
    mv, end = memoryview(buf), len(header) + len(payload)
    first, second = tx.spans(mv, 0, len(header), end)
    tx.seal_into(mv, [(first, second, memoryview(payload), end)])
    return bytes(buf)


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_sealed_data_packet_opens_once_and_its_payload_is_ciphertext_only_when_encrypting(
    encrypt: bool,
) -> None:
    tx, rx, drops = _pair(encrypt)
    header, payload = b"H" * 40, bytes(range(256)) * 16
    pkt = _data_packet(tx, header, payload)
    assert pkt[:40] == header and len(pkt) == 40 + 4096 + 24
    assert (pkt[40:4136] == payload) is not encrypt
    assert struct.unpack_from(">Q", pkt, 4136)[0] == 0
    opened = rx.open(pkt, 40)
    assert opened is not None and bytes(opened) == header + payload
    assert rx.open(pkt, 40) is None and drops == Counter(replay=1)
    # From a writable receive buffer (io's), opened in place: the same plaintext.
    again = _data_packet(tx, header, payload)
    opened = rx.open(memoryview(bytearray(again)), 40)
    assert opened is not None and bytes(opened) == header + payload
    flipped = bytearray(_data_packet(tx, header, payload))
    flipped[100] ^= 1
    assert rx.open(memoryview(flipped), 40) is None and drops == Counter(replay=1, auth=1)


@pytest.mark.parametrize("encrypt", [False, True])
def test_every_single_bit_flip_fails_the_tag(encrypt: bool) -> None:
    tx, rx, drops = _pair(encrypt)
    pkt = _data_packet(tx, b"H" * 40, b"p" * 300)
    for bit in range(len(pkt) * 8):
        flipped = bytearray(pkt)
        flipped[bit // 8] ^= 1 << (bit % 8)
        assert rx.open(bytes(flipped), 40) is None
    # A flip inside the counter is a different nonce, a new counter: an `auth` drop too.
    assert drops == Counter(auth=len(pkt) * 8)
    assert rx.open(pkt, 40) is not None


def test_control_packets_are_tag_only_and_the_counter_is_shared_with_data() -> None:
    tx, rx, _ = _pair(encrypt=True)
    sack = bytes(range(64))
    sealed = tx.seal(sack)
    assert sealed[:64] == sack and struct.unpack_from(">Q", sealed, 64)[0] == 0
    data = _data_packet(tx, b"H" * 40, b"x" * 100)
    assert struct.unpack_from(">Q", data, 140)[0] == 1
    opened = rx.open(sealed, 0)
    assert opened is not None and bytes(opened) == sack


def test_the_key_changes_every_2_to_the_shift_packets_and_the_receiver_follows() -> None:
    tx, rx, drops = _pair(encrypt=True, shift=8)
    keys = []
    for _ in range(3 * 256 + 10):
        pkt = tx.seal(b"c" * 20)
        keys.append(tx._tx_ctx)
        assert rx.open(pkt, 0) is not None
    assert tx.rekeys == 3 and rx.rekeys == 3 and drops == Counter()
    assert len({id(k) for k in keys}) == 4
    # Epoch 0 fell behind the window: forgotten.
    assert sorted(rx._rx_ctxs) == [1, 2, 3]  # the window (512) still reaches epoch 1


def test_packets_of_the_next_epoch_may_arrive_before_the_last_ones_of_this_epoch() -> None:
    tx, rx, drops = _pair(encrypt=False, shift=8)
    pkts = [tx.seal(b"%d" % i) for i in range(300)]
    order = pkts[:250] + pkts[260:300] + pkts[250:260]  # crossing planes across the boundary
    assert all(rx.open(p, 0) is not None for p in order)
    assert drops == Counter()


def test_a_forged_counter_far_ahead_does_not_move_the_window_or_fill_the_key_table() -> None:
    tx, rx, drops = _pair(encrypt=False, shift=8)
    good = tx.seal(b"hello")
    for epoch in range(10, 60):
        forged = bytearray(good)
        struct.pack_into(">Q", forged, 5, epoch << 8)
        assert rx.open(bytes(forged), 0) is None
    assert drops == Counter(auth=50)
    assert rx.replay.top == -1 and sorted(rx._rx_ctxs) == [0]
    assert rx.open(good, 0) is not None


def test_the_traffic_secret_is_ratcheted_at_each_epoch_and_the_old_one_overwritten() -> None:
    """docs/WIRE.md §7: secret(e + 1) = HKDF-Expand(secret(e), "mrc ratchet"), key(e) from
    secret(e); a side that moved past an epoch no longer holds its secret."""
    tx, rx, drops = _pair(encrypt=False, shift=2)
    s0 = bytes(range(32))
    secret = [s0]
    for _ in range(3):
        secret.append(_expand(secret[-1], b"mrc ratchet", 32))
    for counter in range(12):  # epochs 0, 1, 2 of 4 packets each
        pkt = tx.seal(b"c%d" % counter)
        epoch = counter >> 2
        key = AESGCM(_expand(secret[epoch], b"mrc epoch" + epoch.to_bytes(8, "big"), 32))
        assert key.decrypt(struct.pack(">IQ", 0, counter), pkt[-16:], pkt[:-24]) == b""
        assert rx.open(pkt, 0) is not None
    assert drops == Counter()
    # Both ends stand at epoch 2 and hold secret(2) only: epochs 0 and 1 cannot be derived
    # from what is left (the receiver keeps the contexts its window reaches, not secrets).
    for ratchet in (tx._tx_secret, rx._rx_secret):
        assert ratchet.epoch == 2 and bytes(ratchet._secret) == secret[2]
        assert ratchet.key(0) is None and ratchet.key(1) is None
    assert s0 not in bytes(tx._tx_secret._secret) + bytes(rx._rx_secret._secret)


def test_the_reply_is_counter_zero_and_hides_its_private_data() -> None:
    tx, rx, _ = _pair(encrypt=False)
    reply = b"R" * 140 + b"secret rkey"
    sealed = tx.seal_reply(reply, 11)
    assert sealed[:140] == reply[:140] and b"secret" not in sealed
    assert struct.unpack_from(">Q", sealed, 151)[0] == 0
    assert rx.open_reply(sealed, 11) == b"secret rkey"
    with pytest.raises(ValueError):
        tx.seal_reply(reply, 11)  # counter 0 is gone


def test_the_token_bucket_allows_a_burst_then_its_rate() -> None:
    bucket = TokenBucket(rate=10.0, burst=3)
    assert [bucket.take(0.0) for _ in range(5)] == [True, True, True, False, False]
    assert [bucket.take(0.1) for _ in range(2)] == [True, False]
    assert [bucket.take(10.0) for _ in range(4)] == [True, True, True, False]


# -- the handshake, recomputed from the spec ------------------------------------------------------


def _hkdf(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 with SHA-256, written out (independent of the implementation under test)."""
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    return _expand(prk, info, length)


def _expand(prk: bytes, info: bytes, length: int) -> bytes:
    out, block = b"", b""
    for i in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
    return out[:length]


def _x(private: bytes, public: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(private).exchange(
        X25519PublicKey.from_public_bytes(public)
    )


def _head(packet: bytes) -> bytes:
    head = bytearray(packet[:140])
    head[13] = 0  # the CMH plane byte
    return bytes(head)


@pytest.mark.parametrize("psk", [None, b"k" * 32])
def test_the_keys_follow_wire_md_section_7_exactly(psk: bytes | None) -> None:
    s_i, s_r = b"\x11" * 32, b"\x22" * 32
    net = Network(seed=1)
    a, b = net.pair(2, LinkParams(latency=10e-6))
    pub_i, pub_r = Identity(s_i).public_key, Identity(s_r).public_key
    a.endpoint.identity = Identity(s_i, [pub_r], psk, entropy=random.Random(100).randbytes)
    b.endpoint.identity = Identity(s_r, [pub_i], psk, entropy=random.Random(200).randbytes)
    seen: list[bytes] = []
    a.on_receive = b.on_receive = lambda _h, _p, batch: seen.extend(bytes(d) for d, *_ in batch)
    config = SessionConfig(plane_mask=0b11, security="auth")
    b.listen(config, accept=lambda pd: b"answer to " + pd)
    a.connect(b, config, b"question")
    net.drive(0.001)
    assert a.events_of(ConnectionEstablished)[0].private_data == b"answer to question"

    request = next(d for d in seen if d[0] == Opcode.CM_REQUEST)
    reply = next(d for d in seen if d[0] == Opcode.CM_REPLY)
    req, rep = split_request(request), decode_packet(reply[:-24])
    assert req.is_sealed and isinstance(rep, CmPacket)
    assert req.key_block is not None and rep.key_block is not None
    assert (req.cmh.security, rep.cmh.security) == (1, 1)
    # The ephemeral keys are the first draws of each side's entropy (the responder's REPLY
    # nonce comes first).
    e_i = random.Random(100).randbytes(32)
    rb = random.Random(200)
    reply_nonce, e_r = rb.randbytes(16), rb.randbytes(32)
    assert rep.cmh.nonce == reply_nonce
    assert (req.key_block.static, rep.key_block.static) == (pub_i, pub_r)
    ikm = _x(e_i, rep.key_block.ephemeral) + _x(s_i, rep.key_block.ephemeral)
    ikm += _x(e_i, rep.key_block.static) + (psk or b"")
    assert ikm[:32] == _x(e_r, req.key_block.ephemeral)  # both sides agree on DH(e_i, e_r)
    # Revision 1.2: the REQUEST's timestamp and private data are sealed under k_req, from
    # DH(e_i, s_r) and DH(s_i, s_r), salted with its nonce, bound to its head.
    k_req = _hkdf(
        _x(e_i, pub_r) + _x(s_i, pub_r) + (psk or b""),
        req.cmh.nonce,
        b"mrc request" + hashlib.sha256(_head(request)).digest(),
        32,
    )
    sealed = AESGCM(k_req).decrypt(bytes(12), request[140:], _head(request))
    assert sealed[12:] == b"question" and b"question" not in request
    assert struct.unpack(">QI", sealed[:12])[0] >> 62 == 1  # TAI64N: seconds + 2^62
    # The session keys' info hashes the whole REQUEST (through its tag) and the REPLY's head.
    whole = bytearray(request)
    whole[13] = 0
    info = hashlib.sha256(bytes(whole) + _head(reply)).digest()
    okm = _hkdf(ikm, req.cmh.nonce + rep.cmh.nonce, info, 64)
    secret0, secret1 = okm[:32], okm[32:]

    def key(secret: bytes, epoch: int) -> AESGCM:
        return AESGCM(_expand(secret, b"mrc epoch" + epoch.to_bytes(8, "big"), 32))

    # The REPLY: direction 1, counter 0, its private data encrypted under the headers.
    n = len(reply) - 24
    assert reply[n : n + 8] == bytes(8)
    plain = key(secret1, 0).decrypt(
        struct.pack(">IQ", 1, 0), reply[140:n] + reply[n + 8 :], reply[:140]
    )
    assert plain == b"answer to question" and plain not in reply
    # The requester's first packet after the REPLY: direction 0, counter 0, tag only.
    first = next(d for d in seen if d[0] not in (Opcode.CM_REQUEST, Opcode.CM_REPLY))
    m = len(first) - 24
    counter = struct.unpack_from(">Q", first, m)[0]
    assert counter == 0
    assert key(secret0, 0).decrypt(struct.pack(">IQ", 0, counter), first[m + 8 :], first[:m]) == b""
    assert a.session().peer_static_key == pub_r and b.session().peer_static_key == pub_i

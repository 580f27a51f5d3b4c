"""The secured CM handshake (docs/WIRE.md §6–§7): identities, key agreement, traffic secrets.

A host's `Identity` is its static X25519 key pair, the peers it accepts (WireGuard style: a set
of static public keys; None accepts any key, for per-run keys that protect against tampering
but not impersonation), an optional pre-shared key, the entropy source for ephemeral keys, and
the newest REQUEST timestamp it gave (each later one is newer; the wall time comes in from the
caller, as `now` does: the core reads no clock).

The REQUEST proves its sender (revision 1.2). With requester static s_i and ephemeral e_i and
responder static s_r, a sealed REQUEST carries AES-256-GCM(k_req, nonce 0, AD = head) of
`TAI64N timestamp | private data`, where
    k_req = HKDF-SHA256(IKM = DH(e_i, s_r) ‖ DH(s_i, s_r) [‖ PSK], salt = REQUEST nonce,
                        info = "mrc request" ‖ SHA-256(head))
and the head is the REQUEST's bytes from BTH through the key block, CMH `plane` byte 0. So
only a holder of s_i can make a REQUEST that opens, and the responder knows it after two X25519
operations, before it keeps anything (`open_request`). A requester that knows no responder key
(no `peer_key`, and not exactly one key on its allowlist) sends the open form (private data in
clear, nothing sealed), which only a responder that accepts any key takes.

Session keys. With the responder's ephemeral e_r:
    IKM  = DH(e_i, e_r) ‖ DH(s_i, e_r) ‖ DH(e_i, s_r) [‖ PSK]
    salt = REQUEST nonce ‖ REPLY nonce
    info = SHA-256(REQUEST ‖ REPLY head): the whole REQUEST from BTH through its tag (or its
           private data, in the open form) and the REPLY from BTH through its key block, each
           with its CMH `plane` byte set to 0
and HKDF-SHA256 expands them into two 32-byte traffic secrets: direction 0 (requester →
responder), then direction 1. Only holders of the two listed static keys can compute the DH
values, and the transcript binds the negotiated parameters and the request's private data.
Per-epoch AES-GCM keys come from these secrets (aead.py).

`Requester` is the requester's half (its ephemeral key, the REQUEST's seal, and the REPLY
check), `Responder` the responder's (its ephemeral key and IKM, computed before the REPLY
exists). `TokenBucket` caps the X25519 work a flood of REQUESTs can cause. What it leaves to
others: building and parsing CM packets (cm.py, wire/cm.py), the allowlist check's REJECT, the
timestamp replay rule and the half-open bound (endpoint.py, replay.py), and sealing with the
secrets (aead.py).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Iterable
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ...wire.cm import CMH_SIZE, KEY_SIZE, KEYBLOCK_SIZE, TIMESTAMP_SIZE, KeyBlock, tai64n
from ..errors import LocalProtocolError

#: BTH + CMH + key block: the part of a CM packet the transcript hashes.
HEAD: Final = 12 + CMH_SIZE + KEYBLOCK_SIZE
#: Offset of the CMH `plane` byte in a CM packet (zeroed in the transcript).
PLANE_BYTE: Final = 12 + 1
PSK_SIZE: Final = 32
SECRET_SIZE: Final = 32

#: HKDF info prefix of a REQUEST's key (k_req).
REQUEST_LABEL: Final = b"mrc request"
_ZERO_NONCE: Final = bytes(12)

Entropy = Callable[[int], bytes]


def public_key(private_key: bytes) -> bytes:
    """The X25519 public key of a 32-byte private key."""
    return _raw_public(X25519PrivateKey.from_private_bytes(private_key))


def _raw_public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


class Identity:
    """A host's static key pair, the peers it accepts, its optional PSK, its entropy.

    `allowed_peers=None` accepts any peer key (nothing then stops an impersonator);
    `entropy` must be a cryptographically secure source (the default is the OS's, through
    `secrets`); tests pass a seeded one for reproducible packets.
    """

    def __init__(
        self,
        private_key: bytes,
        allowed_peers: Iterable[bytes] | None = None,
        psk: bytes | None = None,
        entropy: Entropy = secrets.token_bytes,
    ) -> None:
        if len(private_key) != KEY_SIZE:
            raise LocalProtocolError(
                f"an X25519 private key is {KEY_SIZE} bytes, got {len(private_key)}"
            )
        if psk is not None and len(psk) != PSK_SIZE:
            raise LocalProtocolError(f"a pre-shared key is {PSK_SIZE} bytes, got {len(psk)}")
        self.key = X25519PrivateKey.from_private_bytes(bytes(private_key))
        self.public_key = _raw_public(self.key)
        self.allowed_peers = None if allowed_peers is None else frozenset(map(bytes, allowed_peers))
        if self.allowed_peers is not None and any(len(k) != KEY_SIZE for k in self.allowed_peers):
            raise LocalProtocolError(f"every allowed peer key must be {KEY_SIZE} bytes")
        self.psk = psk
        self.entropy = entropy
        self._last_ns: int | None = None

    @classmethod
    def generate(
        cls,
        allowed_peers: Iterable[bytes] | None = None,
        psk: bytes | None = None,
        entropy: Entropy = secrets.token_bytes,
    ) -> Identity:
        """A fresh identity (per-run keys)."""
        return cls(entropy(KEY_SIZE), allowed_peers, psk, entropy)

    def allows(self, peer_static: bytes) -> bool:
        return self.allowed_peers is None or peer_static in self.allowed_peers

    def ephemeral(self) -> X25519PrivateKey:
        return X25519PrivateKey.from_private_bytes(self.entropy(KEY_SIZE))

    def timestamp(self, wall: float) -> bytes:
        """A TAI64N label of `wall` (seconds since the Unix epoch), later than every one this
        identity gave before (a clock that stands still or steps back still gives a new one,
        1 ns on)."""
        ns = int(wall * 1e9)
        if self._last_ns is not None and ns <= self._last_ns:
            ns = self._last_ns + 1
        self._last_ns = ns
        return tai64n(ns // 1_000_000_000, ns % 1_000_000_000)

    def sole_peer(self) -> bytes | None:
        """The one key the allowlist holds, if it holds exactly one."""
        peers = self.allowed_peers
        if peers is not None and len(peers) == 1:
            return next(iter(peers))
        return None


def plane_zeroed(packet: bytes | memoryview) -> bytearray:
    """A CM packet's bytes with the CMH `plane` byte set to 0 (what is hashed and sealed)."""
    b = bytearray(packet)
    b[PLANE_BYTE] = 0
    return b


def transcript(request: bytes | memoryview, reply_head: bytes | memoryview) -> bytes:
    """SHA-256 of the whole REQUEST and the REPLY's head, each with CMH `plane` zeroed."""
    h = hashlib.sha256()
    h.update(plane_zeroed(request))
    h.update(plane_zeroed(reply_head[:HEAD]))
    return h.digest()


def request_key(dh_e: bytes, dh_s: bytes, psk: bytes | None, nonce: bytes, head: bytes) -> bytes:
    """k_req: HKDF over DH(e_i, s_r) ‖ DH(s_i, s_r) [‖ PSK], salted with the REQUEST nonce,
    info "mrc request" ‖ SHA-256(head) (`head` already has its `plane` byte zeroed)."""
    info = REQUEST_LABEL + hashlib.sha256(head).digest()
    return HKDF(hashes.SHA256(), SECRET_SIZE, nonce, info).derive(dh_e + dh_s + (psk or b""))


def open_request(
    identity: Identity, head: bytes | memoryview, key_block: KeyBlock, nonce: bytes, sealed: bytes
) -> tuple[bytes, bytes] | None:
    """The responder's check of a sealed REQUEST: (TAI64N timestamp, private data) when it
    opens under this identity's static key, else None (a degenerate key or a failed tag).
    Two X25519 operations; keeps nothing."""
    dh_e = _dh(identity.key, key_block.ephemeral)
    dh_s = _dh(identity.key, key_block.static)
    if dh_e is None or dh_s is None or len(sealed) < TIMESTAMP_SIZE + 16:
        return None
    ad = bytes(plane_zeroed(head[:HEAD]))
    k_req = request_key(dh_e, dh_s, identity.psk, nonce, ad)
    try:
        plain = AESGCM(k_req).decrypt(_ZERO_NONCE, sealed, ad)
    except InvalidTag:
        return None
    return plain[:TIMESTAMP_SIZE], plain[TIMESTAMP_SIZE:]


def derive_secrets(ikm: bytes, salt: bytes, info: bytes) -> tuple[bytes, bytes]:
    """The traffic secrets of direction 0 and direction 1."""
    okm = HKDF(hashes.SHA256(), 2 * SECRET_SIZE, salt, info).derive(ikm)
    return okm[:SECRET_SIZE], okm[SECRET_SIZE:]


def _dh(private: X25519PrivateKey, public: bytes) -> bytes | None:
    """X25519; None for a public key that gives the all-zero secret (a low-order point)."""
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError:
        return None


class Requester:
    """The requester's side: its ephemeral key, and the check of a REPLY's keys.

    `peer_key`, when given, is the one responder static key accepted; otherwise the identity's
    allowlist decides (or any key, without one).
    """

    #: REPLYs checked at most per send of the REQUEST: each costs three X25519 operations,
    #: so a flood of forged REPLYs is cut off until the next send (`new_send`).
    MAX_REPLY_CHECKS: Final = 16

    def __init__(self, identity: Identity, peer_key: bytes | None = None) -> None:
        self.identity = identity
        self.peer_key = peer_key
        #: The responder static key REQUESTs are sealed to (None: the open form).
        self.responder_key = peer_key if peer_key is not None else identity.sole_peer()
        self._ephemeral = identity.ephemeral()
        self.key_block = KeyBlock(_raw_public(self._ephemeral), identity.public_key)
        self.checks = 0

    def new_send(self) -> None:
        """The REQUEST went out again: the REPLY checks start from zero (a flood of forged
        REPLYs can use up one send's budget, never the next one's)."""
        self.checks = 0

    def seal_request(
        self, head: bytes, nonce: bytes, private_data: bytes, wall: float
    ) -> bytes | None:
        """`sealed | tag` of a REQUEST whose head (BTH through key block) is `head`: a new
        timestamp (of the wall time `wall`) and `private_data` under k_req; None without a
        responder key (the open form) or with a degenerate one."""
        s_r = self.responder_key
        if s_r is None:
            return None
        dh_e = _dh(self._ephemeral, s_r)
        dh_s = _dh(self.identity.key, s_r)
        if dh_e is None or dh_s is None:
            return None
        ad = bytes(plane_zeroed(head[:HEAD]))
        k_req = request_key(dh_e, dh_s, self.identity.psk, nonce, ad)
        plain = self.identity.timestamp(wall) + private_data
        return AESGCM(k_req).encrypt(_ZERO_NONCE, plain, ad)

    def accepts(self, responder_static: bytes) -> bool:
        if self.peer_key is not None:
            return responder_static == self.peer_key
        return self.identity.allows(responder_static)

    def secrets(
        self, request: bytes, reply_head: bytes, reply_keys: KeyBlock, salt: bytes
    ) -> tuple[bytes, bytes] | None:
        """The two traffic secrets, or None if a DH value is degenerate. Each call counts
        toward `MAX_REPLY_CHECKS` (`checks`)."""
        self.checks += 1
        e_i = self._ephemeral
        parts = (
            _dh(e_i, reply_keys.ephemeral),
            _dh(self.identity.key, reply_keys.ephemeral),
            _dh(e_i, reply_keys.static),
        )
        if any(p is None for p in parts):
            return None
        ikm = b"".join(p for p in parts if p is not None) + (self.identity.psk or b"")
        return derive_secrets(ikm, salt, transcript(request, reply_head))


class Responder:
    """The responder's side for one REQUEST: its ephemeral key and the IKM.

    Build it with `Responder.start`, which returns None when a DH value is degenerate; the
    REPLY head (with `key_block`) is then built, and `secrets` gives the traffic secrets.
    """

    def __init__(self, key_block: KeyBlock, ikm: bytes) -> None:
        self.key_block = key_block
        self._ikm = ikm

    @classmethod
    def start(cls, identity: Identity, request_keys: KeyBlock) -> Responder | None:
        e_r = identity.ephemeral()
        parts = (
            _dh(e_r, request_keys.ephemeral),
            _dh(e_r, request_keys.static),
            _dh(identity.key, request_keys.ephemeral),
        )
        if any(p is None for p in parts):
            return None
        ikm = b"".join(p for p in parts if p is not None) + (identity.psk or b"")
        return cls(KeyBlock(ephemeral=_raw_public(e_r), static=identity.public_key), ikm)

    def secrets(self, request: bytes, reply_head: bytes, salt: bytes) -> tuple[bytes, bytes]:
        """The traffic secrets over the whole REQUEST (`request`, as it arrived) and the
        REPLY's head."""
        return derive_secrets(self._ikm, salt, transcript(request, reply_head))


class TokenBucket:
    """At most `burst` handshakes at once and `rate` per second on average."""

    def __init__(self, rate: float, burst: int) -> None:
        if rate <= 0 or burst < 1:
            raise LocalProtocolError("handshake rate must be positive and its burst at least 1")
        self.rate = rate
        self.burst = float(burst)
        self._tokens = float(burst)
        self._at: float | None = None

    def take(self, now: float) -> bool:
        if self._at is not None and now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        if self._at is None or now > self._at:
            self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

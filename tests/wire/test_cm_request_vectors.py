"""The sealed CM_REQUEST of docs/WIRE.md §7 (revision 1.2), byte by byte.

The head is written out from the layout of §6 (BTH, CMH, key block), not from `mrc`'s encoders;
the sealed part is computed here from the text of §7 with the primitives alone (X25519,
HKDF-SHA256 written out over HMAC, AES-256-GCM). `mrc` must build the same bytes, open them,
and its decoders (`split_request`, and scapy's layers as an independent reader) must find
every field where the layout puts it.
"""

from __future__ import annotations

import hashlib
import hmac
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from mrc.core.cm import request_head, with_plane
from mrc.core.config import SessionConfig
from mrc.core.secure.handshake import Identity, Requester, open_request
from mrc.wire.cm import KeyBlock, split_request, tai64n_ns

LUA = Path(__file__).resolve().parents[2] / "tools" / "wireshark" / "mrc.lua"
S_I, S_R, E_I = b"\x11" * 32, b"\x22" * 32, b"\x33" * 32
NONCE = bytes(range(16))
PRIVATE = b"hello va"
CONFIG = SessionConfig(plane_mask=0b11, security="auth", payload_mtu=4096, mpr=8,
                       ev_per_plane=16, max_imm=1024)  # fmt: skip


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace("|", " "))


def pub(private: bytes) -> bytes:
    key = X25519PrivateKey.from_private_bytes(private).public_key()
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def dh(private: bytes, public: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(private).exchange(
        X25519PublicKey.from_public_bytes(public)
    )


def hkdf(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    out, block = b"", b""
    for i in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
    return out[:length]


#: BTH through CMH of the REQUEST, plane 0 (the key block follows: computed from the keys).
HEAD = h(
    "e0 00 ffff | 00 000001 | 00 000000"  # BTH: CM_REQUEST, P_Key, DestQP 0x1, PSN 0
    " | 01 00 0000"  # CMH: version 1, plane 0, flags 0
    " | 000abc 00 | 000000 00"  # local_qpn 0xABC; remote_qpn 0
    " | 123456 08 | 1000 02 10"  # initial_psn, mpr 8; payload_mtu 4096, 2 planes, 16 EVs
    " | 00000003 | 0400 01 00"  # plane_mask; max_imm 1024, security auth
    " | 000102030405060708090a0b0c0d0e0f"  # nonce
    " | 0000 0008"  # reject_reason 0, private_data_len 8
    " | 0102030405060708 | 0000000000000000"  # connection_id; rsvd
)
#: TAI64N of 1,800,000,000 s after the epoch: 2^62 + seconds, then 0 ns.
TIMESTAMP = h("400000006b49d200 | 00000000")


def expected() -> bytes:
    head = HEAD + pub(E_I) + pub(S_I)
    s_r = pub(S_R)
    k_req = hkdf(dh(E_I, s_r) + dh(S_I, s_r), NONCE,
                 b"mrc request" + hashlib.sha256(head).digest(), 32)  # fmt: skip
    return head + AESGCM(k_req).encrypt(bytes(12), TIMESTAMP + PRIVATE, head)


def built() -> bytes:
    identity = Identity(S_I, [pub(S_R)], entropy=lambda n: E_I[:n])
    requester = Requester(identity, pub(S_R))
    head = request_head(CONFIG, local_qpn=0xABC, initial_psn=0x123456, nonce=NONCE,
                        connection_id=0x0102030405060708, private_data_len=len(PRIVATE),
                        key_block=requester.key_block)  # fmt: skip
    sealed = requester.seal_request(head, NONCE, PRIVATE, 1.8e9)
    assert sealed is not None
    return head + sealed


def test_mrc_builds_the_sealed_request_of_the_text() -> None:
    vector = expected()
    assert len(vector) == 12 + 64 + 64 + 12 + 8 + 16
    assert built() == vector


def test_the_decoder_finds_every_field_and_the_responder_opens_it() -> None:
    vector = expected()
    parts = split_request(vector)
    cmh = parts.cmh
    assert parts.is_sealed and parts.p_key == 0xFFFF
    assert (cmh.local_qpn, cmh.remote_qpn, cmh.initial_psn, cmh.mpr) == (0xABC, 0, 0x123456, 8)
    assert (cmh.payload_mtu, cmh.plane_count, cmh.ev_per_plane, cmh.plane_mask) == (4096, 2, 16, 3)
    assert (cmh.max_imm, cmh.security, cmh.nonce, cmh.private_data_len) == (1024, 1, NONCE, 8)
    assert cmh.connection_id == 0x0102030405060708 and cmh.plane == 0
    assert parts.key_block == KeyBlock(pub(E_I), pub(S_I))
    responder = Identity(S_R, [pub(S_I)])
    assert parts.key_block is not None
    opened = open_request(responder, vector, parts.key_block, NONCE, parts.rest)
    assert opened == (TIMESTAMP, PRIVATE)
    assert tai64n_ns(TIMESTAMP) == 1_800_000_000 * 10**9
    # Plane 1's copy differs in the plane byte alone and opens alike (the seal covers plane 0).
    copy = with_plane(vector, 1)
    assert [i for i in range(len(copy)) if copy[i] != vector[i]] == [13]
    assert open_request(responder, copy, parts.key_block, NONCE, parts.rest) == opened


@pytest.mark.parametrize("at", [2, 3, 8, 11, 14, 20, 40, 45, 60, 80, 120, 145, 160])
def test_any_other_changed_byte_fails_the_seal(at: int) -> None:
    vector = bytearray(expected())
    vector[at] ^= 0x01
    parts = split_request(bytes(vector))  # the lengths still fit: it decodes
    assert parts.key_block is not None
    responder = Identity(S_R, [pub(S_I)])
    assert open_request(responder, bytes(vector), parts.key_block, parts.cmh.nonce,
                        parts.rest) is None  # fmt: skip


def test_scapy_reads_the_same_layout() -> None:
    pytest.importorskip("scapy")
    from mrc.contrib.scapy_mrc import MRC_BTH, MRC_CMH, MRC_KeyBlock, MRC_SealedRequest

    vector = expected()
    pkt = MRC_BTH(vector)
    assert bytes(pkt) == vector
    cmh, keys, sealed = pkt[MRC_CMH], pkt[MRC_KeyBlock], pkt[MRC_SealedRequest]
    assert (cmh.local_qpn, cmh.private_data_len, cmh.nonce) == (0xABC, 8, NONCE)
    assert (keys.ephemeral, keys.static) == (pub(E_I), pub(S_I))
    assert sealed.sealed + sealed.tag == vector[140:] and len(sealed.tag) == 16


def test_the_wireshark_dissector_shows_the_sealed_part(tmp_path: Path) -> None:
    if shutil.which("tshark") is None:
        pytest.skip("no tshark")
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    vector = expected()
    path = tmp_path / "request.pcap"
    wrpcap(str(path), [Ether() / IP(src="192.0.2.1", dst="192.0.2.2")
                       / UDP(sport=4791, dport=4791) / vector])  # fmt: skip
    proc = subprocess.run(
        ["tshark", "-n", "-X", f"lua_script:{LUA}", "-r", str(path), "-T", "fields",
         "-e", "mrc.cm.private_data_len", "-e", "mrc.cm.sealed", "-e", "mrc.cm.sealed_tag",
         "-e", "_ws.expert.message"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and "Lua" not in proc.stderr, proc.stderr
    (row,) = [line.split("\t") for line in proc.stdout.splitlines()]
    length, sealed, tag, expert = row
    assert (length, expert) == ("8", "")  # nothing left over, nothing malformed
    shown = bytes.fromhex(sealed.replace(":", "")) + bytes.fromhex(tag.replace(":", ""))
    assert shown == vector[140:]

"""Secured transfers in the simulator (docs/WIRE.md §7): every byte lands once through loss,
duplication, reordering, trimming and rekeying, and no (key, nonce) pair is ever used twice."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sim_story import REPLY, Transfer, chunks, make_transfer, pattern

import mrc.core.secure.aead as aead
from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished, Event
from mrc.core.secure.handshake import Identity
from mrc.core.session import Session
from mrc.sim import Host, LinkParams, Network, clos

MiB = 1 << 20
A_KEY, B_KEY = b"\x01" * 32, b"\x02" * 32


def keys(net: Network, a: Host, b: Host) -> None:
    """Each host its own static key, accepting only the other's."""
    a_pub, b_pub = Identity(A_KEY).public_key, Identity(B_KEY).public_key
    a.endpoint.identity = Identity(A_KEY, [b_pub], entropy=random.Random(1).randbytes)
    b.endpoint.identity = Identity(B_KEY, [a_pub], entropy=random.Random(2).randbytes)


def transfer(
    level: str, size: int, params: LinkParams, build: Callable[..., None] = keys, **config: Any
) -> Transfer:
    cfg = SessionConfig(plane_mask=0b1111, security=level, cc_min_base_rtt=0.0, **config)
    return make_transfer(
        messages=chunks(size, MiB), size=size, params=params, config=cfg, build=build
    )


def protections(t: Transfer) -> tuple[aead.PacketProtection, aead.PacketProtection]:
    ca, cb = t.a.session().channel, t.b.session().channel
    assert ca is not None and cb is not None
    return ca.protection, cb.protection


@pytest.mark.parametrize("level", ["auth", "encrypt"])
def test_a_lossy_duplicating_reordering_secured_transfer_ends_byte_identical(level: str) -> None:
    params = LinkParams(
        rate_bps=10e9, latency=20e-6, queue_bytes=8 << 20, loss=0.01, duplicate=0.02,
        reorder=0.05, reorder_delay=50e-6,
    )  # fmt: skip
    t = transfer(level, 8 * MiB, params, flowcell=8)
    t.run()
    t.assert_placed_exactly_once()
    drops = t.b.session().stats.drops_by_reason
    # Every duplicate the network made was caught by the anti-replay window before the PSN
    # check could see it; nothing genuine failed its tag.
    assert drops["replay"] > 0 and drops["auth"] == 0 and drops["duplicate"] == 0
    assert t.a.session().stats.retransmits > 0
    assert t.a.session().stats.drops_by_reason["auth"] == 0


@pytest.mark.parametrize(("level", "visible"), [("auth", True), ("encrypt", False)])
def test_encrypt_hides_the_payload_and_auth_does_not(level: str, visible: bool) -> None:
    seen: list[bytes] = []

    def build(net: Network, a: Host, b: Host) -> None:
        keys(net, a, b)
        b.on_receive = lambda _h, _p, batch: seen.extend(bytes(d) for d, *_ in batch)

    t = transfer(level, MiB, LinkParams(latency=10e-6), build=build)
    t.run()
    t.assert_placed_exactly_once()
    chunk = pattern(MiB)[4096:4160]
    assert any(chunk in d for d in seen) is visible


class _Recording:
    """An AESGCM that notes the (key, nonce) of every seal (`encrypt_into`, or `encrypt` for an
    `auth` data packet's tag)."""

    used: ClassVar[list[tuple[bytes, bytes]]] = []

    def __init__(self, key: bytes) -> None:
        self.key = bytes(key)
        self.inner = AESGCM(key)

    def encrypt_into(self, nonce: Any, data: Any, aad: Any, buf: Any) -> int:
        self.used.append((self.key, bytes(nonce)))
        return self.inner.encrypt_into(nonce, data, aad, buf)

    def encrypt(self, nonce: Any, data: Any, aad: Any) -> bytes:
        self.used.append((self.key, bytes(nonce)))
        return self.inner.encrypt(nonce, data, aad)

    def decrypt_into(self, nonce: Any, data: Any, aad: Any, buf: Any) -> int:
        return self.inner.decrypt_into(nonce, data, aad, buf)


def test_no_key_and_nonce_pair_is_ever_used_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aead, "AESGCM", _Recording)
    monkeypatch.setattr(_Recording, "used", [])
    params = LinkParams(rate_bps=10e9, latency=20e-6, queue_bytes=8 << 20, loss=0.03)
    t = transfer("encrypt", 4 * MiB, params, flowcell=8, rekey_shift=8)
    t.run()
    t.assert_placed_exactly_once()
    used = _Recording.used
    pa, pb = protections(t)
    # Every packet either side sealed (REPLY, data in GSO batches, resends, SACKs, probes)
    # went through one recorded seal, and no pair repeats.
    assert len(used) == pa.tx_counter + pb.tx_counter
    assert len(set(used)) == len(used)
    assert t.a.session().stats.retransmits > 20
    assert len({k for k, _ in used}) >= 2 * 4  # several epochs on both sides


def test_a_rekey_every_256_packets_never_stalls_the_transfer() -> None:
    params = LinkParams(rate_bps=10e9, latency=20e-6, queue_bytes=8 << 20)
    t = transfer("encrypt", 16 * MiB, params, flowcell=8, rekey_shift=8)
    t.run()
    t.assert_placed_exactly_once()
    pa, pb = protections(t)
    assert pa.tx_counter >> 8 >= 16 and pa.rekeys >= 16 and pb.rekeys >= 16
    stats = t.b.session().stats
    assert stats.longest_stall_seconds < 0.010
    assert stats.drops_by_reason == {}


def test_a_congested_tier1_trims_and_each_trim_of_a_secured_flow_is_answered() -> None:
    """As in test_fabric, with `auth`: trimmed packets lost their trailer, skip the tag, and
    are answered with a NACK; each is resent once and every byte still lands once."""
    fast = LinkParams(rate_bps=10e9, latency=5e-6, queue_bytes=8 << 20)
    size = 8 * MiB
    messages = chunks(size, MiB)

    def on_event(host: Host, session: Session, event: Event) -> None:
        if isinstance(event, ConnectionEstablished):
            va, rkey = REPLY.unpack(event.private_data)
            for offset, length, imm in messages:
                session.post_write(t.src_region, offset, length, va + offset, rkey, imm)

    net = Network(seed=1)
    fab = clos(net, planes=4, racks=2, hosts_per_rack=2, tier1=4, host_link=fast,
               fabric_link=fast, trim=True, handlers={"h0": on_event})  # fmt: skip
    a, b = fab.hosts[0], fab.hosts[3]
    keys(net, a, b)
    src, dst = pattern(size), bytearray(size)
    t = Transfer(net, a, b, src, dst, a.regions.register(bytearray(src)), b.regions.register(dst),
                 messages)  # fmt: skip
    cfg = SessionConfig(plane_mask=0b1111, cc_min_base_rtt=0.0, security="auth")
    cfg = replace(cfg, plane_paths=fab.plane_paths)
    b.listen(cfg, accept=lambda _pd: REPLY.pack(t.dst_region.base_va, t.dst_region.rkey))
    t.session = a.connect(b, cfg)
    port = fab.link(fab.tier1[0][1], fab.tier0[0][1])
    port.params.rate_bps, port.params.queue_bytes = 1e9, 64 * 1024
    t.run()
    t.assert_placed_exactly_once()
    trimmed = port.counters["trimmed"]
    assert trimmed > 0
    assert t.b.session().stats.trimmed_received == trimmed
    assert t.a.session().stats.retransmits_by_cause["nack_trimmed"] == trimmed
    assert t.b.session().stats.drops_by_reason["auth"] == 0

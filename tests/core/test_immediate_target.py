"""An immediate names the region its WRITE_WITH_IMM landed in (R_Key, VA, length), so a host
that serves several applications (the daemon) can hand it to the one that owns that region."""

from __future__ import annotations

from mrc.core.config import SessionConfig
from mrc.core.events import ConnectionEstablished, ImmediateReceived, WriteCompleted
from mrc.sim import LinkParams, Network

MTU = 1024


def test_an_immediate_carries_the_rkey_va_and_length_of_its_message() -> None:
    net = Network(seed=5)
    a, b = net.pair(2, LinkParams(latency=10e-6))
    first = b.regions.register(bytearray(64 * 1024))
    second = b.regions.register(bytearray(8 * 1024))
    src = a.regions.register(bytearray(b"x" * 16 * 1024))
    cfg = SessionConfig(plane_mask=0b11, payload_mtu=MTU)
    b.listen(cfg, accept=lambda _: b"")
    session = a.connect(b, cfg)
    net.drive(0.001)
    assert a.events_of(ConnectionEstablished)
    # Three packets (FIRST, MIDDLE, LAST_IMM) at offset 4096 of the first region, then one
    # WRITE_ONLY_IMM of 100 bytes at offset 200 of the second.
    session.post_write(src, 0, 3 * MTU - 10, first.base_va + 4096, first.rkey, imm=11)
    session.post_write(src, 0, 100, second.base_va + 200, second.rkey, imm=22)
    a.flush(session)
    net.drive(0.05)
    assert [e.status for e in a.events_of(WriteCompleted)] == [0, 0]
    got = [(e.imm, e.rkey, e.va, e.length) for e in b.events_of(ImmediateReceived)]
    assert got == [
        (11, first.rkey, first.base_va + 4096, 3 * MTU - 10),
        (22, second.rkey, second.base_va + 200, 100),
    ]

"""recvmmsg drains (mrc.io.mmsg) against the recvmsg_into loop, on real loopback UDP sockets.

Every story sends the same datagrams to two plane sockets, one draining with recvmmsg and one
forced onto the recvmsg_into loop by MRC_NO_RECVMMSG=1, and asserts both hand the core the
same thing: payload bytes, source addresses, TOS / traffic class / flow label, GRO batches
split at the segment size, truncation and ECONNREFUSED counted the same way.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from loopback import ipv6_loopback

from mrc.io import mmsg, planes
from mrc.io.planes import ECT0, PlaneSocket

pytestmark = pytest.mark.skipif(not mmsg.available(), reason="no recvmmsg in this libc")

Got = list[tuple[bytes, tuple[Any, ...], int]]


V6 = pytest.param(
    "::1", marks=pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback")
)


def make_pair(
    monkeypatch: pytest.MonkeyPatch, host: str, **kw: Any
) -> tuple[PlaneSocket, PlaneSocket]:
    """(recvmmsg socket, recvmsg_into socket), both bound on `host`."""
    monkeypatch.delenv(mmsg.NO_RECVMMSG_ENV, raising=False)
    fast = PlaneSocket(0, host, 0, buffer_bytes=1 << 20, **kw)
    monkeypatch.setenv(mmsg.NO_RECVMMSG_ENV, "1")
    try:
        slow = PlaneSocket(0, host, 0, buffer_bytes=1 << 20, **kw)
    except BaseException:
        fast.close()
        raise
    monkeypatch.delenv(mmsg.NO_RECVMMSG_ENV)
    assert fast.recvmmsg and not slow.recvmmsg
    fast.mmsg_min_reads = 0  # every drain with recvmmsg, not only after bursts
    return fast, slow


@pytest.fixture
def closing() -> Iterator[list[PlaneSocket]]:
    socks: list[PlaneSocket] = []
    yield socks
    for s in socks:
        s.close()


def drain_until(sock: PlaneSocket, want: int, limit: int = 64) -> Got:
    """Drain until `want` datagrams came (2 s at most); what a drain returned, in order."""
    got: Got = []
    deadline = time.monotonic() + 2.0
    while len(got) < want and time.monotonic() < deadline:
        select.select([sock.fileno()], [], [], 0.2)
        got.extend((bytes(v), a, t) for v, a, t in sock.drain(limit))
    return got


def settle(*socks: PlaneSocket) -> None:
    """Wait until each socket is readable, then a little more: loopback delivers within the
    send call unless the softirq was deferred to ksoftirqd on a busy machine."""
    for s in socks:
        r, _, _ = select.select([s.fileno()], [], [], 2.0)
        assert r, "datagrams never arrived"
    time.sleep(0.05)


@pytest.mark.parametrize("host", ["127.0.0.3", V6])
def test_same_datagrams_sources_and_tos_as_the_recvmsg_loop(
    monkeypatch: pytest.MonkeyPatch, closing: list[PlaneSocket], host: str
) -> None:
    fast, slow = make_pair(monkeypatch, host)
    closing += [fast, slow]
    src = "127.0.0.2" if ":" not in host else "::1"
    a = PlaneSocket(0, src, 0)  # ECT(0)
    b = PlaneSocket(0, src, 0, tos=0xB8)  # EF, not ECN-capable: another TOS, another port
    closing += [a, b]
    sizes = [1, 7, 100, 1400, 4096, 9000, 65507 if ":" not in host else 65000]
    for i, size in enumerate(sizes * 3):
        sender = a if i % 2 else b
        for dst in (fast, slow):
            assert sender.send(bytes([i]) * size, dst.local_addr) is None
    got_fast = drain_until(fast, 21)
    got_slow = drain_until(slow, 21)
    assert got_fast == got_slow
    assert [len(d) for d, _, _ in got_fast] == sizes * 3
    assert [d[0] for d, _, _ in got_fast] == list(range(21))
    assert {t for _, _, t in got_fast} == {ECT0, 0xB8}
    assert {s for _, s, _ in got_fast} == {a.local_addr, b.local_addr}
    assert (fast.packets_received, fast.bytes_received) == (21, 3 * sum(sizes))
    assert (slow.packets_received, slow.bytes_received) == (21, 3 * sum(sizes))
    assert fast.drain(64) == [] and slow.drain(64) == []  # empty socket: EAGAIN, no exception
    assert fast.counters == slow.counters


@pytest.mark.parametrize("host", ["127.0.0.3", V6])
def test_gro_batches_split_at_their_segment_size(
    monkeypatch: pytest.MonkeyPatch, closing: list[PlaneSocket], host: str
) -> None:
    fast, slow = make_pair(monkeypatch, host, gro=True)
    closing += [fast, slow]
    if not fast.gro:
        pytest.skip("no UDP_GRO")
    a = PlaneSocket(0, "127.0.0.2" if ":" not in host else "::1", 0)
    closing.append(a)
    seg = 1000
    batch = b"".join(bytes([i]) * seg for i in range(11)) + b"\xee" * 321  # short last one
    for dst in (fast, slow):
        assert a.send(batch, dst.local_addr, segment_size=seg) is None
        assert a.send(b"single", dst.local_addr) is None
        assert a.send(batch[: 3 * seg], dst.local_addr, segment_size=seg) is None
    if not a.gso:
        pytest.skip("kernel refused UDP GSO")
    settle(fast, slow)
    got_fast = drain_until(fast, 16)
    got_slow = drain_until(slow, 16)
    assert got_fast == got_slow
    want = [bytes([i]) * seg for i in range(11)] + [b"\xee" * 321, b"single"]
    want += [bytes([i]) * seg for i in range(3)]
    assert [d for d, _, _ in got_fast] == want
    assert all(t == ECT0 and s == a.local_addr for _, s, t in got_fast)
    # The kernel coalesced (one read per batch): 3 reads, 16 datagrams, on both paths.
    assert fast.packets_received == slow.packets_received == 3


def test_a_gro_drain_passes_its_limit_by_one_batch_like_the_recvmsg_loop(
    monkeypatch: pytest.MonkeyPatch, closing: list[PlaneSocket]
) -> None:
    fast, slow = make_pair(monkeypatch, "127.0.0.3", gro=True)
    closing += [fast, slow]
    if not fast.gro:
        pytest.skip("no UDP_GRO")
    a = PlaneSocket(0, "127.0.0.2", 0)
    closing.append(a)
    for i in range(6):  # 6 GSO batches of 10 datagrams: 6 reads of 10 with GRO
        for dst in (fast, slow):
            assert a.send(bytes([i]) * 5000, dst.local_addr, segment_size=500) is None
    if not a.gso:
        pytest.skip("kernel refused UDP GSO")
    settle(fast, slow)
    sizes = {id(s): [len(s.drain(16)) for _ in range(4)] for s in (fast, slow)}
    # 10 < 16, then 20 >= 16: each drain stops after the batch that passes the limit (one
    # recvmmsg call would otherwise have read all 6 batches, 60 datagrams, at once).
    assert sizes[id(fast)] == sizes[id(slow)] == [20, 20, 20, 0]
    assert fast.packets_received == slow.packets_received == 6


def test_truncated_datagrams_are_counted_and_skipped(
    monkeypatch: pytest.MonkeyPatch, closing: list[PlaneSocket]
) -> None:
    monkeypatch.setattr(planes, "RECV_BUFFER_BYTES", 1024)  # ring buffers of 1 KiB
    fast, slow = make_pair(monkeypatch, "127.0.0.3")
    closing += [fast, slow]
    a = PlaneSocket(0, "127.0.0.2", 0)
    closing.append(a)
    sizes = [1024, 1025, 10, 5000, 1023]
    for i, size in enumerate(sizes):
        for dst in (fast, slow):
            a.send(bytes([i]) * size, dst.local_addr)
    settle(fast, slow)
    got_fast = drain_until(fast, 3)
    got_slow = drain_until(slow, 3)
    assert got_fast == got_slow
    assert [(d[0], len(d)) for d, _, _ in got_fast] == [(0, 1024), (2, 10), (4, 1023)]
    assert fast.counters["truncated"] == slow.counters["truncated"] == 2
    assert fast.packets_received == slow.packets_received == 3


def test_limit_ring_reuse_and_one_syscall_per_batch(
    monkeypatch: pytest.MonkeyPatch, closing: list[PlaneSocket]
) -> None:
    fast, slow = make_pair(monkeypatch, "127.0.0.3", ring_size=8)
    closing += [fast, slow]
    a = PlaneSocket(0, "127.0.0.2", 0)
    closing.append(a)
    calls: list[tuple[int, int]] = []
    read = mmsg.MmsgRing.read

    def counting(self: mmsg.MmsgRing, fd: int, start: int, count: int, *rest: Any) -> Any:
        calls.append((start, count))
        return read(self, fd, start, count, *rest)

    monkeypatch.setattr(mmsg.MmsgRing, "read", counting)
    for i in range(20):
        for dst in (fast, slow):
            a.send(bytes([i]) * 50, dst.local_addr)
    settle(fast, slow)
    rings = {id(fast): {id(b) for b in fast._ring}, id(slow): {id(b) for b in slow._ring}}
    seen: dict[int, list[list[int]]] = {id(fast): [], id(slow): []}
    for limit in (3, 64, 5, 64):  # 3, then a ring's worth (8), 5, then what is left (4)
        for s in (fast, slow):
            got = s.drain(limit)
            assert all(id(v.obj) in rings[id(s)] for v, _, _ in got)  # views of the ring
            seen[id(s)].append([v[0] for v, _, _ in got])
    assert seen[id(fast)] == seen[id(slow)]
    assert seen[id(fast)] == [[0, 1, 2], [3, 4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15],
                              [16, 17, 18, 19]]  # fmt: skip
    # One recvmmsg per drain, each from the ring's first slot (planes.py: the slots a drain
    # needs stay in the caches); the last one found the socket short (asked 8, got 4).
    assert calls == [(0, 3), (0, 8), (0, 5), (0, 8)]


def test_recvmmsg_takes_over_after_a_drain_that_found_a_burst(
    monkeypatch: pytest.MonkeyPatch, closing: list[PlaneSocket]
) -> None:
    monkeypatch.delenv(mmsg.NO_RECVMMSG_ENV, raising=False)
    b = PlaneSocket(0, "127.0.0.3", 0)
    a = PlaneSocket(0, "127.0.0.2", 0)
    closing += [a, b]
    assert b.recvmmsg and b.mmsg_min_reads == planes.MMSG_MIN_READS == 4
    calls: list[int] = []
    read = mmsg.MmsgRing.read

    def counting(self: mmsg.MmsgRing, fd: int, start: int, count: int, *rest: Any) -> Any:
        calls.append(count)
        return read(self, fd, start, count, *rest)

    monkeypatch.setattr(mmsg.MmsgRing, "read", counting)

    def burst(n: int) -> list[bytes]:
        for i in range(n):
            a.send(bytes([n, i]), b.local_addr)
        settle(b)
        return [bytes(v) for v, _, _ in b.drain(64)]

    # (each drain reads into the ring from its first slot: a call asks for the whole ring)
    assert burst(3) == [bytes([3, i]) for i in range(3)] and calls == []  # 3 reads: the loop
    assert burst(4) == [bytes([4, i]) for i in range(4)] and calls == []  # 4: still the loop
    assert burst(2) == [bytes([2, i]) for i in range(2)] and calls == [64]  # after 4: recvmmsg
    assert burst(5) == [bytes([5, i]) for i in range(5)] and calls == [64]  # after 2: the loop
    assert burst(1) == [b"\x01\x00"] and calls == [64, 64]  # after 5: recvmmsg
    assert b.packets_received == 15


def test_connection_refused_is_counted_like_the_recvmsg_loop(
    monkeypatch: pytest.MonkeyPatch, closing: list[PlaneSocket]
) -> None:
    fast, slow = make_pair(monkeypatch, "127.0.0.3")
    closing += [fast, slow]
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.4", 0))
    dead = probe.getsockname()
    probe.close()  # nobody listens there now: the kernel answers ICMP port unreachable
    for s in (fast, slow):
        s.connect(dead)
        assert s.send(b"x", dead) is None
        r, _, _ = select.select([s.fileno()], [], [], 2.0)
        assert r, "the ICMP error never came"
        assert s.drain(64) == []
    assert fast.counters == slow.counters
    assert fast.counters["econnrefused"] == 1 and fast.error_events == slow.error_events == 1


def test_flow_label_reaches_the_core_above_the_tclass(
    monkeypatch: pytest.MonkeyPatch, closing: list[PlaneSocket]
) -> None:
    if not ipv6_loopback():
        pytest.skip("no IPv6 loopback")
    fast, slow = make_pair(monkeypatch, "::1", flowlabel=True)
    closing += [fast, slow]
    a = PlaneSocket(0, "::1", 0, flowlabel=True)
    closing.append(a)
    for dst in (fast, slow):
        assert a.send(b"labelled", dst.local_addr, label=0x12345) is None
        assert a.send(b"y" * 3000, dst.local_addr, 1000, label=0xABCDE) is None
    got_fast = drain_until(fast, 4)
    got_slow = drain_until(slow, 4)
    assert got_fast == got_slow
    assert [t for _, _, t in got_fast] == [0x12345 << 8 | ECT0] + [0xABCDE << 8 | ECT0] * 3


def test_environment_variable_forces_the_recvmsg_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(mmsg.NO_RECVMMSG_ENV, "1")
    assert not mmsg.available()
    s = PlaneSocket(0, "127.0.0.3", 0)
    try:
        assert not s.recvmmsg
        assert s.drain(64) == []
    finally:
        s.close()
    monkeypatch.setenv(mmsg.NO_RECVMMSG_ENV, "0")  # 0 is not a request for the fallback
    assert mmsg.available()
    s = PlaneSocket(0, "127.0.0.3", 0)
    try:
        assert s.recvmmsg
    finally:
        s.close()


def test_ipv6_source_addresses_decode_as_cpython_gives_them() -> None:
    """Scope ids, flowinfo and v4-mapped sources, written into a slot the way the kernel does
    (no link-local traffic on loopback to send them with)."""
    ring = mmsg.MmsgRing(socket.AF_INET6, [bytearray(64)], 64)
    lo = socket.if_indextoname(1)

    def decode(host: str, port: int, flowinfo: int, scope: int) -> tuple[Any, ...]:
        raw = struct.pack("=H", socket.AF_INET6) + struct.pack("!HI", port, flowinfo)
        raw += socket.inet_pton(socket.AF_INET6, host) + struct.pack("=I", scope)
        ring._names_view[: len(raw)] = raw
        return ring._decode(0, raw, True)

    assert decode("fe80::1", 4791, 0, 1) == (f"fe80::1%{lo}", 4791, 0, 1)
    assert decode("2001:db8::7", 65535, 0xABCDE, 0) == ("2001:db8::7", 65535, 0xABCDE, 0)
    assert decode("::ffff:10.0.0.1", 1, 0, 0) == ("::ffff:10.0.0.1", 1, 0, 0)

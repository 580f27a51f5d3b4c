"""Plane sockets on loopback: send/drain, TOS, ring reuse, GSO, GRO and send-error mapping."""

from __future__ import annotations

import errno
import select
import socket
from collections.abc import Iterator

import pytest
from counting import CountingReads

from mrc.io.planes import ECT0, PlaneSocket, resolve_addr


def wait_readable(sock: PlaneSocket, timeout: float = 2.0) -> None:
    r, _, _ = select.select([sock.fileno()], [], [], timeout)
    assert r, "socket never became readable"


def drain_all(
    sock: PlaneSocket, want: int, limit: int = 64
) -> list[tuple[bytes, tuple[object, ...], int]]:
    got: list[tuple[bytes, tuple[object, ...], int]] = []
    while len(got) < want:
        wait_readable(sock)
        got.extend((bytes(v), a, t) for v, a, t in sock.drain(limit))
    return got


@pytest.fixture
def pair() -> Iterator[tuple[PlaneSocket, PlaneSocket]]:
    a = PlaneSocket(0, "127.0.0.2", 0, buffer_bytes=1 << 20)
    b = PlaneSocket(0, "127.0.0.3", 0, buffer_bytes=1 << 20)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def test_send_and_drain_carry_tos_and_source(pair: tuple[PlaneSocket, PlaneSocket]) -> None:
    a, b = pair
    for i in range(5):
        assert a.send(bytes([i]) * 100, b.local_addr) is None
    got = drain_all(b, 5)
    assert [d for d, _, _ in got] == [bytes([i]) * 100 for i in range(5)]
    assert all(src == a.local_addr for _, src, _ in got)
    assert all(tos == ECT0 for _, _, tos in got)  # we send ECT(0) and read the TOS byte back
    assert b.packets_received == 5 and a.packets_sent == 5 and a.bytes_sent == 500
    assert b.drain(64) == []  # empty socket: EAGAIN, no exception


def test_drain_stops_at_limit_and_reuses_preallocated_ring() -> None:
    a = PlaneSocket(0, "127.0.0.2", 0)
    b = PlaneSocket(0, "127.0.0.3", 0, ring_size=4)
    try:
        for i in range(10):
            a.send(bytes([i]) * 10, b.local_addr)
        wait_readable(b)
        first = b.drain(64)
        assert len(first) == 4  # never more than one ring per call
        bases = {id(v.obj) for v, _, _ in first}
        assert len(bases) == 4
        rest = drain_all(b, 6)
        assert [d[0] for d, _, _ in rest] == list(range(4, 10))
        # every view points into one of the 4 preallocated buffers: no per-packet buffers
        wait_readable_or_none = b.drain(64)
        assert wait_readable_or_none == []
        a.send(b"x", b.local_addr)
        wait_readable(b)
        ((v, _, _),) = b.drain(64)
        assert id(v.obj) in bases
    finally:
        a.close()
        b.close()


def test_ipv6_tclass_is_read() -> None:
    try:
        a = PlaneSocket(0, "::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback")
    b = PlaneSocket(0, "::1", 0)
    try:
        assert a.send(b"hello", b.local_addr) is None
        ((data, src, tos),) = drain_all(b, 1)
        assert data == b"hello" and tos == ECT0 and src[:2] == a.local_addr[:2]
    finally:
        a.close()
        b.close()


def test_gso_batch_arrives_as_separate_datagrams(pair: tuple[PlaneSocket, PlaneSocket]) -> None:
    a, b = pair
    seg = 1000
    data = b"".join(bytes([i]) * seg for i in range(7)) + b"\xff" * 300  # short last segment
    assert a.send(data, b.local_addr, segment_size=seg) is None
    got = drain_all(b, 8)
    assert [d for d, _, _ in got] == [bytes([i]) * seg for i in range(7)] + [b"\xff" * 300]
    assert a.packets_sent == 8
    if not a.gso:
        pytest.skip("kernel refused UDP GSO; the batch went out split (still correct)")


def test_gro_receive_splits_coalesced_reads() -> None:
    a = PlaneSocket(0, "127.0.0.2", 0)
    b = PlaneSocket(0, "127.0.0.3", 0, gro=True)
    try:
        if not b.gro:
            pytest.skip("no UDP_GRO")
        seg = 512
        data = b"".join(bytes([i]) * seg for i in range(12))
        a.send(data, b.local_addr, segment_size=seg)
        got = drain_all(b, 12)
        assert [d for d, _, _ in got] == [bytes([i]) * seg for i in range(12)]
        assert all(tos == ECT0 for _, _, tos in got)
    finally:
        a.close()
        b.close()


def test_connected_socket_sends_and_counts_refused() -> None:
    a = PlaneSocket(0, "127.0.0.2", 0)
    # a port nobody listens on: the kernel answers ICMP port unreachable
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.3", 0))
    dead = probe.getsockname()
    probe.close()
    try:
        a.connect(dead)
        assert a.connected == dead
        for _ in range(5):
            assert a.send(b"x", dead) is None  # ECONNREFUSED is counted, never raised
            a.drain(8)
        assert a.counters["econnrefused"] >= 1
    finally:
        a.close()


class _FailingSock:
    def __init__(self, code: int) -> None:
        self.code = code

    def sendto(self, data: object, addr: object) -> int:
        raise OSError(self.code, errno.errorcode[self.code])

    send = sendto

    def sendmsg(self, *args: object) -> int:
        raise OSError(self.code, errno.errorcode[self.code])

    def recvmsg(self, *args: object) -> tuple[bytes, list[object], int, object]:
        raise BlockingIOError(errno.EAGAIN, "error queue empty")  # a local error, no ICMP

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("code", "returned", "counter"),
    [
        (errno.ENETUNREACH, errno.ENETUNREACH, "send_enetunreach"),
        (errno.ENETDOWN, errno.ENETDOWN, "send_enetdown"),
        (errno.EHOSTUNREACH, errno.EHOSTUNREACH, "send_ehostunreach"),
        (errno.ECONNREFUSED, None, "econnrefused"),
        (errno.EAGAIN, errno.EAGAIN, "local_drop_eagain"),
        (errno.ENOBUFS, errno.ENOBUFS, "local_drop_enobufs"),
        (errno.EPERM, None, "send_eperm"),
    ],
)
def test_send_error_mapping(code: int, returned: int | None, counter: str) -> None:
    s = PlaneSocket(0, "127.0.0.2", 0)
    real = s.sock
    try:
        s.sock = _FailingSock(code)  # type: ignore[assignment]
        assert s.send(b"x", ("127.0.0.3", 9)) == returned
        assert s.counters[counter] == 1
    finally:
        real.close()


def test_an_icmp_error_pending_on_the_socket_is_not_a_plane_down() -> None:
    # With IP_RECVERR an ICMP unreachable from some router fails the next send with
    # EHOSTUNREACH and waits in the error queue; the plane's own link is fine.
    s = PlaneSocket(0, "127.0.0.2", 0)
    b = PlaneSocket(0, "127.0.0.3", 0)
    real = s.sock

    class IcmpPending:
        def __init__(self) -> None:
            self.queued = 1
            self.failed = False

        def sendto(self, data: bytes, addr: tuple[str, int]) -> int:
            if not self.failed:
                self.failed = True
                raise OSError(errno.EHOSTUNREACH, "pending ICMP error")
            return real.sendto(data, addr)

        def recvmsg(self, *args: object) -> tuple[bytes, list[object], int, object]:
            if self.queued:
                self.queued -= 1
                return b"", [], 0, None
            raise BlockingIOError(errno.EAGAIN, "empty")

    try:
        s.sock = IcmpPending()  # type: ignore[assignment]
        assert s.send(b"once", b.local_addr) is None
        assert s.counters["icmp_ehostunreach"] == 1 and "send_ehostunreach" not in s.counters
        assert [bytes(d) for d, _, _ in drain_all(b, 1)] == [b"once"]
    finally:
        real.close()
        b.close()


def test_gso_refused_by_kernel_falls_back_to_single_sends() -> None:
    s = PlaneSocket(0, "127.0.0.2", 0)
    b = PlaneSocket(0, "127.0.0.3", 0)
    real = s.sock

    class NoGso:
        def sendmsg(self, *args: object) -> int:
            raise OSError(errno.EIO, "no csum offload")

        def sendto(self, data: bytes, addr: tuple[str, int]) -> int:
            return real.sendto(data, addr)

    try:
        s.sock = NoGso()  # type: ignore[assignment]
        assert s.send(b"a" * 10 + b"b" * 10, b.local_addr, segment_size=10) is None
        assert not s.gso and s.counters["gso_disabled"] == 1
        assert [d for d, _, _ in drain_all(b, 2)] == [b"a" * 10, b"b" * 10]
    finally:
        real.close()
        b.close()


def test_bind_errors_raise_oserror_with_errno() -> None:
    with pytest.raises(OSError) as info:
        PlaneSocket(0, "192.0.2.1", 0)  # TEST-NET-1: not a local address
    assert info.value.errno == errno.EADDRNOTAVAIL
    a = PlaneSocket(0, "127.0.0.2", 0)
    try:
        with pytest.raises(OSError) as info:
            PlaneSocket(0, "127.0.0.2", a.local_addr[1])
        assert info.value.errno == errno.EADDRINUSE
    finally:
        a.close()


def test_resolve_addr_forms() -> None:
    assert resolve_addr("127.0.0.2", 7) == (socket.AF_INET, ("127.0.0.2", 7))
    fam, addr = resolve_addr("[::1]", 7)
    assert fam == socket.AF_INET6 and addr[:2] == ("::1", 7)


def test_icmp_port_unreachable_names_the_destination_for_io() -> None:
    """Datagrams to a closed port draw ICMP port unreachable; the error queue (IP_RECVERR)
    names each one's destination, which `take_unreachable` hands to io once (an unconnected
    socket, IPv4 and IPv6). A datagram to a live peer is not reported."""
    for host, other in (("127.0.0.2", "127.0.0.10"), ("::1", "::1")):
        sock = PlaneSocket(0, host, 0)
        live = PlaneSocket(0, other, 0)
        gone = PlaneSocket(0, other, 0)
        try:
            closed = gone.local_addr
            gone.close()
            sock.send(b"x", live.local_addr)
            for _ in range(3):
                sock.send(b"y", closed)
            wait_readable(live)
            deadline = 50
            while len(sock.unreachable) < 3 and deadline:
                select.select([sock.fileno()], [], [], 0.01)
                sock.drain(8)
                deadline -= 1
            assert sock.take_unreachable() == [closed] * 3
            assert sock.take_unreachable() == []
            assert sock.counters["icmp_errors"] >= 1
        finally:
            sock.close()
            live.close()


def test_a_drain_once_reads_one_datagram_and_never_finds_the_socket_empty() -> None:
    a = PlaneSocket(0, "127.0.0.2", 0)
    b = PlaneSocket(0, "127.0.0.3", 0)
    counting = CountingReads(b.sock)
    real = b.sock
    b.sock = counting  # type: ignore[assignment]
    try:
        for i in range(3):
            a.send(bytes([i]) * 10, b.local_addr)
        wait_readable(b)
        (read,) = b.drain_reads(once=True)
        assert bytes(read[0][: read[4]]) == b"\x00" * 10 and b.drained == 1
        assert (counting.reads, counting.empty) == (1, 0)
        # A drain without `once` reads until the socket is empty: the two left, then EAGAIN.
        rest = b.drain_reads()
        assert [bytes(r[0])[0] for r in rest] == [1, 2] and b.drained == 2
        assert (counting.reads, counting.empty) == (4, 1)
        assert b.drain_reads(once=True) == [] and (counting.reads, counting.empty) == (5, 2)
    finally:
        b.sock = real
        a.close()
        b.close()

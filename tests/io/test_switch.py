"""The `mrc switch` relay: egress decisions with an injected clock, then real loopback sockets.

The first half drives `EgressPort` with explicit `now` values and asserts exact outcomes (what
is queued, marked, trimmed or dropped, when the bucket lets each packet out, the counters). The
second half runs `Relay` in this process between plain UDP sockets on 127.0.0.x: TOS and CE
cross it, a trimmed packet arrives with exactly `trim_size` bytes and its DSCP, replies go back
to the client, and the kernel's own socket overflows are counted apart from the relay's drops.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator

import pytest

from mrc.io import switch as switch_mod
from mrc.io.switch import Relay, SwitchConfig, kernel_drops
from mrc.io.switch_queue import (
    DSCP_TRIMMED,
    DSCP_TRIMMED_LASTHOP,
    EgressPort,
    TokenBucket,
    Verdict,
    is_data,
)

ECT0, ECT1, CE = 0x02, 0x01, 0x03
WRITE_MIDDLE, WRITE_ONLY_IMM, SACK = 0xC7, 0xCB, 0xDC
#: 8 Mbit/s = 1000 bytes per millisecond: easy arithmetic.
RATE = 8e6


def pkt(size: int = 1000, opcode: int = WRITE_MIDDLE, fill: int = 0) -> bytes:
    return bytes([opcode]) + bytes((fill + i) & 0xFF for i in range(1, size))


def port(**kw: object) -> EgressPort:
    args: dict[str, object] = {"rate_bps": RATE, "queue_bytes": 4000, "ecn_threshold": 2000}
    args.update(kw)
    return EgressPort(**args)  # type: ignore[arg-type]


# -- classification -------------------------------------------------------------------------


def test_only_bth_opcodes_c6_to_cb_are_data() -> None:
    assert [op for op in range(256) if is_data(bytes([op, 0]))] == list(range(0xC6, 0xCC))
    assert not is_data(b"")


# -- token bucket and timing ------------------------------------------------------------------


def test_bucket_releases_one_packet_per_transmission_time() -> None:
    p = port(queue_bytes=100_000)
    for i in range(3):
        assert p.offer(pkt(fill=i), ECT0, 0.0) is Verdict.QUEUED
    # The link is free: the first packet starts at once and keeps it busy for 1 ms.
    assert [d[1] for d in p.pop_ready(0.0)] == [ECT0]
    assert p.pop_ready(0.0005) == []
    assert p.next_departure(0.0005) == pytest.approx(0.001)
    assert len(p.pop_ready(0.001)) == 1
    assert p.next_departure(0.001) == pytest.approx(0.002)
    assert [d[0] for d in p.pop_ready(0.0025)] == [pkt(fill=2)]
    assert p.next_departure(0.0025) is None
    st = p.stats
    assert st.delay_samples == 3
    assert st.delay_sum == pytest.approx(0.0 + 0.001 + 0.002)
    assert st.lateness_max == pytest.approx(0.0005)  # the third could have gone at 2 ms


def test_late_wakeup_sends_the_backlog_in_one_batch_at_the_exact_rate() -> None:
    p = port(queue_bytes=100_000)
    for _ in range(10):
        p.offer(pkt(), ECT0, 0.0)
    # Nobody looked for 5.5 ms: the link would have started 6 packets (at 0, 1, … 5 ms).
    out = p.pop_ready(0.0055)
    assert len(out) == 6
    assert p.stats.delay_sum == pytest.approx(sum(k * 0.001 for k in range(6)))
    assert p.stats.lateness_max == pytest.approx(0.0055)
    assert p.next_departure(0.0055) == pytest.approx(0.006)
    assert len(p.pop_ready(0.0099)) == 4  # those that start at 6, 7, 8 and 9 ms
    assert p.next_departure(0.0099) is None


def test_long_run_rate_is_the_configured_rate() -> None:
    p = port(rate_bps=100e6, queue_bytes=1 << 20, ecn_threshold=1 << 20)
    last, sent, data = 0.0, 0, pkt(4096)
    for step in range(2000):  # offer 196 Mbit/s; poll at uneven moments
        for _ in range(3):
            p.offer(data, ECT0, step * 0.0005)
        last = step * 0.0005 + (step % 5) * 1e-4
        sent += sum(len(d) for d, _ in p.pop_ready(last))
    assert p.stats.trimmed > 0  # overloaded all along: the link never idled
    # Every byte the link started by `last`, the last packet possibly still on the wire.
    budget = 100e6 / 8 * last
    assert budget <= sent <= budget + 4096


def test_idle_link_stores_no_credit() -> None:
    p = port(queue_bytes=100_000)
    assert p.pop_ready(0.0) == []
    for _ in range(3):
        p.offer(pkt(), ECT0, 1.0)  # after a second of silence: no burst allowance
    assert len(p.pop_ready(1.0)) == 1
    assert len(p.pop_ready(1.0015)) == 1


def test_token_bucket_refill_caps_only_when_idle() -> None:
    b = TokenBucket(1000.0, now=0.0)
    b.refill(2.0, idle=False)
    assert b.tokens == 2000.0
    b.refill(3.0, idle=True)
    assert b.tokens == 0.0
    b.tokens = -500.0
    b.refill(3.25, idle=True)  # still paying for the packet on the wire
    assert b.tokens == -250.0


# -- ECN --------------------------------------------------------------------------------------


def test_ce_marked_above_threshold_at_enqueue_on_ecn_capable_packets_only() -> None:
    p = port(queue_bytes=10_000, ecn_threshold=2000)
    verdicts = [p.offer(pkt(), ECT0, 0.0) for _ in range(3)]
    assert verdicts == [Verdict.QUEUED] * 3  # 0, 1000 and 2000 bytes ahead: not above
    assert p.offer(pkt(), ECT0, 0.0) is Verdict.MARKED
    assert p.offer(pkt(), ECT1, 0.0) is Verdict.MARKED
    assert p.offer(pkt(), 0x00, 0.0) is Verdict.QUEUED  # Not-ECT is never marked
    assert p.offer(pkt(), CE, 0.0) is Verdict.QUEUED  # already CE: not counted again
    assert p.offer(pkt(), 0xB8 | ECT0, 0.0) is Verdict.MARKED  # DSCP kept, ECN → CE
    assert p.stats.ce_marked == 3
    tos = [t for _, t in p.pop_ready(1.0)]
    assert tos == [ECT0, ECT0, ECT0, CE, CE, 0x00, CE, 0xB8 | CE]


def test_marking_follows_the_link_not_a_late_relay() -> None:
    p = port(queue_bytes=10_000, ecn_threshold=2000)
    for _ in range(4):
        p.offer(pkt(), ECT0, 0.0)
    # 3 ms later the link has sent 3 of them even though nobody popped: 1000 B ahead.
    assert p.offer(pkt(), ECT0, 0.003) is Verdict.QUEUED
    assert p.stats.ce_marked == 1  # only the 4th, at t = 0


# -- trimming and drops -----------------------------------------------------------------------


def test_trimmed_packet_keeps_exactly_trim_size_bytes_dscp_21_and_goes_first() -> None:
    p = port(queue_bytes=4000, trim_size=64)
    for i in range(4):
        assert p.offer(pkt(fill=i), ECT0, 0.0) in (Verdict.QUEUED, Verdict.MARKED)
    big = pkt(1000, WRITE_ONLY_IMM, fill=9)
    assert p.offer(big, ECT1, 0.0) is Verdict.TRIMMED
    assert p.stats.trimmed == 1 and p.stats.dropped_queue == 0
    out = p.pop_ready(10.0)
    assert len(out) == 5
    data, tos = out[0]  # the priority queue goes ahead of everything queued
    assert data == big[:64] and len(data) == 64
    assert tos == DSCP_TRIMMED_LASTHOP << 2 | ECT1  # ECN bits kept
    assert [d for d, _ in out[1:]] == [pkt(fill=i) for i in range(4)]


def test_not_last_hop_uses_dscp_11_and_trim_size_is_configurable() -> None:
    p = port(queue_bytes=1000, trim_size=44, last_hop=False)
    p.offer(pkt(), ECT0, 0.0)
    assert p.offer(pkt(2000), CE, 0.0) is Verdict.TRIMMED
    data, tos = p.pop_ready(0.0)[0]
    assert len(data) == 44 and tos == DSCP_TRIMMED << 2 | CE


def test_non_data_packets_are_never_trimmed_but_tail_dropped() -> None:
    p = port(queue_bytes=1000)
    p.offer(pkt(), ECT0, 0.0)
    assert p.offer(pkt(500, SACK), ECT0, 0.0) is Verdict.DROPPED_QUEUE
    assert p.offer(pkt(60), ECT0, 0.0) is Verdict.DROPPED_QUEUE  # data, but not above 64 B
    assert p.stats.trimmed == 0 and p.stats.dropped_queue == 2
    assert len(p.pop_ready(1.0)) == 1


def test_no_trim_tail_drops_data_too() -> None:
    p = port(queue_bytes=1000, trim=False)
    p.offer(pkt(), ECT0, 0.0)
    assert p.offer(pkt(), ECT0, 0.0) is Verdict.DROPPED_QUEUE
    assert (p.stats.trimmed, p.stats.dropped_queue, p.stats.priority) == (0, 1, 0)


def test_full_priority_queue_drops_and_counts() -> None:
    p = port(queue_bytes=1000, priority_bytes=128)
    p.offer(pkt(), ECT0, 0.0)
    got = [p.offer(pkt(), ECT0, 0.0) for _ in range(3)]
    assert got == [Verdict.TRIMMED, Verdict.TRIMMED, Verdict.DROPPED_PRIORITY]
    assert (p.stats.trimmed, p.stats.dropped_priority, p.stats.max_priority_bytes) == (2, 1, 128)


def test_packet_trimmed_upstream_keeps_its_priority_and_dscp() -> None:
    p = port(queue_bytes=10_000)
    p.offer(pkt(), ECT0, 0.0)
    head = pkt(64)
    assert p.offer(head, DSCP_TRIMMED << 2 | ECT0, 0.0) is Verdict.PRIORITY
    assert p.stats.trimmed == 0
    assert p.pop_ready(0.0) == [(head, DSCP_TRIMMED << 2 | ECT0)]


def test_max_queue_and_delay_counters() -> None:
    p = port(queue_bytes=3000, ecn_threshold=3000)
    for _ in range(5):
        p.offer(pkt(), ECT0, 0.0)
    st = p.stats
    assert (st.max_queue_bytes, st.trimmed, st.max_priority_bytes) == (3000, 2, 128)
    assert len(p.pop_ready(0.0)) == 1  # the first trimmed head starts at once
    # Then the link starts the second head at 64 µs and the data at 128, 1128, 2128 µs.
    assert len(p.pop_ready(0.002128)) == 4
    d = st.as_dict()
    assert d["forwarded_packets"] == 0  # the relay counts what it actually sent
    assert d["mean_queue_delay_seconds"] == pytest.approx((64 + 128 + 1128 + 2128) / 5 * 1e-6)
    assert d["max_queue_delay_seconds"] == pytest.approx(0.002128)
    assert d["max_release_lateness_seconds"] == pytest.approx(0.002064)
    assert p.clear() == 0


def test_unshaped_direction_passes_everything() -> None:
    p = EgressPort(rate_bps=None, queue_bytes=1000)
    for _ in range(50):
        assert p.offer(pkt(), ECT0, 0.0) is Verdict.QUEUED
    assert len(p.pop_ready(0.0)) == 50
    assert p.stats.dropped_queue == p.stats.trimmed == p.stats.ce_marked == 0


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="trim_size"):
        port(trim_size=43)
    with pytest.raises(ValueError, match="queue_bytes"):
        port(queue_bytes=0)


# -- the relay on real loopback sockets -----------------------------------------------------


def udp(host: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, 0))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    return s


def recv_all(s: socket.socket, want: int, timeout: float = 2.0) -> list[tuple[bytes, int]]:
    got: list[tuple[bytes, int]] = []
    while len(got) < want:
        r, _, _ = select.select([s], [], [], timeout)
        if not r:
            break
        data, anc, _, _ = s.recvmsg(65536, 64)
        tos = next((c[0] for lvl, kind, c in anc if kind == socket.IP_TOS), -1)
        got.append((data, tos))
    return got


@pytest.fixture
def hosts() -> Iterator[tuple[socket.socket, socket.socket]]:
    client, server = udp("127.0.0.21"), udp("127.0.0.22")
    try:
        yield client, server
    finally:
        client.close()
        server.close()


def relay(server: socket.socket, **kw: object) -> Relay:
    args: dict[str, object] = {
        "listen": ("127.0.0.20", 0),
        "forward": server.getsockname(),
        "rate_bps": 8e6,
        "queue_bytes": 4000,
        "buffer_bytes": 1 << 20,
    }
    args.update(kw)
    return Relay(SwitchConfig(**args))  # type: ignore[arg-type]


def test_relay_forwards_marks_trims_and_returns_replies(
    hosts: tuple[socket.socket, socket.socket],
) -> None:
    client, server = hosts
    r = relay(server, ecn_threshold=1000)
    try:
        burst = [pkt(1000, fill=i) for i in range(8)]
        client.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, ECT0)
        for p in burst:
            client.sendto(p, r.listen_addr)
        r.serve(0.05)
        # One read batch: 4 fit (the 3rd and 4th behind more than 1000 B: CE), 4 were
        # trimmed to 64 B with DSCP 21 and overtook them.
        assert recv_all(server, 8) == [
            *((p[:64], DSCP_TRIMMED_LASTHOP << 2 | ECT0) for p in burst[4:]),
            *zip(burst[:4], [ECT0, ECT0, CE, CE], strict=True),
        ]
        server.sendto(b"\xdc" + bytes(40), r.source_addr)  # a SACK-sized reply
        r.serve(0.05)
        back = client.recvfrom(2048)
        assert back == (b"\xdc" + bytes(40), r.listen_addr)
        doc = r.report()
        fwd, rev = doc["end"]["forward"], doc["end"]["reverse"]
        assert (fwd["received_packets"], fwd["forwarded_packets"]) == (8, 8)
        assert (fwd["trimmed"], fwd["ce_marked"], fwd["dropped_queue"]) == (4, 2, 0)
        assert fwd["forwarded_bytes"] == 4 * 1000 + 4 * 64
        assert (rev["received_packets"], rev["forwarded_packets"]) == (1, 1)
        host, cport = client.getsockname()
        assert doc["end"]["client"] == f"{host}:{cport}"
        assert doc["start"]["trimmed_dscp"] == DSCP_TRIMMED_LASTHOP
    finally:
        r.close()


def test_kernel_socket_overflow_is_counted_apart_from_relay_drops(
    hosts: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, server = hosts
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    r = relay(server, rate_bps=1e10, queue_bytes=1 << 20, buffer_bytes=4096)
    try:
        sent = 300
        for i in range(sent):  # far more than the tiny receive buffer holds
            client.sendto(pkt(1000, fill=i), r.listen_addr)
        r.serve(0.05)
        fwd = r.forward.stats
        assert fwd.socket_overflow > 0  # read from /proc/net/udp when serve() ended
        assert fwd.received_packets + fwd.socket_overflow == sent
        # SO_RXQ_OVFL rides on the next datagram the kernel queues after the drops.
        assert kernel_drops(r.downstream.sock) == fwd.socket_overflow
        fwd.socket_overflow = 0
        client.sendto(pkt(1000), r.listen_addr)
        sent += 1
        with monkeypatch.context() as m:
            m.setattr(switch_mod, "kernel_drops", lambda sock: None)
            r.serve(0.05)
        assert fwd.received_packets + fwd.socket_overflow == sent
        assert fwd.dropped_queue == fwd.trimmed == fwd.dropped_priority == 0
        assert fwd.forwarded_packets == fwd.received_packets
    finally:
        r.close()


def test_replies_before_any_client_are_counted_not_sent(
    hosts: tuple[socket.socket, socket.socket],
) -> None:
    _, server = hosts
    r = relay(server)
    try:
        server.sendto(b"\xdc" + bytes(40), r.source_addr)
        r.serve(0.05)
        assert r.reverse.stats.dropped_no_client == 1
        assert r.reverse.stats.forwarded_packets == 0
    finally:
        r.close()


def test_stop_ends_serve_and_drops_what_is_queued(
    hosts: tuple[socket.socket, socket.socket],
) -> None:
    client, server = hosts
    r = relay(server, rate_bps=8000.0)  # 1 kB/s: the second packet would wait a second
    try:
        client.sendto(pkt(), r.listen_addr)
        client.sendto(pkt(), r.listen_addr)
        r.serve(0.05)
        r.stop()
        r.serve(5.0)  # returns at once
        assert r.forward.stats.forwarded_packets == 1
        assert r.forward.stats.left_queued == 1
        assert r.seconds < 1.0
    finally:
        r.close()

"""Packet trains (mrc.sim.link's train mode, `Network(trains=True)`): exact stories on small
fabrics. Many flows at once on trains are tests/experiments/test_permutation.py's."""

from __future__ import annotations

from collections.abc import Callable

from mrc.core.transmit import Transmit
from mrc.sim import FabricSpec, Host, LinkParams, Network, build

ECT0 = 0x02
SLOW = LinkParams(rate_bps=8e6, latency=1e-6, queue_bytes=1 << 20)  # 1000 bytes = 1 ms


def capture(host: Host) -> list[tuple[float, int, int]]:
    got: list[tuple[float, int, int]] = []

    def hook(h: Host, plane: int, batch: list[tuple[bytes, object, int]]) -> None:
        got.extend((round(h.net.now, 9), data[0], tos) for data, _, tos in batch)

    host.on_receive = hook
    return got


def two_racks(trains: bool, link: LinkParams = SLOW) -> tuple[Network, Host, Host]:
    net = Network(seed=0, trains=trains)
    spec = FabricSpec(
        hosts=2, planes=1, hosts_per_rack=1, tier1=1, host_link=link, fabric_link=link
    )
    fab = build(net, spec)
    return net, fab.hosts[0], fab.hosts[1]


def cell(n: int) -> Transmit:
    data = b"".join(bytes([i]) * 1000 for i in range(n))
    return Transmit(plane=0, addr="h1", data=data, ev=0, segment_size=1000)


def test_a_train_is_timed_packet_by_packet_and_delivered_whole() -> None:
    """Three 1000-byte packets over four 1 ms-per-packet hops, pipelined: the last arrives
    after 3 ms of serialization at the NIC, 3 more hops of 1 ms and 4 µs of cable."""
    net, h0, h1 = two_racks(trains=True)
    got = capture(h1)
    h0._send(cell(3))
    net.drive(0.1)
    assert got == [(0.006004, 0, ECT0), (0.006004, 1, ECT0), (0.006004, 2, ECT0)]
    assert net.events == 4  # one per hop

    # The per-packet model: the same last arrival, each packet on its own.
    net, h0, h1 = two_racks(trains=False)
    got = capture(h1)
    h0._send(cell(3))
    net.drive(0.1)
    assert got == [(0.004004, 0, ECT0), (0.005004, 1, ECT0), (0.006004, 2, ECT0)]


def test_two_trains_into_one_port_mark_and_trim_per_packet() -> None:
    """h0, then h1 10 µs later, each send 4 packets to h2 over a fast fabric whose last hop is
    slow (1 ms per packet) and holds 3000 bytes, ECN above 1500. h0's train: 0 and 1 queued, 2
    finds 2000 bytes ahead (marked), 3 no longer fits (trimmed); h1's finds the queue full:
    four headers. Headers go at priority, one after the other (64 µs each)."""
    fast = LinkParams(rate_bps=1e12, latency=1e-6, queue_bytes=1 << 20)
    net = Network(seed=0, trains=True)
    spec = FabricSpec(
        hosts=3, planes=1, hosts_per_rack=3, tier1=1, host_link=fast, fabric_link=fast,
        ecn_threshold=1500, trim=True,
    )  # fmt: skip
    fab = build(net, spec)
    h0, h1, h2 = fab.hosts
    last = fab.link(fab.tier0[0][0], h2)
    last.params.rate_bps, last.params.queue_bytes = 8e6, 3000
    got = capture(h2)
    tx = Transmit(0, "h2", b"".join(bytes([i]) * 1000 for i in range(4)), 0, 1000)
    h0._send(tx)

    def later() -> None:
        h1._send(tx)

    net.at(10e-6, later)
    net.drive(0.1)
    c = last.counters
    assert (c["forwarded"], c["ce_marked"], c["trimmed"], c["priority"]) == (8, 1, 5, 5)
    assert c["dropped_queue"] == c["dropped_priority"] == 0
    t21 = 21 << 2 | ECT0
    # h1's four headers leave back to back at priority (64 µs each, after h0's header, which
    # went at 1.032-65.032 µs): h2 reads them in one batch when the last is in. h0's train
    # reaches h2 as one back-to-back run, its header having overtaken packet 0's tail: one
    # batch when packet 2's last bit is in (1 µs + 8 ns + 3 × 1 ms + 1 µs).
    assert got == [
        (0.000322032, 0, t21), (0.000322032, 1, t21), (0.000322032, 2, t21),
        (0.000322032, 3, t21),
        (0.003002008, 3, t21), (0.003002008, 0, ECT0), (0.003002008, 1, ECT0),
        (0.003002008, 2, 0x03),
    ]  # fmt: skip


def test_read_every_batches_a_hosts_arrivals() -> None:
    """With read_every = 2 ms, h1 reads the first packet the moment it lands (it had been idle),
    then holds what comes until 2 ms after that read: the packets injected 1 and 2 ms later
    land at 5.004 and 6.004 ms (four 1 ms hops) and are read together at 6.004 ms."""
    net = Network(seed=0, trains=True, read_every=2e-3)
    spec = FabricSpec(hosts=2, planes=1, hosts_per_rack=1, tier1=1, host_link=SLOW,
                      fabric_link=SLOW)  # fmt: skip
    fab = build(net, spec)
    h0, h1 = fab.hosts
    got = capture(h1)
    def send(i: int) -> Callable[[], None]:
        return lambda: h0.inject(0, "h1", bytes([i]) * 1000)

    for i in range(3):
        net.at(i * 1e-3, send(i))
    net.drive(0.1)
    assert got == [(0.004004, 0, ECT0), (0.006004, 1, ECT0), (0.006004, 2, ECT0)]
